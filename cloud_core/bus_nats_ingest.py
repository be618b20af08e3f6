"""Shared ingest on the clustered bus (NATS JetStream): the engine splits reports among replicas.

NATS's MQTT listener grants ``$share/...`` subscriptions but delivers nothing to them, so
on ``--bus nats`` a core's ``$share/<group>/<filter>`` subscription is served here
instead, over a native NATS connection: a JetStream stream ``CFNET_INGEST`` captures
every node's telemetry and status subjects (what the agents publish over MQTT lands on
those subjects), replicated on ``replicas`` servers, and each shared filter is a
*durable pull consumer* ``<group>-<leaf>`` that all replicas of the group fetch from.
JetStream hands each message to one fetcher; a message a replica fetched but never
acknowledged (it died) is delivered again, to whichever replica fetches next, after
``ack_wait_s``: a dead replica's share is taken over within that time, and its queued
backlog with it. The consumer is durable, so reports published while every replica is
down wait in the stream (``max_age_s``) instead of being lost.

A fetched batch is acknowledged to JetStream *before* it goes to the core, and each
acknowledgement is confirmed by the server (``ack_sync``, JetStream's double ack): only
what the server confirmed within ``ack_wait_s`` (less half a second) of the fetch goes on. JetStream
therefore never redelivers a report a replica has folded (a redelivery after a replica's
death carries only what it never saw), and a slow replica's batch is not handed to a
second one while the first still folds it. What is fetched but not confirmed in time is
dropped here and counted (``unconfirmed``): either JetStream redelivers it to a replica
or, its ack having landed after all, the agent resends it, missing the core's end-to-end
ack. As for MQTT in :mod:`cloud_core.mqtt_process`, the JetStream ack promises nothing
about the fold: what an agent waits for is the core's end-to-end ack.

The fetchers fetch only while the core keeps up: while more than a batch waits in the
child for the core (``backlog``), they wait, so a replica that folds slower than its
share arrives leaves the rest in the stream for the others instead of queueing it in
memory, acknowledged and unfolded. How far ingest is behind the bus is measured on every
batch (``lag_ms``: how long the last fetched report waited in the stream; ``behind``:
reports still waiting for the group) and said in the log once it passes ``LAG_WARN_S``.

The same connection carries the replicas' digests (``cfnet/v1/core/+/digest``:
:meth:`SharedIngest.add_plain` subscribes, :meth:`SharedIngest.publish` sends, at most
once, as MQTT QoS 0 did): core NATS fails over in about a second, an MQTT session only
after JetStream's leader elections, and while the digests stop the replicas fold only as
owners (:mod:`cloud_core.ownership`).

This runs in the core's MQTT child process, on a thread with its own asyncio loop
(nats-py, the NATS project's own Python client, is asyncio-only).

The edge sites' sources of the stream are kept by :mod:`cloud_core.bus_nats_sites`
(:class:`~cloud_core.bus_nats_sites.SourceResumer`, run beside the fetchers).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import threading
import time
from collections.abc import Callable
from typing import Any

from cloud_core.bus_nats import (
    STREAM,
    STREAM_SUBJECTS,
    NatsIngestError,
    NatsIngestSettings,
    consumer_name,
    subject_to_topic,
    topic_to_subject,
)
from cloud_core.bus_nats_sites import SourceResumer

log = logging.getLogger(__name__)

FETCH_BATCH = 512
ACK_MARGIN_S = 0.5
# Ingest this far behind the bus is said in the log (at most every LAG_LOG_S): past the
# agents' resend time (10 s) every late report comes twice and the load grows with it.
LAG_WARN_S = 5.0
LAG_LOG_S = 10.0
# A report delivered again, or this long in the stream, is handed on marked late: it waited
# out a stream's or consumer's leader election (a bus node's death), when the stream can hold
# two copies of one report and two replicas can fetch them at once.
LATE_S = 3.0


class SharedIngest:
    """Fetches shared filters from JetStream and hands each message to ``deliver``."""

    def __init__(self, settings: NatsIngestSettings,
                 deliver: Callable[[str, bytes, bool], None],
                 backlog: Callable[[], int] = lambda: 0) -> None:
        if not settings.urls:
            raise NatsIngestError("shared ingest on NATS needs the servers' NATS URLs")
        self.settings = settings
        self.deliver = deliver
        self.backlog = backlog  # messages handed over and not yet taken by the core
        self._shares: list[tuple[str, str]] = []
        self._plain: list[str] = []  # ordinary filters served on this connection (digests)
        self._nc: Any = None
        self._linked = threading.Event()  # the NATS connection itself is up
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._connected = threading.Event()
        self.fetched = 0
        self.errors = 0
        self.unconfirmed = 0  # fetched, JetStream ack not confirmed in time: dropped here
        self.lag_ms = 0  # how long the last fetched report waited in the stream
        self.behind = 0  # reports still waiting in the stream for the group, then
        self._warned = 0.0
        self.resumer: SourceResumer | None = None

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    @property
    def linked(self) -> bool:
        """The NATS connection is up (the plain subscriptions and :meth:`publish` work),
        whether or not JetStream answers yet."""
        return self._linked.is_set()

    def stats(self) -> dict[str, int]:
        """The fetchers' counters and gauges, for the core's metrics."""
        return {"fetched": self.fetched, "unconfirmed": self.unconfirmed,
                "errors": self.errors, "lag_ms": self.lag_ms, "behind": self.behind}

    def edge_counts(self) -> dict[str, dict[str, int]]:
        """The edge sites' counters (:meth:`SourceResumer.counts`); empty before it runs."""
        r = self.resumer
        return r.counts() if r is not None else {}

    def add(self, group: str, topic_filter: str) -> None:
        """Serve ``$share/<group>/<topic_filter>`` (before :meth:`start`)."""
        subject = topic_to_subject(topic_filter)
        if subject not in STREAM_SUBJECTS:
            raise NatsIngestError(f"{topic_filter!r} is not in the {STREAM} stream")
        self._shares.append((group, topic_filter))

    def add_plain(self, topic_filter: str) -> None:
        """Serve the ordinary (not shared) subscription ``topic_filter`` on this connection
        (before :meth:`start`): core NATS, which fails over in about a second, where an
        MQTT session waits for JetStream's leader elections after a bus node's death."""
        self._plain.append(topic_filter)

    def publish(self, topic: str, payload: bytes) -> bool:
        """Publish at most once on this connection (any thread); False while it is down."""
        loop, nc = self._loop, self._nc
        if loop is None or nc is None or not self._linked.is_set():
            return False
        try:
            asyncio.run_coroutine_threadsafe(nc.publish(topic_to_subject(topic), payload), loop)
        except RuntimeError:  # the loop closed meanwhile
            return False
        return True

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="cfnet-nats-ingest",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    # ------------------------------------------------------------------ internals

    def _run(self) -> None:
        # A first connection that fails (no server reachable yet) is tried again, as
        # the client itself retries once connected.
        while not self._stopping.is_set():
            try:
                asyncio.run(self._main())
            except Exception as exc:
                self.errors += 1
                self._linked.clear()
                log.warning("NATS shared ingest: %s; retrying in 1 s", exc)
                self._stopping.wait(1.0)

    def _tls(self) -> ssl.SSLContext | None:
        if not any(u.startswith("tls://") for u in self.settings.urls):
            return None
        ca = self.settings.ca_file
        return ssl.create_default_context(cafile=str(ca) if ca else None)

    async def _main(self) -> None:
        import nats
        from nats.js.api import (
            AckPolicy,
            ConsumerConfig,
            DeliverPolicy,
            DiscardPolicy,
            StorageType,
            StreamConfig,
        )
        from nats.js.errors import NotFoundError

        s = self.settings

        async def disconnected() -> None:
            self._connected.clear()
            self._linked.clear()

        async def reconnected() -> None:
            self._connected.set()
            self._linked.set()

        async def error(exc: Exception) -> None:
            # nats-py's default prints a traceback per failed reconnect attempt (a
            # killed node is tried again and again): one line, the client retries.
            log.info("NATS: %s", exc or type(exc).__name__)

        nc = await nats.connect(
            servers=list(s.urls), user=s.username, password=s.password, tls=self._tls(),
            name=s.username, inbox_prefix=f"_INBOX_{s.username}".encode(),
            max_reconnect_attempts=-1, reconnect_time_wait=0.5, connect_timeout=5,
            allow_reconnect=True, disconnected_cb=disconnected, reconnected_cb=reconnected,
            error_cb=error)
        self._loop, self._nc = asyncio.get_running_loop(), nc

        async def plain(msg: Any) -> None:
            self.deliver(subject_to_topic(msg.subject), msg.data, False)

        for filt in self._plain:  # first: they need no JetStream
            await nc.subscribe(topic_to_subject(filt), cb=plain)
        self._linked.set()
        js = nc.jetstream(timeout=10)
        while not self._stopping.is_set():
            try:
                await js.stream_info(STREAM)
                break
            except NotFoundError:
                try:
                    await js.add_stream(StreamConfig(
                        name=STREAM, subjects=list(STREAM_SUBJECTS), num_replicas=s.replicas,
                        storage=StorageType.FILE, max_age=s.max_age_s, max_bytes=s.max_bytes,
                        discard=DiscardPolicy.OLD))
                    break
                except Exception as exc:  # another replica created it meanwhile, or no quorum
                    log.info("creating stream %s: %s; retrying", STREAM, exc)
            except Exception as exc:  # JetStream not ready yet (leader election)
                log.info("stream %s not reachable yet: %s", STREAM, exc)
            await asyncio.sleep(0.5)
        subs = []
        for group, filt in self._shares:
            cfg = ConsumerConfig(
                durable_name=consumer_name(group, filt), ack_policy=AckPolicy.EXPLICIT,
                ack_wait=s.ack_wait_s, max_ack_pending=s.max_ack_pending,
                deliver_policy=DeliverPolicy.NEW, filter_subject=topic_to_subject(filt))
            while not self._stopping.is_set():
                try:
                    subs.append(await js.pull_subscribe(
                        topic_to_subject(filt), durable=cfg.durable_name, stream=STREAM,
                        config=cfg))
                    break
                except Exception as exc:
                    log.info("consumer %s not ready: %s; retrying", cfg.durable_name, exc)
                    await asyncio.sleep(0.5)
        self._connected.set()
        log.info("shared ingest: %s on %s", ", ".join(consumer_name(g, f)
                                                      for g, f in self._shares), STREAM)
        tasks = [self._fetch(p) for p in subs]
        if s.resume_sources or s.sites:
            if self.resumer is None:  # kept across reconnects: its rate limit and counts
                self.resumer = SourceResumer(nc, s)
            self.resumer.nc = nc
            tasks.append(self.resumer.run(self._stopping))
        try:
            await asyncio.gather(*tasks)
        finally:
            self._connected.clear()
            self._linked.clear()
            # Closed, not drained: a drain waited the client's 30 s for the pull
            # subscriptions' queues (and the core's stop gave up after 10 s); every ack that
            # matters was confirmed already (ack_sync).
            await nc.close()

    async def _fetch(self, psub: object) -> None:
        from nats.errors import TimeoutError as NatsTimeout

        # Confirmed later than this after the fetch began, a message may already be with
        # another replica: JetStream redelivers ack_wait_s after the delivery, which came
        # after the fetch began (less a margin for the server's own delay).
        trust_s = max(self.settings.ack_wait_s - ACK_MARGIN_S, self.settings.ack_wait_s / 2)
        while not self._stopping.is_set():
            if self.backlog() > FETCH_BATCH:
                await asyncio.sleep(0.02)  # the core is behind: leave the rest to others
                continue
            t0 = time.monotonic()
            try:
                msgs = await psub.fetch(FETCH_BATCH, timeout=0.5)  # type: ignore[attr-defined]
            except (TimeoutError, NatsTimeout):
                continue
            except Exception as exc:  # a node went away: the client reconnects
                self.errors += 1
                log.debug("fetch failed: %s", exc)
                await asyncio.sleep(0.2)
                continue
            confirmed = await asyncio.gather(*(self._ack(m, trust_s) for m in msgs))
            late = time.monotonic() - t0 > trust_s
            for m, ok in zip(msgs, confirmed, strict=True):
                if ok and not late:
                    self.deliver(subject_to_topic(m.subject), m.data, self._late(m))
                    self.fetched += 1
                else:
                    self.unconfirmed += 1
            # A redelivery waited ack_wait in the stream by design: the lag is measured on
            # the newest first delivery only.
            first = [m for m in msgs if getattr(m.metadata, "num_delivered", 1) == 1]
            if first:
                self._measure(first[-1], late)

    @staticmethod
    def _late(m: Any) -> bool:
        """Delivered again, or waited in the stream past ``LATE_S``: a copy of it may be
        with another replica (cloud_core/ownership.py folds such a report at its node's
        owner only)."""
        try:
            md = m.metadata
            return int(md.num_delivered) > 1 or time.time() - md.timestamp.timestamp() > LATE_S
        except (AttributeError, TypeError, ValueError):  # no JetStream metadata
            return False

    @staticmethod
    async def _ack(m: Any, timeout_s: float) -> bool:
        try:
            await m.ack_sync(timeout=timeout_s)
        except Exception:  # no confirmation: redelivered, or resent by its agent
            return False
        return True

    def _measure(self, m: Any, late: bool) -> None:
        try:
            md = m.metadata
            self.behind = int(md.num_pending)
            self.lag_ms = max(0, int((time.time() - md.timestamp.timestamp()) * 1000))
        except (AttributeError, TypeError, ValueError):  # no JetStream metadata
            return
        now = time.monotonic()
        if (self.lag_ms > LAG_WARN_S * 1000 or late) and now - self._warned > LAG_LOG_S:
            self._warned = now
            log.warning(
                "shared ingest behind the bus: the last report waited %.1f s in %s, %d more "
                "wait, %d dropped unconfirmed so far%s; the replicas together fold less than "
                "the fleet sends (add replicas or CPU)", self.lag_ms / 1000, STREAM,
                self.behind, self.unconfirmed,
                " (this batch's acks confirmed too late)" if late else "")
