"""A batch's classes and its rounds, for the batch engine (``engine.py``): the classes of
identical workloads, the pod-affinity dependencies between them that order the rounds,
which classes a round may place, anti-affinity between the classes of one round, and gangs
taken back when they come out of the routes in part. Pure functions over the batch.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from cloud_core.errors import PlacementError

from .filters import term_matches_pod
from .model import PodAffinityTerm, Workload
from .prepared import ClusterView, PodIndex, class_key, request_vector
from .solver import ClassSpec


def set_conflicts(reps: list[Workload], specs: list[ClassSpec]) -> None:
    """Anti-affinity between classes of one round, symmetric, per topology key."""
    by_label: dict[tuple[str, str, str], list[int]] = {}
    for b, wb in enumerate(reps):
        for k, v in wb.labels.items():
            by_label.setdefault((wb.namespace, k, v), []).append(b)
    for a, wa in enumerate(reps):
        for t in wa.pod_anti_affinity:
            if t.selector.match_labels:
                k, v = next(iter(t.selector.match_labels.items()))
                cands = [b for ns in t.namespaces or (wa.namespace,)
                         for b in by_label.get((ns, k, v), [])]
            else:
                cands = list(range(len(reps)))
            for b in cands:
                wb = reps[b]
                if term_matches_pod(t, wa.namespace, wb.namespace, wb.labels):
                    for x, y in ((a, b), (b, a)):
                        lst = specs[x].conflicts.setdefault(t.topology_key, [])
                        if y not in lst:
                            lst.append(y)


def classes_of(workloads: Sequence[Workload]) -> list[list[Workload]]:
    """The batch's classes of identical workloads, in order of first appearance."""
    seen: set[str] = set()
    groups: dict[tuple[Hashable, ...], list[Workload]] = {}
    for w in workloads:
        if w.uid in seen:
            raise PlacementError(f"duplicate workload uid {w.uid!r} in one batch")
        seen.add(w.uid)
        groups.setdefault(class_key(w), []).append(w)
    return list(groups.values())


def waiting_reason(w: Workload) -> str:
    """Why a class that waits on pod affinity for ever is not placed."""
    if w.gang is not None:
        return (f"gang {w.gang}: its members wait on pod affinity, which is placed in rounds "
                "and cannot be all-or-nothing")
    return "pod affinity: no matching pod can be placed"


def affinity_deps(reps: list[Workload]) -> dict[int, list[tuple[PodAffinityTerm, set[int]]]]:
    """For each class, its affinity terms and the batch classes that could satisfy them."""
    deps: dict[int, list[tuple[PodAffinityTerm, set[int]]]] = {}
    for a, wa in enumerate(reps):
        for t in wa.pod_affinity:
            ms = {b for b, wb in enumerate(reps)
                  if term_matches_pod(t, wa.namespace, wb.namespace, wb.labels)}
            deps.setdefault(a, []).append((t, ms))
    return deps


def ready_classes(reps: list[Workload], pending: set[int],
           deps: dict[int, list[tuple[PodAffinityTerm, set[int]]]],
           pods: PodIndex) -> tuple[set[int], set[int]]:
    """Classes placeable in the current round, and those that may only place their first pod.

    A class waits while another pending class could satisfy its pod affinity (its pods may
    open domains that running pods don't). When everything waits, a class that can go on
    its own -- each waiting term has running matches or selects the class itself -- goes
    first; if a term has no match at all, only its first pod is placed (the Kubernetes rule
    for the first pod of a self-affine group), which breaks the cycle.
    Gangs move together: all their classes in one round, never first-pod-only.
    """
    ready: set[int] = set()
    first: set[int] = set()
    breakers: list[tuple[int, bool]] = []  # (class, first pod only)
    for ci in sorted(pending):
        w = reps[ci]
        ok, only_first, can_break = True, False, True
        for t, ms in deps.get(ci, []):
            running = bool(pods.matching(t, w.namespace))
            others = (ms - {ci}) & pending
            if others:
                ok = False
                if not running:
                    if ci in ms:
                        only_first = True
                    else:
                        can_break = False
            elif not running:
                if ci in ms:
                    only_first = True
                else:
                    ok = can_break = False  # nothing can ever satisfy it
        if ok:
            ready.add(ci)
            if only_first:
                first.add(ci)
        elif can_break:
            breakers.append((ci, only_first))
    gangs: dict[str, set[int]] = {}
    for ci in pending:
        if reps[ci].gang is not None:
            gangs.setdefault(reps[ci].gang, set()).add(ci)  # type: ignore[arg-type]
    for members in gangs.values():
        if not members <= ready or members & first:
            ready -= members
            first -= members
    breakers = [(ci, f) for ci, f in breakers if reps[ci].gang is None]
    if not ready and breakers:
        ci, only_first = breakers[0]
        ready = {ci}
        first = {ci} if only_first else set()
    return ready, first


def take_back_partial_gangs(pc: ClusterView, reps: list[Workload], members: list[list[Workload]],
                       placed_nodes: list[list[int]], deferred: dict[int, str]) -> None:
    """Gangs all-or-nothing over the whole batch: a gang whose members span classes placed
    by different routes (the solver's rounds, pod by pod, pod-affinity rounds) can come out
    of them in part; its placed members are taken back, their capacity freed."""
    size: dict[str, int] = {}
    got: dict[str, int] = {}
    for ci, w in enumerate(reps):
        if w.gang is not None:
            size[w.gang] = size.get(w.gang, 0) + len(members[ci])
            got[w.gang] = got.get(w.gang, 0) + len(placed_nodes[ci])
    partial = {g for g, n in got.items() if 0 < n < size[g]}
    if not partial:
        return
    dropped: set[str] = set()
    for ci, w in enumerate(reps):
        if w.gang not in partial:
            continue
        req = request_vector(w)
        for j, n in enumerate(placed_nodes[ci]):
            pc.free[n] += req
            dropped.add(members[ci][j].uid)
        placed_nodes[ci].clear()
        deferred.setdefault(ci, f"gang {w.gang}: not every member fits at once")
    pc.pods = PodIndex([p for p in pc.pods.all() if p.uid not in dropped])
