"""Partition vs crash on Kubernetes: the agents' heartbeats and the links their peers measure
decide a Node's health, as in local mode (``cloud_core.health``), combined with its Ready
condition (``health.combined_health``).

A real API server (with its ReplicaSet controller) and a real broker; three agents simulated
over that broker (``FakeAgent``: valid reports, no probes), two on site A that measure each
other and one on site B; ``cfnet-core --kubernetes``'s wiring (``start_kubernetes``) with the
core's MQTT ingest. A one-replica Deployment runs on A's first node (a kwok node: its Node
stays Ready throughout, as a node whose kubelet still talks to the API server does, and
Kubernetes alone would notice nothing for 40-50 s).

- crash: the agent falls silent and its peer stops hearing it: ``down``, the pod is evicted
  and its replacement bound elsewhere within seconds;
- partition: the agent falls silent but its site peer still hears it: ``unreachable``, the
  pod stays for as long as the partition lasts; heal: ``online``, nothing moved.

``CFNET_PARTITION_RUNS`` (default 1) repeats both (docs/kubernetes.md, "Partition vs crash on Kubernetes");
``CFNET_PARTITION_HOLD_S`` (default 15) is how long the partition is held.

The NotReady crash path (a Node whose Ready condition is False, on a node kwok does not manage,
with its agent's real last will fired by the broker) is the second test.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import threading
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from cloud_core.errors import KubeError
from cloud_core.health import Health
from cloud_core.k8s.client import KubeClient
from cloud_core.k8s.registry import AGENT_ID
from cloud_core.k8s.wiring import KubeRunner, KubeSettings, start_kubernetes
from cloud_core.service import CoreConfig, CoreService
from tests.integration.helpers import FakeAgent, settings
from tests.k8s.conftest import Cluster, wait_for
from tests.k8s.test_workloads import deployment, live_pods
from tools.broker import Broker

RUNS = int(os.environ.get("CFNET_PARTITION_RUNS", "1"))
HOLD_S = float(os.environ.get("CFNET_PARTITION_HOLD_S", "15"))
# the suite's 600 s per test is too short for the documented 10 runs held 120 s each: each
# run is its hold plus at most ~90 s of placing, crashing and healing on a loaded machine
pytestmark = [pytest.mark.slow, pytest.mark.timeout(max(600, int(RUNS * (HOLD_S + 90) + 120)))]
ADDR = {"ag-a1": "10.9.0.1", "ag-a2": "10.9.0.2", "ag-b": "10.9.0.3"}
NODE = {"ag-a1": "pk-a1", "ag-a2": "pk-a2", "ag-b": "pk-b"}


class Agents:
    """The three simulated agents, reporting every second on a thread of their own; each
    reports the peers it currently hears (``hears``)."""

    def __init__(self, broker: Broker) -> None:
        self.agents = {a: FakeAgent(broker, broker.add_account(a, "agent"), addr)
                       for a, addr in ADDR.items()}
        self.silent: set[str] = set()
        self.hears = {a: {b for b in ADDR if b != a} for a in ADDR}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.failed: list[str] = []  # reports not acked in time (loaded machine): kept going
        self.rounds = 0
        for ag in self.agents.values():
            ag.announce()
        self._thread = threading.Thread(target=self._run, daemon=True, name="agents")
        self._thread.start()

    def set(self, silent: set[str], hears: dict[str, set[str]]) -> None:
        with self._lock:
            self.silent = set(silent)
            self.hears = {a: set(h) for a, h in hears.items()}

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            with self._lock:
                plan = [(a, {ADDR[b]: 2.0 for b in self.hears[a]})
                        for a in ADDR if a not in self.silent]
            for a, peers in plan:
                ag = self.agents[a]
                ag.peers = peers
                try:
                    ag.report()
                except AssertionError:  # a publish not acked in 5 s: the next round retries
                    self.failed.append(f"{a} at {time.time():.1f}")
            self.rounds += 1

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        for ag in self.agents.values():
            ag.close()


@pytest.fixture
def rig(broker: Broker, admin: KubeClient, cluster: Cluster,
        tmp_path: Path) -> Iterator[tuple[CoreService, Agents, KubeRunner]]:
    for a, node in NODE.items():
        cluster.node(node, region="eu", zone="eu-a" if "-a" in a else "eu-b",
                     labels={AGENT_ID: a}, edge_taint=False)
    core = CoreService(CoreConfig(mqtt=settings(broker, broker.add_account("core-k8s", "core")),
                                  db_path=tmp_path / "core.db", place=False))
    core.start(connect=False)  # as cfnet-core --kubernetes: MQTT while leading
    agents = Agents(broker)
    runner = start_kubernetes(admin, core.state, core.events, KubeSettings(
        identity="core-part", lease_namespace=cluster.namespace, lease_duration_s=4,
        renew_deadline_s=3, retry_period_s=1),
        on_lead=core.connect, on_follow=core.disconnect)
    try:
        # 60 s: the Lease, then the MQTT child process starting on a machine at load 20+
        wait_for(lambda: core.mqtt.connected, timeout=60, what="the leader's MQTT connection")
        yield core, agents, runner
    finally:
        runner.stop()
        agents.close()
        core.stop()


def _health(runner: KubeRunner, node: str) -> Health | None:
    return runner.actuator.loop.health.get(node)


def _node_health(runner: KubeRunner, node: str) -> Health | None:
    rec = runner.actuator.registry.get(node)
    return rec.health if rec is not None else None


def _why(core: CoreService, agents: Agents) -> str:
    """What the core holds when a verdict surprises: each agent's report age and status, who
    hears ag-a1 and how long ago, and whether the simulated agents kept reporting."""
    snap = core.state.snapshot(time.time())
    ages = {a: (round(snap.now - v.last_report, 2), v.status) for a, v in snap.nodes.items()
            if a in ADDR}
    heard = {f"{s}->{d}": round(snap.now - lk.heard, 2) for (s, d), lk in snap.links.items()
             if d in ("ag-a1", ADDR["ag-a1"]) and lk.heard}
    return (f"report age/status {ages}; ag-a1 heard (age s) {heard}; agents' rounds "
            f"{agents.rounds}, thread alive {agents._thread.is_alive()}, publish timeouts "
            f"{agents.failed[-5:]}")


def _is(runner: KubeRunner, node: str, want: Health) -> bool:
    return _health(runner, node) is want


def _first_node(cluster: Cluster, app: str) -> str | None:
    return next(iter(_where(cluster, app).values()), None)


def _where(cluster: Cluster, app: str) -> dict[str, str | None]:
    return {p["metadata"]["name"]: p["spec"].get("nodeName") for p in live_pods(cluster, app)}


def test_crash_is_replaced_in_seconds_partition_keeps_its_pod(
        rig: tuple[CoreService, Agents, KubeRunner], admin: KubeClient,
        cluster: Cluster, tmp_path: Path) -> None:
    core, agents, runner = rig
    every = set(ADDR)
    all_hear = {a: every - {a} for a in ADDR}
    for node in NODE.values():
        wait_for(partial(_is, runner, node, Health.ONLINE), timeout=30,
                 what=f"{node} online from its agent's reports")
    crash_s: list[float] = []
    kept: list[float] = []
    ns = cluster.namespace
    for run in range(RUNS):
        app = f"crash-{run}"
        # Only pk-a1 takes new pods while the Deployment is placed: cordon the others.
        for n in ("pk-a2", "pk-b"):
            admin.patch(f"/api/v1/nodes/{n}", {"spec": {"unschedulable": True}})
        admin.create(f"/apis/apps/v1/namespaces/{ns}/deployments", deployment(ns, app, 1))
        # 90 s: the first Deployment of a fresh control plane waits for the controller
        # manager's caches (the ReplicaSet and its pod), slow on a loaded machine
        first = wait_for(partial(_first_node, cluster, app), timeout=90,
                         what=f"{app}'s pod created by its ReplicaSet and bound")
        assert first == "pk-a1"
        for n in ("pk-a2", "pk-b"):
            admin.patch(f"/api/v1/nodes/{n}", {"spec": {"unschedulable": False}})
        wait_for(lambda: all(_node_health(runner, n) is Health.ONLINE for n in NODE.values()),
                 timeout=10, what="the uncordoned nodes online in the registry")
        (old,) = _where(cluster, app)

        # Crash: ag-a1 silent, and nobody hears it any more.
        t0 = time.monotonic()
        agents.set({"ag-a1"}, {a: h - {"ag-a1"} for a, h in all_hear.items()})

        def moved(a: str = app, gone: str = old) -> str | None:
            w = _where(cluster, a)
            return next((n for p, n in w.items() if p != gone and n), None)

        dst = wait_for(moved, timeout=30, every=0.05, what=f"{app}'s replacement bound")
        crash_s.append(time.monotonic() - t0)
        assert dst in ("pk-a2", "pk-b")
        assert _health(runner, "pk-a1") is Health.DOWN
        admin.delete(f"/apis/apps/v1/namespaces/{ns}/deployments/{app}")
        # kwok finishes the evicted pod as a kubelet would
        wait_for(lambda gone=old: gone not in {p["metadata"]["name"] for p in cluster.pods()},
                 timeout=30, what=f"evicted pod {old} gone")
        agents.set(set(), all_hear)  # the node comes back
        wait_for(lambda: _health(runner, "pk-a1") is Health.ONLINE, timeout=15,
                 what="pk-a1 online again")

        # Partition: ag-a1 silent to the core, its site peer ag-a2 still hears it.
        app = f"part-{run}"
        for n in ("pk-a2", "pk-b"):
            admin.patch(f"/api/v1/nodes/{n}", {"spec": {"unschedulable": True}})
        admin.create(f"/apis/apps/v1/namespaces/{ns}/deployments", deployment(ns, app, 1))
        # 90 s: the first Deployment of a fresh control plane waits for the controller
        # manager's caches (the ReplicaSet and its pod), slow on a loaded machine
        first = wait_for(partial(_first_node, cluster, app), timeout=90,
                         what=f"{app}'s pod created by its ReplicaSet and bound")
        assert first == "pk-a1"
        for n in ("pk-a2", "pk-b"):
            admin.patch(f"/api/v1/nodes/{n}", {"spec": {"unschedulable": False}})
        wait_for(lambda: all(_node_health(runner, n) is Health.ONLINE for n in NODE.values()),
                 timeout=10, what="the uncordoned nodes online in the registry")
        before = _where(cluster, app)
        agents.set({"ag-a1"}, {"ag-a2": {"ag-a1", "ag-b"}, "ag-b": {"ag-a2"},
                               "ag-a1": all_hear["ag-a1"]})
        wait_for(lambda: _health(runner, "pk-a1") is Health.UNREACHABLE, timeout=15,
                 what="pk-a1 unreachable (its peer still hears it)")
        t0 = time.monotonic()
        while time.monotonic() - t0 < HOLD_S:
            assert _where(cluster, app) == before, "a partitioned node's pod was moved"
            h = _health(runner, "pk-a1")
            assert h is Health.UNREACHABLE, f"pk-a1 {h} during the partition: {_why(core, agents)}"
            time.sleep(0.5)
        kept.append(time.monotonic() - t0)
        agents.set(set(), all_hear)  # heal
        wait_for(lambda: _health(runner, "pk-a1") is Health.ONLINE, timeout=15,
                 what="pk-a1 online after the partition")
        time.sleep(2.0)  # two re-planning rounds after the heal: still nothing moved
        assert _where(cluster, app) == before
        admin.delete(f"/apis/apps/v1/namespaces/{ns}/deployments/{app}")
    evictions = [e for e in cluster.events() if e.get("reason") == "Rescheduling"]
    assert len(evictions) == RUNS, [e["message"] for e in evictions]  # the crashes' only
    # inclusive: never beyond the slowest run (with 10 runs the p99 is the slowest)
    q = statistics.quantiles(crash_s, n=100, method="inclusive") if len(crash_s) > 1 \
        else crash_s * 99
    line = (f"crash -> replacement bound over {RUNS} runs: p50 {statistics.median(crash_s):.2f}"
            f" s, p99 {q[98]:.2f} s, max {max(crash_s):.2f} s; partition held "
            f"{min(kept):.0f} s with no eviction; heal: nothing moved")
    print("\n" + line)
    (tmp_path / "timings.txt").write_text(line + "\n" + " ".join(f"{x:.3f}" for x in crash_s))
    assert max(crash_s) <= 10.0, crash_s


def test_notready_edge_whose_will_fired_is_replaced_in_seconds(
        broker: Broker, admin: KubeClient, cluster: Cluster, tmp_path: Path) -> None:
    """The NotReady crash path (``health.combined_health``): an edge Node whose Ready condition
    is False keeps its pods while its agent still reports (edge autonomy: NotReady alone is
    ``unreachable``); once the agent's last will fires too (the broker sends it when the
    connection drops without DISCONNECT) and no peer hears it, the node is ``down`` and its
    pod is re-placed within seconds.

    ``nr-edge`` is a Node kwok does not manage (``simulated=False``): the test writes its Ready
    condition, as a node-lifecycle controller or a kubelet would, and kwok, which keeps its own
    nodes Ready with heartbeats, would set it back. Its pod therefore stays Pending (no kubelet
    runs it); it is bound, which is all re-placement reads. The replacement goes to a kwok node.
    """
    cluster.node("nr-edge", region="eu", openyurt_pool="nr-pool", labels={AGENT_ID: "ag-nr"},
                 simulated=False)
    cluster.node("nr-other", region="eu", labels={AGENT_ID: "ag-ok"}, edge_taint=False)
    core = CoreService(CoreConfig(mqtt=settings(broker, broker.add_account("core-nr", "core")),
                                  db_path=tmp_path / "core.db", place=False))
    core.start(connect=False)
    crashing = FakeAgent(broker, broker.add_account("ag-nr", "agent"), "10.9.1.1", will=True)
    other = FakeAgent(broker, broker.add_account("ag-ok", "agent"), "10.9.1.2")  # hears nobody
    reporting = [crashing, other]
    stop = threading.Event()

    def report() -> None:
        while not stop.wait(0.5):
            for ag in list(reporting):
                ag.report()

    for ag in reporting:
        ag.announce()
    reporter = threading.Thread(target=report, daemon=True, name="nr-agents")
    reporter.start()
    runner = start_kubernetes(admin, core.state, core.events, KubeSettings(
        identity="core-nr", lease_namespace=cluster.namespace, lease_duration_s=4,
        renew_deadline_s=3, retry_period_s=1), on_lead=core.connect, on_follow=core.disconnect)
    ns, app = cluster.namespace, "nr-app"
    try:
        for node in ("nr-edge", "nr-other"):
            # 60 s: the Lease, the MQTT child process, the first reports (a loaded machine)
            wait_for(partial(_is, runner, node, Health.ONLINE), timeout=60,
                     what=f"{node} online from its agent's reports (leader's MQTT "
                          f"connected: {core.mqtt.connected})")
        admin.patch("/api/v1/nodes/nr-other", {"spec": {"unschedulable": True}})
        admin.create(f"/apis/apps/v1/namespaces/{ns}/deployments", deployment(ns, app, 1))
        first = wait_for(partial(_first_node, cluster, app), timeout=90,
                         what=f"{app}'s pod created by its ReplicaSet and bound")
        assert first == "nr-edge"
        admin.patch("/api/v1/nodes/nr-other", {"spec": {"unschedulable": False}})
        (old,) = _where(cluster, app)

        # NotReady alone (the agent still reports): unreachable, the pod stays.
        n = admin.get("/api/v1/nodes/nr-edge")
        n["status"]["conditions"] = [{
            "type": "Ready", "status": "False", "reason": "KubeletNotReady",
            "message": "written by the test (no kwok on this node: it would set Ready back)"}]
        admin.replace("/api/v1/nodes/nr-edge/status", n)
        wait_for(partial(_is, runner, "nr-edge", Health.UNREACHABLE), timeout=15,
                 what="nr-edge unreachable from its NotReady condition")
        assert _node_health(runner, "nr-other") is Health.ONLINE
        t_hold = time.monotonic()
        while time.monotonic() - t_hold < 3.0:  # three re-planning rounds: nothing moves
            assert _where(cluster, app) == {old: "nr-edge"}, "NotReady alone moved the pod"
            time.sleep(0.25)

        # ... and the agent's will fires, nobody hears it: down, re-placed.
        t0 = time.monotonic()
        reporting.remove(crashing)
        crashing.crash()

        def moved() -> str | None:
            return next((nd for p, nd in _where(cluster, app).items() if p != old and nd), None)

        dst = wait_for(moved, timeout=30, every=0.05, what=f"{app}'s replacement bound")
        took = time.monotonic() - t0
        assert dst == "nr-other"
        view = core.state.snapshot(time.time()).nodes["ag-nr"]
        assert view.status == "offline", "the agent's will did not reach the core"
        assert _health(runner, "nr-edge") is Health.DOWN
        print(f"\nNotReady + will fired -> replacement bound in {took:.2f} s")
        assert took <= 10.0, took
    finally:
        with contextlib.suppress(KubeError):
            admin.delete(f"/apis/apps/v1/namespaces/{ns}/deployments/{app}")
        stop.set()
        reporter.join(10)
        runner.stop()
        other.close()
        core.stop()
