"""Benchmark: what the link probe costs the agent, per probe, on the same traffic.

Two lab namespaces exchange a paced bulk flow (~10,000 segments/s, MSS-sized
segments). Phases run one after another on that flow, each a separate probe
loop process calling ``collect()`` once per second:

- ``off``:      the same loop with no probe (baseline: an idle Python process);
- ``ebpf``:     EbpfProbe, charged with its process CPU *and* the in-kernel run
                time of its BPF programs (``kernel.bpf_stats_enabled``), since
                tracepoint programs run in the context of the traffic, not the agent;
- ``sockdiag``: SockDiagProbe inside the sender's namespace.

Prints a table: CPU as % of one core, RSS, events, and the segment rate the
probe saw (a check that the load was there). Run as root:
``python -m tools.bench_agent [--phase-seconds 15] [--segs-per-s 10000]``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
MSS = 1448
STATS_SYSCTL = Path("/proc/sys/kernel/bpf_stats_enabled")
PY = sys.executable


def _rss_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def probe_loop(probe_name: str, seconds: float, local_addr: str | None, peer: str | None,
               netns: str | None) -> dict[str, Any]:
    """The measured process: open a probe, collect() once per second, report its own cost."""
    probe: Any = None
    if probe_name == "ebpf":
        from edge_agent.probes.ebpf import EbpfProbe

        probe = EbpfProbe(local_addrs=(local_addr,) if local_addr else ())
    elif probe_name == "sockdiag":
        from edge_agent.probes.sockdiag import SockDiagProbe

        probe = SockDiagProbe(netns=netns)
    # Loading (BCC's clang compile) is a one-off at agent start, not steady-state cost.
    if probe is not None:
        probe.collect()
    bpf0 = probe.prog_stats() if probe_name == "ebpf" else (0, 0)
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.monotonic()
    segs = 0
    intervals = 0
    rss_max = 0
    deadline = t0 + seconds
    next_tick = t0 + 1.0
    while True:
        now = time.monotonic()
        if now >= deadline:
            break
        time.sleep(max(0.0, min(next_tick, deadline) - now))
        next_tick += 1.0
        if probe is not None:
            for s in probe.collect():
                if peer is None or s.peer == peer:
                    segs += s.segs_out
            intervals += 1
        rss_max = max(rss_max, _rss_kb())
    wall = time.monotonic() - t0
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    bpf1 = probe.prog_stats() if probe_name == "ebpf" else (0, 0)
    if probe is not None:
        probe.close()
    proc_cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    return {
        "probe": probe_name,
        "wall_s": wall,
        "proc_cpu_s": proc_cpu,
        "bpf_cpu_s": (bpf1[0] - bpf0[0]) / 1e9,
        "bpf_events": bpf1[1] - bpf0[1],
        "rss_kb": rss_max,
        "intervals": intervals,
        "segs_per_s": segs / wall if wall else 0.0,
    }


def run_bench(phase_s: float, segs_per_s: float, repeats: int = 1) -> list[dict[str, Any]]:
    """Every phase ``repeats`` times, interleaved (off, ebpf, sockdiag, off, ...), so
    other load on a shared machine falls on all of them alike."""
    from tools.lab import Lab, SiteSpec

    rate_mbit = segs_per_s * MSS * 8 / 1e6
    phases = ("off", "ebpf", "sockdiag") * max(1, repeats)
    traffic_s = len(phases) * (phase_s + 8) + 10
    stats_before = STATS_SYSCTL.read_text().strip() if STATS_SYSCTL.exists() else None
    results: list[dict[str, Any]] = []
    with Lab([SiteSpec("a"), SiteSpec("b")], prefix=f"cfbench{os.getpid() % 10000}") as lab:
        sink = lab.popen("b", [PY, "-m", "tools.traffic", "sink", "--port", "5100",
                               "--duration", str(traffic_s + 5)], stderr=subprocess.DEVNULL)
        sender = None
        try:
            sender = lab.popen("a", [PY, "-m", "tools.traffic", "send", lab.addr("b"), "--port",
                                     "5100", "--duration", str(traffic_s),
                                     "--max-mb", f"{rate_mbit / 8 * traffic_s:.0f}",
                                     "--rate-mbit", f"{rate_mbit:.1f}"],
                               stderr=subprocess.DEVNULL)
            time.sleep(3.0)  # connected (the sender retries until the sink is up), past slow start
            if stats_before is not None:
                STATS_SYSCTL.write_text("1")
            for phase in phases:
                argv = [PY, "-m", "tools.bench_agent", "loop", "--probe", phase,
                        "--seconds", str(phase_s), "--local-addr", lab.addr("a"),
                        "--peer", lab.addr("b")]
                if phase == "sockdiag":
                    argv += ["--netns", lab.ns("a")]
                cp = subprocess.run(argv, cwd=REPO, capture_output=True, text=True,
                                    timeout=phase_s + 120, check=False)
                if cp.returncode != 0:
                    raise RuntimeError(f"{phase} loop failed: {cp.stderr[-2000:]}")
                results.append(json.loads(cp.stdout.strip().splitlines()[-1]))
        finally:
            if stats_before is not None:
                STATS_SYSCTL.write_text(stats_before)
            for p in (sender, sink):
                if p is not None:
                    p.kill()
                    p.wait(timeout=10)
    return results


def table(results: Sequence[dict[str, Any]]) -> str:
    """One row per probe: the median over its repetitions, with the spread of the
    total CPU (min-max) beside it."""
    head = (f"| {'probe':<9} | {'CPU % of 1 core':>15} | {'CPU % min-max':>13} | {'process':>8} "
            f"| {'in-kernel BPF':>13} | {'RSS MiB':>7} | {'BPF runs/s':>10} | "
            f"{'segs/s seen':>11} |")
    rule = "|" + "|".join("-" * (len(c)) for c in head.split("|")[1:-1]) + "|"
    lines = [head, rule]
    by: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        by.setdefault(r["probe"], []).append(r)
    for probe, rs in by.items():
        def med(f: Any, rs: list[dict[str, Any]] = rs) -> float:
            return float(statistics.median(f(r) for r in rs))

        def wall(r: dict[str, Any]) -> float:
            return float(r["wall_s"] or 1.0)

        totals = [100 * (r["proc_cpu_s"] + r["bpf_cpu_s"]) / wall(r) for r in rs]
        proc = med(lambda r: 100 * r["proc_cpu_s"] / wall(r))
        bpf = med(lambda r: 100 * r["bpf_cpu_s"] / wall(r))
        segs = f"{med(lambda r: r['segs_per_s']):.0f}" if probe != "off" else "-"
        spread = f"{min(totals):.2f}-{max(totals):.2f}"
        lines.append(
            f"| {probe:<9} | {statistics.median(totals):>15.2f} | {spread:>13} | {proc:>8.2f} "
            f"| {bpf:>13.2f} | {med(lambda r: r['rss_kb']) / 1024:>7.1f} "
            f"| {med(lambda r: r['bpf_events'] / wall(r)):>10.0f} | {segs:>11} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.bench_agent", description=__doc__)
    sub = ap.add_subparsers(dest="cmd")
    lp = sub.add_parser("loop", help="(internal) one measured probe loop; prints JSON")
    lp.add_argument("--probe", choices=("off", "ebpf", "sockdiag"), required=True)
    lp.add_argument("--seconds", type=float, default=15.0)
    lp.add_argument("--local-addr", default=None)
    lp.add_argument("--peer", default=None)
    lp.add_argument("--netns", default=None)
    ap.add_argument("--phase-seconds", type=float, default=15.0)
    ap.add_argument("--segs-per-s", type=float, default=10_000)
    ap.add_argument("--repeats", type=int, default=3,
                    help="measure every probe this often (interleaved); the median is shown")
    ap.add_argument("--json", action="store_true", help="also print the raw results")
    a = ap.parse_args(argv)
    if a.cmd == "loop":
        print(json.dumps(probe_loop(a.probe, a.seconds, a.local_addr, a.peer, a.netns)))
        return 0
    if os.geteuid() != 0:
        print("bench_agent: needs root (network namespaces, eBPF)", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING)
    results = run_bench(a.phase_seconds, a.segs_per_s, a.repeats)
    print(f"agent link-probe cost, ~{a.segs_per_s:.0f} segments/s between two namespaces, "
          f"{a.phase_seconds:.0f} s per phase, collect() every 1 s; median of {a.repeats} "
          "interleaved repetitions per probe")
    print(table(results))
    if a.json:
        print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
