"""A decision step's budget: how much CP-SAT work the solver's improving steps may spend on a
batch, and the wall-clock time after which none starts.

The work (CP-SAT's deterministic time, summed over the step's sub-solves) grows with the
batch: ``budget_work_base + budget_work_per_pod x pods`` (300 pods: 0.65 units, about as
many seconds of one core). It is counted, not timed, so the same batch gets the same answer
on any load. A wall-clock deadline (``budget_wall_base_s`` > 0: ``budget_wall_base_s +
budget_wall_per_pod_s x pods`` from the step's start) is the bound a loaded machine meets
too: past it no further sub-solve starts and a running one is cut short, and the step keeps
the best answer found so far (``stats["budget_deadline_hits"]`` says so: that answer may
depend on load).
On the Kubernetes path a small batch's step has a wall-clock budget of its own
(``step_deadlines``, ``EngineConfig.step_wall_s``): an anytime step. The greedy answer (packing,
repair, descent) comes first; the neighbourhoods improve it until the search's deadline; the
exact step (``exact.py``) then runs in what is left; the best valid answer is kept. What the
budget cuts is counted (``stats["budget_deadline_hits"]``, ``stats["exact_skipped"]``).
What the budget leaves out -- more neighbourhoods -- only ever lowers the cost further;
the count-first steps that need no CP-SAT (packing, repair, descent, slot flow, refill)
always run.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from .config import EngineConfig


@dataclass(frozen=True)
class StepClock:
    """A decision step's clock (``time.monotonic()``): its start, the search's deadline and
    the step's end; all inf but the start where the step has no budget."""

    start: float = 0.0
    search_end: float = math.inf
    end: float = math.inf

    def search_left_for(self, now: float) -> float:
        """The search's deadline for a search that starts at ``now``: ``search_end``, or
        earlier so that what follows it gets as long as the step took before it (the
        count-first steps after the search -- descent, slot flow, the flow route, refill,
        the engine's decisions -- cost about what packing and repair before it cost, and
        stretch with the machine's load alike: at load 10 they took 0.9 s of a 339-pod
        step's 1.7 s)."""
        return min(self.search_end, self.end - (now - self.start))


@dataclass
class Budget:
    """What is left of a step's CP-SAT work and until when it may run."""

    work: float = math.inf  # CP-SAT deterministic time left
    deadline: float = math.inf  # time.monotonic() past which no sub-solve starts
    spent: float = 0.0
    wall_cap_hits: int = 0  # CP-SAT stopped by its wall-clock safety net
    deadline_hits: int = 0  # the step's deadline cut a sub-solve or stopped the next

    clock: StepClock = field(default_factory=StepClock)

    @classmethod
    def for_batch(cls, cfg: EngineConfig, pods: int, clock: StepClock | None = None
                  ) -> Budget:
        """The budget of one batch of ``pods`` pods (no bound when ``cfg.budget`` is off),
        ending at the step's search deadline at the latest (``step_deadlines``)."""
        clock = clock or StepClock()
        deadline = clock.search_end
        if not cfg.budget:
            return cls(deadline=deadline, clock=clock)
        if cfg.budget_wall_base_s > 0:
            deadline = min(deadline, time.monotonic() + cfg.budget_wall_base_s
                           + cfg.budget_wall_per_pod_s * pods)
        return cls(work=cfg.budget_work_base + cfg.budget_work_per_pod * pods,
                   deadline=deadline, clock=clock)

    def hold_back(self) -> None:
        """A search starts now: leave what follows it as long as what came before
        (``StepClock.search_left_for``)."""
        self.deadline = min(self.deadline, self.clock.search_left_for(time.monotonic()))

    def open(self) -> bool:
        """May another sub-solve start?"""
        if self.work <= 0:
            return False
        if self.deadline < math.inf and time.monotonic() >= self.deadline:
            self.deadline_hits += 1
            self.work = 0.0  # closed for the rest of the step
            return False
        return True

    def limits(self, det_time: float, wall_cap_s: float) -> tuple[float, float, bool]:
        """A sub-solve's deterministic time and wall-clock limit within what is left, and
        whether the deadline (rather than ``wall_cap_s``) sets the latter."""
        wall = wall_cap_s
        by_deadline = False
        if self.deadline < math.inf:
            left = max(self.deadline - time.monotonic(), 1e-3)
            if left < wall:
                wall, by_deadline = left, True
        return min(det_time, self.work), wall, by_deadline

    def charge(self, det_time: float, wall_hit: bool, by_deadline: bool) -> None:
        """Account a finished sub-solve: its deterministic time, and whether the wall clock
        stopped it (the deadline's or the safety net's)."""
        self.work -= det_time
        self.spent += det_time
        if wall_hit:
            if by_deadline:
                self.deadline_hits += 1
                self.work = 0.0
            else:
                self.wall_cap_hits += 1


def step_deadlines(cfg: EngineConfig, small: bool) -> StepClock:
    """A decision step's clock, for a small batch (pods x nodes within the exact step's
    limit) on the Kubernetes path (``cpsat_polish`` off: the local mode's whole-batch polish
    is bounded by work alone) with ``step_wall_s`` > 0, else no deadline: the search's
    (``step_search_share`` of the budget, or earlier: ``StepClock.search_left_for``), after
    which no CP-SAT neighbourhood starts and a running one is cut short, and the step's end,
    within which the exact step runs. The count-first steps without CP-SAT (packing, repair,
    descent, slot flow, fill) always run."""
    now = time.monotonic()
    if not small or cfg.cpsat_polish or cfg.step_wall_s <= 0:
        return StepClock(now)
    return StepClock(now, now + cfg.step_wall_s * cfg.step_search_share, now + cfg.step_wall_s)


def time_left(deadline: float) -> float:
    """Seconds until ``deadline`` (inf when there is none; never below 0)."""
    return math.inf if deadline == math.inf else max(deadline - time.monotonic(), 0.0)
