"""Every manifest under deploy/k8s is accepted by the real API server with strict field
validation (server-side dry run: unknown or misspelt fields fail)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cloud_core.errors import KubeConflict
from cloud_core.k8s.client import KubeClient
from tests.k8s.conftest import DEPLOY, load_manifests
from tools.envtest import ControlPlane

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("path", sorted(DEPLOY.glob("*.yaml")), ids=lambda p: p.name)
def test_manifest_is_valid(control_plane: ControlPlane, admin: KubeClient, path: Path) -> None:
    control_plane.ensure_namespace("cfnet-system")
    docs = load_manifests(path)
    assert docs
    for obj in docs:
        md = obj.get("metadata") or {}
        coll = admin.resource_path(obj["apiVersion"], obj["kind"], md.get("namespace"))
        q = {"dryRun": "All", "fieldValidation": "Strict"}
        try:
            out = admin.request("POST", coll, body=obj, query=q)
        except KubeConflict:  # exists already (the namespace): validate as an update
            out = admin.request("PUT", f"{coll}/{md['name']}", body=obj, query=q)
        assert out["kind"] == obj["kind"] and out["metadata"]["name"] == md["name"]


def test_core_deployment_matches_rbac() -> None:
    core = load_manifests(DEPLOY / "core.yaml")[0]
    assert core["spec"]["replicas"] == 2
    pod = core["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "cfnet-core"
    rbac = {(d["kind"], d["metadata"]["name"]) for d in load_manifests(DEPLOY / "rbac.yaml")}
    assert ("ServiceAccount", "cfnet-core") in rbac and ("ClusterRole", "cfnet-core") in rbac
    agent = load_manifests(DEPLOY / "agent-daemonset.yaml")[0]["spec"]["template"]["spec"]
    assert agent["hostNetwork"] is True
    assert agent["containers"][0]["securityContext"]["privileged"] is True
    mounts = {m["mountPath"] for m in agent["containers"][0]["volumeMounts"]}
    assert {"/sys/kernel/btf", "/sys/kernel/tracing"} <= mounts
