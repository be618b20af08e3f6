"""Active probing: a tiny TCP echo exchange with peers that had no passive traffic.

The exchange itself measures nothing: it makes the kernel's TCP stack produce
RTT samples that the link probe (eBPF or sock_diag) picks up like any other
traffic. Both ends use the probe port (default 7946), which is how the probes
mark those samples ``active=True``. Everything is bounded: connections the
server accepts, bytes per connection, round trips and time per exchange,
peers per round, and how often one peer is probed.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Sequence
from types import TracebackType

from edge_agent.probes.base import DEFAULT_PROBE_PORT

log = logging.getLogger(__name__)

ROUND_TRIPS = 20
MSG = b"cfnet-probe\n"            # 12 bytes: one small segment per round trip
MAX_BYTES_PER_CONN = 64 * 1024    # the echo server hangs up past this
IDLE_TIMEOUT_S = 5.0


class EchoServer:
    """Threaded TCP echo on ``bind_addr:port`` with at most ``max_conns`` clients at once."""

    def __init__(self, bind_addr: str, port: int = DEFAULT_PROBE_PORT, max_conns: int = 16) -> None:
        self.bind_addr = bind_addr
        self.port = port
        self.max_conns = max_conns
        self._slots = threading.BoundedSemaphore(max_conns)
        self._stop = threading.Event()
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        family = socket.AF_INET6 if ":" in self.bind_addr else socket.AF_INET
        sock = socket.create_server((self.bind_addr, self.port), family=family, reuse_port=True)
        sock.settimeout(0.5)  # so stop() is noticed without closing under accept()
        self._sock = sock
        self.port = sock.getsockname()[1]
        self._thread = threading.Thread(target=self._accept_loop, name="cfnet-echo", daemon=True)
        self._thread.start()
        log.info("echo server on %s:%d", self.bind_addr, self.port)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        if self._sock is not None:
            self._sock.close()

    def __enter__(self) -> EchoServer:
        self.start()
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def _accept_loop(self) -> None:
        assert self._sock is not None
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            if not self._slots.acquire(blocking=False):
                conn.close()  # full: a prober will retry next round
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            with conn:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                conn.settimeout(IDLE_TIMEOUT_S)
                total = 0
                while not self._stop.is_set() and total < MAX_BYTES_PER_CONN:
                    data = conn.recv(4096)
                    if not data:
                        return
                    total += len(data)
                    conn.sendall(data)
        except OSError:
            pass  # peer went away or idled out: nothing to clean beyond the socket
        finally:
            self._slots.release()


class ActiveProber:
    """Echo exchanges with peers, at most once per ``min_interval_s`` each."""

    def __init__(self, port: int = DEFAULT_PROBE_PORT, min_interval_s: float = 30.0,
                 max_peers_per_round: int = 8, timeout_s: float = 2.0) -> None:
        self.port = port
        self.min_interval_s = min_interval_s
        self.max_peers_per_round = max_peers_per_round
        self.timeout_s = timeout_s
        self._last: dict[str, float] = {}
        self.last_error: dict[str, str] = {}
        self._round: threading.Thread | None = None
        self._round_lock = threading.Lock()

    def due(self, peers: Sequence[str], now: float | None = None) -> list[str]:
        """The peers a round started now would probe: not probed recently, oldest first, capped."""
        t = time.monotonic() if now is None else now
        ready = [p for p in dict.fromkeys(peers)
                 if t - self._last.get(p, float("-inf")) >= self.min_interval_s]
        ready.sort(key=lambda p: self._last.get(p, float("-inf")))
        return ready[: self.max_peers_per_round]

    def start(self, peers: Sequence[str]) -> bool:
        """Start a round in the background and return at once; False if one is still running.

        The agent calls this from its report loop. A round to distant or lossy
        peers can take the whole timeout, and waiting for it delayed that
        interval's report: in the demo, nodes with far peers looked silent
        ("suspect") for half a second every ``min_interval_s``. The exchange's
        RTT samples reach the link probe like any traffic, so nothing needs to
        wait for the round to end.
        """
        with self._round_lock:
            if self._round is not None and self._round.is_alive():
                return False
            t = threading.Thread(target=self.probe, args=(list(peers),), daemon=True,
                                 name="cfnet-probe-round")
            self._round = t
            t.start()
        return True

    def wait_round(self, timeout_s: float) -> bool:
        """Wait for the round in progress, if any; True once none is running."""
        t = self._round
        if t is not None:
            t.join(timeout_s)
        return t is None or not t.is_alive()

    def probe(self, peers: list[str]) -> None:
        """Run one bounded round (in parallel, returns within about ``timeout_s``)."""
        chosen = self.due(peers)
        if not chosen:
            return
        now = time.monotonic()
        for p in chosen:
            self._last[p] = now
        threads = [threading.Thread(target=self._exchange, args=(p,), daemon=True,
                                    name=f"cfnet-probe-{p}") for p in chosen]
        for t in threads:
            t.start()
        deadline = now + self.timeout_s + 0.5
        for t in threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))

    def _exchange(self, peer: str) -> None:
        deadline = time.monotonic() + self.timeout_s
        try:
            with socket.create_connection((peer, self.port), timeout=self.timeout_s) as s:
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                for _ in range(ROUND_TRIPS):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    s.settimeout(left)
                    s.sendall(MSG)
                    got = 0
                    while got < len(MSG):
                        chunk = s.recv(len(MSG) - got)
                        if not chunk:
                            raise ConnectionError("echo server closed the connection")
                        got += len(chunk)
            self.last_error.pop(peer, None)
        except OSError as exc:
            self.last_error[peer] = str(exc)
            log.debug("active probe of %s failed: %s", peer, exc)
