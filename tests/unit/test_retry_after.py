"""Answers with Retry-After are sent again, as client-go's checkWait does, within bounds.

Over a fake API server (a scripted ``http.server`` on loopback: an I/O edge). The same path
against the real API server, with API Priority and Fairness refusing the requests, is in
tests/k8s/test_apf.py.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cloud_core.errors import KubeUnavailable
from cloud_core.k8s import transport
from cloud_core.k8s.client import Endpoint, KubeClient, LeanHTTP

Answer = tuple[int, str | None]  # status, Retry-After (None: no header)


class FakeAPIServer(ThreadingHTTPServer):
    """A fake answering each request with the next scripted (status, Retry-After); 200 when
    the script is spent. Records the methods it was asked."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.script: list[Answer] = []
        self.seen: list[str] = []
        self.lock = threading.Lock()


class _Handler(BaseHTTPRequestHandler):
    server: FakeAPIServer
    protocol_version = "HTTP/1.1"

    def _answer(self) -> None:
        n = int(self.headers.get("Content-Length") or 0)
        if n:
            self.rfile.read(n)
        with self.server.lock:
            self.server.seen.append(self.command)
            status, after = self.server.script.pop(0) if self.server.script else (200, None)
        body = b'{"kind":"Status","reason":"TooManyRequests"}' if status != 200 else b'{"ok":1}'
        self.send_response(status)
        if after is not None:
            self.send_header("Retry-After", after)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[FakeAPIServer]:
    s = FakeAPIServer()
    t = threading.Thread(target=s.serve_forever, args=(0.02,), daemon=True)
    t.start()
    yield s
    s.shutdown()
    s.server_close()


@pytest.fixture
def lean(server: FakeAPIServer) -> Iterator[LeanHTTP]:
    h = LeanHTTP(Endpoint(host=f"http://127.0.0.1:{server.server_address[1]}"), 5.0)
    yield h
    h.close()


@pytest.mark.parametrize(("method", "script", "status", "asked"), [
    # APF refused it twice (not run): sent again until it is answered
    ("GET", [(429, "0"), (429, "0")], 200, 3),
    ("POST", [(429, "0"), (429, "0")], 200, 3),
    # a 5xx with Retry-After: a read is sent again, a write the server may have run is not
    ("GET", [(503, "0")], 200, 2),
    ("POST", [(503, "0")], 503, 1),
    ("PUT", [(500, "0")], 500, 1),
    # no header, or one that is not an integer number of seconds (client-go's reading)
    ("GET", [(429, None)], 429, 1),
    ("GET", [(429, "Wed, 21 Oct 2026 07:28:00 GMT")], 429, 1),
    ("GET", [(429, "1e3")], 429, 1),
    ("GET", [(429, "\u00b9")], 429, 1),  # "¹": isdigit() but not int(), nor Go's Atoi
    # more than the whole waiting budget: answered at once rather than stalling the caller
    ("GET", [(429, "3600")], 429, 1),
    ("GET", [(429, "99999999999999999999")], 429, 1),
    # a negative wait is no wait
    ("GET", [(429, "-5")], 200, 2),
    # not an error at all, header or not
    ("GET", [(200, "0")], 200, 1),
    # a client error is never retried
    ("GET", [(404, "0")], 404, 1),
])
def test_retry_after(server: FakeAPIServer, lean: LeanHTTP, method: str,
                     script: list[Answer], status: int, asked: int) -> None:
    server.script = list(script)
    got, _ = lean.call(method, "/api/v1/namespaces/x/pods", b"{}" if method != "GET" else None)
    assert got == status
    assert server.seen == [method] * asked
    assert lean.stats["retried"] == asked - 1


def test_at_most_ten_retries(server: FakeAPIServer, lean: LeanHTTP) -> None:
    server.script = [(429, "0")] * 50
    got, _ = lean.call("GET", "/api/v1/pods", None)
    assert got == 429 and len(server.seen) == 1 + transport.RETRY_AFTER_TRIES


def test_the_wait_is_bounded(server: FakeAPIServer, lean: LeanHTTP,
                             monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr(transport.time, "sleep", slept.append)
    server.script = [(429, "4")] * 5
    got, _ = lean.call("GET", "/api/v1/pods", None)
    # 4 + 4 waited; a third 4 would pass the 10 s budget: the 429 is the answer
    assert got == 429 and slept == [4.0, 4.0] and len(server.seen) == 3


def test_opting_out_and_the_error(server: FakeAPIServer) -> None:
    c = KubeClient(Endpoint(host=f"http://127.0.0.1:{server.server_address[1]}"))
    try:
        server.script = [(429, "10")]  # an eviction a disruption budget refuses
        assert c.evict_pod("ns", "p") is False
        assert server.seen == ["POST"]  # answered at once, not after 10 s
        server.script = [(429, "0")] * 11
        with pytest.raises(KubeUnavailable) as e:
            c.get("/api/v1/pods")
        assert e.value.status == 429 and "TooManyRequests" in str(e.value)
    finally:
        c.close()


@settings(max_examples=500, deadline=None)
@given(st.text(max_size=40) | st.from_regex(r"-?[0-9]{1,12}", fullmatch=True))
def test_retry_after_header_fuzz(value: str) -> None:
    # any header text: no exception, and either no retry or a wait within the budget
    got = transport._retry_after_s(value)
    assert got is None or 0.0 <= got <= transport.RETRY_AFTER_BUDGET_S + 1
    if got is not None:
        assert value.strip().isascii() and value.strip().lstrip("-").isdigit()
