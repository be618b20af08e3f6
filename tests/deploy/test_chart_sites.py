"""The chart's agent DaemonSet per edge site (templates/agent-daemonset.yaml with
``nats.leaf.sites``), rendered by the real helm.

Each site's nodes (``nats.leaf.siteLabel`` = the site's ``labelValue``, default its name)
run ``cfnet-agent-<site>``, whose agents take the site leaf's address (``cfnet-bus-<site>``)
instead of the hub's; ``cfnet-agent`` keeps off every site's nodes (``NotIn``), so a node
runs exactly one agent. Which nodes the real DaemonSet controller gives each one:
tests/cluster/test_agent_sites.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tools import helm as chart
from tools.helm import documents, template

LABEL = "node-restriction.kubernetes.io/cfnet-site"
SITES = ["nats.mode=deploy", "nats.leaf.enabled=true",
         "nats.leaf.sites[0].name=siteA", "nats.leaf.sites[0].address=10.1.0.5",
         "nats.leaf.sites[0].nodeSelector.kubernetes\\.io/hostname=edge-gw-a",
         "nats.leaf.sites[1].name=Plant7", "nats.leaf.sites[1].address=edge-b.example.org",
         "nats.leaf.sites[1].nodeSelector.kubernetes\\.io/hostname=edge-gw-b",
         "nats.leaf.sites[1].labelValue=plant-7"]


# helm is built once, at collection (conftest); a failed build fails these tests here.
pytestmark = pytest.mark.usefixtures("helm_built")


def daemonsets(values: list[str]) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in documents(template(values=values))
            if d["kind"] == "DaemonSet"}


def _refused(values: list[str], reason: str) -> None:
    args = [a for v in values for a in ("--set", v)]
    r = chart.helm("template", "t", str(chart.CHART), *args, check=False)
    assert r.returncode != 0 and reason in r.stderr, (values, r.stderr[-2000:])


def test_one_agent_daemonset_per_site_on_its_nodes_with_its_leaf() -> None:
    ds = daemonsets([*SITES, "agent.nodeSelector.kubernetes\\.io/os=linux"])
    assert set(ds) == {"cfnet-agent", "cfnet-agent-sitea", "cfnet-agent-plant7"}
    cloud = ds["cfnet-agent"]["spec"]["template"]["spec"]
    # The cloud agents: the hub's bus, on no site's node (one NotIn over the one label).
    assert cloud["containers"][0]["envFrom"] == [{"configMapRef": {"name": "cfnet-bus"}}]
    assert cloud["nodeSelector"] == {"kubernetes.io/os": "linux"}
    terms = cloud["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [
        {"key": LABEL, "operator": "NotIn", "values": ["siteA", "plant-7"]}]}]
    for name, site, value, bus in (("cfnet-agent-sitea", "siteA", "siteA", "cfnet-bus-sitea"),
                                   ("cfnet-agent-plant7", "Plant7", "plant-7",
                                    "cfnet-bus-plant7")):
        d = ds[name]
        pod = d["spec"]["template"]["spec"]
        # agent.nodeSelector still applies; the site's label narrows it to the site's nodes.
        assert pod["nodeSelector"] == {LABEL: value, "kubernetes.io/os": "linux"}, name
        assert "affinity" not in pod
        assert pod["containers"][0]["envFrom"] == [{"configMapRef": {"name": bus}}]
        # Its own selector (DaemonSet selectors are immutable and must not overlap).
        assert d["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"] == name
        assert d["spec"]["template"]["metadata"]["labels"]["cfnet.io/site"] == site
        # Otherwise the cloud agent's pod: same image, capabilities, mounts, credentials.
        strip = ("nodeSelector", "affinity")
        assert ({k: v for k, v in pod.items() if k not in strip and k != "containers"}
                == {k: v for k, v in cloud.items() if k not in strip and k != "containers"})
        c, cc = pod["containers"][0], cloud["containers"][0]
        assert {k: v for k, v in c.items() if k != "envFrom"} == \
            {k: v for k, v in cc.items() if k != "envFrom"}
    # The bus ConfigMap each site's agents read is the leaf's address (nats-leaf.yaml).
    cms = {d["metadata"]["name"]: d for d in documents(template(values=SITES))
           if d["kind"] == "ConfigMap"}
    assert cms["cfnet-bus-plant7"]["data"]["CFNET_BROKER_HOST"] == "edge-b.example.org"
    r = chart.helm("lint", "--strict", str(chart.CHART),
                   *[a for v in SITES for a in ("--set", v)], check=False)
    assert r.returncode == 0, r.stdout + r.stderr


def test_moving_a_leaf_rolls_only_its_sites_agents() -> None:
    before = daemonsets(SITES)
    after = daemonsets([*SITES, "nats.leaf.sites[0].address=10.1.0.99"])

    def ann(d: dict[str, Any]) -> dict[str, str]:
        return dict(d["spec"]["template"]["metadata"]["annotations"])

    assert ann(before["cfnet-agent-sitea"]) != ann(after["cfnet-agent-sitea"])
    assert ann(before["cfnet-agent-plant7"]) == ann(after["cfnet-agent-plant7"])
    assert ann(before["cfnet-agent"]) == ann(after["cfnet-agent"])


def test_without_sites_the_agent_daemonset_is_as_before() -> None:
    for values in ([], ["nats.mode=deploy"], ["nats.mode=deploy", "nats.leaf.enabled=true"]):
        ds = daemonsets(values)
        assert set(ds) == {"cfnet-agent"}, values
        assert "affinity" not in ds["cfnet-agent"]["spec"]["template"]["spec"], values
    assert daemonsets([*SITES, "agent.enabled=false"]) == {}


def test_site_label_is_a_value_and_bad_ones_are_refused() -> None:
    ds = daemonsets([*SITES, "nats.leaf.siteLabel=example.com/site"])
    assert ds["cfnet-agent-sitea"]["spec"]["template"]["spec"]["nodeSelector"] == {
        "example.com/site": "siteA"}
    terms = ds["cfnet-agent"]["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms[0]["matchExpressions"][0]["key"] == "example.com/site"
    for values, reason in (
            ([*SITES, "nats.leaf.siteLabel=bad label"], "siteLabel"),
            ([*SITES, "nats.leaf.siteLabel=Upper.Example/x"], "siteLabel"),
            ([*SITES, "nats.leaf.sites[0].labelValue=-x"], "labelValue"),
            ([*SITES, f"nats.leaf.sites[0].labelValue={'a' * 64}"], "labelValue"),
            # Two sites on the same nodes would give a node two agents under one name.
            ([*SITES, "nats.leaf.sites[0].labelValue=plant-7"], "a node would run two agents"),
            ([*SITES, "nats.leaf.sites[1].labelValue=siteA"], "a node would run two agents")):
        _refused(values, reason)


def test_site_names_are_refused_as_cfnet_core_refuses_them(tmp_path: Path) -> None:
    """1-32 ASCII letters or digits, at most 1,000 sites: what ``cfnet-core --nats-sites``
    (cloud_core.bus_nats_sites.parse_sites) takes; the chart refuses the rest before anything is
    rendered, naming the value."""
    from cloud_core.bus_nats import NatsIngestError
    from cloud_core.bus_nats_sites import parse_sites

    base = SITES[:2]
    for bad in ("site-a", "s" * 33, "café", "a.b", "a b"):
        _refused([*base, f"nats.leaf.sites[0].name={bad}",
                  "nats.leaf.sites[0].address=10.1.0.5",
                  "nats.leaf.sites[0].nodeSelector.a=b"], "name")
        with pytest.raises(NatsIngestError):
            parse_sites(bad)
    assert parse_sites("s" * 32) == ("s" * 32,)
    assert len(parse_sites(",".join(f"s{i}" for i in range(1000)))) == 1000
    with pytest.raises(NatsIngestError):
        parse_sites(",".join(f"s{i}" for i in range(1001)))

    def sites(n: int) -> Path:
        f = tmp_path / f"sites-{n}.json"
        f.write_text(json.dumps({"nats": {"mode": "deploy", "leaf": {"enabled": True, "sites": [
            {"name": f"s{i}", "address": f"10.2.{i // 250}.{i % 250 + 1}",
             "nodeSelector": {"kubernetes.io/hostname": f"gw-{i}"}} for i in range(n)]}}}))
        return f

    r = chart.helm("template", "t", str(chart.CHART), "-f", str(sites(1001)), check=False)
    assert r.returncode != 0 and "maxItems" in r.stderr.replace(" ", ""), r.stderr[-2000:]
    # 1,000 render (4 MB of DaemonSets: only the first, the cloud one, is parsed).
    out = chart.helm("template", "t", str(chart.CHART), "-f", str(sites(1000)),
                     "--show-only", "templates/agent-daemonset.yaml").stdout
    assert out.count("\nkind: DaemonSet\n") == 1001
    cloud = yaml.safe_load(out.split("\n---\n")[0])
    assert cloud["metadata"]["name"] == "cfnet-agent"
    notin = cloud["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0][
        "matchExpressions"][0]["values"]
    assert len(notin) == 1000


def test_a_one_server_bus_installs_without_mosquitto(tmp_path: Path) -> None:
    """What tests/cluster/test_helm_nats.py installs on its one node: ``nats.deploy.replicas=1``
    renders no cluster block (with one, JetStream waits for a metadata leader among peers
    that never come; the real server accepts the config), and with Mosquitto off the
    agents' broker host defaults to the bus's (it failed: "broker.host is required")."""
    from tests.deploy.test_chart_nats import _check_conf

    values = [*SITES, "mosquitto.enabled=false", "nats.deploy.replicas=1",
              "nats.streamReplicas=1"]
    objs = {(d["kind"], d["metadata"]["name"]): d for d in documents(template(values=values))}
    conf = objs[("ConfigMap", "nats-config")]["data"]["nats.conf"]
    assert "cluster {" not in conf and "stream_replicas: 1" in conf
    _check_conf(tmp_path, conf, env={"NATS_LEAF_PASSWORD": "0123abcd"})
    three = documents(template(values=SITES))
    assert "cluster {" in next(d for d in three if d["metadata"]["name"] == "nats-config")[
        "data"]["nats.conf"]
    agent_yaml = objs[("ConfigMap", "cfnet-agent-config")]["data"]["agent.yaml"]
    assert "broker_host: nats.cfnet-system.svc" in agent_yaml
