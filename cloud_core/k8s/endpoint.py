"""Where the Kubernetes API server is and who cfnet is to it: an ``Endpoint``.

``Endpoint.from_kubeconfig`` reads the common static form of a kubeconfig itself (server, CA,
client certificate and key, token, token file; files or inline data) and hands anything else
(``exec`` plugins, ``auth-provider``, several files in one ``KUBECONFIG``) to
``kubernetes.config``, imported only then, whose token refresh hook it keeps calling: the
generated ``kubernetes`` client is on no request path, and importing it costs a scheduler
~0.2 s of start-up. ``Endpoint.in_cluster`` reads a pod's ServiceAccount.
"""

from __future__ import annotations

import base64
import os
import ssl
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from cloud_core.errors import KubeError

# In-cluster credentials (a ServiceAccount's projected token, rotated by the kubelet).
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
TOKEN_REREAD_S = 60.0  # as client-go and the kubernetes client re-read a rotated token

# A kubeconfig is read whole before YAML sees it: bounded.
KUBECONFIG_MAX_BYTES = 1 << 20

# What ``Endpoint.from_kubeconfig`` reads itself; any other key needs ``kubernetes.config``.
_STATIC_USER = frozenset({"client-certificate", "client-certificate-data", "client-key",
                          "client-key-data", "token", "tokenFile"})
_STATIC_CLUSTER = frozenset({"server", "certificate-authority", "certificate-authority-data",
                             "insecure-skip-tls-verify", "tls-server-name"})


@dataclass(frozen=True)
class Endpoint:
    """One API server and one identity: where to connect and how to authenticate.

    ``token_file`` is re-read every ``TOKEN_REREAD_S`` (rotated ServiceAccount tokens);
    ``auth`` (a kubeconfig read by ``kubernetes.config``) is asked once a second, as its
    refresh hook (``exec`` plugins, OIDC) decides itself when to fetch a new token.
    """

    host: str
    ca_file: str | None = None
    ca_data: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    cert_data: bytes | None = None
    key_data: bytes | None = None
    token: str | None = None
    token_file: str | None = None
    insecure: bool = False
    server_name: str | None = None
    auth: Callable[[], str | None] | None = None

    @classmethod
    def from_token(cls, host: str, token: str, ca_file: str | None) -> Endpoint:
        return cls(host=host, token=token, ca_file=ca_file or None)

    @classmethod
    def in_cluster(cls, environ: Mapping[str, str] | None = None,
                   sa_dir: str = SA_DIR) -> Endpoint:
        """The pod's ServiceAccount, as client-go's ``rest.InClusterConfig`` reads it."""
        env = os.environ if environ is None else environ
        host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
        if not host or not port:
            raise KubeError("not running in a cluster: KUBERNETES_SERVICE_HOST/PORT unset")
        token_file = os.path.join(sa_dir, "token")
        if not os.path.isfile(token_file):
            raise KubeError(f"not running in a cluster: no ServiceAccount token {token_file}")
        ca = os.path.join(sa_dir, "ca.crt")
        hostport = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        return cls(host=f"https://{hostport}", token_file=token_file,
                   ca_file=ca if os.path.isfile(ca) else None)

    @classmethod
    def from_kubeconfig(cls, path: str, context: str | None = None) -> Endpoint:
        """A kubeconfig's context (``current-context`` by default)."""
        if os.pathsep in path:  # several files merged: the kubernetes loader's job
            return cls._kubernetes_loader(path, context)
        try:
            with open(path, "rb") as f:
                raw = f.read(KUBECONFIG_MAX_BYTES + 1)
            if len(raw) > KUBECONFIG_MAX_BYTES:
                raise KubeError(f"cannot load kubeconfig {path}: over "
                                f"{KUBECONFIG_MAX_BYTES} bytes")
            doc = yaml.load(raw.decode(), Loader=yaml.CSafeLoader)
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
            raise KubeError(f"cannot load kubeconfig {path}: {e}") from e
        try:
            ctx_name = context or doc["current-context"]
            ctx = _named(doc, "contexts", ctx_name)["context"]
            cluster = _named(doc, "clusters", ctx["cluster"])["cluster"]
            user = _named(doc, "users", ctx["user"])["user"] if ctx.get("user") else {}
            server = cluster["server"]
        except (KeyError, TypeError, AttributeError) as e:
            raise KubeError(f"cannot load kubeconfig {path}: missing {e}") from e
        if not isinstance(server, str) or not server.startswith(("https://", "http://")):
            raise KubeError(f"cannot load kubeconfig {path}: server is not an http(s) URL")
        if (not isinstance(user, dict) or not isinstance(cluster, dict)
                or set(user) - _STATIC_USER or set(cluster) - _STATIC_CLUSTER):
            return cls._kubernetes_loader(path, context)
        base = os.path.dirname(os.path.abspath(path))

        def file(v: Any) -> str | None:  # relative to the kubeconfig, as kubectl reads them
            return os.path.join(base, str(v)) if v else None

        def data(v: Any) -> bytes | None:
            try:
                return base64.b64decode(str(v), validate=True) if v else None
            except ValueError as e:  # binascii.Error
                raise KubeError(f"cannot load kubeconfig {path}: bad base64: {e}") from e

        ca_data = data(cluster.get("certificate-authority-data"))
        try:
            ca_pem = ca_data.decode() if ca_data else None
        except UnicodeDecodeError as e:
            raise KubeError(f"cannot load kubeconfig {path}: CA data is not PEM") from e
        return cls(host=server.rstrip("/"),
                   ca_file=file(cluster.get("certificate-authority")),
                   ca_data=ca_pem,
                   cert_file=file(user.get("client-certificate")),
                   key_file=file(user.get("client-key")),
                   cert_data=data(user.get("client-certificate-data")),
                   key_data=data(user.get("client-key-data")),
                   token=str(user["token"]) if user.get("token") else None,
                   token_file=file(user.get("tokenFile")),
                   insecure=bool(cluster.get("insecure-skip-tls-verify")),
                   server_name=cluster.get("tls-server-name") or None)

    @classmethod
    def _kubernetes_loader(cls, path: str, context: str | None) -> Endpoint:
        """``kubernetes.config`` for what the static reader does not do (exec, auth-provider,
        merged files); its refresh hook stays the source of the bearer token."""
        # imported here: 0.2 s of start-up, and only this rare path needs it
        from kubernetes import client as k8s
        from kubernetes import config as k8s_config

        cfg = k8s.Configuration()
        try:
            k8s_config.load_kube_config(  # type: ignore[no-untyped-call]  # no hints upstream
                config_file=path, context=context, client_configuration=cfg,
                persist_config=False)
        except Exception as e:  # a third-party loader on an operator's file: any failure
            raise KubeError(f"cannot load kubeconfig {path}: {e}") from e
        if cfg.proxy:
            raise KubeError(f"kubeconfig {path}: proxy-url is not supported")

        def auth() -> str | None:
            st = cfg.auth_settings().get("BearerToken")
            return str(st["value"]) if st and st.get("value") else None

        return cls(host=str(cfg.host).rstrip("/"), ca_file=cfg.ssl_ca_cert or None,
                   cert_file=cfg.cert_file or None, key_file=cfg.key_file or None,
                   insecure=not cfg.verify_ssl, server_name=cfg.tls_server_name or None,
                   auth=auth)

    def ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=self.ca_file, cadata=self.ca_data)
        if self.cert_file:
            ctx.load_cert_chain(self.cert_file, self.key_file)
        elif self.cert_data:
            # ssl loads a client certificate from files only: a private directory, removed
            # as soon as the context holds the key.
            with tempfile.TemporaryDirectory(prefix="cfnet-tls-") as d:
                cert, key = os.path.join(d, "tls.crt"), os.path.join(d, "tls.key")
                for p, b in ((cert, self.cert_data), (key, self.key_data or b"")):
                    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                    with os.fdopen(fd, "wb") as f:
                        f.write(b)
                ctx.load_cert_chain(cert, key if self.key_data else None)
        if self.insecure:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        return ctx


def _named(doc: Any, section: str, name: Any) -> Any:
    for entry in doc.get(section) or []:
        if isinstance(entry, dict) and entry.get("name") == name:
            return entry
    raise KeyError(f"{section[:-1]} {name!r}")
