"""The quality benchmark's reference for one set of pods, from two solves of it."""

from __future__ import annotations

import math

import pytest

from tools.bench_quality import best_same
from tools.ref_model import RefResult


def _r(cost: float, bound: float, status: str = "FEASIBLE", seconds: float = 1.0
       ) -> RefResult:
    return RefResult("OPTIMAL", 3, 3, status, cost, bound, {"p": "n"}, seconds)


@pytest.mark.parametrize(("a", "b", "cost", "bound", "status"), [
    # one solve only
    (None, _r(5.0, 4.0), 5.0, 4.0, "FEASIBLE"),
    # the cheaper answer, the higher bound
    (_r(6.0, 4.5), _r(5.0, 4.0), 5.0, 4.5, "FEASIBLE"),
    (_r(5.0, 3.0), _r(6.0, 4.0), 5.0, 4.0, "FEASIBLE"),
    # one proven: the optimum, whichever answer carries it
    (_r(5.0, 5.0, "OPTIMAL"), _r(5.0, 4.0), 5.0, 5.0, "OPTIMAL"),
    # a solve that found nothing (nan) never wins
    (_r(7.0, 2.0), _r(math.nan, math.nan, "UNKNOWN"), 7.0, 2.0, "FEASIBLE"),
    (_r(math.nan, math.nan, "UNKNOWN"), _r(7.0, 2.0), 7.0, 2.0, "FEASIBLE"),
])
def test_best_same(a: RefResult | None, b: RefResult, cost: float, bound: float,
                   status: str) -> None:
    got = best_same(a, b)
    assert got.cost == cost
    assert got.bound == bound
    assert got.status == status
    assert got.seconds == (b.seconds if a is None else a.seconds + b.seconds)


def test_cfnet_runs_in_a_process_of_its_own() -> None:
    """``Cfnet``: this tree's cfnet in a process of its own gives the answer ``place``
    gives here (a small batch the step budget never cuts), with its times."""
    from pathlib import Path

    from cloud_core.placement import EngineConfig, place
    from tools.bench_quality import Cfnet
    from tools.quality_families import FAMILIES

    worker = Cfnet(str(Path(__file__).resolve().parents[2]))
    try:
        got, wall, cpu = worker.run("tight", 10, 1, 2)
    finally:
        worker.close()
    snap, pods = FAMILIES["tight"](10, 1)
    assert got == dict(place(snap, pods, EngineConfig(cpsat_polish=False)).assignments)
    assert got and wall > 0 and cpu > 0
