"""The chart's NATS option (templates/nats.yaml, the `nats:` block of values.yaml), rendered
by the real helm: off by default (nothing rendered: Mosquitto stays the bus), `external`
writes only the cfnet-bus ConfigMap, `deploy` a 3-node StatefulSet whose config routes to
every pod and whose accounts come from the Secret `python -m tools.nats.cluster accounts`
renders; that rendering is the same users and permissions the test cluster runs with."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tools import helm as chart
from tools.helm import documents, template
from tools.nats.cluster import main as nats_main
from tools.nats.cluster import nats_permissions


@pytest.fixture(scope="module", autouse=True)
def _helm_built() -> Iterator[None]:
    try:
        chart.ensure_helm()
    except (chart.HelmError, subprocess.CalledProcessError) as e:
        pytest.fail(f"cannot build helm: {e}", pytrace=False)
    yield


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
    assert "stream_replicas: 3" in conf and 'include "/etc/nats/accounts/accounts.conf"' in conf
    cm = objs[("ConfigMap", "cfnet-bus")]["data"]  # type: ignore[index]
    assert cm["CFNET_BROKER_HOST"] == "nats.cfnet-system.svc"  # type: ignore[index]
    assert cm["CFNET_BROKER_FAILOVER"].count(":8883") == 3  # type: ignore[index]
    assert ("PodDisruptionBudget", "nats") in objs
    r = chart.helm("lint", "--strict", str(chart.CHART), "--set", "nats.mode=deploy",
                   check=False)
    assert r.returncode == 0, r.stdout + r.stderr


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
