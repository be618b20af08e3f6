"""Re-placement: the moves the loop decides, carried out on Kubernetes.

A moved pod is evicted through the Eviction API (PodDisruptionBudgets honoured: a refused
eviction is an ``EvictionBlocked`` event, retried when the pod strikes out again) with a
``Rescheduling`` event in the engine's words. Its destination is reserved under the pod's
controller and template (``replacement_key``) for ``RESERVATION_TTL_S``; the next pending pod
of that controller and template (the replacement its controller creates) is pinned there
(``pinned``) if the validator still agrees. A pod no controller owns is not moved (``NotMoved``
event; cfnet creates no pods, k8s/evict.py); a copy an older leader made (annotated with what
it replaces and where the move planned it) is still bound where its plan says. Running pods that no
longer fit a changed node raise an alert (``report_misfits``) before they are moved.

The reservations are also kept on the leader's Lease (``ledger.py``): written before the
eviction (a move whose reservation could not be written is not made: retried later), dropped
when the replacement is bound or the reservation expires, and read back by a new leader
(``restore_moves``), which thus binds the replacement where the old one planned it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from cloud_core.errors import KubeError, KubeNotFound
from cloud_core.k8s.client import JSON, KubeClient
from cloud_core.k8s.config import ActuatorConfig, ActuatorStats
from cloud_core.k8s.evict import unowned
from cloud_core.k8s.informer import obj_key
from cloud_core.k8s.ledger import Entry, MoveLedger
from cloud_core.k8s.registry import LabelChange
from cloud_core.loop import Move, Observation
from cloud_core.placement.model import Workload

log = logging.getLogger(__name__)

REPLACES = "cfnet.io/replaces"
PLANNED_NODE = "cfnet.io/planned-node"  # on a copy: where the move that made it planned it
PLANNED_FROM = "cfnet.io/planned-from"  # on a copy: the moved pod's uid (its cool-down)
RESERVATION_TTL_S = 120.0  # how long a move's destination waits for the replacement pod


def replacement_key(pod: Mapping[str, Any]) -> tuple[str, ...] | None:
    """What a pod and the replacement its controller creates have in common.

    Controller-owned: namespace, the controller's uid and the template's hash label. A copy
    cfnet made of a bare pod: the ``cfnet.io/replaces`` annotation naming the original.
    """
    md = pod.get("metadata") or {}
    ns = str(md.get("namespace", "default"))
    for o in md.get("ownerReferences") or []:
        if o.get("controller"):
            lab = md.get("labels") or {}
            tpl = lab.get("pod-template-hash") or lab.get("controller-revision-hash") or ""
            return ("owner", ns, str(o.get("uid")), str(tpl))
    rep = (md.get("annotations") or {}).get(REPLACES)
    return ("copy", ns, str(rep)) if rep else None


class Moves:
    """Evictions, reservations, copies and alerts (see the module docstring)."""

    def __init__(self, client: KubeClient, config: ActuatorConfig, stats: ActuatorStats, *,
                 is_leader: Callable[[], bool],
                 recent_changes: Callable[[str], list[LabelChange]],
                 on_alert: Callable[[dict[str, Any]], None] | None = None,
                 ledger: MoveLedger | None = None) -> None:
        self._client = client
        self._config = config
        self._stats = stats
        self._is_leader = is_leader
        self._recent_changes = recent_changes  # a node's latest label changes (handlers.py)
        self._on_alert = on_alert
        # where the reservations outlive this leader (ledger.py; wiring.py sets it)
        self.ledger = ledger
        self._lock = threading.Lock()
        # a move's destination per replacement key: [(node, moved pod uid, expiry)]
        self._reserved: dict[tuple[str, ...], list[tuple[str, str, float]]] = {}
        self._restore_due = True  # read the ledger back at the next step (taking the Lease)
        self._forget_due = False  # drop the reservations in memory at the next step
        self._alerted: set[str] = set()  # pod uids already reported as violating

    def forget_pod(self, uid: str) -> None:
        """Pod ``uid`` was deleted: a new pod of that uid would be alerted again."""
        with self._lock:
            self._alerted.discard(uid)

    def restore_moves(self) -> None:
        """Read the planned moves of an earlier leader back into the reservations (on taking
        the Lease; a failed read is retried at the next step)."""
        if self.ledger is None:
            return
        try:
            entries = self.ledger.read()
        except KubeError as e:
            log.info("reading the planned moves failed, will retry: %s", e)
            return
        mono, wall = time.monotonic(), time.time()
        with self._lock:
            self._restore_due = False
            for key, node, uid, exp in entries:
                slots = self._reserved.setdefault(key, [])
                if all(r[1] != uid for r in slots):
                    slots.append((node, uid, mono + (exp - wall)))
        if entries:
            self._stats.add("moves_restored")
            log.info("restored %d planned move(s) of an earlier leader", len(entries))

    def forget_moves(self) -> None:
        """Leadership taken or lost (the elector's thread: sets flags only, never waits for
        the loop's lock): the reservations in memory may be stale, the Lease has the ones
        that hold; the next step as leader forgets the former and reads the latter."""
        self._forget_due = True
        self._restore_due = True

    def _ledger_entries(self) -> list[Entry]:
        mono, wall = time.monotonic(), time.time()
        with self._lock:
            return [(k, n, u, wall + (e - mono)) for k, v in self._reserved.items()
                    for n, u, e in v if e >= mono]

    def _sync_ledger(self, required: bool = False) -> bool:
        """Write the reservations to the Lease; False if that failed (``required``: logged
        as the reason a move waits; otherwise the stale entry just expires there)."""
        if self.ledger is None:
            return True
        try:
            self.ledger.write(self._ledger_entries())
            return True
        except KubeError as e:
            log.log(logging.WARNING if required else logging.INFO,
                    "planned moves not written to the Lease: %s", e)
            return False

    def pinned(self, pending: list[Workload], pods: Mapping[str, JSON]
                ) -> dict[str, tuple[str, str]]:
        if self._forget_due:
            self._forget_due = False
            with self._lock:
                self._reserved.clear()
        if self._restore_due:
            self.restore_moves()
        now = time.monotonic()
        out: dict[str, tuple[str, str]] = {}
        with self._lock:
            expired = [k for k, v in self._reserved.items() if all(e < now for *_, e in v)]
            for k in expired:
                del self._reserved[k]
        if expired:
            self._sync_ledger()
        with self._lock:
            taken: dict[tuple[str, ...], int] = {}
            for w in pending:
                key = replacement_key(pods[w.uid])
                slots = [r for r in self._reserved.get(key, []) if r[2] >= now] if key else []
                i = taken.get(key, 0) if key else 0
                if key and i < len(slots):
                    out[w.uid] = (slots[i][0], slots[i][1])
                    taken[key] = i + 1
                    continue
                # A copy a leader made for a move it did not live to finish: the plan is in
                # the copy itself (a new leader has no reservation in memory)
                ann = (pods[w.uid].get("metadata") or {}).get("annotations") or {}
                planned = ann.get(PLANNED_NODE)
                if planned and ann.get(REPLACES):
                    out[w.uid] = (str(planned), str(ann.get(PLANNED_FROM, "")))
        return out

    def consume_reservation(self, pod: JSON | None, moved_uid: str) -> None:
        key = replacement_key(pod) if pod is not None else None
        with self._lock:
            if key not in self._reserved:
                return
            self._reserved[key] = [r for r in self._reserved[key] if r[1] != moved_uid]
            if not self._reserved[key]:
                del self._reserved[key]
        self._sync_ledger()

    def commit_moves(self, obs: Observation, moves: Sequence[Move]) -> list[Move]:
        if not self._is_leader():
            return []
        done = []
        for m in moves:
            pod = obs.objects.get(m.workload_uid)
            if pod is None:
                continue
            try:
                if self._move(pod, m):
                    done.append(m)
            except KubeNotFound:
                continue  # gone meanwhile
            except KubeError as err:
                log.info("moving %s failed, will retry: %s", obj_key(pod), err)
        return done

    def _move(self, pod: JSON, m: Move) -> bool:
        key = obj_key(pod)
        rkey = replacement_key(pod)
        bare = unowned(pod)
        if bare:  # evicted, it would be gone: cfnet creates no pods (k8s/evict.py)
            self._client.record_event(pod, reason="NotMoved", event_type="Warning",
                                     instance=self._config.identity, message=f"cfnet would move "
                                     f"{key} from {m.src} to {m.dst} ({m.reason}), but {bare}")
            return False
        slot = (m.dst, m.workload_uid, time.monotonic() + RESERVATION_TTL_S)
        assert rkey is not None
        with self._lock:  # before evicting: the replacement may appear at once
            self._reserved.setdefault(rkey, []).append(slot)
        # ... and on the Lease, so that a new leader finishes the move (ledger.py); not
        # written (not the holder any more, API server away): no eviction, retried later
        written = self._sync_ledger(required=True)
        if not written or not self._replace(pod, m):
            with self._lock:
                left = [r for r in self._reserved.get(rkey, []) if r != slot]
                if left:
                    self._reserved[rkey] = left
                else:
                    self._reserved.pop(rkey, None)
            if not written:
                self._stats.add("moves_unrecorded")
                return False
            self._sync_ledger()
            self._stats.add("evictions_blocked")
            self._event(pod, "EvictionBlocked", "Warning",
                        f"cfnet would move {key} from {m.src} to {m.dst} ({m.reason}), but a "
                        "PodDisruptionBudget refused the eviction; will retry")
            return False
        self._stats.add("moves")
        self._event(pod, "Rescheduling", "Warning",
                    f"cfnet moves {key} from {m.src} to {m.dst}: {m.reason}")
        return True

    def _replace(self, pod: JSON, m: Move) -> bool:
        """Evict ``pod``, which a controller owns (``_move`` keeps bare pods; False: a
        disruption budget refused). Its controller recreates it pending; we place that one."""
        md = pod.get("metadata") or {}
        ns, name = str(md.get("namespace")), str(md.get("name"))
        if not self._client.evict_pod(ns, name, str(md.get("uid") or "") or None):
            return False
        self._stats.add("replaced")
        return True

    def _event(self, pod: JSON, reason: str, event_type: str, message: str) -> None:
        try:
            self._client.emit_event(pod, reason=reason, message=message, event_type=event_type,
                                   instance=self._config.identity)
        except KubeError as err:
            log.warning("%s event for %s lost: %s", reason, obj_key(pod), err)

    def report_misfits(self, obs: Observation,
                       misfits: Mapping[str, tuple[str, list[str]]]) -> None:
        """The loop found running pods that no longer fit their changed node: an alert each
        (``on_alert`` and a ``ConstraintViolated`` Warning event) before the re-planner moves
        them (its ``Rescheduling`` event, eviction, the replacement bound where it planned)."""
        for uid, (node, problems) in misfits.items():
            pod = obs.objects.get(uid)
            with self._lock:
                said = uid in self._alerted
            if pod is not None and not said:
                self.alert(pod, node, problems, self._recent_changes(node))

    def alert(self, pod: JSON, node: str, problems: list[str],
              changes: list[LabelChange]) -> None:
        """Say that ``pod`` no longer fits ``node`` after ``changes``: ``on_alert`` and a
        ``ConstraintViolated`` Warning event."""
        key = obj_key(pod)
        with self._lock:
            self._alerted.add(str((pod.get("metadata") or {}).get("uid")))
        what = ", ".join(f"{c.key}: {c.old} -> {c.new}" for c in changes)
        msg = f"node {node} changed ({what}); pod no longer fits: {'; '.join(problems)}"
        self._stats.add("alerts")
        alert = {"kind": "constraint-violation", "pod": key, "node": node, "problems": problems,
                 "changes": [c.__dict__ for c in changes], "message": msg}
        if self._on_alert is not None:
            self._on_alert(alert)
        try:
            self._client.emit_event(pod, reason="ConstraintViolated", message=msg,
                                   event_type="Warning", instance=self._config.identity)
        except KubeError as err:
            log.warning("alert event for %s lost: %s", key, err)
