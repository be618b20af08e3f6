"""The chart's NATS auth callout (``nats.deploy.callout``; cloud_core/bus_callout.py): on by
default; every NATS pod gets a ``callout`` sidecar (the core image) that reaches its own
server by its pod name over TLS, with the Secret of seed, password, system-account password
and accounts file; with ``agent.identity: certificate`` (the default) the MQTT listener
checks a presented client certificate against the agent CA (``verify: "optional"``) and the
callout names the agent by it (``--agent-ca``), the agents enroll as on Mosquitto; with
``nats.leaf`` or the callout off they keep the password. The accounts.conf ``python -m
tools.nats.cluster accounts --callout-...`` renders holds only the callout's users and the
``auth_callout`` block, and the real nats-server accepts it with the chart's nats.conf. The
callout's behaviour itself: tests/integration/test_bus_callout.py,
tests/integration/test_bus_agent_certs.py."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from cloud_core.bus_callout import account_public
from tools import helm as chart
from tools.certs import CertStore
from tools.helm import documents, template
from tools.nats.cluster import build_nats
from tools.nats.cluster import main as nats_main

# helm is built once, at collection (conftest); a failed build fails these tests here.
pytestmark = pytest.mark.usefixtures("helm_built")


def _objs(values: list[str]) -> dict[tuple[str, str], dict[str, object]]:
    return {(d["kind"], d["metadata"]["name"]): d for d in documents(template(values=values))}


def test_on_by_default_with_agent_certificates() -> None:
    objs = _objs(["nats.mode=deploy"])
    pod = objs[("StatefulSet", "nats")]["spec"]["template"]["spec"]  # type: ignore[index]
    side = {c["name"]: c for c in pod["containers"]}["callout"]
    cmd = " ".join(side["command"])
    assert "-m cloud_core.bus_callout" in cmd
    assert "tls://$(POD_NAME).nats-cluster.cfnet-system.svc:4222" in cmd
    assert "--agent-ca /etc/nats/agent-ca/ca.crt" in cmd and "--sys-user cfnet-callout-sys" in cmd
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols["callout"]["secret"]["secretName"] == "nats-callout"
    assert vols["agent-ca"]["secret"]["secretName"] == "cfnet-agent-ca"
    assert vols["agent-ca"]["secret"]["items"] == [{"key": "tls.crt", "path": "ca.crt"}]
    conf = objs[("ConfigMap", "nats-config")]["data"]["nats.conf"]  # type: ignore[index]
    assert 'ca_file: "/etc/nats/agent-ca/ca.crt", verify: "optional"' in conf
    assert "system_account: SYS" in conf
    # The agents enroll (CSR RBAC, the core signs) and keep no shared password.
    assert ("ServiceAccount", "cfnet-agent") in objs
    ds = objs[("DaemonSet", "cfnet-agent")]["spec"]["template"]["spec"]  # type: ignore[index]
    assert "enroll-token" in json.dumps(ds)  # the pod-bound token it files its CSR with
    r = chart.helm("lint", "--strict", str(chart.CHART), "--set", "nats.mode=deploy",
                   check=False)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("values", [
    ["nats.deploy.callout.enabled=false"],  # no callout: nothing names an agent by it
    ["agent.identity=password"],
    ["nats.leaf.enabled=true", "nats.leaf.sites[0].name=siteA",  # a leaf has no callout
     "nats.leaf.sites[0].address=10.1.0.5",
     "nats.leaf.sites[0].nodeSelector.kubernetes\\.io/hostname=edge-gw-a"],
])
def test_agents_keep_the_password_without_the_callout_or_at_sites(values: list[str]) -> None:
    objs = _objs(["nats.mode=deploy", *values])
    conf = objs[("ConfigMap", "nats-config")]["data"]["nats.conf"]  # type: ignore[index]
    assert 'verify: "optional"' not in conf
    pod = objs[("StatefulSet", "nats")]["spec"]["template"]["spec"]  # type: ignore[index]
    assert "agent-ca" not in {v["name"] for v in pod["volumes"]}
    ds = objs[("DaemonSet", "cfnet-agent")]["spec"]["template"]["spec"]  # type: ignore[index]
    assert "enroll-token" not in json.dumps(ds)
    assert '{"secret": {"name": "cfnet-agent-credentials"}}' in json.dumps(ds)  # its password


def test_callout_accounts_and_conf_are_rendered_and_accepted_by_nats_server(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = CertStore(tmp_path / "pki")
    store.init()
    store.add_account("edge-a", "agent")
    store.add_account("ops", "operator")
    pki = str(tmp_path / "pki")
    assert nats_main(["callout-seed"]) == 0
    seed = capsys.readouterr().out.strip()
    assert seed.startswith("SA")
    (tmp_path / "seed").write_text(seed)
    (tmp_path / "password").write_text("callout-pw-0123")
    assert nats_main(["callout-accounts", "--pki", pki]) == 0
    users = json.loads(capsys.readouterr().out)["users"]
    assert users["edge-a"]["client_ids"] == ["agent-edge-a", "edge-a"]
    assert users["ops"]["server_assigned"] and not users["edge-a"]["server_assigned"]
    assert nats_main(["callout-accounts", "--pki", pki, "--revoke", "edge-b"]) == 0
    agents = json.loads(capsys.readouterr().out)["cert_agents"]
    assert agents["revoked"] == ["edge-b"] and agents["client_ids"] == ["__NODE__",
                                                                          "agent-__NODE__"]
    assert nats_main(["accounts", "--pki", pki, "--callout-seed-file", str(tmp_path / "seed"),
                      "--callout-password-file", str(tmp_path / "password"),
                      "--callout-bypass", "cfnet-leaf"]) == 0
    acc = capsys.readouterr().out
    assert account_public(seed) in acc and '"edge-a"' not in acc, acc
    assert '"cfnet-leaf"' in acc and '"cfnet-callout-sys"' in acc
    # The chart's nats.conf with this accounts.conf, as the pod mounts them.
    conf = _objs(["nats.mode=deploy"])[
        ("ConfigMap", "nats-config")]["data"]["nats.conf"]  # type: ignore[index]
    etc = tmp_path / "etc" / "nats"
    (etc / "tls").mkdir(parents=True)
    (etc / "accounts").mkdir()
    (etc / "agent-ca").mkdir()
    (etc / "agent-ca" / "ca.crt").write_bytes(Path(store.ca_file).read_bytes())
    for src, dst in ((store.broker_cert, "tls.crt"), (store.broker_key, "tls.key"),
                     (store.ca_file, "ca.crt")):
        (etc / "tls" / dst).write_bytes(Path(src).read_bytes())
    (etc / "accounts" / "accounts.conf").write_text(acc)
    text = conf.replace("/etc/nats/", f"{etc}/").replace('"/data"', f'"{tmp_path / "js"}"')
    (etc / "nats.conf").write_text(text)
    r = subprocess.run([str(build_nats()), "-t", "-c", str(etc / "nats.conf")],
                       capture_output=True, text=True, timeout=60,
                       env={**os.environ, "POD_NAME": "nats-0",
                            "NATS_CALLOUT_SYS_PASSWORD": "0123sys"})
    assert r.returncode == 0, f"nats-server refused the rendered config:\n{r.stderr}{text}"


@pytest.mark.parametrize("callout", [True, False])
def test_a_sites_leaf_reads_the_plain_accounts_when_the_hub_has_the_callout(
        callout: bool) -> None:
    """The hub's accounts.conf in its callout form admits only through the callout, which a
    leaf does not run: with the callout on, the leaf mounts the Secret's
    leaf-accounts.conf (the plain users) as its accounts.conf; without, the hub's own."""
    objs = _objs(["nats.mode=deploy", f"nats.deploy.callout.enabled={str(callout).lower()}",
                  "nats.leaf.enabled=true", "nats.leaf.sites[0].name=siteA",
                  "nats.leaf.sites[0].address=10.1.0.5",
                  "nats.leaf.sites[0].nodeSelector.kubernetes\\.io/hostname=edge-gw-a"])
    pod = objs[("Deployment", "nats-leaf-sitea")]["spec"]["template"]["spec"]  # type: ignore[index]
    secret = {v["name"]: v for v in pod["volumes"]}["accounts"]["secret"]
    assert secret["secretName"] == "nats-accounts"
    if callout:
        assert secret["items"] == [{"key": "leaf-accounts.conf", "path": "accounts.conf"}]
    else:
        assert "items" not in secret
    conf = objs[("ConfigMap", "nats-leaf-sitea")]["data"]["nats.conf"]  # type: ignore[index]
    assert 'include "accounts/accounts.conf"' in conf and "auth_callout" not in conf
