"""eBPF link probe: per-peer TCP telemetry aggregated in kernel maps (bpf/tcp_links.c).

Each ``collect`` drains the maps with lookup-and-delete batches, so an event
lands in exactly one interval (one that races the drain lands in the next).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import time
from collections.abc import Iterable
from typing import Any

from edge_agent import bpf_loader
from edge_agent.errors import ConfigError, ProbeError
from edge_agent.probes.base import (
    DEFAULT_MSS,
    DEFAULT_PROBE_PORT,
    PeerTotals,
    decode_addr,
    encode_addr,
    estimate_segs_out,
)
from edge_agent.wire import LinkSample

log = logging.getLogger(__name__)

TRACEPOINTS = ("tcp:tcp_probe", "tcp:tcp_retransmit_skb", "sock:inet_sock_set_state")
SOURCE = "tcp_links.c"


class EbpfProbe:
    """Loads bpf/tcp_links.c; one instance per agent (each instance loads its own copy)."""

    name = "ebpf"

    def __init__(
        self,
        *,
        include_loopback: bool = False,
        local_addrs: Iterable[str] = (),
        probe_port: int = DEFAULT_PROBE_PORT,
        mss: int = DEFAULT_MSS,
        max_peers: int = 4096,
    ) -> None:
        self._local = tuple(local_addrs)
        _encode_all(self._local)  # a bad address is a config error, not a reason to fall back
        bpf_loader.check_environment(TRACEPOINTS)
        self._mss = mss
        cflags = [f"-DCFNET_PROBE_PORT={int(probe_port)}", f"-DCFNET_MAX_PEERS={int(max_peers)}"]
        if "err" in bpf_loader.tracepoint_fields("tcp", "tcp_retransmit_skb"):
            cflags.append("-DCFNET_RETRANS_HAS_ERR")
        if include_loopback:
            cflags.append("-DCFNET_INCLUDE_LOOPBACK")
        if self._local:
            cflags.append("-DCFNET_FILTER_LOCAL")
        self._bpf: Any = bpf_loader.load(SOURCE, cflags)
        try:
            self._peers = self._bpf[b"peers"]
            self._hist = self._bpf[b"rtt_hist"]
            self._locals = self._bpf[b"local_addrs"]
            self.set_local_addrs(self._local)
        except Exception as exc:
            self._bpf.cleanup()
            raise ProbeError(f"BPF maps unusable: {exc}") from exc
        self._last = time.monotonic()
        log.info("ebpf probe loaded (%s); local filter %s", ", ".join(TRACEPOINTS),
                 ", ".join(self._local) or "off")

    def set_local_addrs(self, addrs: Iterable[str]) -> None:
        """Replace the local address set (only effective if constructed with a non-empty one)."""
        encoded = _encode_all(addrs)
        self._locals.clear()
        key_t, leaf_t = self._locals.Key, self._locals.Leaf
        for raw, fam in encoded:
            k = key_t()
            ctypes.memmove(k.addr, raw, 16)
            k.family = fam
            self._locals[k] = leaf_t(1)

    def _drain(self, table: Any) -> list[tuple[Any, Any]]:
        try:
            return list(table.items_lookup_and_delete_batch())
        except Exception:
            # Kernels without batch ops on hash maps: read then delete one by one.
            items = [(k, v) for k, v in table.items()]
            for k, _ in items:
                with contextlib.suppress(KeyError):
                    del table[k]
            return items

    def collect(self) -> list[LinkSample]:
        now = time.monotonic()
        interval = now - self._last
        self._last = now
        totals: dict[str, PeerTotals] = {}

        def peer_of(k: Any) -> str:
            return decode_addr(bytes(k.addr), int(k.family))

        for k, v in self._drain(self._peers):
            t = totals.setdefault(peer_of(k), PeerTotals())
            t.rtt_count += v.rtt_count
            if v.rtt_min_us:
                t.rtt_min = float(v.rtt_min_us) if t.rtt_min is None else min(t.rtt_min,
                                                                               v.rtt_min_us)
            if v.rtt_max_us:
                t.rtt_max = max(t.rtt_max or 0.0, float(v.rtt_max_us))
            t.bytes_acked += v.bytes_acked
            t.bytes_rcvd += v.bytes_rcvd
            t.retrans += v.retrans
            t.segs_out += estimate_segs_out(v.bytes_sent, v.acks, v.retrans, self._mss)
            t.connects += v.connects
            t.connect_us_sum += v.connect_ns_sum / 1000.0
            t.opened += v.opened
            t.active_events += v.active_events
            t.passive_events += v.passive_events
        for k, c in self._drain(self._hist):
            peer = peer_of(k.peer)
            if peer in totals:
                h = totals[peer].rtt_hist
                n = int(getattr(c, "value", c))
                h[int(k.bucket)] = h.get(int(k.bucket), 0) + n
        return [t.sample(peer, interval) for peer, t in sorted(totals.items())]

    def prog_stats(self) -> tuple[int, int]:
        """(run_time_ns, run_cnt) summed over this probe's BPF programs.

        The kernel counts these only while ``kernel.bpf_stats_enabled`` is 1;
        they are how the benchmark charges the in-kernel cost to the probe.
        """
        total_ns = total_cnt = 0
        for fn in self._bpf.funcs.values():
            try:
                with open(f"/proc/self/fdinfo/{fn.fd}") as f:
                    for line in f:
                        key, _, val = line.partition(":")
                        if key == "run_time_ns":
                            total_ns += int(val)
                        elif key == "run_cnt":
                            total_cnt += int(val)
            except OSError:
                continue
        return total_ns, total_cnt

    def close(self) -> None:
        bpf = self._bpf
        self._bpf = None
        if bpf is not None:
            bpf.cleanup()


def _encode_all(addrs: Iterable[str]) -> list[tuple[bytes, int]]:
    try:
        return [encode_addr(a) for a in addrs]
    except ValueError as exc:
        raise ConfigError(f"bad local address: {exc}") from exc
