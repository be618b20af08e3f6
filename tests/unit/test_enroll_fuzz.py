"""Fuzzing the agent CSR rule (cloud_core/k8s/enroll.py ``decide``) with hostile requests.

Bounded and seeded (the same cases every run, a few hundred, well under a second each):
byte flips and truncations of a valid request (PEM and the DER inside it), random bytes in a
PEM armour, several PEM blocks, oversized and non-base64 requests, and subjects with odd
common names (control characters, NUL, non-ASCII, 64+ characters, upper case, reserved
prefixes, several CNs, other attributes). Whatever comes in, ``decide`` answers with a
Decision (never an exception), approves only a request whose single CN is exactly the
requester's valid node name, and says why in a bounded, printable message.
"""

from __future__ import annotations

import base64
import random
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from cloud_core.k8s.enroll import MAX_REQUEST_BYTES, NODE_NAME_EXTRA, SIGNER_NAME, decide
from edge_agent.wire import valid_id

# the odd CNs are encoded past cryptography's length check on purpose
pytestmark = pytest.mark.filterwarnings("ignore:Attribute's length:UserWarning")
AGENT = "system:serviceaccount:cfnet-system:cfnet-agent"
KEY = ec.generate_private_key(ec.SECP256R1())
REASONS = {"WrongSigner", "RequestTooLarge", "NotAgentServiceAccount", "NoNodeBinding",
           "BadUsages", "BadRequest", "BadKey", "BadSignature", "BadSubject", "BadCommonName",
           "ReservedName", "NodeMismatch", "UnknownNode", "AutoApproved"}
MESSAGE_MAX = 400


def _csr_pem(names: list[tuple[Any, str]]) -> bytes | None:
    """A signed request with these subject attributes (None: cryptography refuses to
    encode them at all, so no agent could send it either)."""
    try:
        attrs = [x509.NameAttribute(oid, v, _validate=False) for oid, v in names]
        b = x509.CertificateSigningRequestBuilder().subject_name(x509.Name(attrs))
        return b.sign(KEY, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)
    except (ValueError, TypeError, UnicodeError):
        return None


def _obj(request: str, node: str = "node-a") -> dict[str, Any]:
    return {"metadata": {"name": "c"}, "spec": {
        "signerName": SIGNER_NAME, "username": AGENT, "usages": ["client auth"],
        "request": request, "extra": {NODE_NAME_EXTRA: [node]}}}


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


VALID = _csr_pem([(NameOID.COMMON_NAME, "node-a")])
assert VALID is not None
DER = x509.load_pem_x509_csr(VALID).public_bytes(serialization.Encoding.DER)
ODD_CNS = ["", " ", "node-a\x00", "node-a\n", "\x1b[31mnode-a", "NODE-A", "nöde-a",
           "node-a" + "x" * 58, "x" * 64, "x" * 1000, "core-a", "sim-x", "bridge-1",
           "node-a/../b", "*", "node a", "\u202enode-a", "node-a\ud800".encode(
               "utf-8", "surrogatepass").decode("utf-8", "replace"), "-node", "node-a."]


def _cases() -> list[tuple[str, str, str]]:
    """(case id, base64 request, requester's node), seeded."""
    rng = random.Random(26)
    out: list[tuple[str, str, str]] = [("valid", _b64(VALID), "node-a")]
    for i in range(120):  # byte flips in the DER, re-armoured as PEM
        der = bytearray(DER)
        for _ in range(rng.randint(1, 4)):
            der[rng.randrange(len(der))] ^= 1 << rng.randrange(8)
        pem = (b"-----BEGIN CERTIFICATE REQUEST-----\n" + base64.encodebytes(bytes(der))
               + b"-----END CERTIFICATE REQUEST-----\n")
        out.append((f"flip-der-{i}", _b64(pem), "node-a"))
    for i in range(40):  # flips anywhere in the PEM text
        pem = bytearray(VALID)
        pem[rng.randrange(len(pem))] = rng.randrange(256)
        out.append((f"flip-pem-{i}", _b64(bytes(pem)), "node-a"))
    for i in range(30):  # truncations
        out.append((f"cut-{i}", _b64(VALID[:rng.randrange(len(VALID))]), "node-a"))
    for i in range(30):  # random bytes, armoured or not
        junk = rng.randbytes(rng.randrange(1, 2000))
        armoured = (b"-----BEGIN CERTIFICATE REQUEST-----\n" + base64.encodebytes(junk)
                    + b"-----END CERTIFICATE REQUEST-----\n")
        out.append((f"junk-{i}", _b64(armoured if i % 2 else junk), "node-a"))
    other = _csr_pem([(NameOID.COMMON_NAME, "node-b")])
    assert other is not None
    out += [
        ("two-blocks", _b64(other + VALID), "node-a"),
        ("two-blocks-valid-first", _b64(VALID + other), "node-a"),
        ("cert-not-csr", _b64(VALID.replace(b"CERTIFICATE REQUEST", b"CERTIFICATE")), "node-a"),
        ("over-limit", _b64(VALID + b"\n" * MAX_REQUEST_BYTES), "node-a"),
        ("huge-string", "A" * (4 * MAX_REQUEST_BYTES), "node-a"),
        ("not-base64", "%%%not base64%%%", "node-a"),
        ("base64-with-spaces", " ".join(_b64(VALID)[i:i + 64]
                                        for i in range(0, len(_b64(VALID)), 64)), "node-a"),
        ("empty", "", "node-a"),
    ]
    for j, cn in enumerate(ODD_CNS):
        pem = _csr_pem([(NameOID.COMMON_NAME, cn)])
        if pem is not None:
            out.append((f"cn-{j}", _b64(pem), cn if j % 2 else "node-a"))
    for j, names in enumerate([
            [(NameOID.COMMON_NAME, "node-a"), (NameOID.COMMON_NAME, "node-a")],
            [(NameOID.COMMON_NAME, "node-a"), (NameOID.ORGANIZATION_NAME, "system:masters")],
            [(NameOID.ORGANIZATION_NAME, "node-a")], []]):
        pem = _csr_pem(names)
        if pem is not None:
            out.append((f"subject-{j}", _b64(pem), "node-a"))
    return out


CASES = _cases()


@pytest.mark.parametrize(("case", "request_b64", "node"), CASES, ids=[c[0] for c in CASES])
def test_hostile_requests_are_answered(case: str, request_b64: str, node: str) -> None:
    d = decide(_obj(request_b64, node), agent_user=AGENT, node_exists=lambda n: True)
    assert d.reason in REASONS, (case, d)
    assert len(d.message) <= MESSAGE_MAX and d.message.isprintable(), (case, d.message)
    if d.approve:
        assert d.csr is not None
        cns = d.csr.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        assert len(list(d.csr.subject)) == 1 and len(cns) == 1, case
        assert cns[0].value == node == d.node and valid_id(node), case
    if case == "valid":
        assert d.approve, d
    if case in ("over-limit", "huge-string"):
        assert d.reason == "RequestTooLarge", d
