"""The chart's NATS auth callout (``nats.deploy.callout``; cloud_core/bus_callout.py): off by
default; on, every NATS pod gets a ``callout`` sidecar (the core image) that reaches its own
server by its pod name over TLS, with the Secret of seed, password and accounts file; the
accounts.conf ``python -m tools.nats.cluster accounts --callout-...`` renders holds only the
callout's user and the ``auth_callout`` block, and the real nats-server accepts it with the
chart's nats.conf. The callout's behaviour itself: tests/integration/test_bus_callout.py."""

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


def test_off_by_default_and_a_sidecar_when_on() -> None:
    pod = _objs(["nats.mode=deploy"])[("StatefulSet", "nats")]["spec"]["template"]["spec"]  # type: ignore[index]
    assert [c["name"] for c in pod["containers"]] == ["nats"]
    objs = _objs(["nats.mode=deploy", "nats.deploy.callout.enabled=true"])
    pod = objs[("StatefulSet", "nats")]["spec"]["template"]["spec"]  # type: ignore[index]
    side = {c["name"]: c for c in pod["containers"]}["callout"]
    cmd = " ".join(side["command"])
    assert "-m cloud_core.bus_callout" in cmd
    assert "tls://$(POD_NAME).nats-cluster.cfnet-system.svc:4222" in cmd
    vols = {v["name"]: v for v in pod["volumes"]}
    assert vols["callout"]["secret"]["secretName"] == "nats-callout"
    r = chart.helm("lint", "--strict", str(chart.CHART), "--set", "nats.mode=deploy",
                   "--set", "nats.deploy.callout.enabled=true", check=False)
    assert r.returncode == 0, r.stdout + r.stderr


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
    assert nats_main(["accounts", "--pki", pki, "--callout-seed-file", str(tmp_path / "seed"),
                      "--callout-password-file", str(tmp_path / "password"),
                      "--callout-bypass", "cfnet-leaf"]) == 0
    acc = capsys.readouterr().out
    assert account_public(seed) in acc and '"edge-a"' not in acc, acc
    assert '"cfnet-leaf"' in acc
    # The chart's nats.conf with this accounts.conf, as the pod mounts them.
    conf = _objs(["nats.mode=deploy", "nats.deploy.callout.enabled=true"])[
        ("ConfigMap", "nats-config")]["data"]["nats.conf"]  # type: ignore[index]
    etc = tmp_path / "etc" / "nats"
    (etc / "tls").mkdir(parents=True)
    (etc / "accounts").mkdir()
    for src, dst in ((store.broker_cert, "tls.crt"), (store.broker_key, "tls.key"),
                     (store.ca_file, "ca.crt")):
        (etc / "tls" / dst).write_bytes(Path(src).read_bytes())
    (etc / "accounts" / "accounts.conf").write_text(acc)
    text = conf.replace("/etc/nats/", f"{etc}/").replace('"/data"', f'"{tmp_path / "js"}"')
    (etc / "nats.conf").write_text(text)
    r = subprocess.run([str(build_nats()), "-t", "-c", str(etc / "nats.conf")],
                       capture_output=True, text=True, timeout=60,
                       env={**os.environ, "POD_NAME": "nats-0"})
    assert r.returncode == 0, f"nats-server refused the rendered config:\n{r.stderr}{text}"
