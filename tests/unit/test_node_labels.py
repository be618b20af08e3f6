"""The Kubernetes registry's reading of a Node's cfnet labels: a typo is named, not ignored."""

from __future__ import annotations

import logging

import pytest

from cloud_core.errors import CoreError
from cloud_core.k8s.registry import (
    AGENT_ID,
    RESIDENCY_REGION,
    SECURITY,
    NodeRegistry,
    RegistryConfig,
    node_protected,
)


def _node(name: str, labels: dict[str, str]) -> dict[str, object]:
    return {"metadata": {"name": name, "labels": labels},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}}


def test_a_cfnet_label_typo_is_named(caplog: pytest.LogCaptureFixture) -> None:
    reg = NodeRegistry()
    with caplog.at_level(logging.WARNING, logger="cloud_core.k8s.registry"):
        reg.upsert(_node("n1", {"cfnet.io/security_level": "3"}))
        reg.upsert(_node("n1", {"cfnet.io/security_level": "3", "x": "y"}))  # said once
        assert reg.say_problems() == 1
        assert reg.say_problems() == 0
    assert [r.getMessage() for r in caplog.records] == [
        "node n1: unknown label 'cfnet.io/security_level' (cfnet reads "
        f"{SECURITY!r}, {RESIDENCY_REGION!r}, {AGENT_ID!r})"]
    rec = reg.get("n1")
    assert rec is not None and rec.security_level == 0  # never guessed upwards
    reg.upsert(_node("n1", {SECURITY: "high"}))
    assert reg.label_problems["n1"] == (f"label {SECURITY!r}: 'high' is not a number "
                                        "(counted as 0)",)
    reg.upsert(_node("n1", {SECURITY: "3", AGENT_ID: "e1", RESIDENCY_REGION: "eu"}))
    assert "n1" not in reg.label_problems
    rec = reg.get("n1")
    assert rec is not None and (rec.security_level, rec.agent_id, rec.region) == (3, "e1", "eu")


def test_a_label_problem_on_many_nodes_is_one_line_per_cause(
        caplog: pytest.LogCaptureFixture) -> None:
    """5,000 Nodes with the old ``cfnet.io/security-level`` were 5,000 WARNING lines at
    start-up; they are one line per cause, with the count and the first few names. Each Node
    still gets its own Warning event (``on_problems``)."""
    reg = NodeRegistry()
    events: list[str] = []
    reg.on_problems = lambda node, probs: events.append(str(node["metadata"]["name"]))
    with caplog.at_level(logging.WARNING, logger="cloud_core.k8s.registry"):
        for i in range(5000):
            reg.upsert(_node(f"n{i}", {"cfnet.io/security-level": "3"}))
        for i in range(3):
            reg.upsert(_node(f"t{i}", {"cfnet.io/security_level": "3"}))
        assert caplog.records == []  # gathered until said
        assert reg.say_problems() == 2
        reg.upsert(_node("late", {"cfnet.io/security-level": "3"}))
        reg.upsert(_node("n7", {"cfnet.io/security-level": "3"}))  # nothing new about n7
        reg.say_problems()
    old = (f"label 'cfnet.io/security-level' ignored: a node can set it on itself; cfnet "
           f"reads {SECURITY!r}, which only an administrator can set")
    typo = (f"unknown label 'cfnet.io/security_level' (cfnet reads {SECURITY!r}, "
            f"{RESIDENCY_REGION!r}, {AGENT_ID!r})")
    assert [r.getMessage() for r in caplog.records] == [
        f"5000 nodes (n0, n1, n2, n3, n4, +4995 more): {old}",
        f"3 nodes (t0, t1, t2): {typo}",
        f"node late: {old}"]
    assert all(r.levelno == logging.WARNING for r in caplog.records)
    assert len(events) == 5004  # the Nodes' own events: one each


def test_node_writable_labels_decide_nothing() -> None:
    """A kubelet may set any label outside NodeRestriction's
    ``node-restriction.kubernetes.io/`` on its own Node. The older keys and the topology
    region are read for no security fact; the node is named, once, through ``on_problems``
    (the core's Warning event). The same against a real API server with a kubelet identity:
    tests/k8s/test_node_facts.py."""
    reg = NodeRegistry()
    said: list[tuple[str, tuple[str, ...]]] = []
    reg.on_problems = lambda node, probs: said.append((str(node["metadata"]["name"]), probs))
    mine = {"cfnet.io/security-level": "5", "cfnet.io/agent-id": "edge-other",
            "topology.kubernetes.io/region": "eu"}
    reg.upsert(_node("n1", mine))
    reg.upsert(_node("n1", mine))  # said once
    rec = reg.get("n1")
    assert rec is not None
    assert (rec.security_level, rec.agent_id, rec.region) == (0, "n1", "")
    assert reg.node_for_agent("edge-other") is None
    assert len(said) == 1 and said[0][0] == "n1"
    assert said[0][1] == (
        f"label 'cfnet.io/agent-id' ignored: a node can set it on itself; cfnet reads "
        f"{AGENT_ID!r}, which only an administrator can set",
        f"label 'cfnet.io/security-level' ignored: a node can set it on itself; cfnet reads "
        f"{SECURITY!r}, which only an administrator can set")
    # protected and topology regions disagree: residency reads the protected one, named
    reg.upsert(_node("n1", {SECURITY: "2", RESIDENCY_REGION: "us",
                            "topology.kubernetes.io/region": "eu"}))
    rec = reg.get("n1")
    assert rec is not None and (rec.security_level, rec.region) == (2, "us")
    assert said[-1][1] == (f"label 'topology.kubernetes.io/region' is 'eu' but "
                           f"{RESIDENCY_REGION!r} is 'us': residency reads the latter",)


@pytest.mark.parametrize(("key", "protected"), [
    ("node-restriction.kubernetes.io/cfnet-security-level", True),
    ("cfnet.node-restriction.kubernetes.io/level", True),  # a subdomain, as upstream
    ("cfnet.io/security-level", False), ("node-restriction.kubernetes.io.evil/x", False),
    ("xnode-restriction.kubernetes.io/x", False), ("node-restriction.kubernetes.io", False),
    ("topology.kubernetes.io/region", False),
])
def test_node_protected_as_noderestriction(key: str, protected: bool) -> None:
    assert node_protected(key) is protected


def test_agent_id_label_must_be_protected() -> None:
    with pytest.raises(CoreError, match=r"agent_id_label 'cfnet\.io/agent-id'"):
        RegistryConfig(agent_id_label="cfnet.io/agent-id")


def test_edge_taint_setting_is_checked() -> None:
    with pytest.raises(CoreError, match="edge_taint 'respekt'"):
        RegistryConfig(edge_taint="respekt")


class FakeEventClient:
    """A fake of the API client's event call (the one I/O edge of ``Moves.alert``); the
    same path against a real API server: tests/k8s/test_actuator.py's label-change test."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def emit_event(self, pod: object, *, reason: str, message: str, event_type: str,
                   instance: str) -> None:
        self.events.append(message)


def test_a_constraint_alert_reaches_the_core_events_in_words() -> None:
    """wiring read a ``message`` key the actuator's alert lacked: the event was a dict's
    repr."""
    from cloud_core.events import EventLog
    from cloud_core.k8s.registry import LabelChange
    from cloud_core.k8s.wiring import alert_to_event, build_actuator

    events = EventLog()
    client = FakeEventClient()
    act = build_actuator(client, on_alert=alert_to_event(events))  # type: ignore[arg-type]
    pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "u1"}}
    act.moves.alert(pod, "n1", ["residency: region eu not allowed"],
               [LabelChange("n1", "topology.kubernetes.io/region", "us", "eu")])
    (ev,) = events.recent(kind="alert")
    assert ev.message == client.events[0]
    assert ev.message.startswith("node n1 changed (topology.kubernetes.io/region: us -> eu)")
    assert (ev.node, ev.workload, ev.severity) == ("n1", "ns/p", "warning")


@pytest.mark.parametrize(("node", "agent", "want"), [
    ("online", None, "online"),  # no agent there: the Node's condition alone
    ("online", "unknown", "online"),
    ("online", "online", "online"),
    ("online", "suspect", "suspect"),  # a late report: no new pods meanwhile
    ("online", "down", "down"),  # crashed, though the kubelet's last word was Ready
    ("online", "unreachable", "unreachable"),  # partitioned: keep its pods
    ("unreachable", "unreachable", "unreachable"),  # NotReady edge, peers hear it: partition
    ("down", "unreachable", "unreachable"),  # NotReady, but alive behind a partition
    ("unreachable", "down", "down"),  # NotReady and nobody hears it: crash
    ("unreachable", "online", "unreachable"),  # the kubelet's NotReady still counts
    ("cordoned", "online", "cordoned"),
    ("cordoned", "down", "down"),
])
def test_combined_health_combines_node_condition_and_agent(node: str, agent: str | None,
                                                             want: str) -> None:
    from cloud_core.health import Health, combined_health

    got = combined_health(Health(node), Health(agent) if agent else None)
    assert got is Health(want)
