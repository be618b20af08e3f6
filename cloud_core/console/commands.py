"""The console's commands: what each one reads or changes, and the role it needs."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from typing import Any

from cloud_core.console.service import CommandError, ConsoleService, jsonable, paged
from cloud_core.errors import CoreError
from cloud_core.events import EventLog
from cloud_core.health import HealthConfig
from cloud_core.ingest import Ingest
from cloud_core.placement import Workload
from cloud_core.registry import Registry
from cloud_core.scheduler import Scheduler, expand_doc
from cloud_core.state import SEQ_HISTORY, ClusterState
from cloud_core.store import Store
from cloud_core.view import link_rows, node_rows
from edge_agent.wire import seq_ranges

MAX_SUBMIT = 1000  # workloads per request, replicas counted
MAX_DOC_BYTES = 32 * 1024  # JSON of one workload document; a Pod spec needs far less


def _specs(args: dict[str, Any]) -> list[tuple[dict[str, Any], Workload]]:
    raw = args.get("specs")
    if not isinstance(raw, list) or not raw:
        raise CommandError("expected 'specs': a non-empty list of workload documents")
    if len(raw) > MAX_SUBMIT:
        raise CommandError(f"at most {MAX_SUBMIT} workloads per request")
    out: list[tuple[dict[str, Any], Workload]] = []
    for i, doc in enumerate(raw):
        if not isinstance(doc, dict):
            raise CommandError(f"document {i + 1}: must be a mapping")
        size = len(json.dumps(doc))
        if size > MAX_DOC_BYTES:
            raise CommandError(f"document {i + 1}: {size} bytes, more than the "
                               f"{MAX_DOC_BYTES} one workload document may have")
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


def _node_arg(args: dict[str, Any], known: Callable[[], set[str]]) -> str:
    node = args.get("node")
    if not isinstance(node, str) or not node:
        raise CommandError("expected a node name")
    if node not in known():
        raise CommandError(f"no node {node!r}; `cfnetctl nodes` lists them")
    return node


def register_commands(
    console: ConsoleService,
    *,
    state: ClusterState,
    ingest: Ingest,
    store: Store,
    scheduler: Scheduler,
    events: EventLog,
    registry: Registry,
    health_config: HealthConfig,
    clock: Callable[[], float] = time.time,
) -> None:
    def snap() -> Any:
        return state.snapshot(clock())

    def known_nodes() -> set[str]:
        return set(snap().nodes) | set(registry.nodes)

    def nodes(op: str, args: dict[str, Any]) -> Any:
        rows = node_rows(snap(), health_config)
        cordoned = store.cordoned()
        by_name = {r["node"]: r for r in rows}
        for name in registry.nodes:
            by_name.setdefault(name, {"node": name, "health": "unknown", "probe": "-",
                                      "cpu_util": None, "cpu_cores": None, "mem_used_bytes": None,
                                      "mem_total_bytes": None, "gpus": 0, "age_s": None,
                                      "reports": 0, "buffered": 0, "dropped": 0, "addresses": []})
        placed = store.placements()
        for name, r in by_name.items():
            f = registry.facts(name).info
            r.update(region=f.region, zone=f.zone, security_level=f.security_level,
                     cordoned=name in cordoned, workloads=len(placed.get(name, [])))
        return [by_name[k] for k in sorted(by_name)]

    def links(op: str, args: dict[str, Any]) -> Any:
        node = args.get("node")
        s = snap()
        if node is not None and node not in s.nodes:
            raise CommandError(f"no node {node!r}; `cfnetctl nodes` lists them")
        return link_rows(s, node)

    def workloads(op: str, args: dict[str, Any]) -> Any:
        # optional paging: a listing of thousands would not fit one answer
        now = clock()
        return paged(store.workloads(), args, lambda r: {
            "uid": r.uid, "name": r.name, "namespace": r.namespace, "state": r.state,
            "node": r.node, "reason": r.reason, "age_s": now - r.created})

    def placements(op: str, args: dict[str, Any]) -> Any:
        return store.placements()

    def find(args: dict[str, Any]) -> str:
        name = args.get("workload")
        if not isinstance(name, str) or not name:
            raise CommandError("expected a workload name or UID")
        rows = store.find(name, args.get("namespace"))
        if not rows:
            raise CommandError(f"no workload {name!r}; `cfnetctl workloads` lists them")
        if len(rows) > 1:
            raise CommandError(f"{name!r} is ambiguous: " + ", ".join(
                f"{r.namespace}/{r.name} ({r.uid})" for r in rows) + "; give the UID")
        return rows[0].uid

    def explain_cmd(op: str, args: dict[str, Any]) -> Any:
        uid = find(args)
        try:
            return jsonable(scheduler.explain(uid))
        except CoreError as exc:
            raise CommandError(str(exc)) from exc

    def submit(op: str, args: dict[str, Any]) -> Any:
        out = []
        for spec, w in _specs(args):
            new = store.submit(w.uid, w.name, w.namespace, spec)
            # uid and result only: a 1000-replica answer must fit one message
            out.append({"uid": w.uid, "result": "submitted" if new else "exists"})
            if new:
                events.emit("console", f"{op} submitted {w.namespace}/{w.name}", workload=w.uid)
        return out

    def delete(op: str, args: dict[str, Any]) -> Any:
        uid = find(args)
        row = store.delete(uid)
        events.emit("console", f"{op} deleted {uid}", workload=uid)
        return {"uid": uid, "was_on": row.node if row else None}

    def what_if(op: str, args: dict[str, Any]) -> Any:
        ws = [w for _spec, w in _specs(args)]
        result = scheduler.what_if(ws)
        return {
            "decisions": [jsonable(d) for d in result.decisions],
            "total_cost": result.total_cost,
            "solver": result.solver,
        }

    def cordon(op: str, args: dict[str, Any]) -> Any:
        node = _node_arg(args, known_nodes)
        changed = store.cordon(node, op)
        if changed:
            events.emit("console", f"{op} cordoned {node}", node=node, severity="warning")
        return {"node": node, "cordoned": True, "changed": changed}

    def uncordon(op: str, args: dict[str, Any]) -> Any:
        node = _node_arg(args, known_nodes)
        changed = store.uncordon(node, op)
        if changed:
            events.emit("console", f"{op} uncordoned {node}", node=node)
        return {"node": node, "cordoned": False, "changed": changed}

    def drain(op: str, args: dict[str, Any]) -> Any:
        node = _node_arg(args, known_nodes)
        store.cordon(node, op)
        moved = []
        with scheduler.lock:
            for uid in store.placements().get(node, []):
                if store.requeue(uid, f"drained from {node} by {op}"):
                    moved.append(uid)
        events.emit("console", f"{op} drained {node}: {len(moved)} workloads requeued",
                    node=node, severity="warning")
        return {"node": node, "requeued": moved}

    def events_cmd(op: str, args: dict[str, Any]) -> Any:
        limit = args.get("limit", 50)
        if not isinstance(limit, int) or not 1 <= limit <= 2000:
            raise CommandError("limit must be an integer within 1..2000")
        return [jsonable(e) for e in events.recent(limit)]

    def stats(op: str, args: dict[str, Any]) -> Any:
        c = ingest.counters()
        s = snap()
        return {"accepted": c.accepted, "duplicates": c.duplicates, "statuses": c.statuses,
                "rejected": c.rejected, "nodes": len(s.nodes), "links": len(s.links)}

    def received(op: str, args: dict[str, Any]) -> Any:
        # What this core folded in from one node since it started (bounded by
        # the state's history), as seq ranges per boot: how an operator -- or
        # a test -- checks that a replay after an outage arrived, and once.
        node = _node_arg(args, lambda: set(snap().nodes))
        per_boot: dict[str, list[int]] = {}
        for boot, seq in state.node_history(node):
            per_boot.setdefault(boot, []).append(seq)
        return {"node": node, "history_limit": SEQ_HISTORY, "boots": [
            {"boot": b, "count": len(seqs), "distinct": len(set(seqs)),
             "seqs": [list(r) for r in seq_ranges(seqs)]} for b, seqs in per_boot.items()]}

    def topology(op: str, args: dict[str, Any]) -> Any:
        return {"nodes": nodes(op, args), "links": link_rows(snap()),
                "placements": store.placements(), "generated": clock(),
                "id": uuid.uuid4().hex[:8]}

    def audit(op: str, args: dict[str, Any]) -> Any:
        limit = args.get("limit", 100)
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 1000:
            raise CommandError("limit must be an integer within 1..1000")
        return store.audit_log(limit)

    c = console.register
    c("nodes", nodes, help="nodes, health, region, load")
    c("links", links, help="measured links")
    c("workloads", workloads, help="workloads and their state")
    c("placements", placements, help="node -> workloads")
    c("explain", explain_cmd, help="why a workload is where it is")
    c("events", events_cmd, help="recent events")
    c("stats", stats, help="ingest counters")
    c("received", received, help="a node's reports this core folded in (seq ranges per boot)")
    c("topology", topology, help="everything `map` and `top` draw")
    c("what-if", what_if, help="the engine's answer, without acting")
    c("submit", submit, help="submit workloads")
    c("delete", delete, help="delete a workload")
    c("cordon", cordon, help="stop placing on a node")
    c("uncordon", uncordon, help="allow placing on a node again")
    c("drain", drain, help="cordon and move workloads off a node")
    c("audit", audit, help="the audit log")
