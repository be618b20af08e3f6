"""Which pods cfnet may evict: the descheduler's DefaultEvictor defaults.

cfnet evicts to re-place (a broken latency SLA, a node whose labels changed) and for the
console's ``drain``. Some pods must never be taken away that way, whoever scheduled them;
sigs.k8s.io/descheduler's ``DefaultEvictor`` (pkg/framework/plugins/defaultevictor) refuses,
by default:

* **mirror pods** (annotation ``kubernetes.io/config.mirror``: the API's copy of a static
  pod; evicting it does nothing to the kubelet's pod) and **static pods** (annotation
  ``kubernetes.io/config.source`` other than ``api``);
* **DaemonSet pods** (an ownerReference of kind DaemonSet: the DaemonSet recreates it on the
  same node);
* **system-critical pods** (``spec.priority`` at least ``system-cluster-critical``'s
  2,000,000,000, or a ``system-*-critical`` priority class), unless allowed;
* **pods with local storage** (an ``emptyDir`` or ``hostPath`` volume: eviction loses the
  data), unless allowed;

and cfnet adds **kube-system** (the descheduler's ``namespaces.exclude`` as cfnet's default).
:func:`exclusion` says which rule keeps a pod (None: it may be evicted).

The DefaultEvictor also refuses a pod without ownerReferences ("pod does not have any
ownerRefs"): nothing would recreate it. cfnet goes one step further and refuses, for a move or
a drain, any pod that no *controller* owns (:func:`move_exclusion`): such a pod, evicted, is
gone, and cfnet does not create pods (its ClusterRole has no ``pods create``, docs/security.md:
a stolen token could otherwise run a pod as any ServiceAccount in any namespace). A bare pod
stays cfnet's own for alerts (a ``ConstraintViolated`` event when its node stops fitting it);
deleting it is its owner's call, as ``kubectl drain`` without ``--force`` leaves it too.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from edge_agent.wire.names import ID_MAX, name_problem

MIRROR = "kubernetes.io/config.mirror"
SOURCE = "kubernetes.io/config.source"
SYSTEM_CRITICAL_PRIORITY = 2_000_000_000  # scheduling.SystemCriticalPriority


@dataclass(frozen=True, slots=True)
class EvictionPolicy:
    """What cfnet may evict (the descheduler's DefaultEvictor arguments, its defaults)."""

    evict_local_storage: bool = False  # evictLocalStoragePods
    evict_system_critical: bool = False  # evictSystemCriticalPods
    excluded_namespaces: frozenset[str] = field(
        default_factory=lambda: frozenset({"kube-system"}))


DEFAULT_POLICY = EvictionPolicy()
MAX_EXCLUDED_NAMESPACES = 256


def parse_namespaces(text: str) -> frozenset[str]:
    """``a,b,c`` as a set of namespace names (the chart's ``core.eviction.excludeNamespaces``
    joined): each a DNS label, at most ``MAX_EXCLUDED_NAMESPACES``; '' is none. Raises
    ``ValueError`` naming the bad entry (argparse turns it into a usage error)."""
    names = [n.strip() for n in text.split(",") if n.strip()] if text else []
    if len(names) > MAX_EXCLUDED_NAMESPACES:
        raise ValueError(f"more than {MAX_EXCLUDED_NAMESPACES} namespaces")
    for n in names:
        if (why := name_problem(n, ID_MAX)) is not None:
            raise ValueError(f"namespace {n[:64]!r}: {why}")
    return frozenset(names)


def exclusion(pod: Mapping[str, Any], policy: EvictionPolicy = DEFAULT_POLICY) -> str | None:
    """Why ``pod`` must not be evicted (None: it may be)."""
    md = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    ann = md.get("annotations") or {}
    if MIRROR in ann:
        return "a mirror pod"
    if SOURCE in ann and ann.get(SOURCE) != "api":
        return "a static pod"
    if any(o.get("kind") == "DaemonSet" for o in md.get("ownerReferences") or []):
        return "a DaemonSet pod"
    if not policy.evict_system_critical:
        prio = spec.get("priority")
        cls = str(spec.get("priorityClassName") or "")
        if (isinstance(prio, int) and prio >= SYSTEM_CRITICAL_PRIORITY) or (
                cls.startswith("system-") and cls.endswith("-critical")):
            return f"system-critical (priority class {cls or prio})"
    if str(md.get("namespace") or "default") in policy.excluded_namespaces:
        return f"in namespace {md.get('namespace')}"
    if not policy.evict_local_storage:
        for v in spec.get("volumes") or []:
            if isinstance(v, Mapping) and ("emptyDir" in v or "hostPath" in v):
                return f"uses local storage (volume {v.get('name')})"
    return None


def unowned(pod: Mapping[str, Any]) -> str | None:
    """Why nothing would recreate ``pod`` once evicted (None: a controller owns it)."""
    refs = (pod.get("metadata") or {}).get("ownerReferences") or []
    if any(isinstance(o, Mapping) and o.get("controller") for o in refs):
        return None
    return "no controller recreates it (no ownerReference with controller: true)"


def move_exclusion(pod: Mapping[str, Any],
                   policy: EvictionPolicy = DEFAULT_POLICY) -> str | None:
    """Why cfnet must not evict ``pod`` to move it or drain its node (None: it may)."""
    return exclusion(pod, policy) or unowned(pod)
