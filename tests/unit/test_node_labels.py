"""The Kubernetes registry's reading of a Node's cfnet labels: a typo is named, not ignored."""

from __future__ import annotations

import logging

import pytest

from cloud_core.errors import CoreError
from cloud_core.k8s.registry import NodeRegistry, RegistryConfig


def _node(name: str, labels: dict[str, str]) -> dict[str, object]:
    return {"metadata": {"name": name, "labels": labels},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}}


def test_a_cfnet_label_typo_is_named(caplog: pytest.LogCaptureFixture) -> None:
    reg = NodeRegistry()
    with caplog.at_level(logging.WARNING, logger="cloud_core.k8s.registry"):
        reg.upsert(_node("n1", {"cfnet.io/security_level": "3"}))
        reg.upsert(_node("n1", {"cfnet.io/security_level": "3", "x": "y"}))  # said once
    assert [r.getMessage() for r in caplog.records] == [
        "node n1: unknown label 'cfnet.io/security_level' (cfnet reads "
        "'cfnet.io/security-level', 'cfnet.io/agent-id')"]
    rec = reg.get("n1")
    assert rec is not None and rec.security_level == 0  # never guessed upwards
    reg.upsert(_node("n1", {"cfnet.io/security-level": "high"}))
    assert reg.label_problems["n1"] == (
        "label 'cfnet.io/security-level': 'high' is not a number (counted as 0)",)
    reg.upsert(_node("n1", {"cfnet.io/security-level": "3", "cfnet.io/agent-id": "e1"}))
    assert "n1" not in reg.label_problems
    rec = reg.get("n1")
    assert rec is not None and rec.security_level == 3


def test_edge_taint_setting_is_checked() -> None:
    with pytest.raises(CoreError, match="edge_taint 'respekt'"):
        RegistryConfig(edge_taint="respekt")


class FakeEventClient:
    """A fake of the API client's event call (the one I/O edge of ``Actuator._alert``); the
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
    from cloud_core.k8s.actuator import Actuator
    from cloud_core.k8s.registry import LabelChange
    from cloud_core.k8s.wiring import alert_to_event

    events = EventLog()
    client = FakeEventClient()
    act = Actuator(client, on_alert=alert_to_event(events))  # type: ignore[arg-type]
    pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "u1"}}
    act._alert(pod, "n1", ["residency: region eu not allowed"],
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
