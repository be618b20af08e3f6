"""The two buses side by side: Mosquitto (one broker) and a 3-node NATS JetStream cluster.

Each run, on each bus, the same scenario, so the table compares like with like:

- **bus**: Mosquitto (:class:`tools.broker.Broker`, TLS, production settings) or three
  ``nats-server`` nodes on loopback (:class:`tools.nats.cluster.NatsCluster`, TLS, MQTT
  state and the shared-ingest stream replicated on all three);
- **core**: two replicas, a leader (places, answers the console) and a follower, as
  ``cfnet-core`` runs them (MQTT in a child process each) and splitting ingest by the
  bus's own mechanism: ``$share`` on Mosquitto, a shared JetStream consumer on NATS
  (``cloud_core/bus_nats_ingest.py``); their states converge through digests;
- **fleet**: ``--nodes`` simulated agents (``python -m tools.simulate``, paho, so that
  it reconnects after a bus-node kill) at 1 report/s with end-to-end acks: each keeps
  a report until a core acknowledges it and resends what is lost, as the agent does.

Timeline (seconds from the fleet's start): warm-up, then ``--steady`` seconds measured
(reports/s ingested by both replicas, p99 staleness of the leader's view of every
node sampled each second, CPU per 1,000 nodes of the bus processes and of the core
processes), then one **bus node is SIGKILLed** (NATS: node 0, the one both cores
connected to first, left down; Mosquitto: its only node, restarted at once as a
supervisor would), then the **follower replica's bus connection is SIGKILLed** (its
MQTT process). Recovery = from the kill until every node is fresh again (staleness
p99 staleness of the leader's view back under max(2.5 s, 1.5 x the steady p99)). At
the end: reports the fleet still holds unacknowledged after a ``DRAIN_S`` drain (kept
and resent by the agents, so not lost while they hold them; 0 means every report
reached a core's state), how many were resent, and how many reports the two replicas
folded in more than once between them (duplicates in the core's state).

Where the machine does not carry the fleet it says so rather than reporting a slow bus:
a run is **overloaded** when ingest falls under 90 % of offered in the steady window or a
report waited more than 5 s in the stream (NATS: the cores' shared-ingest lag, sampled
each second; ``cfnet_shared_ingest_behind``), and the table counts those runs beside the
replica kills that recovered, the longest wait in the stream and the reports dropped
with their JetStream ack unconfirmed.

Median of ``--runs`` runs with the spread (min-max). All of it shares this 2-core
machine (bus, two cores, simulator): absolute figures are this machine's.

    python -m tools.bench_bus [--nodes 1000 --runs 3 --steady 10] [--quick]

Grown to the knee, steady state only, with the 100,000-node sizing: ``tools/bus_sweep.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cloud_core.mqtt_process import MqttProcess
from cloud_core.service import CoreService
from tools.bench_ingest import process_cpu_s, quantile, sample_core
from tools.broker import Broker
from tools.nats.cluster import NatsCluster

REPO = Path(__file__).resolve().parent.parent
SIM_ACCOUNTS = ("sim-bb0", "sim-bb1")
ACK_ACCOUNT = "sim-bb-acks"
FRESH_S = 2.5
WARM_S = 5.0
# The bus node kill's window: on NATS the streams and consumers the dead node led stall
# for the Raft election (4-9 s, docs/nats.md) and the follower's digests for its own
# failover; a window of 12 s left a 10 s recovery 2 s before the replica kill.
KILL_WINDOW_S = 15.0
SETTLE_S = 3.0  # the replica kill comes at least this long after the bus kill recovered
# The replica kill's window: the dead replica's fetched-unacknowledged reports come back
# after NATS's ack wait (5 s), and agents resend after their resend_s (10 s).
REPLICA_WINDOW_S = KILL_WINDOW_S + 10
DRAIN_S = 20.0
PREFIX = "bb"
# A run is marked overloaded (the table says how many were) when ingest falls under this
# share of offered, or reports wait in the stream longer than this (half the agents'
# resend time: past it, late reports come twice).
OVERLOAD_RATE = 0.9
OVERLOAD_LAG_S = 5.0

Bus = Broker | NatsCluster


@dataclass
class Run:
    bus: str
    rate: float = 0.0  # reports/s ingested (both replicas) during the steady window
    offered: float = 0.0  # reports/s due from the fleet
    p99_stale: float = 0.0
    bus_cpu_per_k: float = 0.0  # CPU cores per 1,000 nodes
    core_cpu_per_k: float = 0.0
    bus_kill_recovery: float = float("nan")
    duplicates: float = float("nan")  # reports folded more than once across the replicas
    dup_replica_kill: float = float("nan")  # of those, sent around the replica kill
    replica_kill_recovery: float = float("nan")
    lost: int = -1
    resent: int = 0
    shares: list[int] = field(default_factory=list)
    p99_second: float = float("nan")  # the median second's p99 staleness (bus_sweep's)
    bus_mib_per_k: float = 0.0
    core_mib_per_k: float = 0.0
    # How far shared ingest fell behind the bus (NATS: the longest a fetched report had
    # waited in the stream, sampled each second) and what that cost: reports dropped with
    # their JetStream ack unconfirmed (the agents resend them), bus connections restarted.
    max_lag_s: float = 0.0
    unconfirmed: int = 0
    restarts: int = 0

    @property
    def overloaded(self) -> bool:
        """The machine did not carry this fleet: ingest under 90 % of offered in the steady
        window, or reports waiting in the stream past half the agents' resend time."""
        return self.rate < OVERLOAD_RATE * self.offered or self.max_lag_s > OVERLOAD_LAG_S


def make_bus(kind: str, work: Path) -> Bus:
    return Broker(work) if kind == "mosquitto" else NatsCluster(work)


def bus_pids(b: Bus) -> list[int]:
    if isinstance(b, NatsCluster):
        return b.pids()
    return [b.pid] if b.pid else []


def core_pids(cores: list[CoreService]) -> list[int]:
    return [os.getpid(), *(p for c in cores if (p := getattr(c.mqtt, "pid", None)))]


def cpu(pids: list[int]) -> float:
    return sum(process_cpu_s(p) for p in pids)


def start_cores(b: Bus, work: Path) -> list[CoreService]:
    """Leader and follower configured as ``cfnet-core --share-group`` configures them
    (``build_config``: on Mosquitto that includes the non-persistent session a `$share`
    member needs to leave the group when it dies)."""
    from cloud_core.main import build_config, parse_args

    cores = []
    for i in (1, 2):
        creds = b.add_account(f"core-b{i}", "core")
        argv = ["--broker-host", b.host, "--broker-port", str(b.port),
                "--ca-file", str(b.ca_file), "--username", creds.username,
                f"--password={creds.password}", "--db", str(work / f"core{i}.db"),
                "--share-group", "cfnet"]
        if isinstance(b, NatsCluster):
            argv += ["--bus", "nats", "--nats-url", ",".join(b.nats_urls),
                     "--broker-failover", ",".join(f"{h}:{p}" for h, p in b.failover)]
        if i == 2:
            argv.append("--no-place")
        c = CoreService(build_config(parse_args(argv)))
        c.start()
        if not c.mqtt.wait_connected(30):
            raise RuntimeError(f"core-b{i} did not connect to {type(b).__name__}")
        cores.append(c)
    return cores


def sim_argv(b: Bus, kind: str, nodes: int, duration: float) -> list[str]:
    # On NATS the fleet talks to node 1, which stays up: the kill hits the cores' node.
    port = b.nodes[1].mqtt_port if isinstance(b, NatsCluster) else b.port
    return [sys.executable, "-m", "tools.simulate", "--nodes", str(nodes), "--rate", "1",
            "--duration", str(duration), "--seed", "3", "--node-prefix", PREFIX,
            "--broker-host", b.host, "--broker-port", str(port), "--ca-file", str(b.ca_file),
            "--pki", str(b.store.root), "--accounts", ",".join(SIM_ACCOUNTS), "--bus", kind,
            "--client", "paho", "--ack-account", ACK_ACCOUNT, "--drain", str(DRAIN_S), "--quiet"]


def ingest_stats(cores: list[CoreService]) -> list[dict[str, int]]:
    """Each core's shared-ingest figures as its MQTT child last reported them (NATS)."""
    return [dict(getattr(c.mqtt, "ingest", {})) for c in cores]


class LagWatch:
    """Samples, once a second on its own thread, how long the last report each core
    fetched had waited in the stream; keeps the longest."""

    def __init__(self, cores: list[CoreService]) -> None:
        self.cores, self.max_s = cores, 0.0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, name="lag-watch", daemon=True)
        self._t.start()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            for st in ingest_stats(self.cores):
                self.max_s = max(self.max_s, st.get("lag_ms", 0) / 1000)

    def stop(self) -> float:
        self._stop.set()
        self._t.join(5)
        return self.max_s


def recovery(leader: CoreService, t_kill: float, window_s: float, fresh_s: float) -> float:
    """Seconds from ``t_kill`` until the p99 staleness of the leader's view is back under
    ``fresh_s`` after having gone above it (0 when it never did); NaN if not back within
    ``window_s``."""
    went_stale = False
    while time.time() - t_kill < window_s:
        s = sample_core(leader, PREFIX)
        worst = quantile(s.stale, 0.99) if s.stale else 0.0
        if worst > fresh_s:
            went_stale = True
        elif went_stale:
            return time.time() - t_kill
        time.sleep(0.25)
    return float("nan") if went_stale else 0.0


def one_run(kind: str, nodes: int, steady_s: float, log: Any) -> Run:
    r = Run(kind)
    with tempfile.TemporaryDirectory(prefix=f"cfnet-bench-bus-{kind}-") as tmp:
        work = Path(tmp)
        b = make_bus(kind, work / "bus")
        b.start()
        cores: list[CoreService] = []
        sim: subprocess.Popen[str] | None = None
        lag: LagWatch | None = None
        try:
            for a in SIM_ACCOUNTS:
                b.add_account(a, "sim")
            b.add_account(ACK_ACCOUNT, "sim")
            cores = start_cores(b, work)
            time.sleep(2.0)  # shared subscriptions / consumers in place
            bus_rss0, core_rss0 = rss_mib(bus_pids(b)), rss_mib(core_pids(cores))
            lag = LagWatch(cores)
            # The fleet sends through both kill windows (and a little past them): a window
            # that outlived the fleet read the fleet's end as staleness (n/a in the table).
            duration = WARM_S + steady_s + KILL_WINDOW_S + SETTLE_S + REPLICA_WINDOW_S + 3
            sim = subprocess.Popen(sim_argv(b, kind, nodes, duration), cwd=str(REPO),
                                   stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            t0 = time.time()
            time.sleep(WARM_S)
            leader = cores[0]
            acc0 = sum(c.ingest.counters().accepted for c in cores)
            bus0, core0, w0 = cpu(bus_pids(b)), cpu(core_pids(cores)), time.time()
            stale: list[float] = []
            per_s: list[float] = []
            while time.time() - w0 < steady_s:
                time.sleep(1.0)
                if now_stale := sample_core(leader, PREFIX).stale:
                    stale.extend(now_stale)
                    per_s.append(quantile(now_stale, 0.99))
            dt = time.time() - w0
            r.rate = (sum(c.ingest.counters().accepted for c in cores) - acc0) / dt
            r.offered = float(nodes)
            r.p99_stale = quantile(stale, 0.99)
            r.p99_second = statistics.median(per_s) if per_s else float("nan")
            r.bus_cpu_per_k = (cpu(bus_pids(b)) - bus0) / dt / (nodes / 1000)
            r.core_cpu_per_k = (cpu(core_pids(cores)) - core0) / dt / (nodes / 1000)
            r.bus_mib_per_k = (rss_mib(bus_pids(b)) - bus_rss0) / (nodes / 1000)
            r.core_mib_per_k = (rss_mib(core_pids(cores)) - core_rss0) / (nodes / 1000)
            r.shares = [c.ingest.counters().accepted for c in cores]
            log(f"{kind}: steady {r.rate:,.0f} reports/s, p99 staleness {r.p99_stale:.2f} s")
            # A bus node dies.
            t_kill = time.time()
            if isinstance(b, NatsCluster):
                b.kill_node(0)
            else:
                b.kill()
                b.start()
            # "Fresh" relative to this run's steady state: the shared machine's load
            # already sets the floor of staleness.
            fresh = max(FRESH_S, 1.5 * r.p99_stale)
            r.bus_kill_recovery = recovery(leader, t_kill, KILL_WINDOW_S, fresh)
            log(f"{kind}: bus node kill: fresh again after {r.bus_kill_recovery:.1f} s")
            # The replica kill starts from a settled bus, never inside the bus kill's
            # recovery (the fleet sends SETTLE_S longer than the two windows for that).
            settled = t_kill + (r.bus_kill_recovery if r.bus_kill_recovery == r.bus_kill_recovery
                                else KILL_WINDOW_S) + SETTLE_S
            rest = max(t0 + WARM_S + steady_s + KILL_WINDOW_S, settled) - time.time()
            if rest > 0:
                time.sleep(rest)
            # What each replica ingested between the two kills: a replica whose
            # share stopped would leave the fleet to the other alone.
            between = [c.ingest.counters().accepted - a
                       for c, a in zip(cores, r.shares, strict=True)]
            log(f"{kind}: reports per replica between the kills {between}")
            # The follower replica's bus connection dies.
            mqtt = cores[1].mqtt
            pid = mqtt.pid if isinstance(mqtt, MqttProcess) else None
            t_kill = time.time()
            if pid:
                os.kill(pid, signal.SIGKILL)
            r.replica_kill_recovery = recovery(leader, t_kill, REPLICA_WINDOW_S, fresh)
            log(f"{kind}: replica kill: fresh again after {r.replica_kill_recovery:.1f} s")
            out, _ = sim.communicate(timeout=duration + DRAIN_S + 120)
            lines = [ln for ln in out.splitlines() if ln.startswith("{")]
            if lines:
                res = json.loads(lines[-1])
                r.lost = int(res.get("unacked", -1)) + int(res.get("pending_dropped", 0))
                r.resent = int(res.get("resent", 0))
            dup_seqs = duplicate_seqs(cores, PREFIX)
            r.duplicates = len(dup_seqs)
            # Which kill the twice-folded reports were sent around: from 3 s before the
            # replica kill on, the replica kill's; before that, the bus node kill's.
            r.dup_replica_kill = sum(t0 + q >= t_kill - 3 for q in dup_seqs)
            r.max_lag_s = lag.stop()
            r.unconfirmed = sum(st.get("unconfirmed", 0) for st in ingest_stats(cores))
            r.restarts = sum(getattr(c.mqtt, "restarts", 0) for c in cores)
            log(f"{kind}: {r.lost} unacknowledged after the drain, {r.duplicates:.0f} "
                f"reports twice in the replicas' state ({r.dup_replica_kill:.0f} sent around "
                f"the replica kill, seqs {sorted(set(dup_seqs))[:12]}); shared ingest at most "
                f"{r.max_lag_s:.1f} s behind, {r.unconfirmed} dropped unconfirmed, "
                f"{r.restarts} bus connection(s) restarted")
            log(f"{kind}: fold gates (held for the peers' digests, dropped for their owner: "
                f"cloud_core/ownership.py) {[c.gate.counts() if c.gate else {} for c in cores]}; "
                "digests sent (of those before their interval: answers, the gate's changes) "
                f"{[(d.sent_digests, d.prompt_digests) for c in cores if (d := c.digests)]}")
            if r.overloaded:
                log(f"{kind}: OVERLOADED at {nodes:,} nodes: {r.rate:,.0f} of {nodes:,} "
                    f"reports/s ingested, reports waited up to {r.max_lag_s:.1f} s in the "
                    "stream: this machine does not carry this fleet")
        finally:
            if lag is not None:
                lag.stop()
            if sim is not None and sim.poll() is None:
                sim.kill()
                sim.wait(10)
            for c in cores:
                c.stop()
            b.stop()
    return r


def duplicates_in_state(cores: list[CoreService], prefix: str) -> int:
    """Reports the replicas folded in more than once, together: each core's own history of
    (boot, seq) per node (what it ingested itself, not what digests told it; bounded by
    ``SEQ_HISTORY``, far above a run's reports per node). A report the bus handed to both
    replicas, or to one twice, counts once per extra fold."""
    return len(duplicate_seqs(cores, prefix))


def duplicate_seqs(cores: list[CoreService], prefix: str) -> list[int]:
    """The seq of every extra fold ``duplicates_in_state`` counts (at 1 report/s a seq
    says when its report was sent: about ``seq`` seconds after the fleet started)."""
    nodes: set[str] = set()
    for c in cores:
        nodes |= {n for n in c.state.snapshot(time.time()).nodes if n.startswith(prefix)}
    out: list[int] = []
    for n in nodes:
        folded = [x for c in cores for x in c.state.node_history(n)]
        seen: set[tuple[str, int]] = set()
        for x in folded:
            if x in seen:
                out.append(x[1])
            seen.add(x)
    return out


def rss_mib(pids: list[int]) -> float:
    total = 0
    for p in pids:
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


@dataclass
class Sessions:
    bus: str
    sessions: int
    connect_s: float = 0.0
    rss_mib_per_k: float = 0.0  # bus memory per 1,000 persistent sessions
    delivered: float = 0.0  # fraction of the acks delivered
    bus_cpu_per_k: float = 0.0  # cores per 1,000 sessions, 1 QoS 1 ack/s each


def sessions_run(kind: str, k: int, seconds: float, log: Any, qos: int = 1,
                 sub_qos: int = 1) -> Sessions:
    """What every agent costs the bus beyond its reports: ``k`` persistent sessions (one
    per agent, each subscribed QoS 1 to its ack topic, as the agent is) and one QoS 1 ack
    a second to each, as the core sends them."""
    from edge_agent import wire
    from edge_agent.wire.mqtt import MqttClient, MqttSettings

    out = Sessions(kind, k)
    with tempfile.TemporaryDirectory(prefix=f"cfnet-bench-sess-{kind}-") as tmp:
        b = make_bus(kind, Path(tmp) / "bus")
        if isinstance(b, Broker):
            b.username_as_clientid = False  # many sessions of one test account
        b.start()
        clients: list[MqttClient] = []
        got = [0]
        lock = threading.Lock()

        def hit(_m: Any) -> None:
            with lock:
                got[0] += 1

        try:
            creds = b.add_account("sim-sess", "sim")
            core = b.add_account("core-sess", "core")
            proto: dict[str, Any] = ({"protocol": "mqtt311"} if isinstance(b, NatsCluster)
                                     else {})
            rss0 = rss_mib(bus_pids(b))
            t0 = time.time()
            for i in range(k):
                c = MqttClient(MqttSettings(
                    host=b.host, port=b.port, username=creds.username, password=creds.password,
                    tls=True, ca_file=b.ca_file, client_id=f"sess-{i}", keepalive_s=30,
                    clean_start=False, **proto), on_message=hit)
                c.subscribe(wire.ack_topic(f"sess-{i}"), qos=sub_qos)
                c.start()
                clients.append(c)
                if i % 20 == 19:  # in steps, as a fleet comes up, not one TLS storm
                    time.sleep(0.2)
            deadline = time.time() + 90
            missing = sum(not c.wait_connected(max(0.0, deadline - time.time()))
                          for c in clients)
            if missing:
                raise RuntimeError(f"{kind}: {missing} of {k} sessions did not connect "
                                   "within 90 s")
            out.connect_s = time.time() - t0
            time.sleep(2.0)  # subscriptions (NATS: JetStream consumers) in place
            out.rss_mib_per_k = (rss_mib(bus_pids(b)) - rss0) / (k / 1000)
            pub = MqttClient(MqttSettings(host=b.host, port=b.port, username=core.username,
                                          password=core.password, tls=True, ca_file=b.ca_file,
                                          client_id="core-sess", max_inflight=100, **proto))
            pub.start()
            assert pub.wait_connected(30)
            cpu0, w0, sent = cpu(bus_pids(b)), time.time(), 0
            while time.time() - w0 < seconds:
                tick = time.time()
                hs = [pub.publish(wire.ack_topic(f"sess-{i}"), b'{"v":1}', qos=qos)
                      for i in range(k)]
                sent += len(hs)
                if qos:
                    hs[-1].wait(5)
                time.sleep(max(0.0, 1.0 - (time.time() - tick)))
            dt = time.time() - w0
            out.bus_cpu_per_k = (cpu(bus_pids(b)) - cpu0) / dt / (k / 1000)
            deadline = time.time() + 10
            while got[0] < sent and time.time() < deadline:
                time.sleep(0.1)
            out.delivered = got[0] / sent if sent else 0.0
            pub.stop()
            log(f"{kind}: {k} sessions subscribed at QoS {sub_qos}, acks at QoS {qos}: "
                f"connect {out.connect_s:.1f} s, "
                f"{out.rss_mib_per_k:.0f} MiB/1,000, {out.bus_cpu_per_k:.3f} cores/1,000 "
                f"for acks, acks delivered {out.delivered:.0%}")
        finally:
            for c in clients:
                c.stop()
            b.stop()
    return out


def med(xs: Sequence[float], spec: str) -> str:
    good = [x for x in xs if x == x]
    if not good:
        return "n/a"
    m = statistics.median(good)
    spread = f" ({min(good):{spec}}-{max(good):{spec}})" if len(good) > 1 else ""
    missing = f" [{len(xs) - len(good)} n/a]" if len(good) < len(xs) else ""
    return f"{m:{spec}}{spread}{missing}"


def table(runs: dict[str, list[Run]], nodes: int, steady_s: float) -> str:
    rows: list[tuple[str, Callable[[Run], float], str]] = [
        ("reports/s ingested (offered)", lambda r: r.rate, ",.0f"),
        ("p99 staleness, s", lambda r: r.p99_stale, ".2f"),
        ("bus CPU, cores / 1,000 nodes", lambda r: r.bus_cpu_per_k, ".3f"),
        ("core CPU (2 replicas), cores / 1,000 nodes", lambda r: r.core_cpu_per_k, ".3f"),
        ("bus node SIGKILL: all fresh again after, s", lambda r: r.bus_kill_recovery, ".1f"),
        ("replica SIGKILL: all fresh again after, s", lambda r: r.replica_kill_recovery, ".1f"),
        ("reports still unacknowledged after the drain", lambda r: r.lost, ",.0f"),
        ("reports resent by agents", lambda r: r.resent, ",.0f"),
        ("reports folded twice (both replicas' state)", lambda r: r.duplicates, ",.0f"),
        ("of those, sent around the replica kill", lambda r: r.dup_replica_kill, ",.0f"),
        ("shared ingest behind the bus, s (longest wait in the stream)",
         lambda r: r.max_lag_s, ".1f"),
        ("reports dropped with their JetStream ack unconfirmed", lambda r: r.unconfirmed,
         ",.0f"),
    ]
    kinds = list(runs)
    n = max(len(v) for v in runs.values())
    out = [f"{nodes:,} nodes at 1 report/s ({nodes:,} reports/s offered), {steady_s:.0f} s "
           f"steady window; median of {n} runs (min-max)", "",
           "| | " + " | ".join(kinds) + " |", "|---|" + "---|" * len(kinds)]
    for label, f, spec in rows:
        out.append(f"| {label} | " + " | ".join(med([f(r) for r in runs[k]], spec)
                                                  for k in kinds) + " |")
    out.append("| replica kill recovered, runs | " + " | ".join(
        f"{sum(r.replica_kill_recovery == r.replica_kill_recovery for r in runs[k])} of "
        f"{len(runs[k])}" for k in kinds) + " |")
    out.append("| runs overloaded (ingest < 90 % offered, or a report > 5 s in the stream) | "
               + " | ".join(f"{sum(r.overloaded for r in runs[k])} of {len(runs[k])}"
                            for k in kinds) + " |")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.bench_bus",
                                 description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--steady", type=float, default=10.0)
    ap.add_argument("--buses", default="mosquitto,nats")
    ap.add_argument("--sessions", type=int, default=0,
                    help="also measure N persistent agent sessions per bus (0: skip)")
    ap.add_argument("--skip-fleet", action="store_true", help="only the sessions part")
    ap.add_argument("--ack-qos", type=int, choices=(0, 1), default=1,
                    help="QoS of the acks in the sessions part (the core sends 1)")
    ap.add_argument("--sub-qos", type=int, choices=(0, 1), default=1,
                    help="QoS of the sessions' subscriptions (the agent uses 1)")
    ap.add_argument("--sessions-one", default="", help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true", help="one run each, 500 nodes")
    a = ap.parse_args(argv)
    if a.quick:
        a.runs, a.nodes = 1, 500
    if not 1 <= a.nodes <= 20000 or not 1 <= a.runs <= 5 or not 3 <= a.steady <= 60:
        ap.error("bounds: --nodes 1..20000, --runs 1..5, --steady 3..60")
    t0 = time.time()

    def log(msg: str) -> None:
        print(f"[bench_bus {time.time() - t0:6.1f}s] {msg}", file=sys.stderr, flush=True)

    if a.sessions_one:  # one sessions run in this (fresh) process: JSON on stdout
        x = sessions_run(a.sessions_one, a.sessions, a.steady, log, a.ack_qos, a.sub_qos)
        print(json.dumps(x.__dict__))
        return 0

    runs: dict[str, list[Run]] = {k: [] for k in a.buses.split(",")}
    for i in range(0 if a.skip_fleet else a.runs):
        for kind in runs:  # interleaved, so drift in the machine's load hits both
            log(f"run {i + 1}/{a.runs} on {kind}")
            runs[kind].append(one_run(kind, a.nodes, a.steady, log))
    if not a.skip_fleet:
        print(table(runs, a.nodes, a.steady))
    if a.sessions:
        if not 1 <= a.sessions <= 5000:
            ap.error("--sessions 1..5000")
        sess: dict[str, list[Sessions]] = {k: [] for k in runs}
        for _ in range(a.runs):
            for kind in sess:
                # Each run in a fresh process: hundreds of paho clients leave file
                # descriptors behind, and past 1,024 paho's select() fails to connect.
                cp = subprocess.run(
                    [sys.executable, "-m", "tools.bench_bus", "--sessions-one", kind,
                     "--sessions", str(a.sessions), "--steady", str(a.steady),
                     "--ack-qos", str(a.ack_qos), "--sub-qos", str(a.sub_qos)],
                    cwd=str(REPO), stdout=subprocess.PIPE, text=True, timeout=600, check=False)
                lines = [ln for ln in cp.stdout.splitlines() if ln.startswith("{")]
                if cp.returncode == 0 and lines:
                    sess[kind].append(Sessions(**json.loads(lines[-1])))
                else:  # counted as n/a in the table, said here
                    log(f"{kind}: sessions run failed (rc {cp.returncode})")
                    sess[kind].append(Sessions(kind, a.sessions, *(4 * [float("nan")])))
        kinds = list(sess)
        print(f"\n{a.sessions} persistent agent sessions (QoS {a.sub_qos} on their ack topic), one "
              f"QoS {a.ack_qos} ack a second each for {a.steady:g} s; median of {a.runs} "
              "(min-max)\n")
        print("| | " + " | ".join(kinds) + " |\n|---|" + "---|" * len(kinds))
        srows: tuple[tuple[str, Callable[[Sessions], float], str], ...] = (
                ("connect all, s", lambda x: x.connect_s, ".1f"),
                ("bus memory, MiB / 1,000 sessions", lambda x: x.rss_mib_per_k, ".0f"),
                ("bus CPU for acks, cores / 1,000 sessions", lambda x: x.bus_cpu_per_k, ".3f"),
                ("acks delivered", lambda x: 100 * x.delivered, ".0f"))
        for label, f, spec in srows:
            print(f"| {label} | " + " | ".join(med([f(x) for x in sess[k]], spec)
                                             for k in kinds) + " |")
    print(f"\n(python -m tools.bench_bus {' '.join(sys.argv[1:] if argv is None else argv)}; "
          f"{time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
