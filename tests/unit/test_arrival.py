"""The arrival mode's statistics (tools.arrival): pacing, latencies, percentiles, the table."""

from __future__ import annotations

import math

import numpy as np

from tools.arrival import ArrivalRun, slots, table


def test_slots_pace_the_rate_and_stop_at_the_bound() -> None:
    assert slots(20, 1.0, 1000) == [i / 20 for i in range(20)]
    assert len(slots(200, 30, 5000)) == 5000  # bounded
    assert slots(0, 10, 10) == [] and slots(5, 0, 10) == []


def test_latencies_percentiles_and_cpu_per_pod() -> None:
    created = [10.0 + i for i in range(100)]
    bound = [c + (i + 1) / 1000 for i, c in enumerate(created)]  # 1..100 ms
    bound[7] = math.nan  # never bound: left out of the latencies, not of the count
    bound[3] = created[3] - 0.002  # seen bound before the create call returned: 0 ms
    r = ArrivalRun("cfnet", 0, 1.0, created, bound, sched_cpu_s=0.99, api_cpu_s=1.98)
    lat = r.latencies_ms()
    assert len(lat) == 99 and r.n_bound == 99 and r.pods == 100
    assert min(lat) == 0.0 and math.isclose(r.max_ms(), 100.0)
    for q in (0.5, 0.9, 0.99):
        assert math.isclose(r.percentile_ms(q), float(np.percentile(lat, 100 * q)))
    assert math.isclose(r.cpu_ms_per_pod(r.sched_cpu_s), 10.0)
    assert math.isclose(r.achieved_rate(), 1.0)
    empty = ArrivalRun("kube", 0, 1.0, [1.0], [math.nan])
    assert math.isnan(empty.percentile_ms(0.5)) and math.isnan(empty.max_ms())
    assert math.isnan(empty.cpu_ms_per_pod(1.0)) and math.isnan(empty.achieved_rate())


def test_table_gives_median_and_range_per_rate_and_scheduler() -> None:
    runs = []
    for rep, ms in enumerate((10.0, 30.0, 20.0)):
        created = [float(i) for i in range(10)]
        runs.append(ArrivalRun("cfnet", rep, 20.0, created, [c + ms / 1000 for c in created],
                               sched_cpu_s=0.01 * (rep + 1), api_cpu_s=0.05,
                               api_idle_cpu_s=0.04, sched_idle_cpu_s=0.005))
    runs.append(ArrivalRun("kube", 0, 20.0, [0.0, 1.0], [0.5, math.nan],
                           violations=["x"]))
    text = table(runs, ["kube", "cfnet"], 1000, 0).splitlines()
    assert text[0].startswith("| arrival, 1000 nodes |") and len(text) == 4
    kube, cfnet = text[2], text[3]
    assert kube.startswith("| kube | 20 (1.0) | 1/2 | 500 | 500 | 500 | 500 |")
    assert kube.endswith("| 1 |")
    assert cfnet.startswith("| cfnet | 20 (1.0) | 10/10 | 20 (10–30) | 20 (10–30) |")
    assert "| 2.00 (1.00–3.00) | 1.50 (0.50–2.50) | 5.00 | 1.00 |" in cfnet
    assert kube.endswith("| – | – | – | – | 1 |")  # no CPU figures: none


def test_the_arrival_table_fills_the_readme_headline_row() -> None:
    """bench_all's headline row for arrivals reads this table out of bench_k8s's output."""
    from tools.bench_all import HEADLINE, Outcome, headline_cells
    from tools.bench_k8s import ARRIVAL

    runs = [ArrivalRun(n, 0, 20.0, [0.0, 1.0], [ms / 1000, 1 + ms / 1000])
            for n, ms in zip(ARRIVAL, (40.0, 300.0), strict=True)]
    burst = ("| scheduler (100 nodes / 500 pods) | pods/s | first binding s |\n|---|---:|---:|\n"
             "| kube-scheduler, QPS 5000 | 150 | 0.40 |\n| cfnet | 500 | 0.70 |\n")
    out = Outcome("k8s", ["py", "-m", "tools.bench_k8s"], 0, 1.0,
                  f"{burst}\nnote\n\n{table(runs, ARRIVAL, 100, 0)}\n\nnote\n", "")
    spec = next(h for h in HEADLINE if h.table == "arrival")
    got = headline_cells(spec, out)
    assert got is not None
    assert got[0] == "latency p50 ms: 300; p99 ms: 300"
    assert got[1] == "kube-scheduler, QPS 5000: latency p50 ms: 40; p99 ms: 40"
