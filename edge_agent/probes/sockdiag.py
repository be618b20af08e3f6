"""Fallback link probe: polls sock_diag (tcp_info) through pyroute2.

Used where eBPF can't load (not root, no BTF, no BCC). Reading one's own
namespace's TCP sockets via sock_diag needs no privilege. Per-socket counters
(segs_out, total_retrans, bytes_acked, bytes_received) are differenced between
calls and summed per peer; RTT percentiles are taken over the sockets' current
smoothed RTTs. What it can't see: sockets that opened and closed between two
calls, the last interval of a socket that closed, and connect latency.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from edge_agent.errors import ConfigError, ProbeError
from edge_agent.probes.base import DEFAULT_PROBE_PORT, PeerTotals, is_loopback, normalize_addr
from edge_agent.wire import LinkSample

log = logging.getLogger(__name__)

INET_DIAG_INFO = 2
# Established-ish states: data can flow (ESTABLISHED, FIN_WAIT1/2, CLOSE_WAIT, LAST_ACK, CLOSING).
_STATES = (1 << 1) | (1 << 4) | (1 << 5) | (1 << 8) | (1 << 9) | (1 << 11)


@dataclass
class _SockSnap:
    segs_out: int
    retrans: int
    bytes_acked: int
    bytes_rcvd: int


class SockDiagProbe:
    """Per-peer samples from tcp_info. ``netns`` (a name in /run/netns) is for tests and tools."""

    name = "sockdiag"

    def __init__(
        self,
        *,
        include_loopback: bool = False,
        local_addrs: Iterable[str] = (),
        probe_port: int = DEFAULT_PROBE_PORT,
        netns: str | None = None,
    ) -> None:
        try:
            from pyroute2.netlink import NETLINK_SOCK_DIAG
            from pyroute2.netlink.diag import DiagSocket, MarshalDiag
            from pyroute2.netlink.nlsocket import NetlinkSocket

            if netns is None:
                sock: Any = DiagSocket()
            else:
                # DiagSocket() takes no netns; build the same socket through
                # NetlinkSocket, which opens it inside the named namespace.
                sock = DiagSocket.__new__(DiagSocket)
                NetlinkSocket.__init__(sock, NETLINK_SOCK_DIAG, netns=netns)
                sock.set_marshal(MarshalDiag())
            sock.bind()
        except Exception as exc:
            raise ProbeError(f"sock_diag unavailable: {exc}") from exc
        self._sock = sock
        self._include_loopback = include_loopback
        try:
            self._local = frozenset(normalize_addr(a) for a in local_addrs)
        except ValueError as exc:
            raise ConfigError(f"bad local address: {exc}") from exc
        self._port = probe_port
        self._prev: dict[tuple[int, int], _SockSnap] = {}
        self._first = True
        self._last = time.monotonic()

    def _dump(self) -> list[Any]:
        out: list[Any] = []
        for family in (socket.AF_INET, socket.AF_INET6):
            try:
                out.extend(self._sock.get_sock_stats(
                    family=family, states=_STATES, extensions=1 << (INET_DIAG_INFO - 1)))
            except Exception as exc:
                raise ProbeError(f"sock_diag dump failed: {exc}") from exc
        return out

    def collect(self) -> list[LinkSample]:
        now = time.monotonic()
        interval = now - self._last
        self._last = now
        first, self._first = self._first, False
        seen: dict[tuple[int, int], _SockSnap] = {}
        totals: dict[str, PeerTotals] = {}
        for msg in self._dump():
            info = msg.get_attr("INET_DIAG_INFO")
            if info is None:
                continue
            try:
                src, dst = normalize_addr(msg["idiag_src"]), normalize_addr(msg["idiag_dst"])
            except ValueError:
                continue
            if not self._include_loopback and is_loopback(dst):
                continue
            if self._local and src not in self._local:
                continue
            key = (int(msg["idiag_cookie"]), int(msg["idiag_sport"]))
            snap = _SockSnap(
                segs_out=int(info.get("tcpi_segs_out") or 0),
                retrans=int(info.get("tcpi_total_retrans") or 0),
                bytes_acked=int(info.get("tcpi_bytes_acked") or 0),
                bytes_rcvd=int(info.get("tcpi_bytes_received") or 0),
            )
            seen[key] = snap
            # A socket present at the very first call is a baseline only; one
            # that appears later started within the interval, from zero.
            prev = self._prev.get(key) or (snap if first else _SockSnap(0, 0, 0, 0))
            t = totals.setdefault(dst, PeerTotals())
            rtt = float(info.get("tcpi_rtt") or 0)
            if rtt > 0:
                t.rtt_values.append(rtt)
                t.rtt_count += 1
                t.rtt_min = rtt if t.rtt_min is None else min(t.rtt_min, rtt)
            t.segs_out += max(0, snap.segs_out - prev.segs_out)
            t.retrans += max(0, snap.retrans - prev.retrans)
            t.bytes_acked += max(0, snap.bytes_acked - prev.bytes_acked)
            t.bytes_rcvd += max(0, snap.bytes_rcvd - prev.bytes_rcvd)
            if key not in self._prev and not first:
                t.opened += 1
            if self._port in (int(msg["idiag_sport"]), int(msg["idiag_dport"])):
                t.active_events += 1
            else:
                t.passive_events += 1
        self._prev = seen
        if first:
            return []
        return [t.sample(peer, interval) for peer, t in sorted(totals.items())]

    def close(self) -> None:
        try:
            self._sock.close()
        except Exception as exc:  # closing is best effort; nothing to recover
            log.debug("closing sock_diag socket: %s", exc)

