"""One identity per agent on the clustered bus: the enrolled client certificate (docs/security.md,
"One identity per agent on NATS"), on a real 3-node nats-server cluster with the auth callout.

The agent CA and the agents' certificates are made by the enrolment's own code
(``cloud_core.k8s.enroll``: ``make_ca``, ``AgentSigner.sign`` of a CSR for ``CN=<node>``);
the MQTT listener verifies a certificate when one is presented (``verify: "optional"``, the
agent CA), the callout (``cloud_core.bus_callout`` with ``--agent-ca``) names the node by it.
Shown: an agent connects with its certificate and no password and reports as itself; it
cannot publish as another node (never delivered) nor read another's acks; it cannot connect
with another node's client ID or username, so it cannot take over another node's session
(which stays connected); a certificate of another CA does not get in; a password core and
operator are admitted beside it; a revoked node's open connection is cut off within
seconds and its reconnects are refused.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from cloud_core.k8s.enroll import AgentSigner, make_ca
from edge_agent.wire import ack_topic, status_topic, telemetry_topic
from edge_agent.wire.mqtt import Message, MqttClient, MqttSettings
from tests.integration.helpers import settings, wait_for
from tools.nats.cluster import NatsCluster

REVOKE_WITHIN_S = 10.0  # the callout looks once a second; the kick is one round trip


def _ca(d: Path) -> AgentSigner:
    cert, key = make_ca()
    d.mkdir(parents=True, exist_ok=True)
    (d / "tls.crt").write_bytes(cert)
    (d / "tls.key").write_bytes(key)
    return AgentSigner.from_dir(d)


def _enroll(signer: AgentSigner, d: Path, node: str) -> tuple[Path, Path]:
    """What enrolment leaves on a node: its key, and the certificate the core signed."""
    key = ec.generate_private_key(ec.SECP256R1())
    csr = (x509.CertificateSigningRequestBuilder()
           .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, node)]))
           .sign(key, hashes.SHA256()))
    kf, cf = d / f"{node}.key", d / f"{node}.crt"
    kf.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                     serialization.PrivateFormat.PKCS8,
                                     serialization.NoEncryption()))
    cf.write_bytes(signer.sign(csr, node))
    return cf, kf


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, object]]:
    d = tmp_path_factory.mktemp("agent-certs")
    signer = _ca(d / "agent-ca")
    with NatsCluster(d / "nats", callout=True, agent_ca=d / "agent-ca" / "tls.crt") as bus:
        certs = {n: _enroll(signer, d, n) for n in ("edge-a", "edge-b", "edge-c", "edge-d")}
        rogue = _enroll(_ca(d / "rogue-ca"), d, "edge-e")  # right shape, another CA
        bus.add_account("core-certs", "core")
        yield {"bus": bus, "certs": certs, "rogue": rogue}


def agent(bus: NatsCluster, cert: tuple[Path, Path], client_id: str,
          username: str | None = None, **kw: object) -> MqttClient:
    s = MqttSettings(host=bus.host, port=bus.port, username=username, tls=True,
                     ca_file=bus.ca_file, certfile=cert[0], keyfile=cert[1],
                     client_id=client_id, protocol="mqtt311", clean_start=True,
                     failover=bus.failover, reconnect_max_s=1.0)
    c = MqttClient(s, **kw)  # type: ignore[arg-type]
    c.start()
    return c


def refused(c: MqttClient) -> bool:
    """Refused at CONNECT (CONNACK 5), as soon as the first answer says so."""
    try:
        wait_for(lambda: c.last_refusal or c.connected, 15, "an answer to CONNECT")
        return not c.connected and "Not authorized" in c.last_refusal
    finally:
        c.stop(graceful=False)


def test_an_enrolled_agent_is_itself_only(world: dict[str, object]) -> None:
    bus = world["bus"]
    assert isinstance(bus, NatsCluster)
    certs: dict[str, tuple[Path, Path]] = world["certs"]  # type: ignore[assignment]
    got: list[Message] = []
    core = MqttClient(settings(bus, bus.credentials("core-certs"), client_id="core-certs",
                               clean_start=True), on_message=got.append)
    core.subscribe("cfnet/v1/nodes/+/telemetry")
    core.start()
    spied: list[Message] = []
    a = agent(bus, certs["edge-a"], "agent-edge-a", on_message=spied.append)
    a.subscribe(ack_topic("edge-a"))
    a.subscribe(ack_topic("edge-b"))
    b = agent(bus, certs["edge-b"], "agent-edge-b")
    try:
        assert core.wait_connected(15), core.last_refusal
        assert a.wait_connected(15), a.last_refusal  # a certificate, no password
        assert b.wait_connected(15), b.last_refusal

        def own(tag: bytes) -> bool:
            a.publish(telemetry_topic("edge-a"), tag).wait(5)
            return any(m.payload == tag for m in got)

        wait_for(lambda: own(b"warm"), 20, "edge-a's own report at the core")
        a.publish(telemetry_topic("edge-b"), b"forged").wait(5)
        a.publish(status_topic("edge-b"), b"forged").wait(5)
        wait_for(lambda: own(b"marker"), 20, "the marker after the forged reports")
        assert b"forged" not in [m.payload for m in got]
        core.publish(ack_topic("edge-b"), b"theirs").wait(5)
        wait_for(lambda: core.publish(ack_topic("edge-a"), b"mine").wait(5)
                 and any(m.payload == b"mine" for m in spied), 20, "edge-a's own ack")
        assert [m.topic for m in spied if m.payload == b"theirs"] == []
        # Another node's session: neither its client ID nor its name gets in, and the
        # node holding it stays connected.
        assert refused(agent(bus, certs["edge-a"], "agent-edge-b"))
        assert refused(agent(bus, certs["edge-a"], "edge-b"))
        assert refused(agent(bus, certs["edge-a"], "agent-edge-a", username="edge-b"))
        assert b.connected and b.stats.disconnects == 0
        # A certificate of another CA fails the TLS handshake: no CONNACK at all.
        rogue = agent(bus, world["rogue"], "agent-edge-e")  # type: ignore[arg-type]
        assert not rogue.wait_connected(5)
        rogue.stop(graceful=False)
    finally:
        for c in (a, b, core):
            c.stop()
    log = bus.callout_log.read_text(errors="replace")
    assert "is not node 'edge-a''s" in log and "is not the certificate's node" in log


def test_a_revoked_node_is_cut_off_within_seconds(world: dict[str, object]) -> None:
    bus = world["bus"]
    assert isinstance(bus, NatsCluster)
    certs: dict[str, tuple[Path, Path]] = world["certs"]  # type: ignore[assignment]
    c = agent(bus, certs["edge-c"], "agent-edge-c")
    d = agent(bus, certs["edge-d"], "agent-edge-d")
    try:
        assert c.wait_connected(15) and d.wait_connected(15)
        t0 = time.monotonic()
        bus.revoke("edge-c")
        wait_for(lambda: c.stats.disconnects > 0, REVOKE_WITHIN_S, "edge-c cut off")
        took = time.monotonic() - t0
        time.sleep(2)  # its reconnects (every second at most) are refused
        assert not c.connected and c.stats.refused, c.stats.refused
        assert d.connected and d.stats.disconnects == 0  # the others stay
        print(f"\nrevoked node cut off after {took:.1f} s")
    finally:
        c.stop(graceful=False)
        d.stop()
    assert "kicked 'edge-c'" in bus.callout_log.read_text(errors="replace")
