"""Every value in the chart's values.yaml does what its comment says: the chart is rendered
with the real helm once per changed value, and the rendered objects must say it. Then
values.schema.json: each value outside what is allowed (type, enum, range, unknown key) is
refused by `helm template`, naming the value.

A test below fails when values.yaml gains a key that no case here changes, so a new value
comes with its check."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml

from tools.helm import CHART, HelmError, documents, template

Objs = dict[tuple[str, str], dict[str, Any]]


# helm is built once, at collection (conftest); a failed build fails these tests here.
pytestmark = pytest.mark.usefixtures("helm_built")


def render(values: list[str]) -> Objs:
    return _render(tuple(values))


@functools.cache
def _render(values: tuple[str, ...]) -> Objs:
    """One helm run per distinct set of values (the defaults are rendered once)."""
    return {(d["kind"], d["metadata"]["name"]): d for d in documents(template(values=values))}


def core(o: Objs) -> dict[str, Any]:
    c: dict[str, Any] = o[("Deployment", "cfnet-core")]["spec"]["template"]["spec"]
    return c


def core_c(o: Objs) -> dict[str, Any]:
    c: dict[str, Any] = core(o)["containers"][0]
    return c


def agent(o: Objs) -> dict[str, Any]:
    a: dict[str, Any] = o[("DaemonSet", "cfnet-agent")]["spec"]["template"]["spec"]
    return a


def agent_conf(o: Objs) -> dict[str, Any]:
    c: dict[str, Any] = yaml.safe_load(o[("ConfigMap", "cfnet-agent-config")]["data"]
                                       ["agent.yaml"])
    return c


NATS_EXT = ["nats.mode=external", "nats.external.mqttHost=nats.msg.svc"]


def bus(o: Objs) -> dict[str, str]:
    d: dict[str, str] = o[("ConfigMap", "cfnet-bus")]["data"]
    return d


def nats_pod(o: Objs) -> dict[str, Any]:
    p: dict[str, Any] = o[("StatefulSet", "nats")]["spec"]["template"]["spec"]
    return p


def nats_c(o: Objs) -> dict[str, Any]:
    c: dict[str, Any] = nats_pod(o)["containers"][0]
    return c


LEAF = ["nats.mode=deploy", "nats.leaf.enabled=true", "nats.leaf.sites[0].name=s1",
        "nats.leaf.sites[0].address=10.0.0.9", "nats.leaf.sites[0].nodeSelector.site=s1"]


def leaf_pod(o: Objs) -> dict[str, Any]:
    p: dict[str, Any] = o[("Deployment", "nats-leaf-s1")]["spec"]["template"]["spec"]
    return p


def leaf_conf(o: Objs) -> str:
    c: str = o[("ConfigMap", "nats-leaf-s1")]["data"]["nats.conf"]
    return c


def nats_pvc(o: Objs) -> dict[str, Any]:
    v: dict[str, Any] = o[("StatefulSet", "nats")]["spec"]["volumeClaimTemplates"][0]["spec"]
    return v


def mosq(o: Objs) -> dict[str, Any]:
    m: dict[str, Any] = o[("Deployment", "mosquitto")]["spec"]["template"]["spec"]
    return m


def host_paths(o: Objs) -> dict[str, str]:
    return {v["name"]: v["hostPath"]["path"] for v in agent(o)["volumes"] if "hostPath" in v}


CREDS = ["credentials.create=true", "credentials.caCrt=CA", "credentials.corePassword=c",
         "credentials.agentPassword=a", "agent.identity=password"]

# (the value's path in values.yaml, --set strings, what the rendering must show)
CASES: list[tuple[str, list[str], Callable[[Objs], bool]]] = [
    ("image.registry", ["image.registry=reg.example/x"],
     lambda o: core_c(o)["image"].startswith("reg.example/x/cfnet-core:")
     and agent(o)["containers"][0]["image"].startswith("reg.example/x/cfnet-agent:")),
    ("image.tag", ["image.tag=7.7.7"], lambda o: core_c(o)["image"].endswith(":7.7.7")),
    ("image.pullPolicy", ["image.pullPolicy=Always"],
     lambda o: core_c(o)["imagePullPolicy"] == "Always"
     and agent(o)["containers"][0]["imagePullPolicy"] == "Always"
     and mosq(o)["containers"][0]["imagePullPolicy"] == "Always"),
    ("imagePullSecrets", ["imagePullSecrets[0].name=pull"],
     lambda o: all(p["imagePullSecrets"] == [{"name": "pull"}]
                   for p in (core(o), agent(o), mosq(o)))),
    ("broker.host", ["broker.host=mq.example.org"],
     lambda o: "--broker-host=mq.example.org" in core_c(o)["args"]
     and agent_conf(o)["broker_host"] == "mq.example.org"),
    ("broker.port", ["broker.port=18883", "agent.identity=password"],
     lambda o: "--broker-port=18883" in core_c(o)["args"]
     and agent_conf(o)["broker_port"] == 18883),
    ("broker.certPort", ["broker.certPort=18884"],
     lambda o: agent_conf(o)["broker_port"] == 18884
     and {"name": "mqtts-agent", "port": 18884, "targetPort": "mqtts-agent"}
     in o[("Service", "mosquitto")]["spec"]["ports"]),
    ("broker.tls", ["broker.tls=false", "mosquitto.enabled=false", "broker.host=mq",
                    "agent.identity=password"],  # a client certificate needs TLS
     lambda o: "--no-tls" in core_c(o)["args"]
     and not any(a.startswith("--ca-file") for a in core_c(o)["args"])
     and agent_conf(o)["tls"] is False and "ca_file" not in agent_conf(o)),
    ("broker.agentHost", ["broker.agentHost=203.0.113.7"],
     lambda o: agent_conf(o)["broker_host"] == "203.0.113.7"
     and "--broker-host=mosquitto.cfnet-system.svc" in core_c(o)["args"]),
    ("broker.agentPort", ["broker.agentPort=443"], lambda o: agent_conf(o)["broker_port"] == 443),
    ("credentials.create", CREDS, lambda o: ("Secret", "cfnet-core-mqtt") in o),
    ("credentials.caCrt", CREDS, lambda o: o[("Secret", "cfnet-core-mqtt")]["data"]["ca.crt"]
     == "Q0E="),
    ("credentials.corePassword", CREDS,
     lambda o: o[("Secret", "cfnet-core-mqtt")]["data"]["password"] == "Yw=="),
    ("credentials.agentPassword", CREDS,
     lambda o: o[("Secret", "cfnet-agent-credentials")]["data"]["password"] == "YQ=="),
    ("credentials.coreSecretName", ["credentials.coreSecretName=my-core"],
     lambda o: any(v.get("secret", {}).get("secretName") == "my-core" for v in core(o)["volumes"])),
    ("credentials.agentSecretName", ["credentials.agentSecretName=my-agent"],
     lambda o: {"secret": {"name": "my-agent", "items": [{"key": "ca.crt", "path": "ca.crt"}]}}
     in next(v for v in agent(o)["volumes"] if v["name"] == "config")["projected"]["sources"]),
    ("core.enabled", ["core.enabled=false"],
     lambda o: not [k for k in o if "cfnet-core" in k[1]]),
    ("core.replicas", ["core.replicas=4"],
     lambda o: o[("Deployment", "cfnet-core")]["spec"]["replicas"] == 4),
    ("core.rollingUpdate.maxSurge", ["core.rollingUpdate.maxSurge=1"],
     lambda o: o[("Deployment", "cfnet-core")]["spec"]["strategy"]["rollingUpdate"]
     ["maxSurge"] == 1),
    ("core.rollingUpdate.maxUnavailable", ["core.rollingUpdate.maxUnavailable=25%"],
     lambda o: o[("Deployment", "cfnet-core")]["spec"]["strategy"]["rollingUpdate"]
     ["maxUnavailable"] == "25%"),
    ("core.username", ["core.username=core-x"], lambda o: "--username=core-x" in core_c(o)["args"]),
    ("core.lease.name", ["core.lease.name=my-lease"],
     lambda o: "--lease-name=my-lease" in core_c(o)["args"]
     and any(r.get("resourceNames") == ["my-lease"]
             for r in o[("Role", "cfnet-core-leader-election")]["rules"])
     and ("Lease", "my-lease") in o and ("Lease", "cfnet-core") not in o),
    ("core.lease.durationSeconds", ["core.lease.durationSeconds=30"],
     lambda o: "--lease-duration=30" in core_c(o)["args"]),
    ("core.logFormat", ["core.logFormat=json"], lambda o: "--log-format=json" in core_c(o)["args"]),
    ("core.consoleRoles", ["core.consoleRoles.alice=admin", "core.consoleRoles.bob=viewer"],
     lambda o: "--roles=/etc/cfnet/roles/roles.yaml" in core_c(o)["args"]
     and yaml.safe_load(o[("ConfigMap", "cfnet-core-roles")]["data"]["roles.yaml"])
     == {"operators": {"alice": "admin", "bob": "viewer"}}
     and {"name": "roles", "configMap": {"name": "cfnet-core-roles"}} in core(o)["volumes"]
     and ("ConfigMap", "cfnet-core-roles") not in render([])),
    ("core.edgeTaint", ["core.edgeTaint=ignore"],
     lambda o: "--edge-taint=ignore" in core_c(o)["args"]),
    ("core.metricsPort", ["core.metricsPort=9200"],
     lambda o: "--metrics-port=9200" in core_c(o)["args"]
     and core_c(o)["ports"][0]["containerPort"] == 9200
     and o[("Service", "cfnet-core-metrics")]["spec"]["ports"][0]["port"] == 9200),
    ("core.serviceMonitor.enabled", ["core.serviceMonitor.enabled=true"],
     lambda o: o[("ServiceMonitor", "cfnet-core")]["spec"]["selector"]["matchLabels"].items()
     <= o[("Service", "cfnet-core-metrics")]["metadata"]["labels"].items()),
    ("core.serviceMonitor.interval", ["core.serviceMonitor.enabled=true",
                                      "core.serviceMonitor.interval=15s"],
     lambda o: o[("ServiceMonitor", "cfnet-core")]["spec"]["endpoints"][0]["interval"] == "15s"),
    ("core.serviceMonitor.labels", ["core.serviceMonitor.enabled=true",
                                    "core.serviceMonitor.labels.release=prom"],
     lambda o: o[("ServiceMonitor", "cfnet-core")]["metadata"]["labels"]["release"] == "prom"),
    ("core.extraArgs", ["core.extraArgs[0]=--exact-packing"],
     lambda o: core_c(o)["args"][-1] == "--exact-packing"),
    ("core.resources", ["core.resources.limits.memory=2Gi"],
     lambda o: core_c(o)["resources"]["limits"]["memory"] == "2Gi"),
    ("core.podDisruptionBudget.enabled", ["core.podDisruptionBudget.enabled=false"],
     lambda o: ("PodDisruptionBudget", "cfnet-core") not in o),
    ("core.podDisruptionBudget.minAvailable", ["core.podDisruptionBudget.minAvailable=2"],
     lambda o: o[("PodDisruptionBudget", "cfnet-core")]["spec"]["minAvailable"] == 2),
    ("core.podSecurityContext", ["core.podSecurityContext.runAsUser=1234"],
     lambda o: core(o)["securityContext"]["runAsUser"] == 1234),
    ("core.securityContext", ["core.securityContext.readOnlyRootFilesystem=false"],
     lambda o: core_c(o)["securityContext"]["readOnlyRootFilesystem"] is False),
    ("core.nodeSelector", ["core.nodeSelector.pool=cloud"],
     lambda o: core(o)["nodeSelector"] == {"pool": "cloud"}),
    ("core.tolerations", ["core.tolerations[0].operator=Exists"],
     lambda o: core(o)["tolerations"] == [{"operator": "Exists"}]),
    ("core.serviceAccount.name", ["core.serviceAccount.name=sched"],
     lambda o: core(o)["serviceAccountName"] == "sched" and ("ServiceAccount", "sched") in o
     and ("ClusterRole", "sched") in o),
    ("core.rbac.create", ["core.rbac.create=false"],
     lambda o: not [k for k in o if k[0].endswith(("Role", "RoleBinding"))]),
    ("core.rbac.clusterRules", ["core.rbac.clusterRules[0].apiGroups[0]=",
                                "core.rbac.clusterRules[0].resources[0]=nodes",
                                "core.rbac.clusterRules[0].verbs[0]=get"],
     lambda o: o[("ClusterRole", "cfnet-core")]["rules"] == [
         {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]),
    # One identity per agent (the default) and the shared password it replaces.
    ("agent.identity", ["agent.identity=password"],
     lambda o: agent_conf(o).get("password_file") == "/etc/cfnet-agent/password"
     and "identity" not in agent_conf(o) and agent_conf(o)["broker_port"] == 8883
     and "serviceAccountName" not in agent(o)
     and {"secret": {"name": "cfnet-agent-credentials"}} in next(
         v for v in agent(o)["volumes"] if v["name"] == "config")["projected"]["sources"]
     and not any(a.startswith("--agent-ca-secret") for a in core_c(o)["args"])
     and ("ClusterRole", "cfnet-agent") not in o and ("ServiceAccount", "cfnet-agent") not in o
     and "listener 8884" not in o[("ConfigMap", "mosquitto-config")]["data"]["mosquitto.conf"]),
    ("agent.serviceAccount.name", ["agent.serviceAccount.name=edge-id"],
     lambda o: agent(o)["serviceAccountName"] == "edge-id" and ("ServiceAccount", "edge-id") in o
     and o[("ClusterRoleBinding", "edge-id")]["subjects"][0]["name"] == "edge-id"
     and "--agent-service-account=cfnet-system:edge-id" in core_c(o)["args"]),
    ("agent.caSecretName", ["agent.caSecretName=my-ca"],
     lambda o: "--agent-ca-secret=cfnet-system/my-ca" in core_c(o)["args"]
     and o[("Role", "cfnet-core-agent-ca")]["rules"][0]["resourceNames"] == ["my-ca"]
     and ("Secret", "my-ca") in o
     and {"secret": {"name": "my-ca", "items": [{"key": "tls.crt", "path": "ca.crt"}]}}
     in next(v for v in mosq(o)["volumes"] if v["name"] == "agent-ca")["projected"]["sources"]),
    ("agent.certificateDays", ["agent.certificateDays=30"],
     lambda o: "--agent-cert-days=30" in core_c(o)["args"]),
    ("agent.enabled", ["agent.enabled=false"],
     lambda o: ("DaemonSet", "cfnet-agent") not in o and ("ConfigMap", "cfnet-agent-config")
     not in o),
    ("agent.capabilities", ["agent.capabilities={BPF,PERFMON}"],
     lambda o: agent(o)["containers"][0]["securityContext"]["capabilities"]["add"]
     == ["BPF", "PERFMON"]),
    ("agent.privileged", ["agent.privileged=true"],
     lambda o: agent(o)["containers"][0]["securityContext"] == {"privileged": True}),
    ("agent.intervalSeconds", ["agent.intervalSeconds=5"],
     lambda o: agent_conf(o)["interval_s"] == 5),
    ("agent.ebpf", ["agent.ebpf=false"], lambda o: agent_conf(o)["ebpf"] is False),
    ("agent.probePort", ["agent.probePort=17000"], lambda o: agent_conf(o)["probe_port"] == 17000),
    ("prometheusRule.enabled", ["prometheusRule.enabled=true"],
     lambda o: ("PrometheusRule", "cfnet") in o),
    ("prometheusRule.labels", ["prometheusRule.enabled=true", "prometheusRule.labels.release=kps"],
     lambda o: o[("PrometheusRule", "cfnet")]["metadata"]["labels"]["release"] == "kps"),
    ("agent.metricsPort", ["agent.metricsPort=19109"],
     lambda o: agent_conf(o)["metrics_port"] == 19109
     and agent(o)["containers"][0]["ports"] == [{"name": "metrics", "containerPort": 19109}]),
    ("agent.logFormat", ["agent.logFormat=json"], lambda o: agent_conf(o)["log_format"] == "json"),
    ("agent.tolerations", ["agent.tolerations[0].key=edge", "agent.tolerations[0].operator=Exists"],
     lambda o: agent(o)["tolerations"] == [{"key": "edge", "operator": "Exists"}]),
    ("agent.nodeSelector", ["agent.nodeSelector.edge=yes"],
     lambda o: agent(o)["nodeSelector"] == {"edge": "yes"}),
    ("agent.priorityClassName", ["agent.priorityClassName=high"],
     lambda o: agent(o)["priorityClassName"] == "high"),
    ("agent.resources", ["agent.resources.limits.memory=300Mi"],
     lambda o: agent(o)["containers"][0]["resources"]["limits"]["memory"] == "300Mi"),
    ("agent.maxUnavailable", ["agent.maxUnavailable=3"],
     lambda o: o[("DaemonSet", "cfnet-agent")]["spec"]["updateStrategy"]["rollingUpdate"]
     ["maxUnavailable"] == 3),
    ("agent.hostPaths.btf", ["agent.hostPaths.btf=/b"], lambda o: host_paths(o)["btf"] == "/b"),
    ("agent.hostPaths.tracefs", ["agent.hostPaths.tracefs=/t"],
     lambda o: host_paths(o)["tracefs"] == "/t"),
    ("agent.hostPaths.debugfs", ["agent.hostPaths.debugfs="],
     lambda o: "debugfs" not in host_paths(o)
     and "/sys/kernel/debug" not in {m["mountPath"] for m in agent(o)["containers"][0]
                                     ["volumeMounts"]}),
    ("agent.hostPaths.modules", ["agent.hostPaths.modules=/m"],
     lambda o: host_paths(o)["modules"] == "/m"),
    ("agent.hostPaths.headers", ["agent.hostPaths.headers="],
     lambda o: "headers" not in host_paths(o)),
    ("agent.hostPaths.stateDir", ["agent.hostPaths.stateDir=/data/cfnet"],
     lambda o: host_paths(o)["state"] == "/data/cfnet"
     and agent_conf(o)["buffer_path"] == "/var/lib/cfnet-agent/buffer.db"),
    ("mosquitto.enabled", ["mosquitto.enabled=false", "broker.host=mq"],
     lambda o: ("Deployment", "mosquitto") not in o),
    ("mosquitto.image", ["mosquitto.image=reg/mosq:2"],
     lambda o: mosq(o)["containers"][0]["image"] == "reg/mosq:2"),
    ("mosquitto.authSecretName", ["mosquitto.authSecretName=auth2"],
     lambda o: any(v.get("secret", {}).get("secretName") == "auth2" for v in mosq(o)["volumes"])),
    ("mosquitto.podSecurityContext", ["mosquitto.podSecurityContext.runAsUser=101",
                                      "mosquitto.podSecurityContext.fsGroup=102"],
     lambda o: mosq(o)["securityContext"]["runAsUser"] == 101
     and mosq(o)["securityContext"]["fsGroup"] == 102),
    ("mosquitto.securityContext", ["mosquitto.securityContext.readOnlyRootFilesystem=false"],
     lambda o: mosq(o)["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is False),
    ("mosquitto.service.type", ["mosquitto.service.type=LoadBalancer"],
     lambda o: o[("Service", "mosquitto")]["spec"]["type"] == "LoadBalancer"),
    ("mosquitto.service.certNodePort", ["mosquitto.service.type=NodePort",
                                        "mosquitto.service.certNodePort=30884",
                                        "broker.agentHost=198.51.100.4"],
     lambda o: o[("Service", "mosquitto")]["spec"]["ports"][1]["nodePort"] == 30884
     and agent_conf(o)["broker_port"] == 30884
     and agent_conf(o)["broker_host"] == "198.51.100.4"),
    ("mosquitto.service.nodePort", ["mosquitto.service.type=NodePort",
                                    "mosquitto.service.nodePort=30883",
                                    "broker.agentHost=198.51.100.4", "agent.identity=password"],
     lambda o: o[("Service", "mosquitto")]["spec"]["ports"][0]["nodePort"] == 30883
     and agent_conf(o)["broker_port"] == 30883
     and agent_conf(o)["broker_host"] == "198.51.100.4"),
    ("mosquitto.service.loadBalancerSourceRanges",
     ["mosquitto.service.type=LoadBalancer",
      "mosquitto.service.loadBalancerSourceRanges[0]=192.0.2.0/24"],
     lambda o: o[("Service", "mosquitto")]["spec"]["loadBalancerSourceRanges"]
     == ["192.0.2.0/24"]),
    ("mosquitto.service.annotations", ["mosquitto.service.annotations.lb/x=y"],
     lambda o: o[("Service", "mosquitto")]["metadata"]["annotations"] == {"lb/x": "y"}),
    ("mosquitto.persistence.size", ["mosquitto.persistence.size=5Gi"],
     lambda o: o[("PersistentVolumeClaim", "mosquitto-data")]["spec"]["resources"]["requests"]
     ["storage"] == "5Gi"),
    ("mosquitto.persistence.storageClassName", ["mosquitto.persistence.storageClassName=fast"],
     lambda o: o[("PersistentVolumeClaim", "mosquitto-data")]["spec"]["storageClassName"]
     == "fast"),
    ("mosquitto.resources", ["mosquitto.resources.limits.memory=1Gi"],
     lambda o: mosq(o)["containers"][0]["resources"]["limits"]["memory"] == "1Gi"),
    # the clustered bus (templates/nats.yaml): the core and the agents read cfnet-bus
    ("nats.mode", ["nats.mode=deploy"],
     lambda o: bus(o)["CFNET_BUS"] == "nats" and ("StatefulSet", "nats") in o
     and {"configMapRef": {"name": "cfnet-bus"}} in core_c(o)["envFrom"]
     and {"configMapRef": {"name": "cfnet-bus"}} in agent(o)["containers"][0]["envFrom"]
     and not any(a.startswith("--broker-host") for a in core_c(o)["args"])
     # the chart's NATS checks the enrolled certificate (the callout names the agent by
     # it): the agents enroll and the core signs, as on Mosquitto
     and agent_conf(o).get("identity") == "certificate"
     and any(a.startswith("--agent-ca-secret") for a in core_c(o)["args"])),
    ("nats.streamReplicas", ["nats.mode=deploy", "nats.streamReplicas=2"],
     lambda o: bus(o)["CFNET_NATS_REPLICAS"] == "2"),
    ("nats.external.mqttHost", [*NATS_EXT, "nats.external.mqttHost=bus.example.org"],
     lambda o: bus(o)["CFNET_BROKER_HOST"] == "bus.example.org"),
    ("nats.external.mqttPort", [*NATS_EXT, "nats.external.mqttPort=18883"],
     lambda o: bus(o)["CFNET_BROKER_PORT"] == "18883"),
    ("nats.external.urls", [*NATS_EXT, "nats.external.urls=tls://z:4222"],
     lambda o: bus(o)["CFNET_NATS_URL"] == "tls://z:4222"),
    ("nats.deploy.image", ["nats.mode=deploy", "nats.deploy.image=example.org/nats:9"],
     lambda o: nats_c(o)["image"] == "example.org/nats:9"),
    ("nats.deploy.replicas", ["nats.mode=deploy", "nats.deploy.replicas=5"],
     lambda o: o[("StatefulSet", "nats")]["spec"]["replicas"] == 5),
    ("nats.deploy.clientPort", ["nats.mode=deploy", "nats.deploy.clientPort=14222"],
     lambda o: {"name": "client", "containerPort": 14222} in nats_c(o)["ports"]),
    ("nats.deploy.clusterPort", ["nats.mode=deploy", "nats.deploy.clusterPort=16222"],
     lambda o: {"name": "cluster", "containerPort": 16222} in nats_c(o)["ports"]),
    ("nats.deploy.mqttPort", ["nats.mode=deploy", "nats.deploy.mqttPort=18883"],
     lambda o: {"name": "mqtts", "containerPort": 18883} in nats_c(o)["ports"]
     and bus(o)["CFNET_BROKER_PORT"] == "18883"),
    ("nats.deploy.tlsSecretName", ["nats.mode=deploy", "nats.deploy.tlsSecretName=my-tls"],
     lambda o: any(v.get("secret", {}).get("secretName") == "my-tls"
                   for v in nats_pod(o)["volumes"])),
    ("nats.deploy.accountsSecretName",
     ["nats.mode=deploy", "nats.deploy.accountsSecretName=my-accounts"],
     lambda o: any(v.get("secret", {}).get("secretName") == "my-accounts"
                   for v in nats_pod(o)["volumes"])),
    ("nats.deploy.callout.enabled", ["nats.mode=deploy", "nats.deploy.callout.enabled=true"],
     lambda o: [c["name"] for c in nats_pod(o)["containers"]] == ["nats", "callout"]),
    ("nats.deploy.callout.secretName", ["nats.mode=deploy", "nats.deploy.callout.enabled=true",
                                        "nats.deploy.callout.secretName=my-callout"],
     lambda o: any(v.get("secret", {}).get("secretName") == "my-callout"
                   for v in nats_pod(o)["volumes"])),
    ("core.eviction.excludeNamespaces", ["core.eviction.excludeNamespaces={kube-system,team-a}"],
     lambda o: "--evict-exclude-namespaces=kube-system,team-a" in core_c(o)["args"]),
    ("nats.deploy.storage", ["nats.mode=deploy", "nats.deploy.storage=3Gi"],
     lambda o: nats_pvc(o)["resources"]["requests"]["storage"] == "3Gi"),
    ("nats.deploy.storageClassName", ["nats.mode=deploy", "nats.deploy.storageClassName=fast"],
     lambda o: nats_pvc(o)["storageClassName"] == "fast"),
    ("nats.deploy.maxFileStore", ["nats.mode=deploy", "nats.deploy.maxFileStore=3GB"],
     lambda o: "max_file_store: 3GB" in o[("ConfigMap", "nats-config")]["data"]["nats.conf"]),
    ("nats.deploy.resources", ["nats.mode=deploy", "nats.deploy.resources.limits.memory=3Gi"],
     lambda o: nats_c(o)["resources"]["limits"]["memory"] == "3Gi"),
    # edge sites' leaf nodes (templates/nats-leaf.yaml; tests/deploy/test_chart_nats.py)
    ("nats.leaf.enabled", ["nats.mode=deploy", "nats.leaf.enabled=true"],
     lambda o: "leafnodes {" in o[("ConfigMap", "nats-config")]["data"]["nats.conf"]),
    ("nats.leaf.leafPort", [*LEAF, "nats.leaf.leafPort=17422"],
     lambda o: {"name": "leafnodes", "containerPort": 17422} in nats_c(o)["ports"]),
    ("nats.leaf.secretName", [*LEAF, "nats.leaf.secretName=my-leaf"],
     lambda o: any(v["name"] == "uplink" and v["secret"]["secretName"] == "my-leaf"
                   for v in leaf_pod(o)["volumes"])),
    ("nats.leaf.image", [*LEAF, "nats.leaf.image=example.org/nats:leaf"],
     lambda o: leaf_pod(o)["containers"][0]["image"] == "example.org/nats:leaf"),
    ("nats.leaf.pingInterval", [*LEAF, "nats.leaf.pingInterval=20s"],
     lambda o: 'ping_interval: "20s"' in leaf_conf(o)),
    ("nats.leaf.pingMax", [*LEAF, "nats.leaf.pingMax=7"],
     lambda o: "ping_max: 7" in leaf_conf(o)),
    ("nats.leaf.clientPort", [*LEAF, "nats.leaf.clientPort=14223"],
     lambda o: "listen: 0.0.0.0:14223" in leaf_conf(o)),
    ("nats.leaf.mqttPort", [*LEAF, "nats.leaf.mqttPort=18884"],
     lambda o: o[("ConfigMap", "cfnet-bus-s1")]["data"]["CFNET_BROKER_PORT"] == "18884"),
    ("nats.leaf.sites", LEAF,
     lambda o: ("Deployment", "nats-leaf-s1") in o and ("ConfigMap", "cfnet-bus-s1") in o
     and bus(o)["CFNET_NATS_SITES"] == "s1"  # the core links it (cfnet-core --nats-sites)
     and ("DaemonSet", "cfnet-agent-s1") in o),  # its agents (tests/deploy/test_chart_sites.py)
    ("nats.leaf.monitorPort", [*LEAF, "nats.leaf.monitorPort=18222"],
     lambda o: 'http: "127.0.0.1:18222"' in leaf_conf(o)),
    ("nats.leaf.siteLabel", [*LEAF, "nats.leaf.siteLabel=example.org/site"],
     lambda o: o[("DaemonSet", "cfnet-agent-s1")]["spec"]["template"]["spec"][
         "nodeSelector"] == {"example.org/site": "s1"}),
]


def leaves(d: Any, prefix: str = "") -> Iterator[str]:
    """Dotted paths of values.yaml's values (a map of maps is walked; lists are leaves)."""
    for k, v in d.items():
        path = f"{prefix}{k}"
        if isinstance(v, dict) and v and k not in ("resources", "podSecurityContext",
                                                   "securityContext", "nodeSelector",
                                                   "labels", "annotations"):
            yield from leaves(v, path + ".")
        else:
            yield path


def test_every_value_has_a_case() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    covered = {path for path, _, _ in CASES}
    missing = sorted(p for p in leaves(values) if p not in covered)
    assert not missing, f"values without a rendering check here: {missing}"


@pytest.mark.parametrize(("path", "values", "check"), CASES, ids=[c[0] for c in CASES])
def test_value_reaches_the_objects(path: str, values: list[str],
                                   check: Callable[[Objs], bool]) -> None:
    objs = render(values)
    assert check(objs), f"{path}: the rendering with {values} does not show it"
    default = render([])
    if path not in ("mosquitto.service.loadBalancerSourceRanges",):
        # The default rendering must not already pass (the check would prove nothing).
        try:
            already = check(default)
        except (KeyError, IndexError, StopIteration, TypeError):
            already = False
        assert not already, f"{path}: the check also holds for the defaults"


BAD = [
    ("core.replicas=0", "core.replicas"),
    ("core.replicas=two", "core.replicas"),
    ("core.rollingUpdate.maxSurge=150%", "core.rollingUpdate/maxSurge"),
    ("core.logFormat=xml", "core.logFormat"),
    ("agent.logFormat=yaml", "agent.logFormat"),
    ("core.edgeTaint=maybe", "core.edgeTaint"),
    ("core.lease.name=Bad_Name", "core.lease.name"),
    ("core.consoleRoles.alice=root", "core.consoleRoles"),
    ("core.lease.durationSeconds=1", "core.lease.durationSeconds"),
    ("core.metricsPort=70000", "core.metricsPort"),
    ("broker.port=0", "broker.port"),
    ("broker.tls=maybe", "broker.tls"),
    ("agent.probePort=-1", "agent.probePort"),
    ("agent.metricsPort=0", "agent.metricsPort"),
    ("prometheusRule.enabled=maybe", "prometheusRule.enabled"),
    ("agent.intervalSeconds=0", "agent.intervalSeconds"),
    ("agent.capabilities={cap_bpf}", "agent.capabilities"),
    ("agent.hostPaths.stateDir=relative", "agent.hostPaths.stateDir"),
    ("mosquitto.service.type=ExternalName", "mosquitto.service.type"),
    ("mosquitto.service.nodePort=80", "mosquitto.service.nodePort"),
    ("image.pullPolicy=Sometimes", "image.pullPolicy"),
    ("core.extraArgs[0]=rm", "core.extraArgs"),
    ("core.rbac.clusterRules[0].verbs[0]=destroy", "core.rbac.clusterRules"),
    ("broker.tls=false", "tls"),  # the chart's Mosquitto is TLS only
    # and a client certificate needs TLS, whatever the broker
    ("broker.tls=false --set mosquitto.enabled=false --set broker.host=mq", "tls"),
    ("mosquitto.service.nodePort=30001", "nodePort"),  # a ClusterIP would ignore it
    ("nats.mode=on", "nats.mode"),
    ("nats.streamReplicas=0", "nats.streamReplicas"),
    ("nats.deploy.replicas=0", "nats.deploy.replicas"),
    ("nats.deploy.tlsSecretName=Bad_Name", "nats.deploy.tlsSecretName"),
    ("nats.leaf.pingInterval=soon", "nats.leaf.pingInterval"),
    ("nats.leaf.leafPort=70000", "nats.leaf.leafPort"),
    ("agent.identity=token", "agent.identity"),
    ("agent.serviceAccount.name=Bad_Name", "agent.serviceAccount.name"),
    ("agent.caSecretName=", "agent.caSecretName"),
    ("agent.certificateDays=0", "agent.certificateDays"),
    ("broker.certPort=0", "broker.certPort"),
    ("mosquitto.service.certNodePort=30002", "certNodePort"),  # a ClusterIP would ignore it
    ("core.eviction.excludeNamespaces[0]=Bad_NS", "core.eviction.excludeNamespaces"),
    ("core.typo=1", "typo"),
    ("agentt.enabled=true", "agentt"),
]


@pytest.mark.parametrize(("bad", "field"), BAD, ids=[b[0] for b in BAD])
def test_schema_refuses(bad: str, field: str) -> None:
    with pytest.raises(HelmError) as e:
        template(values=[bad])
    text = str(e.value)
    assert "values don't meet the specifications of the schema" in text, text
    assert field.split(".")[-1].split("[")[0] in text, text
