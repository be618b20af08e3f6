"""Reaction benchmark: from an injected link degradation to the core's re-placement decision.

The outage rig of ``tools.outage_rig`` (a network lab; a TLS Mosquitto and
the core in the ``cloud`` namespace; real ``cfnet-agent`` processes, sock_diag
probe, 1 s interval) with three edge sites: ``edgea`` and ``edgeb`` can run
the workload, ``users`` is where its users are (node ``edge-u``, cordoned so
nothing is placed there; its agent measures its links). Bounded, paced TCP
flows run both ways between ``users`` and each candidate site, so every agent
measures RTTs on those links.

The workload asks for ``maxLatencyMs`` (default 20 ms) to ``edge-u``. The
core places it; then, per run, the bandwidth of the link of the site it runs
on is cut (``Lab.set_rate``, tbf, both directions) so the flows queue and the
measured RTT climbs far past the SLA. Measured per run, from the moment the
rate is changed:

- **sense**: until the core's state first holds a p95 RTT over the SLA for
  that node and ``edge-u`` (the floor: nothing can decide before it knows);
- **reaction**: until the core's re-placement decision (the ``move`` event
  the scheduler emits; the new placement is applied in the same step).

Then the link is restored and the next run degrades the other site. With
``--loss-runs`` a few runs degrade with random loss (``Lab.set_loss``)
instead, to show what loss alone does.

Settings (documented, not defaults changed in the core): core step every
0.5 s (the rig's), ``ReplanConfig.violation_intervals`` 3 (the default; strikes
are counted once per report interval, and a p95 at twice the SLA or more counts
twice), ``cooldown_s`` lowered from 600 s to
``--cooldown`` (3 s) because the same workload moves every ~10 s here.

    python -m tools.bench_reaction [--runs 20 --sla-ms 20 --quick]

``--kubernetes``: the same degradation on the deployed Kubernetes path, timed per stage to
the replacement's binding (``tools.bench_reaction_k8s``).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from cloud_core.placement import ReplanConfig
from cloud_core.scheduler import expand_doc
from tools.outage_rig import Rig, rig, wait_until
from tools.stats import pct

log = logging.getLogger("tools.bench_reaction")

SITES = {"edge-a": "edgea", "edge-b": "edgeb", "edge-u": "users"}
USERS = "edge-u"
UID = "bench-svc"


@dataclass
class Run:
    kind: str  # rate | loss
    src: str
    dst: str | None
    sense_s: float
    react_s: float


def p95_ms(r: Rig, node: str) -> float:
    """The worst-direction p95 RTT (ms) the core holds between ``node`` and ``edge-u``.

    The engine takes the *better* of the two directions as the link's latency,
    so the violation shows once both agree; this is what the floor measures.
    """
    snap = r.core.state.snapshot(time.time())
    vals = []
    for key in ((node, USERS), (USERS, node)):
        lk = snap.links.get(key)
        if lk is None or lk.rtt_p95_us is None:
            return math.inf
        vals.append(lk.rtt_p95_us / 1000.0)
    return min(vals)


def where(r: Rig) -> str | None:
    row = r.core.store.get(UID)
    return row.node if row is not None and row.state == "placed" else None


def move_after(r: Rig, t0: float) -> tuple[float, str] | None:
    for ev in r.core.events.recent(200, kind="placement"):
        if ev.ts >= t0 and ev.workload == UID and ev.message.startswith("move"):
            return ev.ts, ev.node or ""
    return None


class SenseWatch:
    """Polls the core's state every 20 ms for the first over-SLA p95 of one node."""

    def __init__(self, r: Rig, node: str, sla_ms: float) -> None:
        self.t: float | None = None
        self._stop = threading.Event()
        self._th = threading.Thread(target=self._run, args=(r, node, sla_ms), daemon=True)
        self._th.start()

    def _run(self, r: Rig, node: str, sla_ms: float) -> None:
        while not self._stop.wait(0.02):
            if p95_ms(r, node) > sla_ms:
                self.t = time.time()
                return

    def stop(self) -> None:
        self._stop.set()
        self._th.join(2)


def settle(r: Rig, sla_ms: float, cooldown_s: float, last_move: float,
           timeout_s: float = 60.0) -> str:
    """Placed, both candidates' links well inside the SLA, cool-down over; returns the host."""
    def ok() -> str | None:
        node = where(r)
        if node is None or time.time() - last_move < cooldown_s + 0.5:
            return None
        other = "edge-b" if node == "edge-a" else "edge-a"
        if p95_ms(r, node) < 0.5 * sla_ms and p95_ms(r, other) < 0.5 * sla_ms:
            return node
        return None
    got = wait_until(ok, timeout_s, "workload placed and links calm")
    time.sleep(1.5)  # a few calm steps so the forecasts and strikes settle
    node = where(r)
    assert isinstance(got, str) and node is not None
    return node


def bench(runs: int, loss_runs: int, sla_ms: float, degraded_mbit: float, loss: float,
          cooldown_s: float, flow_mbit: float, workdir: Path) -> list[Run]:
    out: list[Run] = []
    budget_s = (runs + loss_runs) * 25.0 + 60.0
    with rig(["edgea", "edgeb", "users"], workdir, prefix="rxn") as r:
        sched = r.core.scheduler
        sched.replan_config = replace(ReplanConfig(), cooldown_s=cooldown_s)
        for node, site in SITES.items():
            r.start_agent(site, node)
        r.traffic("edgea", "users", budget_s, port=5201, rate_mbit=flow_mbit)
        r.traffic("edgeb", "users", budget_s, port=5202, rate_mbit=flow_mbit)
        r.core.store.cordon(USERS, "bench")  # users are there; the workload is not
        doc = {"name": UID, "requests": {"cpu": "100m", "memory": "64Mi"},
               "maxLatencyMs": sla_ms, "latencyTo": USERS}
        wait_until(lambda: all(p95_ms(r, n) < math.inf for n in ("edge-a", "edge-b")), 60,
                   "links measured")
        for spec, w in expand_doc(doc):
            r.core.store.submit(UID, w.name, w.namespace, spec)
        last_move = 0.0
        plan = ["rate"] * runs + ["loss"] * loss_runs
        for i, kind in enumerate(plan):
            node = settle(r, sla_ms, cooldown_s, last_move)
            site = SITES[node]
            watch = SenseWatch(r, node, sla_ms)
            t0 = time.time()
            if kind == "rate":
                r.lab.set_rate(site, degraded_mbit)
            else:
                r.lab.set_loss(site, loss)
            got = None
            deadline = time.monotonic() + (15.0 if kind == "rate" else 10.0)
            while time.monotonic() < deadline:
                got = move_after(r, t0)
                if got is not None:
                    break
                time.sleep(0.01)
            watch.stop()
            if kind == "rate":
                r.lab.set_rate(site, None)
            else:
                r.lab.set_loss(site, 0.0)
            sense = (watch.t - t0) if watch.t is not None else math.nan
            react = (got[0] - t0) if got is not None else math.nan
            out.append(Run(kind, node, got[1] if got else None, sense, react))
            log.info("run %d (%s on %s): sense %.2f s, re-placement %.2f s -> %s",
                     i + 1, kind, node, sense, react, got[1] if got else "none")
            if got is not None:
                last_move = got[0]
    return out


def table(results: list[Run], sla_ms: float, degraded_mbit: float, loss: float) -> str:
    rate = [x for x in results if x.kind == "rate"]
    lines = [
        f"| reaction: link rate cut to {degraded_mbit:g} Mbit/s under a {sla_ms:g} ms SLA "
        f"| runs | re-placed | p50 s | p99 s | max s |",
        "|---|---:|---:|---:|---:|---:|",
    ]

    def row(name: str, xs: list[float], n: int, placed: int) -> str:
        return (f"| {name} | {n} | {placed} | {pct(xs, 0.5):.2f} | {pct(xs, 0.99):.2f} | "
                f"{max((x for x in xs if not math.isnan(x)), default=math.nan):.2f} |")

    moved = sum(1 for x in rate if not math.isnan(x.react_s))
    lines.append(row("degradation -> re-placement decision (cfnet)",
                     [x.react_s for x in rate], len(rate), moved))
    lines.append(row("degradation -> over-SLA RTT in the core's state (sensing floor, "
                     "same runs)", [x.sense_s for x in rate], len(rate), moved))
    lossy = [x for x in results if x.kind == "loss"]
    if lossy:
        lm = sum(1 for x in lossy if not math.isnan(x.react_s))
        lines.append(row(f"loss {loss:.0%} instead (10 s window)",
                         [x.react_s for x in lossy], len(lossy), lm))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.bench_reaction",
                                 description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--runs", type=int, default=None, help="20; 10 with --kubernetes")
    ap.add_argument("--loss-runs", type=int, default=2)
    ap.add_argument("--sla-ms", type=float, default=20.0)
    ap.add_argument("--degraded-mbit", type=float, default=1.0)
    ap.add_argument("--flow-mbit", type=float, default=3.0,
                    help="each paced flow, each way (--kubernetes: 0 for none, active probing "
                         "only)")
    ap.add_argument("--loss", type=float, default=0.1)
    ap.add_argument("--cooldown", type=float, default=3.0, help="ReplanConfig.cooldown_s")
    ap.add_argument("--quick", action="store_true", help="20 runs, no loss runs")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--delay-ms", type=float, default=None,
                    help="with --kubernetes: add this one-way delay instead of the rate cut")
    ap.add_argument("--kubernetes", action="store_true",
                    help="cfnet-core --kubernetes's wiring on a control plane with kwok Nodes, "
                         "per stage to the replacement's binding (tools.bench_reaction_k8s)")
    a = ap.parse_args(argv)
    if a.runs is None:
        a.runs = 10 if a.kubernetes else 20
    if a.quick:
        a.loss_runs = 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s",
                        stream=sys.stderr)
    for name in ("tools.lab", "cloud_core", "edge_agent"):
        logging.getLogger(name).setLevel(logging.WARNING)
    if a.kubernetes:
        from tools import bench_reaction_k8s

        return bench_reaction_k8s.report(a.runs, a.sla_ms, a.degraded_mbit, a.cooldown,
                                         a.flow_mbit, a.delay_ms, a.json)
    with tempfile.TemporaryDirectory(prefix="cfnet-bench-reaction-") as tmp:
        results = bench(a.runs, a.loss_runs, a.sla_ms, a.degraded_mbit, a.loss, a.cooldown,
                        a.flow_mbit, Path(tmp))
    print()
    print(table(results, a.sla_ms, a.degraded_mbit, a.loss))
    print(f"\n(agents: sock_diag probe, 1 s interval; core step 0.5 s; violation_intervals 3; "
          f"cooldown {a.cooldown:g} s; 2 shared CPUs)")
    if a.json:
        print(json.dumps([r.__dict__ for r in results], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
