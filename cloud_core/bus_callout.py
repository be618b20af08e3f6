"""The clustered bus's auth callout: an MQTT client ID is its own account's, as on Mosquitto.

On Mosquitto ``use_username_as_clientid`` makes the client ID the username, so one
account can never take over another's MQTT session. NATS's MQTT listener has no such
option: every user of an account shares one session namespace, and any user may connect
with any client ID, which disconnects the client holding it and resumes its session
(its subscriptions and queued QoS 1 messages). The server's *auth callout* asks a service
before it admits a connection, and its request carries the MQTT client ID
(``client_info.mqtt_id``, filled by ``fillClientInfo`` in server/auth_callout.go from
``c.mqtt.cid``, which ``mqttParseConnect`` in server/mqtt.go reads before
``mqttProcessConnect`` authenticates). This is that service.

With ``auth_callout`` configured, nats-server sends every connection not in its
``auth_users`` here, whatever its config users say (``processClientOrLeafAuthentication``
in server/auth.go), so the service is the authority for those accounts: it checks the
password, the client ID (:func:`client_id_allowed`) and answers with a user JWT carrying
the account's NATS permissions and connection types, as rendered by
``python -m tools.nats.cluster callout-accounts`` (the same translation of the cfnet ACL as
the plain ``accounts.conf``). A refusal is answered with its reason (the server logs it:
``auth callout service returned an error: ...``) and counted by reason
(:attr:`CalloutService.refusals`, logged).

Where it runs: next to each nats-server (the chart's sidecar in every NATS pod, the test
harness's process beside its nodes), a queue group across them, not in the core. The
callout is on every connect's path and fails closed: were it in the core, a core outage
would keep every agent that reconnects meanwhile (a bus-node restart moves thousands) off
the bus until the core returns. They would buffer and lose nothing, but a bus that needs
the core to admit its clients is not a bus that outlives the core. Beside the bus, it is
down only when the bus node is.

Hostile input is bounded before it is expanded: a request larger than
:data:`MAX_REQUEST_BYTES` is dropped unread (the server then refuses on its auth
timeout), the JWT must have three parts and be signed by the server key it names, and
names, passwords and client IDs longer than :data:`MAX_FIELD` are refused.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import collections
import contextlib
import hashlib
import hmac
import json
import logging
import os
import re
import ssl
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nacl.exceptions
import nacl.signing
import nkeys

from cloud_core.bus_certs import AgentCA, AgentTemplate, CertIdentityError, parse_template
from cloud_core.errors import CoreError

log = logging.getLogger("cfnet.callout")

CALLOUT_SUBJECT = "$SYS.REQ.USER.AUTH"
QUEUE = "cfnet-callout"
# A request is a JWT of client info and connect options; a client certificate chain in
# PEM is the largest part (a few KiB). Anything far past that is not a real server's.
MAX_REQUEST_BYTES = 64 * 1024
MAX_ACCOUNTS_BYTES = 64 * 1024 * 1024
MAX_FIELD = 256
GLOBAL_ACCOUNT = "$G"  # config-mode users live in the global account
# What nats-server assigns a clean-session client that sent an empty ID (nuid.Next():
# 22 base62 characters). Account IDs are lowercase, so one with an uppercase letter is
# never an account's own ID.
_SERVER_ASSIGNED = re.compile(r"[0-9A-Za-z]{22}")
_B32 = re.compile(r"[A-Z2-7]+")


class CalloutError(CoreError):
    """The callout's configuration (keys, accounts file) is unusable."""


# ------------------------------------------------------------------ nkeys and JWTs
def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def verify_key(public: str) -> nacl.signing.VerifyKey:
    """The Ed25519 key of an nkey public key (prefix byte, 32 bytes, CRC16; base32).
    nkeys.py signs from a seed but has no verify-from-public-key, so it is decoded here."""
    if len(public) != 56 or not _B32.fullmatch(public):
        raise ValueError("not an nkey public key")
    raw = base64.b32decode(public)
    body, crc = raw[:-2], int.from_bytes(raw[-2:], "little")
    if nkeys.crc16(bytearray(body)) != crc:
        raise ValueError("nkey checksum mismatch")
    return nacl.signing.VerifyKey(bytes(body[1:]))


def decode_jwt(token: str) -> dict[str, Any]:
    """The claims of a NATS JWT (``ed25519-nkey``) after checking its signature by ``iss``."""
    parts = token.split(".")
    if len(parts) != 3:
        raise ValueError("not a JWT (three parts)")
    header = json.loads(_unb64(parts[0]))
    if not isinstance(header, dict) or str(header.get("alg", "")).lower() != "ed25519-nkey":
        raise ValueError("not an ed25519-nkey JWT")
    claims = json.loads(_unb64(parts[1]))
    if not isinstance(claims, dict) or not isinstance(claims.get("iss"), str):
        raise ValueError("JWT without an issuer")
    try:
        verify_key(claims["iss"]).verify(f"{parts[0]}.{parts[1]}".encode(), _unb64(parts[2]))
    except nacl.exceptions.BadSignatureError as exc:
        raise ValueError("bad JWT signature") from exc
    return claims


def encode_jwt(kp: Any, claims: dict[str, Any]) -> str:
    """Sign ``claims`` as nats-io/jwt v2 does: ``jti`` the SHA-512/256 of the claims without
    it, ``iat`` now, ``iss`` the signer."""
    body = {**claims, "iss": kp.public_key.decode(), "iat": int(time.time())}
    body.pop("jti", None)
    digest = hashlib.new("sha512_256", json.dumps(body, separators=(",", ":")).encode())
    body["jti"] = base64.b32encode(digest.digest()).rstrip(b"=").decode()
    head = _b64(json.dumps({"typ": "JWT", "alg": "ed25519-nkey"}).encode())
    payload = _b64(json.dumps(body, separators=(",", ":")).encode())
    sig = kp.sign(f"{head}.{payload}".encode())
    return f"{head}.{payload}.{_b64(sig)}"


def new_account_seed() -> str:
    """A fresh account nkey seed (``SA...``), the callout's signing key."""
    seed: bytes = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_ACCOUNT)
    return seed.decode()


def account_public(seed: str) -> str:
    """The public key (``A...``) of an account seed: the config's ``auth_callout.issuer``."""
    return str(nkeys.from_seed(seed.encode()).public_key.decode())


# ------------------------------------------------------------------ the policy
def _dict(value: Any) -> dict[str, Any]:
    """A claim that should be an object, or an empty one: a signed request is still read
    as hostile (a wrong type is a refusal for want of the field, never an exception)."""
    return value if isinstance(value, dict) else {}


@dataclass(frozen=True)
class Account:
    """One account as the callout admits it (an entry of the rendered accounts file)."""

    name: str
    password: str
    client_ids: frozenset[str]  # the MQTT client IDs that are this account's own
    server_assigned: bool  # may connect with a server-assigned ID (clean-session consoles)
    permissions: dict[str, Any]
    connection_types: tuple[str, ...]
    by_certificate: bool = False  # an enrolled agent, named by its client certificate


def client_id_allowed(account: Account, client_id: str) -> bool:
    """Whether ``account`` may hold the MQTT session ``client_id``."""
    if client_id in account.client_ids:
        return True
    return (account.server_assigned and bool(_SERVER_ASSIGNED.fullmatch(client_id))
            and client_id.lower() != client_id)


def _read_doc(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_ACCOUNTS_BYTES + 1)
    except OSError as exc:
        raise CalloutError(f"cannot read accounts {path}: {exc}") from exc
    if len(raw) > MAX_ACCOUNTS_BYTES:
        raise CalloutError(f"accounts file {path} over {MAX_ACCOUNTS_BYTES} bytes")
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise CalloutError(f"accounts file {path} is malformed: {exc!r}") from exc
    if not isinstance(doc, dict):
        raise CalloutError(f"accounts file {path} is not a JSON object")
    return doc


def _accounts(doc: dict[str, Any], path: Path) -> dict[str, Account]:
    try:
        return {name: Account(name, str(u["password"]), frozenset(map(str, u["client_ids"])),
                              bool(u.get("server_assigned", False)), dict(u["permissions"]),
                              tuple(map(str, u["allowed_connection_types"])))
                for name, u in doc["users"].items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CalloutError(f"accounts file {path} is malformed: {exc!r}") from exc


def load_accounts(path: Path) -> dict[str, Account]:
    """The accounts file ``python -m tools.nats.cluster callout-accounts`` renders."""
    return _accounts(_read_doc(path), path)


def load_template(path: Path) -> AgentTemplate | None:
    """Its ``cert_agents`` entry (:mod:`cloud_core.bus_certs`); None without one."""
    try:
        return parse_template(_read_doc(path).get("cert_agents"))
    except CertIdentityError as exc:
        raise CalloutError(f"accounts file {path}: {exc}") from exc


# Connections remembered per admitted name, to cut them off when it is revoked or removed
# (the newest few: nats-server never reuses a connection id, and an old one that is gone
# costs one no-op kick).
MAX_CONNS_PER_NAME = 4


class CalloutService:
    """Answers ``$SYS.REQ.USER.AUTH`` requests: :meth:`decide` then a signed response."""

    def __init__(self, accounts_file: Path, issuer_seed: str, *, user_ttl_s: int = 0,
                 agent_ca: AgentCA | None = None) -> None:
        """``user_ttl_s``: the admitted connection's lifetime (0: until it disconnects).
        nats-server does not re-ask the callout on a config reload, so an account removed
        from the accounts file stays connected until it reconnects, unless the callout
        cuts it off (:meth:`due_kicks`, with a system-account connection) or a TTL ends it.
        ``agent_ca``: admit enrolled agents by their client certificate
        (:mod:`cloud_core.bus_certs`)."""
        self.accounts_file = accounts_file
        self.user_ttl_s = user_ttl_s
        self.agent_ca = agent_ca
        self.issuer = nkeys.from_seed(issuer_seed.encode())
        self.refusals: collections.Counter[str] = collections.Counter()
        self.accepted = 0
        self.kicked = 0
        self._accounts: dict[str, Account] = {}
        self._template: AgentTemplate | None = None
        self._stamp: tuple[int, ...] | None = None
        # (kind, name) -> (server id, connection id) of its admitted connections, newest last
        self._live: dict[tuple[str, str], collections.deque[tuple[str, int]]] = {}
        self._kicks: list[tuple[str, str, int]] = []  # (name, server id, connection id)
        self.reload()

    def reload(self) -> None:
        """Re-read the accounts file when it changed (a Secret update, an account added)."""
        try:
            st = os.stat(self.accounts_file)
        except OSError as exc:
            raise CalloutError(f"cannot stat {self.accounts_file}: {exc}") from exc
        stamp = (st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size)
        if stamp != self._stamp:
            doc = _read_doc(self.accounts_file)
            accounts = _accounts(doc, self.accounts_file)
            try:
                template = parse_template(doc.get("cert_agents"))
            except CertIdentityError as exc:
                raise CalloutError(f"accounts file {self.accounts_file}: {exc}") from exc
            self._accounts, self._template, self._stamp = accounts, template, stamp
            log.info("callout: %d accounts from %s%s", len(accounts), self.accounts_file,
                     f", {len(template.revoked)} revoked nodes" if template else "")
            self._cut_off_gone()

    def _still_admitted(self, kind: str, name: str) -> bool:
        if kind == "cert":
            return self._template is not None and name not in self._template.revoked
        return name in self._accounts

    def _cut_off_gone(self) -> None:
        for key in [k for k in self._live if not self._still_admitted(*k)]:
            for server_id, cid in self._live.pop(key):
                self._kicks.append((key[1], server_id, cid))
            log.warning("callout: %s %r is no longer admitted: cutting off its connections",
                        key[0], key[1])

    def due_kicks(self) -> list[tuple[str, str, int]]:
        """The connections to cut off now, (name, server id, connection id), each once:
        those of a node revoked or an account removed since they were admitted."""
        out, self._kicks = self._kicks, []
        return out

    def remember(self, kind: str, name: str, info: dict[str, Any], server_id: str) -> None:
        cid = info.get("id")
        if isinstance(cid, int) and not isinstance(cid, bool):
            q = self._live.setdefault((kind, name), collections.deque(maxlen=MAX_CONNS_PER_NAME))
            q.append((server_id, cid))

    def decide(self, request: dict[str, Any]) -> tuple[Account | None, str]:
        """The account a decoded request authenticates as, or None and the reason."""
        nats_claims = _dict(request.get("nats"))
        opts = _dict(nats_claims.get("connect_opts"))
        info = _dict(nats_claims.get("client_info"))
        user, password = opts.get("user"), opts.get("pass")
        mqtt_id = info.get("mqtt_id") or ""
        if not isinstance(mqtt_id, str) or len(mqtt_id) > MAX_FIELD:
            return None, "field too long"
        try:
            self.reload()
        except CalloutError as exc:
            log.error("%s", exc)  # keep the last good set
        if self.agent_ca is not None:
            try:
                node = self.agent_ca.node_of(nats_claims.get("client_tls"))
            except CertIdentityError as exc:
                return None, str(exc)
            if node is not None:
                return self._certificate_agent(node, user, mqtt_id)
        if not isinstance(user, str) or not isinstance(password, str) or not user:
            return None, "no username/password"
        if max(len(user), len(password)) > MAX_FIELD:
            return None, "field too long"
        account = self._accounts.get(user)
        # compare_digest even for an unknown user: no timing tells which names exist.
        good = hmac.compare_digest(password.encode(), (account.password if account else
                                                       "\0" * len(password)).encode())
        if account is None or not good:
            return None, "bad credentials"
        is_mqtt = str(info.get("type", "")).lower() == "mqtt" or bool(mqtt_id)
        if is_mqtt and not client_id_allowed(account, mqtt_id):
            return None, f"client id {mqtt_id!r} is not account {user!r}'s"
        return account, ""

    def _certificate_agent(self, node: str, user: Any, mqtt_id: str) -> tuple[Account | None, str]:
        """Node ``node``'s verified certificate: admitted with the agent role for that node
        only, its own client IDs only (module :mod:`cloud_core.bus_certs`)."""
        t = self._template
        if t is None:
            return None, "no certificate agents are admitted (no cert_agents)"
        if node in t.revoked:
            return None, f"node {node!r} is revoked"
        if user not in (None, "", node):
            return None, f"username {str(user)[:MAX_FIELD]!r} is not the certificate's node"
        account = Account(node, "", t.client_ids_for(node), False, t.permissions_for(node),
                          t.connection_types, by_certificate=True)
        if not client_id_allowed(account, mqtt_id):
            return None, f"client id {mqtt_id!r} is not node {node!r}'s"
        return account, ""

    def respond(self, data: bytes) -> bytes | None:
        """The signed response to one raw request, or None when it cannot be answered."""
        if len(data) > MAX_REQUEST_BYTES:
            self._refuse("oversize request", "-")
            return None
        try:
            req = decode_jwt(data.decode("ascii"))
            nc = req["nats"]
            if not isinstance(nc, dict):
                raise TypeError("nats claims are not an object")
            user_nkey, server_id = str(nc["user_nkey"]), str(nc["server_id"]["id"])
            if nc.get("type") != "authorization_request":
                raise ValueError(f"a {nc.get('type')!r} claim")
        except (ValueError, KeyError, TypeError, UnicodeDecodeError, binascii.Error,
                RecursionError) as exc:  # RecursionError: JSON nested past the parser's depth
            self._refuse("undecodable request", repr(exc)[:200])
            return None
        account, reason = self.decide(req)
        base = {"sub": user_nkey, "aud": server_id}
        if account is None:
            who = str(_dict(nc.get("connect_opts")).get("user", ""))[:MAX_FIELD]
            self._refuse(reason, who)
            body = {**base, "nats": {"error": reason, "type": "authorization_response",
                                     "version": 2}}
            return encode_jwt(self.issuer, body).encode()
        ttl = {"exp": int(time.time()) + self.user_ttl_s} if self.user_ttl_s > 0 else {}
        user_jwt = encode_jwt(self.issuer, {
            **ttl, "sub": user_nkey, "aud": GLOBAL_ACCOUNT, "name": account.name,
            "nats": {**account.permissions, "subs": -1, "data": -1, "payload": -1,
                     "allowed_connection_types": list(account.connection_types),
                     "type": "user", "version": 2}})
        self.accepted += 1
        self.remember("cert" if account.by_certificate else "password", account.name,
                      _dict(nc.get("client_info")), server_id)
        return encode_jwt(self.issuer, {**base, "nats": {
            "jwt": user_jwt, "type": "authorization_response", "version": 2}}).encode()

    def _refuse(self, reason: str, who: str) -> None:
        key = reason.split(" '")[0] if reason.startswith("client id") else reason
        self.refusals[key] += 1
        log.warning("callout: refused %s: %s (%d so far)", who, reason, self.refusals[key])


# ------------------------------------------------------------------ the process
def _tls(ca_file: Path | None) -> ssl.SSLContext | None:
    return ssl.create_default_context(cafile=str(ca_file)) if ca_file else None


KICK_SUBJECT = "$SYS.REQ.SERVER.{}.KICK"  # nats-server's clientKickReqSubj (events.go)
RELOAD_POLL_S = 1.0  # how often the accounts file is looked at for revocations


async def cut_off(svc: CalloutService, sys_nc: Any | None) -> int:
    """Re-read the accounts file and kick the connections of what it no longer admits
    (``$SYS.REQ.SERVER.<id>.KICK``, as the system account); how many were kicked."""
    try:
        svc.reload()
    except CalloutError as exc:
        log.error("%s", exc)  # keep the last good set
    done = 0
    for name, server_id, cid in svc.due_kicks():
        if sys_nc is None:
            log.warning("callout: %r stays connected until it reconnects (connection %d): "
                        "no system-account user to kick it with (--sys-user)", name, cid)
            continue
        try:
            await sys_nc.request(KICK_SUBJECT.format(server_id),
                                 json.dumps({"cid": cid}).encode(), timeout=2)
            done += 1
            log.warning("callout: kicked %r (server %s, connection %d)", name,
                        server_id[:8], cid)
        except Exception as exc:  # that server is away: the connection went with it
            log.info("callout: kicking %r (connection %d): %s", name, cid, exc)
    svc.kicked += done
    return done


async def serve(svc: CalloutService, urls: list[str], user: str, password: str,
                ca_file: Path | None, stop: asyncio.Event,
                sys_login: tuple[str, str] | None = None) -> None:
    """Answer requests on every ``urls`` server until ``stop``; prints ``ready`` once
    subscribed. ``sys_login``: a system-account user, to cut off what is revoked."""
    import nats

    async def on_request(msg: Any) -> None:
        out = svc.respond(msg.data)
        if out is not None and msg.reply:
            await msg.respond(out)

    nc = await nats.connect(servers=urls, user=user, password=password, tls=_tls(ca_file),
                            name="cfnet-callout", max_reconnect_attempts=-1,
                            reconnect_time_wait=0.5)
    sys_nc = None
    try:
        if sys_login is not None:
            sys_nc = await nats.connect(servers=urls, user=sys_login[0], password=sys_login[1],
                                        tls=_tls(ca_file), name="cfnet-callout-sys",
                                        max_reconnect_attempts=-1, reconnect_time_wait=0.5)
        await nc.subscribe(CALLOUT_SUBJECT, queue=QUEUE, cb=on_request)
        await nc.flush()
        print("ready", flush=True)
        while not stop.is_set():
            await cut_off(svc, sys_nc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), RELOAD_POLL_S)
    finally:
        if sys_nc is not None:
            await sys_nc.close()
        await nc.close()


def main(argv: list[str] | None = None) -> int:
    """``python -m cloud_core.bus_callout``: run the callout beside a NATS cluster."""
    ap = argparse.ArgumentParser(prog="python -m cloud_core.bus_callout")
    ap.add_argument("--nats-url", required=True, help="comma-separated native URLs")
    ap.add_argument("--user", default="cfnet-callout")
    ap.add_argument("--password-file", type=Path, required=True)
    ap.add_argument("--issuer-seed-file", type=Path, required=True)
    ap.add_argument("--accounts", type=Path, required=True)
    ap.add_argument("--ca-file", type=Path)
    ap.add_argument("--agent-ca", type=Path,
                    help="admit enrolled agents by a client certificate of this CA "
                         "(the MQTT listener's TLS: verify optional, this ca_file)")
    ap.add_argument("--sys-user", help="a system-account user: cut off revoked connections")
    ap.add_argument("--sys-password-file", type=Path)
    ap.add_argument("--user-ttl", type=int, default=0, metavar="SECONDS",
                    help="close admitted connections after this long, so a removed account "
                         "is cut off (0: never; they reconnect through the callout)")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(message)s")
    try:
        svc = CalloutService(a.accounts, a.issuer_seed_file.read_text().strip(),
                             user_ttl_s=max(0, a.user_ttl),
                             agent_ca=AgentCA(a.agent_ca) if a.agent_ca else None)
        password = a.password_file.read_text().strip()
        sys_login = None
        if a.sys_user:
            if not a.sys_password_file:
                raise CalloutError("--sys-user needs --sys-password-file")
            sys_login = (a.sys_user, a.sys_password_file.read_text().strip())
    except (OSError, CalloutError, CertIdentityError, nkeys.ErrInvalidSeed) as exc:
        print(f"cfnet-callout: {exc}", file=sys.stderr)
        return 2
    stop = asyncio.Event()

    async def run() -> None:
        import signal
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve(svc, a.nats_url.split(","), a.user, password, a.ca_file, stop, sys_login)

    asyncio.run(run())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
