"""The chart's NATS option (templates/nats.yaml, the `nats:` block of values.yaml), rendered
by the real helm: off by default (nothing rendered: Mosquitto stays the bus), `external`
writes only the cfnet-bus ConfigMap, `deploy` a 3-node StatefulSet whose config routes to
every pod and whose accounts come from the Secret `python -m tools.nats.cluster accounts`
renders; that rendering is the same users and permissions the test cluster runs with."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tools import helm as chart
from tools.helm import documents, template
from tools.nats.cluster import main as nats_main
from tools.nats.cluster import nats_permissions

# helm is built once, at collection (conftest); a failed build fails these tests here.
pytestmark = pytest.mark.usefixtures("helm_built")


def kinds(values: list[str]) -> dict[tuple[str, str], dict[str, object]]:
    return {(d["kind"], d["metadata"]["name"]): d for d in documents(template(values=values))}


def test_off_by_default_renders_nothing_of_nats() -> None:
    assert not [k for k in kinds([]) if "nats" in k[1] or k[1] == "cfnet-bus"]


def test_external_writes_only_where_the_bus_is() -> None:
    objs = kinds(["nats.mode=external", "nats.external.mqttHost=nats.msg.svc",
                  "nats.external.urls=tls://a:4222\\,tls://b:4222"])
    cm = objs[("ConfigMap", "cfnet-bus")]["data"]
    assert cm["CFNET_BUS"] == "nats" and cm["CFNET_BROKER_HOST"] == "nats.msg.svc"  # type: ignore[index]
    assert cm["CFNET_NATS_URL"] == "tls://a:4222,tls://b:4222"  # type: ignore[index]
    assert ("StatefulSet", "nats") not in objs
    r = chart.helm("template", "t", str(chart.CHART), "--set", "nats.mode=external",
                   check=False)
    assert r.returncode != 0 and "mqttHost is required" in r.stderr


def test_deploy_renders_a_three_node_cluster() -> None:
    objs = kinds(["nats.mode=deploy"])
    sts = objs[("StatefulSet", "nats")]
    assert sts["spec"]["replicas"] == 3  # type: ignore[index]
    conf = objs[("ConfigMap", "nats-config")]["data"]["nats.conf"]  # type: ignore[index]
    for i in range(3):
        assert f"nats-route://nats-{i}.nats-cluster.cfnet-system.svc:6222" in conf
    # nats-server joins an include with the config's directory (/etc/nats): relative.
    assert "stream_replicas: 3" in conf and 'include "accounts/accounts.conf"' in conf
    cm = objs[("ConfigMap", "cfnet-bus")]["data"]  # type: ignore[index]
    assert cm["CFNET_BROKER_HOST"] == "nats.cfnet-system.svc"  # type: ignore[index]
    assert cm["CFNET_BROKER_FAILOVER"].count(":8883") == 3  # type: ignore[index]
    assert ("PodDisruptionBudget", "nats") in objs
    r = chart.helm("lint", "--strict", str(chart.CHART), "--set", "nats.mode=deploy",
                   check=False)
    assert r.returncode == 0, r.stdout + r.stderr


def test_default_image_is_the_version_the_tests_build_and_run() -> None:
    """The integration tests run tools/nats/build.sh's nats-server; the chart's default
    image is that same release, so what is tested is what is deployed."""
    import re

    build = (Path(__file__).parents[2] / "tools" / "nats" / "build.sh").read_text()
    (version,) = re.findall(r'VERSION="\$\{CFNET_NATS_VERSION:-v([0-9.]+)\}"', build)
    sts = kinds(["nats.mode=deploy"])[("StatefulSet", "nats")]
    images = {c["name"]: c["image"] for c in sts["spec"]["template"]["spec"]["containers"]}  # type: ignore[index]
    assert images["nats"] == f"docker.io/library/nats:{version}-alpine", images


def test_accounts_conf_is_rendered_from_the_cert_store(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    from tools.certs import CertStore

    store = CertStore(tmp_path / "pki")
    store.init()
    store.add_account("edge-a", "agent")
    store.add_account("core-0", "core")
    assert nats_main(["accounts", "--pki", str(tmp_path / "pki")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("authorization { users: ")
    assert '"edge-a"' in out and '"MQTT"' in out
    for subj in nats_permissions("edge-a", "agent")["publish"]["allow"]:  # type: ignore[index]
        assert subj in out


# ---------------------------------------------------------------------- edge sites' leaves
SITE = ["nats.mode=deploy", "nats.leaf.enabled=true", "nats.leaf.sites[0].name=siteA",
        "nats.leaf.sites[0].address=10.1.0.5",
        "nats.leaf.sites[0].nodeSelector.kubernetes\\.io/hostname=edge-gw-a"]


def _sets(values: list[str]) -> list[str]:
    return [a for v in values for a in ("--set", v)]


def _check_conf(tmp_path: Path, conf: str, *, env: dict[str, str] | None = None) -> None:
    """``nats-server -t`` on a rendered config whose mounts (/etc/nats/..., /data) are
    files under tmp_path, the config itself at <tmp_path>/etc/nats/nats.conf as in the
    pod: the real server parses it, includes and all."""
    import os

    from tools.certs import CertStore
    from tools.nats.cluster import build_nats, render_accounts
    from tools.nats.leaf import render_remote

    etc = tmp_path / "etc" / "nats"
    (etc / "tls").mkdir(parents=True, exist_ok=True)
    (etc / "accounts").mkdir(exist_ok=True)
    (etc / "leaf").mkdir(exist_ok=True)
    store = CertStore(tmp_path / "pki")
    store.init()
    store.add_account("edge-a", "agent")
    store.add_account("core-0", "core")
    for src, dst in ((store.broker_cert, "tls.crt"), (store.broker_key, "tls.key"),
                     (store.ca_file, "ca.crt")):
        (etc / "tls" / dst).write_bytes(Path(src).read_bytes())
    (etc / "accounts" / "accounts.conf").write_text(render_accounts(store))
    (etc / "leaf" / "remote.conf").write_text(render_remote(
        ["nats-leaf://nats.cfnet-system.svc:7422"], "cfnet-leaf", "0123abcd",
        etc / "tls" / "ca.crt"))
    text = conf.replace("/etc/nats/", f"{etc}/").replace('"/data"', f'"{tmp_path / "js"}"')
    (etc / "nats.conf").write_text(text)
    r = subprocess.run([str(build_nats()), "-t", "-c", str(etc / "nats.conf")],
                       capture_output=True, text=True, timeout=60,
                       env={**os.environ, "POD_NAME": "nats-0",
                            "NATS_CALLOUT_SYS_PASSWORD": "0123sys", **(env or {})})
    assert r.returncode == 0, f"nats-server refused the rendered config:\n{r.stderr}{text}"


def test_leaf_sites_render_a_leaf_node_per_site_that_nats_server_accepts(
        tmp_path: Path) -> None:
    objs = kinds(SITE)
    dep = objs[("Deployment", "nats-leaf-sitea")]
    pod = dep["spec"]["template"]["spec"]  # type: ignore[index]
    assert dep["spec"]["replicas"] == 1 and pod["hostNetwork"] is True  # type: ignore[index]
    assert pod["nodeSelector"] == {"kubernetes.io/hostname": "edge-gw-a"}
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols["uplink"]["secret"]["secretName"] == "nats-leaf"
    assert vols["data"]["hostPath"]["path"] == "/var/lib/cfnet/nats-leaf/siteA"
    conf = objs[("ConfigMap", "nats-leaf-sitea")]["data"]["nats.conf"]  # type: ignore[index]
    assert 'domain: "siteA"' in conf and 'include "leaf/remote.conf"' in conf
    agents = objs[("ConfigMap", "cfnet-bus-sitea")]["data"]  # type: ignore[index]
    assert agents["CFNET_BROKER_HOST"] == "10.1.0.5" and agents["CFNET_BUS"] == "nats"  # type: ignore[index]
    _check_conf(tmp_path / "leaf", conf)
    # The hub listens for leaves, with the password from the Secret, and parses too.
    hub = objs[("ConfigMap", "nats-config")]["data"]["nats.conf"]  # type: ignore[index]
    assert "leafnodes {" in hub and "$NATS_LEAF_PASSWORD" in hub
    env = objs[("StatefulSet", "nats")]["spec"]["template"]["spec"]["containers"][0]["env"]  # type: ignore[index]
    assert {"name": "NATS_LEAF_PASSWORD", "valueFrom": {"secretKeyRef": {
        "name": "nats-leaf", "key": "password"}}} in env
    _check_conf(tmp_path / "hub", hub, env={"NATS_LEAF_PASSWORD": "0123abcd"})
    r = chart.helm("lint", "--strict", str(chart.CHART), *_sets(SITE),
                   check=False)
    assert r.returncode == 0, r.stdout + r.stderr


def test_leaf_off_by_default_and_bad_sites_refused_with_a_reason() -> None:
    assert not [k for k in kinds(["nats.mode=deploy"]) if "leaf" in k[1]]
    assert "leafnodes" not in kinds(["nats.mode=deploy"])[("ConfigMap", "nats-config")][
        "data"]["nats.conf"]  # type: ignore[index]
    for values, reason in (
            (["nats.leaf.enabled=true"], "needs nats.mode"),
            ([*SITE[:2], "nats.leaf.sites[0].name=site-a",
              "nats.leaf.sites[0].address=x", "nats.leaf.sites[0].nodeSelector.a=b"],
             "name"),
            ([*SITE[:3], "nats.leaf.sites[0].nodeSelector.a=b"], "address"),
            ([*SITE[:4]], "nodeSelector"),
            ([*SITE, "nats.leaf.sites[0].hostPath=relative/dir"], "hostPath"),
            ([*SITE, "nats.leaf.sites[1].name=sitea", "nats.leaf.sites[1].address=x",
              "nats.leaf.sites[1].nodeSelector.a=b"], "given twice"),
            ([*SITE[:2], "nats.leaf.sites[0].name=ACK", *SITE[3:]], "sites/0/name")):
        r = chart.helm("template", "t", str(chart.CHART),
                       *_sets(values), check=False)
        assert r.returncode != 0 and reason in r.stderr, (values, r.stderr)


def test_the_core_is_told_the_sites_to_link() -> None:
    """cfnet-bus (the core's envFrom) carries CFNET_NATS_SITES, what `cfnet-core
    --nats-sites` reads (tests/unit/test_bus_adapter.py; linked on a real leaf:
    tests/integration/test_bus_leaf_resume.py)."""
    from cloud_core.bus_nats_sites import parse_sites

    two = [*SITE, "nats.leaf.sites[1].name=siteB", "nats.leaf.sites[1].address=10.1.0.6",
           "nats.leaf.sites[1].nodeSelector.a=b"]
    cm = kinds(two)[("ConfigMap", "cfnet-bus")]["data"]
    assert cm["CFNET_NATS_SITES"] == "siteA,siteB"  # type: ignore[index]
    assert parse_sites(cm["CFNET_NATS_SITES"]) == ("siteA", "siteB")  # type: ignore[index]
    # A site's reports reach the core only through CFNET_INGEST: shared ingest on.
    assert cm["CFNET_SHARE_GROUP"] == "cfnet-core"  # type: ignore[index]
    off = kinds([*two[:1], *two[2:]])[("ConfigMap", "cfnet-bus")]["data"]  # leaf not enabled
    assert off["CFNET_NATS_SITES"] == "" and "CFNET_SHARE_GROUP" not in off  # type: ignore[operator,index]
    r = chart.helm("template", "t", str(chart.CHART), "--set", "nats.mode=external",
                   "--set", "nats.external.mqttHost=m", *_sets(two[1:]), check=False)
    assert r.returncode != 0 and "nats.external.urls" in r.stderr, r.stderr
    core = kinds(two)[("Deployment", "cfnet-core")]["spec"]["template"]["spec"]  # type: ignore[index]
    assert {"configMapRef": {"name": "cfnet-bus"}} in core["containers"][0]["envFrom"]


def test_leaf_remote_conf_is_rendered_for_the_secret(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from tools.nats.leaf import main as leaf_main

    pw = tmp_path / "pw"
    pw.write_text("0123abcd\n")
    assert leaf_main(["remote", "--hub-url", "nats-leaf://hub.example:7422",
                      "--password-file", str(pw)]) == 0
    out = capsys.readouterr().out
    assert "nats-leaf://cfnet-leaf:0123abcd@hub.example:7422" in out
    assert '"deny_exports"' in out and "/etc/nats/tls/ca.crt" in out
    pw.write_text("has@and:colon")
    assert leaf_main(["remote", "--hub-url", "nats-leaf://h:7422",
                      "--password-file", str(pw)]) == 2
    assert "URL-safe" in capsys.readouterr().err
