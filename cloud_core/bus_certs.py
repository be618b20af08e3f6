"""One identity per agent on the clustered bus: the agent's enrolled client certificate,
read by the auth callout (:mod:`cloud_core.bus_callout`).

On Mosquitto an agent enrolled through the CertificateSigningRequest flow
(:mod:`cloud_core.k8s.enroll`, docs/security.md "One identity per agent") presents its
certificate (``CN=<node>``, signed by the agent CA) to the certificate listener, which takes
the CN as the username; ``pattern`` rules then hold it to its own node's topics. On NATS
the MQTT listener's TLS block has ``verify: "optional"`` with the agent CA as its
``ca_file``: a client that presents a certificate must present one of the agent CA (the
TLS handshake verifies it; ``VerifyClientCertIfGiven``), and one without a certificate
(cores, operators) still authenticates with its password. nats-server hands the verified
chain to the callout (``client_tls.verified_chains`` of the authorization request,
``fillClientInfo``/TLS in server/auth_callout.go). The callout admits such a connection as
node ``<CN>`` when:

- the chain ends at the agent CA (:class:`AgentCA`: the same certificate, byte for byte);
- the leaf has exactly one CN, a node id (``edge_agent.wire.ID_RE``), not a name of the
  bus's own roles (``core-``, ``sim-``, ``bridge-``, as the enrolment rule refuses them);
- the node is not revoked (:attr:`AgentTemplate.revoked`, in the accounts file);
- a username, if sent, is the CN; the MQTT client ID is the node's own (its name or
  ``agent-<node>``, ``.`` as ``~``): no other account can take its session over, and it
  can take over no one else's.

Its permissions are the agent role's, for that node only: the accounts file carries them
once, with :data:`NODE` where the node goes (``callout-accounts`` renders them from the
same cfnet ACL as every account's). Nothing per node is configured: a node enrolled a
second ago is admitted, a revoked one is refused at its next connect and cut off by the
callout (:meth:`cloud_core.bus_callout.CalloutService.due_kicks`).
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.x509.oid import NameOID

from cloud_core.errors import CoreError
from edge_agent.wire import ID_RE

NODE = "__NODE__"  # where the node goes in the template's permissions and client IDs
RESERVED_PREFIXES = ("core-", "sim-", "bridge-")
# Bounds on what a request may carry before anything is parsed.
MAX_CHAINS = 4
MAX_CHAIN_LEN = 4
MAX_PEM_BYTES = 8192
MAX_REVOKED = 1_000_000
_PEM = re.compile(r"-----BEGIN CERTIFICATE-----\s*([A-Za-z0-9+/=\s]+?)\s*-----END CERTIFICATE-----")


class CertIdentityError(CoreError):
    """A certificate identity that cannot be admitted (the message is the refusal's reason)."""


@dataclass(frozen=True)
class AgentTemplate:
    """What every certificate agent is admitted with (``cert_agents`` of the accounts file)."""

    permissions: dict[str, Any]  # the agent role's NATS permissions, NODE for the node
    client_ids: tuple[str, ...]  # its own MQTT client IDs, NODE for the node (wire form)
    connection_types: tuple[str, ...]
    revoked: frozenset[str]  # node names refused (and cut off) though their certificate is valid

    def permissions_for(self, node: str) -> dict[str, Any]:
        """The template's permissions with the node's subject token (``.`` -> ``//``, as
        the MQTT listener maps a dot inside a level); a node id has no wildcard."""
        text = json.dumps(self.permissions).replace(NODE, node.replace(".", "//"))
        out: dict[str, Any] = json.loads(text)
        return out

    def client_ids_for(self, node: str) -> frozenset[str]:
        """The node's own client IDs as sent on MQTT 3.1.1 (``.`` -> ``~``)."""
        return frozenset(c.replace(NODE, node.replace(".", "~")) for c in self.client_ids)


def parse_template(doc: Any) -> AgentTemplate | None:
    """The ``cert_agents`` entry of an accounts file; None when absent (no certificate
    agents admitted). Malformed: :class:`CertIdentityError`."""
    if doc is None:
        return None
    try:
        revoked = doc.get("revoked") or []
        if len(revoked) > MAX_REVOKED:
            raise CertIdentityError(f"more than {MAX_REVOKED} revoked nodes")
        return AgentTemplate(dict(doc["permissions"]), tuple(map(str, doc["client_ids"])),
                             tuple(map(str, doc["allowed_connection_types"])),
                             frozenset(map(str, revoked)))
    except (KeyError, TypeError, AttributeError, ValueError) as exc:
        raise CertIdentityError(f"cert_agents is malformed: {exc!r}") from exc


def _der(pem: str) -> bytes:
    if len(pem) > MAX_PEM_BYTES:
        raise CertIdentityError("certificate too large")
    m = _PEM.search(pem)
    if m is None:
        raise CertIdentityError("not a PEM certificate")
    try:
        return base64.b64decode("".join(m.group(1).split()), validate=True)
    except ValueError as exc:
        raise CertIdentityError("undecodable certificate") from exc


class AgentCA:
    """The agent CA's certificate(s) the callout trusts for node identities."""

    def __init__(self, ca_file: Path) -> None:
        try:
            text = ca_file.read_text()
        except OSError as exc:
            raise CertIdentityError(f"cannot read the agent CA {ca_file}: {exc}") from exc
        self.roots = frozenset(base64.b64decode("".join(m.group(1).split()))
                               for m in _PEM.finditer(text))
        if not self.roots:
            raise CertIdentityError(f"no certificate in the agent CA file {ca_file}")

    def node_of(self, client_tls: Any) -> str | None:
        """The node a request's verified client certificate names; None when the client
        presented no certificate. A certificate that is not an agent's: refused."""
        if not isinstance(client_tls, dict):
            return None
        chains = client_tls.get("verified_chains") or []
        if not chains:
            if client_tls.get("certs"):
                raise CertIdentityError("an unverified client certificate")
            return None
        if not isinstance(chains, list) or len(chains) > MAX_CHAINS:
            raise CertIdentityError("too many certificate chains")
        for chain in chains:
            if not isinstance(chain, list) or not 0 < len(chain) <= MAX_CHAIN_LEN:
                raise CertIdentityError("a malformed certificate chain")
            if not all(isinstance(p, str) for p in chain):
                raise CertIdentityError("a malformed certificate chain")
            if len(chain) >= 2 and _der(chain[-1]) in self.roots:
                return node_name(_der(chain[0]))
        raise CertIdentityError("the client certificate is not of the agent CA")


def node_name(der: bytes) -> str:
    """The node a leaf certificate names: exactly one CN, a node id, not a reserved role."""
    try:
        cert = x509.load_der_x509_certificate(der)
        cns = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    except ValueError as exc:
        raise CertIdentityError("undecodable client certificate") from exc
    if len(cns) != 1 or not isinstance(cns[0].value, str):
        raise CertIdentityError("the client certificate must have exactly one CN")
    cn = cns[0].value
    if not ID_RE.fullmatch(cn):
        raise CertIdentityError(f"CN {cn[:80]!r} is not a node id")
    if cn.startswith(RESERVED_PREFIXES):
        raise CertIdentityError(f"CN {cn!r} is a name of the bus's own roles")
    return cn
