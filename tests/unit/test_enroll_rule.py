"""The core's approval rule for agent CSRs (cloud_core/k8s/enroll.py ``decide``), table-driven,
and what the signer writes. The same rule runs against the real API server and Mosquitto in
tests/k8s/test_identity.py; ``node_exists`` here is a set lookup, the one I/O edge."""

from __future__ import annotations

import base64
import datetime as dt
from collections.abc import Callable
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from cloud_core.k8s.enroll import (
    MAX_REQUEST_BYTES,
    NODE_NAME_EXTRA,
    SIGNER_NAME,
    AgentSigner,
    csr_state,
    decide,
    make_ca,
)
from tools.certs import render_agent_acl

AGENT = "system:serviceaccount:cfnet-system:cfnet-agent"
EC_KEY = ec.generate_private_key(ec.SECP256R1())


def pem_csr(cn: str | None = "node-a", key: Any = EC_KEY, extra_attr: bool = False,
            big_san: int = 0) -> bytes:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)] if cn is not None else []
    if extra_attr:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:masters"))
    b = x509.CertificateSigningRequestBuilder().subject_name(x509.Name(attrs))
    if big_san:
        b = b.add_extension(x509.SubjectAlternativeName(
            [x509.DNSName(f"n{i}.example.org") for i in range(big_san)]), critical=False)
    algo = None if isinstance(key, ed25519.Ed25519PrivateKey) else hashes.SHA256()
    return b.sign(key, algo).public_bytes(serialization.Encoding.PEM)


def csr(request: bytes | str | None = None, *, user: str = AGENT, node: Any = "node-a",
        usages: Any = ("digital signature", "client auth"), signer: str = SIGNER_NAME,
        status: dict[str, Any] | None = None) -> dict[str, Any]:
    req = request if request is not None else pem_csr()
    spec: dict[str, Any] = {
        "signerName": signer, "username": user, "usages": list(usages),
        "request": req if isinstance(req, str) else base64.b64encode(req).decode()}
    if node is not None:
        spec["extra"] = {NODE_NAME_EXTRA: node if isinstance(node, list) else [node]}
    return {"metadata": {"name": "c"}, "spec": spec, "status": status or {}}


def tampered() -> bytes:
    der = bytearray(x509.load_pem_x509_csr(pem_csr()).public_bytes(serialization.Encoding.DER))
    der[-5] ^= 0xFF  # inside the signature
    return (b"-----BEGIN CERTIFICATE REQUEST-----\n" + base64.encodebytes(bytes(der))
            + b"-----END CERTIFICATE REQUEST-----\n")


CASES: list[tuple[str, Callable[[], dict[str, Any]], str]] = [
    ("valid", lambda: csr(), "AutoApproved"),
    ("valid, client auth only", lambda: csr(usages=["client auth"]), "AutoApproved"),
    ("valid RSA 2048", lambda: csr(pem_csr(key=rsa.generate_private_key(65537, 2048)),
                                   usages=["digital signature", "key encipherment",
                                           "client auth"]), "AutoApproved"),
    ("another signer", lambda: csr(signer="kubernetes.io/kube-apiserver-client"),
     "WrongSigner"),
    ("another requester", lambda: csr(user="system:serviceaccount:default:default"),
     "NotAgentServiceAccount"),
    ("a user, not a service account", lambda: csr(user="alice"), "NotAgentServiceAccount"),
    ("token bound to no pod", lambda: csr(node=None), "NoNodeBinding"),
    ("two node names", lambda: csr(node=["node-a", "node-b"]), "NoNodeBinding"),
    ("CN of another node", lambda: csr(pem_csr("node-b")), "NodeMismatch"),
    ("server auth", lambda: csr(usages=["server auth"]), "BadUsages"),
    ("client and server auth", lambda: csr(usages=["client auth", "server auth"]),
     "BadUsages"),
    ("no usages", lambda: csr(usages=[]), "BadUsages"),
    ("CN with bad characters", lambda: csr(pem_csr("Node_A!"), node="Node_A!"),
     "BadCommonName"),
    ("CN too long", lambda: csr(pem_csr("a" * 64), node="a" * 64), "BadCommonName"),
    ("CN with a newline", lambda: csr(pem_csr("node-a\n"), node="node-a\n"),
     "BadCommonName"),
    ("CN with MQTT wildcards", lambda: csr(pem_csr("+"), node="+"), "BadCommonName"),
    ("no CN", lambda: csr(pem_csr(None)), "BadSubject"),
    ("an extra O", lambda: csr(pem_csr(extra_attr=True)), "BadSubject"),
    ("a core account's name", lambda: csr(pem_csr("core-1"), node="core-1"), "ReservedName"),
    ("RSA 1024", lambda: csr(pem_csr(key=rsa.generate_private_key(65537, 1024))), "BadKey"),
    ("EC P-521", lambda: csr(pem_csr(key=ec.generate_private_key(ec.SECP521R1()))), "BadKey"),
    ("Ed25519", lambda: csr(pem_csr(key=ed25519.Ed25519PrivateKey.generate())), "BadKey"),
    ("huge request", lambda: csr(pem_csr(big_san=400)), "RequestTooLarge"),
    ("not base64", lambda: csr("!!notbase64!!"), "BadRequest"),
    ("not a CSR", lambda: csr(b"hello"), "BadRequest"),
    ("bad signature", lambda: csr(tampered()), "BadSignature"),
    ("node that does not exist", lambda: csr(pem_csr("node-gone"), node="node-gone"),
     "UnknownNode"),
]


@pytest.mark.parametrize(("case", "make", "reason"), CASES, ids=[c[0] for c in CASES])
def test_approval_rule(case: str, make: Callable[[], dict[str, Any]], reason: str) -> None:
    looked: list[str] = []

    def node_exists(n: str) -> bool:
        looked.append(n)
        return n in {"node-a", "node-b"}

    d = decide(make(), agent_user=AGENT, node_exists=node_exists)
    assert (d.approve, d.reason) == (reason == "AutoApproved", reason), d.message
    assert d.message and len(d.message) < 400
    # The Node is looked up only for a CSR that passed everything else.
    assert looked == ([] if reason not in ("AutoApproved", "UnknownNode") else [d.node or
                                                                                  "node-gone"])


def test_huge_request_is_refused_before_it_is_decoded() -> None:
    d = decide(csr("A" * (MAX_REQUEST_BYTES * 2)), agent_user=AGENT, node_exists=lambda n: True)
    assert d.reason == "RequestTooLarge"


def test_states() -> None:
    cond = lambda t: {"conditions": [{"type": t, "status": "True"}]}  # noqa: E731
    assert csr_state(csr()) == "pending"
    assert csr_state(csr(status=cond("Approved"))) == "approved"
    assert csr_state(csr(status={**cond("Approved"), "certificate": "x"})) == "issued"
    assert csr_state(csr(status=cond("Denied"))) == "denied"
    assert csr_state(csr(status=cond("Failed"))) == "failed"


def test_signed_certificate_is_a_client_cert_for_the_node_only() -> None:
    crt, key = make_ca()
    signer = AgentSigner.from_pem(crt, key, days=30)
    req = x509.load_pem_x509_csr(pem_csr(big_san=3))
    now = dt.datetime.now(dt.UTC)
    cert = x509.load_pem_x509_certificate(signer.sign(req, "node-a", 3600, now=now))
    assert cert.subject.rfc4514_string() == "CN=node-a"
    assert cert.issuer == signer.ca.subject
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    # The CSR's SANs are not copied: only what the signer sets.
    with pytest.raises(x509.ExtensionNotFound):
        cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    # expirationSeconds shortens the lifetime (never below the API server's 600 s minimum).
    assert cert.not_valid_after_utc - now <= dt.timedelta(seconds=3600)
    cert.verify_directly_issued_by(signer.ca)


def test_agent_acl_is_the_agent_roles_rules_as_patterns() -> None:
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    text = render_agent_acl()
    for f in (root / "deploy/mosquitto/agent-acl", root / "deploy/helm/cfnet/files/agent-acl"):
        assert f.read_text() == text, f"{f} is stale: write tools.certs.render_agent_acl()"
    rules = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    assert rules == ["pattern write cfnet/v1/nodes/%u/telemetry",
                     "pattern write cfnet/v1/nodes/%u/status",
                     "pattern read cfnet/v1/nodes/%u/placements",
                     "pattern read cfnet/v1/nodes/%u/ack"]
