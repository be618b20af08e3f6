"""Can one node's broker identity publish as another node? A check for installed brokers.

``publish_as`` connects to the broker's certificate listener (the agents' one, 8884 in the
Helm chart) with one node's client certificate and key, exactly as that node's agent does,
and publishes QoS 1 with MQTT 5 to the given topics; it returns each PUBACK's reason code
(0 or 16, "no matching subscribers": accepted; 135 not authorized). ``cannot_publish_as``
is the whole check: node A's own telemetry is accepted and node B's telemetry and status
are refused, or it raises
``AssertionError`` saying which was not.

On the installed chart the agent's certificate and key are in its node's state directory
(``<agent.hostPaths.stateDir>/identity/client.crt`` and ``client.key``), the broker's CA is
the ``ca.crt`` of the agents' Secret, and ``netns`` is where the broker's address is
reachable (tools.netns), e.g.::

    from tools.identity_probe import cannot_publish_as
    cannot_publish_as(pod_ip, 8884, ca_file=pki / "ca.crt",
                      certfile=state / "identity/client.crt", keyfile=state / "identity/client.key",
                      node="node-a", other="node-b", netns="cfnet-node", check_hostname=False)

(``check_hostname=False`` when dialling the pod IP that the broker certificate does not name:
the chain is still verified against ``ca_file``.)

The broker replaces the client id with the certificate's CN (use_username_as_clientid), so
the probe takes over node A's connection for a moment: node A's agent is disconnected once
and reconnects by itself (its session is started clean by the probe's connection).

Used by tests/k8s/test_identity.py against a real Mosquitto.

NATS's MQTT listener speaks 3.1.1, which has no reason codes: ``connect_311`` answers with
the CONNACK's code as paho reads it (3.1.1's return code 5, not authorized, what the auth
callout's refusal becomes, is :data:`NOT_AUTHORIZED`) and
the topics whose QoS 1 publishes were acknowledged. NATS acknowledges a publish that its
permissions drop as well, and its log says ``Publish Violation - Subject "<subject>"``:
tests/cluster/test_helm_nats.py reads both.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Mapping
from pathlib import Path

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion

from edge_agent.wire import status_topic, telemetry_topic
from tools.netns import in_netns

NOT_AUTHORIZED = 135


def _await_connack(c: mqtt.Client, state: Mapping[str, object], deadline: float, where: str,
                   timeout_s: float) -> None:
    """Run the client's loop until its on_connect put "connack" in ``state`` (bounded)."""
    while "connack" not in state:
        if time.monotonic() > deadline:
            raise ConnectionError(f"no CONNACK from {where} within {timeout_s}s")
        c.loop(0.1)


def publish_as(host: str, port: int, *, ca_file: Path, certfile: Path, keyfile: Path,
               topics: list[str], payload: bytes = b"{}", check_hostname: bool = True,
               netns: str | None = None, timeout_s: float = 10.0) -> dict[str, int]:
    """``{topic: PUBACK reason code}`` for one QoS 1 publish to each topic, in order, on one
    connection made with this client certificate. Raises ``ConnectionError`` when the
    broker refuses the connection itself."""
    return in_netns(netns, _publish, host, port, ca_file, certfile, keyfile, topics, payload,
                    check_hostname, timeout_s)


def _publish(host: str, port: int, ca_file: Path, certfile: Path, keyfile: Path,
             topics: list[str], payload: bytes, check_hostname: bool,
             timeout_s: float) -> dict[str, int]:
    ctx = ssl.create_default_context(cafile=str(ca_file))
    ctx.check_hostname = check_hostname
    ctx.load_cert_chain(str(certfile), str(keyfile))
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="cfnet-identity-probe",
                    protocol=mqtt.MQTTv5)
    c.tls_set_context(ctx)
    state: dict[str, object] = {}
    acks: dict[int, int] = {}
    c.on_connect = lambda _c, _u, _f, rc, _p: state.__setitem__("connack", rc.value)
    c.on_publish = lambda _c, _u, mid, rc, _p: acks.__setitem__(mid, rc.value)
    deadline = time.monotonic() + timeout_s
    c.connect(host, port, keepalive=10)
    try:
        _await_connack(c, state, deadline, f"{host}:{port}", timeout_s)
        if state["connack"] != 0:
            raise ConnectionError(f"{host}:{port} refused the connection: {state['connack']}")
        mids = {c.publish(t, payload, qos=1).mid: t for t in topics}
        while len(acks) < len(mids):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no PUBACK for {sorted(set(mids.values()))} within "
                                   f"{timeout_s}s")
            c.loop(0.1)
        return {t: acks[m] for m, t in mids.items()}
    finally:
        c.disconnect()


def cannot_publish_as(host: str, port: int, *, ca_file: Path, certfile: Path, keyfile: Path,
                      node: str, other: str, check_hostname: bool = True,
                      netns: str | None = None) -> dict[str, int]:
    """Node ``node``'s certificate publishes its own telemetry (accepted) and ``other``'s
    telemetry and status (each must be refused, 135). Returns the reason codes."""
    own, forged = telemetry_topic(node), [telemetry_topic(other), status_topic(other)]
    codes = publish_as(host, port, ca_file=ca_file, certfile=certfile, keyfile=keyfile,
                       topics=[*forged, own], check_hostname=check_hostname, netns=netns)
    # Below 0x80 is success: 0, or 16 "no matching subscribers" (accepted, nobody listening).
    assert codes[own] < 0x80, f"{node}'s own telemetry was refused ({codes[own]}): {codes}"
    for t in forged:
        assert codes[t] == NOT_AUTHORIZED, \
            f"{node}'s certificate published {t}: PUBACK {codes[t]}, not 135 (not authorized)"
    return codes


def connect_311(host: str, port: int, *, ca_file: Path, certfile: Path, keyfile: Path,
                client_id: str, topics: tuple[str, ...] = (), payload: bytes = b"{}",
                check_hostname: bool = True, netns: str | None = None,
                timeout_s: float = 10.0) -> tuple[int, list[str]]:
    """MQTT 3.1.1 with this client certificate and ``client_id``, clean session: the
    CONNACK's code (0, or :data:`NOT_AUTHORIZED`) and, when 0, the ``topics`` whose QoS 1
    publish (one each, in order) was acknowledged."""
    return in_netns(netns, _connect_311, host, port, ca_file, certfile, keyfile, client_id,
                    topics, payload, check_hostname, timeout_s)


def _connect_311(host: str, port: int, ca_file: Path, certfile: Path, keyfile: Path,
                 client_id: str, topics: tuple[str, ...], payload: bytes,
                 check_hostname: bool, timeout_s: float) -> tuple[int, list[str]]:
    ctx = ssl.create_default_context(cafile=str(ca_file))
    ctx.check_hostname = check_hostname
    ctx.load_cert_chain(str(certfile), str(keyfile))
    c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id,
                    protocol=mqtt.MQTTv311, clean_session=True)
    c.tls_set_context(ctx)
    state: dict[str, int] = {}
    acked: set[int] = set()
    c.on_connect = lambda _c, _u, _f, rc, _p: state.__setitem__("connack", rc.value)
    c.on_publish = lambda _c, _u, mid, _rc, _p: acked.add(mid)
    deadline = time.monotonic() + timeout_s
    c.connect(host, port, keepalive=10)
    try:
        _await_connack(c, state, deadline, f"{host}:{port}", timeout_s)
        if state["connack"] != 0:
            return state["connack"], []
        mids = {c.publish(t, payload, qos=1).mid: t for t in topics}
        while not set(mids) <= acked and time.monotonic() < deadline:
            c.loop(0.1)
        return 0, [t for m, t in mids.items() if m in acked]
    finally:
        c.disconnect()
