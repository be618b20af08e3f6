"""Two core replicas (real processes) elect a leader through a Lease; killing the leader
mid-burst hands over to the other within the lease duration, and no pod is bound twice."""

from __future__ import annotations

import collections
import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

import pytest

from cloud_core.errors import KubeNotFound
from cloud_core.k8s.client import KubeClient
from cloud_core.k8s.leader import LeaderElector, _parse_micro
from tests.k8s.conftest import ROOT, Cluster, wait_for
from tools.broker import Broker, Credentials
from tools.envtest import ControlPlane

pytestmark = pytest.mark.slow

LEASE_S, RENEW_S, RETRY_S = 4.0, 3.0, 1.0


class Replica:
    """``cfnet-core --kubernetes`` as the chart runs it (``python -m cloud_core.k8s`` is that
    with ``--json-lines``), on the test broker with the replicas' one MQTT account, in a
    subprocess, its JSON lines collected by a thread."""

    def __init__(self, identity: str, kubeconfig: Path, log_dir: Path, broker: Broker,
                 creds: Credentials) -> None:
        self.identity = identity
        self.lines: queue.Queue[dict[str, Any]] = queue.Queue()
        self.events: list[dict[str, Any]] = []
        self.on_line: Any = None
        self.err = open(log_dir / f"{identity}.stderr", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "cloud_core.k8s", "--kubeconfig", str(kubeconfig),
             "--identity", identity, "--lease-namespace", "cfnet-system",
             "--lease-duration", str(LEASE_S), "--renew-deadline", str(RENEW_S),
             "--retry-period", str(RETRY_S), "--log-bindings", "--edge-taint", "ignore",
             "--broker-host", "127.0.0.1", "--broker-port", str(broker.port),
             "--username", creds.username, f"--password={creds.password}",
             "--ca-file", str(creds.ca_file), "--db", str(log_dir / f"{identity}.db"),
             "--table-every", "0"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=self.err,
            env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert self.proc.stdout is not None
        threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True).start()

    def _read(self, out: IO[bytes]) -> None:
        for raw in out:
            try:
                ev = json.loads(raw)
            except ValueError:
                continue
            self.events.append(ev)
            if self.on_line is not None:
                self.on_line(self, ev)
            self.lines.put(ev)

    def first(self, event: str) -> dict[str, Any] | None:
        return next((e for e in self.events if e["event"] == event), None)

    def bound(self) -> list[str]:
        return [e["pod"] for e in self.events if e["event"] == "bound"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.err.close()


def _wait_leading(r: Replica, cluster: Cluster, timeout: float = 45.0) -> None:
    """Wait for ``r`` to lead; on a timeout, say why: who holds the Lease (another test's
    core that was killed holds it for a lease duration) and what the replica printed."""
    try:
        wait_for(lambda: r.first("leading"), timeout=timeout, what=f"{r.identity} leading")
    except AssertionError as e:
        lease = cluster.c.get("/apis/coordination.k8s.io/v1/namespaces/cfnet-system/"
                              "leases/cfnet-core").get("spec")
        err = Path(r.err.name).read_bytes()[-3000:].decode(errors="replace")
        raise AssertionError(f"{e}\nlease: {lease}\nexit: {r.proc.poll()}\n"
                             f"events: {r.events[-10:]}\nstderr tail:\n{err}") from None


def test_leader_killed_mid_burst_hands_over(control_plane: ControlPlane, cluster: Cluster,
                                            service_account_client: KubeClient,
                                            broker: Broker, tmp_path: Path) -> None:
    # Both replicas run under deploy/k8s's ServiceAccount, as the Deployment would.
    token = control_plane.service_account_token("cfnet-system", "cfnet-core", create=False)
    kubeconfig = control_plane.token_credentials(token).write_kubeconfig(
        tmp_path / "core.kubeconfig", user="cfnet-core")
    for i in range(8):
        cluster.node(f"le-{i}", region="eu-west", cpu="16", memory="32Gi")
    creds = broker.add_account("core-k8s", "core")
    a = Replica("core-a", kubeconfig, tmp_path, broker, creds)
    replicas = [a]
    try:
        _wait_leading(a, cluster)
        b = Replica("core-b", kubeconfig, tmp_path, broker, creds)
        replicas.append(b)
        wait_for(lambda: b.first("started"), timeout=30, what="core-b started")
        time.sleep(2 * RETRY_S)  # b has read the lease and follows
        assert b.first("leading") is None

        killed = threading.Event()
        t_kill: list[float] = []

        def kill_at_20th(r: Replica, ev: dict[str, Any]) -> None:
            if ev["event"] == "bound" and len(r.bound()) >= 20 and not killed.is_set():
                r.proc.send_signal(signal.SIGKILL)  # crash: no release of the lease
                t_kill.append(time.time())
                killed.set()

        a.on_line = kill_at_20th
        for i in range(80):
            cluster.pod(f"burst-{i}")
        assert killed.wait(60), "core-a never bound 20 pods"
        # core-a's last renewal, read before core-b can have taken over (it may only
        # once that renewal is a lease duration old).
        before = cluster.c.get("/apis/coordination.k8s.io/v1/namespaces/cfnet-system/"
                               "leases/cfnet-core")["spec"]
        assert before["holderIdentity"] == "core-a"
        renew_a = _parse_micro(before["renewTime"])
        lead = wait_for(lambda: b.first("leading"), timeout=LEASE_S * 4, what="core-b leading")
        takeover_s = lead["t"] - t_kill[0]
        print(f"\nleader takeover after SIGKILL: {takeover_s:.2f} s "
              f"(lease {LEASE_S} s, retry {RETRY_S} s)")
        (tmp_path / "takeover_s").write_text(f"{takeover_s:.3f}\n")

        def all_bound() -> bool:
            return all(p["spec"].get("nodeName") for p in cluster.pods())

        wait_for(all_bound, timeout=60, what="all 80 pods bound", explain=cluster.describe)
        lease = cluster.c.get("/apis/coordination.k8s.io/v1/namespaces/cfnet-system/"
                              "leases/cfnet-core")["spec"]
        assert lease["holderIdentity"] == "core-b"
        assert lease["leaseTransitions"] >= 1
        # Safety, not speed: core-b took the lease only after core-a's last renewal
        # had expired, so the two never both believed they led.
        assert _parse_micro(lease["acquireTime"]) >= renew_a + LEASE_S

        by_a, by_b = a.bound(), b.bound()
        assert len(by_a) >= 20 and by_b, (len(by_a), len(by_b))
        assert not set(by_a) & set(by_b), "a pod was bound by both replicas"
        assert len(by_a) == len(set(by_a)) and len(by_b) == len(set(by_b))
        sched = collections.Counter(e["involvedObject"]["name"]
                                    for e in cluster.events("Scheduled"))
        assert max(sched.values(), default=1) == 1  # events may trail the bindings
        nodes = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in cluster.pods()}
        for e in a.events + b.events:
            if e["event"] == "bound":
                assert nodes[e["pod"].split("/", 1)[1]] == e["node"]
    finally:
        for r in replicas:
            r.stop()


def test_three_candidates_one_leader_and_graceful_handover(
        control_plane: ControlPlane, service_account_client: KubeClient) -> None:
    """Racing writes on one Lease: never two leaders; a released lease is taken at once."""
    els = [LeaderElector(service_account_client, "cfnet-system", "cfnet-core", f"cand-{i}",
                         lease_duration_s=3.0, renew_deadline_s=2.0, retry_period_s=0.3)
           for i in range(3)]
    for el in els:
        el.start()
    try:
        leader = wait_for(lambda: [e for e in els if e.is_leader()], timeout=15,
                          what="a leader")[0]
        for _ in range(40):  # 2 s of samples while all three keep campaigning
            assert sum(e.is_leader() for e in els) <= 1
            time.sleep(0.05)
        assert leader.is_leader()
        leader.stop(release=True)  # SIGTERM path: holderIdentity cleared
        rest = [e for e in els if e is not leader]
        nxt = wait_for(lambda: [e for e in rest if e.is_leader()], timeout=10,
                       what="the next leader")[0]
        assert sum(e.is_leader() for e in rest) == 1
        lease = service_account_client.get(
            "/apis/coordination.k8s.io/v1/namespaces/cfnet-system/leases/cfnet-core")
        assert lease["spec"]["holderIdentity"] == nxt.identity
    finally:
        for e in els:
            e.stop(release=True)


def test_a_candidate_campaigns_only_once_it_can_act(control_plane: ControlPlane) -> None:
    """``start(ready=...)``: a replica whose caches are still listing does not create, take
    or renew the Lease (kube-scheduler waits for its informers' sync before it campaigns);
    it campaigns as soon as it is ready, and stop() is heard while it waits. (An admin client
    and a Lease of its own: the chart's Role grants the core its one Lease name only.)"""
    client = KubeClient.from_kubeconfig(str(control_plane.kubeconfig))
    path = "/apis/coordination.k8s.io/v1/namespaces/default/leases/cfnet-ready-gate"
    gate = threading.Event()
    cold = LeaderElector(client, "default", "cfnet-ready-gate", "cold",
                         lease_duration_s=3.0, renew_deadline_s=2.0, retry_period_s=0.3)
    never = LeaderElector(client, "default", "cfnet-ready-gate", "never",
                          lease_duration_s=3.0, renew_deadline_s=2.0, retry_period_s=0.3)
    cold.start(ready=gate.wait)
    never.start(ready=lambda t: time.sleep(t) or False)
    try:
        time.sleep(1.5)  # five retry periods: an ungated candidate would hold it by now
        assert not cold.is_leader() and not never.is_leader()
        assert cold.last_contact == 0.0  # not one call to the API server
        with pytest.raises(KubeNotFound):
            client.get(path)
        gate.set()
        wait_for(cold.is_leader, timeout=10, what="the candidate, ready now, leading")
        assert client.get(path)["spec"]["holderIdentity"] == "cold"
        t0 = time.monotonic()
        never.stop(release=True)
        assert time.monotonic() - t0 < 1.0  # heard within one retry period
        assert not never.is_leader()
    finally:
        cold.stop(release=True)
        never.stop(release=True)
        with contextlib.suppress(KubeNotFound):
            client.delete(path)
        client.close()
