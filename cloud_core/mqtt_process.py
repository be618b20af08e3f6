"""The core's MQTT connection in a child process, so receiving and ingesting run in parallel.

paho's receive path costs about 50 µs of Python per message, the core's
decode, validation and fold about 25 µs more. In one process they share one
GIL and one CPU: the core drained about half of what a bare paho loop
receives. Here the connection (``edge_agent.wire.mqtt.MqttClient``, unchanged)
lives in a child process that forwards messages to the core in batches over a
pipe, and takes the core's publishes the other way; the core spends its CPU
on ingest while the child spends another CPU on MQTT.

:class:`MqttProcess` is a :class:`edge_agent.wire.bus.Bus`, as ``MqttClient`` is
(``subscribe``, ``start``, ``stop``, ``connected``, ``wait_connected``,
``last_refusal``, ``publish`` returning a handle with ``wait`` and ``done``, and its
declared ``capabilities``).
Messages reach ``on_message`` in broker order, on one thread. The child
PUBACKs a QoS 1 message once it is queued for the core, not once it is folded
in, so the PUBACK promises nothing about ingest: a core SIGKILLed with reports
in the pipe has them PUBACKed and lost. What an agent waits for is the core's
end-to-end ack (``cloud_core/acks.py``), which the *parent* publishes after
the fold; a report lost in the pipe is never acked end to end, so the agent
resends it (see ``edge_agent/outbox.py``). A console request lost that way
gets no reply (``cfnetctl`` says so after its timeout; the operator runs it
again); the core's durable work (plans, placements) is journalled separately.

On the NATS bus (``nats``: :class:`cloud_core.bus_nats.NatsIngestSettings`), the
child serves ``$share/<group>/...`` subscriptions from a JetStream consumer shared by
the replicas (:mod:`cloud_core.bus_nats_ingest`) instead of MQTT, which on NATS has no
``$share``; those messages join the same batches. The replicas' digests go out and come in
on that native connection too, and :attr:`MqttProcess.digests_up` says whether it is up.

The child exits when the core asks, and on its own when the core goes away
(its end of the pipe closes), so a killed core leaves no orphan holding the
account's session. A child that exits unasked (SIGKILLed, out of memory), on either bus,
is started again, after 0.2 s and up to 10 s while it keeps dying young; every publish it had not
confirmed fails at once, so the core sends its end-to-end acks again
(``cloud_core/acks.py``) and its next digest names what it folded meanwhile
(``cloud_core/replicas.py``): a replica comes back as itself, its state kept, instead of
staying without a bus connection.
"""

from __future__ import annotations

import itertools
import logging
import os
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from cloud_core.errors import CoreError
from edge_agent.wire import DIGEST_WILDCARD, split_topic
from edge_agent.wire.bus import BusCapabilities, Message
from edge_agent.wire.logsetup import configure_child_logging
from edge_agent.wire.mqtt import MqttSettings

if TYPE_CHECKING:  # the NATS adapter (asyncio: 0.1 s of start-up) only when it is used
    from cloud_core.bus_nats import NatsIngestSettings

log = logging.getLogger(__name__)

# A batch goes to the core when it holds this many messages, or after this
# long: large enough to amortise the pipe, short enough to add no visible delay.
BATCH_MAX = 512
BATCH_WAIT_S = 0.002
# How often the child looks whether its edge sites' counters changed (and sends them).
EDGE_REPORT_S = 0.5
# With nothing to forward, the forwarder sleeps until a message arrives, looking at the
# connection's state and its parent this often: a fixed 2 ms poll woke it 500 times a second
# for nothing (about 15 ms of CPU a second, on the CPUs the API server shares).
IDLE_CHECK_S = 0.05

_Wire = tuple[str, bytes, int, bool, str | None, bytes | None, tuple[tuple[str, str], ...]]
# A publish the broker has not acknowledged after this long is reported failed,
# so one lost acknowledgement cannot hold up the ones behind it.
ACK_GIVE_UP_S = 60.0
# A child that exits unasked is started again after RESTART_MIN_S, the delay doubling up to
# RESTART_MAX_S while each lives less than RESTART_RESET_S (a crash loop is not a tight one).
RESTART_MIN_S = 0.2
RESTART_MAX_S = 10.0
RESTART_RESET_S = 30.0
COUNTERS = ("fetched", "unconfirmed", "errors")  # of SharedIngest.stats; the rest are gauges
LATE_PROPERTY = ("cfnet-late", "1")  # on a shared message that waited out a bus failover
LATE = (LATE_PROPERTY,)


def is_digest(topic: str) -> bool:
    """A replica's digest topic (``cfnet/v1/core/<replica>/digest``)."""
    try:
        area, _replica, leaf = split_topic(topic)
    except ValueError:
        return False
    return area == "core" and leaf == "digest"


class MqttProcessError(CoreError):
    """The MQTT child process could not be started or died."""


class RemoteHandle:
    """A QoS>0 publish made through the child; resolved when the broker acks it."""

    def __init__(self, token: int) -> None:
        self.token = token
        self._done = threading.Event()
        self._ok = False

    def resolve(self, ok: bool) -> None:
        self._ok = ok
        self._done.set()

    def wait(self, timeout_s: float) -> bool:
        """True once the broker acked the message; False on timeout or refusal."""
        return self._done.wait(timeout_s) and self._ok

    def done(self) -> bool:
        return self._done.is_set() and self._ok


class MqttProcess:
    """The core's :class:`~edge_agent.wire.bus.Bus`: an MqttClient in a child process."""

    def __init__(self, settings: MqttSettings,
                 on_message: Callable[[Message], None] | None = None,
                 nats: NatsIngestSettings | None = None) -> None:
        self.settings = settings
        self.nats = nats
        self._on_message = on_message
        self._subs: list[tuple[str, int, bool, bool]] = []
        self._proc: subprocess.Popen[bytes] | None = None
        self._cmd: Connection | None = None
        self._cmd_lock = threading.Lock()
        self._reader: threading.Thread | None = None
        self._life_lock = threading.Lock()  # start, stop and a dead child's restart
        self._stopping = threading.Event()
        self._started = 0.0
        self._restart_delay = RESTART_MIN_S
        self.restarts = 0  # children started again after an unasked exit
        self.connects = 0  # connections made
        self._connected = threading.Event()
        # The connection the replicas' digests travel on (cloud_core/ownership.py: the bus
        # came back): on NATS the shared ingest's native one, else the MQTT connection.
        self.digest_connects = 0
        self._digests_up = threading.Event()
        self._refusal = ""
        self._tokens = itertools.count(1)
        self._handles: dict[int, RemoteHandle] = {}
        self._handles_lock = threading.Lock()
        # The edge sites' counters of the child's shared ingest (bus_nats_sites.SourceResumer:
        # event -> site -> count), as last reported by the child.
        self.edge: dict[str, dict[str, int]] = {}
        # The shared ingest's counters and gauges (bus_nats_ingest.SharedIngest.stats), as
        # last reported by the child.
        self._ingest: dict[str, int] = {}
        self._ingest_before: dict[str, int] = {}  # counters of the children that died

    # ------------------------------------------------------------------ lifecycle

    def subscribe(self, topic: str, qos: int = 1, *, no_local: bool = False,
                  retain_as_published: bool = False) -> None:
        self._subs.append((topic, qos, no_local, retain_as_published))
        if self._cmd is not None:
            self._send(("sub", topic, qos, no_local, retain_as_published))

    def start(self) -> None:
        """Start the child (it connects in the background); returns at once."""
        with self._life_lock:
            if self._proc is not None and self._proc.poll() is None:
                return
            self._stopping.clear()
            self._spawn()

    def _spawn(self) -> None:
        # A fresh interpreter (python -m cloud_core.mqtt_process) rather than
        # multiprocessing: never fork a process that runs threads, and do not
        # re-import the parent's __main__ as spawn would.
        cmd_r, cmd_w = os.pipe()
        out_r, out_w = os.pipe()
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "cloud_core.mqtt_process", str(cmd_r), str(out_w)],
                pass_fds=(cmd_r, out_w), stdin=subprocess.DEVNULL, close_fds=True,
            )
        except OSError as exc:
            for fd in (cmd_r, cmd_w, out_r, out_w):
                os.close(fd)
            raise MqttProcessError(f"cannot start the MQTT process: {exc}") from exc
        os.close(cmd_r)
        os.close(out_w)
        self._proc = proc
        self._started = time.monotonic()
        with self._cmd_lock:
            self._cmd = Connection(cmd_w, readable=False)
        self._send(("init", self.settings, list(self._subs),
                    logging.getLogger().getEffectiveLevel(), self.nats))
        out = Connection(out_r, writable=False)
        self._reader = threading.Thread(target=self._read, args=(out, proc),
                                        name="cfnet-mqtt-reader", daemon=True)
        self._reader.start()

    def stop(self, *, graceful: bool = True) -> None:
        with self._life_lock:
            proc, self._proc = self._proc, None
            self._stopping.set()
        if proc is None:
            return
        self._send(("stop", graceful))
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            log.warning("MQTT process did not stop; killing it")
            proc.kill()
            proc.wait(timeout=5)
        if self._reader is not None:
            self._reader.join(timeout=5)
        self._close_cmd()
        self._connected.clear()
        self._digests_up.clear()
        self._fail_handles()

    def _close_cmd(self) -> None:
        with self._cmd_lock:
            if self._cmd is not None:
                self._cmd.close()
                self._cmd = None

    def _fail_handles(self) -> None:
        with self._handles_lock:
            handles, self._handles = self._handles, {}
        for h in handles.values():
            h.resolve(False)

    def _child_died(self, proc: subprocess.Popen[bytes]) -> None:
        """The child exited unasked (SIGKILLed, out of memory, a bug): what it held is
        gone, so every publish it had not confirmed fails now (the end-to-end acks among
        them are sent again: cloud_core/acks.py), and a new child starts after a short,
        growing delay. The replica comes back as itself, its state kept: its next digest
        names what it folded before (cloud_core/replicas.py)."""
        self._connected.clear()
        self._digests_up.clear()
        self._fail_handles()
        for k in COUNTERS:
            self._ingest_before[k] = self._ingest_before.get(k, 0) + self._ingest.get(k, 0)
        self._ingest = {}
        rc = proc.wait()
        lived = time.monotonic() - self._started
        self._restart_delay = (RESTART_MIN_S if lived > RESTART_RESET_S
                               else min(RESTART_MAX_S, 2 * self._restart_delay))
        self.restarts += 1
        log.error("MQTT process exited unexpectedly (rc %s); starting it again in %.1f s",
                  rc, self._restart_delay)
        if self._stopping.wait(self._restart_delay):
            return
        with self._life_lock:
            if self._proc is not proc:  # stopped (or started again) meanwhile
                return
            self._close_cmd()
            try:
                self._spawn()
            except MqttProcessError as exc:
                log.error("%s; the core stays without a bus connection", exc)

    @property
    def ingest(self) -> dict[str, int]:
        """The shared ingest's figures (``SharedIngest.stats``): its counters summed over
        every child this core started, its gauges as the running child last sent them."""
        out = dict(self._ingest)
        for k, v in self._ingest_before.items():
            out[k] = out.get(k, 0) + v
        return out

    @property
    def pid(self) -> int | None:
        """The child's process id while it runs (for CPU accounting and tests)."""
        return self._proc.pid if self._proc is not None else None

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    @property
    def capabilities(self) -> BusCapabilities:
        """Those of the child's MqttClient, with ``$share`` and edge sites on NATS (served
        from JetStream: :mod:`cloud_core.bus_nats_ingest`)."""
        v5, nats = self.settings.protocol == "mqtt5", self.nats is not None
        return BusCapabilities(mqtt5_properties=v5, shared_subscriptions=v5 or nats,
                               cheap_qos1_subscriptions=v5, edge_sites=nats)

    def edge_site_events(self) -> dict[str, dict[str, int]]:
        """The child's edge sites' counters (``bus_nats_sites.SourceResumer``), as it last
        sent them."""
        return self.edge

    @property
    def digests_up(self) -> bool:
        """The connection the replicas' digests travel on is up (on NATS the shared
        ingest's native one, which fails over without JetStream; else the MQTT one)."""
        return self._digests_up.is_set()

    def wait_connected(self, timeout_s: float) -> bool:
        return self._connected.wait(timeout_s)

    @property
    def last_refusal(self) -> str:
        return self._refusal

    # ------------------------------------------------------------------ publishing

    def publish(self, topic: str, payload: bytes, *, qos: int = 1, retain: bool = False,
                response_topic: str | None = None, correlation_data: bytes | None = None,
                message_expiry_s: int | None = None) -> RemoteHandle:
        h = RemoteHandle(next(self._tokens))
        if qos > 0:
            with self._handles_lock:
                self._handles[h.token] = h
        else:
            h.resolve(True)
        if not self._send(("pub", h.token, topic, payload, qos, retain, response_topic,
                           correlation_data, message_expiry_s)):
            self._resolve(h.token, False)
        return h

    # ------------------------------------------------------------------ internals

    def _send(self, cmd: tuple[Any, ...]) -> bool:
        with self._cmd_lock:
            if self._cmd is None:
                return False
            try:
                self._cmd.send(cmd)
            except (OSError, ValueError):
                return False
        return True

    def _resolve(self, token: int, ok: bool) -> None:
        with self._handles_lock:
            h = self._handles.pop(token, None)
        if h is not None:
            h.resolve(ok)

    def _read(self, conn: Connection, proc: subprocess.Popen[bytes]) -> None:
        on_message = self._on_message
        while True:
            try:
                kind, body = conn.recv()
            except (EOFError, OSError):
                break
            if kind == "msgs":
                if on_message is None:
                    continue
                for topic, payload, qos, retain, rt, cd, up in body:
                    try:
                        on_message(Message(topic, payload, qos, retain, rt, cd, up))
                    except Exception:
                        log.exception("MQTT handler failed")
            elif kind == "state":
                connected, refusal, linked = body
                self._refusal = refusal
                if connected:
                    if not self._connected.is_set():
                        self.connects += 1
                    self._connected.set()
                else:
                    self._connected.clear()
                if linked and not self._digests_up.is_set():
                    self.digest_connects += 1
                (self._digests_up.set if linked else self._digests_up.clear)()
            elif kind == "acks":
                for token, ok in body:
                    self._resolve(token, ok)
            elif kind == "edge":
                self.edge = body
            elif kind == "ingest":
                self._ingest = body
        conn.close()
        self._connected.clear()
        self._digests_up.clear()
        if self._proc is not proc:  # asked to stop
            return
        self._child_died(proc)


# ====================================================================== the child


def main(argv: list[str] | None = None) -> int:
    """The child: ``python -m cloud_core.mqtt_process <command fd> <output fd>``."""
    args = sys.argv[1:] if argv is None else argv
    cmd = Connection(int(args[0]), writable=False)
    out = Connection(int(args[1]), readable=False)
    try:
        kind, settings, subs, level, nats = cmd.recv()
    except (EOFError, OSError, ValueError):
        return 1
    if kind != "init":
        return 1
    configure_child_logging(level)  # the parent's --log-format (text or json lines)
    _Child(settings, subs, cmd, out, nats).run()
    return 0


class _Child:
    """Runs in the child: one MqttClient, a forwarder, an ack waiter, the command loop."""

    def __init__(self, settings: MqttSettings, subs: list[tuple[str, int, bool, bool]],
                 cmd: Connection, out: Connection, nats: NatsIngestSettings | None = None,
                 ) -> None:
        from cloud_core.bus_nats import parse_share
        from cloud_core.bus_nats_ingest import SharedIngest
        from edge_agent.wire.mqtt import MqttClient  # paho only in the child

        self.cmd, self.out = cmd, out
        self.inbox: deque[_Wire] = deque()
        self.inbox_ready = threading.Event()  # set when the inbox gets a message
        self.pending: deque[tuple[int, Any, float]] = deque()
        self.pending_ready = threading.Event()
        self.stopping = threading.Event()
        self.out_lock = threading.Lock()
        self.client = MqttClient(settings, on_message=self._on_message)
        self.shared: SharedIngest | None = None
        if nats is not None:
            self.shared = SharedIngest(nats, self._on_shared, backlog=self.inbox.__len__)
        for topic, qos, no_local, rap in subs:
            share = parse_share(topic) if self.shared is not None else None
            if share is not None and self.shared is not None:
                self.shared.add(*share)
            elif topic == DIGEST_WILDCARD and self.shared is not None:
                self.shared.add_plain(topic)  # the replicas' digests: on core NATS
            else:
                self.client.subscribe(topic, qos=qos, no_local=no_local,
                                      retain_as_published=rap)

    def _on_shared(self, topic: str, payload: bytes, late: bool = False) -> None:
        # A late report (bus_nats_ingest.LATE_S) carries LATE_PROPERTY: only this path sets
        # it, and the core reads it only on the NATS bus, where agents (MQTT 3.1.1) have no
        # user properties to forge it with.
        self.inbox.append((topic, payload, 1, False, None, None, LATE if late else ()))
        if not self.inbox_ready.is_set():
            self.inbox_ready.set()

    def _on_message(self, m: Message) -> None:
        # deque.append is atomic: no lock on paho's network thread (and the event is set
        # only when the forwarder may be asleep).
        self.inbox.append((m.topic, m.payload, m.qos, m.retain, m.response_topic,
                           m.correlation_data, m.user_properties))
        if not self.inbox_ready.is_set():
            self.inbox_ready.set()

    def _emit(self, kind: str, body: Any) -> bool:
        with self.out_lock:
            try:
                self.out.send((kind, body))
            except (OSError, ValueError):
                self.stopping.set()  # the core is gone
                return False
        return True

    def run(self) -> None:
        self.client.start()
        if self.shared is not None:
            self.shared.start()
        threads = [threading.Thread(target=self._forward, name="forward", daemon=True),
                   threading.Thread(target=self._acks, name="acks", daemon=True)]
        for t in threads:
            t.start()
        graceful = True
        try:
            while not self.stopping.is_set():
                try:
                    c = self.cmd.recv()
                except (EOFError, OSError):
                    break  # the core went away
                if c[0] == "pub":
                    _, token, topic, payload, qos, retain, rt, cd, exp = c
                    if self.shared is not None and qos == 0 and is_digest(topic):
                        self.shared.publish(topic, payload)
                        continue
                    try:
                        h = self.client.publish(topic, payload, qos=qos, retain=retain,
                                                response_topic=rt, correlation_data=cd,
                                                message_expiry_s=exp)
                    except Exception as exc:
                        log.warning("publish to %.80s failed: %s", topic, exc)
                        if qos > 0:
                            self._emit("acks", [(token, False)])
                        continue
                    if qos > 0:
                        self.pending.append((token, h, time.monotonic()))
                        self.pending_ready.set()
                elif c[0] == "sub":
                    self.client.subscribe(c[1], qos=c[2], no_local=c[3], retain_as_published=c[4])
                elif c[0] == "stop":
                    graceful = bool(c[1])
                    break
        finally:
            self.stopping.set()
            self.pending_ready.set()
            self.client.stop(graceful=graceful)
            if self.shared is not None:
                self.shared.stop()
            for t in threads:
                t.join(timeout=5)
            while self._flush():
                pass
            self.out.close()

    def _flush(self) -> int:
        batch: list[_Wire] = []
        inbox = self.inbox
        while inbox and len(batch) < BATCH_MAX:
            batch.append(inbox.popleft())
        if batch:
            self._emit("msgs", batch)
        return len(batch)

    def _forward(self) -> None:
        last_state: tuple[bool, str, bool] = (False, "", False)
        last_edge: dict[str, dict[str, int]] = {}
        last_ingest: dict[str, int] = {}
        next_edge = 0.0
        ppid = os.getppid()
        while not self.stopping.is_set():
            state = (self.client.connected, self.client.last_refusal,
                     self.shared.linked if self.shared is not None else self.client.connected)
            if state != last_state:
                last_state = state
                self._emit("state", state)
            if self.shared is not None and time.monotonic() >= next_edge:
                next_edge = time.monotonic() + EDGE_REPORT_S
                edge = self.shared.edge_counts()
                if edge != last_edge:
                    last_edge = edge
                    self._emit("edge", edge)
                ingest = self.shared.stats()
                if ingest != last_ingest:
                    last_ingest = ingest
                    self._emit("ingest", ingest)
            if self._flush() < BATCH_MAX:
                # asleep until a message arrives (or the next look at state and parent),
                # then a moment for the rest of a burst to join it
                if self.inbox or self.inbox_ready.wait(IDLE_CHECK_S):
                    time.sleep(BATCH_WAIT_S)
                self.inbox_ready.clear()
            if os.getppid() != ppid:  # re-parented: the core died without closing
                self.stopping.set()
                self.cmd.close()

    def _acks(self) -> None:
        # QoS 1 acks come back in order, so waiting on the oldest is enough.
        while not self.stopping.is_set() or self.pending:
            if not self.pending:
                self.pending_ready.wait(0.5)
                self.pending_ready.clear()
                continue
            token, h, t0 = self.pending[0]
            if h.wait(0.2) or self.stopping.is_set() \
                    or time.monotonic() - t0 > ACK_GIVE_UP_S:
                self.pending.popleft()
                self._emit("acks", [(token, h.done())])


if __name__ == "__main__":
    raise SystemExit(main())
