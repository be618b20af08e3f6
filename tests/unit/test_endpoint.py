"""How cfnet reads its credentials: kubeconfig (static form read itself, the rest through the
kubernetes loader), in-cluster ServiceAccount, bearer tokens. No API server here; the same
paths against a real one: tests/k8s/test_endpoint_k8s.py and tests/deploy/test_images.py
(in-cluster, in a container)."""

from __future__ import annotations

import base64
import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cloud_core.errors import KubeError
from cloud_core.k8s.client import TOKEN_REREAD_S, Endpoint, LeanHTTP


def kubeconfig(path: Path, user: dict[str, Any], cluster: dict[str, Any] | None = None,
               current: str = "c1") -> Path:
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": current,
        "clusters": [{"name": "k1", "cluster": cluster or {"server": "https://10.0.0.1:6443/"}},
                     {"name": "k2", "cluster": {"server": "https://10.0.0.2:6443"}}],
        "users": [{"name": "u1", "user": user}, {"name": "u2", "user": {"token": "t2"}}],
        "contexts": [{"name": "c1", "context": {"cluster": "k1", "user": "u1"}},
                     {"name": "c2", "context": {"cluster": "k2", "user": "u2"}}],
    }))
    return path


@pytest.mark.parametrize(("user", "cluster", "want"), [
    ({"token": "abc"}, None,
     {"host": "https://10.0.0.1:6443", "token": "abc", "auth": None}),
    ({"client-certificate": "pki/a.crt", "client-key": "/abs/a.key"},
     {"server": "https://h:1", "certificate-authority": "ca.crt"},
     {"cert_file": "{d}/pki/a.crt", "key_file": "/abs/a.key", "ca_file": "{d}/ca.crt"}),
    ({"client-certificate-data": base64.b64encode(b"CERT").decode(),
      "client-key-data": base64.b64encode(b"KEY").decode()},
     {"server": "https://h:1", "certificate-authority-data": base64.b64encode(b"CA").decode(),
      "insecure-skip-tls-verify": True, "tls-server-name": "kubernetes"},
     {"cert_data": b"CERT", "key_data": b"KEY", "ca_data": "CA", "insecure": True,
      "server_name": "kubernetes"}),
    ({"tokenFile": "tok"}, None, {"token_file": "{d}/tok", "token": None}),
], ids=["token", "cert-files-relative", "inline-data", "token-file"])
def test_static_kubeconfig_read_without_the_kubernetes_loader(
        tmp_path: Path, user: dict[str, Any], cluster: dict[str, Any] | None,
        want: dict[str, Any]) -> None:
    ep = Endpoint.from_kubeconfig(str(kubeconfig(tmp_path / "kc", user, cluster)))
    for k, v in want.items():
        assert getattr(ep, k) == (v.format(d=tmp_path) if isinstance(v, str) else v), k
    assert ep.auth is None  # read here, not by kubernetes.config


def test_context_chosen_by_name(tmp_path: Path) -> None:
    kc = kubeconfig(tmp_path / "kc", {"token": "t1"})
    ep = Endpoint.from_kubeconfig(str(kc), context="c2")
    assert (ep.host, ep.token) == ("https://10.0.0.2:6443", "t2")


@pytest.mark.parametrize("doc", [
    "current-context: nowhere\ncontexts: []\n", "[1, 2]\n", "{\n", "contexts: 7\n"])
def test_broken_kubeconfig_is_a_kube_error(tmp_path: Path, doc: str) -> None:
    p = tmp_path / "kc"
    p.write_text(doc)
    with pytest.raises(KubeError, match="cannot load kubeconfig"):
        Endpoint.from_kubeconfig(str(p))


def test_missing_kubeconfig_is_a_kube_error(tmp_path: Path) -> None:
    with pytest.raises(KubeError, match="cannot load kubeconfig"):
        Endpoint.from_kubeconfig(str(tmp_path / "absent"))


def test_exec_plugin_goes_through_the_kubernetes_loader(tmp_path: Path) -> None:
    """A credential plugin (here a tiny script printing an ExecCredential) is the kubernetes
    loader's job: the token comes from its refresh hook."""
    plugin = tmp_path / "plugin.py"
    plugin.write_text('import json\nprint(json.dumps({"apiVersion": '
                      '"client.authentication.k8s.io/v1beta1", "kind": "ExecCredential", '
                      '"status": {"token": "from-exec"}}))\n')
    kc = kubeconfig(tmp_path / "kc", {"exec": {
        "apiVersion": "client.authentication.k8s.io/v1beta1", "command": sys.executable,
        "args": [str(plugin)], "interactiveMode": "Never"}})
    ep = Endpoint.from_kubeconfig(str(kc))
    assert ep.auth is not None and ep.host == "https://10.0.0.1:6443"
    assert LeanHTTP(ep, 1.0).headers(False)["Authorization"] == "Bearer from-exec"


def test_in_cluster_reads_the_service_account(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("tok-1\n")
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}
    ep = Endpoint.in_cluster(env, str(tmp_path))
    assert ep.host == "https://[fd00::1]:443" and ep.ca_file is None
    http = LeanHTTP(ep, 1.0)
    assert http.headers(True)["Authorization"] == "Bearer tok-1"
    (tmp_path / "token").write_text("tok-2\n")  # rotated by the kubelet
    assert http.headers(True)["Authorization"] == "Bearer tok-1"  # re-read once a minute
    http._auth = (time.monotonic() - TOKEN_REREAD_S - 1, http._auth[1])
    assert http.headers(True)["Authorization"] == "Bearer tok-2"


@pytest.mark.parametrize("env", [{}, {"KUBERNETES_SERVICE_HOST": "h"},
                                 {"KUBERNETES_SERVICE_HOST": "h", "KUBERNETES_SERVICE_PORT": ""}])
def test_not_in_a_cluster(tmp_path: Path, env: dict[str, str]) -> None:
    (tmp_path / "token").write_text("t")
    with pytest.raises(KubeError, match="not running in a cluster"):
        Endpoint.in_cluster(env, str(tmp_path))


def test_no_token_file_is_not_in_a_cluster(tmp_path: Path) -> None:
    env = {"KUBERNETES_SERVICE_HOST": "h", "KUBERNETES_SERVICE_PORT": "443"}
    with pytest.raises(KubeError, match="no ServiceAccount token"):
        Endpoint.in_cluster(env, str(tmp_path))


def test_unreadable_certificate_is_a_kube_error(tmp_path: Path) -> None:
    ep = Endpoint(host="https://h:1", cert_file=str(tmp_path / "absent.crt"))
    with pytest.raises(KubeError, match="TLS set-up"):
        LeanHTTP(ep, 1.0)


def test_importing_the_scheduler_does_not_import_the_kubernetes_client() -> None:
    """0.2 s of start-up a scheduler does not need (its kubeconfig is static here)."""
    import subprocess
    out = subprocess.run([sys.executable, "-c", "import sys, cloud_core.main; "
                          "print('kubernetes' in sys.modules)"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_core_asks_for_its_lists_before_importing_the_engine() -> None:
    """cloud_core.main imports at its top only what parsing needs: the placement engine
    (numpy, OR-Tools) comes after the first lists are asked for (k8s/prefetch.py)."""
    import subprocess
    out = subprocess.run([sys.executable, "-c", "import sys, cloud_core.main; "
                          "print(sorted(m for m in ('numpy', 'ortools', 'cloud_core.placement', "
                          "'cloud_core.service') if m in sys.modules))"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_an_unreadable_kubeconfig_stops_the_core_before_it_starts(tmp_path: Path) -> None:
    """The Kubernetes client is set up first now (its lists start right away): a kubeconfig
    that cannot be read exits 2 with the reason, before the database is opened."""
    import subprocess
    db = tmp_path / "core.db"
    out = subprocess.run([sys.executable, "-m", "cloud_core.main", "--kubernetes",
                          "--kubeconfig", str(tmp_path / "absent"), "--db", str(db)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr
    assert "cannot reach the Kubernetes API" in out.stderr
    assert not db.exists()


def test_oversized_kubeconfig_is_refused_before_parsing(tmp_path: Path) -> None:
    from cloud_core.k8s.client import KUBECONFIG_MAX_BYTES
    p = tmp_path / "kc"
    p.write_text("# " + "x" * KUBECONFIG_MAX_BYTES + "\n")
    with pytest.raises(KubeError, match="over"):
        Endpoint.from_kubeconfig(str(p))


_scalar = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=8))
_tree = st.recursive(_scalar, lambda kids: st.one_of(
    st.lists(kids, max_size=3),
    st.dictionaries(st.sampled_from(["name", "context", "cluster", "user", "server", "token",
                                     "tokenFile", "client-certificate-data",
                                     "certificate-authority-data", "exec", "x"]),
                    kids, max_size=4)), max_leaves=12)


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=st.fixed_dictionaries({}, optional={
    "current-context": _scalar, "contexts": _tree, "clusters": _tree, "users": _tree}))
def test_fuzzed_kubeconfig_gives_an_endpoint_or_a_kube_error(tmp_path: Path,
                                                            doc: dict[str, Any]) -> None:
    """Whatever shape the file has: an Endpoint or a KubeError naming the file, nothing else
    (no TypeError/AttributeError from a list where a mapping belongs)."""
    p = tmp_path / "kc"
    p.write_text(json.dumps(doc))
    try:
        Endpoint.from_kubeconfig(str(p))
    except KubeError as e:
        assert "kubeconfig" in str(e)
