"""The core's decide-and-act loop against a real Mosquitto: submit over the console,
place with the engine, apply through retained placement topics, authorise and audit."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from cloud_core.console.client import ConsoleClient
from cloud_core.registry import parse_registry
from cloud_core.service import CoreConfig, CoreService
from edge_agent.mqtt import Message, MqttClient
from edge_agent.wire import placements_topic
from tests.integration.helpers import FakeAgent, settings, wait_for
from tools.broker import Broker

REGISTRY = """
nodes:
  - {name: edge-a, region: eu, zone: eu-1, security_level: 2, price_per_hour: 0.10}
  - {name: edge-b, region: eu, zone: eu-2, security_level: 1, price_per_hour: 0.05}
  - {name: edge-c, region: us, zone: us-1, security_level: 3, price_per_hour: 0.02}
"""


@pytest.fixture
def core(broker: Broker, tmp_path: Path) -> Iterator[CoreService]:
    creds = broker.add_account("core-0", "core")
    cfg = CoreConfig(
        mqtt=settings(broker, creds, client_id="core-0"), db_path=tmp_path / "core.db",
        registry=parse_registry(REGISTRY),
        roles={"alice": "operator", "victor": "viewer", "root": "admin"},
        step_interval_s=0.2,
    )
    c = CoreService(cfg)
    c.start()
    assert c.mqtt.wait_connected(10)
    yield c
    c.stop()


@pytest.fixture
def agents(broker: Broker) -> Iterator[dict[str, FakeAgent]]:
    addrs = {"edge-a": "10.9.0.1", "edge-b": "10.9.0.2", "edge-c": "10.9.0.3"}
    out = {}
    for n, a in addrs.items():
        peers = {p: (5.0 if n[-1] in "ab" and p[-1] in "12" else 80.0)
                 for m, p in addrs.items() if m != n}
        out[n] = FakeAgent(broker, broker.add_account(n, "agent"), a, peers)
    for ag in out.values():
        ag.announce()
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(0.5):
            for ag in out.values():
                ag.report()

    for ag in out.values():
        ag.report()
    t = threading.Thread(target=beat, daemon=True)
    t.start()
    yield out
    stop.set()
    t.join(5)
    for ag in out.values():
        ag.close()


def console(broker: Broker, name: str) -> ConsoleClient:
    return ConsoleClient(settings(broker, broker.add_account(name, "operator")), name)


def test_submit_place_apply_and_explain(broker: Broker, core: CoreService,
                                        agents: dict[str, FakeAgent]) -> None:
    got: dict[str, list[str]] = {}

    def on_msg(m: Message) -> None:
        body = json.loads(m.payload)
        got[body["node"]] = [w["uid"] for w in body["workloads"]]

    watcher = MqttClient(settings(broker, broker.add_account("core-watch", "core")),
                         on_message=on_msg)
    watcher.subscribe("cfnet/v1/nodes/+/placements")
    watcher.start()
    specs = [
        {"name": "eu-only", "requests": {"cpu": "1"}, "residency": "eu"},
        {"name": "secure", "requests": {"cpu": "500m"}, "minSecurityLevel": 3},
        {"name": "fast", "requests": {"cpu": "1"}, "maxLatencyMs": 10, "latencyTo": "edge-a"},
        {"name": "impossible", "requests": {"cpu": "64"}},
    ]
    with console(broker, "alice") as c:
        wait_for(lambda: all(r["health"] == "online" for r in c.call("nodes").data),
                 what="all nodes online")
        r = c.call("submit", {"specs": specs})
        assert r.ok, r.error
        assert [x["result"] for x in r.data] == ["submitted"] * 4
        # Idempotent: the same UIDs again change nothing.
        assert [x["result"] for x in c.call("submit", {"specs": specs}).data] == ["exists"] * 4
        rows = wait_for(lambda: (lambda d: d if all(w["state"] in ("placed", "unplaceable")
                                                   for w in d) else None)(c.call("workloads").data),
                        what="all workloads decided")
        by = {w["name"]: w for w in rows}
        assert by["eu-only"]["node"] in ("edge-a", "edge-b")
        assert by["secure"]["node"] == "edge-c"
        assert by["fast"]["node"] in ("edge-a", "edge-b")
        assert by["impossible"]["state"] == "unplaceable"
        assert "cpu" in by["impossible"]["reason"].lower()
        ex = c.call("explain", {"workload": "eu-only"})
        assert ex.ok and ex.data["node"] == by["eu-only"]["node"]
    # Retained placement messages carry every placed workload exactly once.
    wait_for(lambda: sorted(u for us in got.values() for u in us)
             == sorted(w["uid"] for w in rows if w["state"] == "placed"), what="placements")
    assert sorted(core.store.apply_counts().values()) == [1, 1, 1]
    watcher.stop()


def test_roles_are_enforced_and_audited(broker: Broker, core: CoreService,
                                        agents: dict[str, FakeAgent]) -> None:
    with console(broker, "victor") as v:
        r = v.call("drain", {"node": "edge-a"})
        assert not r.ok and "permission denied" in r.error and "operator" in r.error
        assert v.call("nodes").ok
    with console(broker, "alice") as a:
        wait_for(lambda: any(r["node"] == "edge-a" for r in a.call("nodes").data), what="edge-a")
        r = a.call("drain", {"node": "edge-a"})
        assert r.ok, r.error
        nodes = {n["node"]: n for n in a.call("nodes").data}
        assert nodes["edge-a"]["cordoned"] is True
    with console(broker, "mallory") as m:
        r = m.call("nodes")
        assert not r.ok and "no role" in r.error
    audit = core.store.audit_log()
    assert ("victor", "drain") in {(e["operator"], e["cmd"]) for e in audit}
    refused = [e for e in audit if e["operator"] == "victor" and e["cmd"] == "drain"]
    assert refused[0]["result"].startswith("error: permission denied")


def test_what_if_changes_nothing(broker: Broker, core: CoreService,
                                 agents: dict[str, FakeAgent]) -> None:
    with console(broker, "alice") as c:
        wait_for(lambda: all(r["health"] == "online" for r in c.call("nodes").data),
                 what="all nodes online")
        before = (core.store.workloads(), core.store.journal())
        r = c.call("what-if", {"specs": [{"name": "w", "requests": {"cpu": "1"},
                                          "residency": "us"}]})
        assert r.ok, r.error
        assert r.data["decisions"][0]["node"] == "edge-c"
        assert (core.store.workloads(), core.store.journal()) == before


def test_placements_topic_is_per_node(broker: Broker) -> None:
    assert placements_topic("edge-a") == "cfnet/v1/nodes/edge-a/placements"
