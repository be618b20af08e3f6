"""Leader election with a ``coordination.k8s.io/v1`` Lease between core replicas.

The holder renews every ``retry_period_s``; every write carries the Lease's
resourceVersion, so two candidates racing for it get one success and one 409. A candidate
takes an expired lease at ``renewTime + leaseDurationSeconds`` (it sleeps until that instant
rather than polling, so a crashed leader is replaced within one lease duration of its last
renewal). The holder stops acting as soon as it has not renewed for ``renew_deadline_s``
(< lease duration), so the clocks of the replicas may differ by up to the difference
before two of them could act at once; the API server's UID-preconditioned bindings keep even
that case from binding a pod twice. A graceful stop releases the lease for a fast handover.

A candidate campaigns only once it could act (``start(ready=...)``: cfnet-core passes its
caches' readiness), as kube-scheduler starts its informers and waits for their sync before it
runs its leader elector (cmd/kube-scheduler/app/server.go): a replacement pod still listing
does not take the lease from under a warm standby, and a leader never holds the lease while
it cannot decide.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime

from cloud_core.errors import KubeConflict, KubeError, KubeNotFound
from cloud_core.k8s.client import JSON, KubeClient

log = logging.getLogger(__name__)


def _micro(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse_micro(s: str | None) -> float:
    if not s:
        return 0.0
    s = s.replace("Z", "+00:00")
    try:
        return datetime.fromisoformat(s).timestamp()
    except ValueError:
        return 0.0


class LeaderElector:
    """Campaign for Lease ``namespace/name`` as ``identity``; ``is_leader()`` gates actions."""

    def __init__(self, client: KubeClient, namespace: str, name: str, identity: str, *,
                 lease_duration_s: float = 15.0, renew_deadline_s: float = 10.0,
                 retry_period_s: float = 2.0,
                 on_started: Callable[[], None] | None = None,
                 on_stopped: Callable[[], None] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        if not retry_period_s < renew_deadline_s < lease_duration_s:
            raise ValueError("need retry_period < renew_deadline < lease_duration")
        self.client = client
        self.path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        self.namespace, self.name, self.identity = namespace, name, identity
        self.lease_duration_s = lease_duration_s
        self.renew_deadline_s = renew_deadline_s
        self.retry_period_s = retry_period_s
        self.on_started, self.on_stopped = on_started, on_stopped
        self.clock = clock
        self._last_renew = 0.0  # local clock of our last successful write as holder
        # Local clock at the end of the last round the API server answered (a conflict is an
        # answer); /readyz of cfnet-core turns not-ready when it grows old.
        self.last_contact = 0.0
        self._leading = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ready: Callable[[float], bool] | None = None
        self.transitions_seen = 0

    def is_leader(self) -> bool:
        return self._leading and self.clock() - self._last_renew < self.renew_deadline_s

    def start(self, ready: Callable[[float], bool] | None = None) -> None:
        """Campaign in a thread of its own; with ``ready`` (wait up to N seconds, say whether
        this replica can act), only once it says so."""
        self._ready = ready
        self._thread = threading.Thread(target=self.run, name="leader-election", daemon=True)
        self._thread.start()

    def stop(self, release: bool = True) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.retry_period_s + 15)
        if release and self._leading:
            self._release()
        self._set_leading(False)

    def _set_leading(self, v: bool) -> None:
        if v == self._leading:
            return
        self._leading = v
        cb = self.on_started if v else self.on_stopped
        log.info("%s %s leadership of %s/%s", self.identity, "acquired" if v else "lost",
                 self.namespace, self.name)
        if cb is not None:
            cb()

    def run(self) -> None:
        if self._ready is not None:
            while not self._stop.is_set() and not self._ready(self.retry_period_s):
                pass  # each call waits up to a retry period: stop() is heard within one
        while not self._stop.is_set():
            try:
                wait = self.try_acquire_or_renew()
                self.last_contact = self.clock()
            except KubeError as e:
                log.info("%s: lease call failed: %s", self.identity, e)
                wait = self.retry_period_s
            if self._leading and not self.is_leader():
                self._set_leading(False)  # renew deadline passed without a successful renew
            self._stop.wait(wait)

    def _spec(self, now: float, acquire: float, transitions: int) -> JSON:
        return {"holderIdentity": self.identity,
                "leaseDurationSeconds": max(1, round(self.lease_duration_s)),
                "acquireTime": _micro(acquire), "renewTime": _micro(now),
                "leaseTransitions": transitions}

    def try_acquire_or_renew(self) -> float:
        """One round; returns how long to wait before the next one."""
        now = self.clock()
        try:
            lease = self.client.get(f"{self.path}/{self.name}")
        except KubeNotFound:
            try:
                self.client.create(self.path, {
                    "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace},
                    "spec": self._spec(now, now, 0)})
            except KubeConflict:
                return 0.05  # someone created it first: read it
            self._last_renew = now
            self._set_leading(True)
            return self.retry_period_s
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        duration = float(spec.get("leaseDurationSeconds") or self.lease_duration_s)
        expires = _parse_micro(spec.get("renewTime")) + duration
        transitions = int(spec.get("leaseTransitions") or 0)
        if holder and holder != self.identity and now < expires:
            self._set_leading(False)
            # Sleep until the instant it expires (or one retry period, whichever is first).
            return max(0.05, min(self.retry_period_s, expires - now + 0.02))
        if holder == self.identity:
            acquire = _parse_micro(spec.get("acquireTime")) or now
        else:
            acquire, transitions = now, transitions + 1
        body = {**lease, "spec": self._spec(now, acquire, transitions)}
        try:
            self.client.replace(f"{self.path}/{self.name}", body)
        except KubeConflict:
            return 0.05  # lost a race: re-read
        self._last_renew = now
        self._set_leading(True)
        return self.retry_period_s

    def _release(self) -> None:
        try:
            lease = self.client.get(f"{self.path}/{self.name}")
            if (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            now = self.clock()
            spec = {**lease["spec"], "holderIdentity": "", "leaseDurationSeconds": 1,
                    "renewTime": _micro(now)}
            self.client.replace(f"{self.path}/{self.name}", {**lease, "spec": spec})
        except KubeError as e:
            log.info("%s: releasing the lease failed: %s", self.identity, e)
