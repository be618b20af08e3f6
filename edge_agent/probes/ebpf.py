"""eBPF link probe: per-peer TCP telemetry aggregated in kernel maps (bpf/tcp_links.c).

The programs are loaded by one of two loaders (:func:`edge_agent.bpf_loader.choose`):
the prebuilt CO-RE object by libbpf in this process (the default, wherever the kernel
has BTF), or the same C compiled by BCC in a short-lived loader process
(:func:`edge_agent.bpf_loader.load_in_subprocess`), which hands the descriptors over.
Either way this process reads the maps with ``bpf(2)`` (:mod:`edge_agent.bpfsys`)
and never imports BCC, so no LLVM stays mapped in the long-lived agent. Each
``collect`` drains the maps entry by entry with lookup-and-delete, so an event
lands in exactly one interval (one that races the drain lands in the next).
"""

from __future__ import annotations

import ctypes
import logging
import os
import time
from collections.abc import Iterable
from typing import Any

from edge_agent import bpf_loader
from edge_agent.bpfsys import BpfMap, header_structs
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
HEADER = "cfnet_links.h"
MAPS = ("peers", "rtt_hist", "local_addrs")


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
        pending: bpf_loader.Pending | None = None,
        bcc_fallback: bool = False,
    ) -> None:
        """``pending``: a loader already started (:func:`start_early`) to claim instead of
        starting one; it is used only if its request is the one this probe needs.
        ``bcc_fallback``: BCC may load where CO-RE cannot (:func:`bpf_loader.choose`)."""
        self._local = tuple(local_addrs)
        try:
            _encode_all(self._local)  # a bad address is a config error, not a reason to fall back
            req = load_request(include_loopback=include_loopback, filter_local=bool(self._local),
                               probe_port=probe_port, max_peers=max_peers)
            loader, why = bpf_loader.choose(bcc_fallback)
            if pending is not None and pending.loader != loader:
                pending.cancel()  # started with the other loader (a test's switch)
                pending = None
            if pending is not None and pending.request != req:
                # Started early from the configuration with a guess (say, the node
                # had no address yet); other -D flags make another program.
                log.info("ebpf probe: the early loader's request differs; loading again")
                pending.cancel()
                pending = None
            if pending is None:
                precheck()
            self._mss = mss
            types = header_structs(bpf_loader.bpf_dir() / HEADER)
            if loader == "core":
                self._hand: bpf_loader.Handoff | None = (
                    pending.result() if pending is not None else bpf_loader.load_core(req, why))
            else:
                self._hand = (pending.result() if pending is not None
                              else bpf_loader.load_in_subprocess(req))
                self._hand.reason = why
        finally:
            if pending is not None:
                pending.cancel()  # a no-op once answered; reaps it if anything above failed
        try:
            self._addr_t = types["cf_addr"]
            self._peers = BpfMap(self._hand.maps["peers"], types["cf_addr"],
                                 types["cf_peer_stats"], "peers")
            self._hist = BpfMap(self._hand.maps["rtt_hist"], types["cf_hist_key"],
                                ctypes.c_uint64, "rtt_hist")
            self._locals = BpfMap(self._hand.maps["local_addrs"], types["cf_addr"],
                                  ctypes.c_uint8, "local_addrs")
            self.set_local_addrs(self._local)
        except (KeyError, OSError, ProbeError) as exc:
            self.close()
            raise ProbeError(f"BPF maps unusable: {exc}") from exc
        self._last = time.monotonic()
        #: "core" or "bcc", and why (for BCC: why not CO-RE); the agent logs both.
        self.loader, self.loader_reason = self._hand.loader, self._hand.reason
        log.info("ebpf probe: loader %s (%s), pid %d (%s); %d attachments held; "
                 "local filter %s", self.loader, self.loader_reason, self._hand.loader_pid,
                 ", ".join(TRACEPOINTS), len(self._hand.links), ", ".join(self._local) or "off")
        # With the kernel's counters the loss ratio is tcp_info's; without, it is
        # estimated (retransmitted segments / bytes sent over the MSS).
        self.kernel_counters = self._hand.kernel_counters
        if not self.kernel_counters:
            log.warning("ebpf probe: no BTF offsets for the kernel's TCP counters; "
                        "segs_out is estimated from bytes sent")

    @property
    def fds(self) -> dict[str, list[int]]:
        """The descriptors this probe holds (tests check what a kill releases)."""
        h = self._hand
        if h is None:
            return {"maps": [], "progs": [], "links": []}
        return {"maps": list(h.maps.values()), "progs": list(h.progs.values()),
                "links": list(h.links)}

    def set_local_addrs(self, addrs: Iterable[str]) -> None:
        """Replace the local address set (only effective if constructed with a non-empty one)."""
        encoded = _encode_all(addrs)
        self._locals.clear()
        for raw, fam in encoded:
            k = self._addr_t()
            ctypes.memmove(k.addr, raw, 16)
            k.family = fam
            self._locals.update(k, ctypes.c_uint8(1))

    def _drain(self, table: BpfMap) -> list[tuple[Any, Any]]:
        try:
            return table.drain()
        except OSError as exc:
            raise ProbeError(f"reading map {table.name} failed: {exc}") from exc

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
            if self.kernel_counters:
                t.retrans += v.k_retrans
                t.segs_out += v.k_segs_out
            else:
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
        for fd in self.fds["progs"]:
            try:
                with open(f"/proc/self/fdinfo/{fd}") as f:
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
        """Close the descriptors: the kernel detaches and frees the programs and maps."""
        hand = self._hand
        self._hand = None
        if hand is not None:
            hand.close()


def precheck() -> None:
    """Cheap checks, so a plain "no" costs no loader process (the loaders check
    tracefs and the tracepoints themselves; BTF decides which loader, not whether)."""
    if os.geteuid() != 0:
        raise ProbeError("not root: eBPF needs CAP_BPF/CAP_PERFMON")


def load_request(*, include_loopback: bool = False, filter_local: bool = False,
                 probe_port: int = DEFAULT_PROBE_PORT,
                 max_peers: int = 4096) -> bpf_loader.LoadRequest:
    """What the loader is asked to compile: parameters reach the C code as -D flags only."""
    cflags = [f"-DCFNET_PROBE_PORT={int(probe_port)}", f"-DCFNET_MAX_PEERS={int(max_peers)}"]
    if include_loopback:
        cflags.append("-DCFNET_INCLUDE_LOOPBACK")
    if filter_local:
        cflags.append("-DCFNET_FILTER_LOCAL")
    params = {"filter_local": int(filter_local), "include_loopback": int(include_loopback),
              "probe_port": int(probe_port), "max_peers": int(max_peers)}
    return bpf_loader.LoadRequest(source=SOURCE, cflags=cflags, tracepoints=list(TRACEPOINTS),
                                  maps=list(MAPS), params=params)


def start_early(*, include_loopback: bool = False, filter_local: bool = True,
                probe_port: int = DEFAULT_PROBE_PORT, bcc_fallback: bool = False
                ) -> tuple[bpf_loader.Pending | None, str]:
    """Start the load now, before the agent's own start-up, for the probe to claim later.

    With BCC, the loader process (its compile is most of the agent's start-up); with
    CO-RE, libbpf's load in a thread of this process. Either runs beside the agent's
    imports, buffer and broker connect. Returns (pending or None, why not):
    a failure here is not reported as the probe's fallback reason; the probe
    then runs its own checks and load, and fails or falls back as it would have
    (a CO-RE load that fails in its thread says why when the probe claims it).
    """
    try:
        precheck()
        loader, why = bpf_loader.choose(bcc_fallback)
        req = load_request(include_loopback=include_loopback, filter_local=filter_local,
                           probe_port=probe_port)
        if loader == "core":
            return bpf_loader.start_core(req, why), ""
        return bpf_loader.start_loader(req), ""
    except ProbeError as exc:
        return None, str(exc)


def _encode_all(addrs: Iterable[str]) -> list[tuple[bytes, int]]:
    try:
        return [encode_addr(a) for a in addrs]
    except ValueError as exc:
        raise ConfigError(f"bad local address: {exc}") from exc
