"""Console requests published with retain, on the clustered bus (NATS): refused live, and
removed from the bus's retained store.

On Mosquitto the core subscribes to console requests with *retain-as-published*, so a
request sent with the retain flag shows it when delivered live, and is refused and
audited (:meth:`cloud_core.console.service.ConsoleService.handle_message`). NATS's MQTT
listener speaks 3.1.1, which has no such option: the live copy arrives without the flag.
The bus keeps its own record, though. nats-server stores a retained PUBLISH in the
account's ``$MQTT_rmsgs`` stream, under ``$MQTT.rmsgs.<subject>``, and waits for
JetStream's acknowledgement of that store *before* it delivers the message to any
subscriber (``mqttHandlePubRetain`` is called from ``processInboundClientMsg`` after the
permission check, and ``mqttJSA.storeMsg`` is a request that waits for the stream's
answer; server/client.go and server/mqtt.go, v2.15.3). So when a console request reaches
the core, the stream's last message on that request's subject is this very request if,
and only if, it was published with retain (or an identical retained one is still
stored; the envelope's correlation data and expiry make every console request's bytes
unique).

:class:`RetainedStore` asks that stream, over the core's native NATS connection
(``$JS.API.STREAM.MSG.GET.$MQTT_rmsgs`` with ``last_by_subj``), before a request is
handled. A request found there is refused as retained, like on Mosquitto, and its stored
copy is deleted (``$JS.API.STREAM.MSG.DELETE.$MQTT_rmsgs``, that sequence only): a core
that subscribes later is handed nothing, and nothing is left on the bus. nats-server
fills its in-memory retained cache only when a new subscription loads a retained
message; a later load of a deleted one finds it gone and drops it from the server's map
(``loadRetainedMessages``). A request replayed from the store (3.1.1 marks those
retained) is refused anyway and deleted the same way.

If the stream does not answer (no JetStream leader, the connection down) the request is
refused with that reason, never run on a guess: the operator sends it again.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import ssl
import threading
from collections.abc import Coroutine
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, TypeVar

from cloud_core.errors import CoreError
from edge_agent.wire.mqtt import unwrap

log = logging.getLogger(__name__)

RETAINED_STREAM = "$MQTT_rmsgs"  # nats-server's mqttRetainedMsgsStreamName
RETAINED_PREFIX = "$MQTT.rmsgs."  # mqttRetainedMsgsStreamSubject
MSG_GET = f"$JS.API.STREAM.MSG.GET.{RETAINED_STREAM}"
MSG_DELETE = f"$JS.API.STREAM.MSG.DELETE.{RETAINED_STREAM}"
JS_NO_MESSAGE_FOUND = 10037  # JSNoMessageFoundErr, server/errors.json
CHECK_TIMEOUT_S = 3.0
CONNECT_TIMEOUT_S = 10.0
# The most a stored retained message may be for the core to read it: the wire's payload
# cap with room for the envelope. Bigger is not a console request the core would run.
MAX_STORED_BYTES = 300 * 1024

T = TypeVar("T")


class RetainedCheckError(CoreError):
    """The bus's retained store could not be asked (its stream or the connection)."""


class Verdict(Enum):
    LIVE = "live"  # not in the retained store: an ordinary request
    RETAINED = "retained"  # published with retain: refused, its stored copy deleted


@dataclass(frozen=True, slots=True)
class NatsLogin:
    """Where and as whom the core opens its native NATS connection."""

    urls: tuple[str, ...]
    username: str
    password: str | None
    ca_file: Path | None = None


def topic_subject(topic: str) -> str:
    """The NATS subject NATS's MQTT listener maps a concrete topic to (``/`` -> ``.``,
    a ``.`` inside a level -> ``//``), as :func:`cloud_core.bus_nats.topic_to_subject`."""
    return ".".join(level.replace(".", "//") for level in topic.split("/"))


def stored_payload(answer: dict[str, Any]) -> tuple[int, bytes] | None:
    """(sequence, payload) of a ``STREAM.MSG.GET`` answer; None for "no message".
    Anything else that is not a well-formed stored message is a :class:`RetainedCheckError`."""
    err = answer.get("error")
    if err:
        code = err.get("err_code") if isinstance(err, dict) else None
        if code == JS_NO_MESSAGE_FOUND:
            return None
        raise RetainedCheckError(f"{RETAINED_STREAM}: {err}")
    msg = answer.get("message")
    if not isinstance(msg, dict) or not isinstance(msg.get("seq"), int):
        raise RetainedCheckError(f"{RETAINED_STREAM}: an answer without a message")
    data = msg.get("data") or ""
    if not isinstance(data, str) or len(data) > MAX_STORED_BYTES * 4 // 3 + 4:
        raise RetainedCheckError(f"{RETAINED_STREAM}: a stored message too large to be a request")
    try:
        return int(msg["seq"]), base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise RetainedCheckError(f"{RETAINED_STREAM}: undecodable message: {exc}") from exc


def same_request(stored: bytes, payload: bytes, correlation_data: bytes | None) -> bool:
    """Whether the stored retained payload is the request the core received (the client
    unwraps the 3.1.1 envelope: compare what it carries, not the raw bytes)."""
    body, corr, _expiry = unwrap(stored)
    return bool(stored) and body == payload and corr == correlation_data


class RetainedStore:
    """The core's view of NATS's retained store for console requests (module docstring).

    Its own native connection on a thread with its own asyncio loop (nats-py is
    asyncio-only); :meth:`check` is called from the console's worker threads and blocks
    for one round trip (two when it deletes)."""

    def __init__(self, login: NatsLogin, timeout_s: float = CHECK_TIMEOUT_S) -> None:
        if not login.urls:
            raise RetainedCheckError("the retained-request check needs the servers' NATS URLs")
        self.login = login
        self.timeout_s = timeout_s
        self.refused = 0  # requests found in the retained store
        self.deleted = 0  # stored copies deleted
        self.failures = 0  # checks the store did not answer
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever,
                                        name="cfnet-nats-retained", daemon=True)
        self._nc: Any = None
        self._connecting: asyncio.Lock | None = None

    def start(self) -> None:
        """Start the loop and connect now, so the first request does not wait for a TLS
        connect (a failure here is logged; the first check connects again)."""
        self._thread.start()

        async def warm() -> None:
            try:
                await self._conn()
            except Exception as exc:  # the bus not up yet: the first check tries again
                log.info("retained-store connection not up yet: %s", exc or type(exc).__name__)

        asyncio.run_coroutine_threadsafe(warm(), self._loop)

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        if self._nc is not None:
            try:
                self._run(self._nc.close(), 5.0)
            except RetainedCheckError as exc:
                log.debug("closing the retained-store connection: %s", exc)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    def check(self, topic: str, payload: bytes, correlation_data: bytes | None) -> Verdict:
        """Whether the request on ``topic`` was published with retain; its stored copy is
        deleted when it was. :class:`RetainedCheckError` when the store cannot tell."""
        try:
            verdict: Verdict = self._run(self._check(topic, payload, correlation_data),
                                         self.timeout_s * 2 + CONNECT_TIMEOUT_S)
        except RetainedCheckError:
            self.failures += 1
            raise
        if verdict is Verdict.RETAINED:
            self.refused += 1
        return verdict

    # ------------------------------------------------------------------ internals
    def _run(self, coro: Coroutine[Any, Any, T], timeout_s: float) -> T:
        if not self._thread.is_alive():
            coro.close()
            raise RetainedCheckError("the retained-store connection is not running")
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return fut.result(timeout_s)
        except RetainedCheckError:
            raise
        except Exception as exc:  # timeout, connection refused, no responders
            fut.cancel()
            raise RetainedCheckError(f"the bus's retained store did not answer: "
                                     f"{exc or type(exc).__name__}") from exc

    async def _conn(self) -> Any:
        if self._connecting is None:  # made on the loop's own thread, the only one using it
            self._connecting = asyncio.Lock()
        async with self._connecting:  # one connection, however many checks wait for it
            if self._nc is not None and not self._nc.is_closed:
                return self._nc
            self._nc = await self._connect()
            return self._nc

    async def _connect(self) -> Any:
        import nats

        s = self.login
        tls = None
        if any(u.startswith("tls://") for u in s.urls):
            tls = ssl.create_default_context(cafile=str(s.ca_file) if s.ca_file else None)

        async def error(exc: Exception) -> None:
            log.info("NATS (retained store): %s", exc or type(exc).__name__)

        return await nats.connect(
            servers=list(s.urls), user=s.username, password=s.password, tls=tls,
            name=f"{s.username}-console", inbox_prefix=f"_INBOX_{s.username}".encode(),
            max_reconnect_attempts=-1, reconnect_time_wait=0.5,
            connect_timeout=CONNECT_TIMEOUT_S, allow_reconnect=True, error_cb=error)

    async def _api(self, subject: str, body: dict[str, Any]) -> dict[str, Any]:
        nc = await self._conn()
        msg = await nc.request(subject, json.dumps(body).encode(), timeout=self.timeout_s)
        try:
            answer = json.loads(msg.data)
        except ValueError as exc:
            raise RetainedCheckError(f"{subject}: not JSON") from exc
        if not isinstance(answer, dict):
            raise RetainedCheckError(f"{subject}: not a JSON object")
        return answer

    async def _check(self, topic: str, payload: bytes,
                     correlation_data: bytes | None) -> Verdict:
        found = stored_payload(await self._api(
            MSG_GET, {"last_by_subj": RETAINED_PREFIX + topic_subject(topic)}))
        if found is None or not same_request(found[1], payload, correlation_data):
            return Verdict.LIVE
        seq = found[0]
        answer = await self._api(MSG_DELETE, {"seq": seq})
        err = answer.get("error")
        if err and not (isinstance(err, dict) and err.get("err_code") == JS_NO_MESSAGE_FOUND):
            # Refused all the same; the copy stays until the operator clears it.
            log.warning("retained request on %s: deleting its stored copy (seq %d): %s",
                        topic, seq, err)
        else:
            self.deleted += 1
            log.info("retained request on %s: deleted its stored copy (seq %d)", topic, seq)
        return Verdict.RETAINED
