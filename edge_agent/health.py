"""Liveness, readiness and status of a running agent, served on its metrics port.

One small HTTP server (``metrics_port``; the chart's probes and Prometheus use it):

* ``/healthz`` (``/livez``): 200 while the sampler takes reports; 503 once it has taken
  none for :data:`STALL_INTERVALS` intervals (at least :data:`STALL_MIN_S`): the kubelet
  restarts an agent whose loop is wedged. A broker or core outage is no reason to restart
  it (its reports wait in the buffer), so nothing else decides liveness.
* ``/readyz``: 200 when every check passes, else 503 with one ``[-]name: reason`` line per
  failing check (the shape of the core's ``/readyz``, ``cloud_core.readiness``):

  - ``sampler``: a report was taken, and within the stall bound above;
  - ``probe``: the link probe is attached (the eBPF probe holds its tracepoint
    attachments; sock_diag needs none) and has not failed in the last
    :data:`PROBE_FAIL_INTERVALS` intervals;
  - ``reports``: reports are flowing (the core acknowledged one within
    :data:`ACK_INTERVALS` intervals, at least :data:`ACK_MIN_S`), or they are buffering
    within bounds: the buffer holds less than :data:`BUFFER_READY_FRACTION` of its byte
    bound and has thinned nothing since the agent started (a full buffer thins its
    history: that is what "not ready" says).
* ``/status``: the same verdicts and what they were judged by, as JSON, with the loader in
  use and why (``loader``: ``core``, ``bcc`` or ``none`` for a probe without eBPF).
* ``/metrics``: the Prometheus exposition (``edge_agent.metrics``). prometheus_client is
  imported at the first scrape, not before: an agent that is probed but never scraped
  does not map it (the agent keeps its resident memory small).

The server is ``socketserver`` with a request line and headers read within bounds
(:data:`MAX_LINE`, :data:`MAX_HEADERS`), a per-connection timeout and at most
:data:`MAX_CLIENTS` connections served at once (more are closed unanswered): a probe
endpoint on the host network must not let a client hold the agent's threads or memory.
"""

from __future__ import annotations

import json
import logging
import socketserver
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from edge_agent import __version__
from edge_agent.loaderinfo import Loader, loader_of

if TYPE_CHECKING:
    from edge_agent.agent import Agent

log = logging.getLogger(__name__)

STALL_INTERVALS = 10.0
STALL_MIN_S = 30.0
PROBE_FAIL_INTERVALS = 3.0
ACK_INTERVALS = 10.0
ACK_MIN_S = 15.0
BUFFER_READY_FRACTION = 0.9
MAX_LINE = 4096
MAX_HEADERS = 64
MAX_CLIENTS = 8
CLIENT_TIMEOUT_S = 5.0


class AgentHealth:
    """The verdicts of one agent, judged when asked (each probe request)."""

    def __init__(self, agent: Agent, loader: Loader,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.agent = agent
        self.loader = loader
        self.clock = clock
        self.started = clock()
        # The buffer's count is kept across restarts: only this run's thinning counts.
        self.thinned_at_start = agent.buffer.thinned

    def _age(self, t: float) -> float | None:
        return None if not t else max(0.0, self.clock() - t)

    def stall_bound_s(self) -> float:
        return max(STALL_MIN_S, STALL_INTERVALS * self.agent.interval_s)

    def live(self) -> str | None:
        """None while the sampler takes reports, else why not."""
        last = self.agent.stats.last_report
        since = self.clock() - (last or self.started)
        if since <= self.stall_bound_s():
            return None
        what = "no report taken" if not last else "the latest report was taken"
        return f"{what} {since:.0f} s ago (bound {self.stall_bound_s():.0f} s): sampler stalled"

    def _sampler(self) -> str | None:
        return "no report taken yet" if not self.agent.stats.last_report else self.live()

    def _probe(self) -> str | None:
        probe = self.agent.probe
        fds = getattr(probe, "fds", None)
        if isinstance(fds, dict) and not fds.get("links"):
            return f"the {probe.name} probe holds no attachment"
        failed = self._age(self.agent.stats.last_probe_error)
        if failed is not None and failed <= PROBE_FAIL_INTERVALS * self.agent.interval_s:
            return (f"the {probe.name} probe failed {failed:.1f} s ago "
                    f"({self.agent.stats.probe_errors} failures since start)")
        return None

    def _reports(self) -> str | None:
        a = self.agent
        acked = self._age(a.stats.last_ack)
        if acked is not None and acked <= max(ACK_MIN_S, ACK_INTERVALS * a.interval_s):
            return None
        size, bound = a.buffer.size_bytes(), a.buffer.max_bytes
        thinned = a.buffer.thinned - self.thinned_at_start
        if size < BUFFER_READY_FRACTION * bound and not thinned:
            return None  # buffering within bounds: the reports wait for the broker or core
        why = ("not connected to the broker" if not a.mqtt.connected
               else "connected, but the core acknowledges nothing")
        return (f"buffer {size} of {bound} bytes ({100 * size / bound:.0f} %), "
                f"{a.buffer.depth()} reports waiting, {thinned} thinned: {why}")

    def checks(self) -> dict[str, str | None]:
        """Readiness checks in order, name -> None (passes) or the reason it fails."""
        out: dict[str, str | None] = {}
        for name, check in (("sampler", self._sampler), ("probe", self._probe),
                            ("reports", self._reports)):
            try:
                out[name] = check()
            except Exception as exc:  # a probe reports, never raises
                out[name] = f"check raised {type(exc).__name__}: {exc}"
        return out

    def readyz(self) -> tuple[bool, str]:
        """(ready, body): ``[+]name ok`` / ``[-]name: reason`` lines, then the verdict."""
        checks = self.checks()
        lines = [f"[-]{n}: {why}" if why else f"[+]{n} ok" for n, why in checks.items()]
        failed = any(checks.values())
        lines.append("readyz check failed" if failed else "ok")
        return not failed, "\n".join(lines) + "\n"

    def status(self) -> dict[str, Any]:
        a = self.agent
        checks = self.checks()
        ages = {k: None if v is None else round(v, 3)
                for k, v in (("last_report_age_s", self._age(a.stats.last_report)),
                             ("last_ack_age_s", self._age(a.stats.last_ack)))}
        return {
            "node": a.node, "boot": a.boot, "version": __version__,
            "probe": a.probe.name, "loader": self.loader.name,
            "loader_reason": self.loader.why,
            "live": self.live() is None, "ready": not any(checks.values()),
            "failing": {k: v for k, v in checks.items() if v},
            "connected": bool(a.mqtt.connected),
            "reports": {"taken": a.stats.reports, "published": a.stats.published,
                        "acked": a.stats.acked, "probe_errors": a.stats.probe_errors},
            "buffer": {"reports": a.buffer.depth(), "bytes": a.buffer.size_bytes(),
                       "max_bytes": a.buffer.max_bytes},
            **ages,
        }


class _Handler(socketserver.StreamRequestHandler):
    server: HealthServer
    timeout = CLIENT_TIMEOUT_S

    def handle(self) -> None:
        srv = self.server
        if not srv.slots.acquire(blocking=False):
            return  # too many clients at once: closed unanswered
        try:
            self._serve(srv)
        except (OSError, ValueError):
            pass  # the client went away or sent what is not HTTP: nothing to answer
        finally:
            srv.slots.release()

    def _serve(self, srv: HealthServer) -> None:
        line = self.rfile.readline(MAX_LINE + 1)
        parts = line.decode("latin-1").split()
        if len(line) > MAX_LINE or len(parts) != 3 or not parts[2].startswith("HTTP/"):
            self._send(400, b"bad request\n")
            return
        for _ in range(MAX_HEADERS):
            h = self.rfile.readline(MAX_LINE + 1)
            if h in (b"\r\n", b"\n", b""):
                break
        else:
            self._send(431, b"too many headers\n")
            return
        method, path = parts[0], parts[1].split("?", 1)[0]
        if method not in ("GET", "HEAD"):
            self._send(405, b"GET only\n")
            return
        code, ctype, body = srv.answer(path)
        self._send(code, body, ctype, head=method == "HEAD")

    def _send(self, code: int, body: bytes, ctype: str = "text/plain; charset=utf-8",
              head: bool = False) -> None:
        reason = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
                  431: "Request Header Fields Too Large",
                  503: "Service Unavailable"}.get(code, "")
        self.wfile.write(f"HTTP/1.1 {code} {reason}\r\nContent-Type: {ctype}\r\n"
                         f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                         + (b"" if head else body))


class HealthServer(socketserver.ThreadingTCPServer):
    """/healthz, /readyz, /status and /metrics of one agent (see the module's docstring)."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, health: AgentHealth, addr: tuple[str, int]) -> None:
        self.health = health
        self.slots = threading.BoundedSemaphore(MAX_CLIENTS)
        self._metrics: Callable[[], bytes] | None = None
        self._metrics_lock = threading.Lock()
        super().__init__(addr, _Handler)

    @property
    def server_port(self) -> int:
        return int(self.server_address[1])

    def metrics(self) -> bytes:
        with self._metrics_lock:
            if self._metrics is None:
                from edge_agent.metrics import exposition

                self._metrics = exposition(self.health.agent, self.health.loader)
        return self._metrics()

    def answer(self, path: str) -> tuple[int, str, bytes]:
        """(status, content type, body) for ``path``."""
        text = "text/plain; charset=utf-8"
        if path in ("/healthz", "/livez"):
            why = self.health.live()
            return (200, text, b"ok\n") if why is None else (503, text, f"{why}\n".encode())
        if path == "/readyz":
            ready, body = self.health.readyz()
            return 200 if ready else 503, text, body.encode()
        if path == "/status":
            return 200, "application/json", json.dumps(self.health.status()).encode() + b"\n"
        if path == "/metrics":
            return 200, "text/plain; version=0.0.4; charset=utf-8", self.metrics()
        return 404, text, b"not found: /healthz /readyz /status /metrics\n"

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


def serve(agent: Agent, port: int, addr: str = "0.0.0.0", *,
          fallback: str | None = None) -> HealthServer:
    """Serve ``agent``'s health, status and metrics on ``addr:port`` (0: any free port) from
    a thread; ``fallback``: why the agent does not use eBPF, if it does not. Call
    :meth:`HealthServer.stop` to stop."""
    server = HealthServer(AgentHealth(agent, loader_of(agent.probe, fallback)), (addr, port))
    threading.Thread(target=server.serve_forever, name="cfnet-health", daemon=True).start()
    return server
