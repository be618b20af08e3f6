"""The pool controller reads NodePool / NodeGroup objects even when the first ask fails.

Over a fake client (an I/O edge; the same path runs against the real API server with the
upstream CRDs in tests/k8s/test_pool_mode.py). A 5xx or a timeout while probing the API at
start used to leave the core without the framework's pool objects until restarted (CI saw a
NodeGroup never read under load); now the probe is retried on the next round, and an API the
server does not serve (404: no CRDs) is asked again later, quietly.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from cloud_core.errors import KubeNotFound, KubeUnavailable
from cloud_core.k8s import pools as pools_mod
from cloud_core.k8s.pools import NODEGROUPS, NODEPOOLS, PoolController
from cloud_core.k8s.registry import NodeRegistry

Obj = dict[str, Any]


class FakeClient:
    """A fake of KubeClient's get/list_pages/watch with scripted failures per path."""

    def __init__(self, failures: dict[str, list[Exception]], objects: dict[str, list[Obj]]):
        self.failures = failures
        self.objects = objects
        self.gets: list[str] = []
        self.stop = threading.Event()

    def get(self, path: str, **query: Any) -> Obj:
        self.gets.append(path)
        script = self.failures.get(path) or []
        if script:
            raise script.pop(0)
        return {"items": []}

    def list_pages(self, path: str, **query: Any) -> Iterator[tuple[list[Obj], str]]:
        yield list(self.objects.get(path, [])), "5"

    def watch(self, path: str, rv: str, **kw: Any) -> Iterator[tuple[str, Obj]]:
        kw["stop"].wait(10)
        return iter(())


def edge_node(name: str) -> Obj:
    return {"metadata": {"name": name, "labels": {"node-role.kubernetes.io/edge": ""}},
            "status": {"allocatable": {"cpu": "2", "memory": "4Gi"}}}


def node_group(name: str, nodes: list[str]) -> Obj:
    return {"metadata": {"name": name, "resourceVersion": "3"}, "spec": {"nodes": nodes}}


@pytest.fixture
def controller(request: pytest.FixtureRequest) -> Iterator[tuple[PoolController, FakeClient]]:
    fake = FakeClient(*request.param)
    reg = NodeRegistry()
    reg.upsert(edge_node("e-1"))
    # A fake actuator (the controller reads these four): listed, no Deployments, so
    # reconcile plans nothing
    act = SimpleNamespace(registry=reg, config=SimpleNamespace(identity="t"),
                          snapshot=lambda: None, wait_ready=lambda timeout=None: True)
    pc = PoolController(fake, act)  # type: ignore[arg-type]
    yield pc, fake
    for r in pc.extra:
        r.stop()


def _member(pc: PoolController) -> str | None:
    for _ in range(100):
        got = pc.registry.membership("kubeedge").get("e-1")
        if got:
            return got
        threading.Event().wait(0.02)
    return None


@pytest.mark.parametrize("controller", [(
    {NODEGROUPS: [KubeUnavailable("GET nodegroups: timed out"),
                  KubeUnavailable("GET nodegroups: HTTP 503")],
     NODEPOOLS: [KubeNotFound("404", status=404)]},
    {NODEGROUPS: [node_group("g", ["e-1"])]})], indirect=True)
def test_a_failed_probe_is_retried(controller: tuple[PoolController, FakeClient],
                                   monkeypatch: pytest.MonkeyPatch,
                                   caplog: pytest.LogCaptureFixture) -> None:
    pc, fake = controller
    now = [1000.0]
    monkeypatch.setattr(pools_mod.time, "monotonic", lambda: now[0])
    pc._read_pool_objects()  # the start: NodeGroups time out, NodePools are not served
    assert not pc.extra and pc.registry.membership("kubeedge") == {}
    pc._read_pool_objects()  # the next round: a 503
    assert not pc.extra
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 2 and "503" in warned[1]  # once per distinct cause
    pc._read_pool_objects()  # the API answers: its objects are read from now on
    assert [r.path for r in pc.extra] == [NODEGROUPS]
    assert _member(pc) == "g"
    # the API that is not served was asked once, and again only after NOT_SERVED_RETRY_S
    assert fake.gets.count(NODEPOOLS) == 1
    now[0] += pools_mod.NOT_SERVED_RETRY_S + 1
    pc._read_pool_objects()
    assert fake.gets.count(NODEPOOLS) == 2 and fake.gets.count(NODEGROUPS) == 3
    assert [r.path for r in pc.extra] == [NODEGROUPS, NODEPOOLS]  # installed meanwhile


@pytest.mark.parametrize("controller", [({}, {NODEGROUPS: [node_group("g", ["e-1"])]})],
                         indirect=True)
def test_the_running_controller_retries(controller: tuple[PoolController, FakeClient]) -> None:
    pc, fake = controller
    fake.failures[NODEGROUPS] = [KubeUnavailable("GET nodegroups: timed out")]
    pc.resync_s = 0.05
    pc.start()  # the controller's own thread asks again on its next round
    try:
        assert _member(pc) == "g"
    finally:
        pc.stop()
