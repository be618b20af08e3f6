"""A decision step's budget: how much CPU a small batch's step may take on the Kubernetes
path, and how much CP-SAT work the solver's improving steps may spend on a batch.

**The small-batch step budget** (``step_clock``, ``StepClock``): on the Kubernetes path a
batch of at most ``exact_max_pairs`` pods x nodes is decided anytime, within a CPU budget
that grows with the batch, ``step_cpu_base_s + step_cpu_per_pod_s x pods``, at most
``step_cpu_max_s`` (4 pods: 0.12 s; 100 pods: 0.5 s; 200 pods and more: 0.85 s). It is the
CPU of the thread deciding (``time.thread_time``), counted from the step's start: the
caller's (the decision loop's, so that reading the pending pods counts too) or the
engine's; where the cost neighbourhoods run two at a time, the wall time it waits for the
helper thread's sub-solve counts too (``Budget.beside``, ``Budget.absorb``), so the step
takes the same wall time and up to twice the CPU. Within it, ``step_cpu_after_per_pod_s x
pods`` is left for what follows the engine (its decisions, the loop's validation, handing
out the bindings). The greedy answer
(packing, repair, the flow route, descent, slot flow, refill; no CP-SAT) comes first and
always runs; the CP-SAT neighbourhoods improve it until the search's end
(``step_search_share`` of the engine's share, or earlier: ``StepClock.search_end_for``; when
no pod an allowed node could hold is left out, the engine's end less what follows the
search: ``Budget.count_first``); the exact step (``exact.py``) then runs in what is left.
CP-SAT itself is bounded by its deterministic time, never by the clock: each sub-solve gets at
most the work that fits in the CPU left at the slowest rate measured in the step
(``Budget.rate``; before one, ``step_work_per_cpu_s`` units per CPU second), so a machine
whose CPUs other processes share gives the step fewer CPU seconds per wall second, not fewer
CPU seconds. The answer is the same wherever the search ends before the budget does; where
the budget ends it, the thread's CPU time for the same work (10-20 % from run to run) moves
where, and with it the answer (docs/placement.md).

A wall-clock safety net (``step_wall_factor`` x the CPU budget, at least
``step_wall_min_s``) bounds how long a machine too loaded to give the step its CPU holds the
loop: past it no sub-solve starts and a running one is cut short; only then does the answer
depend on load, and ``stats["budget_deadline_hits"]`` (with ``stats["step_wall_net"]``)
says so. What the budget cuts is counted (``stats["budget_deadline_hits"]``,
``stats["exact_skipped"]``); what it leaves out -- more neighbourhoods, a longer exact
step -- only ever lowers the cost further or places more; the count-first steps without
CP-SAT always run.

**The work budget** (``Budget.for_batch``, ``budget=True``, off by default): the CP-SAT
neighbourhoods and the whole-batch polish share ``budget_work_base + budget_work_per_pod x
pods`` units of deterministic time (counted, not timed), and optionally a wall-clock
deadline (``budget_wall_base_s`` > 0), past which the best answer so far is kept.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .config import EngineConfig

# the least CP-SAT work a sub-solve is given (below it CP-SAT returns its hint unchanged)
MIN_WORK = 1e-3
# a sub-solve shorter than this (CPU seconds) measures no rate: mostly model building
RATE_MIN_CPU = 0.01


@dataclass(frozen=True)
class StepClock:
    """A decision step's clocks. ``cpu0`` is the deciding thread's CPU
    (``time.thread_time``) at the step's start; ``search_cpu`` and ``end_cpu`` are CPU
    seconds from it: the search's end (no CP-SAT neighbourhood starts past it) and the
    engine's (the exact step ends by it); ``wall_end`` (``time.monotonic``) is the safety
    net. All inf where the step has no budget."""

    cpu0: float = 0.0
    search_cpu: float = math.inf
    end_cpu: float = math.inf
    wall_end: float = math.inf
    work_per_cpu: float = 0.15  # CP-SAT deterministic time per CPU second
    short_cpu: float = math.inf  # the cost search's end while pods are still out
    cpu: Callable[[], float] = field(default=time.thread_time, repr=False, compare=False)
    wall: Callable[[], float] = field(default=time.monotonic, repr=False, compare=False)

    @property
    def limited(self) -> bool:
        return self.end_cpu < math.inf or self.wall_end < math.inf

    def used(self) -> float:
        """CPU seconds the step has taken so far."""
        return self.cpu() - self.cpu0

    def cpu_left(self, until: float) -> float:
        """CPU seconds from now to ``until`` (a mark from ``cpu0``; inf: none; never < 0)."""
        return math.inf if until == math.inf else max(until - self.used(), 0.0)

    def wall_left(self) -> float:
        """Wall seconds to the safety net (inf: none; never < 0)."""
        return math.inf if self.wall_end == math.inf else max(self.wall_end - self.wall(), 0.0)

    def past(self, until: float) -> bool:
        """Is the CPU mark ``until`` or the safety net passed?"""
        return self.cpu_left(until) <= 0.0 or self.wall_left() <= 0.0

    def search_end_for(self, used: float) -> float:
        """The search's end for a search that starts ``used`` CPU seconds into the step:
        ``search_cpu``, or earlier so that what follows it gets as long as the step took
        before it (the count-first steps after the search -- descent, slot flow, the flow
        route, refill, the pod-by-pod classes -- cost about what packing and repair before
        it cost)."""
        return min(self.search_cpu, self.end_cpu - used)

    def report(self, stats: dict[str, float]) -> None:
        """What a limited step saw: the CPU it has taken (``step_cpu_s``), and whether the
        wall-clock safety net has passed (``step_wall_net``)."""
        if self.limited:
            stats["step_cpu_s"] = self.used()
            if self.wall_left() <= 0.0:
                stats["step_wall_net"] = 1.0

    def work_for(self, cpu_s: float, rate: float = 0.0) -> float:
        """CP-SAT work (deterministic time) that fits in ``cpu_s`` CPU seconds, at
        ``rate`` units per CPU second (0: the step's, ``work_per_cpu``)."""
        return (math.inf if cpu_s == math.inf
                else max(cpu_s * (rate or self.work_per_cpu), MIN_WORK))


@dataclass
class Budget:
    """What is left of a step's CP-SAT work and until when it may run."""

    work: float = math.inf  # CP-SAT deterministic time left
    deadline: float = math.inf  # time.monotonic() past which no sub-solve starts
    spent: float = 0.0
    wall_cap_hits: int = 0  # CP-SAT stopped by its wall-clock safety net
    deadline_hits: int = 0  # the step's budget cut a sub-solve or stopped the next
    clock: StepClock = field(default_factory=StepClock)
    search_cpu: float = math.inf  # CPU mark (StepClock) past which no sub-solve starts
    after_cpu: float = math.inf  # the latest the search may end leaving what follows its due
    rate: float = 0.0  # the slowest work per CPU second measured this step (0: none yet)
    started: float = 0.0  # the running sub-solve's start (StepClock.used)
    cap: float = 0.0  # ... and its work limit

    @classmethod
    def for_batch(cls, cfg: EngineConfig, pods: int, clock: StepClock | None = None
                  ) -> Budget:
        """The budget of one batch of ``pods`` pods (no work bound when ``cfg.budget`` is
        off), ending at the step's search end and safety net at the latest."""
        clock = clock or StepClock()
        deadline = clock.wall_end
        if not cfg.budget:
            return cls(deadline=deadline, clock=clock, search_cpu=clock.search_cpu)
        if cfg.budget_wall_base_s > 0:
            deadline = min(deadline, clock.wall() + cfg.budget_wall_base_s
                           + cfg.budget_wall_per_pod_s * pods)
        return cls(work=cfg.budget_work_base + cfg.budget_work_per_pod * pods,
                   deadline=deadline, clock=clock, search_cpu=clock.search_cpu)

    def hold_back(self) -> None:
        """A search starts now: leave what follows it as long as what came before
        (``StepClock.search_end_for``)."""
        if self.clock.end_cpu < math.inf:
            used = self.clock.used()
            self.search_cpu = min(self.search_cpu, self.clock.search_end_for(used))
            self.after_cpu = self.clock.end_cpu - used

    def count_first(self, out: bool) -> None:
        """The cost neighbourhoods come next; ``out``: pods an allowed node could hold are
        still out. Then they end at ``StepClock.short_cpu``, so that the exact step, which
        places more where it can, gets the rest of the step; else (the exact step then has
        nothing to place) they may run to the engine's end less what follows the search
        (``hold_back``): the SLA family's 200-300 pods, whose count the reference proves,
        spent the last third of the step's CPU on nothing."""
        if out:
            self.search_cpu = min(self.search_cpu, self.clock.short_cpu)
        elif self.after_cpu < math.inf and self.work == math.inf:
            self.search_cpu = max(self.search_cpu, self.after_cpu)

    def open(self) -> bool:
        """May another sub-solve start?"""
        if self.work <= 0:
            return False
        if (self._wall_left() <= 0.0
                or self.clock.cpu_left(self.search_cpu) <= 0.0):
            self.deadline_hits += 1
            self.work = 0.0  # closed for the rest of the step
            return False
        return True

    def limits(self, det_time: float, wall_cap_s: float) -> tuple[float, float, bool]:
        """A sub-solve's deterministic time (within the work and the CPU left) and
        wall-clock limit, and whether the deadline (rather than ``wall_cap_s``) sets the
        latter."""
        det = self._work_for(det_time)
        self.started = self.clock.used() if self.clock.limited else 0.0
        self.cap = det
        wall = wall_cap_s
        by_deadline = False
        left = self._wall_left()
        if left < wall:
            wall, by_deadline = max(left, 1e-3), True
        return det, wall, by_deadline

    def beside(self, det_time: float) -> Budget:
        """The budget of a sub-solve on another thread, started now beside one on this
        thread (``neighbourhoods._solve_pair``): the work this thread's next sub-solve would
        get (``limits``), the same deadline, no CPU clock (the step's budget counts the
        deciding thread's CPU). ``absorb`` charges what it spent."""
        return Budget(work=self._work_for(det_time), deadline=self.deadline,
                      clock=StepClock(wall=self.clock.wall))

    def absorb(self, side: Budget, waited: float = 0.0) -> None:
        """Charge a ``beside`` budget's sub-solve: its work, what stopped it, and the wall
        time this thread ``waited`` for it past its own (as CPU of the search's share: the
        step takes as long as with one thread)."""
        self.search_cpu -= waited
        self.work -= side.spent
        self.spent += side.spent
        self.wall_cap_hits += side.wall_cap_hits
        if side.deadline_hits:
            self.deadline_hits += side.deadline_hits
            self.work = 0.0

    def _work_for(self, det_time: float) -> float:
        """The work a sub-solve starting now gets: ``det_time``, within the work left and
        what fits in the search's CPU left at the step's rate."""
        return min(det_time, self.work,
                   self.clock.work_for(self.clock.cpu_left(self.search_cpu), self.rate))

    def _wall_left(self) -> float:
        """Wall seconds to the deadline (on the step clock's wall clock)."""
        return (math.inf if self.deadline == math.inf
                else max(self.deadline - self.clock.wall(), 0.0))

    def charge(self, det_time: float, wall_hit: bool, by_deadline: bool) -> None:
        """Account a finished sub-solve: its deterministic time, and whether the wall clock
        stopped it (the deadline's or the safety net's)."""
        self.work -= det_time
        self.spent += det_time
        if self.clock.limited:
            # the slowest rate of this step's sub-solves: the next is capped to what fits
            # at it, not at the slowest of any model
            r = work_rate(det_time, self.cap, self.clock.used() - self.started)
            if r:
                self.rate = r if self.rate == 0.0 else min(self.rate, r)
        if wall_hit:
            if by_deadline:
                self.deadline_hits += 1
                self.work = 0.0
            else:
                self.wall_cap_hits += 1


def work_rate(done: float, cap: float, took: float, min_cpu: float = RATE_MIN_CPU) -> float:
    """The work per CPU second a CP-SAT solve measured: ``done`` units in ``took`` CPU
    seconds, where its work limit ``cap`` stopped it and it took at least ``min_cpu``; else
    0 (no measure). A solve that proved its answer early measured the model's loading, not
    the search (0.02 units per CPU second on mixed 300 x 75, against 0.15-0.45
    searching)."""
    return done / took if took > 0.0 and took >= min_cpu and done >= 0.9 * cap else 0.0


def step_cpu(cfg: EngineConfig, pods: int) -> float:
    """A small batch's CPU budget: ``step_cpu_base_s + step_cpu_per_pod_s x pods``, at most
    ``step_cpu_max_s``."""
    return min(cfg.step_cpu_max_s, cfg.step_cpu_base_s + cfg.step_cpu_per_pod_s * pods)


def step_clock(cfg: EngineConfig, small: bool, pods: int, cpu0: float | None = None,
               cpu: Callable[[], float] = time.thread_time,
               wall: Callable[[], float] = time.monotonic) -> StepClock:
    """A decision step's clock, from ``cpu0`` (the caller's ``time.thread_time()`` at the
    step's start; default now): for a small batch (pods x nodes within the exact step's
    limit) on the Kubernetes path (``cpsat_polish`` off: the local mode's whole-batch polish
    is bounded by work alone) with ``step_cpu_max_s`` > 0, the CPU budget (``step_cpu``)
    less what follows the engine, the search's end within it and the wall-clock safety
    net (from now); else no limit. ``cpu`` and ``wall`` read the clocks."""
    now = cpu()
    start = now if cpu0 is None or cpu0 > now else cpu0
    if not small or cfg.cpsat_polish or cfg.step_cpu_max_s <= 0:
        return StepClock(start, cpu=cpu, wall=wall)
    total = step_cpu(cfg, pods)
    end = max(total - cfg.step_cpu_after_per_pod_s * pods, 0.0)
    net = max(cfg.step_wall_min_s, cfg.step_wall_factor * total)
    return StepClock(start, end * cfg.step_search_share, end, wall() + net,
                     cfg.step_work_per_cpu_s, end * cfg.step_search_share_short, cpu, wall)

