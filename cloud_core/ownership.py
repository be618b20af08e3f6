"""Which replica folds a report while the replicas cannot hear each other: one owner per node.

Replicas that split ingest (``$share`` on Mosquitto, the shared JetStream consumer on NATS)
fold whatever the bus hands them, and their digests' seqs (:mod:`cloud_core.replicas`)
make a later copy of a report a duplicate at every other replica. That holds while the
digests flow. Across a bus disturbance they do not: a replica's own connection is down or
just back, or a peer's digests are overdue (its connection died). Then two copies of one
report (a JetStream redelivery after a stream's or consumer's leader election, a publish
the bus stored twice, an agent's resend of a report whose ack died with a connection) can
reach two replicas before either names it, and both would fold it.

While disturbed, :class:`FoldGate` gives each node one owner, the same on every replica: the
replicas it knows (itself and every peer whose digest it heard) sorted, indexed by the CRC-32
of the node id. A report of a node this replica owns is **held**, neither folded nor
acknowledged, until every peer it waits for has sent a complete digest exported after it
heard this replica say it holds (so every seq that peer folded before it is known here,
marked seen, and from then on the peer leaves this replica's nodes to it); then it is
folded, or taken as the duplicate it turned out to be. Digests are numbered, and each
names the last number it heard from every peer (``n``, ``heard``): a wait that begins
before our next digest ends with a peer's digest that heard that one or a later one, never
with one already under way when the wait began (it could have been exported just before
the peer folded a copy of a held report). A replica's first
connection is not a disturbance: a fresh replica has folded nothing. A report of a node
another replica owns is **dropped** unacknowledged: its agent resends it after its
``resend_s`` (10 s), when the disturbance is usually over, and whichever replica then takes
it folds it once (the digests' seqs, named for 15 s, tell every replica what the others
folded). Both copies of a report thus reach one replica's fold at most: the owner's, where
the local dedupe takes the second. Nothing is lost: a held report is folded or acknowledged
as a duplicate, a dropped one is resent by its agent.

A replica still holding says so in its digests (``holding``): until it stops, a calm
replica drops the reports of the nodes it owns too, so that a copy reaching the calm one
is not folded while the owner's held copy waits for its release (each released report
is folded before the next digest says the owner is calm, so that digest names it).

On NATS a report that waited out a stream's or consumer's leader election (delivered again,
or ``LATE_S`` in the stream: :mod:`cloud_core.bus_nats_ingest`) comes marked late: the
stream may hold a second copy, which another replica may fetch at the same moment, after
the replicas' connections came back and their digests flow again. A late report disturbs
as a reconnection does: every peer's next digest is awaited, and meanwhile only owners
fold (the peers see late reports of the same moment too).

On NATS the MQTT session's return comes while the streams may still hand out fresh copies
of reports published during their leader elections (an agent's publish and its resend after
the server gave up storing the first): for ``settle_s`` after its own connection returns a
replica stays disturbed however soon the peers answer (cloud_core/service.py sets it on NATS;
0 on Mosquitto, which holds no such copies). The digests that end a wait go out promptly
(:mod:`cloud_core.replicas`), so without it a wait ends within a few deliveries.

A peer waited for longer than ``forget_s`` is taken as gone (a replica that died whole: its
state died with it) and leaves the ownership; what it owned is held or folded here from
then on. A replica whose own connection comes back and that knows no peer listens for ``listen_s``
for the peers' digests, holding what it owns meanwhile.

Bounded: at most ``max_held`` reports held; past it a report is dropped unacknowledged
(resent by its agent). At most ``max_peers`` replicas tracked; a digest from one more sender
is refused (it neither joins the ownership nor ends a wait). Every hold, release, drop and
refusal is counted (:meth:`FoldGate.counts`).
"""

from __future__ import annotations

import threading
import time
import zlib
from collections.abc import Callable

from edge_agent.wire import TelemetryReport

# A peer's digests are overdue past this many of its digest intervals (it says its interval
# in each digest).
OVERDUE_INTERVALS = 2.5
FORGET_S = 8.0  # a peer waited for this long is taken as gone
LISTEN_S = 2.5  # after this replica's own (re)connection, before it folds alone
LOOK_S = 0.1  # how often the ingest path looks at the peers' digests' ages
MAX_HELD = 100_000
# Replicas this one keeps track of, at most: a digest from one more sender (a misconfigured
# or hostile core account) is refused and counted, not tracked.
MAX_PEERS = 32

FOLD, HOLD, DROP = "fold", "hold", "drop"


class FoldGate:
    """Decides, per report, fold now / hold for the peers' digests / drop for the owner.

    Thread-safe: ingest calls :meth:`check` on the bus's thread, the digest exchange
    :meth:`peer_heard`, :meth:`tick` and :attr:`holding` on its own. Held reports are
    folded under the gate's lock (``fold`` takes the state's and the acks' locks, which
    never wait on the gate), so that no digest says "calm" before they are in state.
    """

    def __init__(self, me: str, fold: Callable[[TelemetryReport], object], *,
                 connected: Callable[[], bool], connects: Callable[[], int] = lambda: 0,
                 clock: Callable[[], float] = time.monotonic, forget_s: float = FORGET_S,
                 listen_s: float = LISTEN_S, max_held: int = MAX_HELD,
                 max_peers: int = MAX_PEERS, settle_s: float = 0.0) -> None:
        self.me = me
        self._fold = fold
        self._connected = connected
        self._connects = connects
        self._clock = clock
        self.forget_s, self.listen_s, self.max_held = forget_s, listen_s, max_held
        self.max_peers, self.settle_s = max_peers, settle_s
        self._lock = threading.Lock()
        # peer -> (heard at, its digest interval, still holding by its last digest, the
        # number of its last digest)
        self._peers: dict[str, tuple[float, float, bool, int]] = {}
        # peer -> (waited for since, the digest of ours it must have heard: one sent after
        # the wait began, which said this replica holds)
        self._waiting: dict[str, tuple[float, int]] = {}
        # This replica's digests are numbered (unique across its restarts), and each names the
        # last number it heard from every peer: a peer's digest that names one of ours sent
        # after a wait began was itself exported after the peer knew we hold.
        self._n = int(time.time() * 1000)
        self._listen_until = 0.0
        self._settle_until = 0.0  # disturbed until then, however soon the peers answer
        self._seen_connects = 0
        self._was_up = False
        self._armed = False  # from the first connection on: a fresh replica folds at once
        self._members = [me]  # sorted: this replica and its peers
        self._look_at = 0.0  # the next look at overdue and forgotten peers
        self._held: list[TelemetryReport] = []
        self._held_keys: set[tuple[str, str, int]] = set()
        self.held = 0  # reports held for the peers' digests
        self.released = 0  # held reports handed to the fold
        self.dropped_owner = 0  # dropped: another replica owns the node
        self.dropped_full = 0  # dropped: max_held reached
        self.forgotten = 0  # peers taken as gone
        self.late = 0  # disturbances begun by a late report
        self.peers_refused = 0  # digests from a sender past max_peers, not tracked

    # ------------------------------------------------------------------ decisions

    def owner(self, node: str) -> str:
        """The replica that owns ``node`` among the replicas known here."""
        with self._lock:
            return self._owner(node)

    def _owner(self, node: str) -> str:
        members = self._members
        return members[zlib.crc32(node.encode()) % len(members)] if len(members) > 1 \
            else self.me

    def _set_peers(self) -> None:
        self._members = sorted({self.me, *self._peers})

    def check(self, r: TelemetryReport, *, late: bool = False) -> str:
        """FOLD (fold it now), HOLD (kept: folded once the peers are heard) or DROP.
        ``late``: the bus says a copy of this report may be with another replica (NATS: it
        waited out a leader election in the stream), which disturbs as a reconnect does."""
        with self._lock:
            now = self._clock()
            # On the ingest path: the peers are looked at every LOOK_S, the own connection
            # on every report (its loss is what must stop the fold at once).
            if now >= self._look_at or not self._connected() \
                    or self._connects() != self._seen_connects:
                self._update(now)
            if late and self._armed and self._peers and not self._disturbed():
                self._wait_all(now)
                self.late += 1
            if not self._disturbed():
                if len(self._members) == 1:
                    return FOLD
                owner = self._owner(r.node)
                if owner == self.me or not self._peers[owner][2]:
                    return FOLD
                self.dropped_owner += 1  # its owner still holds: the copy is its to fold
                return DROP
            if self._owner(r.node) != self.me:
                self.dropped_owner += 1
                return DROP
            key = (r.node, r.boot, r.seq)
            if key in self._held_keys:
                return HOLD  # the copy held already answers for this one
            if len(self._held) >= self.max_held:
                self.dropped_full += 1
                return DROP
            self._held.append(r)
            self._held_keys.add(key)
            self.held += 1
            return HOLD

    def peer_heard(self, peer: str, interval_s: float, *, complete: bool = True,
                   holding: bool = False, n: int = 0, heard_me: int | None = None) -> None:
        """A digest from ``peer`` arrived (``complete``: its last chunk for this interval;
        ``holding``: the peer is still holding reports itself; ``n``: its number;
        ``heard_me``: the number of our last digest the peer had heard, None from a peer
        that does not say)."""
        with self._lock:
            now = self._clock()
            # Own connection first: a digest on a connection just back answers the wait
            # that connection began, not one begun after it.
            self._update(now)
            prev = self._peers.get(peer)
            known = prev is not None
            if not known and len(self._peers) >= self.max_peers:
                self.peers_refused += 1
                return
            if not complete:
                # A peer counts as calm only from a whole digest saying so: the chunks of
                # the one that says it stopped holding name what it released, and a copy
                # folded here before the last of them arrived would be folded beside its
                # released twin. A chunk that says "holding" is taken at once.
                holding = holding or (prev[2] if prev is not None else True)
            self._peers[peer] = (now, interval_s, holding, n)
            if not known:
                self._set_peers()
            if complete:
                wait = self._waiting.get(peer)
                if wait is None or heard_me is None or heard_me >= wait[1]:
                    self._waiting.pop(peer, None)
                self._listen_until = 0.0
            self._update(now)

    def next_digest(self) -> tuple[int, bool, dict[str, int]]:
        """For the digest about to go out: its number, whether it says this replica holds,
        and the last number heard from each peer; taken together, so that a digest numbered
        after a wait began says "holding"."""
        with self._lock:
            self._update(self._clock())
            self._n += 1
            return (self._n, self._disturbed() or bool(self._held),
                    {p: v[3] for p, v in self._peers.items()})

    def tick(self) -> None:
        """Looked at once per digest interval: overdue peers, forgotten ones, releases."""
        with self._lock:
            self._update(self._clock())

    @property
    def disturbed(self) -> bool:
        """This replica's own connection is down or just back, or a peer is overdue."""
        with self._lock:
            self._update(self._clock())
            return self._disturbed()

    @property
    def holding(self) -> bool:
        """Disturbed, or reports still held (what this replica's digest says)."""
        with self._lock:
            self._update(self._clock())
            return self._disturbed() or bool(self._held)

    def counts(self) -> dict[str, int]:
        with self._lock:
            return {"held": self.held, "released": self.released,
                    "dropped_owner": self.dropped_owner, "dropped_full": self.dropped_full,
                    "peers_forgotten": self.forgotten, "late": self.late,
                    "peers_refused": self.peers_refused,
                    "holding": len(self._held)}

    # ------------------------------------------------------------------ internals

    def _disturbed(self) -> bool:
        if not self._armed:
            return False
        now = self._clock()
        return bool(self._waiting) or now < self._listen_until or now < self._settle_until \
            or not self._was_up

    def _wait_all(self, now: float) -> None:
        """Every peer's next complete digest awaited, one that has heard our next."""
        self._waiting = {p: (now, self._n + 1) for p in self._peers}

    def _update(self, now: float) -> None:
        """Own connection, overdue and forgotten peers; folds the held reports once calm."""
        self._look_at = now + LOOK_S
        up, connects = self._connected(), self._connects()
        if not self._armed:
            # A fresh replica has folded nothing a peer could fold again: it folds from its
            # first connection on, and the gate watches from then.
            self._armed = self._was_up = up
            self._seen_connects = connects
            return
        if not up or connects != self._seen_connects:
            # Down, or back since the last look: every peer's next digest is awaited,
            # counted from the (re)connection, and a replica with no peers known listens.
            self._seen_connects = connects
            self._wait_all(now)
            self._listen_until = now + self.listen_s
            self._settle_until = now + self.settle_s
        self._was_up = up
        for p, (heard, interval, _h, _n) in self._peers.items():
            if p not in self._waiting and now - heard > OVERDUE_INTERVALS * interval:
                self._waiting[p] = (now, self._n + 1)
        for p, (since, _need) in list(self._waiting.items()):
            if now - since > self.forget_s:
                del self._waiting[p]
                self._peers.pop(p, None)
                self._set_peers()
                self.forgotten += 1
        if self._held and not self._disturbed():
            held, self._held, self._held_keys = self._held, [], set()
            self.released += len(held)
            for r in held:
                self._fold(r)
