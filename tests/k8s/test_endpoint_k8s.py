"""Credentials against the real API server: each kubeconfig form cfnet reads itself, one read by
the kubernetes loader (an exec plugin), and a wrong CA refused by TLS, not ignored."""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from cloud_core.errors import KubeError, KubeForbidden
from cloud_core.k8s.client import KubeClient
from tools.envtest import ControlPlane


def _kubeconfig(path: Path, server: str, cluster: dict[str, Any], user: dict[str, Any]) -> str:
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "t",
        "clusters": [{"name": "t", "cluster": {"server": server, **cluster}}],
        "users": [{"name": "t", "user": user}],
        "contexts": [{"name": "t", "context": {"cluster": "t", "user": "t"}}]}))
    return str(path)


def _b64(p: str | None) -> str:
    return base64.b64encode(Path(str(p)).read_bytes()).decode()


@pytest.mark.parametrize("form", ["inline-data", "token-file", "exec-plugin"])
def test_kubeconfig_forms_reach_the_api_server(control_plane: ControlPlane, tmp_path: Path,
                                               form: str) -> None:
    adm = control_plane.admin
    assert adm is not None
    cluster: dict[str, Any] = {"certificate-authority-data": _b64(adm.ca_file)}
    if form == "inline-data":
        user: dict[str, Any] = {"client-certificate-data": _b64(adm.cert_file),
                                "client-key-data": _b64(adm.key_file)}
    else:
        token = control_plane.service_account_token("default", "endpoint-test")
        (tmp_path / "tok").write_text(token)
        user = {"tokenFile": "tok"}  # relative to the kubeconfig
        if form == "exec-plugin":
            plugin = tmp_path / "plugin.py"
            plugin.write_text(
                "import json\nprint(json.dumps({'apiVersion': "
                "'client.authentication.k8s.io/v1beta1', 'kind': 'ExecCredential', "
                f"'status': {{'token': {token!r}}}}}))\n")
            user = {"exec": {"apiVersion": "client.authentication.k8s.io/v1beta1",
                             "command": sys.executable, "args": [str(plugin)],
                             "interactiveMode": "Never"}}
    c = KubeClient.from_kubeconfig(_kubeconfig(tmp_path / "kc", adm.host, cluster, user))
    try:
        if form == "inline-data":  # the admin: may list nodes
            assert isinstance(c.list("/api/v1/nodes")[0], list)
        else:  # a ServiceAccount without roles: authenticated, then refused by RBAC
            with pytest.raises(KubeForbidden, match="system:serviceaccount:default:"
                                                    "endpoint-test"):
                c.list("/api/v1/nodes")
    finally:
        c.close()


def test_wrong_ca_is_refused(control_plane: ControlPlane, tmp_path: Path) -> None:
    adm = control_plane.admin
    assert adm is not None
    # The client certificate is not a CA for the server's certificate: TLS must fail.
    kc = _kubeconfig(tmp_path / "kc", adm.host, {"certificate-authority": str(adm.cert_file)},
                     {"client-certificate": adm.cert_file, "client-key": adm.key_file})
    c = KubeClient.from_kubeconfig(kc)
    try:
        with pytest.raises(KubeError, match="CERTIFICATE_VERIFY_FAILED"):
            c.list("/api/v1/nodes")
    finally:
        c.close()


@pytest.mark.parametrize(("name", "ok"), [("kubernetes.default.svc", True),
                                          ("not-the-server.example", False)])
def test_tls_server_name_is_what_the_certificate_is_checked_against(
        control_plane: ControlPlane, tmp_path: Path, name: str, ok: bool) -> None:
    """kubeconfig's tls-server-name: honoured (a name in the server's certificate works over
    127.0.0.1; one that is not fails verification), never ignored."""
    adm = control_plane.admin
    assert adm is not None
    kc = _kubeconfig(tmp_path / "kc", adm.host,
                     {"certificate-authority": adm.ca_file, "tls-server-name": name},
                     {"client-certificate": adm.cert_file, "client-key": adm.key_file})
    c = KubeClient.from_kubeconfig(kc)
    try:
        if ok:
            assert isinstance(c.list("/api/v1/nodes")[0], list)
        else:
            with pytest.raises(KubeError, match="CERTIFICATE_VERIFY_FAILED"):
                c.list("/api/v1/nodes")
    finally:
        c.close()
