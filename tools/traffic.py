"""Bounded TCP traffic between lab sites, for the demo and tests.

``python -m tools.traffic sink --port P --duration S`` accepts connections and
discards what it reads; ``python -m tools.traffic send HOST --port P --rate-mbit R
--duration S --max-mb M`` writes paced data. Both stop by themselves: every
loop is bounded by time and by bytes.
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import sys
import time

from tools.lab import serve

CHUNK = 16 * 1024


def sink(port: int, duration_s: float) -> None:
    """Accept and discard for ``duration_s`` (the lab's bounded server in sink mode)."""
    serve(port, "sink", duration_s)


def send(host: str, port: int, rate_mbit: float, duration_s: float, max_mb: float) -> int:
    """Send at most ``max_mb`` MB at about ``rate_mbit`` (0: as fast as possible)."""
    deadline = time.monotonic() + duration_s
    budget = int(max_mb * 1e6)
    sent = 0
    buf = b"\x00" * CHUNK
    start = time.monotonic()
    while time.monotonic() < deadline and sent < budget:
        try:
            with socket.create_connection((host, port), timeout=2.0) as s:
                s.settimeout(2.0)
                while time.monotonic() < deadline and sent < budget:
                    if rate_mbit > 0:
                        ahead = sent * 8 / (rate_mbit * 1e6) - (time.monotonic() - start)
                        if ahead > 0:
                            time.sleep(min(ahead, 0.1))
                            continue
                    with contextlib.suppress(TimeoutError):
                        sent += s.send(buf)
        except OSError:
            time.sleep(0.5)  # sink not up yet, or the link is cut: retry until the deadline
    return sent


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="tools.traffic")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sink")
    s.add_argument("--port", type=int, default=5201)
    s.add_argument("--duration", type=float, default=60)
    t = sub.add_parser("send")
    t.add_argument("host")
    t.add_argument("--port", type=int, default=5201)
    t.add_argument("--rate-mbit", type=float, default=5)
    t.add_argument("--duration", type=float, default=60)
    t.add_argument("--max-mb", type=float, default=500)
    a = p.parse_args(argv)
    if a.cmd == "sink":
        sink(a.port, a.duration)
        return 0
    n = send(a.host, a.port, a.rate_mbit, a.duration, a.max_mb)
    print(f"send: {n / 1e6:.1f} MB", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
