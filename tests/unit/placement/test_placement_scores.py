"""Table-driven tests for every cost term, and for how the engine weighs them."""

from __future__ import annotations

import numpy as np
import pytest
from placement_helpers import GIB, node, snap, wl

from cloud_core.placement import EngineConfig, LinkInfo, PreparedCluster, Resources, ScoreWeights
from cloud_core.placement.scores import (
    balance_cost,
    carbon_cost,
    components,
    data_cost,
    dominant_share,
    energy_cost,
    latency_cost,
    power_kw,
    price_cost,
    total_cost,
)

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
    assert latency_cost(A([p95]), sla)[0] == pytest.approx(want)


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
