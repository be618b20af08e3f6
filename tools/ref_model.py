"""An exact CP-SAT model of one placement batch, written apart from the engine.

The reference the quality benchmark (``tools.bench_quality``) measures cfnet against. It
reads the engine's input types (``cloud_core.placement.model``) and nothing else of the
engine: no classes, no filters, no hint from its answer. The rules are the ones
``cloud_core.placement.validate`` states, written out again here, one boolean per pod and
node the pod may use on its own:

* resources (cpu, memory, GPUs; a zero request fits an over-committed node), pods per node,
  extended resources and host ports, running pods included;
* node health, residency, security level, nodeSelector, required node affinity, taints
  (``NoSchedule``/``NoExecute``) and the latency SLA (best measured p95, stale links
  inflated, expired ones absent), fixed per (pod, node) and so left out of the variables;
* required pod anti-affinity both ways (a pod's own terms and the terms of every other pod
  that select it), required pod affinity (only pods matching every term count; a pod
  matching all its own terms with no such pod anywhere is the first of its group), hard
  topology spread (``DoNotSchedule``, on the final state, eligible domains and minDomains
  as validate counts them) and gangs (all or nothing).

The cost of a pod on a node is the engine's per-pod price (``scores.total_cost``: price,
energy and carbon by dominant share, data gravity, latency margin, balance, soft node
affinity, ``PreferNoSchedule`` taints, InterPodAffinity against the running pods normalised
over the nodes the pod may use before the batch), computed here in plain Python in the same
order of operations and scaled to integers as the engine's solver scales it
(``round(cost * cost_scale)``).

Solved lexicographically: the most pods first, then, with that count fixed, the least cost.
CP-SAT with its workers and a time limit per stage; each stage reports its status
(OPTIMAL: proven, FEASIBLE: the best found in time) and its bound. A cost stage that finds
nothing within its limit leaves the count stage's answer, priced, with the status
``UNKNOWN: count stage's`` and no bound.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ortools.sat.python import cp_model

from cloud_core.placement.config import EngineConfig
from cloud_core.placement.model import (
    ClusterSnapshot,
    HostPort,
    PodAffinityTerm,
    RunningPod,
    SpreadConstraint,
    Workload,
)
from tools.ref_cost import Pricer
from tools.ref_rules import Links, label, selector_and_taints, selects, static_ok, term_hits

ZERO_IP = "0.0.0.0"


@dataclass
class RefResult:
    """One lexicographic solve: the count stage, then the cost stage at that count."""

    count_status: str
    placed: int
    count_bound: int
    status: str
    cost: float  # $/hour of ``assignments``: the cost stage's objective
    bound: float  # the cost stage's proven lower bound, $/hour
    assignments: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0


STATUS = {cp_model.OPTIMAL: "OPTIMAL", cp_model.FEASIBLE: "FEASIBLE",
          cp_model.INFEASIBLE: "INFEASIBLE", cp_model.MODEL_INVALID: "MODEL_INVALID",
          cp_model.UNKNOWN: "UNKNOWN"}


class RefModel:
    """The batch as one CP-SAT model (no objective): ``solve`` for the reference's answer,
    ``accepts`` to ask whether an assignment satisfies the model's constraints."""

    def __init__(self, snapshot: ClusterSnapshot, workloads: Sequence[Workload],
                 config: EngineConfig | None = None) -> None:
        self.snap, self.pods = snapshot, list(workloads)
        self.cfg = config or EngineConfig()
        self.nodes = list(snapshot.nodes)
        self.pos = {nd.name: i for i, nd in enumerate(self.nodes)}
        self.links = Links(snapshot, self.cfg)
        self.running = running_on(snapshot)
        self.m = cp_model.CpModel()
        self.x: dict[tuple[int, int], cp_model.IntVar] = {}
        self.icost: dict[tuple[int, int], int] = {}
        self.on: list[list[int]] = [[] for _ in self.pods]  # per pod: its nodes
        self._in: dict[tuple[int, str, str], cp_model.IntVar] = {}
        pricer = Pricer(snapshot, self.links, self.cfg)
        for p, w in enumerate(self.pods):
            before = [n for n, nd in enumerate(self.nodes) if static_ok(w, nd, self.links)
                      and self._with_running(w, n)]
            share = pricer.interpod(w, before)
            for n in before:
                if not self._alone_fits(w, n):
                    continue
                self.x[p, n] = self.m.new_bool_var(f"x{p}_{n}")
                c = pricer.price(w, n, None if share is None else share[n])
                self.icost[p, n] = round(c * self.cfg.cost_scale)
                self.on[p].append(n)
            if len(self.on[p]) > 1:
                self.m.add(sum(self.x[p, n] for n in self.on[p]) <= 1)
        self._capacity()
        self._host_ports()
        self._anti_affinity()
        self._affinity()
        self._spread()
        self._gangs()

    # -- per pod and node ---------------------------------------------------------------
    def _with_running(self, w: Workload, n: int) -> bool:
        """Anti-affinity both ways with the running pods; every topology key that the pod's
        affinity and hard spread need is on the node."""
        nd = self.nodes[n]
        for t in w.pod_affinity:
            if label(nd, t.topology_key) is None:
                return False
        for c in w.spread:
            if c.hard and label(nd, c.topology_key) is None:
                return False
        for r in self.snap.pods:
            if r.uid == w.uid or r.node not in self.pos:
                continue
            where = self.nodes[self.pos[r.node]]
            for t in w.pod_anti_affinity:
                d = label(nd, t.topology_key)
                if (d is not None and label(where, t.topology_key) == d
                        and term_hits(t, w.namespace, r.namespace, r.labels)):
                    return False
            for t in r.anti_affinity:
                d = label(where, t.topology_key)
                if (d is not None and label(nd, t.topology_key) == d
                        and term_hits(t, r.namespace, w.namespace, w.labels)):
                    return False
        return True

    def _alone_fits(self, w: Workload, n: int) -> bool:
        """Resources, pods, extended resources and host ports with the pod alone there."""
        nd = self.nodes[n]
        free = nd.capacity - nd.allocated
        for want, have in ((w.requests.cpu_milli, free.cpu_milli),
                           (w.requests.mem_bytes, free.mem_bytes), (w.requests.gpus, free.gpus)):
            if want > 0 and want > have:
                return False
        here = self.running.get(nd.name, [])
        if nd.max_pods is not None and len(here) + 1 > nd.max_pods:
            return False
        for k, v in w.extended.items():
            if sum(int(r.extended.get(k, 0)) for r in here) + int(v) > nd.extended.get(k, 0):
                return False
        taken = [hp for r in here for hp in r.host_ports]
        for i, hp in enumerate(w.host_ports):
            for other in [*taken, *w.host_ports[:i]]:
                if _clash(hp, other):
                    return False
        return True

    # -- constraints over the batch -----------------------------------------------------
    def _by_node(self) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in self.nodes]
        for p, ns in enumerate(self.on):
            for n in ns:
                out[n].append(p)
        return out

    def _capacity(self) -> None:
        """Resources, pods per node, extended resources: sums within what is left."""
        for n, ps in enumerate(self._by_node()):
            nd = self.nodes[n]
            free = nd.capacity - nd.allocated
            for r, have in enumerate((free.cpu_milli, free.mem_bytes, free.gpus)):
                want = [(p, _req(self.pods[p], r)) for p in ps if _req(self.pods[p], r) > 0]
                if sum(q for _, q in want) > max(have, 0):
                    self.m.add(sum(q * self.x[p, n] for p, q in want) <= max(have, 0))
            here = self.running.get(nd.name, [])
            if nd.max_pods is not None and len(ps) > nd.max_pods - len(here):
                self.m.add(sum(self.x[p, n] for p in ps) <= max(nd.max_pods - len(here), 0))
            keys = {k for p in ps for k in self.pods[p].extended}
            for k in sorted(keys):
                left = nd.extended.get(k, 0) - sum(int(r.extended.get(k, 0)) for r in here)
                use = [(p, int(self.pods[p].extended[k])) for p in ps
                       if k in self.pods[p].extended]
                if sum(q for _, q in use) > left:
                    self.m.add(sum(q * self.x[p, n] for p, q in use) <= left)

    def _host_ports(self) -> None:
        """Per node and (protocol, port): one pod per address, and a pod on 0.0.0.0 alone."""
        for n, ps in enumerate(self._by_node()):
            groups: dict[tuple[str, int], list[tuple[str, int]]] = {}
            for p in ps:
                for hp in self.pods[p].host_ports:
                    groups.setdefault((hp.protocol, hp.port), []).append((hp.host_ip, p))
            for entries in groups.values():
                if len({p for _, p in entries}) < 2:
                    continue
                zero = [self.x[p, n] for ip, p in entries if ip == ZERO_IP]
                if len(zero) > 1:
                    self.m.add(sum(zero) <= 1)
                for ip in {ip for ip, _ in entries if ip != ZERO_IP}:
                    same = [self.x[p, n] for a, p in entries if a == ip]
                    if len(same) + len(zero) > 1:
                        self.m.add(sum(same) + sum(zero) <= 1)

    def _anti_affinity(self) -> None:
        """No pod that a pod's anti-affinity term selects in its domain (both directions
        follow: each pod's own terms are posted)."""
        for a, w in enumerate(self.pods):
            for t in w.pod_anti_affinity:
                hit = [b for b, o in enumerate(self.pods)
                       if b != a and o.uid != w.uid
                       and term_hits(t, w.namespace, o.namespace, o.labels)]
                if not hit:
                    continue
                for d in sorted(self.domains_of(a, t.topology_key)):
                    others = self._in_domain_sum(hit, t.topology_key, d)
                    z = self.in_domain(a, t.topology_key, d)
                    if others and z is not None:
                        self.m.add(sum(others) == 0).only_enforce_if(z)

    def _affinity(self) -> None:
        """Required pod affinity: in each term's domain a pod (not itself) matching every
        term, unless the pod is the first of its group."""
        for a, w in enumerate(self.pods):
            if not w.pod_affinity or not self.on[a]:
                continue
            terms = w.pod_affinity

            def every(ns: str, labels: Mapping[str, str], _t: tuple[PodAffinityTerm, ...] = terms,
                      _w: Workload = w) -> bool:
                return all(term_hits(t, _w.namespace, ns, labels) for t in _t)

            run = [r for r in self.snap.pods if r.uid != w.uid and every(r.namespace, r.labels)]
            mates = [b for b, o in enumerate(self.pods)
                     if b != a and o.uid != w.uid and every(o.namespace, o.labels)]
            can_first = every(w.namespace, w.labels) and not run
            if can_first and not mates:
                continue  # the first of its group whatever the batch does
            first = None
            if can_first:
                first = self.m.new_bool_var(f"first{a}")
                placed = sum(self.placed(b) for b in mates)
                self.m.add(placed == 0).only_enforce_if(first)
                self.m.add(placed >= 1).only_enforce_if(first.Not())
            for t in terms:
                near = {label(self.nodes[self.pos[r.node]], t.topology_key) for r in run
                        if r.node in self.pos}
                for d in sorted(self.domains_of(a, t.topology_key) - near):
                    z = self.in_domain(a, t.topology_key, d)
                    assert z is not None
                    mate = self._in_domain_sum(mates, t.topology_key, d)
                    if first is None:
                        if mate:
                            self.m.add(sum(mate) >= 1).only_enforce_if(z)
                        else:
                            self.m.add(z == 0)
                    elif mate:
                        self.m.add(sum(mate) >= 1).only_enforce_if([z, first.Not()])
                    else:
                        self.m.add_implication(z, first)

    def _spread(self) -> None:
        """``DoNotSchedule`` spread: the matching pods in the pod's domain, less the fewest
        in any eligible domain (0 below minDomains), at most maxSkew."""
        groups: dict[tuple[object, ...], tuple[dict[str, cp_model.LinearExpr],
                                               cp_model.LinearExpr | int]] = {}
        for a, w in enumerate(self.pods):
            for c in w.spread:
                if not c.hard or not self.on[a]:
                    continue
                elig = tuple(n for n, nd in enumerate(self.nodes)
                             if label(nd, c.topology_key) is not None
                             and (not c.honor_affinity or selector_and_taints(w, nd)[0])
                             and (not c.honor_taints or selector_and_taints(w, nd)[1]))
                if not elig:
                    continue
                key = (w.namespace, c, elig)
                if key not in groups:
                    groups[key] = self._spread_counts(w.namespace, c, elig)
                cnt, low = groups[key]
                for d in sorted(self.domains_of(a, c.topology_key) & set(cnt)):
                    z = self.in_domain(a, c.topology_key, d)
                    assert z is not None
                    self.m.add(cnt[d] <= low + c.max_skew).only_enforce_if(z)

    def _spread_counts(self, ns: str, c: SpreadConstraint, elig: tuple[int, ...]
                       ) -> tuple[dict[str, cp_model.LinearExpr], cp_model.LinearExpr | int]:
        """Per eligible domain, the matching pods there (running and placed); the least."""
        dom = {n: label(self.nodes[n], c.topology_key) for n in elig}
        names = {self.nodes[n].name: d for n, d in dom.items()}
        const: dict[str, int] = {d: 0 for d in dom.values() if d is not None}
        xs: dict[str, list[cp_model.IntVar]] = {d: [] for d in const}
        for r in self.snap.pods:
            d = names.get(r.node)
            if d is not None and not r.terminating and r.namespace == ns and selects(
                    c.selector, r.labels):
                const[d] += 1
        for b, o in enumerate(self.pods):
            if o.namespace != ns or not selects(c.selector, o.labels):
                continue
            for n in self.on[b]:
                d = dom.get(n)
                if d is not None:
                    xs[d].append(self.x[b, n])
        cnt = {d: cp_model.LinearExpr.sum(xs[d]) + const[d] for d in const}
        if c.min_domains is not None and len(cnt) < c.min_domains:
            return cnt, 0
        low = self.m.new_int_var(0, len(self.snap.pods) + len(self.pods), "low")
        self.m.add_min_equality(low, list(cnt.values()))
        return cnt, low

    def _gangs(self) -> None:
        gangs: dict[str, list[int]] = {}
        for p, w in enumerate(self.pods):
            if w.gang is not None:
                gangs.setdefault(w.gang, []).append(p)
        for ps in gangs.values():
            for p in ps[1:]:
                self.m.add(self.placed(p) == self.placed(ps[0]))

    # -- helpers the rules share --------------------------------------------------------
    def placed(self, p: int) -> cp_model.LinearExprT:
        return sum(self.x[p, n] for n in self.on[p])

    def in_domain(self, p: int, key: str, dom: str) -> cp_model.IntVar | None:
        """A literal: pod ``p`` is on a node whose ``key`` label is ``dom`` (None: never)."""
        k = (p, key, dom)
        if k not in self._in:
            xs = [self.x[p, n] for n in self.on[p] if label(self.nodes[n], key) == dom]
            if not xs:
                return None
            if len(xs) == 1:
                self._in[k] = xs[0]
            else:
                lit = self.m.new_bool_var(f"in{p}_{key}_{dom}")
                self.m.add(sum(xs) == lit)
                self._in[k] = lit
        return self._in[k]

    def _in_domain_sum(self, ps: Sequence[int], key: str, dom: str) -> list[cp_model.IntVar]:
        return [self.x[b, n] for b in ps for n in self.on[b]
                if label(self.nodes[n], key) == dom]

    def domains_of(self, p: int, key: str) -> set[str]:
        return {d for n in self.on[p] if (d := label(self.nodes[n], key)) is not None}

    # -- answers ------------------------------------------------------------------------
    def price(self, assignments: Mapping[str, str]) -> int:
        """The integer cost of ``assignments`` (every pair must be a variable)."""
        by_uid = {w.uid: i for i, w in enumerate(self.pods)}
        return sum(self.icost[by_uid[u], self.pos[n]] for u, n in assignments.items())

    def accepts(self, assignments: Mapping[str, str]) -> bool:
        """Whether the model's constraints hold with exactly ``assignments`` (uid -> node)."""
        by_uid = {w.uid: i for i, w in enumerate(self.pods)}
        want: set[tuple[int, int]] = set()
        for u, name in assignments.items():
            if u not in by_uid or name not in self.pos or (by_uid[u], self.pos[name]) not in self.x:
                return False
            want.add((by_uid[u], self.pos[name]))
        m = self.m.clone()
        for k, v in self.x.items():
            m.add(m.get_bool_var_from_proto_index(v.index) == int(k in want))
        s = cp_model.CpSolver()
        s.parameters.num_workers = 1
        s.parameters.max_time_in_seconds = 30.0
        return s.solve(m) in (cp_model.OPTIMAL, cp_model.FEASIBLE)

    def solve(self, seconds: float = 10.0, workers: int = 2,
              only: Iterable[str] | None = None, work: float | None = None) -> RefResult:
        """Most pods placed, then the least cost at that count, ``seconds`` per stage.
        ``only``: the placed pods are exactly these uids (one cost stage). ``work``: a limit
        on CP-SAT's deterministic time per stage too (what a loaded machine does not
        shorten; ``seconds`` stays the wall-clock cap)."""
        t0 = time.perf_counter()
        m = self.m.clone()
        xs = {k: m.get_bool_var_from_proto_index(v.index) for k, v in self.x.items()}
        count = sum(xs.values())
        s = cp_model.CpSolver()
        s.parameters.num_workers = workers
        s.parameters.max_time_in_seconds = seconds
        if work is not None:
            s.parameters.max_deterministic_time = work
        if only is not None:
            keep = set(only)
            for p, w in enumerate(self.pods):
                m.add(sum(xs[p, n] for n in self.on[p]) == int(w.uid in keep))
            c_status, placed, c_bound = "FIXED", len(keep), len(keep)
        else:
            m.maximize(count)
            st = s.solve(m)
            c_status = STATUS.get(st, str(st))
            if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
                return RefResult(c_status, 0, 0, c_status, math.nan, math.nan, {},
                                 time.perf_counter() - t0)
            placed = round(s.objective_value)
            c_bound = min(math.floor(s.best_objective_bound + 1e-6), len(self.pods))
            first = {self.pods[p].uid: self.nodes[n].name for (p, n), v in xs.items()
                     if s.boolean_value(v)}
            for v in xs.values():
                m.add_hint(v, s.boolean_value(v))
            m.add(count == placed)
        m.minimize(sum(self.icost[k] * v for k, v in xs.items()))
        st = s.solve(m)
        status = STATUS.get(st, str(st))
        scale = self.cfg.cost_scale
        if st not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            if only is None:  # the count stage's answer stands, its cost unimproved
                return RefResult(c_status, placed, c_bound, f"{status}: count stage's",
                                 self.price(first) / scale, math.nan, first,
                                 time.perf_counter() - t0)
            return RefResult(c_status, placed, c_bound, status, math.nan, math.nan, {},
                             time.perf_counter() - t0)
        got = {self.pods[p].uid: self.nodes[n].name for (p, n), v in xs.items()
               if s.boolean_value(v)}
        return RefResult(c_status, placed, c_bound, status, s.objective_value / scale,
                         s.best_objective_bound / scale, got, time.perf_counter() - t0)


def _req(w: Workload, r: int) -> int:
    return (w.requests.cpu_milli, w.requests.mem_bytes, w.requests.gpus)[r]


def _clash(a: HostPort, b: HostPort) -> bool:
    return a.protocol == b.protocol and a.port == b.port and (
        a.host_ip == b.host_ip or ZERO_IP in (a.host_ip, b.host_ip))


def running_on(snap: ClusterSnapshot) -> dict[str, list[RunningPod]]:
    out: dict[str, list[RunningPod]] = {}
    for p in snap.pods:
        out.setdefault(p.node, []).append(p)
    return out
