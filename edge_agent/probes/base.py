"""Probe contract and the pure helpers both link probes share.

A probe turns kernel TCP statistics into one :class:`~edge_agent.wire.LinkSample`
per remote peer per interval. The helpers here (address encoding, the RTT
histogram layout shared with ``bpf/cfnet_links.h``, percentiles, the loss
estimate) are pure so they can be tested table-driven without a kernel.
"""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from edge_agent.wire import LinkSample, RttStats

AF_INET = 2
AF_INET6 = 10
# Keep in sync with CF_SUB_BITS in bpf/cfnet_links.h.
SUB_BITS = 4
SUB = 1 << SUB_BITS
# Payload of a full-sized segment on a 1500-byte MTU path with TCP timestamps;
# the eBPF probe divides bytes sent by it to estimate segments sent.
DEFAULT_MSS = 1448
DEFAULT_PROBE_PORT = 7946


@dataclass(frozen=True)
class ProbeConfig:
    """How the agent wants its links measured."""

    ebpf: bool = True
    include_loopback: bool = False
    # Addresses of this node. Tracepoints see every network namespace on the
    # host, so the eBPF probe counts only sockets bound to one of these
    # (empty: count every non-loopback socket).
    local_addrs: tuple[str, ...] = ()
    # The active prober's TCP port: its connections count as active, not passive, samples.
    # Must be the port the agent's echo server and prober use (AgentConfig.probe_port).
    probe_port: int = DEFAULT_PROBE_PORT
    # Load with BCC (a compiler on the device) where CO-RE cannot load: only when asked.
    bcc_fallback: bool = False


class LinkProbe(Protocol):
    """Per-peer link measurements; every ``collect`` covers the time since the last."""

    name: str

    def collect(self) -> list[LinkSample]: ...

    def close(self) -> None: ...


# --------------------------------------------------------------------------- addresses


def encode_addr(addr: str) -> tuple[bytes, int]:
    """Address -> (16 bytes, family) as the BPF side keys it.

    IPv4 sits in the first 4 bytes; IPv4-mapped IPv6 is folded to IPv4 so a
    dual-stack socket and a plain one count for the same peer.
    """
    ip = ipaddress.ip_address(addr)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if isinstance(ip, ipaddress.IPv4Address):
        return ip.packed + bytes(12), AF_INET
    return ip.packed, AF_INET6


def decode_addr(raw: bytes, family: int) -> str:
    """Inverse of :func:`encode_addr`; ``ValueError`` for an unknown family."""
    if family == AF_INET:
        return str(ipaddress.IPv4Address(bytes(raw[:4])))
    if family == AF_INET6:
        ip6 = ipaddress.IPv6Address(bytes(raw[:16]))
        return str(ip6.ipv4_mapped) if ip6.ipv4_mapped is not None else str(ip6)
    raise ValueError(f"unknown address family {family}")


def normalize_addr(addr: str) -> str:
    """Canonical text form (compressed IPv6, mapped IPv4 folded), as samples name peers."""
    raw, family = encode_addr(addr)
    return decode_addr(raw, family)


def is_loopback(addr: str) -> bool:
    ip = ipaddress.ip_address(addr)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


# --------------------------------------------------------------------------- histogram


def bucket_of(value_us: int) -> int:
    """Bucket index of a value, exactly as ``cf_bucket`` in bpf/tcp_links.c computes it."""
    if value_us < SUB:
        return max(0, int(value_us))
    log = value_us.bit_length() - 1
    sub = (value_us >> (log - SUB_BITS)) & (SUB - 1)
    return (log - SUB_BITS + 1) * SUB + sub


def bucket_bounds(bucket: int) -> tuple[float, float]:
    """[low, high) of a bucket in microseconds."""
    if bucket < SUB:
        return float(bucket), float(bucket + 1)
    log = bucket // SUB + SUB_BITS - 1
    sub = bucket % SUB
    width = 1 << (log - SUB_BITS)
    low = (SUB + sub) * width
    return float(low), float(low + width)


def hist_quantile(hist: Mapping[int, int], q: float, lo: float | None = None,
                  hi: float | None = None) -> float | None:
    """Quantile ``q`` (0..1) of a bucket histogram, interpolated linearly in its bucket.

    ``lo``/``hi`` are the exact min/max seen; the estimate is clamped to them,
    which makes a narrow distribution (one bucket) exact at its ends.
    """
    total = sum(c for c in hist.values() if c > 0)
    if total == 0:
        return None
    rank = q * total
    seen = 0.0
    est = 0.0
    for b in sorted(hist):
        c = hist[b]
        if c <= 0:
            continue
        if seen + c >= rank:
            low, high = bucket_bounds(b)
            est = low + (high - low) * max(0.0, rank - seen) / c
            break
        seen += c
    else:
        est = bucket_bounds(max(hist))[1]
    if lo is not None:
        est = max(est, lo)
    if hi is not None:
        est = min(est, hi)
    return est


def list_quantile(values: Iterable[float], q: float) -> float | None:
    """Quantile of raw values (linear between closest ranks)."""
    v = sorted(values)
    if not v:
        return None
    pos = q * (len(v) - 1)
    i = math.floor(pos)
    j = min(i + 1, len(v) - 1)
    return v[i] + (v[j] - v[i]) * (pos - i)


def rtt_stats(p50: float | None, p95: float | None, mn: float | None) -> RttStats | None:
    """RttStats with the wire's invariant min <= p50 <= p95 enforced."""
    if p50 is None or p95 is None:
        return None
    low = p50 if mn is None or mn <= 0 else mn
    p50 = max(p50, low)
    p95 = max(p95, p50)
    return RttStats(p50=round(p50, 1), p95=round(p95, 1), min=round(low, 1))


def estimate_segs_out(bytes_sent: int, acks: int, retrans: int, mss: int = DEFAULT_MSS) -> int:
    """Segments sent, for a probe that sees bytes but not segments.

    Bulk transfers send full segments, so bytes/MSS counts them; small
    request/response traffic sends short segments that each get their own
    ACK, so the count of ACKs that advanced snd_una is the better bound.
    Retransmissions are segments too (tcp_info's segs_out counts them).
    """
    by_bytes = -(-bytes_sent // max(1, mss))
    return max(by_bytes, acks) + retrans


def loss_ratio(retrans: int, segs_out: int) -> float:
    if segs_out <= 0:
        return 0.0
    return min(1.0, retrans / segs_out)


@dataclass
class PeerTotals:
    """What a probe gathered about one peer during one interval."""

    rtt_hist: dict[int, int] = field(default_factory=dict)
    rtt_values: list[float] = field(default_factory=list)
    rtt_min: float | None = None
    rtt_max: float | None = None
    rtt_count: int = 0
    bytes_acked: int = 0
    bytes_rcvd: int = 0
    segs_out: int = 0
    retrans: int = 0
    connects: int = 0
    connect_us_sum: float = 0.0
    opened: int = 0
    active_events: int = 0
    passive_events: int = 0

    def sample(self, peer: str, interval_s: float) -> LinkSample:
        if self.rtt_hist:
            p50 = hist_quantile(self.rtt_hist, 0.5, self.rtt_min, self.rtt_max)
            p95 = hist_quantile(self.rtt_hist, 0.95, self.rtt_min, self.rtt_max)
        else:
            p50 = list_quantile(self.rtt_values, 0.5)
            p95 = list_quantile(self.rtt_values, 0.95)
        dt = max(interval_s, 1e-3)
        return LinkSample(
            peer=peer,
            rtt_us=rtt_stats(p50, p95, self.rtt_min),
            retrans=self.retrans,
            segs_out=self.segs_out,
            loss=loss_ratio(self.retrans, self.segs_out),
            tx_bps=self.bytes_acked * 8 / dt,
            rx_bps=self.bytes_rcvd * 8 / dt,
            samples=self.rtt_count,
            connect_us=(self.connect_us_sum / self.connects) if self.connects else None,
            conns=self.opened,
            active=self.active_events > 0 and self.passive_events == 0,
        )
