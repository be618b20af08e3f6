"""The core's live model of nodes and directed links, fed by ingest.

Collector pattern (as scheduler-plugins' trimaran): ingest is the only writer;
everyone else reads an immutable :class:`StateSnapshot`. Freshness is explicit
(every node and link carries the time it was last refreshed) so readers decide
how much to trust old data — a stale value lowers confidence, it never raises.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from edge_agent.wire import LinkSample, NodeStatus, Resources, TelemetryReport

# Loss from one 1-second interval with 40 segments is mostly noise; the link's
# loss figure is retransmits over segments across this many recent reports.
LOSS_WINDOW = 10
# Dedupe memory per (node, boot): seqs further back than this are treated as
# already seen — redelivery that old means a broken client, not a retry.
DEDUPE_WINDOW = 4096
SEQ_HISTORY = 20000
# Distinct peers remembered per source node. A report may name up to
# wire.MAX_LINKS peers; a compromised agent naming fresh made-up peers in every
# report must not grow the core without bound, so the least recently
# measured peer is forgotten first.
MAX_LINKS_PER_NODE = 2048


@dataclass(frozen=True, slots=True)
class NodeView:
    node: str
    boot: str
    seq: int
    probe: str
    last_report: float  # core receive time (core clock), 0 if never
    report_ts: float  # agent's own timestamp of the last report
    interval_s: float
    resources: Resources | None
    reports: int
    status: str  # last status message: online | offline | unknown
    status_ts: float
    addresses: tuple[str, ...]
    agent_labels: tuple[tuple[str, str], ...]
    buffered: int
    dropped: int


@dataclass(frozen=True, slots=True)
class LinkView:
    """One direction of a link, as measured by ``src``'s agent."""

    src: str
    dst: str  # a node id when the peer's address is known, else the raw address
    peer_addr: str
    rtt_p50_us: float | None
    rtt_p95_us: float | None
    rtt_min_us: float | None
    loss: float
    tx_bps: float
    rx_bps: float
    samples: int
    updated: float  # core time of the last sample with traffic
    connect_us: float | None
    probe: str
    # Core time of the last sample in which the peer answered (bytes acked by
    # it, or received from it). ``updated`` also moves on segments sent into
    # the void and on idle sockets (sock_diag counts an RTT sample per open
    # socket), so only ``heard`` proves the peer is alive.
    heard: float = 0.0


@dataclass(frozen=True, slots=True)
class StateSnapshot:
    now: float
    nodes: Mapping[str, NodeView]
    links: Mapping[tuple[str, str], LinkView]

    def node_age(self, node: str) -> float:
        v = self.nodes.get(node)
        return math.inf if v is None or v.last_report == 0 else self.now - v.last_report

    def link_age(self, src: str, dst: str) -> float:
        lk = self.links.get((src, dst))
        return math.inf if lk is None else self.now - lk.updated


@dataclass(slots=True)
class _Node:
    node: str
    boot: str = ""
    seq: int = 0
    probe: str = ""
    last_report: float = 0.0
    report_ts: float = 0.0
    interval_s: float = 1.0
    resources: Resources | None = None
    reports: int = 0
    status: str = "unknown"
    status_ts: float = 0.0
    addresses: tuple[str, ...] = ()
    agent_labels: tuple[tuple[str, str], ...] = ()
    buffered: int = 0
    dropped: int = 0
    # (boot -> (high-water seq, recent seqs)) for dedupe.
    seen: dict[str, tuple[int, set[int]]] = field(default_factory=dict)
    history: deque[tuple[str, int]] = field(default_factory=lambda: deque(maxlen=SEQ_HISTORY))


@dataclass(slots=True)
class _Link:
    src: str
    peer_addr: str
    rtt: tuple[float, float, float] | None = None
    window: deque[tuple[int, int]] = field(default_factory=lambda: deque(maxlen=LOSS_WINDOW))
    tx_bps: float = 0.0
    rx_bps: float = 0.0
    samples: int = 0
    updated: float = 0.0
    connect_us: float | None = None
    probe: str = ""
    heard: float = 0.0


class ClusterState:
    """Thread-safe; ingest writes, :meth:`snapshot` gives readers a frozen copy."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._nodes: dict[str, _Node] = {}
        # src node -> peer address -> link, least recently measured first.
        self._links: dict[str, OrderedDict[str, _Link]] = {}
        self._addr_owner: dict[str, str] = {}

    # ------------------------------------------------------------------ writes

    def is_duplicate(self, node: str, boot: str, seq: int) -> bool:
        with self._lock:
            n = self._nodes.get(node)
            if n is None or boot not in n.seen:
                return False
            hwm, recent = n.seen[boot]
            return seq in recent or seq <= hwm - DEDUPE_WINDOW

    def apply_report(self, r: TelemetryReport, now: float) -> bool:
        """Fold one validated report in; False (and no change) if already seen."""
        with self._lock:
            n = self._nodes.get(r.node)
            if n is None:
                n = self._nodes[r.node] = _Node(node=r.node)
            hwm, recent = n.seen.get(r.boot, (0, set()))
            if r.seq in recent or r.seq <= hwm - DEDUPE_WINDOW:
                return False
            recent.add(r.seq)
            if r.seq > hwm:
                hwm = r.seq
                if len(recent) > DEDUPE_WINDOW:
                    recent = {s for s in recent if s > hwm - DEDUPE_WINDOW}
            n.seen[r.boot] = (hwm, recent)
            if len(n.seen) > 8:  # forget the oldest boots of a flapping agent
                for b in list(n.seen)[: len(n.seen) - 8]:
                    del n.seen[b]
            n.history.append((r.boot, r.seq))
            n.reports += 1
            # Buffered reports arrive late and oldest first: only a report at
            # least as new as what we hold may overwrite the current view.
            if r.ts >= n.report_ts or r.boot != n.boot:
                n.boot, n.seq, n.probe = r.boot, r.seq, r.probe
                n.report_ts, n.interval_s = r.ts, r.interval_s
                n.resources = r.resources
                n.buffered, n.dropped = r.buffered, r.dropped
            n.last_report = now
            for lk in r.links:
                self._apply_link(r, lk, now)
            return True

    def _apply_link(self, r: TelemetryReport, s: LinkSample, now: float) -> None:
        mine = self._links.get(r.node)
        if mine is None:
            mine = self._links[r.node] = OrderedDict()
        lk = mine.get(s.peer)
        if lk is None:
            lk = mine[s.peer] = _Link(src=r.node, peer_addr=s.peer)
            while len(mine) > MAX_LINKS_PER_NODE:
                mine.popitem(last=False)
        else:
            mine.move_to_end(s.peer)
        if s.samples <= 0 and s.segs_out <= 0 and s.rx_bps <= 0:
            return
        if s.rtt_us is not None:
            lk.rtt = (s.rtt_us.p50, s.rtt_us.p95, s.rtt_us.min)
        if s.segs_out > 0 or s.retrans > 0:
            lk.window.append((s.retrans, s.segs_out))
        lk.tx_bps, lk.rx_bps = s.tx_bps, s.rx_bps
        lk.samples = s.samples
        if s.connect_us is not None:
            lk.connect_us = s.connect_us
        lk.updated = now
        lk.probe = r.probe
        if s.tx_bps > 0 or s.rx_bps > 0:
            lk.heard = now

    def apply_status(self, s: NodeStatus, now: float) -> None:
        with self._lock:
            n = self._nodes.get(s.node)
            if n is None:
                n = self._nodes[s.node] = _Node(node=s.node)
            n.status, n.status_ts = s.state, now
            if s.state == "online":
                for a in n.addresses:
                    if self._addr_owner.get(a) == s.node:
                        del self._addr_owner[a]
                n.addresses = s.addresses
                n.agent_labels = s.labels
                for a in s.addresses:
                    self._addr_owner[a] = s.node

    # ------------------------------------------------------------------ reads

    def node_history(self, node: str) -> list[tuple[str, int]]:
        """(boot, seq) of every accepted report of ``node``, in arrival order (bounded)."""
        with self._lock:
            n = self._nodes.get(node)
            return list(n.history) if n else []

    def snapshot(self, now: float) -> StateSnapshot:
        with self._lock:
            nodes = {
                k: NodeView(
                    node=n.node, boot=n.boot, seq=n.seq, probe=n.probe,
                    last_report=n.last_report, report_ts=n.report_ts, interval_s=n.interval_s,
                    resources=n.resources, reports=n.reports, status=n.status,
                    status_ts=n.status_ts, addresses=n.addresses, agent_labels=n.agent_labels,
                    buffered=n.buffered, dropped=n.dropped,
                )
                for k, n in self._nodes.items()
            }
            links: dict[tuple[str, str], LinkView] = {}
            for src, addr, lk in ((s, a, lk) for s, m in self._links.items()
                                  for a, lk in m.items()):
                if lk.updated == 0:
                    continue
                dst = self._addr_owner.get(addr, addr)
                retrans = sum(w[0] for w in lk.window)
                segs = sum(w[1] for w in lk.window)
                view = LinkView(
                    src=src, dst=dst, peer_addr=addr,
                    rtt_p50_us=lk.rtt[0] if lk.rtt else None,
                    rtt_p95_us=lk.rtt[1] if lk.rtt else None,
                    rtt_min_us=lk.rtt[2] if lk.rtt else None,
                    loss=min(1.0, retrans / segs) if segs > 0 else 0.0,
                    tx_bps=lk.tx_bps, rx_bps=lk.rx_bps, samples=lk.samples,
                    updated=lk.updated, connect_us=lk.connect_us, probe=lk.probe,
                    heard=lk.heard,
                )
                old = links.get((src, dst))
                # A node with several addresses: keep the freshest measurement.
                if old is None or view.updated > old.updated:
                    links[(src, dst)] = view
        return StateSnapshot(now=now, nodes=MappingProxyType(nodes), links=MappingProxyType(links))
