"""The core's compiled report decoder answers exactly as the reference validator.

``cloud_core.decode.ReportDecoder`` takes a fast path through msgspec and
hands anything it does not accept to ``edge_agent.wire.parse_report``. These
tests hold it to the reference: same report, or the same rejection reason,
for well-formed, malformed and mutated payloads alike.
"""

from __future__ import annotations

import copy
import json
import random
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cloud_core.decode import ReportDecoder
from edge_agent import wire
from tests.unit.reports import report_dict
from tools.simulate import SimConfig, World


def _full_report() -> dict[str, Any]:
    """A report with every optional field present: GPUs, disk, connect time, conns."""
    d = report_dict()
    d["resources"].update(
        gpus=[{"index": 0, "name": "NVIDIA L4", "util": 0.5, "mem_total_bytes": 24 << 30,
               "mem_used_bytes": 8 << 30, "power_w": 40.0, "temp_c": 55.0}],
        disk_total_bytes=256 << 30, disk_used_bytes=64 << 30, power_w=30.0, load1=1.5)
    d["links"].append({"peer": "fd00::2", "rtt_us": None, "retrans": 0, "segs_out": 0,
                       "loss": 0, "tx_bps": 0, "rx_bps": 0, "samples": 0,
                       "connect_us": 350.0, "conns": 3, "active": True})
    d["dropped"] = 2
    return d


def outcome(fn: Any, payload: bytes, topic_node: str | None) -> tuple[str, Any]:
    try:
        return "ok", fn(payload, topic_node)
    except wire.WireError as exc:
        return "rejected", exc.reason


def assert_same(payload: bytes, topic_node: str | None = "edge-a") -> ReportDecoder:
    dec = ReportDecoder()
    assert outcome(dec.decode, payload, topic_node) == outcome(
        wire.parse_report, payload, topic_node)
    return dec


def test_well_formed_reports_take_the_fast_path_with_the_same_result() -> None:
    for d in (report_dict(), _full_report()):
        dec = assert_same(json.dumps(d).encode())
        assert (dec.fast, dec.slow) == (1, 0)


def test_simulated_and_agent_encoded_reports_take_the_fast_path() -> None:
    world = World(SimConfig(nodes=50))
    rnd = random.Random(7)
    dec = ReportDecoder()
    for nd in world.nodes:
        payload = world.report_bytes(nd, 3, "b1", time.time(), 0.0, rnd)
        assert dec.decode(payload, nd.name) == wire.parse_report(payload, nd.name)
        again = wire.encode_report(wire.parse_report(payload))
        assert dec.decode(again, nd.name) == wire.parse_report(again, nd.name)
    assert (dec.fast, dec.slow) == (100, 0)


@pytest.mark.parametrize(("name", "payload"), [
    ("not json", b"{nope"),
    ("binary", b"\xff\xfe\x00"),
    ("byte order mark", b"\xef\xbb\xbf" + json.dumps(report_dict()).encode()),
    ("trailing data", json.dumps(report_dict()).encode() + b" x"),
    ("array", b"[1,2]"),
    ("NaN literal", json.dumps(report_dict()).replace('"loss": 0.05', '"loss": NaN').encode()),
    ("huge exponent", json.dumps(report_dict()).replace('"loss": 0.05', '"loss": 1e400').encode()),
    ("oversized", json.dumps(report_dict(pad="x" * wire.MAX_PAYLOAD_BYTES)).encode()),
    ("other node", json.dumps(report_dict(node="edge-b")).encode()),
    ("bad node id", json.dumps(report_dict(node="Edge A")).encode()),
    ("version 2", json.dumps(report_dict(v=2)).encode()),
    ("missing v", json.dumps({k: v for k, v in report_dict().items() if k != "v"}).encode()),
    ("missing buffered", json.dumps(
        {k: v for k, v in report_dict().items() if k != "buffered"}).encode()),
    ("probe", json.dumps(report_dict(probe="kprobe")).encode()),
    ("lone surrogate", json.dumps(report_dict(boot="\ud800")).encode()),
    ("duplicate key, last wins", json.dumps(report_dict())[:-1].encode() + b', "seq": 9}'),
    ("integer as float", json.dumps(report_dict()).replace('"seq": 1', '"seq": 4.0').encode()),
    ("integer as exponent", json.dumps(report_dict()).replace('"seq": 1', '"seq": 1e2').encode()),
    ("seq past int64", json.dumps(report_dict(seq=2**63)).encode()),
])
def test_edge_cases_answer_as_the_reference(name: str, payload: bytes) -> None:
    assert_same(payload)


def _resources(**over: Any) -> bytes:
    d = report_dict()
    d["resources"].update(over)
    return json.dumps(d).encode()


@pytest.mark.parametrize("payload", [
    _resources(disk_total_bytes=0, disk_used_bytes=5),  # zero total: not reported
    _resources(disk_total_bytes=10),  # a total alone: used is 0
    _resources(disk_used_bytes=5),  # used alone: ignored
    _resources(disk_used_bytes="x"),  # ... even when it is not a number
    _resources(mem_used_bytes=(8 << 30) + 1),  # more used than there is
])
def test_disk_and_memory_rules_match(payload: bytes) -> None:
    assert_same(payload)


# Values that stress every type rule: nulls, booleans, integers past int64,
# integral and fractional floats, non-finite floats, long strings.
_vals = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 2**64), st.floats(allow_nan=True),
    st.sampled_from([0, 1, 3.0, 1e8, 1e8 + 1, 1e13, 1.5e13, 2**63 - 1, 2**63, -0.0]),
    st.text(max_size=70), st.builds(list), st.builds(dict),
)


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _paths(v, (*prefix, i))
    return out


_BASE = _full_report()
_PATHS = _paths(_BASE)


@settings(max_examples=1500, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(_PATHS), st.one_of(st.just("<delete>"), _vals)),
                min_size=1, max_size=3))
def test_mutated_reports_answer_as_the_reference(edits: list[tuple[tuple[Any, ...], Any]]) -> None:
    d = copy.deepcopy(_BASE)
    for path, value in edits:
        target: Any = d
        try:
            for p in path[:-1]:
                target = target[p]
            if value == "<delete>" and not isinstance(value, bool):
                del target[path[-1]]
            else:
                target[path[-1]] = copy.deepcopy(value)
        except (KeyError, IndexError, TypeError):
            continue  # an earlier edit removed or replaced the parent
    assert_same(json.dumps(d).encode())
