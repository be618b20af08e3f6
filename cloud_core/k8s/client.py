"""cfnet's Kubernetes client: ``KubeClient``, JSON calls against one API server.

Everything above the client works on plain dicts (the API's JSON) and on
``cloud_core.errors.KubeError`` subclasses (409 → ``KubeConflict``, 410 → ``KubeGone``,
401/403 → ``KubeForbidden``, 404 → ``KubeNotFound``, no answer / 5xx / 429 →
``KubeUnavailable``): that keeps the actuator testable and its error handling explicit.

Paths are API paths (``/api/v1/namespaces/x/pods``); ``watch`` streams one event per line.
The parts, each its own module: ``endpoint`` (where the API server is, which credentials),
``transport`` (``LeanHTTP``: keep-alive connections, retries, error mapping), ``listwatch``
(list pages, watch streams), ``events`` (the ``EventRecorder`` thread). This module adds the
verbs (bindings, evictions, events, manifests with discovery) and keeps the names callers
import from it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from cloud_core.errors import KubeConflict, KubeNotFound, KubeUnavailable
from cloud_core.k8s import listwatch
from cloud_core.k8s.endpoint import KUBECONFIG_MAX_BYTES, TOKEN_REREAD_S, Endpoint
from cloud_core.k8s.events import EventRecorder, event_body, micro_time
from cloud_core.k8s.listwatch import Page
from cloud_core.k8s.objects import Schema
from cloud_core.k8s.transport import (
    JSON,
    JSON_PATCH,
    MERGE_PATCH,
    STRATEGIC_PATCH,
    LeanHTTP,
    api_error,
    encode_json,
    query_string,
)

# the names callers import from here, wherever they are defined
__all__ = [
    "JSON", "JSON_PATCH", "KUBECONFIG_MAX_BYTES", "MERGE_PATCH", "STRATEGIC_PATCH",
    "TOKEN_REREAD_S", "Endpoint", "KubeClient", "LeanHTTP", "Page", "micro_time",
]

# Paths of the kinds cfnet's manifests use, so applying them needs no discovery round trip.
_KNOWN_KINDS: dict[tuple[str, str], tuple[str, bool]] = {
    ("v1", "Namespace"): ("namespaces", False),
    ("v1", "ServiceAccount"): ("serviceaccounts", True),
    ("v1", "ConfigMap"): ("configmaps", True),
    ("v1", "Secret"): ("secrets", True),
    ("v1", "Service"): ("services", True),
    ("v1", "Pod"): ("pods", True),
    ("v1", "Node"): ("nodes", False),
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): ("clusterroles", False),
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): ("clusterrolebindings", False),
    ("rbac.authorization.k8s.io/v1", "Role"): ("roles", True),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): ("rolebindings", True),
    ("apps/v1", "Deployment"): ("deployments", True),
    ("apps/v1", "DaemonSet"): ("daemonsets", True),
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition"):
        ("customresourcedefinitions", False),
    ("coordination.k8s.io/v1", "Lease"): ("leases", True),
}


def _group_prefix(api_version: str) -> str:
    return "/api/v1" if api_version == "v1" else f"/apis/{api_version}"


class KubeClient:
    """JSON calls against one API server with one identity (thread-safe)."""

    def __init__(self, endpoint: Endpoint, *, timeout_s: float = 10.0) -> None:
        self.endpoint = endpoint
        self.host = endpoint.host
        self.timeout_s = timeout_s
        self.lean = LeanHTTP(endpoint, timeout_s)
        self.events = EventRecorder(self.lean)
        self._discovery: dict[tuple[str, str], tuple[str, bool]] = dict(_KNOWN_KINDS)
        self._lock = threading.Lock()

    # -- construction --------------------------------------------------------------------------
    @classmethod
    def from_kubeconfig(cls, path: str, context: str | None = None) -> KubeClient:
        return cls(Endpoint.from_kubeconfig(path, context))

    @classmethod
    def from_token(cls, host: str, token: str, ca_file: str | None) -> KubeClient:
        return cls(Endpoint.from_token(host, token, ca_file))

    @classmethod
    def in_cluster(cls) -> KubeClient:
        return cls(Endpoint.in_cluster())

    def close(self) -> None:
        self.events.close()
        self.lean.close()

    # -- raw calls -----------------------------------------------------------------------------
    def request(self, method: str, path: str, *, query: Mapping[str, Any] | None = None,
                body: Any = None, content_type: str | None = None,
                timeout: float | None = None, retry_after: bool = True) -> Any:
        """One call; returns the decoded JSON body or raises a ``KubeError`` subclass
        (answers with Retry-After are retried first: ``LeanHTTP.call``)."""
        q = query_string(query) if query else ""
        return self.lean.request(method, f"{path}?{q}" if q else path, body,
                                 content_type or "application/json", timeout_s=timeout,
                                 retry_after=retry_after)

    def get(self, path: str, **query: Any) -> JSON:
        return dict(self.request("GET", path, query=query))

    def list(self, path: str, *, schema: Schema | None = None,
             **query: Any) -> tuple[list[JSON], str]:
        """All items (following ``continue``) and the list's resourceVersion."""
        items: list[JSON] = []
        rv = ""
        # limit= in query: page size
        for page, page_rv in self.list_pages(path, schema=schema, **query):
            items.extend(page)
            rv = page_rv  # the last page's (all pages carry the list's)
        return items, rv

    def list_pages(self, path: str, *, limit: int = 500, schema: Schema | None = None,
                   **query: Any) -> Iterator[Page]:
        """The pages of one list, as they arrive: ``(items, resourceVersion)``.

        The pages of one list are one consistent snapshot (the ``continue`` token carries
        its resourceVersion), so a caller may act on the first page while the rest is still
        on its way. Over the lean connections: the generated client's response handling
        doubled the time of a 5,000-node list (0.50 s against 0.23 s, measured).

        ``schema`` (``objects.POD``, ``objects.NODE``): the items hold only what cfnet reads
        of that kind, the rest skipped while decoding (a quarter of the CPU; ``objects.py``).
        """
        yield from listwatch.list_pages(self.lean, path, limit=limit, schema=schema,
                                        query=query)

    def create(self, path: str, body: JSON) -> JSON:
        return dict(self.request("POST", path, body=body))

    def replace(self, path: str, body: JSON) -> JSON:
        return dict(self.request("PUT", path, body=body))

    def patch(self, path: str, body: Any, content_type: str = MERGE_PATCH) -> JSON:
        return dict(self.request("PATCH", path, body=body, content_type=content_type))

    def delete(self, path: str, grace_period_s: int | None = None) -> None:
        body = None
        if grace_period_s is not None:
            body = {"apiVersion": "v1", "kind": "DeleteOptions",
                    "gracePeriodSeconds": grace_period_s}
        self.request("DELETE", path, body=body)

    def watch(self, path: str, resource_version: str, *, timeout_s: int = 60,
              stop: threading.Event | None = None, schema: Schema | None = None,
              **query: Any) -> Iterator[tuple[str, JSON]]:
        """Stream ``(type, object)`` from ``resource_version`` until the server ends the watch.

        Bookmarks come through as ``("BOOKMARK", obj)`` so the caller can advance its
        resourceVersion. A 410 (as a status or as an ERROR event) raises ``KubeGone``. The
        stream has a connection of its own, closed when the watch ends. ``schema``: the
        objects as ``list_pages`` gives them.
        """
        yield from listwatch.watch(self.lean, path, resource_version, timeout_s=timeout_s,
                                   stop=stop, schema=schema, query=query)

    # -- discovery and manifests ---------------------------------------------------------------
    def resource_path(self, api_version: str, kind: str, namespace: str | None = None,
                      name: str | None = None) -> str:
        """The collection (or, with ``name``, object) path of a kind; discovers CRDs."""
        key = (api_version, kind)
        with self._lock:
            known = self._discovery.get(key)
        if known is None:
            doc = self.get(_group_prefix(api_version))
            for r in doc.get("resources") or []:
                if r.get("kind") == kind and "/" not in str(r.get("name")):
                    known = (str(r["name"]), bool(r.get("namespaced")))
                    break
            if known is None:
                raise KubeNotFound(f"no resource of kind {kind} in {api_version}", 404)
            with self._lock:
                self._discovery[key] = known
        plural, namespaced = known
        p = _group_prefix(api_version)
        if namespaced:
            p += f"/namespaces/{namespace or 'default'}"
        p += f"/{plural}"
        return f"{p}/{name}" if name else p

    def apply(self, obj: JSON, guard: Callable[[JSON], None] | None = None) -> JSON:
        """Create ``obj``, or replace it (carrying the live resourceVersion) when it exists;
        ``guard`` sees the live object first and raises to refuse the replace."""
        md = obj.get("metadata") or {}
        coll = self.resource_path(str(obj["apiVersion"]), str(obj["kind"]), md.get("namespace"))
        try:
            return self.create(coll, obj)
        except KubeConflict:
            path = f"{coll}/{md['name']}"
            live = self.get(path)
            if guard is not None:
                guard(live)
            body = {**obj, "metadata": {**md, "resourceVersion":
                                        live["metadata"]["resourceVersion"]}}
            return self.replace(path, body)

    # -- verbs the actuator uses ---------------------------------------------------------------
    def bind_pod(self, namespace: str, name: str, uid: str, node: str, *,
                 retry_after: bool = True) -> None:
        """POST pods/binding with a UID precondition (409 if bound already or replaced).
        ``retry_after=False``: a 429 is raised at once (``KubeUnavailable``), not waited out
        (``LeanHTTP.call``)."""
        path = f"/api/v1/namespaces/{namespace}/pods/{name}/binding"
        body = (b'{"apiVersion":"v1","kind":"Binding","metadata":{"name":%s,"namespace":%s,'
                b'"uid":%s},"target":{"apiVersion":"v1","kind":"Node","name":%s}}' % tuple(
                    encode_json(x) for x in (name, namespace, uid, node)))
        status, data = self.lean.call("POST", path, body, retry_after=retry_after)
        if not 200 <= status <= 299:
            raise api_error(status, data, f"POST {path}")

    def evict_pod(self, namespace: str, name: str, uid: str | None = None) -> bool:
        """POST pods/eviction (policy/v1), so PodDisruptionBudgets are honoured.

        True: evicted (the pod is terminating); False: a disruption budget refused it now
        (HTTP 429, retry later). Other failures raise (404: gone already).
        """
        body: JSON = {"apiVersion": "policy/v1", "kind": "Eviction",
                      "metadata": {"name": name, "namespace": namespace}}
        if uid:
            body["deleteOptions"] = {"preconditions": {"uid": uid}}
        try:
            # a refusal by a disruption budget says Retry-After: 10; the re-planner asks
            # again on its own clock rather than holding its thread here
            self.request("POST", f"/api/v1/namespaces/{namespace}/pods/{name}/eviction",
                         body=body, retry_after=False)
        except KubeUnavailable as e:
            if e.status == 429:
                return False
            raise
        return True

    def emit_event(self, involved: JSON, *, reason: str, message: str, event_type: str = "Normal",
                   component: str = "cfnet-scheduler", instance: str = "",
                   action: str = "Scheduling") -> JSON:
        """Write an ``events.k8s.io/v1`` Event about ``involved`` now (raises on failure)."""
        ev = event_body(involved, reason=reason, message=message, event_type=event_type,
                        action=action, controller=component, instance=instance)
        ns = ev["metadata"]["namespace"]
        return dict(self.lean.request("POST", f"/apis/events.k8s.io/v1/namespaces/{ns}/events",
                                      ev))

    def record_event(self, involved: JSON, *, reason: str, message: str,
                     event_type: str = "Normal", component: str = "cfnet-scheduler",
                     instance: str = "", action: str = "Scheduling",
                     background: bool = False) -> None:
        """Queue an ``events.k8s.io/v1`` Event for the background recorder (never blocks;
        repeats aggregate into a series; failures are logged and counted, not raised).
        ``background``: an event about the cluster, written after the pods' events and
        paced (``EventRecorder``)."""
        self.events.record(event_body(involved, reason=reason, message=message,
                                      event_type=event_type, action=action,
                                      controller=component, instance=instance),
                           background=background)

    def flush_events(self, timeout: float = 10.0) -> bool:
        return self.events.flush(timeout)
