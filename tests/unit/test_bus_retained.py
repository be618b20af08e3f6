"""The console's retained-request check on NATS (cloud_core/bus_retained.py): reading the
bus's answers, telling the very request from another, and refusing when the store does
not answer. The real store is exercised in tests/integration/test_bus.py."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from cloud_core.bus_retained import (
    JS_NO_MESSAGE_FOUND,
    NatsLogin,
    RetainedCheckError,
    RetainedStore,
    Verdict,
    same_request,
    stored_payload,
    topic_subject,
)
from cloud_core.console.protocol import parse_response
from cloud_core.registry import parse_registry
from cloud_core.service import CoreConfig, CoreService
from edge_agent.wire import request_topic
from edge_agent.wire.mqtt import Message, MqttSettings, wrap


def _answer(seq: int, data: bytes) -> dict[str, object]:
    return {"message": {"subject": "$MQTT.rmsgs.x", "seq": seq,
                        "data": base64.b64encode(data).decode()}}


def test_answers_are_read_bounded_and_checked() -> None:
    assert stored_payload({"error": {"code": 404, "err_code": JS_NO_MESSAGE_FOUND}}) is None
    assert stored_payload(_answer(7, b"abc")) == (7, b"abc")
    for bad in ({"error": {"code": 503, "err_code": 10008}}, {"message": {"seq": "7"}},
                {"message": {"seq": 1, "data": "!!not base64"}},
                {"message": {"seq": 1, "data": "A" * (500 * 1024)}}):
        with pytest.raises(RetainedCheckError):
            stored_payload(bad)


def test_the_very_request_is_told_from_another() -> None:
    body = b'{"cmd":"drain","args":{"node":"a"}}'
    stored = wrap(body, b"\x01\x02", 1.7e9)
    assert same_request(stored, body, b"\x01\x02")
    assert not same_request(stored, body, b"\x01\x03")  # another request, same command
    assert not same_request(stored, b'{"cmd":"nodes"}', b"\x01\x02")
    assert not same_request(b"", b"", None)  # an empty (cleared) retained message
    assert same_request(body, body, None)  # a raw request without the envelope


def test_topics_map_as_the_mqtt_listener_maps_them() -> None:
    assert topic_subject(request_topic("alice")) == "cfnet.v1.console.alice.request"
    assert topic_subject("cfnet/v1/console/a.b/request") == "cfnet.v1.console.a//b.request"


class _Store(RetainedStore):
    """The check's I/O edge replaced: a verdict or a failure, recorded."""

    def __init__(self, outcome: Verdict | RetainedCheckError) -> None:
        super().__init__(NatsLogin(urls=("nats://127.0.0.1:1",), username="core-0",
                                   password="p"))
        self.outcome = outcome
        self.asked: list[tuple[str, bytes]] = []

    def check(self, topic: str, payload: bytes, correlation_data: bytes | None) -> Verdict:
        self.asked.append((topic, payload))
        if isinstance(self.outcome, RetainedCheckError):
            raise self.outcome
        return self.outcome


@pytest.mark.parametrize(("outcome", "result"), [
    (Verdict.RETAINED, "refused: retained"),
    (RetainedCheckError("the bus's retained store did not answer: timeout"),
     "refused: unavailable: cannot tell"),
    (Verdict.LIVE, "ok"),
])
def test_the_core_refuses_what_the_store_holds_or_cannot_tell(
        tmp_path: Path, outcome: Verdict | RetainedCheckError, result: str) -> None:
    cfg = CoreConfig(mqtt=MqttSettings(protocol="mqtt311", client_id="core-0"), db_path=tmp_path / "c.db",
                     registry=parse_registry("nodes: [{name: edge-a}]\n"),
                     roles={"alice": "operator"}, mqtt_process=False, place=False)
    core = CoreService(cfg)
    core.retained = _Store(outcome)
    m = Message(request_topic("alice"), json.dumps({"cmd": "cordon",
                                                    "args": {"node": "edge-a"}}).encode(),
                qos=1, correlation_data=b"\x09")
    try:
        resp = core.handle_request("alice", m)
        (entry,) = core.store.audit_log()
        assert entry["result"].startswith(result), entry
        assert resp.ok is (result == "ok")
        assert ("edge-a" in core.store.cordoned()) is (result == "ok")
        assert parse_response(json.dumps({"ok": resp.ok, "error": resp.error}).encode())
    finally:
        core.store.close()


def test_cfnet_core_on_nats_asks_the_retained_store_as_itself() -> None:
    from cloud_core.errors import CoreError
    from cloud_core.main import build_config, parse_args
    from tools.nats.cluster import nats_permissions

    base = ["--password", "p", "--db", "/nonexistent/core.db", "--username", "core-1"]
    cfg = build_config(parse_args([*base, "--bus", "nats", "--nats-url", "tls://h:4222"]))
    assert cfg.nats_console == NatsLogin(urls=("tls://h:4222",), username="core-1",
                                         password="p", ca_file=None)
    with pytest.raises(CoreError, match="--bus nats needs --nats-url"):
        build_config(parse_args([*base, "--bus", "nats"]))
    # A follower (no console) and Mosquitto (retain-as-published) need no such check.
    assert build_config(parse_args([*base, "--bus", "nats", "--no-place"])).nats_console is None
    assert build_config(parse_args(base)).nats_console is None
    allow = nats_permissions("core-1", "core")["publish"]["allow"]  # type: ignore[index]
    assert [s for s in allow if "$MQTT_rmsgs" in s] == [
        "$JS.API.STREAM.MSG.GET.$MQTT_rmsgs", "$JS.API.STREAM.MSG.DELETE.$MQTT_rmsgs"]
    for role in ("agent", "operator", "sim"):
        assert not [s for s in nats_permissions("x", role)["publish"]["allow"]  # type: ignore[index]
                    if "$JS" in s]
