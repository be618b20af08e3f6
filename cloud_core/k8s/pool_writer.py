"""What the pool controller writes to the API server, and what it remembers of it.

The sink of a pool loop (``pool_loop.py``) hands each Deployment whose replicas changed to
:meth:`PoolWriter.write`: the YurtAppSet / EdgeApplication for the new counts is created or
replaced (only an object cfnet owns: ``pool_objects.owned_by``) when it differs from what was
written last, with a ``PoolPlan`` event on the Deployment; a refusal is the Deployment's own
Warning event, once per distinct cause. :meth:`PoolWriter.restore` is a new leader's read of
the last plan on the object; :meth:`PoolWriter.delete` removes an object whose Deployment
left pool mode, with uid and resourceVersion preconditions.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable

from cloud_core.errors import KubeError, KubeNotFound, SpecError
from cloud_core.k8s.client import JSON, KubeClient
from cloud_core.k8s.informer import obj_key
from cloud_core.k8s.pool_loop import Key, PoolApp
from cloud_core.k8s.pool_objects import (
    NotOwned,
    PoolPlan,
    apply_pool_plan,
    digest,
    edge_application,
    owned_by,
    plan_note,
    pool_path,
    read_note,
    template_digest,
    yurt_app_set,
)

log = logging.getLogger(__name__)


class PoolWriter:
    """Writes, restores and deletes the pool objects of one controller (module docstring)."""

    def __init__(self, client: KubeClient, identity: Callable[[], str]) -> None:
        self.client = client
        self.identity = identity  # the event's reportingInstance
        self.written: dict[Key, tuple[str, str]] = {}  # (ns, name) -> (flavour, obj digest)
        self.owner: dict[Key, str] = {}  # (ns, name) -> Deployment uid written for
        self.failed: dict[Key, str] = {}  # (ns, name) -> last failure told
        self.warned: set[str] = set()  # Deployments told PoolModeNotPaused
        self.plans: dict[str, PoolPlan] = {}  # "ns/name" -> last plan written

    def forget(self) -> None:
        """Leadership changed: what was written is read back from the objects."""
        for d in (self.written, self.owner, self.plans):
            d.clear()

    def restore(self, dep: JSON, key: Key, flavour: str) -> dict[int, str] | None:
        """The nodes of the last plan on the pool object cfnet wrote for ``dep`` (a new
        leader), replica index -> node, to pin its replicas to; None if it could not be read
        (the Deployment waits for the next round)."""
        try:
            live = self.client.get(pool_path(flavour, *key))
        except KubeNotFound:
            return {}
        except KubeError as e:
            log.info("reading the %s object of %s failed, will retry: %s", flavour,
                     obj_key(dep), e)
            return None
        if not owned_by(live, dep):
            return {}  # never adopted: the write says NotOwned
        got = read_note(live, key[1], flavour)
        if got is None or got[2] != digest(template_digest(dep)):
            return {}  # no note, or made for another template: planned afresh
        plan = got[0]
        self.written[key] = (flavour, self.digest(dep, flavour, plan))
        self.owner[key] = str((dep.get("metadata") or {}).get("uid") or "")
        self.plans[obj_key(dep)] = plan
        nodes = [n for n, c in sorted(plan.per_node.items()) for _ in range(c)]
        return dict(enumerate(nodes))

    @staticmethod
    def digest(dep: JSON, flavour: str, plan: PoolPlan) -> str:
        obj = yurt_app_set(dep, plan) if flavour == "openyurt" else edge_application(dep, plan)
        return json.dumps(obj, sort_keys=True)

    def refused(self, dep: JSON, key: Key, flavour: str, e: Exception) -> None:
        """``dep``'s own Warning event, once per distinct failure."""
        reason = ("PoolObjectNotOwned" if isinstance(e, NotOwned) else
                  "PoolPlanRefused" if isinstance(e, SpecError) else "PoolPlanFailed")
        msg = f"cfnet did not write the {flavour} pool object: {e}"
        if self.failed.get(key) != msg:
            self.failed[key] = msg
            log.warning("%s: %s", obj_key(dep), msg)
            self.event(dep, reason, "Warning", msg)

    def write(self, key: Key, app: PoolApp, plan: PoolPlan) -> int:
        """The sink's writer: the object for ``plan`` if it changed (1), nothing to write (0),
        or a failed write, retried on the next step (-1)."""
        dep = app.deployment
        flavour = plan.flavour
        obj_digest = self.digest(dep, flavour, plan)
        if self.written.get(key) == (flavour, obj_digest):
            return 0
        try:
            apply_pool_plan(self.client, dep, plan,
                            plan_note(plan, "", digest(template_digest(dep))))
        except NotOwned as e:
            self.refused(dep, key, flavour, e)
            return 0  # tried again at the next resync
        except KubeError as e:
            log.warning("writing the %s object for %s failed: %s", flavour, obj_key(dep), e)
            return -1
        self.failed.pop(key, None)
        old = self.written.get(key)
        if old is not None and old[0] != flavour:
            self.delete(key, old[0])
        self.written[key] = (flavour, obj_digest)
        self.owner[key] = str((dep.get("metadata") or {}).get("uid") or "")
        self.plans[obj_key(dep)] = plan
        self.event(dep, "PoolPlan", "Normal",
                    f"cfnet placed {plan.placed}/{plan.replicas} replicas per pool "
                    f"({flavour}): " + (", ".join(f"{p} {n}" for p, n in
                                                  plan.per_pool.items()) or "none")
                    + (f"; {len(plan.unplaced)} unplaced: "
                       f"{next(iter(plan.unplaced.values()))}" if plan.unplaced else ""))
        if not (dep.get("spec") or {}).get("paused") and obj_key(dep) not in self.warned:
            self.warned.add(obj_key(dep))
            self.event(dep, "PoolModeNotPaused", "Warning",
                        "pool-mode Deployment is not paused: its own ReplicaSet runs "
                        "replicas too; set spec.paused: true to use it as a template only")
        return 1

    def delete(self, key: tuple[str, str], flavour: str) -> None:
        """Delete the pool object cfnet wrote for ``key``, only if it still is cfnet's (its
        label and an ownerReference to the Deployment it was written for), with the uid and
        resourceVersion read as preconditions: never an object that changed hands."""
        path = pool_path(flavour, *key)
        try:
            live = self.client.get(path)
            lmd = live.get("metadata") or {}
            if owned_by(live, {"metadata": {"uid": self.owner.get(key)}}):
                self.client.request("DELETE", path, body={
                    "apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {
                        "uid": lmd.get("uid"), "resourceVersion": lmd.get("resourceVersion")}})
            else:
                log.warning("not deleting %s: it is not the object cfnet wrote", path)
        except KubeNotFound:
            pass
        except KubeError as e:
            log.warning("deleting the %s object %s/%s failed: %s", flavour, *key, e)
            return
        self.written.pop(key, None)
        self.owner.pop(key, None)
        self.failed.pop(key, None)
        self.plans.pop("/".join(key), None)

    def event(self, dep: JSON, reason: str, event_type: str, message: str) -> None:
        obj = {**dep, "apiVersion": "apps/v1", "kind": "Deployment"}
        try:
            self.client.emit_event(obj, reason=reason, message=message, event_type=event_type,
                                   instance=self.identity())
        except KubeError as e:
            log.warning("%s event for %s lost: %s", reason, obj_key(dep), e)

