"""The core SIGKILLed in the middle of a batch of placements, then restarted.

A real ``cfnet-core`` process (TLS Mosquitto, persistent session, SQLite
journal) places 40 workloads pinned across 8 nodes, applying one node every
``--apply-interval`` so the batch takes a while. It is killed with SIGKILL
once some nodes are applied and others are not, and started again on the
same database. Afterwards every workload is placed, on the node it was
planned for; the journal has exactly one ``plan`` and one ``apply`` per
workload and no re-placement; and the retained per-node placement sets hold
every workload exactly once.

The second test kills the same ``cfnet-core`` mid-stream under 200 simulated
agents with end-to-end acks: nothing taken is lost, nothing is in the restarted
core's state twice.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cloud_core.console.client import ConsoleClient, ConsoleUnavailable
from edge_agent.wire.bus import Message
from edge_agent.wire.mqtt import MqttClient
from tests.integration.helpers import FakeAgent, settings, wait_for
from tools.broker import Broker
from tools.procs import stop_all

pytestmark = pytest.mark.slow

VENV_BIN = Path(sys.executable).parent
NODES = [f"edge-{c}" for c in "abcdefgh"]
N_WORKLOADS = 40


def db_rows(db: Path, q: str) -> list[tuple[Any, ...]]:
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    except sqlite3.OperationalError:  # not created yet
        return []
    try:
        return con.execute(q).fetchall()
    except sqlite3.OperationalError:  # not created yet
        return []
    finally:
        con.close()


@pytest.fixture
def rig(broker_factory: Callable[..., Broker], tmp_path: Path) -> Iterator[tuple[Broker, Path]]:
    b = broker_factory()
    (tmp_path / "registry.yaml").write_text("nodes:\n" + "".join(
        f"  - {{name: {n}, region: eu, zone: eu-{i % 2}, security_level: 2}}\n"
        for i, n in enumerate(NODES)))
    (tmp_path / "roles.yaml").write_text("operators: {alice: operator}\n")
    yield b, tmp_path


def start_core(b: Broker, tmp: Path, log_name: str) -> subprocess.Popen[bytes]:
    creds = b.add_account("core-0", "core")
    pw = tmp / "core.pw"
    pw.write_text(creds.password)
    out = open(tmp / log_name, "wb")  # noqa: SIM115 - the process owns it
    try:
        return subprocess.Popen(
            [str(VENV_BIN / "cfnet-core"), "--broker-host", b.host, "--broker-port", str(b.port),
             "--username", "core-0", "--password-file", str(pw), "--ca-file", str(b.ca_file),
             "--registry", str(tmp / "registry.yaml"), "--roles", str(tmp / "roles.yaml"),
             "--db", str(tmp / "core.db"), "--apply-interval", "1.0", "--table-every", "0"],
            stdout=out, stderr=subprocess.STDOUT)
    finally:
        out.close()


def test_sigkill_mid_batch_loses_nothing_applies_nothing_twice(
        rig: tuple[Broker, Path]) -> None:
    b, tmp = rig
    db = tmp / "core.db"
    agents = [FakeAgent(b, b.add_account(n, "agent"), f"10.9.0.{i + 1}")
              for i, n in enumerate(NODES)]
    for ag in agents:
        ag.announce()
        ag.report()
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(0.5):
            for ag in agents:
                ag.report()

    beater = threading.Thread(target=beat, daemon=True)
    beater.start()
    retained: dict[str, list[str]] = {}

    def on_msg(m: Message) -> None:
        body = json.loads(m.payload)
        retained[body["node"]] = [w["uid"] for w in body["workloads"]]

    watcher = MqttClient(settings(b, b.add_account("core-watch", "core")), on_message=on_msg)
    watcher.subscribe("cfnet/v1/nodes/+/placements")
    watcher.start()
    core = start_core(b, tmp, "core1.log")
    procs = [core]
    try:
        specs = [{"name": f"w{i:02d}", "requests": {"cpu": "100m"},
                  "nodeSelector": {"kubernetes.io/hostname": NODES[i % len(NODES)]}}
                 for i in range(N_WORKLOADS)]
        with ConsoleClient(settings(b, b.add_account("alice", "operator")), "alice") as c:
            def online() -> bool:
                try:
                    rows = c.call("nodes").data
                except ConsoleUnavailable:  # the core is still starting
                    return False
                return len(rows) == len(NODES) and all(r["health"] == "online" for r in rows)

            wait_for(online, 60, "core up, nodes online")
            r = c.call("submit", {"specs": specs})
            assert r.ok, r.error
        uids = sorted(x["uid"] for x in r.data)
        assert len(uids) == N_WORKLOADS

        def applied_nodes() -> int:
            return int(db_rows(db, "SELECT COUNT(DISTINCT node) FROM journal"
                                   " WHERE action='apply'")[0][0] if db.exists() else 0)

        wait_for(lambda: applied_nodes() >= 2, 60, "a batch under way")
        core.send_signal(signal.SIGKILL)
        core.wait(10)
        states = dict(db_rows(db, "SELECT state, COUNT(*) FROM workloads GROUP BY state"))
        print(f"\nat SIGKILL: workloads by state {states}, nodes applied {applied_nodes()}"
              f"/{len(NODES)}")
        assert states.get("planned", 0) > 0, f"killed too late to prove anything: {states}"

        core = start_core(b, tmp, "core2.log")
        procs.append(core)
        wait_for(lambda: dict(db_rows(db, "SELECT state, COUNT(*) FROM workloads GROUP BY state"))
                 == {"placed": N_WORKLOADS}, 90, "every workload placed after restart")
        placed = dict(db_rows(db, "SELECT uid, node FROM workloads"))
        for i, u in enumerate(sorted(placed)):
            assert placed[u] == NODES[int(u.rsplit("w", 1)[1]) % len(NODES)], (i, u)
        counts: dict[str, dict[str, int]] = {}
        for uid, action, n in db_rows(db, "SELECT uid, action, COUNT(*) FROM journal"
                                          " GROUP BY uid, action"):
            counts.setdefault(str(uid), {})[str(action)] = int(str(n))
        for u in uids:
            assert counts[u] == {"submit": 1, "plan": 1, "apply": 1}, (u, counts[u])
        # The nodes' retained sets: each workload exactly once, where the store says.
        wait_for(lambda: sorted(x for us in retained.values() for x in us) == uids, 30,
                 "retained placement sets")
        for node, us in retained.items():
            assert all(placed[u] == node for u in us)
        print(f"after restart: {len(placed)} placed, apply counts "
              f"{sorted({c['apply'] for c in counts.values() if 'apply' in c})}")
    finally:
        stop.set()
        beater.join(5)
        stop_all(procs, grace_s=15)
        watcher.stop()
        for ag in agents:
            ag.close()
    for name in ("core1.log", "core2.log"):
        text = (tmp / name).read_text(errors="replace")
        assert "Traceback" not in text, text[-3000:]


# ------------------------------------------------------------ telemetry across a SIGKILL

FLEET = 200
FLEET_RUN_S = 40.0
KILL_AT_S = 12.0
DOWN_S = 3.0


def test_sigkill_mid_stream_every_report_of_200_agents_arrives_once(
        broker_factory: Callable[..., Broker], tmp_path: Path) -> None:
    """200 simulated agents report at 1 Hz with end-to-end acks (tools.simulate, ack
    mode: each keeps a report until the core acknowledges it, as the agent does);
    ``cfnet-core`` as shipped (MQTT in its child process) is SIGKILLed mid-stream and
    restarted. Every report taken is acknowledged in the end (none lost), and every
    report the first core had not acknowledged before it died is in the second
    core's state exactly once (counted by (node, boot, seq) through the console's
    ``received``)."""
    from tools.simulate import SimConfig, Simulator, World

    b = broker_factory()
    (tmp_path / "roles.yaml").write_text("operators: {alice: viewer}\n")
    sims = [settings(b, b.add_account(n, "sim"), client_id=n, session_expiry_s=0,
                     clean_start=True, keepalive_s=10, max_inflight=100)
            for n in ("sim-ck0", "sim-ck1")]
    listener = settings(b, b.add_account("sim-ck-acks", "sim"), client_id="sim-ck-acks")
    world = World(SimConfig(nodes=FLEET, rate=1.0, duration_s=FLEET_RUN_S, seed=5,
                            node_prefix="ck"))

    def core_proc(log_name: str) -> subprocess.Popen[bytes]:
        creds = b.add_account("core-0", "core")
        (tmp_path / "core.pw").write_text(creds.password)
        out = open(tmp_path / log_name, "wb")  # noqa: SIM115 - the process owns it
        try:
            return subprocess.Popen(
                [str(VENV_BIN / "cfnet-core"), "--broker-host", b.host, "--broker-port",
                 str(b.port), "--username", "core-0", "--password-file",
                 str(tmp_path / "core.pw"), "--ca-file", str(b.ca_file), "--roles",
                 str(tmp_path / "roles.yaml"), "--db", str(tmp_path / "core.db"),
                 "--table-every", "0"], stdout=out, stderr=subprocess.STDOUT)
        finally:
            out.close()

    def stats(c: ConsoleClient) -> dict[str, Any] | None:
        try:
            r = c.call("stats")
        except ConsoleUnavailable:
            return None
        return r.data if r.ok else None

    procs = [core_proc("fleet1.log")]
    sim = Simulator(world, sims, acks=listener, drain_s=120.0, log_acks=True)
    result: dict[str, Any] = {}
    runner = threading.Thread(target=lambda: result.update(sim.run()), daemon=True)
    with ConsoleClient(settings(b, b.add_account("alice", "operator")), "alice") as c:
        try:
            wait_for(lambda: stats(c), 60, "first core answering")
            runner.start()
            wait_for(lambda: sim.t0 and time.time() - sim.t0 >= KILL_AT_S, 60, "mid-stream")
            procs[0].send_signal(signal.SIGKILL)
            procs[0].wait(10)
            t_kill = time.time()
            time.sleep(DOWN_S)
            t_restart = time.time()
            procs.append(core_proc("fleet2.log"))
            runner.join(FLEET_RUN_S + 180)
            assert not runner.is_alive(), "simulator did not finish"
            assert result["errors"] == 0 and result["pending_dropped"] == 0, result
            # Nothing lost: every report of every agent was acknowledged in the end.
            assert result["unacked"] == 0, result
            taken = sim.taken()
            everything = {(n, s) for n, (_b, last) in taken.items() for s in range(1, last + 1)}
            assert sum(last for _b, last in taken.values()) == result["offered"]
            assert sim.ack_log is not None
            before = {(n, s) for n, _b, s, tw in sim.ack_log if tw < t_restart}
            assert before and len(before) < len(everything), "killed too early or too late"
            # The second core's state, node by node: each (boot, seq) once.
            second: set[tuple[str, int]] = set()
            for n, (boot, _last) in taken.items():
                r = c.call("received", {"node": n}, timeout_s=10)
                assert r.ok, r.error
                (entry,) = [e for e in r.data["boots"] if e["boot"] == boot]
                assert entry["count"] == entry["distinct"], (n, entry)
                second |= {(n, s) for lo, hi in entry["seqs"] for s in range(lo, hi + 1)}
            assert before | second == everything
            both = before & second
            c2 = stats(c) or {}
            print(f"\n{FLEET} agents, {len(everything)} reports: {len(before)} acknowledged by "
                  f"the first core before it was SIGKILLed at {t_kill - sim.t0:.1f} s, "
                  f"{len(second)} in the restarted core's state, each once; {len(both)} in "
                  f"both (sent again before the first core's ack arrived); resent "
                  f"{result['resent']}; second core duplicates dropped {c2.get('duplicates')}")
        finally:
            sim.stop()
            runner.join(10) if runner.is_alive() else None
            stop_all(procs, grace_s=15)
    for name in ("fleet1.log", "fleet2.log"):
        text = (tmp_path / name).read_text(errors="replace")
        assert "Traceback" not in text, text[-3000:]
