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

A digest goes out only while the bus connection is up (``publish_once``), so what a
replica folded just before its connection died is named in the first digest on its new
one (cloud_core/mqtt_process.py starts the connection again). Nothing comes back to the
other replicas meanwhile: on NATS a replica folds only what JetStream confirmed
acknowledged (cloud_core/bus_nats_ingest.py), so nothing it folded is redelivered, and
its end-to-end acks wait for the new connection too (cloud_core/acks.py), so the agents
resend nothing it folded unless it stays away longer than their ``resend_s``.

While the digests cannot flow (a replica's connection down or just back, a peer's digests
overdue), only a node's owner folds its reports, once the peers' digests have named what
they folded (:mod:`cloud_core.ownership`). For that a digest goes out every interval, an
empty one included, and says the sender's interval (``every``), whether it still holds
reports back (``holding``) and which chunk is the interval's last (``last``).
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


def encode_digests(items: list[dict[str, Any]], limit: int = MAX_DIGEST_BYTES,
                   every_s: float = 1.0, holding: bool = False) -> list[bytes]:
    """Items split into JSON messages of at most ``limit`` bytes each; at least one (an
    empty digest says the replica is there). Each says the sender's digest interval
    (``every``) and whether it holds reports back (``holding``: cloud_core/ownership.py),
    the last one of an interval ``"last":true`` (the fold gate waits for a whole digest).

    msgspec encodes (dataclasses such as ``Resources`` included) several times
    faster than ``json.dumps`` of ``asdict``: at 5,000 nodes a second the
    digest would otherwise cost a replica a fifth of a core.
    """
    enc = msgspec.json.Encoder()
    head = (b'{"v":1,"every":' + enc.encode(float(every_s)) + b',"holding":'
            + enc.encode(holding) + b',"items":[')
    chunks: list[list[bytes]] = [[]]
    size = 0
    for it in items:
        b = enc.encode(it)
        if chunks[-1] and size + len(b) + 48 > limit:
            chunks.append([])
            size = 0
        chunks[-1].append(b)
        size += len(b) + 1
    return [head + b",".join(c) + (b']}' if i < len(chunks) - 1 else b'],"last":true}')
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
    ) -> None:
        self.replica = replica
        self.gate = gate
        self.state = state
        state.share_seqs = True  # each digest names the seqs folded here (state.py)
        self.mqtt = mqtt
        self.interval_s = interval_s
        self._clock = clock
        self._since = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
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
        if not self.mqtt.connected:
            return 0
        now = self._clock()
        # Read before the export: a replica that stops holding folds what it held first,
        # so the digest that says so names all of it (cloud_core/ownership.py).
        holding = self.gate.holding if self.gate is not None else False
        items = self.state.export_local(self._since, now)
        for payload in encode_digests(items, every_s=self.interval_s, holding=holding):
            self.mqtt.publish(digest_topic(self.replica), payload, qos=0)
        self._since = now
        self.sent_items += len(items)
        return len(items)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
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
        except (WireError, KeyError, ValueError, TypeError, msgspec.DecodeError) as exc:
            self.bad_items += 1
            log.warning("bad digest on %.80s: %s", m.topic, exc)
            return
        self.bad_items += self.state.merge(items, self._clock())
        self.merged_items += len(items)
        if self.gate is not None:  # after the merge: its seqs are marked seen by now
            self.gate.peer_heard(sender, every, complete=body.get("last", True) is True,
                                 holding=body.get("holding", False) is True)
