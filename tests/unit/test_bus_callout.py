"""The auth callout's decisions and bounds (cloud_core/bus_callout.py), on requests signed as
nats-server signs them (a server nkey, ``ed25519-nkey`` JWTs), with no server: what a
request may claim, which client IDs an account owns, and what is refused unread. The same
service against the real nats-server: tests/integration/test_bus_callout.py."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import nkeys
import pytest

from cloud_core import bus_callout as bc
from tools.certs import CertStore
from tools.nats.cluster import callout_accounts


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> CertStore:
    st = CertStore(tmp_path_factory.mktemp("callout") / "pki")  # keys once: openssl is slow
    st.init()
    st.add_account("node.a", "agent")
    st.add_account("b", "agent")
    st.add_account("agent-b", "agent")  # claims node b's agent-b too: nobody's
    st.add_account("ops", "operator")
    return st


@pytest.fixture()
def svc(store: CertStore, tmp_path: Path) -> bc.CalloutService:
    (tmp_path / "acc.json").write_text(json.dumps(callout_accounts(store)))
    s = bc.CalloutService(tmp_path / "acc.json", bc.new_account_seed())
    s.store = store  # type: ignore[attr-defined]
    return s


SERVER = nkeys.from_seed(nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_SERVER))


def request(user: str, password: str, mqtt_id: str | None, *, signer: Any = SERVER) -> bytes:
    info: dict[str, Any] = {"user": user, "type": "mqtt" if mqtt_id is not None else "nats"}
    if mqtt_id:
        info["mqtt_id"] = mqtt_id
    claims = {"sub": "ACALLOUT", "aud": "nats-authorization-request", "nats": {
        "type": "authorization_request", "version": 2, "user_nkey": "UXYZ",
        "server_id": {"id": "NSERVERID", "name": "n0"},
        "connect_opts": {"user": user, "pass": password}, "client_info": info}}
    return bc.encode_jwt(signer, claims).encode()


def answer(svc: bc.CalloutService, data: bytes) -> dict[str, Any]:
    out = svc.respond(data)
    assert out is not None
    claims = bc.decode_jwt(out.decode())
    assert claims["iss"] == svc.issuer.public_key.decode()
    assert claims["sub"] == "UXYZ" and claims["aud"] == "NSERVERID"
    return claims["nats"]


def pw(svc: bc.CalloutService, name: str) -> str:
    return str(svc.store.credentials(name).password)  # type: ignore[attr-defined]


def test_own_ids_admitted_with_the_acl_others_refused_with_the_reason(
        svc: bc.CalloutService) -> None:
    ok = answer(svc, request("node.a", pw(svc, "node.a"), "agent-node~a"))
    user = bc.decode_jwt(ok["jwt"])
    assert user["aud"] == "$G" and user["name"] == "node.a" and user["sub"] == "UXYZ"
    assert user["nats"]["allowed_connection_types"] == ["MQTT"]
    assert "$MQTT.sub.>" in user["nats"]["sub"]["allow"]
    assert answer(svc, request("node.a", pw(svc, "node.a"), "node~a")).get("jwt")
    bad = answer(svc, request("node.a", pw(svc, "node.a"), "agent-b"))
    assert "jwt" not in bad and "is not account 'node.a'" in bad["error"]
    # agent-b is both node b's agent id and account agent-b's name: nobody's.
    assert "error" in answer(svc, request("b", pw(svc, "b"), "agent-b"))
    assert "error" in answer(svc, request("agent-b", pw(svc, "agent-b"), "agent-b"))
    assert answer(svc, request("b", pw(svc, "b"), "b")).get("jwt")
    # A console's server-assigned id: operators only, never a lowercase (account) id.
    assert answer(svc, request("ops", pw(svc, "ops"), "Ab3dE5gH9jK1mN2pQ4sT6v")).get("jwt")
    assert "error" in answer(svc, request("ops", pw(svc, "ops"), "ab3de5gh9jk1mn2pq4st6v"))
    assert "error" in answer(svc, request("b", pw(svc, "b"), "Ab3dE5gH9jK1mN2pQ4sT6v"))
    assert answer(svc, request("b", "wrong", "b"))["error"] == "bad credentials"
    assert answer(svc, request("nobody", "x", "nobody"))["error"] == "bad credentials"
    assert svc.refusals["bad credentials"] == 2 and svc.accepted == 4


def test_hostile_requests_are_refused_unread_and_counted(svc: bc.CalloutService) -> None:
    assert svc.respond(b"x" * (bc.MAX_REQUEST_BYTES + 1)) is None
    assert svc.refusals["oversize request"] == 1
    for junk in (b"not.a.jwt", b"\xff\xfe", b"a.b", request("b", "x", "b")[:-4] + b"AAAA"):
        assert svc.respond(junk) is None
    impostor = nkeys.from_seed(nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_SERVER))
    forged = request("b", pw(svc, "b"), "b", signer=impostor).split(b".")
    real = request("b", pw(svc, "b"), "b").split(b".")
    assert svc.respond(b".".join([real[0], real[1], forged[2]])) is None  # bad signature
    assert svc.refusals["undecodable request"] == 5
    assert answer(svc, request("b", "p" * (bc.MAX_FIELD + 1), "b"))["error"] == "field too long"


def test_fuzzed_requests_never_raise_and_every_refusal_is_counted(
        svc: bc.CalloutService) -> None:
    """Byte mutations of a real request, JSON nested past the parser's depth, and correctly
    signed claims of the wrong shape: each is answered or dropped, never an exception."""
    import random

    rng = random.Random(7)
    good = request("b", pw(svc, "b"), "b")
    head = bc._b64(json.dumps({"typ": "JWT", "alg": "ed25519-nkey"}).encode())
    deep = bc._b64(b"[" * 100_000 + b"]" * 100_000)
    cases = [f"{head}.{deep}.AAAA".encode(), f"{deep}.{deep}.{deep}".encode()[:60_000]]
    for _ in range(400):
        b = bytearray(good)
        for _ in range(rng.randint(1, 8)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        cases.append(bytes(b))
    for shape in ([], "x", 3, {"type": "authorization_request", "user_nkey": "U",
                               "server_id": {"id": "N"}, "connect_opts": [],
                               "client_info": "mqtt"}):
        claims = {"sub": "A", "aud": "x", "nats": shape}
        cases.append(bc.encode_jwt(SERVER, claims).encode())
    before = sum(svc.refusals.values()) + svc.accepted
    for data in cases:
        svc.respond(data)  # must not raise
    assert sum(svc.refusals.values()) + svc.accepted == before + len(cases)
    assert svc.refusals["undecodable request"] >= 2  # the deep ones at least


def test_the_accounts_file_is_reread_when_it_changes(svc: bc.CalloutService,
                                                     tmp_path: Path) -> None:
    store: CertStore = svc.store  # type: ignore[attr-defined]
    store.add_account("late", "agent")
    late = pw(svc, "late")
    try:
        assert "error" in answer(svc, request("late", late, "late"))
        tmp = tmp_path / "acc.tmp"
        tmp.write_text(json.dumps(callout_accounts(store)))
    finally:
        store.remove_account("late")  # the module's store, as the other tests expect it
    tmp.replace(tmp_path / "acc.json")
    assert answer(svc, request("late", late, "agent-late")).get("jwt")
    (tmp_path / "acc.json").write_text("{broken")  # a bad file keeps the last good set
    assert answer(svc, request("late", late, "late")).get("jwt")


def test_a_user_ttl_bounds_the_connection_so_a_removed_account_is_cut_off(
        svc: bc.CalloutService) -> None:
    """nats-server does not re-ask the callout on reload: the JWT's ``exp`` is what ends an
    admitted connection (the server closes it then; it reconnects through the callout)."""
    user = bc.decode_jwt(answer(svc, request("b", pw(svc, "b"), "b"))["jwt"])
    assert "exp" not in user
    svc.user_ttl_s = 600
    user = bc.decode_jwt(answer(svc, request("b", pw(svc, "b"), "b"))["jwt"])
    assert 0 < user["exp"] - user["iat"] <= 600
