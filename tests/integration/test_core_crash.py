"""The core SIGKILLed in the middle of a batch of placements, then restarted.

A real ``cfnet-core`` process (TLS Mosquitto, persistent session, SQLite
journal) places 40 workloads pinned across 8 nodes, applying one node every
``--apply-interval`` so the batch takes a while. It is killed with SIGKILL
once some nodes are applied and others are not, and started again on the
same database. Afterwards every workload is placed, on the node it was
planned for; the journal has exactly one ``plan`` and one ``apply`` per
workload and no re-placement; and the retained per-node placement sets hold
every workload exactly once.
"""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cloud_core.console.client import ConsoleClient, ConsoleUnavailable
from edge_agent.mqtt import Message, MqttClient
from tests.integration.helpers import FakeAgent, settings, wait_for
from tools.broker import Broker

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
        for p in procs:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    p.kill()
        watcher.stop()
        for ag in agents:
            ag.close()
    for name in ("core1.log", "core2.log"):
        text = (tmp / name).read_text(errors="replace")
        assert "Traceback" not in text, text[-3000:]
