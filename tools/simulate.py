"""Fleet simulator: 1 to 10,000+ virtual edge nodes reporting through the real broker.

Every virtual node publishes schema-v1 telemetry (valid under
``edge_agent.wire.parse_report``) and a retained ``online`` status with an
address and labels, exactly as an agent would, through a handful of ``sim-*``
accounts (role ``sim`` in ``tools.certs``: write on any node's telemetry and
status, nothing else). One account is one MQTT connection (the broker uses
the username as the client id) publishing for a contiguous slice of the nodes.

The world is deterministic from ``seed``: regions (each with a UTC offset, an
electricity price curve and a grid-carbon curve), sites inside regions, nodes
of a few hardware classes at sites, and for every node a few peers (mostly at
its own site and region, some across regions). Per report:

- CPU follows a diurnal curve in the region's local time (with per-node phase
  and noise); memory, power (idle..max watts), load and traffic follow CPU;
- each link's RTT comes from the site pair (same site ~1 ms, same region
  ~5-15 ms, across regions 30-150 ms), with jitter and a little load-related
  queueing, its loss from the pair's baseline;
- scheduled :class:`Degradation` s multiply RTT and set loss on the links of a
  site (or one site pair) for a while; scheduled :class:`Disconnect` s silence
  a site's nodes (an ``offline`` status first, as the broker would send their
  wills), then on reconnect they announce ``online`` again and deliver their
  buffered reports oldest first, as the agent's store-and-forward buffer does.

Price and carbon are registry facts in cfnet, not agent claims: the report
carries them only as an ignored extra (``sim``), and :meth:`Simulator.registry_yaml`
writes a registry the core can load. Everything is bounded: ``duration_s``,
at most ``MAX_NODES`` nodes, a bounded backlog per disconnected node.

Library: ``Simulator(World(SimConfig(...)), [MqttSettings, ...]).run()``.
CLI::

    python -m tools.simulate --nodes 1000 --rate 1 --duration 60 \\
        --broker-host 127.0.0.1 --broker-port 8883 --ca-file ca.crt \\
        --pki run/pki --accounts sim-0,sim-1 \\
        --degrade at=20,dur=15,site=r1s0,rtt=4,loss=0.05 --disconnect at=30,dur=10,site=r0s1

prints a JSON summary (offered, published, acknowledged, late, events) at the end.
With ``--ack-account sim-acks`` every virtual node behaves as an agent with
end-to-end acks (``edge_agent.outbox``): it keeps each report until the core
acknowledges it on ``cfnet/v1/nodes/{node}/ack`` and resends what was lost.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import random
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edge_agent.outbox import AckWindow
from edge_agent.wire import (
    ACK_WILDCARD,
    AckBatch,
    WireError,
    parse_ack,
    split_topic,
    status_topic,
    telemetry_topic,
)
from edge_agent.wire.bus import Message
from edge_agent.wire.mqtt import BUSES, MqttClient, MqttSettings, PublishHandle, protocol_for_bus
from tools.publisher import Publisher, PublisherError

log = logging.getLogger("tools.simulate")

MAX_NODES = 200_000
MAX_DURATION_S = 24 * 3600.0
MAX_BACKLOG = 60  # buffered reports per disconnected node delivered on reconnect
# With end-to-end acks (``acks=``), each virtual node keeps every report until
# the core acknowledges it, as the agent's buffer does, up to this many (the
# agent's default 16 MiB holds about as many of these ~5 KiB reports).
MAX_PENDING = 3000
RESCAN_S = 0.5  # how often an ack-mode slice looks for reports due for a resend
GIB = 1 << 30

# name, UTC offset (h), price $/kWh (night, peak), carbon g/kWh (low, high)
REGION_TEMPLATES: tuple[tuple[str, float, tuple[float, float], tuple[float, float]], ...] = (
    ("eu-west", 1.0, (0.12, 0.32), (40.0, 160.0)),
    ("eu-north", 2.0, (0.05, 0.15), (15.0, 45.0)),
    ("us-east", -5.0, (0.09, 0.22), (250.0, 420.0)),
    ("us-west", -8.0, (0.14, 0.35), (120.0, 300.0)),
    ("ap-south", 5.5, (0.07, 0.18), (550.0, 750.0)),
    ("ap-east", 9.0, (0.11, 0.26), (380.0, 560.0)),
    ("sa-east", -3.0, (0.10, 0.24), (60.0, 140.0)),
    ("af-south", 2.0, (0.08, 0.20), (650.0, 850.0)),
)
# hardware classes: name, cores, memory GiB, gpus, idle W, max W, share of the fleet
NODE_CLASSES: tuple[tuple[str, int, int, int, float, float, float], ...] = (
    ("edge-small", 4, 8, 0, 6.0, 25.0, 0.5),
    ("edge-medium", 8, 32, 0, 15.0, 65.0, 0.35),
    ("edge-gpu", 16, 64, 1, 40.0, 300.0, 0.15),
)


class SimError(RuntimeError):
    """The simulator was given an impossible configuration or could not connect."""


# ====================================================================== schedule


@dataclass(frozen=True, slots=True)
class Degradation:
    """From ``at_s`` for ``duration_s`` (seconds since start), links of ``site`` (to any
    other site, or only to ``peer_site``) get RTT x ``rtt_factor`` and loss ``loss``."""

    at_s: float
    duration_s: float
    site: str
    peer_site: str | None = None
    rtt_factor: float = 3.0
    loss: float = 0.05

    def active(self, t: float) -> bool:
        return self.at_s <= t < self.at_s + self.duration_s

    def hits(self, site_a: str, site_b: str) -> bool:
        if self.peer_site is None:
            return (site_a == self.site) != (site_b == self.site)
        return {site_a, site_b} == {self.site, self.peer_site}


@dataclass(frozen=True, slots=True)
class Disconnect:
    """From ``at_s`` for ``duration_s`` every node of ``site`` is cut off from the broker."""

    at_s: float
    duration_s: float
    site: str
    will: bool = True  # publish 'offline' for each node when it drops (the broker's will)

    def active(self, t: float) -> bool:
        return self.at_s <= t < self.at_s + self.duration_s


def _kv(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in text.split(","):
        k, sep, v = part.partition("=")
        if not sep:
            raise SimError(f"expected key=value in {text!r}")
        out[k.strip()] = v.strip()
    return out


def parse_degradation(text: str) -> Degradation:
    """``at=S,dur=S,site=SITE[,peer=SITE][,rtt=FACTOR][,loss=RATIO]``."""
    d = _kv(text)
    try:
        return Degradation(float(d["at"]), float(d["dur"]), d["site"], d.get("peer"),
                           float(d.get("rtt", 3.0)), float(d.get("loss", 0.05)))
    except (KeyError, ValueError) as exc:
        raise SimError(f"bad degradation {text!r}: {exc}") from exc


def parse_disconnect(text: str) -> Disconnect:
    """``at=S,dur=S,site=SITE[,will=0|1]``."""
    d = _kv(text)
    try:
        return Disconnect(float(d["at"]), float(d["dur"]), d["site"], d.get("will", "1") != "0")
    except (KeyError, ValueError) as exc:
        raise SimError(f"bad disconnect {text!r}: {exc}") from exc


# ====================================================================== world


@dataclass(frozen=True, slots=True)
class SimConfig:
    nodes: int = 100
    rate: float = 1.0  # reports per node per second
    duration_s: float = 60.0
    regions: int = 4
    sites_per_region: int = 4
    peers: int = 3  # links per node
    seed: int = 1
    node_prefix: str = "vn"
    day_s: float = 86400.0  # length of a simulated day (shorter: curves move faster)
    start_hour_utc: float | None = None  # None: the real UTC hour at start
    degradations: tuple[Degradation, ...] = ()
    disconnects: tuple[Disconnect, ...] = ()

    def check(self) -> None:
        if not 1 <= self.nodes <= MAX_NODES:
            raise SimError(f"nodes must be 1..{MAX_NODES}, not {self.nodes}")
        if not 0.001 <= self.rate <= 100:
            raise SimError(f"rate must be 0.001..100 reports/s per node, not {self.rate}")
        if not 0 < self.duration_s <= MAX_DURATION_S:
            raise SimError(f"duration must be in (0, {MAX_DURATION_S:g}] s")
        if not 1 <= self.regions <= len(REGION_TEMPLATES):
            raise SimError(f"regions must be 1..{len(REGION_TEMPLATES)}")
        if not 1 <= self.sites_per_region <= 64 or not 0 <= self.peers <= 64:
            raise SimError("sites_per_region 1..64, peers 0..64")
        if self.day_s <= 0:
            raise SimError("day_s must be positive")


@dataclass(frozen=True, slots=True)
class Region:
    name: str
    utc_offset_h: float
    price: tuple[float, float]
    carbon: tuple[float, float]


@dataclass(frozen=True, slots=True)
class VNode:
    """One virtual node: identity, placement in the world, hardware, peers."""

    index: int
    name: str
    site: str
    region: str
    addr: str
    klass: str
    cores: int
    mem_bytes: int
    gpus: int
    idle_w: float
    max_w: float
    base_util: float
    amp: float
    phase_h: float
    peers: tuple[int, ...]
    security_level: int


def _addr(i: int) -> str:
    # 100.64.0.0/10 (shared address space): never a real peer of this machine.
    j = i + 1
    return f"100.{64 + (j >> 16)}.{(j >> 8) & 255}.{j & 255}"


class World:
    """The deterministic fleet: regions, sites, nodes, peers, curves (pure, no I/O)."""

    def __init__(self, cfg: SimConfig) -> None:
        cfg.check()
        self.cfg = cfg
        rnd = random.Random(cfg.seed)
        self.regions = [Region(*REGION_TEMPLATES[r]) for r in range(cfg.regions)]
        self.sites: dict[str, str] = {}  # site -> region
        for ri, reg in enumerate(self.regions):
            for s in range(cfg.sites_per_region):
                self.sites[f"r{ri}s{s}"] = reg.name
        for site in [d.site for d in cfg.degradations] + [d.site for d in cfg.disconnects]:
            if site not in self.sites:
                raise SimError(f"no site {site!r}; sites are {', '.join(self.sites)}")
        site_names = list(self.sites)
        # region 'distance' on a ring gives plausible cross-region RTTs
        self._region_index = {r.name: i for i, r in enumerate(self.regions)}
        weights = [c[6] for c in NODE_CLASSES]
        by_site: dict[str, list[int]] = {s: [] for s in site_names}
        nodes: list[VNode] = []
        width = max(5, len(str(cfg.nodes - 1)))
        for i in range(cfg.nodes):
            site = site_names[i % len(site_names)]
            k = rnd.choices(NODE_CLASSES, weights)[0]
            by_site[site].append(i)
            nodes.append(VNode(
                index=i, name=f"{cfg.node_prefix}{i:0{width}d}", site=site,
                region=self.sites[site], addr=_addr(i), klass=k[0], cores=k[1],
                mem_bytes=k[2] * GIB, gpus=k[3], idle_w=k[4], max_w=k[5],
                base_util=rnd.uniform(0.05, 0.25), amp=rnd.uniform(0.2, 0.6),
                phase_h=rnd.gauss(0.0, 1.5), peers=(), security_level=rnd.choice((0, 1, 1, 2, 3)),
            ))
        out: list[VNode] = []
        for nd in nodes:
            peers: list[int] = []
            local = [j for j in by_site[nd.site] if j != nd.index]
            for _ in range(cfg.peers):
                x = rnd.random()
                if x < 0.6 and local:
                    j = rnd.choice(local)
                elif x < 0.85:
                    same = [s for s in site_names if self.sites[s] == nd.region and by_site[s]]
                    j = rnd.choice(by_site[rnd.choice(same)])
                else:
                    j = rnd.randrange(cfg.nodes)
                if j != nd.index and j not in peers:
                    peers.append(j)
            out.append(VNode(**{**_asdict(nd), "peers": tuple(peers)}))
        self.nodes: list[VNode] = out
        self.by_name = {nd.name: nd for nd in out}
        self.by_site = by_site
        pair_rnd = random.Random(cfg.seed + 1)
        # base one-way-ish RTT (ms) and loss per unordered site pair
        self._pair: dict[tuple[str, str], tuple[float, float]] = {}
        for a in site_names:
            for b in site_names:
                if a > b:
                    continue
                self._pair[(a, b)] = self._pair_base(a, b, pair_rnd)
        start = cfg.start_hour_utc
        if start is None:
            now = time.gmtime()
            start = now.tm_hour + now.tm_min / 60.0
        self.start_hour_utc = start
        self._curve_cache: dict[tuple[str, int], tuple[float, float]] = {}

    def _pair_base(self, a: str, b: str, rnd: random.Random) -> tuple[float, float]:
        if a == b:
            return rnd.uniform(0.4, 2.0), rnd.uniform(0.0, 0.001)
        ra, rb = self._region_index[self.sites[a]], self._region_index[self.sites[b]]
        if ra == rb:
            return rnd.uniform(4.0, 15.0), rnd.uniform(0.0, 0.003)
        n = len(self.regions)
        hops = min(abs(ra - rb), n - abs(ra - rb))
        return 25.0 + 30.0 * hops + rnd.uniform(0.0, 20.0), rnd.uniform(0.001, 0.01)

    # ------------------------------------------------------------------ curves

    def local_hour(self, region: str, t: float) -> float:
        """Hour of day (0..24) in ``region`` at ``t`` seconds since the start."""
        reg = self.regions[self._region_index[region]]
        return (self.start_hour_utc + reg.utc_offset_h + 24.0 * t / self.cfg.day_s) % 24.0

    @staticmethod
    def diurnal(hour: float) -> float:
        """0 at 04:00, 1 at 16:00 local: the shape of a working day's load."""
        return 0.5 - 0.5 * math.cos(2 * math.pi * (hour - 4.0) / 24.0)

    def price(self, region: str, t: float) -> float:
        """Electricity price ($/kWh): cheap at night, peak in the evening."""
        reg = self.regions[self._region_index[region]]
        h = self.local_hour(region, t)
        shape = 0.5 - 0.5 * math.cos(2 * math.pi * (h - 6.0) / 24.0)
        return reg.price[0] + (reg.price[1] - reg.price[0]) * shape

    def carbon(self, region: str, t: float) -> float:
        """Grid carbon intensity (g/kWh): lowest at midday (solar), highest at night."""
        reg = self.regions[self._region_index[region]]
        h = self.local_hour(region, t)
        shape = 0.5 + 0.5 * math.cos(2 * math.pi * (h - 13.0) / 24.0)
        return reg.carbon[0] + (reg.carbon[1] - reg.carbon[0]) * (1.0 - shape)

    def cpu_util(self, nd: VNode, t: float, rnd: random.Random) -> float:
        h = (self.local_hour(nd.region, t) + nd.phase_h) % 24.0
        u = nd.base_util + nd.amp * self.diurnal(h) + rnd.gauss(0.0, 0.03)
        return min(1.0, max(0.0, u))

    def link(self, a: VNode, b: VNode, t: float) -> tuple[float, float]:
        """(RTT p50 ms, loss) of the a-b link at ``t``, scheduled degradations included."""
        key = (a.site, b.site) if a.site <= b.site else (b.site, a.site)
        rtt, loss = self._pair[key]
        for d in self.cfg.degradations:
            if d.active(t) and d.hits(a.site, b.site):
                rtt *= d.rtt_factor
                loss = max(loss, d.loss)
        return rtt, loss

    def disconnected(self, nd: VNode, t: float) -> Disconnect | None:
        for d in self.cfg.disconnects:
            if d.site == nd.site and d.active(t):
                return d
        return None

    # ------------------------------------------------------------------ messages

    def report(self, nd: VNode, seq: int, boot: str, ts: float, t: float,
               rnd: random.Random, buffered: int = 0) -> dict[str, Any]:
        """One telemetry report of ``nd`` as a dict (the decoded :meth:`report_bytes`)."""
        out: dict[str, Any] = json.loads(self.report_bytes(nd, seq, boot, ts, t, rnd, buffered))
        return out

    def _curves(self, region: str, t: float) -> tuple[float, float]:
        # price and carbon move slowly: one value per region per simulated second
        key = (region, int(t))
        got = self._curve_cache.get(key)
        if got is None:
            if len(self._curve_cache) > 4096:
                self._curve_cache.clear()
            got = self._curve_cache[key] = (self.price(region, t), self.carbon(region, t))
        return got

    def report_bytes(self, nd: VNode, seq: int, boot: str, ts: float, t: float,
                     rnd: random.Random, buffered: int = 0) -> bytes:
        """One telemetry report of ``nd`` (schema v1), encoded.

        Formatted directly rather than through ``json.dumps`` of a dict: at
        10,000 reports/s the simulator shares two cores with the broker and
        the core, and this is about three times cheaper.
        """
        util = self.cpu_util(nd, t, rnd)
        interval = 1.0 / self.cfg.rate
        uni = rnd.uniform
        links = []
        for j in nd.peers:
            peer = self.nodes[j]
            base, loss = self.link(nd, peer, t)
            # queueing grows with the sender's load; jitter is multiplicative
            p50 = base * (1.0 + 0.3 * util) * uni(0.95, 1.08)
            segs = int((200 + 4000 * util) * interval * uni(0.8, 1.2))
            retrans = min(segs, int(segs * loss * uni(0.7, 1.3) + 0.5))
            tx = segs * 11584 / interval  # 1448-byte segments, in bits
            links.append(
                f'{{"peer":"{peer.addr}","rtt_us":{{"p50":{p50 * 1000:.1f},'
                f'"p95":{p50 * 1000 * uni(1.15, 1.6):.1f},'
                f'"min":{p50 * 1000 * uni(0.75, 0.95):.1f}}},'
                f'"retrans":{retrans},"segs_out":{segs},'
                f'"loss":{retrans / segs if segs else 0.0:.5f},"tx_bps":{tx:.1f},'
                f'"rx_bps":{tx * uni(0.5, 1.5):.1f},"samples":{max(1, segs // 10)},'
                f'"conns":{1 + int(6 * rnd.random())}}}')
        mem_used = int(nd.mem_bytes * min(0.95, 0.25 + 0.6 * util))
        gpus = ",".join(
            f'{{"index":{g},"name":"NVIDIA L4","util":{min(1.0, util * 1.1):.3f},'
            f'"mem_total_bytes":{24 * GIB},"mem_used_bytes":{int(24 * GIB * util * 0.8)},'
            f'"power_w":{20 + 50 * util:.1f},"temp_c":{35 + 40 * util:.1f}}}'
            for g in range(nd.gpus))
        price, carbon = self._curves(nd.region, t)
        probe = "sockdiag" if nd.index % 10 == 9 else "ebpf"
        return (
            f'{{"v":1,"node":"{nd.name}","seq":{seq},"boot":"{boot}","ts":{ts:.4f},'
            f'"interval_s":{interval!r},"probe":"{probe}","resources":{{'
            f'"cpu_cores":{nd.cores},"cpu_util":{util:.4f},"mem_total_bytes":{nd.mem_bytes},'
            f'"mem_used_bytes":{mem_used},"gpus":[{gpus}],"disk_total_bytes":{256 * GIB},'
            f'"disk_used_bytes":{(64 + nd.index % 97) * GIB},'
            f'"power_w":{nd.idle_w + (nd.max_w - nd.idle_w) * util:.1f},'
            f'"load1":{util * nd.cores:.2f}}},"links":[{",".join(links)}],'
            f'"buffered":{buffered},"dropped":0,'
            # extra, ignored by the core (price and carbon are registry facts)
            f'"sim":{{"site":"{nd.site}","price_per_kwh":{price:.4f},'
            f'"carbon_g_per_kwh":{carbon:.1f}}}}}'
        ).encode()

    def status(self, nd: VNode, state: str, boot: str) -> dict[str, Any]:
        return {"node": nd.name, "state": state, "ts": time.time(), "boot": boot,
                "addresses": [nd.addr], "version": "sim",
                "labels": {"cfnet.io/site": nd.site, "cfnet.io/class": nd.klass}}

    def status_bytes(self, nd: VNode, state: str, boot: str) -> bytes:
        return json.dumps(self.status(nd, state, boot), separators=(",", ":")).encode()

    def registry_yaml(self, t: float = 0.0) -> str:
        """A node registry (``cloud_core.registry`` format) for this fleet at ``t``."""
        lines = ["defaults: {region: unregistered, zone: unregistered, security_level: 0}",
                 "nodes:"]
        for nd in self.nodes:
            k = next(c for c in NODE_CLASSES if c[0] == nd.klass)
            lines.append(
                f"  - {{name: {nd.name}, region: {nd.region}, zone: {nd.site}, "
                f"security_level: {nd.security_level}, "
                f"energy_price_per_kwh: {self.price(nd.region, t):.4f}, "
                f"carbon_g_per_kwh: {self.carbon(nd.region, t):.1f}, "
                f"idle_watts: {k[4]}, max_watts: {k[5]}, "
                f"price_per_hour: {0.02 * nd.cores + 0.5 * nd.gpus:.3f}}}")
        return "\n".join(lines) + "\n"


def _asdict(nd: VNode) -> dict[str, Any]:
    return {f: getattr(nd, f) for f in VNode.__slots__}


# ====================================================================== runner


class _PahoSender:
    """The project's paho adapter behind the same small interface as :class:`Publisher`.

    Kept for comparison (``--client paho``): the lean publisher is the default
    because paho's per-message cost made the simulator the bottleneck.
    """

    def __init__(self, settings: MqttSettings) -> None:
        self.settings = settings
        self._client = MqttClient(settings)
        self._pending: deque[PublishHandle] = deque()

    def connect(self, timeout_s: float) -> None:
        self._client.start()
        if not self._client.wait_connected(timeout_s):
            raise SimError(f"{self.settings.username}: not connected "
                           f"({self._client.last_refusal or 'timeout'})")

    @property
    def in_flight(self) -> int:
        while self._pending and self._pending[0].done():  # acks come back in order
            self._pending.popleft()
        return len(self._pending)

    def publish(self, topic: str, payload: bytes, *, retain: bool = False) -> None:
        self._pending.append(self._client.publish(topic, payload, qos=1, retain=retain))

    def flush(self) -> None:
        pass  # paho's network thread sends

    def poll(self, timeout_s: float = 0.0) -> None:
        if timeout_s > 0 and self.in_flight:
            time.sleep(timeout_s)

    def drain(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while self.in_flight and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.in_flight == 0

    def close(self) -> None:
        self._client.stop()


Sender = Publisher | _PahoSender


@dataclass(slots=True)
class SliceStats:
    """What one connection did (offered = reports due; published = handed to MQTT)."""

    account: str
    nodes: int
    offered: int = 0
    published: int = 0
    acked: int = 0
    late: int = 0  # published more than one interval after it was due
    backlog_sent: int = 0
    statuses: int = 0
    resent: int = 0  # ack mode: reports sent again (no core ack in time)
    acked_e2e: int = 0  # ack mode: reports the core acknowledged
    pending_dropped: int = 0  # ack mode: oldest reports dropped past MAX_PENDING
    max_pending: int = 0  # ack mode: the most reports one node held unacknowledged
    max_lag_s: float = 0.0
    errors: int = 0


@dataclass(slots=True)
class _NodeRun:
    seq: int = 0
    boot: str = ""
    cut: Disconnect | None = None
    backlog: list[tuple[int, float, float]] = field(default_factory=list)  # (seq, ts, t)
    # ack mode: seq -> (ts, t), oldest first, until the core acknowledges it
    pending: dict[int, tuple[float, float]] = field(default_factory=dict)
    win: AckWindow[int] | None = None


class Simulator:
    """Runs a :class:`World` over ``connections`` (one MQTT connection each, in threads).

    Node slices are contiguous: connection ``k`` of ``K`` publishes for nodes
    ``[k*N/K, (k+1)*N/K)``. ``shard=(i, n)`` keeps only connections with
    ``k % n == i`` -- for running the fleet over several processes.
    """

    def __init__(self, world: World, connections: Sequence[MqttSettings], *,
                 shard: tuple[int, int] = (0, 1), tick_s: float = 0.01,
                 max_pending: int = 2000, client: str = "lean",
                 on_event: Callable[[str, dict[str, Any]], None] | None = None,
                 acks: MqttSettings | None = None, drain_s: float = 0.0,
                 log_acks: bool = False) -> None:
        if not connections:
            raise SimError("at least one connection (sim account) is needed")
        self.world = world
        self.cfg = world.cfg
        n, k = world.cfg.nodes, len(connections)
        self._slices: list[tuple[MqttSettings, list[VNode]]] = []
        for c, s in enumerate(connections):
            if c % shard[1] != shard[0]:
                continue
            self._slices.append((s, world.nodes[c * n // k:(c + 1) * n // k]))
        self.tick_s = tick_s
        # QoS 1 messages handed to MQTT but not yet acknowledged, per connection:
        # past this the slice waits (as an agent does), so a slow broker shows up
        # as late reports instead of an unbounded queue in the client.
        self.max_pending = max_pending
        if client not in ("lean", "paho"):
            raise SimError(f"client must be lean or paho, not {client!r}")
        self.client = client
        self.stats: list[SliceStats] = []
        self.events: list[dict[str, Any]] = []
        self._events_lock = threading.Lock()
        self._on_event = on_event
        self._stop = threading.Event()
        self.t0 = 0.0
        # Ack mode: every node behaves like an agent with end-to-end acks
        # (edge_agent.outbox): keeps each report until the core acknowledges it,
        # resends what is lost. ``acks`` is a sim account that listens on every
        # node's ack topic; after ``duration_s`` a slice keeps resending for up to
        # ``drain_s`` until its nodes hold nothing unacknowledged.
        self.ack_settings = acks
        self.drain_s = drain_s
        self.ack_log: list[tuple[str, str, int, float]] | None = [] if log_acks else None
        self._runs: dict[str, _NodeRun] = {}
        self._ack_q: dict[str, deque[tuple[str, AckBatch]]] = {}
        self._slice_of: dict[str, str] = {}
        self.bad_acks = 0

    def stop(self) -> None:
        self._stop.set()

    def pending_total(self) -> int:
        """Ack mode: reports the fleet holds that the core has not acknowledged."""
        return sum(len(r.pending) for r in list(self._runs.values()))

    def oldest_pending(self) -> dict[str, int | None]:
        """Ack mode: node -> the oldest seq it holds unacknowledged (None: nothing)."""
        out: dict[str, int | None] = {}
        for n, r in list(self._runs.items()):
            for _ in range(3):  # the slice thread may change the dict meanwhile
                try:
                    out[n] = next(iter(r.pending), None)
                    break
                except RuntimeError:
                    continue
        return out

    def taken(self) -> dict[str, tuple[str, int]]:
        """node -> (boot, last seq taken)."""
        return {n: (r.boot, r.seq) for n, r in list(self._runs.items())}

    def _on_ack(self, m: Message) -> None:
        # paho's thread: validate, then hand to the node's slice thread.
        try:
            _area, node, _leaf = split_topic(m.topic)
            batch = parse_ack(m.payload, node)
        except WireError:
            self.bad_acks += 1
            return
        acct = self._slice_of.get(node)
        if acct is not None:
            self._ack_q[acct].append((node, batch))

    def _event(self, kind: str, **kw: Any) -> None:
        ev = {"t": round(time.time() - self.t0, 3), "wall": time.time(), "kind": kind, **kw}
        with self._events_lock:
            self.events.append(ev)
        if self._on_event is not None:
            self._on_event(kind, ev)

    def run(self, *, connect_timeout_s: float = 20.0) -> dict[str, Any]:
        """Connect, announce, publish for ``duration_s`` (or until :meth:`stop`), summarise."""
        clients: list[Sender] = []
        listener: MqttClient | None = None
        try:
            if self.ack_settings is not None:
                listener = MqttClient(self.ack_settings, on_message=self._on_ack)
                listener.subscribe(ACK_WILDCARD, qos=1)
                listener.start()
                if not listener.wait_connected(connect_timeout_s):
                    raise SimError(f"ack listener: not connected ({listener.last_refusal})")
            for s, _nodes in self._slices:
                c: Sender = Publisher(s) if self.client == "lean" else _PahoSender(s)
                clients.append(c)
                try:
                    c.connect(connect_timeout_s)
                except PublisherError as exc:
                    raise SimError(f"{s.username}: {exc}") from exc
            self.t0 = time.time()
            for d in self.cfg.degradations:
                self._schedule_note("degradation", d.at_s, d.duration_s, site=d.site,
                                    peer=d.peer_site, rtt_factor=d.rtt_factor, loss=d.loss)
            threads = []
            for (_s, nodes), c in zip(self._slices, clients, strict=True):
                st = SliceStats(account=c.settings.username or "", nodes=len(nodes))
                self.stats.append(st)
                t = threading.Thread(target=self._run_slice, args=(c, nodes, st),
                                     name=f"sim-{st.account}", daemon=True)
                threads.append(t)
                t.start()
            for t in threads:
                t.join(self.cfg.duration_s + self.drain_s + 60)
        finally:
            for c in clients:
                c.close()
            if listener is not None:
                listener.stop()
        return self.summary()

    def _schedule_note(self, kind: str, at: float, dur: float, **kw: Any) -> None:
        # Degradations act inside the reports; log when they start and end, as events.
        def note() -> None:
            if not self._stop.wait(at):
                self._event(f"{kind}_start", **kw)
                if not self._stop.wait(dur):
                    self._event(f"{kind}_end", **kw)
        threading.Thread(target=note, daemon=True).start()

    def _run_slice(self, client: Sender, nodes: list[VNode], st: SliceStats) -> None:
        world, cfg = self.world, self.cfg
        rnd = random.Random(cfg.seed * 7919 + (nodes[0].index if nodes else 0))
        period = 1.0 / cfg.rate
        runs = {nd.index: _NodeRun(boot=uuid.uuid4().hex[:12]) for nd in nodes}
        acking = self.ack_settings is not None
        by_name = {nd.name: nd for nd in nodes}
        q: deque[tuple[str, AckBatch]] = deque()
        if acking:
            self._ack_q[st.account] = q
            for nd in nodes:
                r = runs[nd.index]
                r.win = AckWindow(window=100, resend_s=10.0)
                self._runs[nd.name] = r
                self._slice_of[nd.name] = st.account
        next_scan = time.time() + RESCAN_S
        for nd in nodes:
            self._publish(client, status_topic(nd.name), world.status(nd, "online",
                          runs[nd.index].boot), st, retain=True)
            st.statuses += 1
        # spread the slice evenly over one period (offset by its position in the fleet)
        n_all = cfg.nodes
        due = [self.t0 + period * (nd.index / n_all) for nd in nodes]
        end = self.t0 + cfg.duration_s
        order = list(range(len(nodes)))
        i = 0  # nodes are due in this cyclic order, so a pointer is enough
        while not self._stop.is_set():
            now = time.time()
            if now >= end:
                break
            if acking:
                self._take_acks(client, q, by_name, runs, st, rnd)
                if now >= next_scan:
                    next_scan = now + RESCAN_S
                    for nd in nodes:
                        if runs[nd.index].pending:
                            self._send_due(client, nd, runs[nd.index], st, rnd)
            burst = 0
            while due[order[i]] <= now and burst < 256:
                burst += 1
                k = order[i]
                nd, run = nodes[k], runs[nodes[k].index]
                t_due = due[k]
                due[k] += period
                i = (i + 1) % len(order)
                if t_due >= end:
                    break
                self._node_tick(client, nd, run, t_due, now, st, rnd)
            try:
                client.flush()
                client.poll()
                while client.in_flight >= self.max_pending and not self._stop.is_set() \
                        and time.time() < end:
                    client.poll(0.002)
                wait = min(self.tick_s, max(0.0, due[order[i]] - time.time()))
                if wait > 0:
                    # Waiting for the next node to be due is also when acks are read.
                    client.poll(wait)
            except PublisherError as exc:
                st.errors += 1
                log.error("%s: %s", st.account, exc)
                return
        if acking:
            # Past the schedule: keep taking acks and resending until every node
            # of the slice holds nothing unacknowledged, or drain_s is over.
            stop_at = time.time() + self.drain_s
            while not self._stop.is_set() and time.time() < stop_at \
                    and any(r.pending for r in runs.values()):
                try:
                    self._take_acks(client, q, by_name, runs, st, rnd)
                    if time.time() >= next_scan:
                        next_scan = time.time() + RESCAN_S
                        for nd in nodes:
                            if runs[nd.index].pending:
                                self._send_due(client, nd, runs[nd.index], st, rnd)
                    client.flush()
                    client.poll(0.01)
                except PublisherError as exc:
                    st.errors += 1
                    log.error("%s: %s", st.account, exc)
                    return
        # acknowledged = published minus what is still in flight after a grace period
        try:
            client.drain(15.0)
        except PublisherError as exc:
            st.errors += 1
            log.error("%s: %s", st.account, exc)
        st.acked = max(0, st.published - client.in_flight)

    def _node_tick(self, client: Sender, nd: VNode, run: _NodeRun, t_due: float,
                   now: float, st: SliceStats, rnd: random.Random) -> None:
        world = self.world
        t = t_due - self.t0
        st.offered += 1
        cut = world.disconnected(nd, t)
        if run.win is not None:
            self._ack_mode_tick(client, nd, run, t_due, now, t, cut, st, rnd)
            return
        if cut is not None:
            if run.cut is None:
                run.cut = cut
                if cut.will:
                    self._publish(client, status_topic(nd.name),
                                  world.status(nd, "offline", run.boot), st, retain=True)
                    st.statuses += 1
                if nd.index == self.world.by_site[nd.site][0]:
                    self._event("disconnect_start", site=nd.site, at_s=cut.at_s)
            run.seq += 1
            run.backlog.append((run.seq, t_due, t))
            del run.backlog[:-MAX_BACKLOG]  # the agent's buffer is bounded too
            return
        if run.cut is not None:
            run.cut = None
            self._publish(client, status_topic(nd.name), world.status(nd, "online", run.boot),
                          st, retain=True)
            st.statuses += 1
            if nd.index == self.world.by_site[nd.site][0]:
                self._event("disconnect_end", site=nd.site)
            left = len(run.backlog)
            for seq, ts, tb in run.backlog:
                rep = world.report_bytes(nd, seq, run.boot, ts, tb, rnd, buffered=left)
                left -= 1
                self._publish(client, telemetry_topic(nd.name), rep, st)
                st.backlog_sent += 1
            run.backlog.clear()
        lag = now - t_due
        st.max_lag_s = max(st.max_lag_s, lag)
        if lag > 1.0 / self.cfg.rate:
            st.late += 1
        run.seq += 1
        rep = world.report_bytes(nd, run.seq, run.boot, time.time(), t, rnd)
        self._publish(client, telemetry_topic(nd.name), rep, st)
        st.published += 1

    # ------------------------------------------------------------------ ack mode

    def _ack_mode_tick(self, client: Sender, nd: VNode, run: _NodeRun, t_due: float,
                       now: float, t: float, cut: Disconnect | None, st: SliceStats,
                       rnd: random.Random) -> None:
        world = self.world
        if cut is not None and run.cut is None:
            run.cut = cut
            if cut.will:
                self._publish(client, status_topic(nd.name),
                              world.status(nd, "offline", run.boot), st, retain=True)
                st.statuses += 1
            if nd.index == world.by_site[nd.site][0]:
                self._event("disconnect_start", site=nd.site, at_s=cut.at_s)
        elif cut is None and run.cut is not None:
            run.cut = None
            self._publish(client, status_topic(nd.name), world.status(nd, "online", run.boot),
                          st, retain=True)
            st.statuses += 1
            if nd.index == world.by_site[nd.site][0]:
                self._event("disconnect_end", site=nd.site)
        lag = now - t_due
        st.max_lag_s = max(st.max_lag_s, lag)
        if lag > 1.0 / self.cfg.rate:
            st.late += 1
        run.seq += 1
        run.pending[run.seq] = (time.time() if cut is None else t_due, t)
        if len(run.pending) > MAX_PENDING:  # bounded like the agent's buffer
            oldest = next(iter(run.pending))
            del run.pending[oldest]
            st.pending_dropped += 1
        st.max_pending = max(st.max_pending, len(run.pending))
        if cut is None:
            self._send_due(client, nd, run, st, rnd)

    def _send_due(self, client: Sender, nd: VNode, run: _NodeRun, st: SliceStats,
                  rnd: random.Random) -> None:
        win = run.win
        if win is None or run.cut is not None:
            return
        head: list[int] = []
        for seq in run.pending:
            head.append(seq)
            if len(head) >= win.window:
                break
        now = time.monotonic()
        send, give_up = win.due(head, now)
        for seq in give_up:
            run.pending.pop(seq, None)
            st.pending_dropped += 1
        topic = telemetry_topic(nd.name)
        left = len(run.pending)
        for seq in send:
            ts, t = run.pending[seq]
            if seq in win.inflight:
                st.resent += 1
            else:
                st.published += 1
            self._publish(client, topic, self.world.report_bytes(
                nd, seq, run.boot, ts, t, rnd, buffered=left), st)
        win.sent(send, now)

    def _take_acks(self, client: Sender, q: deque[tuple[str, AckBatch]],
                   by_name: dict[str, VNode], runs: dict[int, _NodeRun], st: SliceStats,
                   rnd: random.Random) -> None:
        now_m, now_w = time.monotonic(), time.time()
        while q:
            node, batch = q.popleft()
            nd = by_name.get(node)
            if nd is None:
                continue
            run = runs[nd.index]
            assert run.win is not None
            gone: list[int] = []
            for boot, ranges in batch.acks:
                if boot != run.boot:
                    continue
                for lo, hi in ranges:
                    if hi - lo < len(run.pending):
                        gone.extend(s for s in range(lo, hi + 1) if s in run.pending)
                    else:
                        gone.extend(s for s in run.pending if lo <= s <= hi)
            for s in gone:
                run.pending.pop(s, None)
                if self.ack_log is not None:
                    self.ack_log.append((node, run.boot, s, now_w))
            st.acked_e2e += len(gone)
            run.win.acked(gone, now_m)
            self._send_due(client, nd, run, st, rnd)

    def _publish(self, client: Sender, topic: str, body: dict[str, Any] | bytes,
                 st: SliceStats, *, retain: bool = False) -> None:
        payload = body if isinstance(body, bytes) else json.dumps(
            body, separators=(",", ":")).encode()
        try:
            client.publish(topic, payload, retain=retain)
        except Exception:
            st.errors += 1
            log.exception("publish failed")

    def summary(self) -> dict[str, Any]:
        tot: dict[str, Any] = {k: sum(getattr(s, k) for s in self.stats)
                               for k in ("nodes", "offered", "published", "acked", "late",
                                         "backlog_sent", "statuses", "errors", "resent",
                                         "acked_e2e", "pending_dropped")}
        tot["max_pending"] = max((s.max_pending for s in self.stats), default=0)
        if self.ack_settings is not None:
            tot["unacked"] = self.pending_total()
            tot["bad_acks"] = self.bad_acks
        tot["max_lag_s"] = round(max((s.max_lag_s for s in self.stats), default=0.0), 3)
        tot["connections"] = len(self.stats)
        tot["elapsed_s"] = round(time.time() - self.t0, 3) if self.t0 else 0.0
        tot["events"] = list(self.events)
        return tot


# ====================================================================== CLI


def settings_from_pki(pki: Path, accounts: Sequence[str], host: str, port: int,
                      ca_file: Path | None, tls: bool = True,
                      bus: str = "mosquitto") -> list[MqttSettings]:
    """MQTT settings for ``accounts`` whose passwords a ``tools.certs`` store holds."""
    out = []
    for a in accounts:
        pw_file = pki / "clients" / a / "password"
        try:
            pw = pw_file.read_text().strip()
        except OSError as exc:
            raise SimError(f"no password for {a} in {pki}: {exc}") from exc
        out.append(MqttSettings(host=host, port=port, username=a, password=pw, tls=tls,
                                ca_file=ca_file or (pki / "ca.crt"), client_id=a,
                                keepalive_s=10, session_expiry_s=0, clean_start=True,
                                max_inflight=100,  # the broker's own limit
                                protocol=protocol_for_bus(bus)))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.simulate",
                                 description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--nodes", type=int, default=100)
    ap.add_argument("--rate", type=float, default=1.0, help="reports per node per second")
    ap.add_argument("--duration", type=float, default=60.0, help="seconds")
    ap.add_argument("--regions", type=int, default=4)
    ap.add_argument("--sites-per-region", type=int, default=4)
    ap.add_argument("--peers", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--node-prefix", default="vn")
    ap.add_argument("--day-s", type=float, default=86400.0, help="simulated day length, s")
    ap.add_argument("--degrade", action="append", default=[], metavar="at=,dur=,site=,...")
    ap.add_argument("--disconnect", action="append", default=[], metavar="at=,dur=,site=")
    ap.add_argument("--broker-host", default="127.0.0.1")
    ap.add_argument("--broker-port", type=int, default=8883)
    ap.add_argument("--no-tls", action="store_true")
    ap.add_argument("--bus", choices=BUSES, default="mosquitto",
                    help="mosquitto (MQTT 5) or nats (MQTT 3.1.1 to a NATS node)")
    ap.add_argument("--ca-file", type=Path, default=None)
    ap.add_argument("--pki", type=Path, default=Path("run/pki"),
                    help="tools.certs directory holding the sim accounts' passwords")
    ap.add_argument("--accounts", default="sim-0", help="comma list of sim-* accounts")
    ap.add_argument("--shard", default="0/1", help="i/n: run connections k with k %% n == i")
    ap.add_argument("--max-pending", type=int, default=2000,
                    help="unacknowledged QoS 1 reports per connection before it waits")
    ap.add_argument("--client", choices=("lean", "paho"), default="lean",
                    help="publisher: lean (tools.publisher, default) or paho "
                    "(edge_agent.wire.mqtt)")
    ap.add_argument("--ack-account", default="",
                    help="a sim-* account to hear the core's end-to-end acks on: each node "
                         "then keeps its reports until acknowledged, as the agent does")
    ap.add_argument("--drain", type=float, default=60.0,
                    help="with --ack-account: seconds after --duration to finish resending")
    ap.add_argument("--registry-out", type=Path, default=None,
                    help="write the fleet's node registry (YAML) here and continue")
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING if a.quiet else logging.INFO,
                        format="%(asctime)s %(name)s %(message)s")
    try:
        cfg = SimConfig(
            nodes=a.nodes, rate=a.rate, duration_s=a.duration, regions=a.regions,
            sites_per_region=a.sites_per_region, peers=a.peers, seed=a.seed,
            node_prefix=a.node_prefix, day_s=a.day_s,
            degradations=tuple(parse_degradation(d) for d in a.degrade),
            disconnects=tuple(parse_disconnect(d) for d in a.disconnect),
        )
        world = World(cfg)
        if a.registry_out is not None:
            a.registry_out.write_text(world.registry_yaml())
        si, _, sn = a.shard.partition("/")
        conns = settings_from_pki(a.pki, [x for x in a.accounts.split(",") if x],
                                  a.broker_host, a.broker_port, a.ca_file, tls=not a.no_tls,
                                  bus=a.bus)
        acks = settings_from_pki(a.pki, [a.ack_account], a.broker_host, a.broker_port,
                                 a.ca_file, tls=not a.no_tls, bus=a.bus)[0] \
            if a.ack_account else None
        sim = Simulator(world, conns, shard=(int(si), int(sn or 1)), max_pending=a.max_pending,
                        client=a.client, acks=acks, drain_s=a.drain if acks else 0.0)
        summary = sim.run()
    except (SimError, ValueError) as exc:
        print(f"simulate: {exc}", flush=True)
        return 2
    except KeyboardInterrupt:
        return 130
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
