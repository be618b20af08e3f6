"""Table-driven tests for every cost term, and for how the engine weighs them."""

from __future__ import annotations

import numpy as np
import pytest
from placement_helpers import GIB, node, snap, wl

from cloud_core.placement import (
    EngineConfig,
    LinkInfo,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    PreparedCluster,
    Resources,
    ScoreWeights,
    Taint,
    Toleration,
    prepared,
)
from cloud_core.placement.filters import check_node_affinity
from cloud_core.placement.model import HOSTNAME, ZONE, node_label
from cloud_core.placement.scores import (
    TERMS,
    affinity_cost,
    balance_cost,
    carbon_cost,
    components,
    data_cost,
    dominant_share,
    energy_cost,
    power_kw,
    preferred_weight,
    price_cost,
    total_cost,
    total_costs,
    untolerated_soft_taints,
)
from cloud_core.placement.sla import judge

A = np.asarray


@pytest.mark.parametrize("req,cap,want", [
    ((1000, 0, 0), (4000, 8, 0), 0.25),
    ((1000, 4, 0), (4000, 8, 0), 0.5),
    ((0, 0, 1), (4000, 8, 4), 0.25),
    ((0, 0, 1), (4000, 8, 0), np.inf),  # a GPU where there is none: never cheap
    ((0, 0, 0), (4000, 8, 0), 0.0),
])
def test_dominant_share(req: tuple[int, ...], cap: tuple[int, ...], want: float) -> None:
    assert dominant_share(A(req, float), A(cap, float)) == pytest.approx(want)


@pytest.mark.parametrize("share,price,want", [(0.25, 2.0, 0.5), (0.0, 9.0, 0.0), (1, 1, 1)])
def test_price(share: float, price: float, want: float) -> None:
    assert price_cost(A(share), A(price)) == pytest.approx(want)


@pytest.mark.parametrize("share,cpu_share,idle,mx,want_kw", [
    (0.5, 0.5, 100.0, 300.0, (50 + 100) / 1000),
    (0.25, 0.0, 100.0, 300.0, 25 / 1000),  # memory-only pod: its share of idle power
    (0.5, 0.5, 100.0, 50.0, 50 / 1000),  # max below idle: no negative dynamic power
])
def test_power(share: float, cpu_share: float, idle: float, mx: float, want_kw: float) -> None:
    assert power_kw(A(share), A(cpu_share), A(idle), A(mx)) == pytest.approx(want_kw)


@pytest.mark.parametrize("kw,price,want", [(0.1, 0.2, 0.02), (0.0, 1.0, 0.0)])
def test_energy(kw: float, price: float, want: float) -> None:
    assert energy_cost(A(kw), A(price)) == pytest.approx(want)


@pytest.mark.parametrize("kw,g_per_kwh,price_per_g,want", [
    (0.1, 500.0, 0.0001, 0.005), (0.1, 0.0, 0.0001, 0.0), (1.0, 100.0, 0.0, 0.0),
])
def test_carbon(kw: float, g_per_kwh: float, price_per_g: float, want: float) -> None:
    assert carbon_cost(A(kw), A(g_per_kwh), price_per_g) == pytest.approx(want)


CFG = EngineConfig(intra_region_per_gb=0.01, inter_region_per_gb=0.09, data_amortize_hours=10)


@pytest.mark.parametrize("gb,same_zone,same_region,want", [
    (100.0, True, True, 0.0),
    (100.0, False, True, 100 * 0.01 / 10),
    (100.0, False, False, 100 * 0.09 / 10),
    (0.0, False, False, 0.0),
])
def test_data_gravity(gb: float, same_zone: bool, same_region: bool, want: float) -> None:
    assert data_cost(gb, A(same_zone), A(same_region), CFG) == pytest.approx(want)


@pytest.mark.parametrize("p95,sla,want", [
    (10.0, 50.0, 0.2), (50.0, 50.0, 1.0), (80.0, 50.0, 1.0), (np.inf, 50.0, 1.0),
    (10.0, None, 0.0),
])
def test_latency_margin(p95: float, sla: float | None, want: float) -> None:
    assert judge(sla, A([p95])).used[0] == pytest.approx(want)


@pytest.mark.parametrize("after,cap,want", [
    ((2000, 4, 0), (4000, 8, 0), 0.5), ((4000, 2, 0), (4000, 8, 0), 1.0),
    ((8000, 2, 0), (4000, 8, 0), 1.0),
])
def test_balance(after: tuple[int, ...], cap: tuple[int, ...], want: float) -> None:
    assert balance_cost(A(after, float), A(cap, float)) == pytest.approx(want)


def test_components_on_nodes() -> None:
    """Each weighted term on a real index, by hand."""
    n1 = node("a", "eu", "eu-1", capacity=Resources(4000, 8 * GIB, 0), price_per_hour=2.0,
              energy_price_per_kwh=0.5, carbon_g_per_kwh=400, idle_watts=100, max_watts=300)
    n2 = node("b", "us", "us-1", capacity=Resources(4000, 8 * GIB, 0), price_per_hour=1.0,
              allocated=Resources(2000, 0, 0))
    cfg = EngineConfig(weights=ScoreWeights(latency=0.1, balance=0.2), carbon_price_per_g=1e-4,
                       inter_region_per_gb=0.09, data_amortize_hours=10)
    pc = PreparedCluster(snap([n1, n2], {("b", "a"): LinkInfo(5, 10)}), cfg)
    w = wl("w", requests=Resources(1000, 2 * GIB, 0), data_gb=100, data_location="eu",
           max_latency_ms=40, latency_to="a", cost_weight=2.0)
    c = components(w, pc.ix)
    share = 0.25
    kw = (100 * share + 200 * share) / 1000
    assert c["price"] == pytest.approx([2 * 2.0 * share, 2 * 1.0 * share])
    assert c["energy"] == pytest.approx([2 * kw * 0.5, 0.0])
    assert c["carbon"] == pytest.approx([2 * kw * 400 * 1e-4, 0.0])
    assert c["data"] == pytest.approx([0.0, 2 * 100 * 0.09 / 10])
    assert c["latency"] == pytest.approx([0.0, 0.1 * 10 / 40])
    assert c["balance"] == pytest.approx([0.2 * 0.25, 0.2 * 0.75])
    assert c["affinity"] == pytest.approx([0.0, 0.0])  # no preferences, no taints
    assert c["taint"] == pytest.approx([0.0, 0.0])
    assert set(c) == set(TERMS)
    assert total_cost(w, pc.ix) == pytest.approx(sum(c.values()))


def test_cost_weight_trades_price_against_latency() -> None:
    """A low cost weight lets latency margin win over a cheaper, farther node."""
    near = node("near", price_per_hour=1.2)
    far = node("far", price_per_hour=1.0)
    links = {("near", "u"): LinkInfo(1, 2), ("far", "u"): LinkInfo(30, 45)}
    cfg = EngineConfig(weights=ScoreWeights(latency=0.01, balance=0.0))
    pc = PreparedCluster(snap([near, far], links), cfg)
    cheap = wl("a", max_latency_ms=50, latency_to="u", cost_weight=1.0)
    fast = wl("b", max_latency_ms=50, latency_to="u", cost_weight=0.1)
    assert int(np.argmin(pc.cost(cheap))) == 1
    assert int(np.argmin(pc.cost(fast))) == 0


# -- soft node affinity and PreferNoSchedule taints ------------------------------------------
@pytest.mark.parametrize("matched,total,want", [
    (100.0, 100.0, 0.0),  # matches every preferred term
    (0.0, 100.0, 1.0),  # matches none
    (80.0, 100.0, 0.2),  # partial: the share of weight it misses
    (1.0, 3.0, 2 / 3),
    (0.0, 0.0, 0.0),  # no (non-empty) preferences: no cost anywhere
])
def test_affinity_cost(matched: float, total: float, want: float) -> None:
    assert affinity_cost(A([matched]), total)[0] == pytest.approx(want)


def _req(key: str, op: str, *values: str) -> NodeSelectorRequirement:
    return NodeSelectorRequirement(key, op, values)


def _term(*reqs: NodeSelectorRequirement) -> NodeSelectorTerm:
    return NodeSelectorTerm(reqs)


# labelled nodes: "ssd" {disk: ssd, gen: 5}, "hdd" {disk: hdd, gen: 3}, "bare" {},
# "odd" {gen: x} (a non-integer value never satisfies Gt/Lt)
LABELLED = [node("ssd", "r1", "r1-a", labels={"disk": "ssd", "gen": "5"}),
            node("hdd", "r1", "r1-b", labels={"disk": "hdd", "gen": "3"}),
            node("bare", "r2", "r2-a"),
            node("odd", "r2", "r2-a", labels={"gen": "x"})]


@pytest.mark.parametrize("term,want", [
    (_term(_req("disk", "In", "ssd")), [1, 0, 0, 0]),
    (_term(_req("disk", "In", "ssd", "hdd")), [1, 1, 0, 0]),
    (_term(_req("disk", "NotIn", "ssd")), [0, 1, 1, 1]),  # absent label: NotIn matches
    (_term(_req("disk", "Exists")), [1, 1, 0, 0]),
    (_term(_req("disk", "DoesNotExist")), [0, 0, 1, 1]),
    (_term(_req("gen", "Gt", "4")), [1, 0, 0, 0]),
    (_term(_req("gen", "Lt", "4")), [0, 1, 0, 0]),
    (_term(_req("disk", "In", "hdd"), _req("gen", "Gt", "2")), [0, 1, 0, 0]),  # ANDed
    (_term(_req("disk", "In", "ssd"), _req("gen", "Lt", "4")), [0, 0, 0, 0]),
    (_term(_req(HOSTNAME, "In", "bare")), [0, 0, 1, 0]),  # matchFields metadata.name
    (_term(_req(ZONE, "In", "r2-a")), [0, 0, 1, 1]),  # topology facts the registry owns
    (_term(), [0, 0, 0, 0]),  # an empty term matches nothing
])
def test_preferred_term_matches(term: NodeSelectorTerm, want: list[int]) -> None:
    """Each operator, over all nodes at once -- and the same verdict as the required-affinity
    filter gives node by node (soft and hard affinity must agree on what a term means)."""
    pc = PreparedCluster(snap(LABELLED))
    mask = pc.ix.term_mask(term)
    assert mask.tolist() == [bool(x) for x in want]
    keys = sorted({r.key for r in term.match_expressions})
    for i, nd in enumerate(LABELLED):
        hard = check_node_affinity((term,), tuple(node_label(nd, k) for k in keys))
        assert (hard is None) == bool(mask[i])


SSD = _term(_req("disk", "In", "ssd"))
NEW = _term(_req("gen", "Gt", "4"))
HDD = _term(_req("disk", "In", "hdd"))


@pytest.mark.parametrize("prefs,want", [
    ((), [0.0, 0.0, 0.0, 0.0]),  # no preferences: no cost
    (((100, SSD),), [0.0, 1.0, 1.0, 1.0]),  # match / no match
    (((80, SSD), (20, HDD)), [0.2, 0.8, 1.0, 1.0]),  # partial weights
    (((50, SSD), (50, NEW)), [0.0, 1.0, 1.0, 1.0]),  # ssd matches both
    (((1, HDD), (3, _term(_req("disk", "DoesNotExist")))), [1.0, 0.75, 0.25, 0.25]),
    (((10, SSD), (90, _term())), [0.0, 1.0, 1.0, 1.0]),  # empty terms are no-ops
    (((10, _term()),), [0.0, 0.0, 0.0, 0.0]),
])
def test_preferred_affinity_cost_per_node(prefs: tuple[tuple[int, NodeSelectorTerm], ...],
                                          want: list[float]) -> None:
    """``weights.affinity`` x the share of preferred weight each node misses."""
    cfg = EngineConfig(weights=ScoreWeights(affinity=0.5))
    pc = PreparedCluster(snap(LABELLED), cfg)
    w = wl("w", preferred_node_affinity=prefs)
    assert components(w, pc.ix)["affinity"] == pytest.approx([0.5 * x for x in want])
    # the same on a subset of nodes (the engine scores only where a class may go)
    sel = np.array([3, 1])
    assert components(w, pc.ix, sel)["affinity"] == pytest.approx([0.5 * want[3],
                                                                   0.5 * want[1]])
    matched, total = preferred_weight(w, pc.ix)
    assert total == sum(wt for wt, t in prefs if t.match_expressions)
    assert (matched <= total).all()


SOFT = Taint("spot", "yes", "PreferNoSchedule")
SOFT2 = Taint("noisy", "", "PreferNoSchedule")


@pytest.mark.parametrize("tols,taints,want", [
    ((), (), 0),
    ((), (SOFT,), 1),
    ((), (SOFT, SOFT2), 2),  # each untolerated soft taint counts
    ((), (Taint("gpu", "", "NoSchedule"),), 0),  # hard taints are the filter's business
    ((Toleration("spot", "Exists"),), (SOFT,), 0),
    ((Toleration("spot", "Equal", "yes"),), (SOFT,), 0),
    ((Toleration("spot", "Equal", "no"),), (SOFT,), 1),  # wrong value
    ((Toleration("spot", "Exists", effect="PreferNoSchedule"),), (SOFT,), 0),
    ((Toleration("spot", "Exists", effect="NoSchedule"),), (SOFT,), 1),  # other effect
    ((Toleration("", "Exists"),), (SOFT, SOFT2), 0),  # empty key + Exists: everything
    ((Toleration("spot", "Exists"),), (SOFT, SOFT2), 1),
])
def test_untolerated_soft_taints(tols: tuple[Toleration, ...], taints: tuple[Taint, ...],
                                 want: int) -> None:
    assert untolerated_soft_taints(tols, taints) == want


def test_taint_cost_on_nodes() -> None:
    """``weights.taint`` per untolerated PreferNoSchedule taint, node by node."""
    nodes = [node("clean"), node("spot", taints=(SOFT,)),
             node("both", taints=(SOFT, SOFT2, Taint("gpu", "", "NoSchedule"))),
             node("spot2", taints=(SOFT,))]
    pc = PreparedCluster(snap(nodes), EngineConfig(weights=ScoreWeights(taint=0.3)))
    assert components(wl("a"), pc.ix)["taint"] == pytest.approx([0.0, 0.3, 0.6, 0.3])
    tol = wl("b", tolerations=(Toleration("spot", "Exists"),))
    assert components(tol, pc.ix)["taint"] == pytest.approx([0.0, 0.0, 0.3, 0.0])
    assert components(tol, pc.ix, np.array([2]))["taint"] == pytest.approx([0.3])
    clean = PreparedCluster(snap([node("x"), node("y")]))
    assert components(wl("a"), clean.ix)["taint"] == pytest.approx([0.0, 0.0])


def test_default_soft_weights_outweigh_small_price_gaps_only() -> None:
    """The defaults: a full preference (or a soft taint) beats a 10 % price gap on a quarter
    of a $1/h node, and loses to a 50 % one."""
    wt = ScoreWeights()
    small_gap, big_gap = 0.25 * 0.1, 0.25 * 0.5
    assert small_gap < wt.affinity < big_gap
    assert small_gap < wt.taint < big_gap
    assert wt.affinity > wt.latency + wt.balance


@pytest.mark.parametrize("soft_taints", [False, True])
def test_total_costs_is_total_cost_bit_for_bit(soft_taints: bool,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The batched pricing of a round's classes gives every class exactly the values of
    ``total_cost`` on its own nodes (the solver integerises costs: a last-bit difference
    could change an answer), over every term: data to a node, zone, region or nowhere;
    latency bounds absent, 0, finite, to unmeasured targets; preferences; soft taints;
    cost weights; GPUs; empty node sets."""
    rnd = np.random.default_rng(7)
    nodes = []
    for i in range(40):
        gpus = int(rnd.choice([0, 0, 2]))
        nodes.append(node(f"n{i}", f"r{i % 3}", f"r{i % 3}-z{i % 2}",
                          capacity=Resources(int(rnd.integers(2, 64)) * 1000,
                                             int(rnd.integers(4, 256)) * GIB, gpus),
                          allocated=Resources(int(rnd.integers(0, 2000)), 0, 0),
                          price_per_hour=float(rnd.uniform(0.1, 3.0)),
                          energy_price_per_kwh=float(rnd.uniform(0.05, 0.3)),
                          carbon_g_per_kwh=float(rnd.uniform(50, 500)),
                          idle_watts=float(rnd.uniform(50, 200)),
                          max_watts=float(rnd.uniform(200, 900)),
                          labels={"disk": "ssd" if i % 4 else "hdd"},
                          taints=(SOFT,) if soft_taints and i % 5 == 0 else ()))
    links = {(f"n{i}", f"n{(i * 7) % 40}"): LinkInfo(float(i), float(i) * 1.5)
             for i in range(0, 40, 3)}
    links[("n1", "gw")] = LinkInfo(3.0, 4.0)
    pc = PreparedCluster(snap(nodes, links), EngineConfig(
        weights=ScoreWeights(latency=0.3, balance=0.2, affinity=0.4, taint=0.25),
        carbon_price_per_g=1e-4))
    pref = ((3, NodeSelectorTerm((NodeSelectorRequirement("disk", "In", ("ssd",)),))),)
    ws, sels = [], []
    for k in range(60):
        data = [("", 0.0), ("n3", 40.0), ("r1-z0", 7.5), ("r2", 120.0), ("nowhere", 5.0)]
        loc, gb = data[k % len(data)]
        lat = [(None, None), (40.0, "n0"), (0.0, "n0"), (15.0, "r1"), (9.0, "gw"),
               (20.0, "unmeasured"), (None, "n2"), (30.0, None)]
        bound, target = lat[k % len(lat)]
        ws.append(wl(f"w{k}", requests=Resources(int(rnd.integers(0, 8)) * 250,
                                                 int(rnd.integers(0, 16)) * GIB // 2,
                                                 int(rnd.choice([0, 0, 1]))),
                     data_gb=gb, data_location=loc or None, max_latency_ms=bound,
                     latency_to=target, cost_weight=float(rnd.choice([1.0, 0.5, 2.0])),
                     preferred_node_affinity=pref if k % 3 == 0 else (),
                     tolerations=(Toleration("spot", "Exists"),) if k % 4 == 0 else ()))
        sels.append(np.flatnonzero(rnd.random(40) < (0.0 if k % 11 == 0 else 0.6)))
    flat = total_costs(ws, pc.ix, sels)
    at = 0
    for w, sel in zip(ws, sels, strict=True):
        want = total_cost(w, pc.ix, sel)
        assert np.array_equal(flat[at:at + sel.size], want), w.uid
        at += sel.size
    assert at == flat.size
    masks = [np.isin(np.arange(40), s) for s in sels]
    for w, m, c in zip(ws, masks, pc.costs(ws, masks), strict=True):
        assert np.array_equal(c, pc.cost(w, m)), w.uid
    monkeypatch.setattr(prepared, "COST_RUN_CELLS", 50)  # many runs, some of one class
    for w, m, c in zip(ws, masks, pc.costs(ws, masks), strict=True):
        assert np.array_equal(c, pc.cost(w, m)), w.uid
