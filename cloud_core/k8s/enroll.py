"""One broker identity per agent: the core approves and signs the agents' CSRs.

kubelet TLS bootstrap's pattern (docs/security.md, "One identity per agent"). Every agent
makes its own key and files a ``certificates.k8s.io/v1`` CertificateSigningRequest for the
signer ``cfnet.io/agent`` with CN = its node name, authenticated by its pod-bound
ServiceAccount token. For such a token the API server records the pod's node in the CSR's
``spec.extra["authentication.kubernetes.io/node-name"]`` (feature ServiceAccountTokenPodNodeInfo:
beta and on in 1.30, GA and locked on since 1.32; kube-apiserver v1.34 always does it), so
the node a CSR speaks for is the API server's word, not the requester's.

The leading core (:class:`EnrollLoop`) approves a CSR only when :func:`decide` says so:
the requester is the agent ServiceAccount, the token was bound to a pod on a node, the
CSR's only subject is CN = that node name, its usages are client auth, its key is EC
P-256/P-384 or RSA 2048-4096, and that Node exists. Anything else is Denied with a reason
(the condition's reason and message), an Event on the CSR, a counter and a warning log line
(the audit trail). Approved CSRs are signed here (:class:`AgentSigner`, the agent CA from a
Secret) and the certificate written to ``status.certificate``; the broker's certificate
listener trusts that CA only and takes the CN as the MQTT username.

Bounded: a CSR's request is refused above :data:`MAX_REQUEST_BYTES` before it is parsed;
one pass handles at most ``max_per_pass`` CSRs (oldest first), so a flood of CSRs delays
enrollment but cannot stall the core; every refusal is answered and counted.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import logging
import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from cloud_core.errors import CoreError, KubeConflict, KubeError, KubeNotFound
from cloud_core.k8s.client import JSON, KubeClient, micro_time
from edge_agent.wire import valid_id

log = logging.getLogger(__name__)

SIGNER_NAME = "cfnet.io/agent"
CSR_PATH = "/apis/certificates.k8s.io/v1/certificatesigningrequests"
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
# A PEM CSR of an RSA-4096 key is about 1.7 KB; the API server keeps it base64 in JSON.
MAX_REQUEST_BYTES = 8 * 1024
ALLOWED_USAGES = frozenset({"client auth", "digital signature", "key encipherment"})
EC_CURVES = ("secp256r1", "secp384r1")
RSA_BITS = (2048, 4096)
# Prefixes of the broker's own account roles (tools/certs.py RESERVED_PREFIXES): a node
# named like a core account would share its MQTT client id (use_username_as_clientid).
RESERVED_PREFIXES = ("core-", "sim-", "bridge-")
DEFAULT_DAYS = 365
MIN_SECONDS = 600  # as the API server's own minimum for spec.expirationSeconds


class EnrollError(CoreError):
    """The agent CA cannot be read or used."""


@dataclass(frozen=True, slots=True)
class Decision:
    """What :func:`decide` says about one CSR: approve or deny, and why."""

    approve: bool
    reason: str  # CamelCase, the condition's reason
    message: str
    node: str = ""
    csr: x509.CertificateSigningRequest | None = None


def _printable(text: str, n: int = 128) -> str:
    """``text`` cut to ``n`` characters, control characters escaped (it goes into a condition
    message and an event)."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[:n])


def _deny(reason: str, message: str) -> Decision:
    return Decision(False, reason, message)


def csr_state(obj: JSON) -> str:
    """``pending``, ``approved`` (not signed yet), ``issued``, ``denied`` or ``failed``."""
    status = obj.get("status") or {}
    types = {c.get("type") for c in status.get("conditions") or [] if c.get("status") != "False"}
    if "Denied" in types:
        return "denied"
    if "Failed" in types:
        return "failed"
    if "Approved" in types:
        return "issued" if status.get("certificate") else "approved"
    return "pending"


def decide(obj: JSON, *, agent_user: str, node_exists: Callable[[str], bool]) -> Decision:
    """Approve ``obj`` (a CSR of signer cfnet.io/agent) or deny it, with the reason.

    Cheapest checks first; the request is size-checked before it is decoded and parsed, and
    the Node is looked up last (one GET, only for an otherwise valid CSR)."""
    spec = obj.get("spec") or {}
    if spec.get("signerName") != SIGNER_NAME:
        return _deny("WrongSigner", f"signer {str(spec.get('signerName'))[:64]!r} is not "
                                    f"{SIGNER_NAME}")
    raw = spec.get("request")
    if not isinstance(raw, str) or len(raw) > MAX_REQUEST_BYTES * 4 // 3 + 4:
        return _deny("RequestTooLarge", f"the request is over {MAX_REQUEST_BYTES} bytes")
    if spec.get("username") != agent_user:
        return _deny("NotAgentServiceAccount",
                     f"requested by {str(spec.get('username'))[:128]!r}, not {agent_user}")
    extra = spec.get("extra") or {}
    nodes = extra.get(NODE_NAME_EXTRA) if isinstance(extra, dict) else None
    if not isinstance(nodes, list) or len(nodes) != 1 or not isinstance(nodes[0], str):
        return _deny("NoNodeBinding", "the requester's token is not bound to a pod on a node "
                                      f"(no {NODE_NAME_EXTRA})")
    node = nodes[0]
    usages = spec.get("usages") or []
    if (not isinstance(usages, list) or "client auth" not in usages
            or not set(usages) <= ALLOWED_USAGES or len(usages) > len(ALLOWED_USAGES)):
        return _deny("BadUsages", f"usages {str(usages)[:128]} must be client auth "
                                  "(and digital signature, key encipherment) only")
    try:
        pem = base64.b64decode(raw, validate=True)
    except (binascii.Error, ValueError):
        return _deny("BadRequest", "the request is not base64")
    if len(pem) > MAX_REQUEST_BYTES:
        return _deny("RequestTooLarge", f"the request is over {MAX_REQUEST_BYTES} bytes")
    try:
        csr = x509.load_pem_x509_csr(pem)
    except (ValueError, x509.InvalidVersion, UnsupportedAlgorithm):
        # InvalidVersion is no ValueError (found by fuzzing: a flipped version byte)
        return _deny("BadRequest", "the request is not a PEM certificate request")
    try:
        key = csr.public_key()
    except (ValueError, TypeError, UnsupportedAlgorithm) as e:
        # a mangled key OID is UnsupportedAlgorithm, not a ValueError (found by fuzzing:
        # tests/unit/test_enroll_fuzz.py); the request is refused like any bad key
        return _deny("BadKey", f"unsupported public key: {_printable(str(e))}")
    if isinstance(key, ec.EllipticCurvePublicKey):
        if key.curve.name not in EC_CURVES:
            return _deny("BadKey", f"EC curve {key.curve.name} is not one of {EC_CURVES}")
    elif isinstance(key, rsa.RSAPublicKey):
        if not RSA_BITS[0] <= key.key_size <= RSA_BITS[1]:
            return _deny("BadKey", f"RSA key of {key.key_size} bits, not {RSA_BITS[0]}.."
                                   f"{RSA_BITS[1]}")
    else:
        return _deny("BadKey", f"key type {type(key).__name__} is not EC or RSA")
    try:
        signed = csr.is_signature_valid
    except (ValueError, TypeError, UnsupportedAlgorithm) as e:
        return _deny("BadSignature", f"unsupported signature: {_printable(str(e))}")
    if not signed:
        return _deny("BadSignature", "the request's signature does not verify")
    try:
        attrs = list(csr.subject)
    except ValueError as e:
        return _deny("BadSubject", f"the subject does not parse: {_printable(str(e))}")
    if len(attrs) != 1 or attrs[0].oid != NameOID.COMMON_NAME:
        return _deny("BadSubject", "the subject must be exactly CN=<node name>")
    cn = attrs[0].value
    if not isinstance(cn, str) or not valid_id(cn):
        return _deny("BadCommonName", f"CN {str(cn)[:80]!r} is not a node id (lower-case "
                                      "letters, digits, '.', '_', '-'; at most 63)")
    if cn.startswith(RESERVED_PREFIXES):
        return _deny("ReservedName", f"CN {cn!r} starts with a prefix reserved for the "
                                     f"broker's own accounts {RESERVED_PREFIXES}")
    if cn != node:
        return _deny("NodeMismatch", f"CN {cn!r} is not the requester's node {node[:80]!r}")
    if not node_exists(node):
        return _deny("UnknownNode", f"Node {node!r} does not exist")
    return Decision(True, "AutoApproved", f"cfnet agent on node {node}", node=node, csr=csr)


class AgentSigner:
    """Signs agent client certificates with the agent CA (``tls.crt`` and ``tls.key``)."""

    def __init__(self, cert_file: Path, key_file: Path, *, days: int = DEFAULT_DAYS) -> None:
        try:
            self.ca = x509.load_pem_x509_certificate(cert_file.read_bytes())
            key = serialization.load_pem_private_key(key_file.read_bytes(), password=None)
        except (OSError, ValueError, TypeError) as e:
            raise EnrollError(f"cannot read the agent CA {cert_file} / {key_file}: {e}") from e
        if not isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
            raise EnrollError(f"agent CA key {key_file}: EC or RSA expected")
        self.key = key
        self.days = days

    @classmethod
    def from_dir(cls, d: Path, *, days: int = DEFAULT_DAYS) -> AgentSigner:
        """The layout of a ``kubernetes.io/tls`` Secret mounted as a directory."""
        return cls(d / "tls.crt", d / "tls.key", days=days)

    @classmethod
    def from_pem(cls, cert_pem: bytes, key_pem: bytes, *,
                 days: int = DEFAULT_DAYS) -> AgentSigner:
        self = cls.__new__(cls)
        try:
            self.ca = x509.load_pem_x509_certificate(cert_pem)
            key = serialization.load_pem_private_key(key_pem, password=None)
        except (ValueError, TypeError) as e:
            raise EnrollError(f"cannot read the agent CA: {e}") from e
        if not isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
            raise EnrollError("agent CA key: EC or RSA expected")
        self.key = key
        self.days = days
        return self

    def sign(self, csr: x509.CertificateSigningRequest, node: str,
             expiration_s: int | None = None, now: dt.datetime | None = None) -> bytes:
        """A PEM client certificate for ``node``: only what we set, nothing the CSR asked."""
        now = now or dt.datetime.now(dt.UTC)
        life = dt.timedelta(days=self.days)
        if expiration_s is not None:
            life = min(life, dt.timedelta(seconds=max(MIN_SECONDS, expiration_s)))
        not_after = min(now + life, self.ca.not_valid_after_utc)
        key = csr.public_key()
        assert isinstance(key, ec.EllipticCurvePublicKey | rsa.RSAPublicKey)  # decide() did
        b = (x509.CertificateBuilder()
             .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, node)]))
             .issuer_name(self.ca.subject).public_key(key)
             .serial_number(int.from_bytes(secrets.token_bytes(16), "big") >> 1)
             .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(not_after)
             .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
             .add_extension(x509.KeyUsage(
                 digital_signature=True, key_encipherment=isinstance(key, rsa.RSAPublicKey),
                 content_commitment=False, data_encipherment=False, key_agreement=False,
                 key_cert_sign=False, crl_sign=False, encipher_only=False,
                 decipher_only=False), critical=True)
             .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]),
                            critical=False)
             .add_extension(x509.SubjectKeyIdentifier.from_public_key(key), critical=False))
        cert = b.sign(self.key, hashes.SHA256())
        return cert.public_bytes(serialization.Encoding.PEM)


def make_ca(now: dt.datetime | None = None, years: int = 10) -> tuple[bytes, bytes]:
    """A new agent CA: (certificate PEM, PKCS#8 key PEM), EC P-256."""
    now = now or dt.datetime.now(dt.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "cfnet"),
                      x509.NameAttribute(NameOID.COMMON_NAME, "cfnet agent CA")])
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key())
            .serial_number(int.from_bytes(secrets.token_bytes(16), "big") >> 1)
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=365 * years))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=False, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False)
            .sign(key, hashes.SHA256()))
    return (cert.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()))


def ca_from_secret(client: KubeClient, namespace: str, name: str, *,
                   days: int = DEFAULT_DAYS) -> AgentSigner:
    """The agent CA from Secret ``namespace/name`` (keys ``tls.crt``, ``tls.key``), made
    first when the Secret is empty (the chart makes it so: the release owns it and
    ``helm uninstall`` removes it; the core's Role is get and update of that one name) or
    missing (then created as ``kubernetes.io/tls``, where the core may create Secrets). Made
    by the core rather than by Helm's ``genCA``: a chart-made key would change on every
    ``helm template`` (GitOps, deploy/k8s) and sit in Helm's release record; made here once,
    it survives upgrades and is read by the API only. An operator's own CA there is used as
    is."""
    path = f"/api/v1/namespaces/{namespace}/secrets"
    try:
        obj = client.get(f"{path}/{name}")
    except KubeNotFound:
        obj = None
    if obj is not None and not (obj.get("data") or {}):
        crt, key = make_ca()
        filled = {**obj, "data": {"tls.crt": base64.b64encode(crt).decode(),
                                  "tls.key": base64.b64encode(key).decode()}}
        try:  # resourceVersion kept: of two replicas filling it at once, one wins
            obj = client.replace(f"{path}/{name}", filled)
            log.info("made the agent CA in Secret %s/%s", namespace, name)
        except KubeConflict:
            obj = client.get(f"{path}/{name}")
    if obj is None:
        crt, key = make_ca()
        body = {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
                "metadata": {"name": name, "namespace": namespace,
                             "labels": {"app.kubernetes.io/part-of": "cfnet",
                                        "app.kubernetes.io/component": "agent-ca"}},
                "data": {"tls.crt": base64.b64encode(crt).decode(),
                         "tls.key": base64.b64encode(key).decode()}}
        try:
            obj = client.create(path, body)
            log.info("made the agent CA in Secret %s/%s", namespace, name)
        except KubeConflict:  # another replica made it first: use that one
            obj = client.get(f"{path}/{name}")
    data = obj.get("data") or {}
    try:
        crt, key = (base64.b64decode(data["tls.crt"]), base64.b64decode(data["tls.key"]))
    except (KeyError, binascii.Error, ValueError) as e:
        raise EnrollError(f"Secret {namespace}/{name} has no tls.crt/tls.key") from e
    return AgentSigner.from_pem(crt, key, days=days)


@dataclass
class EnrollStats:
    """Counters of the enrollment loop (exported as cfnet_agent_enrollment{outcome})."""

    approved: int = 0
    denied: int = 0
    signed: int = 0
    conflicts: int = 0
    errors: int = 0
    deferred: int = 0  # pending CSRs left for a later pass (over max_per_pass)
    denied_by_reason: Counter[str] = field(default_factory=Counter)

    def as_dict(self) -> dict[str, int]:
        return {"approved": self.approved, "denied": self.denied, "signed": self.signed,
                "conflicts": self.conflicts, "errors": self.errors, "deferred": self.deferred}


class AgentEnroller:
    """One pass over the cfnet.io/agent CSRs: decide the pending ones, sign the approved."""

    def __init__(self, client: KubeClient, signer: AgentSigner | Callable[[], AgentSigner], *,
                 agent_user: str, max_per_pass: int = 50, component: str = "cfnet-core",
                 instance: str = "") -> None:
        """``signer``: the CA, or how to get it (read when first needed, by the leader)."""
        self.client = client
        self._signer = signer
        self.agent_user = agent_user
        self.max_per_pass = max_per_pass
        self.component = component
        self.instance = instance
        self.stats = EnrollStats()

    @property
    def signer(self) -> AgentSigner:
        if not isinstance(self._signer, AgentSigner):
            self._signer = self._signer()
        return self._signer

    def node_exists(self, name: str) -> bool:
        try:
            self.client.get(f"/api/v1/nodes/{name}")
        except KubeNotFound:
            return False
        return True

    def run_once(self) -> int:
        """Handle at most ``max_per_pass`` CSRs, oldest first; returns how many."""
        items, _ = self.client.list(CSR_PATH, fieldSelector=f"spec.signerName={SIGNER_NAME}")
        todo = [o for o in items if csr_state(o) in ("pending", "approved")]
        todo.sort(key=lambda o: ((o.get("metadata") or {}).get("creationTimestamp") or "",
                                 (o.get("metadata") or {}).get("name") or ""))
        self.stats.deferred += max(0, len(todo) - self.max_per_pass)
        for obj in todo[:self.max_per_pass]:
            try:
                self._handle(obj)
            except KubeConflict:
                self.stats.conflicts += 1  # changed meanwhile: the next pass sees it again
            except KubeError as e:
                self.stats.errors += 1
                log.warning("agent CSR %s: %s", (obj.get("metadata") or {}).get("name"), e)
        return min(len(todo), self.max_per_pass)

    def _handle(self, obj: JSON) -> None:
        name = obj["metadata"]["name"]
        d = decide(obj, agent_user=self.agent_user, node_exists=self.node_exists)
        if not d.approve:
            self._condition(obj, "Denied", d.reason, d.message)
            self.stats.denied += 1
            self.stats.denied_by_reason[d.reason] += 1
            log.warning("audit: denied agent CSR %s from %s: %s (%s)", name,
                        str((obj.get("spec") or {}).get("username"))[:128], d.reason, d.message)
            self.client.record_event(obj, reason="CSRDenied", message=f"{d.reason}: {d.message}",
                                     event_type="Warning", component=self.component,
                                     instance=self.instance, action="Enroll")
            return
        if csr_state(obj) == "pending":
            obj = self._condition(obj, "Approved", d.reason, d.message)
            self.stats.approved += 1
            log.info("audit: approved agent CSR %s for node %s", name, d.node)
        assert d.csr is not None
        pem = self.signer.sign(d.csr, d.node, (obj.get("spec") or {}).get("expirationSeconds"))
        obj = dict(obj)
        obj["status"] = {**(obj.get("status") or {}),
                         "certificate": base64.b64encode(pem).decode()}
        self.client.replace(f"{CSR_PATH}/{name}/status", obj)
        self.stats.signed += 1
        self.client.record_event(obj, reason="CSRSigned", message=f"client certificate for "
                                 f"node {d.node}", component=self.component,
                                 instance=self.instance, action="Enroll")

    def _condition(self, obj: JSON, kind: str, reason: str, message: str) -> JSON:
        status = dict(obj.get("status") or {})
        status["conditions"] = [*(status.get("conditions") or []), {
            "type": kind, "status": "True", "reason": reason, "message": message[:1024],
            "lastUpdateTime": micro_time()[:19] + "Z"}]
        body = {**obj, "status": status}
        return self.client.replace(f"{CSR_PATH}/{obj['metadata']['name']}/approval", body)


class EnrollLoop:
    """Runs :meth:`AgentEnroller.run_once` every ``interval_s`` while ``leading()``."""

    def __init__(self, enroller: AgentEnroller, leading: Callable[[], bool], *,
                 interval_s: float = 1.0) -> None:
        self.enroller = enroller
        self.leading = leading
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="agent-enroll", daemon=True)

    def start(self) -> EnrollLoop:
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            if not self.leading():
                continue
            t0 = time.monotonic()
            try:
                # The CA first, even with no CSR yet: the broker's certificate listener
                # needs its certificate (the Secret) before any agent can connect.
                _ = self.enroller.signer
                n = self.enroller.run_once()
            except (KubeError, EnrollError) as e:  # API server away, CA unreadable: retry
                self.enroller.stats.errors += 1
                log.warning("agent enrollment pass failed: %s", e)
                continue
            except Exception:  # a bug must not end enrollment for good: log it, go on
                self.enroller.stats.errors += 1
                log.exception("agent enrollment pass failed")
                continue
            if n:
                log.debug("agent enrollment: %d CSRs in %.3fs", n, time.monotonic() - t0)


def agent_user(service_account: str) -> str:
    """``ns:name`` (or ``system:serviceaccount:ns:name``) → the API server's username."""
    s = service_account.removeprefix("system:serviceaccount:")
    ns, _, name = s.partition(":")
    if not ns or not name:
        raise EnrollError(f"agent service account {service_account!r}: expected NAMESPACE:NAME")
    return f"system:serviceaccount:{ns}:{name}"
