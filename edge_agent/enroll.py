"""The agent's own broker identity: a key made here, a certificate from the cluster.

With ``identity: certificate`` (the Helm chart's default) the agent, before it connects:

1. keeps a private key in ``identity_dir`` (EC P-256, file mode 0600, made once);
2. reuses ``client.crt`` there when it is for this node, matches the key and is not in the
   last third of its life (while it runs, :class:`Renewer` renews it in place when it gets
   there);
3. otherwise files a ``certificates.k8s.io/v1`` CertificateSigningRequest (signer
   ``cfnet.io/agent``, CN = the node name, usages client auth) with its pod-bound
   ServiceAccount token, and waits, bounded, until the leading core has approved and signed
   it (or denied it: then it stops with the core's reason).

The broker's certificate listener takes the certificate's CN as the MQTT username, so the
node name the agent publishes under is the one the API server bound its token to
(docs/security.md, "One identity per agent"). The API server is spoken to with the standard
library only (three calls: create, get, and nothing else); the key, the CSR and the reading
of the certificate are Debian's ``openssl`` command (:func:`_openssl` says why not a library).
"""

from __future__ import annotations

import base64
import datetime as dt
import http.client
import json
import logging
import os
import shutil
import ssl
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from edge_agent.errors import AgentError
from edge_agent.wire import valid_id

log = logging.getLogger(__name__)

SIGNER_NAME = "cfnet.io/agent"
CSR_PATH = "/apis/certificates.k8s.io/v1/certificatesigningrequests"
SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
MAX_RESPONSE_BYTES = 1 << 20
KEY_FILE = "client.key"
CERT_FILE = "client.crt"


class EnrollError(AgentError):
    """No certificate: the API server cannot be reached, or the CSR was denied or failed."""


@dataclass(frozen=True, slots=True)
class EnrollSettings:
    node: str
    identity_dir: Path
    api_server: str  # https://host:port
    token_file: Path = SA_DIR / "token"
    ca_file: Path | None = SA_DIR / "ca.crt"
    timeout_s: float = 600.0
    poll_s: float = 1.0
    expiration_s: int | None = None  # spec.expirationSeconds (None: the signer's default)


def api_server_from_env(environ: dict[str, str] | None = None) -> str:
    """The in-cluster API server (the variables the kubelet sets in every pod), or ""."""
    env = os.environ if environ is None else environ
    host = env.get("KUBERNETES_SERVICE_HOST", "")
    port = env.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        return ""
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


def _openssl(*args: str, what: str) -> bytes:
    """Run Debian's ``openssl`` command with a fixed argv (no shell; the only variable parts
    are our own file paths and a node name checked by :func:`make_csr`) and return stdout.

    Why a command and not a Python X.509 library: the agent needs four things (make a P-256
    key, write a CSR, read a certificate's subject and dates, compare public keys), and PyCA's
    ``cryptography`` costs the agent image ~17 MB (with cffi) for them. The ``openssl`` CLI
    (~1.5 MB on top of the libssl3 Python's ssl already needs) is OpenSSL's own, stable,
    documented interface; ctypes to libcrypto would need hand-declared OpenSSL 3 prototypes,
    pointer ownership and error-queue handling for each call, and one wrong signature is a
    crash in the agent, not an error. ``OPENSSL_CONF=/dev/null``: no site configuration (engines,
    providers) changes what these calls do."""
    exe = shutil.which("openssl")
    if exe is None:
        raise EnrollError("identity certificate: the openssl command is needed (Debian's "
                          "openssl package)")
    try:
        r = subprocess.run([exe, *args], stdin=subprocess.DEVNULL, capture_output=True,
                           timeout=30, check=False,
                           env={"OPENSSL_CONF": "/dev/null", "PATH": "/usr/bin:/bin"})
    except (OSError, subprocess.TimeoutExpired) as e:
        raise EnrollError(f"{what}: openssl: {e}") from e
    if r.returncode != 0:
        err = r.stderr.decode(errors="replace").strip().splitlines()
        raise EnrollError(f"{what}: openssl {args[0]}: {err[0] if err else r.returncode}")
    return r.stdout


def load_or_make_key(path: Path) -> Path:
    """The agent's private key file: checked (an EC key), or made (P-256) and written 0600
    before any use."""
    if path.exists():
        text = _openssl("pkey", "-in", str(path), "-noout", "-text_pub", "-passin", "pass:",
                        what=f"cannot read the agent key {path}")
        if b"\nASN1 OID: " not in text:  # the named curve an EC key has, and no other has
            raise EnrollError(f"agent key {path} is not an EC key")
        return path
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    pem = _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
                   what="cannot make the agent key")
    if not pem.startswith(b"-----BEGIN PRIVATE KEY-----"):
        raise EnrollError("cannot make the agent key: openssl wrote no PEM key")
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, pem)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return path


def public_key_pem(key_file: Path) -> bytes:
    """The public half of the agent's key (SubjectPublicKeyInfo PEM)."""
    return _openssl("pkey", "-in", str(key_file), "-pubout", "-passin", "pass:",
                    what=f"cannot read the agent key {key_file}")


@dataclass(frozen=True, slots=True)
class CertInfo:
    """What the agent reads from its certificate."""
    cn: str
    not_before: float  # epoch seconds
    not_after: float
    public_key: bytes  # SubjectPublicKeyInfo PEM


def read_cert(path: Path) -> CertInfo:
    """Subject CN, validity and public key of the PEM certificate in ``path``."""
    what = f"cannot read the certificate {path}"
    out = _openssl("x509", "-in", str(path), "-noout", "-subject", "-nameopt", "RFC2253",
                   "-startdate", "-enddate", what=what)
    pub = _openssl("x509", "-in", str(path), "-noout", "-pubkey", what=what)
    fields = dict(line.split("=", 1) for line in out.decode(errors="replace").splitlines()
                  if "=" in line)
    try:
        start = ssl.cert_time_to_seconds(fields["notBefore"])
        end = ssl.cert_time_to_seconds(fields["notAfter"])
    except (KeyError, ValueError) as e:
        raise EnrollError(f"{what}: no validity dates") from e
    cn = ""
    for rdn in fields.get("subject", "").split(","):
        if rdn.startswith("CN="):
            cn = rdn[3:]
    return CertInfo(cn=cn, not_before=float(start), not_after=float(end), public_key=pub)


def usable_cert(path: Path, key_file: Path, node: str, now: dt.datetime | None = None) -> bool:
    """``path`` holds a certificate for ``node`` and this key, short of its last third."""
    if not path.exists():
        return False
    try:
        cert = read_cert(path)
        pub = public_key_pem(key_file)
    except EnrollError:
        return False
    t = (now or dt.datetime.now(dt.UTC)).timestamp()
    if cert.cn != node or cert.public_key != pub:
        return False
    return t < cert.not_after - (cert.not_after - cert.not_before) / 3


def make_csr(key_file: Path, node: str) -> bytes:
    """A PKCS#10 request signed with the agent's key, subject CN = ``node`` and nothing else.
    ``node`` must be a valid id (lower-case letters, digits, '.', '_', '-'): none of those is
    special in openssl's ``-subj`` syntax, so the subject is exactly the name."""
    if not valid_id(node):
        raise EnrollError(f"node id {node!r} cannot be a certificate's subject")
    pem = _openssl("req", "-new", "-config", "/dev/null", "-key", str(key_file),
                   "-passin", "pass:", "-subj", f"/CN={node}", "-sha256", "-batch",
                   what="cannot write the CSR")
    if not pem.startswith(b"-----BEGIN CERTIFICATE REQUEST-----"):
        raise EnrollError("cannot write the CSR: openssl wrote no PEM request")
    return pem


class _Api:
    """The three API calls enrollment makes, over one HTTPS connection at a time."""

    def __init__(self, server: str, token_file: Path, ca_file: Path | None) -> None:
        if not server.startswith("https://"):
            raise EnrollError(f"API server {server!r}: an https:// URL is required")
        u = urlsplit(server)
        try:
            self.host, self.port = str(u.hostname or ""), int(u.port or 443)
        except ValueError as e:
            raise EnrollError(f"API server {server!r}: {e}") from e
        self.token_file = token_file
        self.ctx = ssl.create_default_context(cafile=str(ca_file) if ca_file else None)

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        try:
            # Read every time: the kubelet rotates a projected token before it expires.
            token = self.token_file.read_text().strip()
        except OSError as e:
            raise EnrollError(f"cannot read the ServiceAccount token {self.token_file}: {e}") \
                from e
        c = http.client.HTTPSConnection(self.host, self.port, context=self.ctx, timeout=15)
        try:
            data = json.dumps(body).encode() if body is not None else None
            c.request(method, path, body=data, headers={
                "Authorization": f"Bearer {token}", "Accept": "application/json",
                **({"Content-Type": "application/json"} if data else {})})
            r = c.getresponse()
            raw = r.read(MAX_RESPONSE_BYTES + 1)
        except (OSError, http.client.HTTPException) as e:
            raise EnrollError(f"API server {self.host}:{self.port}: {e}") from e
        finally:
            c.close()
        if len(raw) > MAX_RESPONSE_BYTES:
            raise EnrollError(f"{method} {path}: answer over {MAX_RESPONSE_BYTES} bytes")
        if r.status >= 300:
            raise EnrollError(f"{method} {path}: HTTP {r.status}: {raw[:300]!r}")
        try:
            return json.loads(raw)
        except ValueError as e:
            raise EnrollError(f"{method} {path}: not JSON") from e


def request_certificate(s: EnrollSettings, key_file: Path,
                        stop: threading.Event | None = None) -> bytes:
    """File the CSR and wait for its certificate (PEM). Raises on Denied/Failed/timeout."""
    api = _Api(s.api_server, s.token_file, s.ca_file)
    spec: dict[str, Any] = {
        "request": base64.b64encode(make_csr(key_file, s.node)).decode(),
        "signerName": SIGNER_NAME, "usages": ["digital signature", "client auth"]}
    if s.expiration_s:
        spec["expirationSeconds"] = s.expiration_s
    obj = api.call("POST", CSR_PATH, {
        "apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
        "metadata": {"generateName": f"cfnet-agent-{s.node}-"[:200]}, "spec": spec})
    name = obj["metadata"]["name"]
    log.info("filed CertificateSigningRequest %s for node %s; waiting for the core", name, s.node)
    deadline = time.monotonic() + s.timeout_s
    stop = stop or threading.Event()
    while True:
        status = obj.get("status") or {}
        for c in status.get("conditions") or []:
            if c.get("type") in ("Denied", "Failed") and c.get("status") != "False":
                raise EnrollError(f"CertificateSigningRequest {name} {c['type'].lower()}: "
                                  f"{c.get('reason')}: {c.get('message')}")
        if status.get("certificate"):
            return base64.b64decode(status["certificate"])
        if time.monotonic() >= deadline:
            raise EnrollError(f"CertificateSigningRequest {name}: no certificate after "
                              f"{s.timeout_s:.0f}s (is a cfnet core leading, with the agent "
                              "CA?)")
        if stop.wait(s.poll_s):
            raise EnrollError("stopped while waiting for a certificate")
        try:
            obj = api.call("GET", f"{CSR_PATH}/{name}")
        except EnrollError as e:  # the API server is briefly away: keep waiting
            log.warning("%s", e)


def ensure_identity(s: EnrollSettings, stop: threading.Event | None = None) -> tuple[Path, Path]:
    """The agent's ``(certfile, keyfile)``, enrolling first if needed."""
    key_file, cert_file = s.identity_dir / KEY_FILE, s.identity_dir / CERT_FILE
    key = load_or_make_key(key_file)
    if usable_cert(cert_file, key, s.node):
        log.info("using the client certificate %s for node %s", cert_file, s.node)
        return cert_file, key_file
    cert = _write_cert(cert_file, request_certificate(s, key, stop), key)
    log.info("enrolled: client certificate for node %s until %s", s.node,
             dt.datetime.fromtimestamp(cert.not_after, dt.UTC).isoformat())
    return cert_file, key_file


def renew_at(cert_file: Path) -> float:
    """When the certificate in ``cert_file`` enters its last third (epoch seconds)."""
    try:
        cert = read_cert(cert_file)
    except EnrollError as e:
        raise EnrollError(f"cannot read the client certificate {cert_file}: {e}") from e
    return cert.not_after - (cert.not_after - cert.not_before) / 3


class Renewer:
    """Renews the client certificate in place when it enters its last third: a new CSR with
    the same key (bounded wait, retried every ``retry_s`` until it works), the certificate
    file replaced, then ``on_renewed(certfile, keyfile)`` (the MQTT client reloads it for its
    next connection). The agent never has to restart for it."""

    def __init__(self, s: EnrollSettings, on_renewed: Callable[[Path, Path], None],
                 stop: threading.Event, *, clock: Callable[[], float] = time.time,
                 retry_s: float = 60.0) -> None:
        self.s = s
        self.on_renewed = on_renewed
        self.stop = stop
        self.clock = clock
        self.retry_s = retry_s
        self.renewed = 0
        self._thread = threading.Thread(target=self._run, name="cert-renewer", daemon=True)

    def start(self) -> Renewer:
        self._thread.start()
        return self

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def _run(self) -> None:
        cert_file, key_file = self.s.identity_dir / CERT_FILE, self.s.identity_dir / KEY_FILE
        while not self.stop.is_set():
            try:
                wait = renew_at(cert_file) - self.clock()
                if wait > 0 and self.stop.wait(min(wait, 86400.0)):
                    return
                if wait > 0:
                    continue  # waited a day at most: look again (the clock may have moved)
                key = load_or_make_key(key_file)
                pem = request_certificate(self.s, key, self.stop)
                _write_cert(cert_file, pem, key)
                self.renewed += 1
                log.info("renewed the client certificate for node %s", self.s.node)
                self.on_renewed(cert_file, key_file)
            except EnrollError as e:
                log.warning("certificate renewal: %s; again in %.0fs", e, self.retry_s)
                if self.stop.wait(self.retry_s):
                    return


def _write_cert(cert_file: Path, pem: bytes, key_file: Path) -> CertInfo:
    if not pem.startswith(b"-----BEGIN CERTIFICATE-----"):
        raise EnrollError("the certificate issued is not PEM")
    tmp = cert_file.with_suffix(".tmp")
    tmp.write_bytes(pem)
    try:
        cert = read_cert(tmp)
    except EnrollError as e:
        tmp.unlink(missing_ok=True)
        raise EnrollError(f"the certificate issued is not PEM: {e}") from e
    if cert.public_key != public_key_pem(key_file):
        tmp.unlink(missing_ok=True)
        raise EnrollError("the certificate issued is not for this agent's key")
    os.replace(tmp, cert_file)
    return cert


def enroll_settings(cfg: Any) -> EnrollSettings:
    """The enrollment settings of an AgentConfig with ``identity: certificate``."""
    api = cfg.api_server or api_server_from_env()
    if not api:
        raise EnrollError("identity certificate: no API server (api_server, or the pod's "
                          "KUBERNETES_SERVICE_HOST)")
    d = cfg.identity_dir or cfg.buffer_path.parent / "identity"
    return EnrollSettings(node=cfg.node, identity_dir=d, api_server=api,
                          token_file=cfg.api_token_file, ca_file=cfg.api_ca_file,
                          timeout_s=cfg.enroll_timeout_s)


def enrolled(cfg: Any, stop: threading.Event | None = None) -> Any:
    """``cfg`` (an AgentConfig with ``identity: certificate``) with its client certificate
    and key set and no password (the broker takes the certificate's CN as the username)."""
    cert, key = ensure_identity(enroll_settings(cfg), stop)
    return replace(cfg, certfile=cert, keyfile=key, password=None, password_file=None)
