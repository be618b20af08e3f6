"""Enrolled agents by their client certificate, as the auth callout reads them
(cloud_core/bus_certs.py, cloud_core/bus_callout.py): requests signed as nats-server signs
them, certificates made by the enrolment's own signer, no server. The real nats-server:
tests/integration/test_bus_agent_certs.py."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import nkeys
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from cloud_core import bus_callout as bc
from cloud_core.bus_certs import AgentCA, CertIdentityError, node_name, parse_template
from cloud_core.k8s.enroll import AgentSigner, make_ca
from tools.certs import CertStore
from tools.nats.cluster import callout_accounts, cert_agents

SERVER = nkeys.from_seed(nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_SERVER))


def _pem(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def _csr(cn: str | None, extra_cn: bool = False) -> x509.CertificateSigningRequest:
    names = [x509.NameAttribute(NameOID.COMMON_NAME, cn)] if cn else []
    if extra_cn:
        names.append(x509.NameAttribute(NameOID.COMMON_NAME, "other"))
    return (x509.CertificateSigningRequestBuilder().subject_name(x509.Name(names))
            .sign(ec.generate_private_key(ec.SECP256R1()), hashes.SHA256()))


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, AgentSigner]:
    cert, key = make_ca()
    d = tmp_path_factory.mktemp("ca")
    (d / "tls.crt").write_bytes(cert)
    (d / "tls.key").write_bytes(key)
    return d / "tls.crt", AgentSigner.from_dir(d)


def chain(signer: AgentSigner, node: str) -> list[str]:
    leaf = x509.load_pem_x509_certificate(signer.sign(_csr(node), node))
    return [_pem(leaf), _pem(signer.ca)]


def request(tls: dict[str, Any] | None, mqtt_id: str, user: str | None = None,
            cid: int = 7) -> bytes:
    opts = {"user": user} if user is not None else {}
    claims: dict[str, Any] = {"sub": "ACALLOUT", "aud": "nats-authorization-request", "nats": {
        "type": "authorization_request", "version": 2, "user_nkey": "UXYZ",
        "server_id": {"id": "NSERVERID", "name": "n0"}, "connect_opts": opts,
        "client_info": {"type": "mqtt", "mqtt_id": mqtt_id, "id": cid}}}
    if tls is not None:
        claims["nats"]["client_tls"] = tls
    return bc.encode_jwt(SERVER, claims).encode()


@pytest.fixture()
def svc(ca: tuple[Path, AgentSigner], tmp_path: Path) -> bc.CalloutService:
    (tmp_path / "acc.json").write_text(json.dumps({"version": 1, "users": {},
                                                   "cert_agents": cert_agents()}))
    return bc.CalloutService(tmp_path / "acc.json", bc.new_account_seed(),
                             agent_ca=AgentCA(ca[0]))


def answer(svc: bc.CalloutService, data: bytes) -> dict[str, Any]:
    out = svc.respond(data)
    assert out is not None
    return bc.decode_jwt(out.decode())["nats"]  # type: ignore[no-any-return]


def test_an_agent_certificate_is_its_node_only(svc: bc.CalloutService,
                                               ca: tuple[Path, AgentSigner]) -> None:
    tls = {"verified_chains": [chain(ca[1], "node.a")]}
    ok = answer(svc, request(tls, "agent-node~a"))
    user = bc.decode_jwt(ok["jwt"])
    assert user["name"] == "node.a" and user["nats"]["allowed_connection_types"] == ["MQTT"]
    assert user["nats"]["pub"]["allow"] == ["cfnet.v1.nodes.node//a.telemetry",
                                            "cfnet.v1.nodes.node//a.status"]
    assert answer(svc, request(tls, "node~a", user="node.a")).get("jwt")
    for mqtt_id, user_name, why in (("agent-b", None, "is not node 'node.a''s"),
                                    ("agent-node~a", "b", "is not the certificate's node"),
                                    ("Abcdefghij0123456789AB", None, "is not node")):
        bad = answer(svc, request(tls, mqtt_id, user=user_name))
        assert "jwt" not in bad and why in bad["error"], bad


@pytest.mark.parametrize(("tls", "why"), [
    ({"certs": ["x"]}, "an unverified client certificate"),
    ({"verified_chains": [["a"]] * 5}, "too many certificate chains"),
    ({"verified_chains": [["a"] * 5]}, "a malformed certificate chain"),
    ({"verified_chains": [[1, 2]]}, "a malformed certificate chain"),
    ({"verified_chains": [["x", "-----BEGIN CERTIFICATE-----\n" + "A" * 9000]]},
     "certificate too large"),
])
def test_hostile_tls_claims_are_refused_bounded(svc: bc.CalloutService,
                                                tls: dict[str, Any], why: str) -> None:
    bad = answer(svc, request(tls, "agent-x"))
    assert "jwt" not in bad and why in bad["error"], bad


def test_other_cas_reserved_names_and_bad_subjects(svc: bc.CalloutService,
                                                   tmp_path: Path) -> None:
    cert, key = make_ca()
    (tmp_path / "tls.crt").write_bytes(cert)
    (tmp_path / "tls.key").write_bytes(key)
    other = AgentSigner.from_dir(tmp_path)
    bad = answer(svc, request({"verified_chains": [chain(other, "edge-a")]}, "agent-edge-a"))
    assert "not of the agent CA" in bad["error"]
    for cn, why in (("core-1", "bus's own roles"), ("sim-x", "bus's own roles"),
                    ("Edge_A", "not a node id")):
        der = x509.load_pem_x509_certificate(other.sign(_csr("x"), cn)).public_bytes(
            serialization.Encoding.DER)
        with pytest.raises(CertIdentityError, match=why):
            node_name(der)


def test_revoked_nodes_are_refused_and_cut_off(svc: bc.CalloutService,
                                                ca: tuple[Path, AgentSigner]) -> None:
    tls = {"verified_chains": [chain(ca[1], "edge-c")]}
    assert answer(svc, request(tls, "agent-edge-c", cid=41)).get("jwt")
    assert answer(svc, request(tls, "edge-c", cid=42)).get("jwt")
    assert svc.due_kicks() == []
    doc = {"version": 1, "users": {}, "cert_agents": cert_agents(["edge-c"])}
    svc.accounts_file.write_text(json.dumps(doc) + " ")  # another size: a new stamp
    svc.reload()
    assert svc.due_kicks() == [("edge-c", "NSERVERID", 41), ("edge-c", "NSERVERID", 42)]
    assert svc.due_kicks() == []  # each once
    bad = answer(svc, request(tls, "agent-edge-c"))
    assert "node 'edge-c' is revoked" in bad["error"]


def test_without_cert_agents_or_agent_ca_nothing_is_admitted_by_certificate(
        ca: tuple[Path, AgentSigner], tmp_path: Path) -> None:
    st = CertStore(tmp_path / "pki")
    st.init()
    doc = callout_accounts(st)
    assert parse_template(doc["cert_agents"]) is not None  # type: ignore[index]
    (tmp_path / "acc.json").write_text(json.dumps({"version": 1, "users": {}}))
    tls = {"verified_chains": [chain(ca[1], "edge-a")]}
    s = bc.CalloutService(tmp_path / "acc.json", bc.new_account_seed(), agent_ca=AgentCA(ca[0]))
    assert "no certificate agents" in answer(s, request(tls, "agent-edge-a"))["error"]
    s = bc.CalloutService(tmp_path / "acc.json", bc.new_account_seed())
    assert "no username/password" in answer(s, request(tls, "agent-edge-a"))["error"]
