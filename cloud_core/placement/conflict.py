"""Why a pod fits no node: a minimal set of its hard constraints that together admit none.

Each hard constraint of the pod is split into its parts (one per nodeSelector key, taint,
resource, host port, anti-affinity term, spread constraint ...) and each part is evaluated
over every node on its own, with the engine's own filters (``PreparedCluster``,
``filters.py``, ``sequential.SpreadState``), so a part means exactly what placement means.
A set of parts is *feasible* when some online node passes all of them (for a gang: when the
nodes passing them hold every member). The conflict reported is:

* every part that fails on every node by itself ("alone"), when there is one; else
* a smallest set found by exhaustive search up to :data:`EXHAUSTIVE_SIZE` parts, else a
  deletion filter (parts that pass the most nodes are tried for removal first). Either way
  it is minimal: dropping any one of its parts leaves a node that passes the rest.

Cost: one boolean mask per (part, node), built once (numpy over the nodes, python over the
distinct label values and the running pods with the relevant terms); the search then ANDs
masks, at most :data:`MAX_CHECKS` feasibility checks of at most :data:`MAX_PARTS` masks.
Pure: no I/O, no clock. ``relax.py`` turns a conflict into checked suggestions.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from .engine import PreparedCluster
from .filters import check_taints, term_matches_pod
from .model import (
    HOSTNAME,
    ClusterSnapshot,
    HostPort,
    LabelSelector,
    PodAffinityTerm,
    Resources,
    Taint,
    Toleration,
    Workload,
)
from .sequential import SpreadState, ports_conflict

EXHAUSTIVE_SIZE = 3  # sets up to this size are searched exhaustively (smallest first)
MAX_CHECKS = 4096  # feasibility checks of the exhaustive search, at most
MAX_PARTS = 64  # parts considered; past it, the rest of one kind are merged into one
MAX_TAINTS = 16  # distinct untolerated taints named one by one
NOBODY = "\x00cfnet-none"  # a namespace no pod can have: probes see only their own terms


@dataclass(frozen=True, slots=True)
class Constraint:
    """One part of a pod's hard constraints. ``kind`` is stable (metric label), ``key``
    tells parts of one kind apart, ``text`` is what the operator wrote, for people."""

    kind: str
    key: str
    text: str


KINDS = ("latency", "residency", "security", "node_selector", "node_affinity", "taint",
         "cpu", "memory", "gpu", "extended", "host_port", "pods", "spread", "pod_affinity",
         "pod_anti_affinity", "repelled", "gang")
"""Every ``Constraint.kind``, in the order conflicts list them."""


@dataclass(frozen=True, slots=True)
class Parts:
    """A pod's parts with their masks over the snapshot's nodes (``online``: the nodes
    considered at all), and what the search and the suggestions need again."""

    pc: PreparedCluster
    workload: Workload
    online: np.ndarray
    masks: dict[Constraint, np.ndarray]
    slots: dict[Constraint, np.ndarray]  # per node, pods of this kind it holds (gang count)
    gang_size: int
    usage: NodePods  # what the running pods take per node

    def feasible(self, parts: Iterable[Constraint]) -> bool:
        """Some online node passes every part (with ``gang``: they hold every member)."""
        return bool(self.capacity(parts) >= self.need(parts))

    def need(self, parts: Iterable[Constraint]) -> int:
        return self.gang_size if any(c.kind == "gang" for c in parts) else 1

    def passing(self, parts: Iterable[Constraint]) -> np.ndarray:
        m = self.online.copy()
        for c in parts:
            if c.kind != "gang":
                m &= self.masks[c]
        return m

    def capacity(self, parts: Iterable[Constraint]) -> int:
        """Pods like this one the nodes passing ``parts`` hold (one per node without a
        gang; with one, what the parts' resources, slots and ports leave, up to its size)."""
        parts = list(parts)
        m = self.passing(parts)
        if not any(c.kind == "gang" for c in parts):
            return int(m.any())
        per = np.full(int(m.sum()), self.gang_size, dtype=np.int64)
        for c in parts:
            if c in self.slots:
                per = np.minimum(per, self.slots[c][m])
        return int(per.sum())


@dataclass(frozen=True, slots=True)
class Conflict:
    """The answer for one pod: ``fits`` (some node takes it) or a minimal conflicting set."""

    uid: str
    nodes: int  # online nodes considered
    fits: bool
    constraints: tuple[Constraint, ...]  # minimal: drop any one and a node fits the rest
    alone: tuple[Constraint, ...]  # parts failing on every node by themselves
    parts: int  # parts of the pod's constraints considered
    checks: int  # feasibility checks the search made

    def __str__(self) -> str:
        if self.fits:
            return f"{self.uid}: fits ({self.nodes} online nodes)"
        if not self.nodes:
            return f"{self.uid}: no node is online"
        if self.alone:
            names = "; ".join(c.text for c in self.alone)
            return f"{self.uid}: no node meets {names} (each alone fails on every node)"
        names = " + ".join(c.text for c in self.constraints)
        return f"{self.uid}: no node meets {names} together"


def _stripped(w: Workload) -> Workload:
    """``w`` without a hard constraint: what every probe starts from."""
    return dataclasses.replace(
        w, requests=Resources(), node_selector={}, node_affinity=(), tolerations=(),
        pod_affinity=(), pod_anti_affinity=(), max_latency_ms=None, residency=frozenset(),
        min_security_level=0, gang=None, spread=tuple(c for c in w.spread if not c.hard),
        host_ports=(), extended={})


def _mask(pc: PreparedCluster, w: Workload, name: str) -> np.ndarray:
    for fr in pc.filter_results(w, resources=False):
        if fr.name == name:
            return np.asarray(fr.ok, dtype=bool)
    raise KeyError(name)  # a filter the engine no longer has: a bug here, not input


def _fmt_mem(b: int) -> str:
    for unit, size in (("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if b >= size:
            return f"{b / size:.3g}{unit}"
    return str(b)


def fmt_amount(kind: str, v: int) -> str:
    """A resource amount as an operator writes it (cpu in cores, memory in Mi/Gi)."""
    if kind == "cpu":
        return f"{v / 1000:g}"
    if kind == "memory":
        return _fmt_mem(v)
    return str(v)


def selector_text(sel: LabelSelector) -> str:
    """``app=db,tier In (a,b)`` for a label selector (``*``: every pod)."""
    out = [f"{k}={v}" for k, v in sorted(sel.match_labels.items())]
    for r in sel.match_expressions:
        vals = f" ({','.join(r.values)})" if r.values else ""
        out.append(f"{r.key} {r.operator}{vals}")
    return ",".join(out) or "*"


def term_text(t: PodAffinityTerm) -> str:
    """``app=db per zone`` for a pod (anti-)affinity term."""
    per = t.topology_key.rsplit("/", 1)[-1]
    per = "node" if t.topology_key == HOSTNAME else per
    ns = f" in {','.join(t.namespaces)}" if t.namespaces else ""
    return f"{selector_text(t.selector)}{ns} per {per}"


def anti_probe(w: Workload, t: PodAffinityTerm) -> Workload:
    """A workload with ``t`` as its only anti-affinity term, in a namespace no running pod's
    term selects: its mask is the term's own, without the repulsion of others."""
    own = dataclasses.replace(t, namespaces=t.namespaces or (w.namespace,))
    return dataclasses.replace(_stripped(w), namespace=NOBODY, labels={},
                               pod_anti_affinity=(own,))


def _static_parts(pc: PreparedCluster, w: Workload, out: dict[Constraint, np.ndarray]
                  ) -> None:
    full = {fr.name: np.asarray(fr.ok, dtype=bool) for fr in pc.filter_results(w, resources=False)}
    base = _stripped(w)
    if w.max_latency_ms is not None:
        to = w.latency_to or "nowhere"
        out[Constraint("latency", to, f"max latency {w.max_latency_ms:g} ms to {to}")] = \
            full["latency"]
    if w.residency:
        out[Constraint("residency", "", f"residency {','.join(sorted(w.residency))}")] = \
            full["residency"]
    if w.min_security_level:
        out[Constraint("security", "", f"security level {w.min_security_level}")] = \
            full["security"]
    for k, v in sorted(w.node_selector.items()):
        probe = dataclasses.replace(base, node_selector={k: v})
        out[Constraint("node_selector", k, f"nodeSelector {k}={v}")] = \
            _mask(pc, probe, "node_selector")
    if w.node_affinity:
        out[Constraint("node_affinity", "", "required node affinity")] = full["node_affinity"]
    _taint_parts(pc, w, out)
    for r, kind in enumerate(("cpu", "memory", "gpu")):
        want = (w.requests.cpu_milli, w.requests.mem_bytes, w.requests.gpus)[r]
        if want > 0:
            out[Constraint(kind, "", f"{kind} {fmt_amount(kind, want)}")] = \
                np.asarray(pc.free[:, r] >= want, dtype=bool)
    if w.pod_affinity:
        text = " and ".join(term_text(t) for t in w.pod_affinity)
        out[Constraint("pod_affinity", "", f"pod affinity {text}")] = full["pod_affinity"]
    for t in w.pod_anti_affinity:
        out[Constraint("pod_anti_affinity", term_text(t), f"anti-affinity {term_text(t)}")] = \
            _mask(pc, anti_probe(w, t), "pod_anti_affinity")
    repelled = _mask(pc, base, "pod_anti_affinity")
    if not repelled.all():
        who = sorted({f"{p.namespace}/{p.name}" for p, _ in pc.pods.repelling(w)})
        more = f" (+{len(who) - 3})" if len(who) > 3 else ""
        out[Constraint("repelled", "", "anti-affinity of running pods "
                       f"{', '.join(who[:3])}{more}")] = repelled


def _taint_parts(pc: PreparedCluster, w: Workload, out: dict[Constraint, np.ndarray]) -> None:
    """One part per distinct taint the pod does not tolerate (the first MAX_TAINTS by how
    many nodes carry them; the rest as one part)."""
    by_taint: dict[Taint, list[int]] = {}
    for i, nd in enumerate(pc.ix.nodes):
        for t in nd.taints:
            if check_taints(w.tolerations, (t,)) is not None:
                by_taint.setdefault(t, []).append(i)
    ranked = sorted(by_taint, key=lambda t: (-len(by_taint[t]), t.key, t.value, t.effect))
    rest = np.ones(pc.ix.n, dtype=bool)
    for j, t in enumerate(ranked):
        m = np.ones(pc.ix.n, dtype=bool)
        m[by_taint[t]] = False
        if j < MAX_TAINTS:
            text = f"untolerated taint {t.key}={t.value}:{t.effect}"
            out[Constraint("taint", f"{t.key}={t.value}:{t.effect}", text)] = m
        else:
            rest &= m
    if not rest.all():
        out[Constraint("taint", "*", f"{len(ranked) - MAX_TAINTS} more untolerated taints")] \
            = rest


@dataclass(frozen=True, slots=True)
class NodePods:
    """What the running pods take per node: pod slots, extended resources, host ports."""

    count: np.ndarray
    ext_used: dict[str, np.ndarray]
    ports: dict[int, list[HostPort]]

    @classmethod
    def of(cls, pc: PreparedCluster) -> NodePods:
        count = np.zeros(pc.ix.n, dtype=np.int64)
        used: dict[str, np.ndarray] = {}
        ports: dict[int, list[HostPort]] = {}
        for p in pc.snapshot.pods:
            i = pc.ix.pos.get(p.node)
            if i is None:
                continue
            count[i] += 1
            for k, v in p.extended.items():
                used.setdefault(k, np.zeros(pc.ix.n, dtype=np.int64))[i] += int(v)
            if p.host_ports:
                ports.setdefault(i, []).extend(p.host_ports)
        return cls(count, used, ports)


def _pod_parts(pc: PreparedCluster, w: Workload, np_: NodePods, gang_size: int,
               out: dict[Constraint, np.ndarray], slots: dict[Constraint, np.ndarray]) -> None:
    """The parts the engine checks pod by pod: slots, extended resources, ports, spread."""
    n = pc.ix.n
    max_pods = np.array([n_ if (n_ := nd.max_pods) is not None else 2**40
                         for nd in pc.ix.nodes], dtype=np.int64)
    room = max_pods - np_.count
    if (room < gang_size).any():  # a gang needs a slot per member
        c = Constraint("pods", "", "a free pod slot")
        out[c] = room > 0
        slots[c] = np.maximum(room, 0)
    for k, v in sorted(w.extended.items()):
        cap = np.array([nd.extended.get(k, 0) for nd in pc.ix.nodes], dtype=np.int64)
        left = cap - np_.ext_used.get(k, np.zeros(n, dtype=np.int64))
        c = Constraint("extended", k, f"{k} {int(v)}")
        out[c] = left >= int(v)
        if int(v) > 0:
            slots[c] = np.maximum(left, 0) // int(v)
    for hp in w.host_ports:
        m = np.ones(n, dtype=bool)
        for i, taken in np_.ports.items():
            m[i] = not any(ports_conflict(hp, b) for b in taken)
        c = Constraint("host_port", f"{hp.protocol}/{hp.port}",
                       f"hostPort {hp.protocol}/{hp.port}")
        out[c] = m
        slots[c] = m.astype(np.int64)  # one pod per node: the port is taken after it
    hard = [c for c in w.spread if c.hard]
    if hard:
        by = {fr.name: np.asarray(fr.ok, dtype=bool)
              for fr in pc.filter_results(w, resources=False)}
        for sc in hard:
            st = SpreadState(pc, w, sc, by["node_selector"] & by["node_affinity"],
                             by["taints"])
            key = f"{sc.topology_key} {selector_text(sc.selector)}"
            out[Constraint("spread", key, f"spread maxSkew {sc.max_skew} per "
                           f"{sc.topology_key.rsplit('/', 1)[-1]} "
                           f"({selector_text(sc.selector)})")] = st.ok()


def parts_of(snapshot: ClusterSnapshot, w: Workload, pc: PreparedCluster,
             gang_size: int = 1) -> Parts:
    """Every part of ``w``'s hard constraints with its mask over ``snapshot``'s nodes.
    ``pc`` is prepared on ``snapshot`` without ``w``'s own running pod (it must not crowd or
    repel itself); ``gang_size``: the members of its gang (``w.gang``), itself included."""
    masks: dict[Constraint, np.ndarray] = {}
    slots: dict[Constraint, np.ndarray] = {}
    _static_parts(pc, w, masks)
    usage = NodePods.of(pc)
    _pod_parts(pc, w, usage, max(1, gang_size) if w.gang is not None else 1, masks, slots)
    req = (w.requests.cpu_milli, w.requests.mem_bytes, w.requests.gpus)
    for c in masks:
        if c.kind in ("cpu", "memory", "gpu"):
            r = ("cpu", "memory", "gpu").index(c.kind)
            slots[c] = np.maximum(pc.free[:, r], 0) // req[r]
    if w.gang is not None and gang_size > 1:
        masks[Constraint("gang", w.gang, f"gang {w.gang} of {gang_size}")] = \
            np.ones(pc.ix.n, dtype=bool)
    online = _mask(pc, _stripped(w), "health")
    if len(masks) > MAX_PARTS:  # bounded: the least selective parts merged into one
        ranked = sorted(masks, key=lambda c: int(masks[c].sum()))
        rest = ranked[MAX_PARTS - 1:]
        merged = np.logical_and.reduce([masks[c] for c in rest])
        masks = {c: masks[c] for c in ranked[:MAX_PARTS - 1]}
        masks[Constraint("merged", "", f"{len(rest)} more constraints")] = merged
    return Parts(pc, w, online, masks, slots, max(1, gang_size), usage)


def minimal_conflict(parts: Parts) -> Conflict:
    """A minimal conflicting set of ``parts`` (see the module docstring)."""
    w = parts.workload
    every = [c for k in (*KINDS, "merged") for c in parts.masks if c.kind == k]
    n_online = int(parts.online.sum())
    checks = 1
    if parts.feasible(every) or not n_online:
        return Conflict(w.uid, n_online, bool(n_online), (), (), len(every), checks)
    alone = tuple(c for c in every if not parts.feasible([c]))
    checks += len(every)
    if alone:
        return Conflict(w.uid, n_online, False, alone[:1], alone, len(every), checks)
    found: tuple[Constraint, ...] | None = None
    for size in range(2, EXHAUSTIVE_SIZE + 1):
        for combo in itertools.combinations(every, size):
            checks += 1
            if checks > MAX_CHECKS:
                break
            if not parts.feasible(combo):
                found = combo
                break
        if found is not None or checks > MAX_CHECKS:
            break
    if found is None:
        found = _deletion_filter(parts, every)
        checks += len(every)
    return Conflict(w.uid, n_online, False, found, (), len(every), checks)


def _deletion_filter(parts: Parts, every: Sequence[Constraint]) -> tuple[Constraint, ...]:
    """Drop each part whose absence keeps the set infeasible; what stays is minimal (the
    check is monotone: more parts never admit more nodes). The parts passing the most nodes
    go first, so the selective ones tend to stay and the set stays small."""
    keep = list(every)
    for c in sorted(every, key=lambda c: -int(parts.passing([c]).sum())):
        trial = [x for x in keep if x != c]
        if not parts.feasible(trial):
            keep = trial
    return tuple(x for x in every if x in keep)


def drop(snapshot: ClusterSnapshot, w: Workload, parts: Iterable[Constraint]
         ) -> tuple[ClusterSnapshot, Workload]:
    """``snapshot`` and ``w`` with ``parts`` gone: what "dropping a constraint" means. Parts
    of the pod's spec are removed from it (a taint is tolerated); the two that are not the
    pod's own are removed from the cluster (``repelled``: the pods repelling it are gone;
    ``pods``: no node has a pod limit)."""
    snap = snapshot
    for c in parts:
        k = c.kind
        if k == "latency":
            w = dataclasses.replace(w, max_latency_ms=None, latency_to=None)
        elif k == "residency":
            w = dataclasses.replace(w, residency=frozenset())
        elif k == "security":
            w = dataclasses.replace(w, min_security_level=0)
        elif k == "node_selector":
            w = dataclasses.replace(w, node_selector={a: b for a, b in w.node_selector.items()
                                                      if a != c.key})
        elif k == "node_affinity":
            w = dataclasses.replace(w, node_affinity=())
        elif k == "taint":
            tol = Toleration(operator="Exists") if c.key == "*" else _toleration(c.key)
            w = dataclasses.replace(w, tolerations=(*w.tolerations, tol))
        elif k in ("cpu", "memory", "gpu"):
            req = [w.requests.cpu_milli, w.requests.mem_bytes, w.requests.gpus]
            req[("cpu", "memory", "gpu").index(k)] = 0
            w = dataclasses.replace(w, requests=Resources(*req))
        elif k == "extended":
            w = dataclasses.replace(w, extended={a: b for a, b in w.extended.items()
                                                 if a != c.key})
        elif k == "host_port":
            w = dataclasses.replace(w, host_ports=tuple(
                h for h in w.host_ports if f"{h.protocol}/{h.port}" != c.key))
        elif k == "spread":
            w = dataclasses.replace(w, spread=tuple(
                s for s in w.spread
                if not s.hard or f"{s.topology_key} {selector_text(s.selector)}" != c.key))
        elif k == "pod_affinity":
            w = dataclasses.replace(w, pod_affinity=())
        elif k == "pod_anti_affinity":
            w = dataclasses.replace(w, pod_anti_affinity=tuple(
                t for t in w.pod_anti_affinity if term_text(t) != c.key))
        elif k == "gang":
            w = dataclasses.replace(w, gang=None)
        elif k == "pods":
            snap = dataclasses.replace(snap, nodes=tuple(
                dataclasses.replace(n, max_pods=None) for n in snap.nodes))
        elif k == "repelled":  # the pods stay (they count for the rest): not their terms
            snap = dataclasses.replace(snap, pods=tuple(
                dataclasses.replace(p, anti_affinity=tuple(
                    t for t in p.anti_affinity
                    if not term_matches_pod(t, p.namespace, w.namespace, w.labels)))
                for p in snap.pods))
    return snap, w


def _toleration(key: str) -> Toleration:
    """The toleration of a taint part's key (``key=value:effect``)."""
    kv, _, effect = key.rpartition(":")
    k, _, v = kv.partition("=")
    return Toleration(k, "Equal", v, effect)
