"""The loop's source builds each step's snapshot on the last one (``Source._scan_changes``):
only the nodes whose sums changed are read again while no Node, agent verdict or link
changed, and the facts token stays the same only then. Checked against a whole scan after
each change the informers can bring: pods bound, assumed, forgotten, deleted; a Node added,
relabelled, removed, its status rewritten unchanged; an agent's verdict."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cloud_core.k8s.actuator import Actuator
from cloud_core.k8s.config import ActuatorConfig
from cloud_core.k8s.registry import NodeRegistry
from cloud_core.k8s.wiring import build_actuator
from cloud_core.placement.model import Health, Resources, Workload


class _Client:
    """A fake at the I/O edge (events, bindings): nothing here is bound through it."""

    def record_event(self, *a: Any, **kw: Any) -> None:
        pass

    emit_event = record_event

    def bind_pod(self, *a: Any, **kw: Any) -> None:
        pass


def _node(name: str, tier: str = "a") -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"topology.kubernetes.io/region": "eu",
                                                  "tier": tier}},
            "spec": {}, "status": {"allocatable": {"cpu": "8", "memory": "8Gi", "pods": "110"},
                                   "conditions": [{"type": "Ready", "status": "True"}]}}


def _pod(name: str, node: str | None, cpu: str = "100m", rv: int = 1) -> dict[str, Any]:
    spec: dict[str, Any] = {"schedulerName": "other",
                            "containers": [{"name": "c", "image": "x",
                                            "resources": {"requests": {"cpu": cpu}}}]}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": name, "namespace": "ns", "uid": name,
                         "resourceVersion": str(rv)},
            "spec": spec, "status": {"phase": "Running"}}


def test_each_snapshot_is_the_whole_scans_and_the_token_follows_the_facts() -> None:
    agents: dict[str, Health] = {}
    act: Actuator = build_actuator(_Client(), NodeRegistry(),  # type: ignore[arg-type]
                                   ActuatorConfig(), agent_health=lambda: agents)
    h, src, cache = act.handlers, act.source, act.cache
    tokens: list[Any] = []

    def step(what: str, change: Callable[[], None], same: bool) -> None:
        change()
        obs = src.observe()
        assert obs.snapshot.nodes == src.snapshot().nodes, what
        assert sorted(p.uid for p in obs.snapshot.pods) == \
            sorted(p.uid for p in src.snapshot().pods), what
        assert obs.health == {n.name: n.health for n in obs.snapshot.nodes}, what
        assert (obs.facts == tokens[-1]) is same, what
        tokens.append(obs.facts)

    try:
        for i in range(4):
            h.on_node("ADDED", _node(f"n{i}"), None)
        tokens.append(src.observe().facts)
        step("a pod bound", lambda: h.on_pod("ADDED", _pod("a", "n1"), None), True)
        step("another", lambda: h.on_pod("ADDED", _pod("b", "n2", "2"), None), True)
        w = Workload("c", "c", requests=Resources(500, 1 << 20, 0))
        step("assumed", lambda: cache.assume("ns/c", "n3", w), True)
        step("forgotten", lambda: cache.forget("ns/c"), True)
        step("deleted", lambda: h.on_pod("DELETED", _pod("a", "n1"), None), True)
        step("status rewritten", lambda: h.on_node("MODIFIED", _node("n0"), _node("n0")), True)
        step("relabelled", lambda: h.on_node("MODIFIED", _node("n0", "b"), _node("n0")), False)
        step("added", lambda: h.on_node("ADDED", _node("n9"), None), False)
        step("removed", lambda: h.on_node("DELETED", _node("n9"), None), False)
        step("bound again", lambda: h.on_pod("ADDED", _pod("d", "n0", rv=2), None), True)
        step("an agent's verdict", lambda: agents.update(n2=Health.DOWN), False)
        step("its pod's sums", lambda: h.on_pod("ADDED", _pod("e", "n2"), None), True)
        assert {n.name: n.health for n in src.observe().snapshot.nodes}["n2"] is Health.DOWN
    finally:
        act.stop()
