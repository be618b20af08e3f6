"""Replicas that split ingest (MQTT ``$share``) tell each other what they took in.

With a shared subscription the broker hands each report to one replica only,
so no replica's state would hold the whole fleet. Each replica therefore
publishes, once per ``interval``, a digest of the nodes and links it ingested
itself since the last one — the latest values only, so a digest costs far
less to fold in than the reports it summarises — on
``cfnet/v1/core/<replica>/digest``; every replica folds the others' digests
into its state. The leader's state thus converges to the whole fleet while
parsing and validation stay split.

Each item also names the seqs the replica folded in the last ``NAME_FOR_S`` (15 s,
cloud_core/state.py) (``seqs``: ranges per boot, bounded; each seq in every digest for
15 s, longer than the agents' resend time, so digests lost while a replica's connection
was away lose none). A replica marks them seen without folding them, so a report
that reaches it later anyway (the bus redelivered it after the first replica's
acknowledgement was lost, or the agent resent it because the core's ack was) is
acknowledged as a duplicate there, not folded a second time.

A digest goes out only while its connection is up (``publish_once``), so what a
replica folded just before its connection died is named in the first digest on its new
one (cloud_core/mqtt_process.py starts the connection again). On NATS the digests travel
on the core's native NATS connection, the one its shared ingest fetches on, not on its
MQTT session: core NATS fails over to another server in about a second, while an MQTT
session there waits for JetStream's leader elections after a bus node's death (4-9 s,
docs/nats.md), long enough for a peer to take a replica as gone. The fold gate still
watches the MQTT session too (cloud_core/service.py). Nothing comes back to the
other replicas meanwhile: on NATS a replica folds only what JetStream confirmed
acknowledged (cloud_core/bus_nats_ingest.py), so nothing it folded is redelivered, and
its end-to-end acks wait for the new connection too (cloud_core/acks.py), so the agents
resend nothing it folded unless it stays away longer than their ``resend_s``.

While the digests cannot flow (a replica's connection down or just back, a peer's digests
overdue), only a node's owner folds its reports, once the peers' digests have named what
they folded (:mod:`cloud_core.ownership`). For that a digest goes out every interval, an
empty one included, and says the sender's interval (``every``), whether it still holds
reports back (``holding``), its number (``n``), the last number it heard from each peer
(``heard``) and which chunk is the interval's last (``last``).

Across a disturbance the digests also go out promptly, not only once per interval: when
this replica's gate starts or stops holding (its wait began, or it released what it held)
and when a whole digest arrives from a peer that holds (it may be waiting for ours to name
its latest). A wait thus ends within a few deliveries of the connection's return instead of
two or three digest intervals, and the peers stop dropping this replica's nodes as soon as
it is calm: every second of a disturbance is a second of reports dropped by a non-owner,
which their agents resend only after their ``resend_s``, and an agent whose reports all go
unacknowledged for ``resend_s`` takes the core as away and backs off its resends (10, 20,
40 s: edge_agent/outbox.py). Prompt digests are at most ``ANSWER_GAP_S`` apart.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import msgspec

from cloud_core.ownership import FoldGate
from cloud_core.state import ClusterState
from edge_agent.wire import MAX_PAYLOAD_BYTES, WireError, digest_topic, split_topic
from edge_agent.wire.bus import Bus, Message

log = logging.getLogger(__name__)

# Below the broker's packet limit (272 KiB) with room to spare.
MAX_DIGEST_BYTES = 200 * 1024
MAX_HEARD = 64  # replicas a digest's ``heard`` may name (the fold gate tracks 32 at most)
MAX_CHUNKS = 1024  # chunks of one digest, at most (200 MiB)
# Prompt digests (see the module docstring) at most this often: two holding replicas answer
# each other's digests, and this bounds that exchange to a few digests a second.
ANSWER_GAP_S = 0.2
LOOK_S = 0.05  # how often the digest thread looks for a reason to publish early


def encode_digests(items: list[dict[str, Any]], limit: int = MAX_DIGEST_BYTES,
                   every_s: float = 1.0, holding: bool = False, n: int | None = None,
                   heard: dict[str, int] | None = None) -> list[bytes]:
    """Items split into JSON messages of at most ``limit`` bytes each; at least one (an
    empty digest says the replica is there). Each says the sender's digest interval
    (``every``), whether it holds reports back (``holding``: cloud_core/ownership.py), the
    digest's number (``n``) and the last number the sender heard from each peer
    (``heard``); numbered, each chunk its index (``chunk``), the last one of an interval
    ``"last":true`` and the count (``chunks``): the fold gate waits for a whole digest, and
    a replica whose subscription came back in the middle of one has not heard it whole.

    msgspec encodes (dataclasses such as ``Resources`` included) several times
    faster than ``json.dumps`` of ``asdict``: at 5,000 nodes a second the
    digest would otherwise cost a replica a fifth of a core.
    """
    enc = msgspec.json.Encoder()
    numbered = b"" if n is None else (b',"n":' + enc.encode(n) + b',"heard":'
                                       + enc.encode(heard or {}))
    head = (b'{"v":1,"every":' + enc.encode(float(every_s)) + b',"holding":'
            + enc.encode(holding) + numbered)
    chunks: list[list[bytes]] = [[]]
    size = 0
    for it in items:
        b = enc.encode(it)
        if chunks[-1] and size + len(b) + 48 > limit:
            chunks.append([])
            size = 0
        chunks[-1].append(b)
        size += len(b) + 1
    last = b'],"last":true' + (b"}" if n is None else b',"chunks":' + enc.encode(len(chunks))
                               + b"}")
    return [head + (b"" if n is None else b',"chunk":' + enc.encode(i)) + b',"items":['
            + b",".join(c) + (b"]}" if i < len(chunks) - 1 else last)
            for i, c in enumerate(chunks)]


class DigestExchange:
    def __init__(
        self,
        replica: str,
        state: ClusterState,
        mqtt: Bus,
        interval_s: float = 1.0,
        clock: Callable[[], float] = time.time,
        gate: FoldGate | None = None,
        connected: Callable[[], bool] | None = None,
    ) -> None:
        self.replica = replica
        # Whether the digests' connection is up (on NATS the native one: cloud_core/service.py).
        self._connected = connected or (lambda: mqtt.connected)
        self.gate = gate
        self.state = state
        state.share_seqs = True  # each digest names the seqs folded here (state.py)
        self.mqtt = mqtt
        self.interval_s = interval_s
        self._clock = clock
        self._since = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # sender -> (the number of its digest being received, the chunks of it received)
        self._chunks: dict[str, tuple[int, set[int]]] = {}
        # A whole digest from a peer that holds arrived since our last digest: answer it.
        self._answer = threading.Event()
        self._said_holding = False  # what our last digest said
        self.sent_digests = 0
        self.prompt_digests = 0  # of those, sent before their interval was up
        self.sent_items = 0
        self.merged_items = 0
        self.bad_items = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="cfnet-digest", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def publish_once(self) -> int:
        if not self._connected():
            return 0
        now = self._clock()
        # Read before the export: a replica that stops holding folds what it held first,
        # so the digest that says so names all of it (cloud_core/ownership.py).
        n, holding, heard = (self.gate.next_digest() if self.gate is not None
                             else (None, False, None))
        items = self.state.export_local(self._since, now)
        # Cleared before the publish: a holding peer's digest arriving from here on is
        # answered by the next one (ours may have gone out before it heard that digest).
        self._answer.clear()
        for payload in encode_digests(items, every_s=self.interval_s, holding=holding, n=n,
                                      heard=heard):
            self.mqtt.publish(digest_topic(self.replica), payload, qos=0)
        self._since = now
        self._said_holding = holding
        self.sent_digests += 1
        self.sent_items += len(items)
        return len(items)

    def prompt(self) -> bool:
        """Whether a digest is due before its interval: the gate started or stopped holding
        since our last digest, or a holding peer's whole digest awaits an answer."""
        if self.gate is None or not self._connected():
            return False
        return self._answer.is_set() or self.gate.holding != self._said_holding

    def _run(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(LOOK_S):
            try:
                now = time.monotonic()
                due = now - last >= self.interval_s
                if not due and now - last >= ANSWER_GAP_S and self.prompt():
                    due = True
                    self.prompt_digests += 1
                if due:
                    last = now
                    self.publish_once()
                    if self.gate is not None:
                        self.gate.tick()
            except Exception:
                log.exception("digest publish failed")

    def handle(self, m: Message) -> None:
        try:
            _area, sender, _leaf = split_topic(m.topic)
            if sender == self.replica:
                return  # our own digest, echoed back
            if len(m.payload) > MAX_PAYLOAD_BYTES:
                raise WireError("oversized", f"{len(m.payload)} bytes")
            # JSON as load_json reads it (NaN and Infinity refused), compiled.
            body = msgspec.json.decode(m.payload)
            items = body["items"] if isinstance(body, dict) else None
            if not isinstance(items, list):
                raise WireError("schema", "digest without items")
            every = float(body.get("every", self.interval_s))
            if not 0 < every <= 60:
                raise WireError("schema", f"digest interval {every!r} out of (0, 60] s")
            n, heard_me = _numbers(body, self.replica)
            whole = self._whole(sender, n, body)
        except (WireError, KeyError, ValueError, TypeError, msgspec.DecodeError) as exc:
            self.bad_items += 1
            log.warning("bad digest on %.80s: %s", m.topic, exc)
            return
        self.bad_items += self.state.merge(items, self._clock())
        self.merged_items += len(items)
        if self.gate is not None:  # after the merge: its seqs are marked seen by now
            holding = body.get("holding", False) is True
            self.gate.peer_heard(sender, every, complete=whole, holding=holding, n=n,
                                 heard_me=heard_me)
            if whole and holding:
                self._answer.set()  # it may be waiting for a digest of ours that heard it


    def _whole(self, sender: str, n: int, body: dict[str, Any]) -> bool:
        """Whether this chunk completes a digest every chunk of which arrived here (QoS 0:
        a chunk is lost with a connection, or sent before a subscription came back). A
        sender that numbers nothing: its last chunk completes it, as before."""
        chunk, chunks = body.get("chunk"), body.get("chunks")
        if chunk is None:
            return body.get("last", True) is True
        if type(chunk) is not int or not 0 <= chunk < MAX_CHUNKS:
            raise WireError("schema", f"digest chunk index {chunk!r}")
        got_n, got = self._chunks.get(sender, (n, set()))
        if got_n != n:
            got = set()
        if sender in self._chunks or len(self._chunks) < MAX_HEARD:
            self._chunks[sender] = (n, got)
        got.add(chunk)
        return body.get("last") is True and chunks == len(got)


def _numbers(body: dict[str, Any], me: str) -> tuple[int, int | None]:
    """A digest's number and the number of ``me``'s digest its sender last heard (0: none
    yet); ``None`` for the latter from a sender that numbers nothing. Bounded: a ``heard``
    of more than ``MAX_HEARD`` replicas is refused."""
    n, heard = body.get("n", 0), body.get("heard")
    if type(n) is not int:
        raise WireError("schema", "digest number not an integer")
    if heard is None:
        return n, None
    if not isinstance(heard, dict) or len(heard) > MAX_HEARD:
        raise WireError("schema", "digest's heard not a map of at most "
                        f"{MAX_HEARD} replicas")
    mine = heard.get(me, 0)
    if type(mine) is not int:
        raise WireError("schema", "digest's heard number not an integer")
    return n, mine
