"""The Helm chart with the real helm (built from the Go module proxy by tools/helm/build.sh):
`helm lint --strict` clean for the default and the alternative values, `helm template` output
shaped as the issue asks (least privilege, probes, eBPF mounts), and deploy/k8s generated from
it. Applying the rendered manifests to a real API server is in tests/k8s/test_manifests.py."""

from __future__ import annotations

import base64
import shlex
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from tools import helm as chart
from tools.helm import CHART, ROOT, HelmError, documents, template

# Values a platform team sets instead of the defaults: own broker, Secrets from the chart,
# the agent on the privileged fallback instead of capabilities, no PDB.
ALT_VALUES = ["mosquitto.enabled=false", "broker.host=mqtt.example.org",
              "credentials.create=true", "credentials.caCrt=CA",
              "credentials.corePassword=c0re", "credentials.agentPassword=ag3nt",
              "agent.privileged=true", "core.podDisruptionBudget.enabled=false",
              "image.tag=9.9.9", "core.replicas=3"]


# helm is built once, at collection (conftest); a failed build fails these tests here.
pytestmark = pytest.mark.usefixtures("helm_built")


def by_kind(docs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


# Edge nodes without cluster DNS reach the chart's broker through a NodePort (docs/install.md).
EDGE_VALUES = ["mosquitto.service.type=NodePort", "mosquitto.service.nodePort=30883",
               "broker.agentHost=203.0.113.10", "core.serviceMonitor.enabled=true",
               "core.logFormat=json", "agent.logFormat=json", "prometheusRule.enabled=true"]


@pytest.mark.parametrize("values", [[], ALT_VALUES, EDGE_VALUES],
                         ids=["defaults", "alternative", "edge"])
def test_helm_lint_strict_is_clean(values: list[str]) -> None:
    args = ["lint", "--strict", str(CHART)]
    for v in values:
        args += ["--set", v]
    r = chart.helm(*args, check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in r.stdout
    assert "[ERROR]" not in r.stdout and "[WARNING]" not in r.stdout


def test_deploy_k8s_is_generated_from_the_chart() -> None:
    stale = chart.check()
    assert not stale, f"deploy/k8s differs from the chart ({stale}); run python -m tools.helm render"


def test_defaults_render_the_core_as_asked() -> None:
    objs = by_kind(documents(template()))
    dep = objs[("Deployment", "cfnet-core")]
    assert dep["metadata"]["namespace"] == "cfnet-system"
    assert dep["spec"]["replicas"] == 2
    pod = dep["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "cfnet-core"
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"]
    (c,) = pod["containers"]
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert c["image"] == f"ghcr.io/cfnet/cfnet-core:{version}"
    assert c["securityContext"] == {"allowPrivilegeEscalation": False,
                                    "readOnlyRootFilesystem": True,
                                    "capabilities": {"drop": ["ALL"]}}
    assert {"startupProbe", "livenessProbe", "readinessProbe"} <= set(c)
    assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
    assert "--kubernetes" in c["args"] and "--broker-host=mosquitto.cfnet-system.svc" in c["args"]
    assert {e["name"] for e in c["env"]} >= {"POD_NAME", "POD_NAMESPACE"}  # election identity
    probes = {k: c[k]["httpGet"]["path"] for k in ("startupProbe", "livenessProbe",
                                                    "readinessProbe")}
    assert probes == {"startupProbe": "/healthz", "livenessProbe": "/healthz",
                      "readinessProbe": "/readyz"}
    assert objs[("Service", "cfnet-core-metrics")]["spec"]["publishNotReadyAddresses"] is True
    mq = objs[("Deployment", "mosquitto")]["spec"]["template"]["spec"]
    assert mq["securityContext"]["runAsNonRoot"] is True and mq["securityContext"]["fsGroup"]
    assert mq["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert mq["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    pdb = objs[("PodDisruptionBudget", "cfnet-core")]
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    # Lease: create, and get/update of its own Lease only, in its own namespace.
    role = objs[("Role", "cfnet-core-leader-election")]
    assert role["metadata"]["namespace"] == "cfnet-system"
    named = [r for r in role["rules"] if r.get("resourceNames")]
    assert named == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                      "resourceNames": ["cfnet-core"], "verbs": ["get", "update"]}]
    cr = objs[("ClusterRole", "cfnet-core")]
    for rule in cr["rules"]:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"]
        assert "secrets" not in rule["resources"]


def test_defaults_render_the_agent_as_asked() -> None:
    objs = by_kind(documents(template()))
    ds = objs[("DaemonSet", "cfnet-agent")]
    pod = ds["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert pod["automountServiceAccountToken"] is False
    assert {"operator": "Exists"} in pod["tolerations"]  # edge taints included
    (c,) = pod["containers"]
    sc = c["securityContext"]
    assert sc["privileged"] is False and sc["capabilities"]["drop"] == ["ALL"]
    assert {"BPF", "PERFMON", "NET_ADMIN"} <= set(sc["capabilities"]["add"])
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert {"/sys/kernel/btf", "/sys/kernel/tracing", "/sys/kernel/debug", "/lib/modules",
            "/usr/src", "/var/lib/cfnet-agent", "/etc/cfnet-agent"} <= set(mounts)
    assert mounts["/lib/modules"]["readOnly"] and mounts["/sys/kernel/btf"]["readOnly"]
    # A node without headers, modules or BTF still starts the agent (sock_diag fallback).
    assert {v["hostPath"]["type"] for v in pod["volumes"] if "hostPath" in v} == \
        {"DirectoryOrCreate"}
    cm = objs[("ConfigMap", "cfnet-agent-config")]
    assert "broker_host: mosquitto.cfnet-system.svc" in cm["data"]["agent.yaml"]
    # The agent's own probes (edge_agent/health.py) on the port its config serves.
    assert "metrics_port: 9109" in cm["data"]["agent.yaml"]
    assert c["ports"] == [{"name": "metrics", "containerPort": 9109}]
    probes = {k: (c[k]["httpGet"]["path"], c[k]["httpGet"]["port"])
              for k in ("startupProbe", "livenessProbe", "readinessProbe")}
    assert probes == {"startupProbe": ("/healthz", "metrics"),
                      "livenessProbe": ("/healthz", "metrics"),
                      "readinessProbe": ("/readyz", "metrics")}
    # The startup probe outlasts the enrollment's wait for its certificate (600 s).
    start = c["startupProbe"]
    assert start["periodSeconds"] * start["failureThreshold"] > 600
    assert ("Deployment", "mosquitto") in objs and ("Service", "mosquitto") in objs
    # credentials are the operator's; the one Secret is the agent CA's, made empty (the
    # leading core fills it; the release owns it, so helm uninstall removes it)
    assert [k for k in objs if k[0] == "Secret"] == [("Secret", "cfnet-agent-ca")]
    assert not objs[("Secret", "cfnet-agent-ca")].get("data")


def test_alternative_values_render() -> None:
    objs = by_kind(documents(template(values=ALT_VALUES)))
    assert not [k for k in objs if k[1] == "mosquitto"]
    assert ("PodDisruptionBudget", "cfnet-core") not in objs
    dep = objs[("Deployment", "cfnet-core")]
    assert dep["spec"]["replicas"] == 3
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert c["image"].endswith("cfnet-core:9.9.9")
    assert "--broker-host=mqtt.example.org" in c["args"]
    agent = objs[("DaemonSet", "cfnet-agent")]["spec"]["template"]["spec"]["containers"][0]
    assert agent["securityContext"] == {"privileged": True}
    sec = objs[("Secret", "cfnet-core-mqtt")]
    assert set(sec["data"]) == {"ca.crt", "password"}
    assert ("Secret", "cfnet-agent-credentials") in objs


def test_no_broker_is_refused_with_a_reason() -> None:
    with pytest.raises(HelmError, match=r"broker\.host is required"):
        template(values=["mosquitto.enabled=false"])
    with pytest.raises(HelmError, match=r"credentials\.corePassword is required"):
        template(values=["credentials.create=true", "credentials.caCrt=x"])


def test_chart_mosquitto_conf_is_the_production_one() -> None:
    # helm cannot read files outside the chart; the copy must not drift from deploy/mosquitto.
    assert (CHART / "files" / "mosquitto.conf").read_text() == \
        (ROOT / "deploy" / "mosquitto" / "mosquitto.conf").read_text()


def readme_command(start: str) -> list[str]:
    """The README's shell command beginning with ``start``, continuation lines joined."""
    text = (ROOT / "README.md").read_text()
    lines = []
    for line in text[text.index(start):].splitlines():
        lines.append(line.rstrip("\\").strip())
        if not line.endswith("\\"):
            break
    return shlex.split(" ".join(lines))


def test_readme_helm_install_renders(tmp_path: Path) -> None:
    # The README's `helm install`, rendered as `helm template` (same flags, same files).
    argv = readme_command("helm install cfnet ")
    assert argv[:3] == ["helm", "install", "cfnet"]
    (tmp_path / "pki").mkdir()
    (tmp_path / "pki" / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    (tmp_path / "core-k8s.pw").write_text("core-secret\n")
    (tmp_path / "agent.pw").write_text("agent-secret\n")
    chart_arg = str(ROOT / argv[3])
    r = subprocess.run([str(chart.ensure_helm()), "template", "cfnet", chart_arg, *argv[4:]],
                       capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    objs = by_kind(documents(r.stdout))
    core = objs[("Secret", "cfnet-core-mqtt")]
    assert base64.b64decode(core["data"]["password"]).decode().strip() == "core-secret"
    assert core["metadata"]["namespace"] == "cfnet-system"
    agent = objs[("Secret", "cfnet-agent-credentials")]
    # One identity per agent (the default): the agents' Secret holds the broker's CA only.
    assert set(agent["data"]) == {"ca.crt"}
    assert ("Deployment", "mosquitto") in objs  # the broker the README's Secret is for


def test_defaults_give_every_agent_its_own_identity() -> None:
    """agent.identity certificate (the default): no shared password reaches a node; the agent
    may only file and read CSRs, with a pod-bound token; the core may approve and sign for
    cfnet.io/agent only; the broker has the certificate listener (docs/security.md)."""
    objs = by_kind(documents(template()))
    pod = objs[("DaemonSet", "cfnet-agent")]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "cfnet-agent"
    assert pod["automountServiceAccountToken"] is False  # only the projected, pod-bound one
    vols = {v["name"]: v for v in pod["volumes"]}
    sources = vols["config"]["projected"]["sources"]
    assert {"secret": {"name": "cfnet-agent-credentials",
                       "items": [{"key": "ca.crt", "path": "ca.crt"}]}} in sources
    token = vols["enroll-token"]["projected"]["sources"]
    assert {"serviceAccountToken": {"path": "token", "expirationSeconds": 3600}} in token
    conf = yaml.safe_load(objs[("ConfigMap", "cfnet-agent-config")]["data"]["agent.yaml"])
    assert conf["identity"] == "certificate" and "password_file" not in conf
    assert conf["broker_port"] == 8884
    assert objs[("ClusterRole", "cfnet-agent")]["rules"] == [
        {"apiGroups": ["certificates.k8s.io"], "resources": ["certificatesigningrequests"],
         "verbs": ["create", "get"]}]
    enroll = objs[("ClusterRole", "cfnet-core-agent-enrollment")]["rules"]
    assert {"apiGroups": ["certificates.k8s.io"], "resources": ["signers"],
            "resourceNames": ["cfnet.io/agent"], "verbs": ["approve", "sign"]} in enroll
    assert all("*" not in r["verbs"] and "secrets" not in r["resources"] for r in enroll)
    ca_role = objs[("Role", "cfnet-core-agent-ca")]
    assert ca_role["metadata"]["namespace"] == "cfnet-system"
    assert ca_role["rules"] == [
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["cfnet-agent-ca"],
         "verbs": ["get", "update"]}]  # no create: the release makes the Secret
    args = objs[("Deployment", "cfnet-core")]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--agent-ca-secret=cfnet-system/cfnet-agent-ca" in args
    mq = objs[("ConfigMap", "mosquitto-config")]["data"]
    assert "listener 8884" in mq["mosquitto.conf"] and "use_identity_as_username true" in \
        mq["mosquitto.conf"] and "per_listener_settings true" in mq["mosquitto.conf"]
    assert mq["agent-acl"] == (CHART / "files" / "agent-acl").read_text()
    ports = objs[("Service", "mosquitto")]["spec"]["ports"]
    assert {"name": "mqtts-agent", "port": 8884, "targetPort": "mqtts-agent"} in ports
    mpod = objs[("Deployment", "mosquitto")]["spec"]["template"]["spec"]
    agent_ca = next(v for v in mpod["volumes"] if v["name"] == "agent-ca")
    # the CA's certificate only, never its key
    assert {"secret": {"name": "cfnet-agent-ca", "items": [{"key": "tls.crt",
                                                            "path": "ca.crt"}]}} \
        in agent_ca["projected"]["sources"]
