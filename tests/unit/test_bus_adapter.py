"""The bus adapter's pure parts: the 3.1.1 envelope that replaces MQTT 5 properties, the
client id NATS accepts, topic <-> subject mapping and the NATS permissions rendered from
the cfnet ACL (the same paths run against a real NATS cluster in
tests/integration/test_bus.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edge_agent import wire
from edge_agent.mqtt import MqttError, protocol_for_bus, unwrap, wire_client_id, wrap
from tools.nats.cluster import mqtt_to_subject, nats_permissions, subject_to_topic

NODE = st.from_regex(r"\A[a-z0-9]([a-z0-9._-]{0,20}[a-z0-9])?\Z")


@given(st.binary(max_size=300), st.one_of(st.none(), st.binary(min_size=1, max_size=32)),
       st.one_of(st.none(), st.floats(1.0, 4e9)))
def test_envelope_round_trip(payload: bytes, corr: bytes | None, exp: float | None) -> None:
    body, c, x = unwrap(wrap(payload, corr, exp))
    assert body == payload and c == corr
    assert (x is None) == (exp is None) and (exp is None or abs(x - exp) < 0.01)  # type: ignore


@given(st.binary(max_size=200))
def test_anything_without_a_valid_envelope_passes_unchanged(payload: bytes) -> None:
    body, c, _x = unwrap(payload)
    if c is None:
        assert body == payload or payload.startswith(b"\x1ecf1")


def test_malformed_envelopes_pass_unchanged() -> None:
    for bad in (b"\x1ecf1", b"\x1ecf1\xff\xff{}", b"\x1ecf1\x00\x05{nope", b'\x1ecf1\x00\x02[]x'):
        assert unwrap(bad) == (bad, None, None)
    assert unwrap(b'{"cmd":"nodes"}') == (b'{"cmd":"nodes"}', None, None)


def test_json_payload_never_mistaken_for_an_envelope() -> None:
    assert wrap(b'{"a":1}', None, None) == b'{"a":1}'


@given(NODE)
def test_client_id_has_no_dot_on_nats_and_stays_distinct(node: str) -> None:
    cid = wire_client_id(f"agent-{node}", "mqtt311")
    assert "." not in cid and cid.replace("~", ".") == f"agent-{node}"
    assert wire_client_id(node, "mqtt5") == node


def test_bus_names() -> None:
    assert protocol_for_bus("mosquitto") == "mqtt5"
    assert protocol_for_bus("nats") == "mqtt311"
    with pytest.raises(MqttError):
        protocol_for_bus("emqx")


@given(NODE)
def test_topic_subject_round_trip(node: str) -> None:
    for topic in (wire.telemetry_topic(node), wire.status_topic(node), wire.ack_topic(node)):
        subj = mqtt_to_subject(topic)
        assert subject_to_topic(subj) == topic
        assert subj.replace("//", "").count(".") == topic.count("/")


def test_wildcards_map_to_nats_wildcards() -> None:
    assert mqtt_to_subject("cfnet/v1/nodes/+/telemetry") == "cfnet.v1.nodes.*.telemetry"
    assert mqtt_to_subject("cfnet/v1/#") == "cfnet.v1.>"
    assert mqtt_to_subject("cfnet/v1/nodes/a.b/ack") == "cfnet.v1.nodes.a//b.ack"


def test_agent_permissions_name_only_its_own_subjects() -> None:
    p = nats_permissions("edge.a", "agent")
    pub = p["publish"]["allow"]  # type: ignore[index]
    sub = p["subscribe"]["allow"]  # type: ignore[index]
    assert sorted(pub) == ["cfnet.v1.nodes.edge//a.status", "cfnet.v1.nodes.edge//a.telemetry"]
    assert sorted(sub) == ["$MQTT.sub.>", "cfnet.v1.nodes.edge//a.ack",
                           "cfnet.v1.nodes.edge//a.placements"]
    assert not any("*" in s or ">" in s for s in pub)


def test_core_permissions_have_no_share_prefix() -> None:
    p = nats_permissions("core-0", "core")
    every = p["publish"]["allow"] + p["subscribe"]["allow"]  # type: ignore[index,operator]
    assert not any("$share" in s for s in every)
    assert "cfnet.v1.nodes.*.telemetry" in p["subscribe"]["allow"]  # type: ignore[index]


def test_failover_flag_parsed_and_bounded() -> None:
    from cloud_core.broker_args import parse_failover
    from cloud_core.errors import CoreError

    assert parse_failover("") == ()
    assert parse_failover("a:1, [::1]:8883") == (("a", 1), ("::1", 8883))
    for bad in ("a", "a:", ":1", "a:0", "a:70000", "a:x"):
        with pytest.raises(CoreError):
            parse_failover(bad)
    with pytest.raises(CoreError):
        parse_failover(",".join(f"h{i}:1" for i in range(17)))


def test_agent_config_bus_checked() -> None:
    from edge_agent.config import AgentConfig, validate
    from edge_agent.errors import ConfigError

    ok = validate(AgentConfig(node="n1", bus="nats", broker_failover=("h:8883",)))
    assert ok.bus == "nats"
    for cfg in (AgentConfig(node="n1", bus="emqx"),
                AgentConfig(node="n1", broker_failover=("h",))):
        with pytest.raises(ConfigError):
            validate(cfg)


def test_shared_filters_are_refused_on_mqtt311() -> None:
    from edge_agent.mqtt import MqttClient, MqttSettings

    c = MqttClient(MqttSettings(protocol="mqtt311", tls=False, client_id="x"))
    with pytest.raises(MqttError):
        c.subscribe("$share/g/cfnet/v1/nodes/+/telemetry")
    c.subscribe("cfnet/v1/nodes/+/telemetry")  # an ordinary filter is fine
