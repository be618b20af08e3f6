"""JSON over keep-alive HTTP(S) to the Kubernetes API server: ``LeanHTTP``.

Every call of cfnet's Kubernetes client goes over ``LeanHTTP``: ``http.client`` keep-alive
connections from a shared pool, bodies encoded and decoded with msgspec. The generated
``kubernetes`` client is not on any request path: its serialisation, header and response
handling cost more CPU than the request itself (a 5,000-node list took 0.50 s through it,
0.23 s here).

Answers that are not 2xx become ``cloud_core.errors.KubeError`` subclasses (``api_error``:
409 → ``KubeConflict``, 410 → ``KubeGone``, 401/403 → ``KubeForbidden``, 404 →
``KubeNotFound``, no answer / 5xx / 429 → ``KubeUnavailable``); answers with Retry-After are
sent again first, as client-go does.
"""

from __future__ import annotations

import http.client
import logging
import select
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlencode

import msgspec

from cloud_core.errors import (
    KubeConflict,
    KubeError,
    KubeForbidden,
    KubeGone,
    KubeNotFound,
    KubeUnavailable,
)
from cloud_core.k8s.endpoint import TOKEN_REREAD_S, Endpoint

log = logging.getLogger(__name__)

JSON = dict[str, Any]

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"

encode_json = msgspec.json.Encoder().encode
decode_json = msgspec.json.Decoder().decode

# Answers that carry Retry-After are sent again, as client-go does (its maxRetries is 10);
# the total wait per call is bounded too, so a throttled caller is slowed, never stalled.
RETRY_AFTER_TRIES = 10
RETRY_AFTER_BUDGET_S = 10.0


def api_error(status: int, body: bytes | str | None, what: str) -> KubeError:
    reason, message = "", ""
    try:
        st = decode_json(body or b"{}")
        reason, message = str(st.get("reason", "")), str(st.get("message", ""))
    except (ValueError, AttributeError):
        message = (body.decode(errors="replace") if isinstance(body, bytes) else str(body))[:300]
    text = f"{what}: HTTP {status} {reason}: {message}".strip()
    if status == 409:
        return KubeConflict(text, status, reason)
    if status == 410:
        return KubeGone(text, status, reason)
    if status in (401, 403):
        return KubeForbidden(text, status, reason)
    if status == 404:
        return KubeNotFound(text, status, reason)
    if status == 429 or status >= 500:
        return KubeUnavailable(text, status, reason)
    return KubeError(text, status, reason)


def _closed_by_peer(c: http.client.HTTPConnection) -> bool:
    """An idle kept-alive connection with something to read has been closed by the server
    (EOF) or is out of step with it: either way not one to send a request on (urllib3's
    ``is_connection_dropped``). A never-connected one connects when used."""
    sock = c.sock
    if sock is None:
        return False
    try:
        p = select.poll()
        p.register(sock, select.POLLIN)
        return bool(p.poll(0))
    except (OSError, ValueError):
        return True


def _retry_after_s(value: str) -> float | None:
    """Seconds from a ``Retry-After`` header as client-go reads it (an integer; anything
    else, e.g. an HTTP date, is not a retry), at least 0 and at most the whole budget."""
    v = value.strip()
    if not v or len(v) > 8 or not v.isascii() or not v.lstrip("-").isdigit():
        return None
    return float(min(max(int(v), 0), int(RETRY_AFTER_BUDGET_S) + 1))


def query_string(query: Mapping[str, Any]) -> str:
    """``query`` as the API server reads it: booleans lower-case, None left out."""
    return urlencode([(k, str(v).lower() if isinstance(v, bool) else str(v))
                      for k, v in query.items() if v is not None])


class _NamedTLSConnection(http.client.HTTPSConnection):
    """HTTPS whose certificate is checked against ``server_name`` (kubeconfig's
    ``tls-server-name``) instead of the host it connects to, as client-go does."""

    def __init__(self, host: str, *, server_name: str, timeout: float,
                 context: ssl.SSLContext) -> None:
        super().__init__(host, timeout=timeout, context=context)
        self._server_name = server_name
        self._tls = context

    def connect(self) -> None:
        http.client.HTTPConnection.connect(self)  # TCP; TLS below, with the other name
        self.sock = self._tls.wrap_socket(self.sock, server_hostname=self._server_name)


class LeanHTTP:
    """JSON over keep-alive HTTPS with ``http.client``, from a shared pool of connections.

    A caller takes an idle connection (or opens one) and gives it back: the first bindings of
    a burst go out on the connection already open instead of waiting for a TLS handshake
    per thread; the pool grows to the callers' concurrency and keeps at most ``max_idle``.
    """

    def __init__(self, endpoint: Endpoint, timeout_s: float) -> None:
        self.endpoint = endpoint
        host = endpoint.host
        https = host.startswith("https://")
        hostport = host.split("://", 1)[-1].rstrip("/")
        self.prefix = ""
        if "/" in hostport:
            hostport, rest = hostport.split("/", 1)
            self.prefix = "/" + rest
        self._hostport = hostport
        self.timeout_s = timeout_s
        self._ctx: ssl.SSLContext | None = None
        if https:
            try:
                self._ctx = endpoint.ssl_context()
            except (OSError, ValueError) as e:  # ssl.SSLError is an OSError
                raise KubeError(f"TLS set-up for {host}: {e}") from e
        self._idle: list[http.client.HTTPConnection] = []
        self.max_idle = 64
        self._lock = threading.Lock()
        self._auth: tuple[float, str | None] = (-1e9, None)
        self.stats = {"retried": 0}  # requests sent again because the answer said Retry-After

    def _authorization(self) -> str | None:
        ep = self.endpoint
        if ep.token:
            return f"Bearer {ep.token}"
        if ep.auth is None and not ep.token_file:
            return None
        now = time.monotonic()
        at, value = self._auth
        if now - at > (1.0 if ep.auth is not None else TOKEN_REREAD_S):
            if ep.auth is not None:
                value = ep.auth()
            else:
                try:
                    with open(str(ep.token_file)) as f:
                        value = f"Bearer {f.read().strip()}"
                except OSError as e:
                    log.warning("token file %s unreadable (%s); keeping the last token",
                                ep.token_file, e)
            self._auth = (now, value)
        return value

    def headers(self, body: bool, content_type: str = "application/json") -> dict[str, str]:
        h = {"Accept": "application/json", "User-Agent": "cfnet-scheduler"}
        if body:
            h["Content-Type"] = content_type
        auth = self._authorization()
        if auth:
            h["Authorization"] = auth
        return h

    def connect(self, timeout_s: float | None = None) -> http.client.HTTPConnection:
        """A new connection of its own (a watch keeps one for its whole stream)."""
        t = self.timeout_s if timeout_s is None else timeout_s
        if self._ctx is not None and self.endpoint.server_name:
            return _NamedTLSConnection(self._hostport, server_name=self.endpoint.server_name,
                                       timeout=t, context=self._ctx)
        if self._ctx is not None:
            return http.client.HTTPSConnection(self._hostport, timeout=t, context=self._ctx)
        return http.client.HTTPConnection(self._hostport, timeout=t)

    def _take(self) -> tuple[http.client.HTTPConnection, bool]:
        """A connection and whether it was kept alive from an earlier call. Idle connections
        the server has closed meanwhile are dropped, not handed out: Go's transport notices
        a closed idle connection on its own (a reader per connection), ``http.client`` only
        when it is used, and after an API server restart every idle one is dead."""
        while True:
            with self._lock:
                if not self._idle:
                    break
                c = self._idle.pop()
            if _closed_by_peer(c):
                c.close()
                continue
            return c, True
        return self.connect(), False

    def _give(self, c: http.client.HTTPConnection) -> None:
        with self._lock:
            if len(self._idle) < self.max_idle:
                self._idle.append(c)
                return
        c.close()

    def call(self, method: str, path: str, body: bytes | None,
             content_type: str = "application/json",
             timeout_s: float | None = None, *,
             retry_after: bool = True) -> tuple[int, bytes]:
        """One request. A kept-alive connection that fails (the server closed it meanwhile,
        or restarted) is dropped and the request sent once more on a new one, as Go's
        net/http does; the callers' requests are idempotent or guarded (bindings carry a UID
        precondition, events unique names). A timeout is not retried; ``timeout_s`` (a
        slow call, e.g. a collection delete) holds for this call only.

        An answer with ``Retry-After`` is sent again after that many seconds, as client-go's
        ``checkWait`` does: a 429 for any method (API Priority and Fairness refused it before
        running it), a 5xx for a GET only (a write the server may have run is the caller's
        to retry), at most ``RETRY_AFTER_TRIES`` times and ``RETRY_AFTER_BUDGET_S`` of
        waiting in all; the last answer is returned. ``retry_after=False`` returns the first
        answer (an eviction a disruption budget refuses is a 429 with Retry-After: 10, which
        the re-planner retries on its own clock)."""
        waited = 0.0
        for tries in range(RETRY_AFTER_TRIES + 1):
            status, data, after = self._call_once(method, path, body, content_type, timeout_s)
            if tries == RETRY_AFTER_TRIES or not retry_after or after is None or not (
                    status == 429 or (status >= 500 and method == "GET")):
                break
            wait = _retry_after_s(after)
            if wait is None or waited + wait > RETRY_AFTER_BUDGET_S:
                break
            self.stats["retried"] += 1
            log.info("%s %s: HTTP %d, retrying after %.0f s as the server asks", method,
                     path.split("?", 1)[0], status, wait)
            time.sleep(wait)
            waited += wait
        return status, data

    def _call_once(self, method: str, path: str, body: bytes | None, content_type: str,
                   timeout_s: float | None) -> tuple[int, bytes, str | None]:
        """One request (and its resend on a stale kept-alive connection): the status, the
        body and the ``Retry-After`` header of a non-2xx answer."""
        headers = self.headers(body is not None, content_type)
        for attempt in (0, 1):
            # the resend goes over a new connection: another idle one may be as stale
            c, reused = self._take() if not attempt else (self.connect(), False)
            t = self.timeout_s if timeout_s is None else timeout_s
            c.timeout = t
            if c.sock is not None:
                c.sock.settimeout(t)
            try:
                c.request(method, self.prefix + path, body=body, headers=headers)
                resp = c.getresponse()
                data = resp.read()
            except (OSError, http.client.HTTPException) as e:
                c.close()
                if reused and not attempt and not isinstance(e, TimeoutError):
                    continue
                raise KubeUnavailable(f"{method} {path}: {type(e).__name__}: {e}") from e
            if resp.will_close:
                c.close()
            else:
                self._give(c)
            after = None if 200 <= resp.status <= 299 else resp.getheader("Retry-After")
            return resp.status, data, after
        raise AssertionError("unreachable")

    def request(self, method: str, path: str, body: Any = None,
                content_type: str = "application/json", *, decode: bool = True,
                timeout_s: float | None = None, retry_after: bool = True,
                decoder: Callable[[bytes], Any] = decode_json) -> Any:
        """One call with a JSON body (or raw bytes); the decoded answer, or None with
        ``decode=False`` (an answer nobody reads is not parsed). ``decoder``: a lean schema's
        (``objects.Schema.page``) instead of the generic one."""
        raw = body if body is None or isinstance(body, bytes) else encode_json(body)
        status, data = self.call(method, path, raw, content_type, timeout_s,
                                 retry_after=retry_after)
        if not 200 <= status <= 299:
            raise api_error(status, data, f"{method} {path}")
        if not decode or not data:
            return None
        try:
            return decoder(data)
        except msgspec.DecodeError as e:
            raise KubeError(f"{method} {path}: the answer is not JSON: {e}", status) from e

    def close(self) -> None:
        with self._lock:
            conns, self._idle = self._idle, []
        for c in conns:
            c.close()
