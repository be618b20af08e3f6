"""The console's cluster in local mode: the core's store, node registry and scheduler.

The :class:`~cloud_core.console.context.Cluster` of a core without Kubernetes: workloads
are the store's (submitted through the console), nodes are those that report and those the
YAML registry names, and cordon / drain are the store's (the local loop reads them).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from cloud_core.console.registry import MAX_SUBMIT, CommandError, jsonable, node_arg, paged
from cloud_core.errors import CoreError
from cloud_core.events import EventLog
from cloud_core.health import HealthConfig
from cloud_core.placement import Workload
from cloud_core.registry import Registry
from cloud_core.scheduler import Scheduler, expand_doc
from cloud_core.state import ClusterState, StateSnapshot
from cloud_core.store import Store
from cloud_core.view import node_rows


def expand_specs(raw: list[dict[str, Any]]) -> list[tuple[dict[str, Any], Workload]]:
    """Workload documents (within the command's bounds) expanded to workloads: at most
    ``MAX_SUBMIT``, each UID once."""
    out: list[tuple[dict[str, Any], Workload]] = []
    for i, doc in enumerate(raw):
        try:
            # each document expands to at most spec.MAX_EXPAND workloads (checked before
            # expanding), and the running total stops the loop as soon as it is over
            out.extend(expand_doc(doc))
        except CoreError as exc:
            raise CommandError(f"document {i + 1}: {exc}") from exc
        if len(out) > MAX_SUBMIT:
            raise CommandError(f"at most {MAX_SUBMIT} workloads per request")
    uids = [w.uid for _s, w in out]
    if len(set(uids)) != len(uids):
        raise CommandError("two documents describe the same workload UID")
    return out


class LocalCluster:
    """Where workloads run without Kubernetes (see the module docstring)."""

    def __init__(self, *, state: ClusterState, store: Store, scheduler: Scheduler,
                 events: EventLog, registry: Registry, health_config: HealthConfig,
                 clock: Callable[[], float] = time.time) -> None:
        self.state = state
        self.store = store
        self.scheduler = scheduler
        self.events = events
        self.registry = registry
        self.health_config = health_config
        self.clock = clock

    def _snap(self) -> StateSnapshot:
        return self.state.snapshot(self.clock())

    def _known_nodes(self) -> set[str]:
        return set(self._snap().nodes) | set(self.registry.nodes)

    def nodes(self) -> list[dict[str, Any]]:
        rows = node_rows(self._snap(), self.health_config)
        cordoned = self.store.cordoned()
        by_name = {r["node"]: r for r in rows}
        for name in self.registry.nodes:
            by_name.setdefault(name, {"node": name, "health": "unknown", "probe": "-",
                                      "cpu_util": None, "cpu_cores": None, "mem_used_bytes": None,
                                      "mem_total_bytes": None, "gpus": 0, "age_s": None,
                                      "reports": 0, "buffered": 0, "dropped": 0, "addresses": []})
        placed = self.store.placements()
        for name, r in by_name.items():
            f = self.registry.facts(name).info
            r.update(region=f.region, zone=f.zone, security_level=f.security_level,
                     cordoned=name in cordoned, workloads=len(placed.get(name, [])))
        return [by_name[k] for k in sorted(by_name)]

    def workloads(self, args: dict[str, Any]) -> Any:
        now = self.clock()
        return paged(self.store.workloads(), args, lambda r: {
            "uid": r.uid, "name": r.name, "namespace": r.namespace, "state": r.state,
            "node": r.node, "reason": r.reason, "age_s": now - r.created})

    def placements(self) -> dict[str, list[str]]:
        return self.store.placements()

    def _find(self, args: dict[str, Any]) -> str:
        name = args.get("workload")
        if not isinstance(name, str) or not name:
            raise CommandError("expected a workload name or UID")
        rows = self.store.find(name, args.get("namespace"))
        if not rows:
            raise CommandError(f"no workload {name!r}; `cfnetctl workloads` lists them")
        if len(rows) > 1:
            raise CommandError(f"{name!r} is ambiguous: " + ", ".join(
                f"{r.namespace}/{r.name} ({r.uid})" for r in rows) + "; give the UID")
        return rows[0].uid

    def explain(self, args: dict[str, Any]) -> Any:
        uid = self._find(args)
        try:
            return jsonable(self.scheduler.explain(uid))
        except CoreError as exc:
            raise CommandError(str(exc)) from exc

    def what_if(self, specs: list[dict[str, Any]]) -> Any:
        result = self.scheduler.what_if([w for _spec, w in expand_specs(specs)])
        return {
            "decisions": [jsonable(d) for d in result.decisions],
            "total_cost": result.total_cost,
            "solver": result.solver,
        }

    def submit(self, op: str, specs: list[dict[str, Any]]) -> Any:
        out = []
        for spec, w in expand_specs(specs):
            new = self.store.submit(w.uid, w.name, w.namespace, spec)
            # uid and result only: a 1000-replica answer must fit one message
            out.append({"uid": w.uid, "result": "submitted" if new else "exists"})
            if new:
                self.events.emit("console", f"{op} submitted {w.namespace}/{w.name}",
                                 workload=w.uid)
        return out

    def delete(self, op: str, args: dict[str, Any]) -> Any:
        uid = self._find(args)
        row = self.store.delete(uid)
        self.events.emit("console", f"{op} deleted {uid}", workload=uid)
        return {"uid": uid, "was_on": row.node if row else None}

    def cordon(self, op: str, args: dict[str, Any]) -> Any:
        node = node_arg(args, self._known_nodes)
        changed = self.store.cordon(node, op)
        if changed:
            self.events.emit("console", f"{op} cordoned {node}", node=node, severity="warning")
        return {"node": node, "cordoned": True, "changed": changed}

    def uncordon(self, op: str, args: dict[str, Any]) -> Any:
        node = node_arg(args, self._known_nodes)
        changed = self.store.uncordon(node, op)
        if changed:
            self.events.emit("console", f"{op} uncordoned {node}", node=node)
        return {"node": node, "cordoned": False, "changed": changed}

    def drain(self, op: str, args: dict[str, Any]) -> Any:
        node = node_arg(args, self._known_nodes)
        self.store.cordon(node, op)
        moved = []
        with self.scheduler.lock:
            for uid in self.store.placements().get(node, []):
                if self.store.requeue(uid, f"drained from {node} by {op}"):
                    moved.append(uid)
        self.events.emit("console", f"{op} drained {node}: {len(moved)} workloads requeued",
                         node=node, severity="warning")
        return {"node": node, "requeued": moved}
