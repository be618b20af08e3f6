"""Tight capacity: count first, and the same answer whatever the machine's load.

Instances come from ``tools.bench_tight.make_tight`` (the benchmark's generator): every pod
fits at once in a hidden packing at 90-98 % of capacity, so the maximum placeable is the pod
count, known by construction (and checked here: the hidden packing passes the validator).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

from cloud_core.placement import EngineConfig, PreparedCluster, place, validate
from cloud_core.placement.classes import ClassSpec
from cloud_core.placement.cpsat import cpsat
from cloud_core.placement.descent import cost_descent
from cloud_core.placement.engine import runners_up
from cloud_core.placement.packing import pressure
from tools.bench_tight import make_tight
from tools.placement_ref import cpsat_cost_reference, lp_lower_bound, solve_exact_pods
from tools.quality_families import FAMILIES

BUSY = ("import time\n"
        "t = time.monotonic()\n"
        "while time.monotonic() - t < 15: pass\n")  # bounded: 15 s at most, killed sooner


def _busy(k: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(k)]


def test_same_placement_five_times_under_different_load() -> None:
    """Five solves of one tight instance -- as is, then with 1-3 busy-loop processes
    competing for the CPU -- give five identical placements: CP-SAT is bounded by its
    deterministic time with one worker and a fixed seed, and nothing else reads a clock."""
    inst = make_tight(10, 50, seed=2)
    cfg = EngineConfig()
    seen = []
    stats = []
    solvers = []
    for load in (0, 1, 2, 1, 3):
        procs = _busy(load)
        try:
            res = place(inst.snapshot, inst.pods, cfg)
        finally:
            for p in procs:
                p.kill()
                p.wait()
        seen.append(tuple(sorted(res.assignments.items())))
        stats.append(dict(res.stats))
        solvers.append(res.solver)
    # the path under test ran: CP-SAT neighbourhoods, then a CP-SAT polish stopped by its
    # work limit (the case a wall-clock limit made load-dependent), no wall cap hit
    assert stats[0].get("lns_solved", 0) + stats[0].get("cost_lns_solved", 0) > 0, stats[0]
    assert solvers == ["cpsat-feasible"] * 5
    assert all("cpsat_wall_cap_hits" not in s for s in stats)
    assert len(set(seen)) == 1
    assert len(seen[0]) == len(inst.pods)


def test_wall_clock_cap_is_reported_when_hit() -> None:
    """The wall-clock cap is only a safety net, and when it does cut CP-SAT short the
    result says so (that answer may depend on load)."""
    inst = make_tight(20, 100, seed=3)
    res = place(inst.snapshot, inst.pods, EngineConfig(cpsat_wall_cap_s=1e-6))
    assert res.stats.get("cpsat_wall_cap_hits", 0) > 0
    assert validate(inst.snapshot, inst.pods, res.assignments) == []


@pytest.mark.parametrize("seed", [1, 3])
def test_tight_300x60_places_every_pod(seed: int) -> None:
    """300-pod target on 60 nodes at 92-98 %: the maximum is every pod (the hidden packing
    is valid), and the engine places them all, with no violation."""
    inst = make_tight(60, 300, seed=seed, util=(0.92, 0.98))
    assert validate(inst.snapshot, inst.pods, inst.hidden) == []
    res = place(inst.snapshot, inst.pods)
    assert validate(inst.snapshot, inst.pods, res.assignments) == []
    assert len(res.assignments) == len(inst.pods)
    # the cost descent keeps the count and lowers the cost (without it: the same pods,
    # measured 4-5 % dearer before the cost neighbourhoods took several passes; now
    # 0.4 % on seed 1, 370.43 against 369.05 $/h)
    off = place(inst.snapshot, inst.pods, EngineConfig(descent_rounds=0))
    assert len(off.assignments) == len(res.assignments)
    assert res.stats.get("descent_moves", 0) > 0
    assert res.total_cost < off.total_cost
    if seed == 1:  # one seed is enough (2 s): the ring of roomy nodes (cost_lns_slack)
        # lowers it further, 1.5 % here (374.66 -> 369.05 $/h) -- a pod reaches a cheaper
        # node once its pods move on
        no_ring = place(inst.snapshot, inst.pods, EngineConfig(cost_lns_slack=0))
        assert len(no_ring.assignments) == len(res.assignments)
        assert res.total_cost < no_ring.total_cost


@pytest.mark.parametrize(("family", "n", "seed", "over", "want"), [
    # every pod placed, within the step's budget: short neighbourhoods, many passes
    ("tight", 100, 3, {}, 0.04),
    # the same batch without a step budget (step_cpu_max_s=0): 0.1 units each
    ("tight", 100, 3, {"step_cpu_max_s": 0.0}, 0.1),
    # pods out that an allowed node could hold: the count first, 0.1 units each (the
    # batch's first search; the engine's later part-batches may be settled)
    ("mixed", 300, 1, {}, 0.1),
])
def test_cost_neighbourhoods_work_by_what_is_settled(
        monkeypatch: pytest.MonkeyPatch, family: str, n: int, seed: int,
        over: dict[str, Any], want: float) -> None:
    """The cost neighbourhoods' CP-SAT work each: ``cost_lns_settled_deterministic_time``
    where a step budget holds and no pod an allowed node could hold is out, else
    ``cost_lns_deterministic_time``."""
    seen: list[float] = []

    def spy(*args: Any, **kw: Any) -> Any:
        if not kw["count_only"]:
            seen.append(kw["det_time"])
        return cpsat(*args, **kw)

    monkeypatch.setattr("cloud_core.placement.neighbourhoods.cpsat", spy)
    snap, pods = FAMILIES[family](n, seed)
    cfg = EngineConfig(cpsat_polish=False, cost_lns_iterations=4, **over)
    res = place(snap, pods, cfg)
    assert validate(snap, pods, res.assignments) == []
    assert seen and seen[0] == want, seen
    if family == "tight":
        assert set(seen) == {want}, seen


def test_gpu_ring_frees_the_8_gpu_node() -> None:
    """300 x 60, seed 2: the last pod asks for 8 GPUs and its one free-able 8-GPU node holds
    smaller GPU pods; they can move only to GPU nodes whose cpu is taken by cpu pods that
    tolerate the taint, which must move on to cpu nodes -- a chain the first neighbourhood
    ring leaves out. With the GPU ring (``lns_gpu_ring``) every pod is placed; without it
    one is left out. The cost neighbourhoods (count first while a pod is out) are off: the
    GPU nodes among a GPU pod's cheapest with room reach the same chain without the ring."""
    inst = make_tight(60, 300, seed=2, util=(0.92, 0.98))
    res = place(inst.snapshot, inst.pods, EngineConfig(cost_lns_iterations=0))
    assert validate(inst.snapshot, inst.pods, res.assignments) == []
    assert len(res.assignments) == len(inst.pods) == 342
    off = place(inst.snapshot, inst.pods, EngineConfig(lns_gpu_ring=0, cost_lns_iterations=0))
    assert len(off.assignments) == len(inst.pods) - 1
    both = place(inst.snapshot, inst.pods, EngineConfig(lns_gpu_ring=0))
    assert len(both.assignments) == len(inst.pods)


def _spec(req: tuple[int, int, int], cost: list[float]) -> ClassSpec:
    return ClassSpec(count=1, req=np.array(req, dtype=np.int64), mask=np.ones(len(cost), bool),
                     cost=np.array(cost))


@pytest.mark.parametrize("with_spare", [False, True])
def test_descent_swaps_or_chains_a_pod_off_the_dear_node(with_spare: bool) -> None:
    """A memory-heavy pod on a GPU-priced node fits the cheap cpu node only once the
    cpu-heavy pod there leaves: with nowhere else for that pod, the two trade places (swap);
    with a spare cheap node that holds it, it goes there instead (chain, cheaper still).
    Every node stays within its resources and both pods stay placed."""
    gib = 1 << 30
    free = [[4000, 16 * gib, 0], [16000, 64 * gib, 1]]  # n0 cheap cpu node, n1 GPU node
    a_cost, b_cost = [10.0, 100.0], [10.0, 20.0]
    if with_spare:
        free.append([2500, 4 * gib, 0])  # n2: room for b only
        a_cost.append(10.0)
        b_cost.append(12.0)
    classes = [_spec((3000, 12 * gib, 0), a_cost), _spec((2000, 2 * gib, 0), b_cost)]
    icost = [np.round(c.cost * 1e5).astype(np.int64) for c in classes]
    got = [[1], [0]]  # a on the GPU node, b filling the cpu node's cpu
    stats: dict[str, float] = {}
    out = cost_descent(classes, np.array(free, dtype=np.int64), icost, got, EngineConfig(), stats)
    assert out == ([[0], [2]] if with_spare else [[0], [1]])
    assert stats["descent_moves"] == 1
    # its (classes x nodes) tables are bounded: over the limit it is skipped, and says so
    skipped: dict[str, float] = {}
    assert cost_descent(classes, np.array(free, dtype=np.int64), icost, got,
                    EngineConfig(descent_max_cells=1), skipped) == got
    assert skipped == {"descent_skipped": 1.0}


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_overfull_small_places_the_proven_maximum(seed: int) -> None:
    """More pods than fit (a tight instance plus a quarter of its pods again): the engine
    places exactly as many as a pod-level CP-SAT model proves to be the maximum."""
    inst = make_tight(8, 36, seed=seed, util=(0.92, 0.98))
    extra = [dataclasses.replace(w, uid=f"{w.uid}-x", name=f"{w.name}-x")
             for w in inst.pods[::4]]
    pods = inst.pods + extra
    cfg = EngineConfig()
    res = place(inst.snapshot, pods, cfg)
    assert validate(inst.snapshot, pods, res.assignments, cfg) == []
    pc = PreparedCluster(inst.snapshot, cfg)
    feas = []
    for w in pods:
        ok = np.logical_and.reduce([fr.ok for fr in pc.filter_results(w)])
        feas.append({int(n): 0 for n in np.flatnonzero(ok)})  # count only: cost 0
    conflicts = [(a, b, t.topology_key) for a, wa in enumerate(pods)
                 for t in wa.pod_anti_affinity for b, wb in enumerate(pods)
                 if a != b and wb.labels.get("app") == t.selector.match_labels.get("app")]
    domains = {k: pc.ix.domain_ids(k)[0].tolist()
               for k in {t[2] for t in conflicts} | {"kubernetes.io/hostname"}}
    req = [(w.requests.cpu_milli, w.requests.mem_bytes, w.requests.gpus) for w in pods]
    ex = solve_exact_pods(feas, req, pc.free.tolist(), conflicts, domains, [], 1, 60.0)
    assert ex.optimal
    assert len(res.assignments) == sum(n >= 0 for n in ex.nodes)
    assert len(res.assignments) >= len(inst.pods)  # the hidden packing is a lower bound


SOLVE = ("from tools.bench_tight import make_tight\n"
         "from cloud_core.placement import place\n"
         "inst = make_tight(8, 40, seed=1)\n"
         "print(sorted(place(inst.snapshot, inst.pods).assignments.items()))\n")


def test_same_placement_in_other_processes() -> None:
    """Another interpreter with another string-hash seed (set and dict orders of strings
    change with it) places the same instance the same way."""
    inst = make_tight(8, 40, seed=1)
    here = repr(sorted(place(inst.snapshot, inst.pods).assignments.items()))
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run([sys.executable, "-c", SOLVE], env=env, capture_output=True,
                             text=True, timeout=300, check=True)
        assert out.stdout.strip() == here


def test_slot_flow_stands_in_when_the_descent_is_skipped() -> None:
    """A batch too large for the descent's tables (here: a limit of one cell) and above
    ``pack_flow_max_pods`` still gets the slot-flow cost rounds, as before the descent."""
    inst = make_tight(30, 150, seed=1)
    res = place(inst.snapshot, inst.pods, EngineConfig(descent_max_cells=1,
                                                       pack_flow_max_pods=10))
    assert res.stats.get("descent_skipped") == 1.0
    assert res.stats.get("slot_rounds", 0) > 0
    assert validate(inst.snapshot, inst.pods, res.assignments) == []


@pytest.mark.parametrize("seed", [2, 4])
def test_lp_bound_is_loose_where_the_optimum_is_proven(seed: int) -> None:
    """The cost target "within 2 % of the LP bound" is out of reach on some tight instances
    for any placement: on these 30-pod ones CP-SAT proves the optimum (every pod placed) and
    it lies more than 2 % above the LP bound; the engine's cost is that optimum."""
    from tools.bench_tight import engine_classes

    inst = make_tight(6, 30, seed=seed, util=(0.92, 0.98))
    res = place(inst.snapshot, inst.pods)
    assert len(res.assignments) == len(inst.pods)
    cfg = EngineConfig()
    specs, free, domains, hint = engine_classes(inst.snapshot, inst.pods, cfg,
                                                dict(res.assignments))
    lp, finished = lp_lower_bound(specs, free, len(inst.pods))
    ref = cpsat_cost_reference(specs, free, domains, hint, cfg, time_limit_s=20.0)
    assert finished and ref.optimal and ref.placed == len(inst.pods)
    assert ref.bound == pytest.approx(ref.cost)
    assert ref.cost > lp * 1.02
    assert res.total_cost == pytest.approx(ref.cost, rel=1e-6)



def test_pressure_is_the_class_by_class_sum() -> None:
    """``packing.pressure`` (blocks of classes at once) gives the greedy pack the same pressure,
    bit for bit, and the same per-class indices and shares as adding the classes one by
    one: the pack's scores are rounded, so a last-bit difference could change an answer.
    Several blocks (many nodes), empty masks, zero requests."""
    rnd = np.random.default_rng(3)
    n = 60_000  # ~5 classes a block: the running sum crosses blocks
    classes = [ClassSpec(count=int(rnd.integers(1, 9)),
                         req=np.array([int(rnd.integers(0, 4)) * 250,
                                       int(rnd.integers(0, 9)) << 29,
                                       int(rnd.choice([0, 0, 1, 2]))], dtype=np.int64),
                         mask=rnd.random(n) < (0.0 if i == 4 else rnd.uniform(0.01, 0.6)),
                         cost=np.zeros(n))
               for i in range(17)]
    press = np.zeros((n, 3))
    where, tiled = pressure(classes, press)
    want = np.zeros((n, 3))
    for c, wh, ti in zip(classes, where, tiled, strict=True):
        w = np.flatnonzero(c.mask)
        share = c.req.astype(np.float64) / max(int(w.size), 1)
        want[w] += share * c.count
        assert np.array_equal(wh, (w[:, None] * 3 + np.arange(3)).reshape(-1))
        assert np.array_equal(ti, np.tile(share, w.size))
    assert np.array_equal(press, want)


def test_runners_up_are_the_per_class_ones() -> None:
    """``engine.runners_up`` (blocks of classes) gives each class the count of nodes that
    fit it before the batch and its two cheapest there, the cheaper first and the lower
    index first among equal costs (ties included: costs on a coarse grid), as ``_decide``'s
    per-class path gives them."""
    rnd = np.random.default_rng(5)
    n = 250_000  # 4 classes a block
    free0 = np.stack([rnd.integers(0, 8, n) * 500, rnd.integers(0, 8, n) << 30,
                      rnd.integers(0, 3, n)], axis=1)
    k = 14
    reqs = [np.array([int(rnd.integers(0, 4)) * 500, int(rnd.integers(0, 4)) << 30,
                      int(rnd.choice([0, 0, 1]))], dtype=np.int64) for _ in range(k)]
    base = {ci: rnd.random(n) < (0.0 if ci == 3 else 0.5) for ci in range(k)}
    costs = {ci: np.where(base[ci], np.round(rnd.uniform(0, 2, n), 1), np.inf)
             for ci in range(k)}
    got = runners_up(list(range(k)), reqs, base, costs, free0)
    for ci in range(k):
        ok = base[ci].copy()
        for r in range(3):
            if reqs[ci][r]:
                ok = ok & (free0[:, r] >= reqs[ci][r])
        cand = np.where(ok, costs[ci], np.inf)
        top = [int(i) for i in np.argsort(cand, kind="stable")[:2] if np.isfinite(cand[i])]
        assert got[ci] == (int(ok.sum()), top), ci


@pytest.mark.parametrize(("g_cost", "want"), [
    # G pays 10 on node 4; node 5 (2) opens once the 1-GPU pod there joins the one on
    # node 6. G's cheapest allowed nodes are the cpu-only 0-2 (1 each), no place for it
    ([1, 1, 1, 1, 10, 2, 3, 5], [5]),
    # G already pays the least of the nodes that can hold it: it stays
    ([1, 1, 1, 1, 2, 5, 6, 7], [4]),
])
def test_cost_neighbourhoods_take_the_cheapest_nodes_with_room(g_cost: list[float],
                                                               want: list[int]) -> None:
    """``neighbourhoods.cost_lns``: a 2-GPU pod's cheapest nodes are those with room for it
    (GPU nodes), not the cpu-only nodes that pass its filters (no roomy nodes here:
    ``cost_lns_slack`` 0)."""
    from cloud_core.placement.budget import Budget
    from cloud_core.placement.classes import integer_costs
    from cloud_core.placement.neighbourhoods import cost_lns
    from cloud_core.placement.packing import Pack

    gib = 1 << 30
    free = np.array([[8000, 32 * gib, 0]] * 4 + [[8000, 32 * gib, 2]] * 4, dtype=np.int64)
    every = np.ones(8, dtype=bool)
    classes = [
        ClassSpec(count=1, req=np.array([1000, gib, 2], dtype=np.int64), mask=every,
                  cost=np.array(g_cost, dtype=np.float64)),
        ClassSpec(count=2, req=np.array([1000, gib, 1], dtype=np.int64), mask=every,
                  cost=np.ones(8)),
    ]
    icost, penalty = integer_costs(classes, 1000.0)
    pa = Pack(classes, free, {}, icost)
    for ci, n in ((0, 4), (1, 5), (1, 6)):
        pa.put(ci, n)
    cfg = EngineConfig(cpsat_polish=False, cost_lns_slack=0)
    cost_lns(pa, free, {}, penalty, cfg, Budget(), left=0)
    assert pa.got[0] == want
    assert sorted(pa.got[1]) == ([6, 6] if want == [5] else [5, 6])


@pytest.mark.parametrize(("out", "want"), [
    # every pod placed: A's neighbourhood (node 0 and its cheap nodes 2, 3) runs after B's
    # (nodes 0, 1) held node 0, and A moves to its cheapest node
    (False, [2]),
    # a pod of the batch out: a node an earlier neighbourhood of the pass held hides the
    # neighbourhoods of the pods on it, as the count search has them
    (True, [0]),
])
def test_cost_neighbourhoods_of_pods_on_a_node_seen_before(out: bool, want: list[int]) -> None:
    """``neighbourhoods.cost_lns``: B (1 GPU) pays 5 on node 0, 4 above the cpu-only nodes
    its filters pass, and leads the regrets; its neighbourhood holds node 0 and the GPU
    node 1 (6), and B stays. A (no GPU) on node 0 pays 3, 1 on node 2, 1.5 on node 3."""
    from cloud_core.placement.budget import Budget
    from cloud_core.placement.classes import integer_costs
    from cloud_core.placement.neighbourhoods import cost_lns
    from cloud_core.placement.packing import Pack

    gib = 1 << 30
    free = np.array([[8000, 32 * gib, 2]] * 2 + [[8000, 32 * gib, 0]] * 2, dtype=np.int64)
    every = np.ones(4, dtype=bool)
    classes = [
        ClassSpec(count=1, req=np.array([1000, gib, 0], dtype=np.int64), mask=every,
                  cost=np.array([3.0, 3.0, 1.0, 1.5])),  # A
        ClassSpec(count=1, req=np.array([1000, gib, 1], dtype=np.int64), mask=every,
                  cost=np.array([5.0, 6.0, 1.0, 1.0])),  # B
        # a pod that no node takes (its filters pass none): out when ``out``
        ClassSpec(count=int(out), req=np.array([1000, gib, 0], dtype=np.int64),
                  mask=np.zeros(4, dtype=bool), cost=np.ones(4)),
    ]
    icost, penalty = integer_costs(classes, 1000.0)
    pa = Pack(classes, free, {}, icost)
    pa.put(0, 0)
    pa.put(1, 0)
    cfg = EngineConfig(cpsat_polish=False, cost_lns_slack=0)
    cost_lns(pa, free, {}, penalty, cfg, Budget(), left=0)
    assert pa.got[0] == want
    assert pa.got[1] == [0]


@pytest.mark.parametrize(("repel", "want_b"), [
    # apart: both answers of the pair stand together
    (False, [3]),
    # A and B repel each other per zone, and nodes 1 and 3 share one: each answer alone
    # was right, both together are not; B's is dropped, and B tried again stays on node 2
    (True, [2]),
])
def test_cost_neighbourhoods_two_at_a_time(monkeypatch: pytest.MonkeyPatch, repel: bool,
                                           want_b: list[int]) -> None:
    """``neighbourhoods.cost_lns`` with every pod placed solves two neighbourhoods at once
    (``_solve_pair``): A pays 3 on node 0 and 1 on node 1, B pays 3 on node 2 and 1 on node
    3; their neighbourhoods ({0, 1}, {2, 3}) are apart."""
    from cloud_core.placement import neighbourhoods
    from cloud_core.placement.budget import Budget
    from cloud_core.placement.classes import integer_costs
    from cloud_core.placement.packing import Pack

    gib = 1 << 30
    free = np.array([[8000, 32 * gib, 0]] * 4, dtype=np.int64)
    every = np.ones(4, dtype=bool)
    req = np.array([1000, gib, 0], dtype=np.int64)
    classes = [
        ClassSpec(count=1, req=req, mask=every, cost=np.array([3.0, 1.0, 5.0, 5.0]),
                  conflicts={"zone": [1]} if repel else {}),  # A
        ClassSpec(count=1, req=req, mask=every, cost=np.array([5.0, 5.0, 3.0, 1.0]),
                  conflicts={"zone": [0]} if repel else {}),  # B
    ]
    domains = {"zone": np.array([0, 1, 2, 1], dtype=np.int64)}
    icost, penalty = integer_costs(classes, 1000.0)
    pa = Pack(classes, free, domains, icost)
    pa.put(0, 0)
    pa.put(1, 2)
    pairs: list[bool] = []
    solve_pair = neighbourhoods._solve_pair

    def pair(*args: Any, **kw: Any) -> bool:
        pairs.append(solve_pair(*args, **kw))
        return pairs[-1]

    monkeypatch.setattr(neighbourhoods, "threads", lambda cfg: 2)
    monkeypatch.setattr(neighbourhoods, "_solve_pair", pair)
    cfg = EngineConfig(cpsat_polish=False, cost_lns_slack=0, lns_near=1)
    neighbourhoods.cost_lns(pa, free, domains, penalty, cfg, Budget(), left=0)
    assert pairs[0] is not repel
    assert pa.got[0] == [1]
    assert pa.got[1] == want_b
    with_one = Pack(classes, free, domains, icost)
    with_one.put(0, 0)
    with_one.put(1, 2)
    neighbourhoods.cost_lns(with_one, free, domains, penalty,
                            dataclasses.replace(cfg, cost_lns_threads=1), Budget(), left=0)
    assert with_one.got == pa.got  # as one at a time


@pytest.mark.parametrize(("own", "want_counts"), [
    # as one at a time: the pods on the nodes and the left-out ones that may go there
    (False, [2, 1]),
    # the second of a pair: the pods on its nodes alone, so that a left-out pod is never
    # offered to both neighbourhoods of a pair
    (True, [1]),
])
def test_a_neighbourhood_of_a_pair_re_places_its_own_pods(own: bool,
                                                         want_counts: list[int]) -> None:
    """``neighbourhoods._prepare``: class A has one pod on node 0 and one out; class B's
    one pod is out. The sub-problem of node 0 and what it re-places."""
    from cloud_core.placement.classes import integer_costs
    from cloud_core.placement.neighbourhoods import _prepare
    from cloud_core.placement.packing import Pack

    gib = 1 << 30
    free = np.array([[8000, 32 * gib, 0]] * 2, dtype=np.int64)
    every = np.ones(2, dtype=bool)
    req = np.array([1000, gib, 0], dtype=np.int64)
    classes = [ClassSpec(count=2, req=req, mask=every, cost=np.ones(2)),
               ClassSpec(count=1, req=req, mask=every, cost=np.ones(2))]
    icost, penalty = integer_costs(classes, 1000.0)
    pa = Pack(classes, free, {}, icost)
    pa.put(0, 0)
    sub = _prepare(pa, np.array([0], dtype=np.int64), {}, penalty,
                   EngineConfig(cpsat_polish=False), own=own)
    assert [c.count for c in sub.classes] == want_counts
    assert sub.removed == [(0, 0)] and pa.got[0] == []
