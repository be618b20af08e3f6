"""The one module of cfnet that imports the kubernetes client: a thin JSON-over-HTTPS wrapper.

Everything above this module works on plain dicts (the API's JSON) and on
``cloud_core.errors.KubeError`` subclasses, never on the client's generated models or its
``ApiException``: that keeps the actuator testable and its error handling explicit
(409 → ``KubeConflict``, 410 → ``KubeGone``, 401/403 → ``KubeForbidden``, 404 →
``KubeNotFound``, no answer / 5xx / 429 → ``KubeUnavailable``).

Paths are API paths (``/api/v1/namespaces/x/pods``); ``watch`` streams one event per line.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import urllib3
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from cloud_core.errors import (
    KubeConflict,
    KubeError,
    KubeForbidden,
    KubeGone,
    KubeNotFound,
    KubeUnavailable,
)

JSON = dict[str, Any]

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"

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


def _error(status: int, body: bytes | str | None, what: str) -> KubeError:
    reason, message = "", ""
    try:
        st = json.loads(body or b"{}")
        reason, message = str(st.get("reason", "")), str(st.get("message", ""))
    except (ValueError, AttributeError):
        message = (body.decode(errors="replace") if isinstance(body, bytes) else str(body))[:300]
    text = f"{what}: HTTP {status} {reason}: {message}".strip()
    if status == 409:
        return KubeConflict(text, status, reason)
    if status == 410:
        return KubeGone(text, status, reason)
    if status in (401, 403):
        return KubeForbidden(text, status, reason)
    if status == 404:
        return KubeNotFound(text, status, reason)
    if status == 429 or status >= 500:
        return KubeUnavailable(text, status, reason)
    return KubeError(text, status, reason)


class KubeClient:
    """JSON calls against one API server with one identity (thread-safe)."""

    def __init__(self, configuration: k8s.Configuration, *, timeout_s: float = 10.0) -> None:
        configuration.retries = 1  # the callers retry with backoff; don't stall on a dead server
        configuration.connection_pool_maxsize = 16
        self._api = k8s.ApiClient(configuration)
        self.host = str(configuration.host)
        self.timeout_s = timeout_s
        self._discovery: dict[tuple[str, str], tuple[str, bool]] = dict(_KNOWN_KINDS)
        self._lock = threading.Lock()

    # -- construction --------------------------------------------------------------------------
    @classmethod
    def from_kubeconfig(cls, path: str, context: str | None = None) -> KubeClient:
        cfg = k8s.Configuration()
        try:
            k8s_config.load_kube_config(config_file=path, context=context,
                                        client_configuration=cfg, persist_config=False)
        except (k8s_config.ConfigException, OSError, ValueError) as e:
            raise KubeError(f"cannot load kubeconfig {path}: {e}") from e
        return cls(cfg)

    @classmethod
    def from_token(cls, host: str, token: str, ca_file: str | None) -> KubeClient:
        cfg = k8s.Configuration()
        cfg.host = host
        cfg.api_key = {"authorization": f"Bearer {token}"}
        if ca_file:
            cfg.ssl_ca_cert = ca_file
        return cls(cfg)

    @classmethod
    def in_cluster(cls) -> KubeClient:
        cfg = k8s.Configuration()
        try:
            k8s_config.load_incluster_config(client_configuration=cfg)
        except k8s_config.ConfigException as e:
            raise KubeError(f"not running in a cluster: {e}") from e
        return cls(cfg)

    def close(self) -> None:
        self._api.close()

    # -- raw calls -----------------------------------------------------------------------------
    def _send(self, method: str, path: str, *, query: Mapping[str, Any] | None = None,
              body: Any = None, content_type: str | None = None,
              timeout: float | tuple[float, float] | None = None) -> Any:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type or "application/json"
        q = [(k, str(v).lower() if isinstance(v, bool) else v)
             for k, v in (query or {}).items() if v is not None]
        try:
            req = self._api.param_serialize(method=method, resource_path=path, query_params=q,
                                            header_params=headers, body=body,
                                            auth_settings=["BearerToken"])
            return self._api.call_api(*req, _request_timeout=timeout or self.timeout_s)
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise KubeUnavailable(f"{method} {path}: {type(e).__name__}: {e}") from e

    def request(self, method: str, path: str, *, query: Mapping[str, Any] | None = None,
                body: Any = None, content_type: str | None = None,
                timeout: float | None = None) -> Any:
        """One call; returns the decoded JSON body or raises a ``KubeError`` subclass."""
        resp = self._send(method, path, query=query, body=body, content_type=content_type,
                          timeout=timeout)
        try:
            data = resp.read()
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise KubeUnavailable(f"{method} {path}: reading the answer: {e}") from e
        if not 200 <= resp.status <= 299:
            raise _error(resp.status, data, f"{method} {path}")
        return json.loads(data) if data else None

    def get(self, path: str, **query: Any) -> JSON:
        return dict(self.request("GET", path, query=query))

    def list(self, path: str, **query: Any) -> tuple[list[JSON], str]:
        """All items (following ``continue``) and the list's resourceVersion."""
        items: list[JSON] = []
        cont: str | None = None
        while True:
            page = self.get(path, limit=500, **{"continue": cont}, **query)
            items.extend(page.get("items") or [])
            cont = (page.get("metadata") or {}).get("continue")
            if not cont:
                return items, str((page.get("metadata") or {}).get("resourceVersion", ""))

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
              stop: threading.Event | None = None, **query: Any) -> Iterator[tuple[str, JSON]]:
        """Stream ``(type, object)`` from ``resource_version`` until the server ends the watch.

        Bookmarks come through as ``("BOOKMARK", obj)`` so the caller can advance its
        resourceVersion. A 410 (as a status or as an ERROR event) raises ``KubeGone``.
        """
        q = {"watch": True, "resourceVersion": resource_version,
             "allowWatchBookmarks": True, "timeoutSeconds": timeout_s, **query}
        resp = self._send("GET", path, query=q, timeout=(5.0, timeout_s + 15.0))
        if not 200 <= resp.status <= 299:
            raise _error(resp.status, resp.read(), f"WATCH {path}")
        raw = resp.response
        buf = b""
        try:
            for chunk in raw.stream(65536, decode_content=True):
                if stop is not None and stop.is_set():
                    return
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if not line.strip():
                        continue
                    ev = json.loads(line)
                    kind, obj = str(ev.get("type")), dict(ev.get("object") or {})
                    if kind == "ERROR":
                        raise _error(int(obj.get("code") or 500), json.dumps(obj),
                                     f"WATCH {path}")
                    yield kind, obj
        except (urllib3.exceptions.HTTPError, OSError) as e:
            raise KubeUnavailable(f"WATCH {path}: stream broke: {e}") from e
        finally:
            raw.release_conn()

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

    def apply(self, obj: JSON) -> JSON:
        """Create ``obj``, or replace it (carrying the live resourceVersion) when it exists."""
        md = obj.get("metadata") or {}
        coll = self.resource_path(str(obj["apiVersion"]), str(obj["kind"]), md.get("namespace"))
        try:
            return self.create(coll, obj)
        except KubeConflict:
            path = f"{coll}/{md['name']}"
            live = self.get(path)
            body = {**obj, "metadata": {**md, "resourceVersion":
                                        live["metadata"]["resourceVersion"]}}
            return self.replace(path, body)

    # -- verbs the actuator uses ---------------------------------------------------------------
    def bind_pod(self, namespace: str, name: str, uid: str, node: str) -> None:
        """POST pods/binding with a UID precondition (409 if bound already or replaced)."""
        self.request("POST", f"/api/v1/namespaces/{namespace}/pods/{name}/binding", body={
            "apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": name, "namespace": namespace, "uid": uid},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        })

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
            self.request("POST", f"/api/v1/namespaces/{namespace}/pods/{name}/eviction",
                         body=body)
        except KubeUnavailable as e:
            if e.status == 429:
                return False
            raise
        return True

    def emit_event(self, involved: JSON, *, reason: str, message: str, event_type: str = "Normal",
                   component: str = "cfnet-scheduler", instance: str = "") -> JSON:
        """Create a core/v1 Event about ``involved`` (a pod or node object)."""
        md = involved.get("metadata") or {}
        ns = md.get("namespace") or "default"
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        ev = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{md.get('name')}.{uuid.uuid4().hex[:16]}", "namespace": ns},
            "involvedObject": {"apiVersion": involved.get("apiVersion", "v1"),
                               "kind": involved.get("kind", "Pod"), "name": md.get("name"),
                               "namespace": md.get("namespace"), "uid": md.get("uid")},
            "reason": reason, "message": message[:1024], "type": event_type,
            "source": {"component": component}, "reportingComponent": component,
            "reportingInstance": instance or component,
            "firstTimestamp": now, "lastTimestamp": now, "count": 1,
        }
        return self.create(f"/api/v1/namespaces/{ns}/events", ev)
