"""The smallest change that makes an unplaceable pod fit, one per part of its conflict.

For each part of the minimal conflict (``conflict.py``), the nodes that pass every *other*
part of the pod are the ones relaxing that part alone can open. Among them the change with
the least amount wins (the lowest latency, the most free cpu, the nearest security level;
ties to the cheapest node), and the pod with that change applied is checked by the
independent validator (``validate.py``) on that node before it is shown; a change the
validator refuses is not shown (the next node is tried, at most :data:`TRIES`).
Pure: no I/O, no clock.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .config import EngineConfig
from .conflict import (
    Conflict,
    Constraint,
    Parts,
    anti_probe,
    fmt_amount,
    minimal_conflict,
    parts_of,
    selector_text,
    term_text,
)
from .engine import PreparedCluster
from .filters import check_taints, requirement_matches
from .index import effective_p95
from .model import (
    HOSTNAME,
    ClusterSnapshot,
    HostPort,
    LinkInfo,
    NodeInfo,
    NodeSelectorTerm,
    Resources,
    Taint,
    Toleration,
    Workload,
    node_label,
)
from .preempt import RESOURCES, DisruptionBudget, eviction, without
from .sequential import SpreadState, ports_conflict
from .validate import validate

TRIES = 3  # candidate nodes the validator is asked about, per part
EVENT_CHARS = 900  # the event's share of cfnet's text (the API server caps a message at 1 KiB)


@dataclass(frozen=True, slots=True)
class Relaxation:
    """One checked suggestion: ``change`` applied to the pod (``workload``), and
    ``evict`` run first, makes ``node`` fit it, as the validator confirmed."""

    constraint: Constraint
    change: str
    node: str
    evidence: str
    workload: Workload
    evict: tuple[str, ...] = ()  # uids of running pods to evict first
    gang_size: int | None = None  # for a gang: the members that then fit

    def __str__(self) -> str:
        why = f" ({self.evidence})" if self.evidence else ""
        return f"{self.change}: {self.node} fits{why}"


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """A conflict with its suggestions, and the parts no change of its own can open."""

    conflict: Conflict
    relaxations: tuple[Relaxation, ...]
    dead_ends: tuple[tuple[Constraint, str], ...]

    def lines(self) -> list[str]:
        out = [str(self.conflict)]
        out += [f"  {r}" for r in self.relaxations]
        out += [f"  {c.text}: {why}" for c, why in self.dead_ends]
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def doc(self) -> dict[str, object]:
        """The answer as plain JSON types, for the console."""
        c = self.conflict
        return {"fits": c.fits, "nodes": c.nodes, "parts": c.parts, "checks": c.checks,
                "conflict": [x.text for x in c.constraints],
                "kinds": sorted({x.kind for x in c.alone or c.constraints}),
                "alone": [x.text for x in c.alone],
                "suggestions": [str(r) for r in self.relaxations],
                "dead_ends": [f"{x.text}: {why}" for x, why in self.dead_ends],
                "summary": str(c)}

    def event_text(self, limit: int = EVENT_CHARS) -> str:
        """One line for a FailedScheduling event, at most ``limit`` characters."""
        c = self.conflict
        if c.fits or not c.nodes:
            return ""
        what = (" and ".join(x.text for x in c.alone)
                + (" fails" if len(c.alone) == 1 else " fail") + " on every node"
                if c.alone else " + ".join(x.text for x in c.constraints) + " admit no node")
        tips = "; ".join(str(r) for r in self.relaxations)
        text = f"cfnet: {what}" + (f"; would fit: {tips}" if tips else "")
        return text if len(text) <= limit else text[:max(0, limit - 3)] + "..."


def diagnose(snapshot: ClusterSnapshot, w: Workload, config: EngineConfig | None = None,
             gang_size: int = 1, prepared: PreparedCluster | None = None,
             budgets: Sequence[DisruptionBudget] | None = ()) -> Diagnosis:
    """Why ``w`` fits no node of ``snapshot`` and what would make it fit (its own running
    pod, if any, taken out first). ``gang_size``: the members of ``w.gang``, itself included.
    ``prepared``: ``snapshot`` prepared once for many pending pods (used when ``w`` does not
    run in it; nothing in it is changed). ``budgets``: the PodDisruptionBudgets, for a
    suggestion to evict pods of lower priority (None: not known, no such suggestion)."""
    cfg = config or EngineConfig()
    snap = without(snapshot, (w.uid,))
    pc = (prepared if prepared is not None and snap is snapshot
          and prepared.snapshot is snapshot else PreparedCluster(snap, cfg, eager=False))
    parts = parts_of(snap, w, pc, gang_size)
    conflict = minimal_conflict(parts)
    if conflict.fits or not conflict.nodes:
        return Diagnosis(conflict, (), ())
    relaxations: list[Relaxation] = []
    dead: list[tuple[Constraint, str]] = []
    cost = np.nan_to_num(pc.cost(w), nan=np.inf)
    for c in conflict.alone or conflict.constraints:
        r = _relax_one(snap, parts, c, cost, cfg)
        if isinstance(r, Relaxation):
            relaxations.append(r)
        else:
            dead.append((c, r))
    cs = conflict.alone or conflict.constraints
    ev = eviction(snap, parts, cs, cost, cfg, budgets) if budgets is not None else None
    if ev is not None:  # beside the resource's own change: room made by evicting pods
        c = next(x for x in cs if x.kind in RESOURCES)
        relaxations.append(Relaxation(c, ev.change, ev.node, ev.evidence, w, ev.uids))
    return Diagnosis(conflict, tuple(relaxations), tuple(dead))


def diagnose_many(snapshot: ClusterSnapshot, pods: Sequence[tuple[Workload, int]],
                  config: EngineConfig | None = None,
                  budgets: Sequence[DisruptionBudget] | None = ()
                  ) -> list[Diagnosis | Exception]:
    """``diagnose`` for each (workload, gang size) of pods waiting together, ``snapshot``
    prepared once for them. A pod whose diagnosis fails gets its exception in its place,
    so the others still get theirs."""
    cfg = config or EngineConfig()
    prepared = PreparedCluster(snapshot, cfg, eager=False)
    out: list[Diagnosis | Exception] = []
    for w, gang_size in pods:
        try:
            out.append(diagnose(snapshot, w, cfg, gang_size, prepared, budgets))
        except Exception as exc:  # one pod's bug, not its neighbours'
            out.append(exc)
    return out


Candidate = tuple[Workload, str, str, tuple[str, ...]]  # (pod, change, evidence, evict)


def _relax_one(snap: ClusterSnapshot, parts: Parts, c: Constraint, cost: np.ndarray,
               cfg: EngineConfig) -> Relaxation | str:
    """The checked relaxation of ``c``, or why there is none."""
    if c.kind == "gang":
        return _relax_gang(snap, parts, c, cfg)
    others = [x for x in parts.masks if x != c and x.kind != "gang"]
    opened = parts.passing(others) & ~parts.masks[c]
    idx = np.flatnonzero(opened)
    if not idx.size:
        return "relaxing it alone opens no node (other constraints fail there too)"
    how = RELAXERS.get(c.kind)
    if how is None:
        return "no change to the pod opens a node (the nodes are full)"
    pc = parts.pc
    amount, build = how(parts, c, cfg)
    scored: list[tuple[float, float, int]] = []
    for i in idx.tolist():
        a = amount(pc.ix.nodes[i], i)
        if a is not None:
            scored.append((a, float(cost[i]), i))
    scored.sort()
    for _, _, i in scored[:TRIES]:
        nd = pc.ix.nodes[i]
        w2, change, evidence, evict = build(nd, i)
        name = nd.name
        probe = dataclasses.replace(w2, gang=None)
        if not validate(without(snap, evict), [probe], {w2.uid: name}, cfg):
            return Relaxation(c, change, name, evidence, w2, evict)
    if not scored:
        return "no figure to relax it by on the nodes it would open"
    return "the validator refused every nearest change"


def _relax_gang(snap: ClusterSnapshot, parts: Parts, c: Constraint, cfg: EngineConfig
                ) -> Relaxation | str:
    others = [x for x in parts.masks if x.kind != "gang"]
    fit = parts.capacity([*others, c])
    if fit < 1:
        return "not one member fits"
    w = parts.workload
    per = np.full(parts.pc.ix.n, fit, dtype=np.int64)
    for x in others:
        if x in parts.slots:
            per = np.minimum(per, parts.slots[x])
    members: list[Workload] = []
    assign: dict[str, str] = {}
    for i in np.flatnonzero(parts.passing(others)).tolist():
        for _ in range(int(min(per[i], fit - len(members)))):
            m = dataclasses.replace(w, uid=f"{w.uid}#{len(members)}")
            members.append(m)
            assign[m.uid] = parts.pc.ix.nodes[i].name
    if validate(snap, members, assign, cfg):
        return "the validator refused the smaller gang"
    first = assign[members[0].uid]
    where = f"{len(set(assign.values()))} nodes"
    return Relaxation(c, f"gang size {parts.gang_size} -> {fit}", first, where, w,
                      gang_size=fit)


Amount = Callable[[NodeInfo, int], "float | None"]
Build = Callable[[NodeInfo, int], Candidate]
Relaxer = Callable[[Parts, Constraint, EngineConfig], tuple[Amount, Build]]
"""Per kind: how far ``nd`` (position ``i``) is from passing the part (None: no change of
the pod opens it), and the changed pod with its text; built once per part."""


def _latency(parts: Parts, c: Constraint, cfg: EngineConfig) -> tuple[Amount, Build]:
    w = parts.workload
    lat = (parts.pc.ix.latency_to(w.latency_to) if w.latency_to is not None
           else np.full(parts.pc.ix.n, np.inf))

    def amount(nd: NodeInfo, i: int) -> float | None:
        return float(lat[i]) if math.isfinite(lat[i]) else None

    def build(nd: NodeInfo, i: int) -> Candidate:
        new = float(math.ceil(lat[i]))
        w2 = dataclasses.replace(w, max_latency_ms=new)
        change = f"max latency {w.max_latency_ms:g} ms -> {new:g} ms"
        return w2, change, link_evidence(parts.pc.snapshot, nd, w.latency_to or "", cfg), ()
    return amount, build


def best_link(snap: ClusterSnapshot, nd: NodeInfo, target: str, cfg: EngineConfig
              ) -> LinkInfo | None:
    """The measured link behind ``nd``'s latency to ``target`` (a node, zone or region):
    the one the engine counts lowest (None: none measured)."""
    members = {target} | {n.name for n in snap.nodes if target in (n.zone, n.region)}
    best = None
    for (a, b), lk in snap.links.items():
        if (a == nd.name and b in members) or (b == nd.name and a in members):
            v = effective_p95(lk, cfg)
            if best is None or v < best[0]:
                best = (v, lk)
    return None if best is None else best[1]


def link_evidence(snap: ClusterSnapshot, nd: NodeInfo, target: str, cfg: EngineConfig
                  ) -> str:
    """The measured link behind ``nd``'s latency to ``target``: p95, samples, age, and
    whether it is stale (its p95 counted ``stale_factor`` times)."""
    lk = best_link(snap, nd, target, cfg)
    if lk is None:
        return ""
    stale = (f", stale: counted x{cfg.stale_factor:g}" if lk.age_s > cfg.stale_after_s
             else "")
    return (f"p95 {lk.rtt_p95_ms:.1f} ms, {lk.samples} samples, {lk.age_s:.0f} s old"
            f"{stale}")


def _residency(parts: Parts, c: Constraint, cfg: EngineConfig) -> tuple[Amount, Build]:
    w = parts.workload
    old = ",".join(sorted(w.residency))

    def build(nd: NodeInfo, i: int) -> Candidate:
        w2 = dataclasses.replace(w, residency=w.residency | {nd.region})
        return w2, f"residency {old} -> {old},{nd.region}", "", ()
    return (lambda nd, i: 0.0), build


def _security(parts: Parts, c: Constraint, cfg: EngineConfig) -> tuple[Amount, Build]:
    w = parts.workload

    def build(nd: NodeInfo, i: int) -> Candidate:
        w2 = dataclasses.replace(w, min_security_level=nd.security_level)
        return w2, f"security level {w.min_security_level} -> {nd.security_level}", "", ()
    return (lambda nd, i: float(w.min_security_level - nd.security_level)), build


def _node_selector(parts: Parts, c: Constraint, cfg: EngineConfig) -> tuple[Amount, Build]:
    w = parts.workload

    def build(nd: NodeInfo, i: int) -> Candidate:
        sel = dict(w.node_selector)
        have = node_label(nd, c.key)
        if have is None:
            del sel[c.key]
            change = f"drop nodeSelector {c.key}={w.node_selector[c.key]}"
        else:
            sel[c.key] = have
            change = f"nodeSelector {c.key}={w.node_selector[c.key]} -> {c.key}={have}"
        return dataclasses.replace(w, node_selector=sel), change, "", ()
    return (lambda nd, i: float(node_label(nd, c.key) is None)), build


def _affinity_term(w: Workload, nd: NodeInfo) -> tuple[int, int] | None:
    """(failing requirements, index) of the term nearest to matching ``nd``."""
    best: tuple[int, int] | None = None
    for j, t in enumerate(w.node_affinity):
        bad = sum(not requirement_matches(r, node_label(nd, r.key))
                  for r in t.match_expressions)
        if t.match_expressions and (best is None or bad < best[0]):
            best = (bad, j)
    return best


def _node_affinity(parts: Parts, c: Constraint, cfg: EngineConfig) -> tuple[Amount, Build]:
    """The term with the fewest failing requirements at the node, those widened (``In``:
    the node's value added) or dropped."""
    w = parts.workload

    def amount(nd: NodeInfo, i: int) -> float | None:
        best = _affinity_term(w, nd)
        return None if best is None else float(best[0])

    def build(nd: NodeInfo, i: int) -> Candidate:
        j = (_affinity_term(w, nd) or (0, 0))[1]
        reqs, said = [], []
        for r in w.node_affinity[j].match_expressions:
            v = node_label(nd, r.key)
            if requirement_matches(r, v):
                reqs.append(r)
            elif r.operator == "In" and v is not None:
                reqs.append(dataclasses.replace(r, values=(*r.values, v)))
                said.append(f"{r.key} In ({','.join(r.values)}) -> "
                             f"In ({','.join(reqs[-1].values)})")
            else:
                said.append(f"drop {r.key} {r.operator} ({','.join(r.values)})")
        terms = list(w.node_affinity)
        terms[j] = NodeSelectorTerm(tuple(reqs))
        if not reqs:  # an empty term matches nothing: the affinity goes as a whole
            return dataclasses.replace(w, node_affinity=()), "drop required node affinity", \
                "", ()
        change = "node affinity " + ", ".join(said)
        return dataclasses.replace(w, node_affinity=tuple(terms)), change, "", ()
    return amount, build


def _untolerated(w: Workload, c: Constraint, nd: NodeInfo) -> list[Taint]:
    return [t for t in nd.taints if check_taints(w.tolerations, (t,)) is not None
            and (c.key == "*" or f"{t.key}={t.value}:{t.effect}" == c.key)]


def _taint(parts: Parts, c: Constraint, cfg: EngineConfig) -> tuple[Amount, Build]:
    w = parts.workload

    def build(nd: NodeInfo, i: int) -> Candidate:
        bad = _untolerated(w, c, nd)
        tols = tuple(Toleration(t.key, "Equal", t.value, t.effect) for t in bad)
        w2 = dataclasses.replace(w, tolerations=(*w.tolerations, *tols))
        change = "tolerate " + ", ".join(f"{t.key}={t.value}:{t.effect}" for t in bad)
        return w2, change, "", ()
    return (lambda nd, i: float(len(_untolerated(w, c, nd))) or None), build


def _resource(parts: Parts, c: Constraint, cfg: EngineConfig) -> tuple[Amount, Build]:
    w = parts.workload
    r = ("cpu", "memory", "gpu").index(c.kind)
    free = parts.pc.free[:, r]
    vals = [w.requests.cpu_milli, w.requests.mem_bytes, w.requests.gpus]

    def build(nd: NodeInfo, i: int) -> Candidate:
        new = list(vals)
        new[r] = int(free[i])
        w2 = dataclasses.replace(w, requests=Resources(*new))
        change = f"{c.kind} {fmt_amount(c.kind, vals[r])} -> {fmt_amount(c.kind, new[r])}"
        return w2, change, f"{fmt_amount(c.kind, new[r])} free", ()
    return (lambda nd, i: float(vals[r] - free[i])), build


def _extended(parts: Parts, c: Constraint, cfg: EngineConfig) -> tuple[Amount, Build]:
    w = parts.workload
    used = parts.usage.ext_used.get(c.key)

    def left(nd: NodeInfo, i: int) -> int:
        return max(0, int(nd.extended.get(c.key, 0)) - (int(used[i]) if used is not None
                                                          else 0))

    def build(nd: NodeInfo, i: int) -> Candidate:
        n = left(nd, i)
        w2 = dataclasses.replace(w, extended={**w.extended, c.key: n})
        return w2, f"{c.key} {w.extended[c.key]} -> {n}", f"{n} free", ()
    return (lambda nd, i: float(w.extended[c.key] - left(nd, i))), build


def _free_port(w: Workload, hp: HostPort, taken: Sequence[HostPort]) -> int | None:
    mine = [h for h in w.host_ports if h is not hp]
    for port in range(hp.port + 1, min(hp.port + 64, 65536)):
        if not any(ports_conflict(dataclasses.replace(hp, port=port), b)
                   for b in [*taken, *mine]):
            return port
    return None


def _host_port(parts: Parts, c: Constraint, cfg: EngineConfig) -> tuple[Amount, Build]:
    w = parts.workload
    hp = next(h for h in w.host_ports if f"{h.protocol}/{h.port}" == c.key)

    def amount(nd: NodeInfo, i: int) -> float | None:
        port = _free_port(w, hp, parts.usage.ports.get(i, []))
        return None if port is None else float(port - hp.port)

    def build(nd: NodeInfo, i: int) -> Candidate:
        port = _free_port(w, hp, parts.usage.ports.get(i, [])) or hp.port
        ports = tuple(dataclasses.replace(hp, port=port) if h is hp else h
                      for h in w.host_ports)
        change = f"hostPort {hp.protocol}/{hp.port} -> {hp.protocol}/{port}"
        return dataclasses.replace(w, host_ports=ports), change, "", ()
    return amount, build


def _spread(parts: Parts, c: Constraint, cfg: EngineConfig) -> tuple[Amount, Build]:
    w = parts.workload
    pc = parts.pc
    sc = next(s for s in w.spread if s.hard
              and f"{s.topology_key} {selector_text(s.selector)}" == c.key)
    by = {fr.name: fr.ok for fr in pc.filter_results(w, resources=False)}
    st = SpreadState(pc, w, sc, by["node_selector"] & by["node_affinity"], by["taints"])
    # no node carries the key: no skew opens one
    skew = st.skew() if st.counts.size else np.full(pc.ix.n, 2**40)

    def build(nd: NodeInfo, i: int) -> Candidate:
        new = dataclasses.replace(sc, max_skew=int(skew[i]))
        w2 = dataclasses.replace(w, spread=tuple(new if s is sc else s for s in w.spread))
        return w2, f"spread maxSkew {sc.max_skew} -> {int(skew[i])}", "", ()
    return (lambda nd, i: float(skew[i]) if sc.max_skew < skew[i] < 2**31 else None), build


def _pod_affinity(parts: Parts, c: Constraint, cfg: EngineConfig) -> tuple[Amount, Build]:
    w2 = dataclasses.replace(parts.workload, pod_affinity=())
    return (lambda nd, i: 0.0), (lambda nd, i: (w2, f"drop {c.text}", "", ()))


def _anti(parts: Parts, c: Constraint, cfg: EngineConfig) -> tuple[Amount, Build]:
    """A term per zone or region narrowed to per node where that opens the node, else
    dropped."""
    w = parts.workload
    t = next(x for x in w.pod_anti_affinity if term_text(x) == c.key)
    narrow = dataclasses.replace(t, topology_key=HOSTNAME)
    ok = np.zeros(parts.pc.ix.n, dtype=bool)
    if t.topology_key != HOSTNAME:
        for fr in parts.pc.filter_results(anti_probe(w, narrow), resources=False):
            if fr.name == "pod_anti_affinity":
                ok = np.asarray(fr.ok, dtype=bool)

    def build(nd: NodeInfo, i: int) -> Candidate:
        if ok[i]:
            terms = tuple(narrow if x is t else x for x in w.pod_anti_affinity)
            w2 = dataclasses.replace(w, pod_anti_affinity=terms)
            return w2, f"anti-affinity {c.key} -> {term_text(narrow)}", "", ()
        rest = tuple(x for x in w.pod_anti_affinity if x is not t)
        return dataclasses.replace(w, pod_anti_affinity=rest), f"drop {c.text}", "", ()
    return (lambda nd, i: 0.0 if ok[i] else 1.0), build


def _repellers(parts: Parts, nd: NodeInfo) -> list[tuple[str, str]]:
    """(uid, namespace/name) of the running pods whose anti-affinity repels the pod on nd."""
    pc = parts.pc
    out: list[tuple[str, str]] = []
    for p, t in pc.pods.repelling(parts.workload):
        j = pc.ix.pos.get(p.node)
        d = node_label(pc.ix.nodes[j], t.topology_key) if j is not None else None
        if d is not None and d == node_label(nd, t.topology_key) and \
                all(p.uid != u for u, _ in out):
            out.append((p.uid, f"{p.namespace}/{p.name}"))
    return out


def _repelled(parts: Parts, c: Constraint, cfg: EngineConfig) -> tuple[Amount, Build]:
    def build(nd: NodeInfo, i: int) -> Candidate:
        who = _repellers(parts, nd)
        # pods of other namespaces are counted, never named: the answer goes into this
        # pod's event, which its tenant reads
        ns = parts.workload.namespace
        own = [n for n in (name for _, name in who) if n.startswith(f"{ns}/")]
        other = len(who) - len(own)
        said = [*own[:3], *([f"{other} pod(s) of other namespaces"] if other else [])]
        more = f" (+{len(own) - 3})" if len(own) > 3 else ""
        change = f"evict {', '.join(said)}{more}"
        return (parts.workload, change, "their anti-affinity repels this pod",
                tuple(u for u, _ in who))
    return (lambda nd, i: float(len(_repellers(parts, nd))) or None), build


RELAXERS: dict[str, Relaxer] = {
    "latency": _latency, "residency": _residency, "security": _security,
    "node_selector": _node_selector, "node_affinity": _node_affinity, "taint": _taint,
    "cpu": _resource, "memory": _resource, "gpu": _resource, "extended": _extended,
    "host_port": _host_port, "spread": _spread, "pod_affinity": _pod_affinity,
    "pod_anti_affinity": _anti, "repelled": _repelled,
}
"""Per kind, the change that opens one node and its amount (smaller is nearer)."""


def explain_extras(snapshot: ClusterSnapshot, w: Workload, node: str | None,
                   config: EngineConfig | None = None, gang_size: int = 1,
                   budgets: Sequence[DisruptionBudget] | None = ()) -> dict[str, object]:
    """What ``explain`` adds to the engine's explanation: for a pod on no node, the minimal
    conflict and its checked suggestions (``conflict``); for one with a latency SLA on a
    node, the link figure behind it with its sample count and age (``link``)."""
    cfg = config or EngineConfig()
    out: dict[str, object] = {}
    if node is None:
        out["conflict"] = diagnose(snapshot, w, cfg, gang_size, budgets=budgets).doc()
    elif w.latency_to is not None:
        nd = next((n for n in snapshot.nodes if n.name == node), None)
        if nd is not None and w.latency_to in (nd.name, nd.zone, nd.region):
            out["link"] = f"{node} -> {w.latency_to}: inside it (0 ms)"
        elif nd is not None:
            ev = link_evidence(snapshot, nd, w.latency_to, cfg)
            out["link"] = (f"{node} -> {w.latency_to}: {ev}" if ev
                           else f"{node} -> {w.latency_to}: no measured link")
            lk = best_link(snapshot, nd, w.latency_to, cfg)
            if lk is not None:  # the same figures, for a program to read
                out["link_figures"] = {"p95_ms": lk.rtt_p95_ms, "samples": lk.samples,
                                       "age_s": lk.age_s,
                                       "stale": lk.age_s > cfg.stale_after_s}
    return out
