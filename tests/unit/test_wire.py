"""The wire contract: valid reports round-trip; every kind of bad input is rejected by reason."""

from __future__ import annotations

import copy
import json
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edge_agent import wire
from edge_agent.wire import decode as wire_decode
from tests.unit.reports import report_bytes, report_dict


def test_valid_report_parses_into_frozen_dataclasses() -> None:
    r = wire.parse_report(report_bytes(), topic_node="edge-a")
    assert r.node == "edge-a" and r.seq == 1 and r.probe == "ebpf"
    assert r.links[0].rtt_us == wire.RttStats(p50=1200.0, p95=1500.0, min=900.0)
    assert r.resources.cpu_cores == 4
    with pytest.raises(AttributeError):
        r.seq = 2  # type: ignore[misc]


def test_encode_then_parse_round_trips() -> None:
    r = wire.parse_report(report_bytes())
    again = wire.parse_report(wire.encode_report(r))
    assert again == r


def test_unknown_fields_are_ignored() -> None:
    r = wire.parse_report(report_bytes(future_field={"x": 1}))
    assert r.seq == 1


def _mut(path: list[Any], value: Any) -> bytes:
    d = report_dict()
    target = d
    for p in path[:-1]:
        target = target[p]
    if value is _DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return json.dumps(d).encode()


_DELETE = object()

BAD: list[tuple[str, bytes, str]] = [
    ("not json", b"{nope", "malformed"),
    ("binary", b"\xff\xfe\x00", "malformed"),
    ("json array", b"[1,2]", "schema"),
    ("empty", b"", "malformed"),
    ("missing seq", _mut(["seq"], _DELETE), "missing"),
    ("missing resources", _mut(["resources"], _DELETE), "missing"),
    ("missing links", _mut(["links"], _DELETE), "missing"),
    ("missing cpu_util", _mut(["resources", "cpu_util"], _DELETE), "missing"),
    ("NaN literal", report_bytes().replace(b'"cpu_util": 0.25', b'"cpu_util": NaN'), "nan"),
    ("Infinity literal", report_bytes().replace(b'"tx_bps": 20000000.0', b'"tx_bps": Infinity'), "nan"),
    ("negative rtt", _mut(["links", 0, "rtt_us", "p50"], -1.0), "range"),
    ("p95 below p50", _mut(["links", 0, "rtt_us", "p95"], 10.0), "range"),
    ("loss above 1", _mut(["links", 0, "loss"], 1.5), "range"),
    ("negative loss", _mut(["links", 0, "loss"], -0.1), "range"),
    ("cpu_util above 1", _mut(["resources", "cpu_util"], 3.0), "range"),
    ("mem used > total", _mut(["resources", "mem_used_bytes"], 9 << 30), "range"),
    ("zero cores", _mut(["resources", "cpu_cores"], 0), "range"),
    ("string seq", _mut(["seq"], "7"), "schema"),
    ("bool seq", _mut(["seq"], True), "schema"),
    ("negative seq", _mut(["seq"], -1), "range"),
    ("version 2", _mut(["v"], 2), "version"),
    ("bad probe", _mut(["probe"], "magic"), "schema"),
    ("bad node id", _mut(["node"], "Edge/A#"), "schema"),
    ("links not list", _mut(["links"], {"a": 1}), "schema"),
    ("too many links", _mut(["links"], [report_dict()["links"][0]] * (wire.MAX_LINKS + 1)), "oversized"),
    ("oversized payload", b"{" + b" " * (wire.MAX_PAYLOAD_BYTES + 1) + b"}", "oversized"),
    ("deep nesting", b"[" * 100000 + b"]" * 100000, "malformed"),
]


@pytest.mark.parametrize(("name", "payload", "reason"), BAD, ids=[b[0] for b in BAD])
def test_bad_reports_are_rejected_with_reason(name: str, payload: bytes, reason: str) -> None:
    with pytest.raises(wire.WireError) as ei:
        wire.parse_report(payload, topic_node="edge-a")
    assert ei.value.reason == reason, str(ei.value)


def test_node_id_that_is_not_the_topics_is_rejected() -> None:
    with pytest.raises(wire.WireError) as ei:
        wire.parse_report(report_bytes(node="edge-b"), topic_node="edge-a")
    assert ei.value.reason == "node_mismatch"


@pytest.mark.parametrize(
    ("topic", "ok"),
    [
        ("cfnet/v1/nodes/edge-a/telemetry", True),
        ("cfnet/v1/nodes/edge-a", False),
        ("cfnet/v2/nodes/edge-a/telemetry", False),
        ("cfnet/v1/nodes/EDGE/telemetry", False),
        ("cfnet/v1/nodes/a b/telemetry", False),
    ],
)
def test_split_topic(topic: str, ok: bool) -> None:
    if ok:
        assert wire.split_topic(topic) == ("nodes", "edge-a", "telemetry")
    else:
        with pytest.raises(wire.WireError):
            wire.split_topic(topic)


def test_status_round_trip_and_mismatch() -> None:
    s = wire.NodeStatus(node="edge-a", state="online", ts=1.0, addresses=("10.0.0.1",),
                        labels=(("site", "x"),))
    assert wire.parse_status(wire.encode_status(s), "edge-a") == s
    with pytest.raises(wire.WireError):
        wire.parse_status(wire.encode_status(s), "edge-b")


def test_gpu_fields_validated() -> None:
    d = report_dict()
    d["resources"]["gpus"] = [{"index": 0, "name": "T4", "util": 0.5, "mem_total_bytes": 16,
                               "mem_used_bytes": 8, "power_w": 70.0, "temp_c": 60.0}]
    r = wire.parse_report(json.dumps(d).encode())
    assert r.resources.gpus[0].power_w == 70.0
    bad = copy.deepcopy(d)
    bad["resources"]["gpus"][0]["util"] = math.inf
    with pytest.raises(wire.WireError):
        wire.parse_report(json.dumps(bad).encode())


_vals = st.one_of(st.none(), st.booleans(), st.integers(-5, 2**64), st.floats(allow_nan=True),
                  st.text(max_size=70), st.just(1.5e13))


@settings(max_examples=500, deadline=None)
@given(st.fixed_dictionaries(
    {"peer": st.one_of(st.just("10.0.0.1"), _vals), "retrans": _vals, "segs_out": _vals,
     "loss": _vals, "tx_bps": _vals, "rx_bps": _vals, "samples": _vals},
    optional={"rtt_us": st.one_of(_vals, st.fixed_dictionaries(
        {"p50": _vals, "p95": _vals, "min": _vals})), "connect_us": _vals, "conns": _vals,
        "active": _vals}))
def test_link_fast_path_agrees_with_full_validator(d: dict[str, Any]) -> None:
    fast = wire_decode._link_fast(d)
    try:
        slow: wire.LinkSample | None = wire_decode._parse_link(wire_decode._Obj(d, "links[0]"))
    except wire.WireError:
        slow = None
    if fast is not None:
        assert fast == slow  # the fast path never accepts what the validator refuses


def test_link_fast_path_takes_the_common_case() -> None:
    link = report_dict()["links"][0]
    fast = wire_decode._link_fast(link)
    assert fast is not None and fast == wire_decode._parse_link(wire_decode._Obj(link, "links[0]"))
    assert wire_decode._link_fast({**link, "loss": float("nan")}) is None  # left to the validator


def test_encode_report_is_drop_none_of_asdict() -> None:
    """encode_report skips asdict's deep copy (a fifth of the agent's sampler
    time); its bytes are still those of ``_drop_none(asdict(report))``."""
    from dataclasses import asdict, replace

    r = wire.parse_report(report_bytes())
    gpu = wire.Gpu(index=0, name="g", util=0.5, mem_total_bytes=2, mem_used_bytes=1,
                   power_w=None, temp_c=40.0)
    richer = replace(r, resources=replace(r.resources, gpus=(gpu,), power_w=None),
                     interfaces=({"name": "eth0", "rx_bytes": 1, "speed_mbps": None,
                                  "up": True},))
    for rep in (r, richer):
        want = json.dumps(_drop_none(asdict(rep)), separators=(",", ":"),
                          allow_nan=False).encode()
        assert wire.encode_report(rep) == want


def _drop_none(obj: object) -> object:
    """The reference encoding ``encode_report`` replaced (``asdict``, then no ``None``)."""
    if isinstance(obj, dict):
        return {k: _drop_none(v) for k, v in obj.items() if v is not None}
    if isinstance(obj, list | tuple):
        return [_drop_none(v) for v in obj]
    return obj
