"""Ingest benchmark: reports/s from the broker into the core's state, beside a raw paho loop.

One TLS Mosquitto (the harness broker, production settings), one run, three parts:

1. **Drain capacity.** The fleet simulator queues ``--drain`` telemetry reports
   (plus 10,000 retained statuses) on the broker for four offline persistent
   sessions at once; then each receiver connects alone and drains its queue:
   a **raw paho-mqtt** loop that only counts (the baseline), the project's
   MQTT adapter (``edge_agent.wire.mqtt.MqttClient``) that only counts, and the
   **core** (``CoreService``: parse, validate, dedupe, fold into state), once
   with its MQTT connection in its own process and once in a child process
   (``cloud_core.mqtt_process``, what ``cfnet-core`` runs).
   Rate = reports / (last - first arrival). Nothing else is publishing while
   a receiver drains, so this is each receive path's own ceiling here.
2. **Live fleet.** ``--nodes`` simulated nodes at ``--rate`` reports/s each for
   ``--live`` seconds into one core (as ``cfnet-core`` runs it: MQTT in a child
   process; once ingest-only, once with the scheduler on; /metrics on): accepted
   reports/s, staleness (age of each node's latest report at the core, as the
   core's ``cfnet_node_staleness_seconds`` defines it) p50/p99/max sampled
   every second, and data age (now - the report's own timestamp). The core's
   /metrics endpoint is scraped during the run; its figures are printed beside
   the benchmark's own.
3. **Two replicas, one ``$share`` group.** The same fleet into a leader
   (places) and a follower (ingest only): how many reports each ingests, whether
   together they got all, and what the leader alone sees of the fleet.

paho is imported directly here (not through ``edge_agent.wire.mqtt``), as in
``tests/integration/test_broker_security.py``: the baseline *is* plain paho.
The simulator runs as a separate process (``python -m tools.simulate``). On a
shared 2-core machine the broker, the simulator and the receiver compete for
CPU: the figures are what they are there, and the table says so.

    python -m tools.bench_ingest [--nodes 10000 --rate 1 --live 40 --drain 60000 --quick]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from cloud_core.mqtt_process import MqttProcess
from cloud_core.service import CoreConfig, CoreService
from edge_agent.wire import STATUS_WILDCARD, TELEMETRY_WILDCARD
from edge_agent.wire.bus import Message
from edge_agent.wire.mqtt import MqttClient, MqttSettings
from tools.broker import Broker, Credentials, free_port

REPO = Path(__file__).resolve().parent.parent
SIM_ACCOUNTS = ("sim-b0", "sim-b1", "sim-b2", "sim-b3")


def quantile(xs: Sequence[float], q: float) -> float:
    """The same nearest-rank quantile as ``cloud_core.metrics``."""
    if not xs:
        return math.nan
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def mqtt_settings(broker: Broker, creds: Credentials, **kw: Any) -> MqttSettings:
    return MqttSettings(host=broker.host, port=broker.port, username=creds.username,
                        password=creds.password, tls=broker.tls, ca_file=creds.ca_file,
                        client_id=creds.username, **kw)


# ====================================================================== simulator


def run_sim(broker: Broker, *, nodes: int, rate: float, duration: float, seed: int,
            prefix: str, max_pending: int | None = None) -> dict[str, Any]:
    """Run ``python -m tools.simulate`` to completion; its JSON summary."""
    for a in SIM_ACCOUNTS:
        broker.add_account(a, "sim")
    argv = [sys.executable, "-m", "tools.simulate", "--nodes", str(nodes), "--rate", str(rate),
            "--duration", str(duration), "--seed", str(seed), "--node-prefix", prefix,
            "--broker-host", broker.host, "--broker-port", str(broker.port),
            "--ca-file", str(broker.ca_file), "--pki", str(broker.store.root),
            "--accounts", ",".join(SIM_ACCOUNTS), "--quiet"]
    if max_pending is not None:
        argv += ["--max-pending", str(max_pending)]
    cp = subprocess.run(argv, cwd=str(REPO), capture_output=True, text=True,
                        timeout=duration + 120, check=False)
    lines = [ln for ln in cp.stdout.splitlines() if ln.startswith("{")]
    if cp.returncode != 0 or not lines:
        raise RuntimeError(f"simulator failed rc={cp.returncode}: {cp.stdout[-800:]} "
                           f"{cp.stderr[-800:]}")
    out: dict[str, Any] = json.loads(lines[-1])
    return out


class SimProcess:
    """The simulator in the background, for the live parts."""

    def __init__(self, broker: Broker, **kw: Any) -> None:
        self.result: dict[str, Any] | None = None
        self.error: BaseException | None = None
        self._t = threading.Thread(target=self._go, args=(broker,), kwargs=kw, daemon=True)
        self._t.start()

    def _go(self, broker: Broker, **kw: Any) -> None:
        try:
            self.result = run_sim(broker, **kw)
        except BaseException as exc:  # reported by join()
            self.error = exc

    def join(self, timeout: float) -> dict[str, Any]:
        self._t.join(timeout)
        if self.error is not None:
            raise RuntimeError(f"simulator: {self.error}") from self.error
        if self.result is None:
            raise RuntimeError("simulator did not finish")
        return self.result


# ====================================================================== receivers


class RawLoop:
    """The baseline: plain paho (MQTT 5, TLS), count telemetry messages, nothing else."""

    def __init__(self, broker: Broker, creds: Credentials) -> None:
        self.count = 0
        c = paho.Client(CallbackAPIVersion.VERSION2, client_id=creds.username,
                        protocol=paho.MQTTv5)
        c.username_pw_set(creds.username, creds.password)
        c.tls_set(ca_certs=str(creds.ca_file))
        c.on_message = self._on_message
        c.on_connect = self._on_connect
        self._c = c
        self._broker = broker
        self._subscribed = threading.Event()
        c.on_subscribe = lambda *a: self._subscribed.set()

    def _on_connect(self, client: paho.Client, *a: Any) -> None:
        client.subscribe([(TELEMETRY_WILDCARD, 1), (STATUS_WILDCARD, 1)])

    def _on_message(self, client: paho.Client, userdata: Any, msg: paho.MQTTMessage) -> None:
        if msg.topic.endswith("/telemetry"):
            self.count += 1

    def start(self) -> None:
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties
        props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        props.SessionExpiryInterval = 3600
        self._c.connect(self._broker.host, self._broker.port, keepalive=30,
                        clean_start=False, properties=props)
        self._c.loop_start()

    def wait_subscribed(self, timeout_s: float) -> bool:
        return self._subscribed.wait(timeout_s)

    def stop(self) -> None:
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties
        props = Properties(PacketTypes.DISCONNECT)  # type: ignore[no-untyped-call]
        props.SessionExpiryInterval = 3600
        self._c.disconnect(properties=props)
        self._c.loop_stop()


class AdapterLoop:
    """The project's adapter (``MqttClient``), counting telemetry messages."""

    def __init__(self, broker: Broker, creds: Credentials) -> None:
        self.count = 0
        self.mqtt = MqttClient(mqtt_settings(broker, creds, keepalive_s=30),
                               on_message=self._on_message)
        self.mqtt.subscribe(TELEMETRY_WILDCARD, qos=1)
        self.mqtt.subscribe(STATUS_WILDCARD, qos=1)

    def _on_message(self, m: Message) -> None:
        if m.topic.endswith("/telemetry"):
            self.count += 1

    def start(self) -> None:
        self.mqtt.start()

    def stop(self) -> None:
        self.mqtt.stop()


def core_config(broker: Broker, creds: Credentials, db: Path, **kw: Any) -> CoreConfig:
    return CoreConfig(mqtt=mqtt_settings(broker, creds, keepalive_s=30), db_path=db, **kw)


def timed_drain(count: Callable[[], int], target: int, timeout_s: float) -> tuple[float, int]:
    """Poll ``count`` every 5 ms: (seconds from the first to the target-th report, reached)."""
    deadline = time.monotonic() + timeout_s
    t_first: float | None = None
    n = 0
    last_change = time.monotonic()
    while time.monotonic() < deadline:
        m = count()
        now = time.monotonic()
        if m != n:
            last_change = now
        n = m
        if t_first is None and n > 0:
            t_first = now
        if n >= target:
            break
        if t_first is not None and now - last_change > 10.0:
            break  # nothing for 10 s: the broker dropped some (queue limits)
        time.sleep(0.005)
    end = time.monotonic()
    return (end - t_first if t_first is not None else math.inf), n


@dataclass
class DrainResult:
    name: str
    reports: int
    seconds: float
    cpu_s: float = math.nan  # CPU of the receiving processes over the drain (not the broker's)
    short: str = ""

    @property
    def cpu_us_per_report(self) -> float:
        return self.cpu_s / self.reports * 1e6 if self.reports else math.nan

    @property
    def rate(self) -> float:
        return self.reports / self.seconds if self.seconds > 0 else math.nan


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of one process (all its threads), from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def receiver_cpu_s(core: CoreService | None = None) -> float:
    """This process's CPU, plus the core's MQTT child process if it has one."""
    total = process_cpu_s(os.getpid())
    pid = core.mqtt.pid if core is not None and isinstance(core.mqtt, MqttProcess) else None
    if pid is not None:
        total += process_cpu_s(pid)
    return total


def drain_phase(broker: Broker, work: Path, n_reports: int, nodes: int, seed: int,
                log: Callable[[str], None], rounds: int = 2
                ) -> tuple[list[DrainResult], dict[str, Any]]:
    raw_c = broker.add_account("core-braw", "core")
    ad_c = broker.add_account("core-badapt", "core")
    core_c = broker.add_account("core-bdrain", "core")
    proc_c = broker.add_account("core-bdrainp", "core")
    # 1. create the four persistent sessions (subscribed), then leave them offline
    raw = RawLoop(broker, raw_c)
    raw.start()
    raw.wait_subscribed(15)
    raw.stop()
    ad = AdapterLoop(broker, ad_c)
    ad.start()
    ad.mqtt.wait_connected(15)
    time.sleep(0.5)
    ad.stop()
    for creds, proc in ((core_c, False), (proc_c, True)):
        core = CoreService(core_config(broker, creds, work / f"drain0{proc:d}.db", place=False,
                                       mqtt_process=proc))
        core.start()
        core.mqtt.wait_connected(15)
        time.sleep(0.5)
        core.stop()
    # Offered 2 reports/s per node; the simulator sends what it can in the time
    # (bounded), and exactly what it sent is what each session has queued. Other
    # work on a shared machine comes and goes: every round queues a fresh batch
    # and drains it with each receiver in turn. Reported: each receiver's median
    # round, the spread of its ratio to the raw loop of the same round, and its
    # best round only as an extra.
    rate = 2.0
    duration = max(0.5, n_reports / (nodes * rate))
    per: dict[str, list[DrainResult]] = {}
    ratios: dict[str, list[float]] = {}
    queued_all: list[int] = []
    rejected = 0
    sim: dict[str, Any] = {}
    for r in range(rounds):
        sim = run_sim(broker, nodes=nodes, rate=rate, duration=duration, seed=seed + r,
                      prefix=f"d{r}")
        queued = int(sim["published"])
        queued_all.append(queued)
        log(f"drain round {r + 1}: {queued} reports queued for 4 sessions "
            f"(simulator sent {queued / max(sim['elapsed_s'], 1e-9):,.0f}/s)")
        got: list[DrainResult] = []
        raw = RawLoop(broker, raw_c)
        c0 = receiver_cpu_s()
        raw.start()
        s, n = timed_drain(lambda raw=raw: raw.count, queued, 300)  # type: ignore[misc]
        c1 = receiver_cpu_s()
        raw.stop()
        got.append(DrainResult("raw paho loop (count only)", n, s, c1 - c0, "raw paho"))
        ad = AdapterLoop(broker, ad_c)
        c0 = receiver_cpu_s()
        ad.start()
        s, n = timed_drain(lambda ad=ad: ad.count, queued, 300)  # type: ignore[misc]
        c1 = receiver_cpu_s()
        ad.stop()
        got.append(DrainResult("MqttClient adapter (count only)", n, s, c1 - c0, "adapter"))
        for creds, proc, name, short in (
                (core_c, False, "core ingest, one process (parse, validate, state)",
                 "core, one process"),
                (proc_c, True, "core ingest, MQTT in a child process (cfnet-core default)",
                 "core, MQTT child")):
            core = CoreService(core_config(broker, creds, work / f"drain{r}{proc:d}.db",
                                           place=False, mqtt_process=proc))
            core.start()
            # From the connection on: the child's interpreter start-up is not ingest.
            core.mqtt.wait_connected(15)
            c0 = receiver_cpu_s(core)
            s, n = timed_drain(lambda core=core: core.ingest.counters().accepted,  # type: ignore[misc]
                               queued, 300)
            c1 = receiver_cpu_s(core)
            rejected += core.ingest.counters().rejected_total
            core.stop()
            got.append(DrainResult(name, n, s, c1 - c0, short))
        for d in got:
            log(f"  {d.name}: {d.reports} in {d.seconds:.2f} s = {d.rate:,.0f}/s, "
                f"{d.cpu_us_per_report:.0f} us CPU/report")
            per.setdefault(d.name, []).append(d)
            ratios.setdefault(d.name, []).append(d.rate / got[0].rate if got[0].rate else math.nan)
    # The median round of each receiver (the lower middle one for an even count).
    results = [sorted(ds, key=lambda d: d.rate)[(len(ds) - 1) // 2] for ds in per.values()]
    return results, {"queued": min(queued_all), "rounds": rounds, "rejected": rejected,
                     "ratios": ratios, "best": {n: max(d.rate for d in ds)
                                                for n, ds in per.items()},
                     "sim": {k: v for k, v in sim.items() if k != "events"}}


# ====================================================================== live parts


def scrape(port: int, timeout_s: float = 60.0) -> dict[str, float]:
    """The /metrics text as {'name{labels}': value}; {} when the endpoint does not answer.

    The collector snapshots the whole state and judges every node's health at
    scrape time; a core saturated by ingest answers slowly, hence the long timeout.
    """
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                    timeout=timeout_s) as r:
            text = r.read().decode()
    except OSError:
        return {}
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, val = line.rpartition(" ")
        try:
            out[key] = float(val)
        except ValueError:
            continue
    return out


@dataclass
class LiveSample:
    t: float
    accepted: int
    stale: list[float] = field(default_factory=list)
    age: list[float] = field(default_factory=list)
    nodes: int = 0


def sample_core(core: CoreService, prefix: str) -> LiveSample:
    """Every node's staleness and data age, read straight from the state's table.

    ``ClusterState.snapshot`` copies every node *and link* (tens of
    milliseconds at 10,000 nodes, holding the state lock and the GIL); a
    benchmark sampling every second through it would itself slow ingest down.
    So this reads the two timestamps under the state's lock and nothing else.
    """
    st = core.state
    with st._lock:  # a read-only peek at the private table, see above
        stamps = [(n.last_report, n.report_ts) for name, n in st._nodes.items()
                  if name.startswith(prefix) and n.last_report]
    now = time.time()
    s = LiveSample(now, core.ingest.counters().accepted, nodes=len(stamps))
    s.stale = [now - lr for lr, _ in stamps]
    s.age = [now - ts for _, ts in stamps]
    return s


def live_phase(broker: Broker, work: Path, nodes: int, rate: float, seconds: float,
               seed: int, log: Callable[[str], None], *, place: bool,
               scrape_every: float = 10.0) -> dict[str, Any]:
    """``place=False``: an ingest-only replica; ``True``: the full core (scheduler on).

    ``scrape_every`` 0: never scrape /metrics (its health pass can stall a core
    that is behind, see docs/scale.md), to see what ingest alone does.
    """
    name = "core-blead" if place else "core-bingest"
    creds = broker.add_account(name, "core")
    core = CoreService(core_config(broker, creds, work / f"{name}.db", metrics_port=0,
                                   metrics_addr="127.0.0.1", place=place, mqtt_process=True))
    core.start()
    core.mqtt.wait_connected(15)
    assert core.metrics_port is not None
    warm = min(10.0, seconds / 4)
    sim = SimProcess(broker, nodes=nodes, rate=rate, duration=seconds, seed=seed,
                     prefix="lv")
    samples: list[LiveSample] = []
    scrapes: list[tuple[LiveSample, LiveSample, dict[str, float]]] = []
    t0 = time.time()
    next_scrape = t0 + warm + 2.0 if scrape_every > 0 else math.inf
    while time.time() < t0 + seconds + 1.0:
        time.sleep(1.0)
        s = sample_core(core, "lv")
        if s.t - t0 >= warm:
            samples.append(s)
        if s.t >= next_scrape and s.t < t0 + seconds:
            # the endpoint between two of the benchmark's own readings
            before = sample_core(core, "lv")
            m = scrape(core.metrics_port)
            scrapes.append((before, sample_core(core, "lv"), m))
            next_scrape = s.t + scrape_every
    result = sim.join(seconds + 120)
    time.sleep(2.0)
    final = core.ingest.counters()
    final_m = scrape(core.metrics_port) if scrape_every > 0 else {}
    core.stop()
    steady = [s for s in samples if s.t <= t0 + seconds]
    span = steady[-1].t - steady[0].t if len(steady) > 1 else math.nan
    acc_rate = (steady[-1].accepted - steady[0].accepted) / span if len(steady) > 1 else math.nan
    stale = [x for s in steady for x in s.stale]
    ages = [x for s in steady for x in s.age]
    log(f"live ({'scheduler on' if place else 'ingest only'}): accepted {acc_rate:,.0f}/s, "
        f"staleness p99 {quantile(stale, 0.99):.2f} s, steps {core.steps}")
    return {
        "place": place, "steps": core.steps,
        "nodes": nodes, "rate": rate, "offered_per_s": nodes * rate,
        "published_per_s": result["published"] / max(result["elapsed_s"], 1e-9),
        "sim": {k: v for k, v in result.items() if k != "events"},
        "accepted_per_s": acc_rate,
        "stale_p50": quantile(stale, 0.5), "stale_p99": quantile(stale, 0.99),
        "stale_max": max(stale) if stale else math.nan,
        "age_p50": quantile(ages, 0.5), "age_p99": quantile(ages, 0.99),
        "nodes_seen_min": min((s.nodes for s in steady), default=0),
        "accepted": final.accepted, "rejected": final.rejected_total,
        "metrics_accepted": final_m.get('cfnet_reports_total{result="accepted"}', math.nan),
        "metrics_rejected": sum(v for k, v in final_m.items()
                                if k.startswith("cfnet_messages_rejected_total")),
        "scrapes": [
            {"bench_p99": (quantile(b.stale, 0.99), quantile(e.stale, 0.99)),
             "metrics_p99": m.get('cfnet_node_staleness_seconds{quantile="0.99"}', math.nan),
             "bench_accepted": (b.accepted, e.accepted),
             "metrics_accepted": m.get('cfnet_reports_total{result="accepted"}', math.nan)}
            for b, e, m in scrapes
        ],
    }


def start_core_proc(broker: Broker, name: str, work: Path, group: str,
                    port: int) -> subprocess.Popen[bytes]:
    """A ``cfnet-core`` process (ingest only) in the ``$share`` group, /metrics on ``port``."""
    broker.add_account(name, "core")
    argv = [str(Path(sys.executable).parent / "cfnet-core"), "--broker-host", broker.host,
            "--broker-port", str(broker.port), "--username", name,
            "--password-file", str(broker.store.root / "clients" / name / "password"),
            "--ca-file", str(broker.ca_file), "--db", str(work / f"{name}.db"),
            "--share-group", group, "--no-place", "--metrics-port", str(port)]
    log_file = open(work / f"{name}.log", "wb")  # noqa: SIM115 - the process owns it
    try:
        return subprocess.Popen(argv, cwd=str(REPO), stdout=log_file,
                                stderr=subprocess.STDOUT)
    finally:
        log_file.close()


def _accepted(m: dict[str, float]) -> float:
    return m.get('cfnet_reports_total{result="accepted"}', math.nan)


def _nodes(m: dict[str, float]) -> float:
    vals = [v for k, v in m.items() if k.startswith("cfnet_nodes{")]
    return sum(vals) if vals else math.nan


def share_phase(broker: Broker, work: Path, nodes: int, rate: float, seconds: float,
                seed: int, log: Callable[[str], None]) -> dict[str, Any]:
    """Two ``cfnet-core`` processes in one ``$share`` group; everything read from /metrics.

    Separate processes (one GIL each), as replicas run. Both ingest only: at
    10,000 nodes the scheduler's health pass is quadratic in silent nodes
    (docs/scale.md), and that would be measured here instead of the sharing.
    """
    ports = [free_port(), free_port()]
    procs = [start_core_proc(broker, n, work, "bench", p)
             for n, p in zip(("core-bshare1", "core-bshare2"), ports, strict=True)]
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(scrape(p, 5) for p in ports):
            time.sleep(0.5)
        time.sleep(2.0)  # subscribed
        sim = SimProcess(broker, nodes=nodes, rate=rate, duration=seconds, seed=seed,
                         prefix="sh")
        t0 = time.time()
        lead: list[dict[str, float]] = []
        while time.time() < t0 + seconds:
            time.sleep(5.0)
            m = scrape(ports[0], 30)
            if m and time.time() - t0 >= min(10.0, seconds / 4):
                lead.append(m)
        result = sim.join(seconds + 120)
        published = int(result["published"])
        t_end = time.monotonic() + 30
        ms = [scrape(p, 30) for p in ports]
        while sum(_accepted(m) for m in ms) < published and time.monotonic() < t_end:
            time.sleep(1.0)
            ms = [scrape(p, 30) for p in ports]
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)
    a, b = _accepted(ms[0]), _accepted(ms[1])
    log(f"share: leader {a:.0f}, follower {b:.0f}, published {published}")
    p99 = [m.get('cfnet_node_staleness_seconds{quantile="0.99"}', math.nan) for m in lead]
    suspect = [m.get('cfnet_nodes{health="suspect"}', math.nan) for m in lead]
    return {
        "published": published, "published_per_s": published / max(result["elapsed_s"], 1e-9),
        "leader": a, "follower": b,
        "leader_share": a / (a + b) if a + b > 0 else math.nan,
        "leader_nodes": _nodes(ms[0]), "follower_nodes": _nodes(ms[1]), "nodes": nodes,
        "leader_stale_p99_samples": p99,
        "leader_stale_p99": max(p99) if p99 else math.nan,
        "leader_suspect_mean": sum(suspect) / len(suspect) if suspect else math.nan,
    }


# ====================================================================== table


def fmt(x: float, spec: str = ",.0f") -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def table(drain: list[DrainResult], dinfo: dict[str, Any], lives: list[dict[str, Any]],
          share: dict[str, Any] | None) -> str:
    raw = drain[0].rate
    lines = [
        "| ingest (TLS Mosquitto 2.0.11) | cfnet | baseline (same run) | ratio |",
        "|---|---:|---:|---:|",
    ]
    for d in drain[1:]:
        rs = sorted(dinfo.get("ratios", {}).get(d.name, [d.rate / raw]))
        med = statistics.median(rs)
        best = dinfo.get("best", {}).get(d.name, d.rate)
        lines.append(f"| drain {dinfo['queued']:,} queued reports (median of {dinfo['rounds']}"
                     f" rounds): {d.name}, reports/s | {fmt(d.rate)} | raw paho {fmt(raw)} | "
                     f"{med:.0%} (rounds {rs[0]:.0%}-{rs[-1]:.0%}; best round {fmt(best)}/s) |")
    names = " / ".join(d.short or d.name for d in drain[1:])
    if drain[1:]:
        lines.append(f"| drain: receiver CPU per report, µs ({names}) | "
                     f"{' / '.join(f'{d.cpu_us_per_report:.0f}' for d in drain[1:])} | "
                     f"raw paho {drain[0].cpu_us_per_report:.0f} | |")
    for live in lives:
        what = "full core, scheduler on" if live["place"] else "ingest-only replica"
        lines += [
            f"| live {live['nodes']:,} nodes @ {live['rate']:g}/s ({what}): accepted reports/s | "
            f"{fmt(live['accepted_per_s'])} | offered {fmt(live['offered_per_s'])} "
            f"(sim sent {fmt(live['published_per_s'])}/s) | "
            f"{live['accepted_per_s'] / live['offered_per_s']:.0%} |",
            f"| live: staleness p50 / p99 / max, s | {live['stale_p50']:.2f} / "
            f"{live['stale_p99']:.2f} / {live['stale_max']:.2f} | target p99 < 2 | |",
            f"| live: data age (now - report ts) p50 / p99, s | {live['age_p50']:.2f} / "
            f"{live['age_p99']:.2f} | | |",
            f"| live: reports accepted / rejected (core) | {live['accepted']:,} / "
            f"{live['rejected']} | /metrics: {fmt(live['metrics_accepted'])} / "
            f"{fmt(live['metrics_rejected'])} | |",
        ]
        for i, sc in enumerate(live["scrapes"]):
            (p0, p1), (a0, a1) = sc["bench_p99"], sc["bench_accepted"]
            lines.append(f"| live: scrape {i + 1}: staleness p99 s, accepted (bench just "
                         f"before / after) | {p0:.2f} / {p1:.2f}, {a0:,} / {a1:,} | "
                         f"/metrics: {sc['metrics_p99']:.2f}, {fmt(sc['metrics_accepted'])} | |")
    if share is not None:
        lines += [
            f"| 2 replicas (processes), $share, {share['nodes']:,} nodes: reports ingested "
            f"leader / follower (/metrics) | {fmt(share['leader'])} / {fmt(share['follower'])} "
            f"| published {share['published']:,} ({fmt(share['published_per_s'])}/s) | "
            f"{share['leader_share']:.0%} / {1 - share['leader_share']:.0%} |",
            f"| 2 replicas: nodes in leader / follower state (/metrics) | "
            f"{fmt(share['leader_nodes'])} / {fmt(share['follower_nodes'])} | fleet "
            f"{share['nodes']:,} | |",
            f"| 2 replicas: leader staleness p99 (worst scrape), s; suspect nodes (mean) | "
            f"{share['leader_stale_p99']:.2f}; {fmt(share['leader_suspect_mean'])} | | |",
        ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.bench_ingest",
                                 description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--rate", type=float, default=1.0)
    ap.add_argument("--core-nodes", type=int, default=2000,
                    help="fleet size for the live part with the scheduler on")
    ap.add_argument("--share-nodes", type=int, default=2000,
                    help="fleet size for the two-replica part (at 10,000 on 2 CPUs two "
                         "replicas fall behind where one core keeps up: docs/scale.md)")
    ap.add_argument("--live", type=float, default=40.0, help="seconds of the live parts")
    ap.add_argument("--drain", type=int, default=60_000, help="reports queued for the drain")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--scrape-every", type=float, default=10.0,
                    help="seconds between /metrics scrapes in the live parts (0: none)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="drain rounds (the median is reported, with the spread)")
    ap.add_argument("--skip", default="",
                    help="comma list of parts to skip: drain,live,live-core,share")
    ap.add_argument("--quick", action="store_true",
                    help="2,000 nodes, 15 s parts, 20,000 drained reports")
    ap.add_argument("--json", action="store_true", help="also print the raw results")
    a = ap.parse_args(argv)
    if a.quick:
        a.nodes, a.core_nodes, a.share_nodes, a.live, a.drain = 2000, 2000, 2000, 15.0, 20_000
    skip = set(a.skip.split(",")) - {""}

    def log(msg: str) -> None:
        print(f"# {msg}", file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="cfnet-bench-ingest-") as tmp:
        work = Path(tmp)
        # One broker per part (same settings), so retained statuses of one part's
        # fleet do not land on the next part's core as thousands of dead nodes.
        drain: list[DrainResult] = []
        dinfo: dict[str, Any] = {"queued": 0, "rounds": 0}
        lives: list[dict[str, Any]] = []
        share = None
        if "drain" not in skip:
            with Broker(work / "b-drain", persistence=False,
                        extra_conf="max_queued_messages 1000000") as broker:
                drain, dinfo = drain_phase(broker, work, a.drain, min(a.nodes, 10_000),
                                           a.seed, log, rounds=a.rounds)
        for place, n in ((False, a.nodes), (True, a.core_nodes)):
            part = "live-core" if place else "live"
            if part in skip:
                continue
            with Broker(work / f"b-{part}", persistence=False) as broker:
                lives.append(live_phase(broker, work, n, a.rate, a.live, a.seed, log,
                                        place=place, scrape_every=a.scrape_every))
        if "share" not in skip:
            with Broker(work / "b-share", persistence=False) as broker:
                share = share_phase(broker, work, a.share_nodes, a.rate, a.live, a.seed, log)
    print(f"\ningest benchmark: {os.cpu_count()} CPUs shared by broker, simulator and core "
          f"(and other work on this machine); load avg {os.getloadavg()[0]:.1f}\n")
    if drain:
        print(table(drain, dinfo, lives, share))
    else:
        print(table([DrainResult("none", 0, 0.0)], dinfo, lives, share))
    if a.json:
        print(json.dumps({"drain": [d.__dict__ for d in drain], "drain_info": dinfo,
                          "live": lives, "share": share}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
