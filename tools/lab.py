"""Network lab: sites as network namespaces around one router namespace.

Each site ``s`` gets a namespace ``<prefix>-<s>`` with ``eth0`` (10.B.i.2/24,
default route via the router) joined by a veth pair to the router namespace
``<prefix>-rt`` (``s<i>``, 10.B.i.1/24, IPv4 forwarding on). Per site:

- ``rate_mbit``: ``tc tbf`` on both ends of the site's veth (both directions);
- ``loss``: nftables random drop in the router's *forward* chain for packets
  from or to the site -- i.e. on the path, at the receiver's side of the
  router, never on the sender's own output hook (a drop there is reported
  to the local TCP stack and shows up as far fewer retransmits);
- ``delay_ms``: one-way delay of the site's link, each direction, with
  ``netem`` as a child of the tbf (or as root). Kernels without netem (and
  without ``fq``, which an EDT/cls_bpf delay needs) reject it with LabError;
  :func:`delay_supported` tells beforehand.

B is derived from the prefix so two labs with different prefixes use
different addresses (tracepoints see every namespace, and the eBPF probe
filters by local address). Everything the lab does is logged (logger
``tools.lab``); every command has a timeout.

Command line: ``python -m tools.lab up|down|cleanup|status`` and small bounded
traffic tools (``serve``, ``send``, ``pingpong``) the tests and benchmarks
run inside site namespaces.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import re
import socket
import struct
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import Any

log = logging.getLogger("tools.lab")

REPO = Path(__file__).resolve().parent.parent
CMD_TIMEOUT_S = 20.0
NFT_TABLE = "cfnet_lab"
_PREFIX_RE = re.compile(r"^[a-z][a-z0-9]{0,11}$")
_SITE_RE = re.compile(r"^[a-z][a-z0-9]{0,15}$")
MAX_SITES = 64


class LabError(RuntimeError):
    """A lab operation failed (command error, bad spec, unsupported feature)."""


@dataclass(frozen=True)
class SiteSpec:
    name: str
    rate_mbit: float | None = None
    loss: float = 0.0
    delay_ms: float = 0.0


def _run(argv: Sequence[str], *, check: bool = True, input_: str | None = None,
         timeout: float = CMD_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    log.info("lab: %s", " ".join(argv))
    try:
        cp = subprocess.run(list(argv), input=input_, capture_output=True, text=True,
                            timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LabError(f"{argv[0]} failed: {exc}") from exc
    if check and cp.returncode != 0:
        raise LabError(f"{' '.join(argv)}: rc={cp.returncode}: {cp.stderr.strip()[:400]}")
    return cp


def list_namespaces(prefix: str) -> list[str]:
    """Namespaces named ``<prefix>-*`` (this lab's, or a crashed run's)."""
    cp = _run(["ip", "netns", "list"], check=False)
    names = [line.split()[0] for line in cp.stdout.splitlines() if line.strip()]
    return sorted(n for n in names if n.startswith(prefix + "-"))


def cleanup_prefix(prefix: str) -> list[str]:
    """Delete every namespace of ``prefix`` (veths and nft tables go with them)."""
    removed = []
    for ns in list_namespaces(prefix):
        _run(["ip", "netns", "del", ns], check=False)
        removed.append(ns)
    if removed:
        log.info("lab: removed %d namespaces of prefix %s", len(removed), prefix)
    return removed


def delay_supported() -> bool:
    """Whether this kernel has netem (probed on a throwaway dummy in a scratch namespace)."""
    ns = f"cfdelayprobe{int(time.time() * 1000) % 100000}"
    try:
        _run(["ip", "netns", "add", ns])
        _run(["ip", "-n", ns, "link", "add", "d0", "type", "dummy"])
        cp = _run(["tc", "-n", ns, "qdisc", "add", "dev", "d0", "root", "netem", "delay", "1ms"],
                  check=False)
        return cp.returncode == 0
    except LabError:
        return False
    finally:
        _run(["ip", "netns", "del", ns], check=False)


class Lab:
    """N sites around one router. A context manager: ``up`` on enter, ``down`` on exit."""

    def __init__(self, sites: Sequence[SiteSpec], prefix: str = "cfl") -> None:
        if not _PREFIX_RE.match(prefix):
            raise LabError(f"prefix {prefix!r} must match {_PREFIX_RE.pattern}")
        if not 1 <= len(sites) <= MAX_SITES:
            raise LabError(f"1..{MAX_SITES} sites, not {len(sites)}")
        names = [s.name for s in sites]
        if len(set(names)) != len(names):
            raise LabError("site names must be unique")
        for s in sites:
            if not _SITE_RE.match(s.name) or s.name == "rt":
                raise LabError(f"bad site name {s.name!r}")
            _check_params(s.rate_mbit, s.loss, s.delay_ms)
        self.prefix = prefix
        self._sites: dict[str, SiteSpec] = {s.name: s for s in sites}
        self._index = {s.name: i + 1 for i, s in enumerate(sites)}
        # Second octet from the prefix: distinct labs, distinct addresses.
        self._net = 64 + zlib.crc32(prefix.encode()) % 128
        self._lock = threading.Lock()
        self._is_up = False

    # ------------------------------------------------------------------ names

    @property
    def router(self) -> str:
        return f"{self.prefix}-rt"

    @property
    def sites(self) -> list[str]:
        return list(self._sites)

    def spec(self, site: str) -> SiteSpec:
        return self._sites[self._site(site)]

    def _site(self, site: str) -> str:
        if site not in self._sites:
            raise LabError(f"no site {site!r} in lab {self.prefix}")
        return site

    def ns(self, site: str) -> str:
        return f"{self.prefix}-{self._site(site)}"

    def addr(self, site: str) -> str:
        return f"10.{self._net}.{self._index[self._site(site)]}.2"

    def gateway(self, site: str) -> str:
        return f"10.{self._net}.{self._index[self._site(site)]}.1"

    def router_if(self, site: str) -> str:
        return f"s{self._index[self._site(site)]}"

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> Lab:
        self.up()
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.down()

    def up(self) -> None:
        with self._lock:
            stale = cleanup_prefix(self.prefix)
            if stale:
                log.warning("lab: removed stale namespaces %s", ", ".join(stale))
            try:
                self._build()
            except BaseException:
                cleanup_prefix(self.prefix)
                raise
            self._is_up = True
        log.info("lab %s up: %s", self.prefix,
                 ", ".join(f"{s}={self.addr(s)}" for s in self._sites))

    def _build(self) -> None:
        r = self.router
        _run(["ip", "netns", "add", r])
        _run(["ip", "-n", r, "link", "set", "lo", "up"])
        _run(["ip", "netns", "exec", r, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1"])
        for name in self._sites:
            ns, rif = self.ns(name), self.router_if(name)
            _run(["ip", "netns", "add", ns])
            # Both ends are created directly in their namespaces: nothing ever
            # appears in the root namespace, so a crash can't leave veths there.
            _run(["ip", "link", "add", "name", rif, "netns", r, "type", "veth",
                  "peer", "name", "eth0", "netns", ns])
            _run(["ip", "-n", r, "addr", "add", f"{self.gateway(name)}/24", "dev", rif])
            _run(["ip", "-n", ns, "addr", "add", f"{self.addr(name)}/24", "dev", "eth0"])
            _run(["ip", "-n", r, "link", "set", rif, "up"])
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
            # One segment per skb (no TSO/GSO super-packets): a drop on the
            # router then loses one segment, as on a real link, not a burst.
            _run(["ip", "-n", ns, "link", "set", "eth0", "gso_max_segs", "1"])
            _run(["ip", "-n", r, "link", "set", rif, "gso_max_segs", "1"])
            _run(["ip", "-n", ns, "link", "set", "eth0", "up"])
            _run(["ip", "-n", ns, "route", "add", "default", "via", self.gateway(name)])
            self._apply_qdisc(name)
        self._apply_nft()

    def down(self) -> None:
        with self._lock:
            cleanup_prefix(self.prefix)
            self._is_up = False

    def cleanup(self) -> list[str]:
        """Remove this prefix's namespaces, including those a crashed run left."""
        with self._lock:
            self._is_up = False
            return cleanup_prefix(self.prefix)

    # ------------------------------------------------------------------ shaping

    def set_loss(self, site: str, loss: float) -> None:
        _check_params(None, loss, 0.0)
        self._sites[self._site(site)] = replace(self.spec(site), loss=loss)
        self._apply_nft()

    def set_rate(self, site: str, mbit: float | None) -> None:
        _check_params(mbit, 0.0, 0.0)
        self._sites[self._site(site)] = replace(self.spec(site), rate_mbit=mbit)
        self._apply_qdisc(site)

    def set_delay(self, site: str, ms: float) -> None:
        _check_params(None, 0.0, ms)
        old = self.spec(site)
        self._sites[self._site(site)] = replace(old, delay_ms=ms)
        try:
            self._apply_qdisc(site)
        except LabError:
            self._sites[site] = old
            self._apply_qdisc(site)
            raise

    def link_down(self, site: str) -> None:
        _run(["ip", "-n", self.router, "link", "set", self.router_if(site), "down"])

    def link_up(self, site: str) -> None:
        _run(["ip", "-n", self.router, "link", "set", self.router_if(site), "up"])
        # The site's default route went with the carrier; put it back.
        _run(["ip", "-n", self.ns(site), "route", "replace", "default", "via",
              self.gateway(site)])

    def _apply_qdisc(self, site: str) -> None:
        spec = self.spec(site)
        for ns, dev in ((self.router, self.router_if(site)), (self.ns(site), "eth0")):
            _run(["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"], check=False)
            netem = ["netem", "delay", f"{spec.delay_ms:g}ms", "limit", "10000"]
            if spec.rate_mbit:
                rate_bps = spec.rate_mbit * 1e6
                # burst: enough for one timer tick at this rate, never under 32 KB.
                burst = max(32 * 1024, int(rate_bps / 8 / 100))
                _run(["tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "handle", "1:", "tbf",
                      "rate", f"{spec.rate_mbit:g}mbit", "burst", str(burst),
                      "latency", "50ms"])
                if spec.delay_ms > 0:
                    self._netem(["tc", "-n", ns, "qdisc", "add", "dev", dev, "parent", "1:1",
                                 "handle", "10:", *netem])
            elif spec.delay_ms > 0:
                self._netem(["tc", "-n", ns, "qdisc", "add", "dev", dev, "root", *netem])

    @staticmethod
    def _netem(argv: list[str]) -> None:
        try:
            _run(argv)
        except LabError as exc:
            raise LabError(f"delay needs netem, which this kernel lacks ({exc})") from exc

    def _apply_nft(self) -> None:
        lines = [f"table inet {NFT_TABLE} {{", "  chain forward {",
                 "    type filter hook forward priority 0; policy accept;"]
        for name, spec in self._sites.items():
            if spec.loss > 0:
                thresh = round(spec.loss * 1_000_000)
                rif = self.router_if(name)
                for dirn in ("iifname", "oifname"):
                    lines.append(f'    {dirn} "{rif}" numgen random mod 1000000 < {thresh} '
                                 "counter drop")
        lines += ["  }", "}"]
        _run(["ip", "netns", "exec", self.router, "nft", "delete", "table", "inet", NFT_TABLE],
             check=False)
        script = "\n".join(lines) + "\n"
        log.info("lab: nft ruleset for %s:\n%s", self.router, script)
        _run(["ip", "netns", "exec", self.router, "nft", "-f", "-"], input_=script)

    # ------------------------------------------------------------------ processes

    def _wrap(self, site: str, argv: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", self.ns(site), *argv]

    def popen(self, site: str, argv: Sequence[str], **kw: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` inside the site's namespace (cwd defaults to the repo root)."""
        full = self._wrap(site, argv)
        kw.setdefault("cwd", str(REPO))
        log.info("lab: [%s] %s", site, " ".join(argv))
        return subprocess.Popen(full, **kw)

    def run(self, site: str, argv: Sequence[str], **kw: Any) -> subprocess.CompletedProcess[Any]:
        full = self._wrap(site, argv)
        kw.setdefault("cwd", str(REPO))
        kw.setdefault("timeout", 120)
        log.info("lab: [%s] %s", site, " ".join(argv))
        return subprocess.run(full, check=False, **kw)

    def status(self) -> dict[str, Any]:
        return {
            "prefix": self.prefix,
            "up": self._is_up,
            "namespaces": list_namespaces(self.prefix),
            "sites": {n: {"ns": self.ns(n), "addr": self.addr(n), "rate_mbit": s.rate_mbit,
                          "loss": s.loss, "delay_ms": s.delay_ms}
                      for n, s in self._sites.items()},
        }


def _check_params(rate: float | None, loss: float, delay: float) -> None:
    if rate is not None and not 0.01 <= rate <= 100_000:
        raise LabError(f"rate_mbit {rate} outside 0.01..100000")
    if not 0.0 <= loss < 1.0:
        raise LabError(f"loss {loss} outside [0, 1)")
    if not 0.0 <= delay <= 10_000:
        raise LabError(f"delay_ms {delay} outside 0..10000")


# ====================================================================== traffic tools
# Bounded load generators run inside lab namespaces (python -m tools.lab ...).

TCP_INFO = 11
_TCPI_RTT_OFFSET = 68  # struct tcp_info: 8 x u8, then u32s; tcpi_rtt is the 16th u32


def tcp_info_rtt_us(sock: socket.socket) -> int:
    raw = sock.getsockopt(socket.IPPROTO_TCP, TCP_INFO, 104)
    return int(struct.unpack_from("I", raw, _TCPI_RTT_OFFSET)[0])


def serve(port: int, mode: str, seconds: float, max_conns: int = 64) -> None:
    """Accept connections for ``seconds``; discard (sink) or echo what arrives."""
    deadline = time.monotonic() + seconds
    srv = socket.create_server(("0.0.0.0", port), reuse_port=True)
    srv.settimeout(0.2)
    threads: list[threading.Thread] = []

    def handle(c: socket.socket) -> None:
        c.settimeout(1.0)
        with c:
            while time.monotonic() < deadline:
                try:
                    data = c.recv(65536)
                except TimeoutError:
                    continue
                except OSError:
                    return
                if not data:
                    return
                if mode == "echo":
                    c.sendall(data)

    print(json.dumps({"listening": port}), flush=True)
    with srv:
        while time.monotonic() < deadline:
            try:
                c, _ = srv.accept()
            except TimeoutError:
                continue
            threads = [t for t in threads if t.is_alive()]
            if len(threads) >= max_conns:
                c.close()
                continue
            t = threading.Thread(target=handle, args=(c,), daemon=True)
            t.start()
            threads.append(t)


def send(host: str, port: int, total_bytes: int, seconds: float,
         rate_mbit: float | None = None, chunk: int = 65536) -> None:
    """Send up to ``total_bytes`` for at most ``seconds``, optionally paced to ``rate_mbit``."""
    s = _connect(host, port, seconds)
    buf = b"\0" * chunk
    sent = 0
    t0 = time.monotonic()
    deadline = t0 + seconds
    with s:
        while sent < total_bytes and time.monotonic() < deadline:
            if rate_mbit:
                ahead = sent * 8 / (rate_mbit * 1e6) - (time.monotonic() - t0)
                if ahead > 0:
                    time.sleep(min(ahead, 0.05))
                    continue
            s.settimeout(max(0.05, deadline - time.monotonic()))
            try:
                sent += s.send(buf[: min(chunk, total_bytes - sent)])
            except TimeoutError:
                break
        print(json.dumps({"sent": sent, "rtt_us": tcp_info_rtt_us(s)}), flush=True)


def pingpong(host: str, port: int, count: int, seconds: float, size: int = 64,
             gap_s: float = 0.002, report_every_s: float = 0.05) -> None:
    """Request/response round trips on one connection; prints the socket's tcp_info RTT."""
    s = _connect(host, port, seconds)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    msg = b"p" * size
    deadline = time.monotonic() + seconds
    next_report = 0.0
    with s:
        s.settimeout(2.0)
        for _ in range(count):
            now = time.monotonic()
            if now >= deadline:
                break
            s.sendall(msg)
            got = 0
            while got < size:
                chunk = s.recv(size - got)
                if not chunk:
                    return
                got += len(chunk)
            if now >= next_report:
                print(json.dumps({"t": time.time(), "rtt_us": tcp_info_rtt_us(s)}), flush=True)
                next_report = now + report_every_s
            if gap_s:
                time.sleep(gap_s)


def _connect(host: str, port: int, seconds: float) -> socket.socket:
    deadline = time.monotonic() + min(seconds, 10.0)
    while True:
        try:
            return socket.create_connection((host, port), timeout=2.0)
        except OSError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.05)


# ====================================================================== CLI


def _parse_kv(items: Sequence[str], conv: type) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for it in items:
        k, _, v = it.partition("=")
        out[k] = conv(v)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.lab", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="create a lab (left running)")
    up.add_argument("--prefix", default="cfl")
    up.add_argument("--sites", default="a,b,c", help="comma list of site names")
    up.add_argument("--rate", nargs="*", default=[], metavar="SITE=MBIT")
    up.add_argument("--loss", nargs="*", default=[], metavar="SITE=RATIO")
    up.add_argument("--delay", nargs="*", default=[], metavar="SITE=MS")
    for name in ("down", "cleanup", "status"):
        p = sub.add_parser(name, help=f"{name} the lab(s) of a prefix")
        p.add_argument("--prefix", default="cfl")
    sv = sub.add_parser("serve", help="TCP sink/echo server (bounded)")
    sv.add_argument("--port", type=int, default=5001)
    sv.add_argument("--mode", choices=("sink", "echo"), default="sink")
    sv.add_argument("--seconds", type=float, default=30.0)
    sd = sub.add_parser("send", help="bulk sender (bounded)")
    sd.add_argument("host")
    sd.add_argument("--port", type=int, default=5001)
    sd.add_argument("--bytes", type=int, default=50_000_000)
    sd.add_argument("--seconds", type=float, default=10.0)
    sd.add_argument("--rate-mbit", type=float, default=None)
    sd.add_argument("--chunk", type=int, default=65536)
    pp = sub.add_parser("pingpong", help="request/response round trips (bounded)")
    pp.add_argument("host")
    pp.add_argument("--port", type=int, default=5002)
    pp.add_argument("--count", type=int, default=10_000)
    pp.add_argument("--seconds", type=float, default=10.0)
    pp.add_argument("--gap", type=float, default=0.002)
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        if a.cmd == "up":
            rates = _parse_kv(a.rate, float)
            losses = _parse_kv(a.loss, float)
            delays = _parse_kv(a.delay, float)
            specs = [SiteSpec(n, rates.get(n), losses.get(n, 0.0), delays.get(n, 0.0))
                     for n in a.sites.split(",") if n]
            lab = Lab(specs, prefix=a.prefix)
            lab.up()
            print(json.dumps(lab.status(), indent=2))
        elif a.cmd in ("down", "cleanup"):
            print(json.dumps({"removed": cleanup_prefix(a.prefix)}))
        elif a.cmd == "status":
            print(json.dumps({"namespaces": list_namespaces(a.prefix)}))
        elif a.cmd == "serve":
            serve(a.port, a.mode, a.seconds)
        elif a.cmd == "send":
            send(a.host, a.port, a.bytes, a.seconds, a.rate_mbit, a.chunk)
        elif a.cmd == "pingpong":
            pingpong(a.host, a.port, a.count, a.seconds, gap_s=a.gap)
    except LabError as exc:
        print(f"lab: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        raise SystemExit(main())
