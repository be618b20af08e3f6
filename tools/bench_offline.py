"""Offline detection benchmark on the outage rig (:mod:`tools.outage_rig`).

``python -m tools.bench_offline`` measures, for ``--kills`` SIGKILLs of an
agent, ``--cuts`` link cuts and ``--partitions`` partitions, the time from the
kill or cut until the core's health says ``down`` or ``unreachable``, and
prints a table (p50 / p95 / max) beside the Kubernetes defaults
(node-monitor-grace-period 40 s, 50 s in some releases, then eviction after
the 300 s default toleration), and writes it into its section of the results
file (``docs/benchmarks/results.md``, the ``results:offline`` markers; ``--no-doc``
prints only). ``--core-outage SECONDS`` instead stops ``cfnet-core`` under a
simulated fleet with end-to-end acks (:func:`core_outage`) and writes its table
between the ``results:offline_core`` markers. Every loop is
bounded in count and time.
"""

from __future__ import annotations

import argparse
import logging
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cloud_core.health import Health, HealthConfig
from edge_agent.wire.mqtt import MqttSettings
from tools.broker import Broker
from tools.outage_rig import Rig, rig, wait_until
from tools.procs import stop_all
from tools.stats import pct

log = logging.getLogger("tools.bench_offline")

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
DOC = REPO / "docs" / "benchmarks" / "results.md"
BEGIN, END = "<!-- results:offline:begin -->", "<!-- results:offline:end -->"
CORE_BEGIN, CORE_END = "<!-- results:offline_core:begin -->", "<!-- results:offline_core:end -->"
AGENT_BUFFER_BYTES = 16 * 1024 * 1024  # the agent's default buffer bound
OFFLINE = (Health.DOWN, Health.UNREACHABLE)
# Kubernetes defaults for comparison: kube-controller-manager marks a node
# Unknown/NotReady after --node-monitor-grace-period (40 s; 50 s in some
# releases), then pods are evicted after the default 300 s toleration for
# node.kubernetes.io/unreachable and not-ready.
K8S_GRACE_S = 40.0
K8S_GRACE_NEW_S = 50.0
K8S_EVICT_S = 300.0


# ====================================================================== benchmark


@dataclass
class Trial:
    kind: str  # kill | cut | partition
    seconds: float
    verdict: str


def _detect(r: Rig, node: str, t0: float, timeout_s: float = 30.0) -> tuple[float, str]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        h = r.health(node)
        if h in OFFLINE:
            return time.time() - t0, str(h)
        time.sleep(0.01)
    return float("nan"), "missed"


def _settle(r: Rig, node: str, reports: int = 3, timeout_s: float = 60.0) -> None:
    """Online with ``reports`` fresh reports from the current boot."""
    wait_until(lambda: r.health(node) is Health.ONLINE, timeout_s, f"{node} online")
    _, seq0 = r.current(node)
    wait_until(lambda: r.current(node)[1] >= seq0 + reports, timeout_s, f"{node} reporting")


def bench(kills: int, cuts: int, partitions: int, workdir: Path) -> list[Trial]:
    trials: list[Trial] = []
    node = "edge-v"
    with rig(["victim", "peer"], workdir) as r:
        r.start_agent("peer", "edge-p")
        for i in range(kills):
            r.start_agent("victim", node)
            _settle(r, node)
            t0 = time.time()
            r.kill_agent(node)
            secs, verdict = _detect(r, node, t0)
            trials.append(Trial("kill", secs, verdict))
            log.info("kill %d: %.3f s -> %s", i + 1, secs, verdict)
        if cuts or partitions:
            r.start_agent("victim", node)
            _settle(r, node)
        for i in range(cuts):
            t0 = time.time()
            r.lab.link_down("victim")
            secs, verdict = _detect(r, node, t0)
            trials.append(Trial("cut", secs, verdict))
            log.info("cut %d: %.3f s -> %s", i + 1, secs, verdict)
            r.lab.link_up("victim")
            _settle(r, node)
        if partitions:
            # Peers keep talking to the victim: bounded traffic both ways.
            r.traffic("victim", "peer", seconds=partitions * 25.0 + 30)
            time.sleep(3)
        for i in range(partitions):
            t0 = time.time()
            r.partition("victim")
            secs, verdict = _detect(r, node, t0)
            trials.append(Trial("partition", secs, verdict))
            log.info("partition %d: %.3f s -> %s", i + 1, secs, verdict)
            r.heal("victim")
            _settle(r, node)
    return trials


def table(trials: list[Trial], hc: HealthConfig, keepalive_s: int) -> str:
    rows = [
        "| fault | n | verdicts | p50 (s) | p95 (s) | max (s) | Kubernetes default |",
        "|---|---|---|---|---|---|---|",
    ]
    what = {"kill": "agent SIGKILL (will)", "cut": "link down (keepalive / age)",
            "partition": "site <-> cloud partition, peers talking"}
    for kind in ("kill", "cut", "partition"):
        ts = [t for t in trials if t.kind == kind]
        if not ts:
            continue
        xs = [t.seconds for t in ts if t.verdict != "missed"]
        verdicts = ", ".join(f"{v} {n}" for v, n in sorted(
            {v: sum(1 for t in ts if t.verdict == v) for v in {t.verdict for t in ts}}.items()))
        rows.append(f"| {what[kind]} | {len(ts)} | {verdicts} | {pct(xs, 0.5):.2f} | "
                    f"{pct(xs, 0.95):.2f} | {max(xs) if xs else float('nan'):.2f} | "
                    f"NotReady after {K8S_GRACE_S:.0f} s ({K8S_GRACE_NEW_S:.0f} s in some "
                    f"releases), eviction {K8S_EVICT_S:.0f} s later |")
    rows.append("")
    rows.append(f"Settings: agent keepalive {keepalive_s} s (the broker's nominal deadline "
                f"for its will: 1.5 x = {1.5 * keepalive_s:.1f} s), report interval 1 s, "
                f"core `offline_after_s` {hc.offline_after_s:g} s, `peer_fresh_s` "
                f"{hc.peer_fresh_s:g} s; probe sock_diag. Health polled every 10 ms from the "
                f"core's state. Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.")
    return "\n".join(rows)


def write_doc(tbl: str, path: Path = DOC, begin: str = BEGIN, end: str = END) -> None:
    text = path.read_text() if path.exists() else ""
    block = f"{begin}\n{tbl}\n{end}"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        _, tail = rest.split(end, 1)
        text = head + block + tail
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    path.write_text(text)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.bench_offline", description=__doc__.split(
        "\n")[0])
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--cuts", type=int, default=20)
    ap.add_argument("--partitions", type=int, default=10)
    ap.add_argument("--no-doc", action="store_true", help="print only; leave docs alone")
    ap.add_argument("--core-outage", type=float, default=0.0, metavar="SECONDS",
                    help="instead: stop cfnet-core this long under a simulated fleet "
                         "(no root needed) and measure loss and drain")
    ap.add_argument("--fleet", type=int, default=2000, help="with --core-outage: agents")
    ap.add_argument("--fleet-interval", type=float, default=2.0,
                    help="with --core-outage: seconds between an agent's reports")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s",
                        stream=sys.stderr)
    for name in ("tools.lab", "cloud_core", "edge_agent"):
        logging.getLogger(name).setLevel(logging.WARNING)
    if a.core_outage > 0:
        with tempfile.TemporaryDirectory(prefix="cfnet-bench-outage-") as tmp:
            out = core_outage(a.fleet, a.fleet_interval, a.core_outage, Path(tmp))
        tbl = outage_table(out)
        print(tbl)
        if not a.no_doc:
            write_doc(tbl, DOC, CORE_BEGIN, CORE_END)
        ok = out.unacked_at_end == 0 and out.dropped == 0 and out.duplicates_in_state == 0
        return 0 if ok else 1
    with tempfile.TemporaryDirectory(prefix="cfnet-bench-offline-") as tmp:
        trials = bench(a.kills, a.cuts, a.partitions, Path(tmp))
    tbl = table(trials, HealthConfig(), 3)
    print(tbl)
    if any(t.verdict == "missed" for t in trials):
        print("some faults were not detected within 30 s", file=sys.stderr)
    if not a.no_doc:
        write_doc(tbl)
    return 0



# ====================================================================== core outage


def outage_table(o: CoreOutage) -> str:
    lost = o.unacked_at_end + o.dropped
    return "\n".join([
        "| agents | interval | core stopped | reports taken | lost | twice in state | "
        "resent | most held by one agent | drain after restart |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| {o.fleet:,} | {o.interval_s:g} s | {o.outage_s:g} s | {o.taken:,} | {lost} | "
        f"{o.duplicates_in_state} | {o.resent:,} | {o.max_pending_per_agent} reports "
        f"(~{o.max_pending_per_agent * o.report_bytes / 1024:.0f} KiB of the agent's "
        f"{AGENT_BUFFER_BYTES >> 20} MiB bound) | {o.drain_s:.1f} s ({o.connect_s:.1f} s of "
        "it until the core answered) |",
        "",
        f"`python -m tools.bench_offline --core-outage {o.outage_s:g} --fleet {o.fleet} "
        f"--fleet-interval {o.interval_s:g}`: simulated agents with end-to-end acks (ack "
        "mode of tools/simulate.py, the agent's window and resend policy), TLS Mosquitto, "
        "`cfnet-core` as shipped (MQTT child process), stopped with SIGTERM and started "
        f"again; {o.acked_before_stop:,} reports acknowledged before the stop. Drain: from "
        "the restart until every report taken before it was acknowledged. Whole run "
        f"{o.elapsed_s:.0f} s, measured "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on the shared 2-CPU machine.",
    ])


@dataclass
class CoreOutage:
    """What :func:`core_outage` saw."""

    fleet: int
    interval_s: float
    outage_s: float
    taken: int
    acked_before_stop: int
    unacked_at_end: int
    dropped: int  # reports a simulated agent gave up (buffer bound, refused): must be 0
    duplicates_in_state: int  # (node, boot, seq) twice in the restarted core's state
    resent: int
    max_pending_per_agent: int
    report_bytes: int
    drain_s: float  # from the core's restart until every report taken before it was acked
    connect_s: float  # of which: until the restarted core answered the console
    elapsed_s: float


def _core_proc(broker: Broker, workdir: Path, log_name: str) -> subprocess.Popen[bytes]:
    """``cfnet-core`` as shipped (MQTT in its child process), on ``broker``."""
    creds = broker.add_account("core-0", "core")
    (workdir / "core.pw").write_text(creds.password)
    (workdir / "roles.yaml").write_text("operators: {bench: viewer}\n")
    out = open(workdir / log_name, "ab")  # noqa: SIM115 - the process owns it
    try:
        return subprocess.Popen(
            [str(VENV_BIN / "cfnet-core"), "--broker-host", broker.host, "--broker-port",
             str(broker.port), "--username", "core-0", "--password-file",
             str(workdir / "core.pw"), "--ca-file", str(broker.ca_file), "--roles",
             str(workdir / "roles.yaml"), "--db", str(workdir / "core.db"),
             "--table-every", "0"], stdout=out, stderr=subprocess.STDOUT)
    finally:
        out.close()


def core_outage(fleet: int, interval_s: float, outage_s: float, workdir: Path, *,
                warm_s: float = 20.0, after_s: float = 20.0, drain_limit_s: float = 600.0,
                connections: int = 4) -> CoreOutage:
    """``fleet`` simulated agents (tools.simulate, ack mode: each keeps every report
    until the core acknowledges it, window and resends as ``edge_agent.outbox``)
    report every ``interval_s`` through a TLS Mosquitto; ``cfnet-core`` is stopped
    (SIGTERM) after ``warm_s`` for ``outage_s`` and started again. Measured: every
    report acknowledged in the end, none dropped, none twice in the restarted core's
    state, the most any agent held, and the time to drain."""
    from cloud_core.console.client import ConsoleClient, ConsoleUnavailable
    from tools.simulate import SimConfig, Simulator, World

    t_start = time.time()
    with Broker(workdir / "broker") as broker:
        def ms(name: str) -> MqttSettings:
            c = broker.add_account(name, "sim")
            return MqttSettings(host=broker.host, port=broker.port, username=name,
                                password=c.password, tls=True, ca_file=c.ca_file,
                                client_id=name, keepalive_s=10, session_expiry_s=0,
                                clean_start=True, max_inflight=100)

        sims = [ms(f"sim-out{i}") for i in range(connections)]
        listener = ms("sim-out-acks")
        run_s = warm_s + outage_s + after_s
        world = World(SimConfig(nodes=fleet, rate=1.0 / interval_s, duration_s=run_s, seed=3,
                                node_prefix="ot"))
        op = broker.add_account("bench", "operator")
        console = ConsoleClient(MqttSettings(host=broker.host, port=broker.port,
                                             username="bench", password=op.password,
                                             tls=True, ca_file=op.ca_file), "bench")
        procs = [_core_proc(broker, workdir, "core.log")]

        def answering() -> bool:
            try:
                return console.call("stats", timeout_s=2).ok
            except ConsoleUnavailable:
                return False

        sim = Simulator(world, sims, acks=listener, drain_s=drain_limit_s)
        result: dict[str, object] = {}
        runner = threading.Thread(target=lambda: result.update(sim.run()), daemon=True)
        try:
            console.connect(30)
            wait_until(answering, 60, "core answering")
            runner.start()
            wait_until(lambda: sim.t0 and time.time() - sim.t0 >= warm_s, warm_s + 60,
                       "warm-up")
            procs[0].terminate()
            procs[0].wait(30)
            log.info("core stopped; %d reports unacknowledged", sim.pending_total())
            acked_before = sum(last for _b, last in sim.taken().values()) - sim.pending_total()
            time.sleep(outage_s)
            mark = {n: last for n, (_b, last) in sim.taken().items()}
            t_restart = time.time()
            procs.append(_core_proc(broker, workdir, "core.log"))
            wait_until(answering, 120, "restarted core answering")
            connect_s = time.time() - t_restart

            def drained() -> bool:
                return all(o is None or o > mark[n] for n, o in sim.oldest_pending().items())

            wait_until(drained, drain_limit_s, "every report taken during the outage acked",
                       poll_s=0.5)
            drain_s = time.time() - t_restart
            log.info("drained in %.1f s", drain_s)
            runner.join(run_s + drain_limit_s + 120)
            taken = sum(last for _b, last in sim.taken().values())
            dups = 0
            for n, (boot, _last) in sim.taken().items():
                r = console.call("received", {"node": n}, timeout_s=10)
                for e in r.data["boots"] if r.ok else []:
                    if e["boot"] == boot:
                        dups += e["count"] - e["distinct"]
            sample = world.report_bytes(world.nodes[0], 1, "0123456789ab", time.time(), 0.0,
                                        random.Random(1))
            return CoreOutage(
                fleet=fleet, interval_s=interval_s, outage_s=outage_s, taken=taken,
                acked_before_stop=acked_before, unacked_at_end=int(str(result["unacked"])),
                dropped=int(str(result["pending_dropped"])), duplicates_in_state=dups,
                resent=int(str(result["resent"])),
                max_pending_per_agent=int(str(result["max_pending"])),
                report_bytes=len(sample), drain_s=drain_s, connect_s=connect_s,
                elapsed_s=time.time() - t_start)
        finally:
            sim.stop()
            console.close()
            stop_all(procs, grace_s=15)


if __name__ == "__main__":
    raise SystemExit(main())
