"""tools.bench_step: the lone pod's steps run through the Kubernetes core's parts, and
the table of medians."""

from __future__ import annotations

import argparse

from tools.bench_step import COLUMNS, WARM_STEPS, measure, table


def test_steps_bind_and_are_timed() -> None:
    got = measure(nodes=40, background=10, steps=12, spread=True)
    assert set(got) == {k for k, _ in COLUMNS} | {"bound"}
    assert got["bound"] == 12 + WARM_STEPS  # every pod fits: each step binds its pod
    assert 0 < got["cpu_p50"] <= got["cpu_p90"] and got["first_cpu"] > 0


def test_table_gives_median_and_range() -> None:
    a = argparse.Namespace(nodes=40, background=10, spread=False)
    row = dict.fromkeys((k for k, _ in COLUMNS), 1.0)
    text = table({"cfnet": [row, {**row, "cpu_p50": 3.0}, {**row, "cpu_p50": 2.0}]}, a)
    lines = text.splitlines()
    assert lines[0].startswith("| lone pod's step, 40 nodes, 10 bound pods | CPU ms p50 |")
    assert lines[2] == "| cfnet | 2.00 (1.00–3.00) | 1.00 | 1.00 | 1.00 | 1.00 |"
