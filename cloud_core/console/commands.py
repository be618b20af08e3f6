"""The console's commands: what each one reads or changes, the role it needs, its bounds.

Each command is a handler registered here by name (:data:`REGISTRY`), with the least role
that may run it and the bounds of its arguments beside it. The commands about where
workloads run (``nodes``, ``workloads``, ``placements``, ``explain``, ``what-if``,
``submit``, ``delete``, ``cordon``, ``uncordon``, ``drain``) answer through the context's
:class:`~cloud_core.console.context.Cluster`: the local core's
(:mod:`cloud_core.console.local`) or the Kubernetes cluster's
(:mod:`cloud_core.k8s.console`). ``links``, ``events``, ``stats``, ``received``,
``topology``'s links and ``audit`` are the core's own, the same in both modes.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from cloud_core.console.context import ConsoleContext
from cloud_core.console.registry import (
    MAX_SUBMIT,
    Bounds,
    Command,
    CommandError,
    CommandRegistry,
    jsonable,
    node_arg,
)
from cloud_core.state import SEQ_HISTORY
from cloud_core.view import link_rows
from edge_agent.wire import seq_ranges

EVENTS_LIMIT = (1, 2000)
AUDIT_LIMIT = (1, 1000)
NODE = Bounds(names=("node",))
WORKLOAD = Bounds(names=("workload", "namespace"))
SPECS = Bounds(specs=MAX_SUBMIT)

REGISTRY = CommandRegistry()
command = REGISTRY.command


@command("nodes", help="nodes, health, region, load")
def nodes(ctx: ConsoleContext, op: str, args: dict[str, Any]) -> Any:
    return ctx.cluster.nodes()


@command("links", bounds=NODE, help="measured links")
def links(ctx: ConsoleContext, op: str, args: dict[str, Any]) -> Any:
    node = args.get("node")
    s = ctx.snapshot()
    if node is not None and (not isinstance(node, str) or node not in s.nodes):
        raise CommandError(f"no node {node!r}; `cfnetctl nodes` lists them")
    return link_rows(s, node)


@command("workloads", bounds=Bounds(paged=True), help="workloads and their state")
def workloads(ctx: ConsoleContext, op: str, args: dict[str, Any]) -> Any:
    # paged (offset, limit, total): a listing of thousands would not fit one answer
    return ctx.cluster.workloads(args)


@command("placements", help="node -> workloads")
def placements(ctx: ConsoleContext, op: str, args: dict[str, Any]) -> Any:
    return ctx.cluster.placements()


@command("explain", bounds=WORKLOAD, help="why a workload is where it is")
def explain(ctx: ConsoleContext, op: str, args: dict[str, Any]) -> Any:
    return ctx.cluster.explain(args)


@command("events", bounds=Bounds(limit=EVENTS_LIMIT), help="recent events")
def events(ctx: ConsoleContext, op: str, args: dict[str, Any]) -> Any:
    return [jsonable(e) for e in ctx.events.recent(args.get("limit", 50))]


@command("stats", help="ingest counters")
def stats(ctx: ConsoleContext, op: str, args: dict[str, Any]) -> Any:
    c = ctx.ingest.counters()
    s = ctx.snapshot()
    return {"accepted": c.accepted, "duplicates": c.duplicates, "statuses": c.statuses,
            "rejected": c.rejected, "nodes": len(s.nodes), "links": len(s.links)}


@command("received", bounds=NODE,
         help="a node's reports this core folded in (seq ranges per boot)")
def received(ctx: ConsoleContext, op: str, args: dict[str, Any]) -> Any:
    # What this core folded in from one node since it started (bounded by the state's
    # history), as seq ranges per boot: how an operator -- or a test -- checks that a
    # replay after an outage arrived, and once.
    node = node_arg(args, lambda: set(ctx.snapshot().nodes))
    per_boot: dict[str, list[int]] = {}
    for boot, seq in ctx.state.node_history(node):
        per_boot.setdefault(boot, []).append(seq)
    return {"node": node, "history_limit": SEQ_HISTORY, "boots": [
        {"boot": b, "count": len(seqs), "distinct": len(set(seqs)),
         "seqs": [list(r) for r in seq_ranges(seqs)]} for b, seqs in per_boot.items()]}


@command("topology", help="everything `map` and `top` draw")
def topology(ctx: ConsoleContext, op: str, args: dict[str, Any]) -> Any:
    return {"nodes": ctx.cluster.nodes(), "links": link_rows(ctx.snapshot()),
            "placements": ctx.cluster.placements(), "generated": ctx.clock(),
            "id": uuid.uuid4().hex[:8]}


@command("what-if", bounds=SPECS, help="the engine's answer, without acting")
def what_if(ctx: ConsoleContext, op: str, args: dict[str, Any]) -> Any:
    return ctx.cluster.what_if(args["specs"])


@command("submit", role="operator", bounds=SPECS, help="submit workloads")
def submit(ctx: ConsoleContext, op: str, args: dict[str, Any]) -> Any:
    return ctx.cluster.submit(op, args["specs"])


@command("delete", role="operator", bounds=WORKLOAD, help="delete a workload")
def delete(ctx: ConsoleContext, op: str, args: dict[str, Any]) -> Any:
    return ctx.cluster.delete(op, args)


@command("cordon", role="operator", bounds=NODE, help="stop placing on a node")
def cordon(ctx: ConsoleContext, op: str, args: dict[str, Any]) -> Any:
    return ctx.cluster.cordon(op, args)


@command("uncordon", role="operator", bounds=NODE, help="allow placing on a node again")
def uncordon(ctx: ConsoleContext, op: str, args: dict[str, Any]) -> Any:
    return ctx.cluster.uncordon(op, args)


@command("drain", role="operator", bounds=NODE, help="cordon and move workloads off a node")
def drain(ctx: ConsoleContext, op: str, args: dict[str, Any]) -> Any:
    return ctx.cluster.drain(op, args)


@command("audit", role="admin", bounds=Bounds(limit=AUDIT_LIMIT), help="the audit log")
def audit(ctx: ConsoleContext, op: str, args: dict[str, Any]) -> Any:
    return ctx.audit_log(args.get("limit", 100))


#: Every console command, by name.
COMMANDS: Mapping[str, Command] = REGISTRY.commands
