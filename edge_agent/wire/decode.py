"""Decoding and validating wire messages: the core's and the agent's one parser.

A message that breaks the contract raises :class:`~edge_agent.wire.errors.WireError`
whose ``reason`` is a short, stable code the core counts drops by. Hostile input is
bounded before it is expanded: the payload's size, integer literals' digits, nesting
depth and list lengths are checked before anything is built from them.
"""

from __future__ import annotations

import json
import math
from typing import Any

from edge_agent.wire.errors import WireError
from edge_agent.wire.names import label_key_problem, label_value_problem
from edge_agent.wire.schema import (
    MAX_ACK_BOOTS,
    MAX_ACK_RANGES,
    MAX_GPUS,
    MAX_LINKS,
    MAX_PAYLOAD_BYTES,
    PROBES,
    SCHEMA_VERSION,
    AckBatch,
    Gpu,
    LinkSample,
    NodeStatus,
    Resources,
    RttStats,
    TelemetryReport,
)
from edge_agent.wire.topics import ADDRESS_RE, valid_address, valid_id


def _reject_constant(name: str) -> float:
    raise WireError("nan", f"non-finite number {name} in JSON")


MAX_INT_DIGITS = 40  # no field needs more; 2**63 has 19 digits
MAX_DEPTH = 32  # nesting of arrays and objects


def _parse_int(text: str) -> int:
    # json hands the literal over before converting: a 100,000-digit integer is refused
    # here, not converted (quadratic) or left to Python's 4,300-digit ValueError
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise WireError("range", f"integer of {len(text)} digits (at most {MAX_INT_DIGITS})")
    return int(text)


def _parse_float(text: str) -> float:
    f = float(text)
    if not math.isfinite(f):  # 1e400 overflows to inf without a literal "Infinity"
        raise WireError("nan", f"number {text[:40]} is out of range (not a finite float)")
    return f


def _depth_ok(obj: Any) -> bool:
    stack = [(obj, 1)]
    while stack:
        o, d = stack.pop()
        if isinstance(o, dict | list):
            if d > MAX_DEPTH:
                return False
            stack.extend((v, d + 1) for v in (o.values() if isinstance(o, dict) else o))
    return True


def load_json(payload: bytes) -> Any:
    """Size-checked JSON decode: refuses NaN/Infinity literals, numbers that overflow a
    float, integers of more than ``MAX_INT_DIGITS`` digits and nesting deeper than
    ``MAX_DEPTH``, each as a ``WireError`` with its reason (never another exception)."""
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise WireError("oversized", f"{len(payload)} bytes > {MAX_PAYLOAD_BYTES}")
    try:
        text = payload.decode("utf-8")
        obj = json.loads(text, parse_constant=_reject_constant, parse_int=_parse_int,
                         parse_float=_parse_float)
    except WireError:
        raise
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        # JSONDecodeError is a ValueError
        raise WireError("malformed", f"not JSON: {str(exc)[:200]}") from exc
    if not _depth_ok(obj):
        raise WireError("schema", f"nested deeper than {MAX_DEPTH} levels")
    return obj


class _Obj:
    """Typed field access over one decoded JSON object, with paths in errors."""

    def __init__(self, raw: Any, path: str) -> None:
        if not isinstance(raw, dict):
            raise WireError("schema", f"{path or 'message'} must be an object")
        self.raw = raw
        self.path = path

    def _name(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def _get(self, key: str, required: bool) -> Any:
        if key not in self.raw or self.raw[key] is None:
            if required:
                raise WireError("missing", f"required field {self._name(key)} is missing")
            return None
        return self.raw[key]

    def num(
        self,
        key: str,
        *,
        lo: float | None = 0.0,
        hi: float | None = None,
        required: bool = True,
    ) -> float | None:
        v = self._get(key, required)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise WireError("schema", f"{self._name(key)} must be a number")
        if isinstance(v, int) and not -(2**63) <= v < 2**63:
            raise WireError("range", f"{self._name(key)} is out of range")
        f = float(v)
        if not math.isfinite(f):
            raise WireError("nan", f"{self._name(key)} is not finite")
        if lo is not None and f < lo:
            raise WireError("range", f"{self._name(key)}={f} below {lo}")
        if hi is not None and f > hi:
            raise WireError("range", f"{self._name(key)}={f} above {hi}")
        return f

    def req_num(self, key: str, *, lo: float | None = 0.0, hi: float | None = None) -> float:
        v = self.num(key, lo=lo, hi=hi, required=True)
        assert v is not None
        return v

    def int_(self, key: str, *, lo: int = 0, hi: int = 2**63 - 1, required: bool = True) -> int:
        v = self._get(key, required)
        if v is None:
            return 0
        if isinstance(v, bool) or not isinstance(v, int):
            if isinstance(v, float) and v.is_integer() and math.isfinite(v):
                v = int(v)
            else:
                raise WireError("schema", f"{self._name(key)} must be an integer")
        if not lo <= v <= hi:
            shown = v if abs(v) < 10**30 else "(a huge integer)"
            raise WireError("range", f"{self._name(key)}={shown} outside [{lo}, {hi}]")
        return int(v)

    def str_(self, key: str, *, max_len: int = 256, required: bool = True) -> str:
        v = self._get(key, required)
        if v is None:
            return ""
        if not isinstance(v, str):
            raise WireError("schema", f"{self._name(key)} must be a string")
        if len(v) > max_len:
            raise WireError("range", f"{self._name(key)} longer than {max_len}")
        return v

    def list_(self, key: str, *, max_len: int, required: bool = True) -> list[Any]:
        v = self._get(key, required)
        if v is None:
            return []
        if not isinstance(v, list):
            raise WireError("schema", f"{self._name(key)} must be a list")
        if len(v) > max_len:
            raise WireError("oversized", f"{self._name(key)} has {len(v)} > {max_len} items")
        return v

    def obj(self, key: str, *, required: bool = True) -> _Obj | None:
        v = self._get(key, required)
        return None if v is None else _Obj(v, self._name(key))


_NUM = (int, float)
_MAX_INT = 2**63 - 1


def _link_fast(raw: Any) -> LinkSample | None:
    """The common case in a few comparisons; None sends the link down the slow path.

    Ingest cost is dominated by links, and almost every link is well formed.
    This accepts only what :func:`_parse_link` accepts with the same values
    (NaN and infinities fail the range comparisons); anything unusual or wrong
    returns None, so the slow path produces the exact error and reason.
    """
    if type(raw) is not dict:
        return None
    d: Any = raw  # values are checked one by one below
    peer, retrans, segs = d.get("peer"), d.get("retrans"), d.get("segs_out")
    loss, tx, rx, samples = d.get("loss"), d.get("tx_bps"), d.get("rx_bps"), d.get("samples")
    if not (
        type(peer) is str and 0 < len(peer) <= 64 and ADDRESS_RE.fullmatch(peer)
        and type(retrans) is int and 0 <= retrans <= _MAX_INT
        and type(segs) is int and 0 <= segs <= _MAX_INT
        and type(samples) is int and 0 <= samples <= _MAX_INT
        and type(loss) in _NUM and 0.0 <= loss <= 1.0
        and type(tx) in _NUM and 0.0 <= tx <= 1e13
        and type(rx) in _NUM and 0.0 <= rx <= 1e13
    ):
        return None
    rtt: Any = d.get("rtt_us")
    rs = None
    if rtt is not None:
        if type(rtt) is not dict:
            return None
        r: Any = rtt
        p50, p95, mn = r.get("p50"), r.get("p95"), r.get("min")
        if not (type(p50) in _NUM and type(p95) in _NUM and type(mn) in _NUM
                and 0.0 <= mn <= p50 <= p95 <= 1e8):
            return None
        rs = RttStats(p50=float(p50), p95=float(p95), min=float(mn))
    conn = d.get("connect_us")
    if conn is not None and not (type(conn) in _NUM and 0.0 <= conn <= 1e8):
        return None
    conns = d.get("conns")
    if conns is not None and not (type(conns) is int and 0 <= conns <= _MAX_INT):
        return None
    active = d.get("active", False)
    return LinkSample(
        peer=peer, rtt_us=rs, retrans=retrans, segs_out=segs, loss=float(loss),
        tx_bps=float(tx), rx_bps=float(rx), samples=samples,
        connect_us=float(conn) if conn is not None else None, conns=conns or 0,
        active=active if type(active) is bool else False,
    )


def _parse_link(o: _Obj) -> LinkSample:
    rtt_o = o.obj("rtt_us", required=False)
    rtt = None
    if rtt_o is not None:
        p50 = rtt_o.req_num("p50", hi=1e8)
        p95 = rtt_o.req_num("p95", hi=1e8)
        mn = rtt_o.req_num("min", hi=1e8)
        if not mn <= p50 <= p95:
            raise WireError("range", f"{o.path}.rtt_us needs min <= p50 <= p95")
        rtt = RttStats(p50=p50, p95=p95, min=mn)
    peer = o.str_("peer", max_len=64)
    if not peer:
        raise WireError("missing", f"{o.path}.peer is empty")
    if not valid_address(peer):
        raise WireError("schema", f"{o.path}.peer is not an address")
    conn = o.num("connect_us", hi=1e8, required=False)
    active = o.raw.get("active", False)
    return LinkSample(
        peer=peer,
        rtt_us=rtt,
        retrans=o.int_("retrans"),
        segs_out=o.int_("segs_out"),
        loss=o.req_num("loss", hi=1.0),
        tx_bps=o.req_num("tx_bps", hi=1e13),
        rx_bps=o.req_num("rx_bps", hi=1e13),
        samples=o.int_("samples"),
        connect_us=conn,
        conns=o.int_("conns", required=False),
        active=bool(active) if isinstance(active, bool) else False,
    )


def _parse_gpu(o: _Obj) -> Gpu:
    return Gpu(
        index=o.int_("index", hi=1024),
        name=o.str_("name", max_len=128, required=False),
        util=o.req_num("util", hi=1.0),
        mem_total_bytes=o.int_("mem_total_bytes"),
        mem_used_bytes=o.int_("mem_used_bytes"),
        power_w=o.num("power_w", hi=1e5, required=False),
        temp_c=o.num("temp_c", lo=-100, hi=300, required=False),
    )


def _parse_resources(o: _Obj) -> Resources:
    gpus = tuple(
        _parse_gpu(_Obj(g, f"{o.path}.gpus[{i}]"))
        for i, g in enumerate(o.list_("gpus", max_len=MAX_GPUS))
    )
    mem_total = o.int_("mem_total_bytes")
    mem_used = o.int_("mem_used_bytes")
    if mem_used > mem_total:
        raise WireError("range", "resources.mem_used_bytes exceeds mem_total_bytes")
    disk_total = o.raw.get("disk_total_bytes")
    return Resources(
        cpu_cores=o.int_("cpu_cores", lo=1, hi=1 << 20),
        cpu_util=o.req_num("cpu_util", hi=1.0),
        mem_total_bytes=mem_total,
        mem_used_bytes=mem_used,
        gpus=gpus,
        disk_total_bytes=o.int_("disk_total_bytes", required=False) if disk_total else None,
        disk_used_bytes=o.int_("disk_used_bytes", required=False) if disk_total else None,
        power_w=o.num("power_w", hi=1e6, required=False),
        load1=o.num("load1", hi=1e6, required=False),
    )


def parse_report(payload: bytes, topic_node: str | None = None) -> TelemetryReport:
    """Decode and validate one telemetry report.

    ``topic_node`` is the node id taken from the topic (the MQTT username under
    the broker's ACL); a report that claims to be another node is rejected.
    """
    o = _Obj(load_json(payload), "")
    v = o.int_("v", lo=0, hi=1 << 16)
    if v != SCHEMA_VERSION:
        raise WireError("version", f"schema v{v} not supported (want {SCHEMA_VERSION})")
    node = o.str_("node", max_len=63)
    if not valid_id(node):
        raise WireError("schema", f"node id {node!r} is not a valid id")
    if topic_node is not None and node != topic_node:
        raise WireError("node_mismatch", f"report says {node!r} but came on {topic_node!r}")
    probe = o.str_("probe", max_len=16)
    if probe not in PROBES:
        raise WireError("schema", f"probe must be one of {PROBES}, not {probe!r}")
    res = o.obj("resources")
    assert res is not None
    links = tuple(
        _link_fast(lk) or _parse_link(_Obj(lk, f"links[{i}]"))
        for i, lk in enumerate(o.list_("links", max_len=MAX_LINKS))
    )
    return TelemetryReport(
        v=v,
        node=node,
        seq=o.int_("seq"),
        boot=o.str_("boot", max_len=64),
        ts=o.req_num("ts", lo=0.0, hi=1e11),
        interval_s=o.req_num("interval_s", lo=0.001, hi=86400.0),
        probe=probe,
        resources=_parse_resources(res),
        links=links,
        buffered=o.int_("buffered"),
        dropped=o.int_("dropped", required=False),
    )


def parse_status(payload: bytes, topic_node: str | None = None) -> NodeStatus:
    o = _Obj(load_json(payload), "")
    node = o.str_("node", max_len=63)
    if not valid_id(node) or (topic_node is not None and node != topic_node):
        raise WireError("node_mismatch", f"status for {node!r} on {topic_node!r}")
    state = o.str_("state", max_len=16)
    if state not in ("online", "offline"):
        raise WireError("schema", f"state must be online|offline, not {state!r}")
    labels_raw = o.raw.get("labels") or {}
    if not isinstance(labels_raw, dict) or len(labels_raw) > 64:
        raise WireError("schema", "labels must be an object of at most 64 entries")
    for k, lv in labels_raw.items():
        if label_key_problem(k) or not isinstance(lv, str) or label_value_problem(lv):
            raise WireError("schema", "labels must map label keys to label values "
                            "(Kubernetes syntax, at most 63 characters)")
    labels = tuple(sorted(labels_raw.items()))
    addrs = tuple(o.list_("addresses", max_len=64, required=False))
    if not all(isinstance(a, str) and valid_address(a) for a in addrs):
        raise WireError("schema", "addresses must be IP addresses")
    return NodeStatus(
        node=node,
        state=state,  # type: ignore[arg-type]
        ts=o.req_num("ts", hi=1e11),
        boot=o.str_("boot", max_len=64, required=False),
        addresses=addrs,
        labels=labels,
        version=o.str_("version", max_len=64, required=False),
    )


def parse_ack(payload: bytes, topic_node: str | None = None) -> AckBatch:
    """Validate an ack message (the agent trusts only its own node's, within bounds)."""
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise WireError("oversized", f"{len(payload)} bytes > {MAX_PAYLOAD_BYTES}")
    o = _Obj(load_json(payload), "")
    if o.int_("v", lo=0, hi=1000) != SCHEMA_VERSION:
        raise WireError("version", "unsupported ack version")
    node = o.str_("node", max_len=63)
    if not valid_id(node) or (topic_node is not None and node != topic_node):
        raise WireError("node_mismatch", f"ack for {node[:64]!r} on {topic_node!r}")
    acks: list[tuple[str, tuple[tuple[int, int], ...]]] = []
    for i, raw in enumerate(o.list_("acks", max_len=MAX_ACK_BOOTS)):
        a = _Obj(raw, f"acks[{i}]")
        ranges: list[tuple[int, int]] = []
        for r in a.list_("seqs", max_len=MAX_ACK_RANGES):
            if (not isinstance(r, list) or len(r) != 2
                    or not all(type(x) is int and 0 <= x <= _MAX_INT for x in r) or r[0] > r[1]):
                raise WireError("schema", f"acks[{i}].seqs: [lo, hi] with 0 <= lo <= hi")
            ranges.append((r[0], r[1]))
        acks.append((a.str_("boot", max_len=64), tuple(ranges)))
    return AckBatch(node=node, ts=o.req_num("ts", hi=1e11), acks=tuple(acks))
