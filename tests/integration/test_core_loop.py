"""The core's decide-and-act loop against a real Mosquitto: submit over the console,
place with the engine, apply through retained placement topics, authorise and audit."""

from __future__ import annotations

import json

from cloud_core.console.client import ConsoleClient
from cloud_core.service import CoreService
from edge_agent.wire import placements_topic
from edge_agent.wire.bus import Message
from edge_agent.wire.mqtt import MqttClient
from tests.integration.helpers import FakeAgent, settings, wait_for
from tools.broker import Broker


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
        e = ex.data["explanation"]
        other = ({"edge-a", "edge-b"} - {by["eu-only"]["node"]}).pop()
        assert e["fit"] == 2 and e["counts"] == {"residency": 1}
        assert e["runner_up"] == other and set(e["runner_up_breakdown"]) == set(e["breakdown"])
        assert e["examples"] == [["edge-c", "residency"]]
        ex = c.call("explain", {"workload": "impossible"})
        e = ex.data["explanation"]
        assert ex.ok and e["fit"] == 0 and e["runner_up"] is None and e["best"] == []
        assert sum(e["counts"].values()) == 3
        assert {n for n, _why in e["examples"]} == {"edge-a", "edge-b", "edge-c"}
        assert all(why in e["counts"] for _n, why in e["examples"])
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
