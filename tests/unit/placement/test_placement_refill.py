"""After the last step of every route, no unplaced pod has a node that still fits it.

Over-full tight instances of 1,000-1,600 pods (``tools.bench_tight.make_overfull``: a
tight instance with some of its nodes taken away) go through the pack route, whose cost
steps (the descent, the slot flow, the CP-SAT neighbourhoods) move pods and free room.
Before the final refill, 20 of 24 such instances (seeds 1-12, use_cpsat=False) left 1-32
pods out with nodes still fitting them. Each left-out pod is checked with the independent validator on every node
whose free resources hold it (the only nodes where it could go).
"""

from __future__ import annotations

import numpy as np
import pytest

from cloud_core.placement import EngineConfig, place, validate
from cloud_core.placement.model import Workload
from tools.bench_tight import make_overfull


def _still_fits(inst_nodes: tuple, pods: list[Workload], assign: dict[str, str],
                w: Workload, snap: object, cfg: EngineConfig) -> list[str]:
    """Nodes where ``w`` could go on top of ``assign`` without any violation: the
    validator on each node whose free cpu, memory and GPUs hold ``w``."""
    used: dict[str, np.ndarray] = {}
    by_uid = {p.uid: p for p in pods}
    for uid, n in assign.items():
        r = by_uid[uid].requests
        req = np.array((r.cpu_milli, r.mem_bytes, r.gpus), dtype=np.int64)
        used[n] = used.get(n, np.zeros(3, dtype=np.int64)) + req
    rest = [p for p in pods if p.uid in assign]
    out = []
    for nd in inst_nodes:
        free = (np.array((nd.capacity.cpu_milli, nd.capacity.mem_bytes, nd.capacity.gpus))
                - (nd.allocated.cpu_milli, nd.allocated.mem_bytes, nd.allocated.gpus)
                - used.get(nd.name, 0))
        need = (w.requests.cpu_milli, w.requests.mem_bytes, w.requests.gpus)
        if (free < need).any():
            continue
        if not validate(snap, [*rest, w], {**assign, w.uid: nd.name}, cfg):  # type: ignore[arg-type]
            out.append(nd.name)
    return out


@pytest.mark.parametrize(("seed", "n_nodes", "n_pods"),
                         [(1, 180, 1000), (1, 260, 1400), (4, 180, 1000)])
def test_no_unplaced_pod_has_a_node_that_fits(seed: int, n_nodes: int, n_pods: int) -> None:
    inst = make_overfull(n_nodes, n_pods, seed)
    # use_cpsat=False keeps the test short (the CP-SAT neighbourhoods take 20 s here); the
    # refill is the last step of solve() whatever ran before it
    cfg = EngineConfig(use_cpsat=False)
    res = place(inst.snapshot, inst.pods, cfg)
    assert len(inst.pods) >= 1000 and res.unplaced, "not an over-full pack-route instance"
    assert res.solver.startswith("pack"), res.solver
    assert not validate(inst.snapshot, inst.pods, res.assignments, cfg)
    assign = dict(res.assignments)
    by_uid = {w.uid: w for w in inst.pods}
    seen: set[tuple[object, ...]] = set()
    for d in res.unplaced:
        w = by_uid[d.workload_uid]
        key = (w.requests, w.residency, w.max_latency_ms, w.latency_to, w.tolerations,
               w.pod_anti_affinity, tuple(sorted(w.labels.items())))
        if key in seen:  # pods alike in every constraint: one check answers for all
            continue
        seen.add(key)
        fits = _still_fits(inst.snapshot.nodes, inst.pods, assign, w, inst.snapshot, cfg)
        assert not fits, (f"{w.uid} left out ({d.summary}) but {fits[:3]} still fit it; "
                          f"stats {dict(res.stats)}")
