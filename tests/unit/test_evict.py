"""Which pods cfnet may evict (cloud_core/k8s/evict.py): the descheduler's DefaultEvictor
defaults (sigs.k8s.io/descheduler pkg/framework/plugins/defaultevictor). The re-planner and
the console's drain against a real API server: tests/k8s/test_evictions.py."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from cloud_core.k8s.evict import (
    DEFAULT_POLICY,
    EvictionPolicy,
    exclusion,
    move_exclusion,
    parse_namespaces,
    unowned,
)
from cloud_core.k8s.flags import add_eviction_args, eviction_policy


def _pod(ns: str = "app", ann: dict[str, str] | None = None, owner: str | None = None,
         **spec: Any) -> dict[str, Any]:
    md: dict[str, Any] = {"name": "p", "namespace": ns, "annotations": ann or {}}
    if owner:
        md["ownerReferences"] = [{"kind": owner, "name": "o", "uid": "u", "controller": True}]
    return {"metadata": md, "spec": {"containers": [{"name": "c"}], **spec}}


@pytest.mark.parametrize(("pod", "why"), [
    (_pod(owner="ReplicaSet"), None),
    (_pod(), None),
    (_pod(owner="DaemonSet"), "a DaemonSet pod"),
    (_pod(ann={"kubernetes.io/config.mirror": "abc"}), "a mirror pod"),
    (_pod(ann={"kubernetes.io/config.source": "file"}), "a static pod"),
    (_pod(ann={"kubernetes.io/config.source": "api"}), None),
    (_pod(priorityClassName="system-cluster-critical"), "system-critical"),
    (_pod(priority=2_000_001_000), "system-critical"),
    (_pod(priority=1000), None),
    (_pod(ns="kube-system"), "in namespace kube-system"),
    (_pod(volumes=[{"name": "scratch", "emptyDir": {}}]), "local storage"),
    (_pod(volumes=[{"name": "h", "hostPath": {"path": "/x"}}]), "local storage"),
    (_pod(volumes=[{"name": "cfg", "configMap": {"name": "c"}}]), None),
])
def test_default_evictor_table(pod: dict[str, Any], why: str | None) -> None:
    got = exclusion(pod)
    assert (got is None) == (why is None), got
    if why is not None:
        assert got is not None and why in got


def test_allowed_by_policy() -> None:
    pol = EvictionPolicy(evict_local_storage=True, evict_system_critical=True,
                         excluded_namespaces=frozenset())
    assert exclusion(_pod(volumes=[{"name": "s", "emptyDir": {}}]), pol) is None
    assert exclusion(_pod(ns="kube-system", priorityClassName="system-node-critical"),
                     pol) is None
    assert exclusion(_pod(owner="DaemonSet"), pol) == "a DaemonSet pod"  # never


def test_a_pod_no_controller_owns_is_not_moved() -> None:
    """The DefaultEvictor refuses pods without ownerRefs; cfnet refuses any pod without a
    controller ownerReference for a move or a drain (it creates no pods to replace it), but
    the pod stays cfnet's own otherwise (``exclusion`` None: alerts still reach it)."""
    bare = _pod()
    assert exclusion(bare) is None
    assert unowned(bare) == move_exclusion(bare)
    assert move_exclusion(bare) is not None and "no controller recreates it" in move_exclusion(bare)
    ref = _pod()
    ref["metadata"]["ownerReferences"] = [{"kind": "ConfigMap", "name": "o", "uid": "u"}]
    assert move_exclusion(ref) is not None  # an owner that is not a controller recreates nothing
    assert move_exclusion(_pod(owner="ReplicaSet")) is None
    assert move_exclusion(_pod(owner="DaemonSet")) == "a DaemonSet pod"  # the first rule says it


def test_tenant_namespace_exclusion_from_the_flag() -> None:
    """``--evict-exclude-namespaces`` (the chart's ``core.eviction.excludeNamespaces``) is
    the descheduler's ``namespaces.exclude``: the list replaces the default kube-system."""
    p = argparse.ArgumentParser()
    add_eviction_args(p)
    assert eviction_policy(p.parse_args([])) == DEFAULT_POLICY
    pol = eviction_policy(p.parse_args(["--evict-exclude-namespaces=kube-system,team-a"]))
    assert exclusion(_pod(ns="team-a", owner="ReplicaSet"), pol) == "in namespace team-a"
    assert move_exclusion(_pod(ns="team-a", owner="ReplicaSet"), pol) == "in namespace team-a"
    assert exclusion(_pod(ns="team-b", owner="ReplicaSet"), pol) is None
    assert exclusion(_pod(ns="kube-system"), pol) is not None
    none = eviction_policy(p.parse_args(["--evict-exclude-namespaces="]))
    assert exclusion(_pod(ns="kube-system"), none) is None


@pytest.mark.parametrize("text", ["Bad_NS", "a,,b,-x", "x" * 64, ",".join(["n"] * 257),
                                  "a\nb", "ns/other"])
def test_bad_namespace_lists_refused_with_the_reason(text: str) -> None:
    with pytest.raises(ValueError) as e:
        parse_namespaces(text)
    assert "namespace" in str(e.value)


def test_namespace_list_parsed() -> None:
    assert parse_namespaces(" kube-system , team-a ") == {"kube-system", "team-a"}
    assert parse_namespaces("") == frozenset()
