"""The console in Kubernetes mode: commands answer from, and act on, what the loop decides on.

In ``cfnet-core --kubernetes`` the loop's source of truth is the cluster (informers and the
Node registry), not the SQLite store and the YAML registry. So the commands that read or
change placements answer here, through :class:`KubernetesCluster` (the console context's
:class:`~cloud_core.console.context.Cluster` in this mode), from the Kubernetes actuator's
snapshot and the API server:

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
from collections.abc import Callable, Mapping
from typing import Any

from cloud_core.console.registry import MAX_SUBMIT, CommandError, jsonable, paged
from cloud_core.errors import CoreError, KubeError, KubeForbidden, KubeNotFound
from cloud_core.events import EventLog
from cloud_core.k8s.actuator import Actuator
from cloud_core.k8s.budgets import BudgetReader
from cloud_core.k8s.client import KubeClient
from cloud_core.k8s.evict import move_exclusion
from cloud_core.k8s.informer import obj_key
from cloud_core.loop import what_if as engine_answer
from cloud_core.placement import explain, parse_workload_yaml
from cloud_core.placement.model import Health
from cloud_core.placement.relax import explain_extras


def _pod_row(actuator: Actuator, p: dict[str, Any]) -> dict[str, Any]:
    md, spec = p.get("metadata") or {}, p.get("spec") or {}
    state = ("terminating" if md.get("deletionTimestamp") else
             "bound" if spec.get("nodeName") else "pending")
    return {"uid": md.get("uid"), "name": md.get("name"),
            "namespace": md.get("namespace"), "state": state,
            "node": spec.get("nodeName"),
            "reason": actuator.last_failure(str(md.get("uid")))}


def _ns_name(p: dict[str, Any]) -> tuple[str, str]:
    md = p.get("metadata") or {}
    return str(md.get("namespace")), str(md.get("name"))


class KubernetesCluster:
    """The console's cluster in Kubernetes mode (see the module docstring).
    ``agent_probes``: Node name -> the probe its agent reports with (``ebpf``, ``sock_diag``),
    shown by ``nodes`` as in local mode ("-": no report from that node's agent)."""

    def __init__(self, actuator: Actuator, client: KubeClient, events: EventLog,
                 clock: Callable[[], float] = time.time,
                 agent_probes: Callable[[], Mapping[str, str]] | None = None) -> None:
        self.actuator = actuator
        self.client = client
        self.events = events
        self.clock = clock
        self.agent_probes = agent_probes
        self.sched = actuator.config.scheduler_name
        self.budgets = BudgetReader(client)  # for explain's eviction suggestions

    def _cfnet_pods(self) -> list[dict[str, Any]]:
        return [p for p in self.actuator.pods.items()
                if (p.get("spec") or {}).get("schedulerName") == self.sched]

    def _node_arg(self, args: dict[str, Any]) -> str:
        node = args.get("node")
        if not isinstance(node, str) or not node:
            raise CommandError("expected a node name")
        if self.actuator.registry.get(node) is None:
            raise CommandError(f"no Node {node!r} in the cluster; `cfnetctl nodes` lists them")
        return node

    def placements(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for p in self._cfnet_pods():
            node = (p.get("spec") or {}).get("nodeName")
            if node and not (p.get("metadata") or {}).get("deletionTimestamp"):
                out.setdefault(str(node), []).append(obj_key(p))
        return {k: sorted(v) for k, v in sorted(out.items())}

    def nodes(self) -> list[dict[str, Any]]:
        snap = self.actuator.snapshot()
        placed = self.placements()
        probes = self.agent_probes() if self.agent_probes is not None else {}
        return [{"node": n.name, "region": n.region, "zone": n.zone,
                 "security_level": n.security_level, "health": str(n.health),
                 "probe": probes.get(n.name) or "-",
                 "cordoned": n.health == Health.CORDONED,
                 "cpu_milli": n.capacity.cpu_milli, "cpu_allocated": n.allocated.cpu_milli,
                 "mem_bytes": n.capacity.mem_bytes, "mem_allocated": n.allocated.mem_bytes,
                 "workloads": len(placed.get(n.name, []))} for n in snap.nodes]

    def workloads(self, args: dict[str, Any]) -> Any:
        # paged as in local mode (offset, limit, total): thousands of pods don't fit one answer
        return paged(sorted(self._cfnet_pods(), key=_ns_name), args,
                     lambda p: _pod_row(self.actuator, p))

    def _find(self, args: dict[str, Any]) -> dict[str, Any]:
        name = args.get("workload")
        if not isinstance(name, str) or not name:
            raise CommandError("expected a pod name, namespace/name or UID")
        ns = args.get("namespace")
        if "/" in name and ns is None:
            ns, name = name.split("/", 1)
        hits = [p for p in self._cfnet_pods()
                if (p["metadata"].get("uid") == name or p["metadata"].get("name") == name)
                and (ns is None or p["metadata"].get("namespace") == ns)]
        if not hits:
            raise CommandError(f"no cfnet pod {name!r}; `cfnetctl workloads` lists them")
        if len(hits) > 1:
            raise CommandError(f"{name!r} is ambiguous: "
                               + ", ".join(obj_key(p) for p in hits) + "; give namespace/name")
        return hits[0]

    def explain(self, args: dict[str, Any]) -> Any:
        pod = self._find(args)
        w = self.actuator.parse(pod)
        if w is None:
            raise CommandError(f"{obj_key(pod)}: its spec is not one the engine can read")
        node = (pod.get("spec") or {}).get("nodeName")
        snap = self.actuator.snapshot(exclude=frozenset({w.uid}))
        try:
            ex = explain(snap, w, self.actuator.config.engine_config, node=node)
        except CoreError as exc:
            raise CommandError(str(exc)) from exc
        extras = (explain_extras(snap, w, node, self.actuator.config.engine_config,
                                 budgets=None if node else self.budgets())
                  if node or not ex.fit else {})
        q = self.actuator.batch_of(w.uid) if node else None
        if q is not None:
            extras["batch"] = q.doc(time.time())
        return jsonable({"workload": obj_key(pod), "uid": w.uid,
                          "state": "bound" if node else "pending", "node": node,
                          "reason": self.actuator.last_failure(w.uid), "explanation": ex,
                          **extras})

    def what_if(self, specs: list[dict[str, Any]]) -> Any:
        ws = []
        for i, doc in enumerate(specs):
            try:
                ws.extend(parse_workload_yaml(json.dumps(doc)))
            except CoreError as exc:
                raise CommandError(f"document {i + 1}: {exc}") from exc
            if len(ws) > MAX_SUBMIT:
                raise CommandError(f"at most {MAX_SUBMIT} workloads per request")
        result = engine_answer(self.actuator.snapshot(), ws, self.actuator.config.engine_config)
        return {"decisions": [jsonable(d) for d in result.decisions],
                "total_cost": result.total_cost, "solver": result.solver}

    def submit(self, op: str, specs: list[dict[str, Any]]) -> Any:
        raise CommandError(
            "refused: in Kubernetes mode cfnet places the workloads the cluster runs and does "
            "not create them; create a Pod, Deployment, StatefulSet or Job with "
            "`schedulerName: cfnet-scheduler` with `kubectl apply -f <file>`")

    def delete(self, op: str, args: dict[str, Any]) -> Any:
        pod = self._find(args)
        md = pod.get("metadata") or {}
        owner = next((o for o in md.get("ownerReferences") or [] if o.get("controller")), None)
        what = (f"its {owner.get('kind')} ({owner.get('name')}), e.g. `kubectl delete "
                f"{str(owner.get('kind')).lower()} -n {md.get('namespace')} "
                f"{owner.get('name')}`" if owner else
                f"`kubectl delete pod -n {md.get('namespace')} {md.get('name')}`")
        raise CommandError(f"refused: in Kubernetes mode the user owns {obj_key(pod)}; "
                           f"delete {what}")

    def _set_unschedulable(self, op: str, node: str, value: bool) -> bool:
        before = self.actuator.registry.get(node)
        was = before is not None and before.health == Health.CORDONED
        try:
            obj = self.client.patch(f"/api/v1/nodes/{node}",
                                    {"spec": {"unschedulable": value}})
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
        self.actuator.node_changed(obj)
        changed = was != value
        if changed:
            self.events.emit("console",
                             f"{op} {'cordoned' if value else 'uncordoned'} Node {node}",
                             node=node, severity="warning" if value else "info")
        return changed

    def cordon(self, op: str, args: dict[str, Any]) -> Any:
        node = self._node_arg(args)
        return {"node": node, "cordoned": True,
                "changed": self._set_unschedulable(op, node, True), "unschedulable": True}

    def uncordon(self, op: str, args: dict[str, Any]) -> Any:
        node = self._node_arg(args)
        return {"node": node, "cordoned": False,
                "changed": self._set_unschedulable(op, node, False), "unschedulable": False}

    def _evict(self, node: str, p: dict[str, Any], out: dict[str, list[str]]) -> None:
        """Evict one of cfnet's pods on ``node`` (or say why not) into ``out``'s lists."""
        md = p.get("metadata") or {}
        # the descheduler's DefaultEvictor defaults, and no pod that nothing recreates
        why = move_exclusion(p, self.actuator.config.eviction)
        if why is not None:
            out["not_evictable"].append(f"{obj_key(p)}: {why}")
            return
        try:
            ok = self.client.evict_pod(str(md.get("namespace")), str(md.get("name")),
                                       str(md.get("uid")))
        except KubeForbidden as exc:
            raise CommandError(
                f"refused: the core's Kubernetes role may not evict pods ({exc.status}); "
                f"Node {node} is cordoned; run `kubectl drain {node}`") from exc
        except KubeNotFound:
            return
        except KubeError as exc:
            out["failed"].append(f"{obj_key(p)}: {exc}")
            return
        out["evicted" if ok else "blocked_by_budget"].append(obj_key(p))

    def drain(self, op: str, args: dict[str, Any]) -> Any:
        node = self._node_arg(args)
        self._set_unschedulable(op, node, True)
        out: dict[str, list[str]] = {"evicted": [], "blocked_by_budget": [], "failed": [],
                                     "not_evictable": []}
        for p in self._cfnet_pods():
            md = p.get("metadata") or {}
            if (p.get("spec") or {}).get("nodeName") == node and not md.get("deletionTimestamp"):
                self._evict(node, p, out)
        others = sum(1 for p in self.actuator.pods.items()
                     if (p.get("spec") or {}).get("nodeName") == node
                     and (p.get("spec") or {}).get("schedulerName") != self.sched)
        self.events.emit("console", f"{op} drained Node {node}: {len(out['evicted'])} evicted, "
                         f"{len(out['blocked_by_budget'])} held by a PodDisruptionBudget",
                         node=node, severity="warning")
        return {"node": node, **out, "other_schedulers_pods_left": others,
                "note": "pods of other schedulers are left; `kubectl drain` evicts them too"
                if others else ""}
