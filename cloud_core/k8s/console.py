"""The console in Kubernetes mode: commands answer from, and act on, what the loop decides on.

In ``cfnet-core --kubernetes`` the loop's source of truth is the cluster (informers and the
Node registry), not the SQLite store and the YAML registry. So the commands that read or
change placements are replaced here by ones that use the Kubernetes actuator's snapshot and
the API server:

* ``nodes``, ``workloads``, ``placements``, ``topology``: the cluster snapshot and cfnet's pods;
* ``explain`` and ``what-if``: the engine on that same snapshot;
* ``cordon`` / ``uncordon``: ``spec.unschedulable`` on the Node; ``drain``: cordon, then evict
  cfnet's pods on the node through the Eviction API (PodDisruptionBudgets honoured), never
  those ``evict.move_exclusion`` keeps (DaemonSet, mirror/static, system-critical, kube-system,
  local storage, no controller: listed as ``not_evictable``). When the core's role lacks the
  verb the command is refused, naming the kubectl equivalent;
* ``submit`` / ``delete``: refused, naming the kubectl equivalent: on Kubernetes a workload is
  an object the user owns (a Deployment, StatefulSet, Job or Pod with
  ``schedulerName: cfnet-scheduler``); the core places it, it does not create it.

No command reports success on state the loop ignores. ``links``, ``events``, ``stats`` and
``audit`` are the same in both modes (measured links and events are the core's own).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from cloud_core.console.service import CommandError, ConsoleService, jsonable, paged
from cloud_core.errors import CoreError, KubeError, KubeForbidden, KubeNotFound
from cloud_core.events import EventLog
from cloud_core.k8s.actuator import Actuator
from cloud_core.k8s.client import KubeClient
from cloud_core.k8s.evict import move_exclusion
from cloud_core.k8s.informer import obj_key
from cloud_core.loop import what_if as engine_answer
from cloud_core.placement import explain, parse_workload_yaml
from cloud_core.placement.model import Health
from cloud_core.placement.relax import explain_extras

MAX_WHAT_IF = 1000


def register_kubernetes_commands(console: ConsoleService, actuator: Actuator,
                                 client: KubeClient, events: EventLog,
                                 clock: Callable[[], float] = time.time,
                                 agent_probes: Callable[[], Mapping[str, str]] | None = None
                                 ) -> None:
    """Replace the store-backed commands with cluster-backed ones (see the module docstring).
    ``agent_probes``: Node name -> the probe its agent reports with (``ebpf``, ``sock_diag``),
    shown by ``nodes`` as in local mode ("-": no report from that node's agent)."""
    sched = actuator.config.scheduler_name

    def cfnet_pods() -> list[dict[str, Any]]:
        return [p for p in actuator.pods.items()
                if (p.get("spec") or {}).get("schedulerName") == sched]

    def node_arg(args: dict[str, Any]) -> str:
        node = args.get("node")
        if not isinstance(node, str) or not node:
            raise CommandError("expected a node name")
        if actuator.registry.get(node) is None:
            raise CommandError(f"no Node {node!r} in the cluster; `cfnetctl nodes` lists them")
        return node

    def placements(op: str = "", args: dict[str, Any] | None = None) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for p in cfnet_pods():
            node = (p.get("spec") or {}).get("nodeName")
            if node and not (p.get("metadata") or {}).get("deletionTimestamp"):
                out.setdefault(str(node), []).append(obj_key(p))
        return {k: sorted(v) for k, v in sorted(out.items())}

    def nodes(op: str, args: dict[str, Any]) -> Any:
        snap = actuator.snapshot()
        placed = placements()
        probes = agent_probes() if agent_probes is not None else {}
        return [{"node": n.name, "region": n.region, "zone": n.zone,
                 "security_level": n.security_level, "health": str(n.health),
                 "probe": probes.get(n.name) or "-",
                 "cordoned": n.health == Health.CORDONED,
                 "cpu_milli": n.capacity.cpu_milli, "cpu_allocated": n.allocated.cpu_milli,
                 "mem_bytes": n.capacity.mem_bytes, "mem_allocated": n.allocated.mem_bytes,
                 "workloads": len(placed.get(n.name, []))} for n in snap.nodes]

    def workloads(op: str, args: dict[str, Any]) -> Any:
        def row(p: dict[str, Any]) -> dict[str, Any]:
            md, spec = p.get("metadata") or {}, p.get("spec") or {}
            state = ("terminating" if md.get("deletionTimestamp") else
                     "bound" if spec.get("nodeName") else "pending")
            return {"uid": md.get("uid"), "name": md.get("name"),
                    "namespace": md.get("namespace"), "state": state,
                    "node": spec.get("nodeName"),
                    "reason": actuator.last_failure(str(md.get("uid")))}

        def key(p: dict[str, Any]) -> tuple[str, str]:
            md = p.get("metadata") or {}
            return str(md.get("namespace")), str(md.get("name"))

        # paged as in local mode (offset, limit, total): thousands of pods don't fit one answer
        return paged(sorted(cfnet_pods(), key=key), args, row)

    def find(args: dict[str, Any]) -> dict[str, Any]:
        name = args.get("workload")
        if not isinstance(name, str) or not name:
            raise CommandError("expected a pod name, namespace/name or UID")
        ns = args.get("namespace")
        if "/" in name and ns is None:
            ns, name = name.split("/", 1)
        hits = [p for p in cfnet_pods()
                if (p["metadata"].get("uid") == name or p["metadata"].get("name") == name)
                and (ns is None or p["metadata"].get("namespace") == ns)]
        if not hits:
            raise CommandError(f"no cfnet pod {name!r}; `cfnetctl workloads` lists them")
        if len(hits) > 1:
            raise CommandError(f"{name!r} is ambiguous: "
                               + ", ".join(obj_key(p) for p in hits) + "; give namespace/name")
        return hits[0]

    def explain_cmd(op: str, args: dict[str, Any]) -> Any:
        pod = find(args)
        w = actuator.parse(pod)
        if w is None:
            raise CommandError(f"{obj_key(pod)}: its spec is not one the engine can read")
        node = (pod.get("spec") or {}).get("nodeName")
        snap = actuator.snapshot(exclude=frozenset({w.uid}))
        try:
            ex = explain(snap, w, actuator.config.engine_config, node=node)
        except CoreError as exc:
            raise CommandError(str(exc)) from exc
        extras = (explain_extras(snap, w, node, actuator.config.engine_config)
                  if node or not ex.fit else {})
        return jsonable({"workload": obj_key(pod), "uid": w.uid,
                          "state": "bound" if node else "pending", "node": node,
                          "reason": actuator.last_failure(w.uid), "explanation": ex,
                          **extras})

    def what_if(op: str, args: dict[str, Any]) -> Any:
        raw = args.get("specs")
        if not isinstance(raw, list) or not raw:
            raise CommandError("expected 'specs': a non-empty list of workload documents")
        ws = []
        for i, doc in enumerate(raw[:MAX_WHAT_IF + 1]):
            if not isinstance(doc, dict):
                raise CommandError(f"document {i + 1}: must be a mapping")
            try:
                ws.extend(parse_workload_yaml(json.dumps(doc)))
            except CoreError as exc:
                raise CommandError(f"document {i + 1}: {exc}") from exc
            if len(ws) > MAX_WHAT_IF:
                raise CommandError(f"at most {MAX_WHAT_IF} workloads per request")
        result = engine_answer(actuator.snapshot(), ws, actuator.config.engine_config)
        return {"decisions": [jsonable(d) for d in result.decisions],
                "total_cost": result.total_cost, "solver": result.solver}

    def submit(op: str, args: dict[str, Any]) -> Any:
        raise CommandError(
            "refused: in Kubernetes mode cfnet places the workloads the cluster runs and does "
            "not create them; create a Pod, Deployment, StatefulSet or Job with "
            "`schedulerName: cfnet-scheduler` with `kubectl apply -f <file>`")

    def delete(op: str, args: dict[str, Any]) -> Any:
        pod = find(args)
        md = pod.get("metadata") or {}
        owner = next((o for o in md.get("ownerReferences") or [] if o.get("controller")), None)
        what = (f"its {owner.get('kind')} ({owner.get('name')}), e.g. `kubectl delete "
                f"{str(owner.get('kind')).lower()} -n {md.get('namespace')} "
                f"{owner.get('name')}`" if owner else
                f"`kubectl delete pod -n {md.get('namespace')} {md.get('name')}`")
        raise CommandError(f"refused: in Kubernetes mode the user owns {obj_key(pod)}; "
                           f"delete {what}")

    def set_unschedulable(op: str, node: str, value: bool) -> bool:
        before = actuator.registry.get(node)
        was = before is not None and before.health == Health.CORDONED
        try:
            obj = client.patch(f"/api/v1/nodes/{node}", {"spec": {"unschedulable": value}})
        except KubeForbidden as exc:
            verb = "cordon" if value else "uncordon"
            raise CommandError(
                f"refused: the core's Kubernetes role may not patch nodes ({exc.status}); "
                f"grant `nodes: patch` or run `kubectl {verb} {node}`") from exc
        except KubeNotFound as exc:
            raise CommandError(f"no Node {node!r} in the cluster") from exc
        except KubeError as exc:
            raise CommandError(f"the API server did not take it: {exc}") from exc
        # The loop must not bind there from the very next step, before the watch catches up.
        actuator.node_changed(obj)
        changed = was != value
        if changed:
            events.emit("console", f"{op} {'cordoned' if value else 'uncordoned'} Node {node}",
                        node=node, severity="warning" if value else "info")
        return changed

    def cordon(op: str, args: dict[str, Any]) -> Any:
        node = node_arg(args)
        return {"node": node, "cordoned": True, "changed": set_unschedulable(op, node, True),
                "unschedulable": True}

    def uncordon(op: str, args: dict[str, Any]) -> Any:
        node = node_arg(args)
        return {"node": node, "cordoned": False, "changed": set_unschedulable(op, node, False),
                "unschedulable": False}

    def drain(op: str, args: dict[str, Any]) -> Any:
        node = node_arg(args)
        set_unschedulable(op, node, True)
        evicted: list[str] = []
        blocked: list[str] = []
        refused: list[str] = []
        kept: list[str] = []
        for p in cfnet_pods():
            md = p.get("metadata") or {}
            if (p.get("spec") or {}).get("nodeName") != node or md.get("deletionTimestamp"):
                continue
            # the descheduler's DefaultEvictor defaults, and no pod that nothing recreates
            why = move_exclusion(p, actuator.config.eviction)
            if why is not None:
                kept.append(f"{obj_key(p)}: {why}")
                continue
            try:
                ok = client.evict_pod(str(md.get("namespace")), str(md.get("name")),
                                      str(md.get("uid")))
            except KubeForbidden as exc:
                raise CommandError(
                    f"refused: the core's Kubernetes role may not evict pods ({exc.status}); "
                    f"Node {node} is cordoned; run `kubectl drain {node}`") from exc
            except KubeNotFound:
                continue
            except KubeError as exc:
                refused.append(f"{obj_key(p)}: {exc}")
                continue
            (evicted if ok else blocked).append(obj_key(p))
        others = sum(1 for p in actuator.pods.items()
                     if (p.get("spec") or {}).get("nodeName") == node
                     and (p.get("spec") or {}).get("schedulerName") != sched)
        events.emit("console", f"{op} drained Node {node}: {len(evicted)} evicted, "
                    f"{len(blocked)} held by a PodDisruptionBudget", node=node,
                    severity="warning")
        return {"node": node, "evicted": evicted, "blocked_by_budget": blocked,
                "failed": refused, "not_evictable": kept, "other_schedulers_pods_left": others,
                "note": "pods of other schedulers are left; `kubectl drain` evicts them too"
                if others else ""}

    def topology(op: str, args: dict[str, Any]) -> Any:
        links_cmd = console.commands.get("links")  # measured links: the same in both modes
        link_data = links_cmd.handler(op, {}) if links_cmd else []
        return {"nodes": nodes(op, args), "links": link_data, "placements": placements(),
                "generated": clock(), "id": uuid.uuid4().hex[:8]}

    c = console.register
    c("nodes", nodes, help="Nodes of the cluster, health, region, allocation")
    c("workloads", workloads, help="cfnet's pods and their state")
    c("placements", placements, help="Node -> cfnet pods")
    c("explain", explain_cmd, help="why a pod is where it is (cluster snapshot)")
    c("what-if", what_if, help="the engine's answer on the cluster snapshot, without acting")
    c("topology", topology, help="everything `map` and `top` draw")
    c("submit", submit, help="refused on Kubernetes: kubectl apply")
    c("delete", delete, help="refused on Kubernetes: kubectl delete")
    c("cordon", cordon, help="spec.unschedulable on the Node")
    c("uncordon", uncordon, help="clear spec.unschedulable")
    c("drain", drain, help="cordon, then evict cfnet's pods on the Node")
