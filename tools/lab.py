"""Network lab: sites as network namespaces around one router namespace.

Each site ``s`` gets a namespace ``<prefix>-<s>`` with ``eth0`` (10.B.i.2/24
and fd00:cf:B:i::2/64, default routes via the router) joined by a veth pair to
the router namespace ``<prefix>-rt`` (``s<i>``, 10.B.i.1/24, fd00:cf:B:i::1/64,
forwarding on). Per site:

- ``rate_mbit``: ``tc tbf`` on both ends of the site's veth (both directions);
- ``loss``: nftables random drop in the router's *forward* chain for packets
  from or to the site -- i.e. on the path, at the receiver's side of the
  router, never on the sender's own output hook (a drop there is reported
  to the local TCP stack and shows up as far fewer retransmits);
- ``delay_ms``: one-way delay of the site's link, each direction, so the RTT
  between sites x and y grows by 2 * (delay_x + delay_y). This kernel has
  neither netem nor fq (which an EDT/cls_bpf delay needs), so the router
  sends packets from and to delayed sites through a *delay line*: a TUN
  device in the router namespace served by a small process (``python -m
  tools.lab delayline``) that holds each packet for its delay and writes it
  back; policy routing (``iif dly`` -> main table first) keeps the
  returning packet from looping. Only delayed sites' traffic takes that
  path. Cost: one user-space pass per packet (fine for tests; it is not a
  10 Gbit/s emulator).

B is derived from the prefix so two labs with different prefixes use
different addresses (tracepoints see every namespace, and the eBPF probe
filters by local address). Everything the lab does is logged (logger
``tools.lab``); every command has a timeout.

Command line: ``python -m tools.lab up|down|cleanup|status``, and the bounded
request/response tools the RTT tests run inside site namespaces (``serve``,
an echo server, and ``pingpong``); bulk traffic is ``tools.traffic``.
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import ipaddress
import json
import logging
import os
import re
import select
import signal
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
DELAY_DIR = Path("/run/cfnet-lab")
DELAY_TUN = "dly"
DELAY_TABLE = "100"
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
    # False: one segment per skb (the default, a drop loses one segment);
    # True: the veths keep GSO/TSO, so TCP builds multi-segment skbs and a
    # retransmitted skb can carry several segments (what real NICs do).
    gso: bool = False


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
    """Delete every namespace of ``prefix`` (veths and nft tables go with them).

    Processes still inside (a crashed run's delay line or load generators)
    are killed first: a process keeps its namespace alive after ``ip netns del``.
    """
    removed = []
    for ns in list_namespaces(prefix):
        pids = _run(["ip", "netns", "pids", ns], check=False).stdout.split()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, ValueError, PermissionError):
                os.kill(int(pid), signal.SIGKILL)
        _run(["ip", "netns", "del", ns], check=False)
        removed.append(ns)
    for leftover in (DELAY_DIR / f"{prefix}.json", DELAY_DIR / f"{prefix}.log"):
        with contextlib.suppress(FileNotFoundError):
            leftover.unlink()
    if removed:
        log.info("lab: removed %d namespaces of prefix %s", len(removed), prefix)
    return removed


def delay_supported() -> bool:
    """Whether the delay line can run here (it needs TUN)."""
    return os.path.exists("/dev/net/tun")


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
        self._delayline: subprocess.Popen[bytes] | None = None
        self._delay_rules: set[str] = set()
        self._delay_gen = 0
        self._dl_buf = b""

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

    def addr6(self, site: str) -> str:
        """The site's IPv6 address (fd00:cf:B:i::2/64)."""
        return f"fd00:cf:{self._net}:{self._index[self._site(site)]}::2"

    def gateway6(self, site: str) -> str:
        return f"fd00:cf:{self._net}:{self._index[self._site(site)]}::1"

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
        _run(["ip", "netns", "exec", r, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1",
              "net.ipv6.conf.all.forwarding=1"])
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
            if not self._sites[name].gso:
                _run(["ip", "-n", ns, "link", "set", "eth0", "gso_max_segs", "1"])
                _run(["ip", "-n", r, "link", "set", rif, "gso_max_segs", "1"])
            _run(["ip", "-n", ns, "link", "set", "eth0", "up"])
            _run(["ip", "-n", ns, "route", "add", "default", "via", self.gateway(name)])
            # nodad: usable at once instead of after ~2 s of duplicate detection.
            _run(["ip", "-n", r, "addr", "add", f"{self.gateway6(name)}/64", "dev", rif,
                  "nodad"])
            _run(["ip", "-n", ns, "addr", "add", f"{self.addr6(name)}/64", "dev", "eth0",
                  "nodad"])
            _run(["ip", "-n", ns, "-6", "route", "add", "default", "via", self.gateway6(name)])
            self._apply_qdisc(name)
        self._apply_nft()
        self._apply_delay()

    def down(self) -> None:
        with self._lock:
            self._stop_delayline()
            cleanup_prefix(self.prefix)
            self._is_up = False

    def cleanup(self) -> list[str]:
        """Remove this prefix's namespaces, including those a crashed run left."""
        with self._lock:
            self._stop_delayline()
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
            self._apply_delay()
        except LabError:
            self._sites[site] = old
            raise

    def set_gso(self, site: str, on: bool) -> None:
        """GSO/TSO on or off for the site's link (both veth ends); affects new connections.

        TCP caches the device's limit when a socket connects, so set it before
        starting traffic.
        """
        self._sites[self._site(site)] = replace(self.spec(site), gso=on)
        segs = "65535" if on else "1"
        _run(["ip", "-n", self.ns(site), "link", "set", "eth0", "gso_max_segs", segs])
        _run(["ip", "-n", self.router, "link", "set", self.router_if(site), "gso_max_segs", segs])

    def link_down(self, site: str) -> None:
        _run(["ip", "-n", self.router, "link", "set", self.router_if(site), "down"])

    def link_up(self, site: str) -> None:
        _run(["ip", "-n", self.router, "link", "set", self.router_if(site), "up"])
        # The site's default route went with the carrier; put it back.
        _run(["ip", "-n", self.ns(site), "route", "replace", "default", "via",
              self.gateway(site)])
        _run(["ip", "-n", self.ns(site), "-6", "route", "replace", "default", "via",
              self.gateway6(site)])

    def _apply_qdisc(self, site: str) -> None:
        spec = self.spec(site)
        for ns, dev in ((self.router, self.router_if(site)), (self.ns(site), "eth0")):
            _run(["tc", "-n", ns, "qdisc", "del", "dev", dev, "root"], check=False)
            if spec.rate_mbit:
                rate_bps = spec.rate_mbit * 1e6
                # burst: enough for one timer tick at this rate, never under 32 KB.
                burst = max(32 * 1024, int(rate_bps / 8 / 100))
                _run(["tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "handle", "1:", "tbf",
                      "rate", f"{spec.rate_mbit:g}mbit", "burst", str(burst),
                      "latency", "50ms"])

    # ------------------------------------------------------------------ delay line

    def _delay_config(self) -> Path:
        return DELAY_DIR / f"{self.prefix}.json"

    def _apply_delay(self) -> None:
        delayed = {a: s.delay_ms for n, s in self._sites.items() if s.delay_ms > 0
                   for a in (self.addr(n), self.addr6(n))}
        if delayed and not delay_supported():
            raise LabError("delay needs /dev/net/tun (no netem or fq in this kernel either)")
        if not delayed and self._delayline is None:
            return
        # Config first (atomic rename): the running delay line rereads it.
        DELAY_DIR.mkdir(parents=True, exist_ok=True)
        cfg = self._delay_config()
        tmp = cfg.with_suffix(".tmp")
        self._delay_gen += 1
        tmp.write_text(json.dumps({"gen": self._delay_gen, "delays": delayed}))
        tmp.replace(cfg)
        log.info("lab: delays %s", delayed)
        if self._delayline is None:
            self._start_delayline()
        self._await_delay_gen()
        r = self.router
        want = set(delayed)
        for addr in self._delay_rules - want:
            for sel in ("from", "to"):
                _run(["ip", "-n", r, _fam(addr), "rule", "del", sel, addr, "lookup",
                      DELAY_TABLE], check=False)
        for addr in want - self._delay_rules:
            for sel in ("from", "to"):
                _run(["ip", "-n", r, _fam(addr), "rule", "add", sel, addr, "lookup",
                      DELAY_TABLE, "priority", "200"])
        self._delay_rules = want

    def _start_delayline(self) -> None:
        r = self.router
        errlog = self._delay_config().with_suffix(".log").open("a")
        proc = subprocess.Popen(
            ["ip", "netns", "exec", r, sys.executable, "-m", "tools.lab", "delayline",
             "--tun", DELAY_TUN, "--config", str(self._delay_config())],
            cwd=str(REPO), stdout=subprocess.PIPE, bufsize=0, start_new_session=True,
            # Not our stderr: a CLI "up" exits while the line runs on.
            stderr=errlog)
        errlog.close()  # the child holds its own copy
        self._dl_buf = b""
        if not self._await_line(proc, "ready", timeout=15.0):
            proc.kill()
            proc.wait(timeout=5)
            raise LabError(f"delay line did not start (see {errlog.name})")
        self._delayline = proc
        _run(["ip", "-n", r, "link", "set", DELAY_TUN, "txqueuelen", "10000", "up"])
        for conf in ("all", DELAY_TUN):
            _run(["ip", "netns", "exec", r, "sysctl", "-q", "-w",
                  f"net.ipv4.conf.{conf}.rp_filter=0"])
        for fam in ("-4", "-6"):
            _run(["ip", "-n", r, fam, "route", "replace", "default", "dev", DELAY_TUN,
                  "table", DELAY_TABLE])
            # Packets coming back out of the delay line use the main table;
            # otherwise "to <delayed site>" would send them round again.
            _run(["ip", "-n", r, fam, "rule", "add", "iif", DELAY_TUN, "lookup", "main",
                  "priority", "100"])

    def _await_delay_gen(self) -> None:
        """Block until the delay line says it runs with the config just written."""
        proc = self._delayline
        assert proc is not None
        if not self._await_line(proc, f"applied {self._delay_gen}"):
            raise LabError(f"delay line did not apply config {self._delay_gen}")

    def _await_line(self, proc: subprocess.Popen[bytes], want: str, timeout: float = 5.0) -> bool:
        """Read the delay line's stdout (raw fd, own buffer) until a line equals ``want``."""
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while True:
            while b"\n" in self._dl_buf:
                line, _, self._dl_buf = self._dl_buf.partition(b"\n")
                if line.decode(errors="replace").strip() == want:
                    return True
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return False
            chunk = os.read(fd, 4096)
            if not chunk:
                return False
            self._dl_buf += chunk

    def _stop_delayline(self) -> None:
        proc, self._delayline = self._delayline, None
        self._delay_rules = set()
        if proc is not None:
            proc.kill()
            proc.wait(timeout=10)
        with contextlib.suppress(FileNotFoundError):
            self._delay_config().unlink()

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
            "sites": {n: {"ns": self.ns(n), "addr": self.addr(n), "addr6": self.addr6(n),
                          "rate_mbit": s.rate_mbit,
                          "loss": s.loss, "delay_ms": s.delay_ms}
                      for n, s in self._sites.items()},
        }


def _fam(addr: str) -> str:
    return "-6" if ":" in addr else "-4"


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
    """Accept connections for ``seconds``; echo (or discard) what arrives.

    Prints a ``listening`` line once ready. Bulk senders and sinks are
    ``tools.traffic``; this is the echo end of :func:`pingpong`.
    """
    deadline = time.monotonic() + seconds
    # Dual-stack: IPv4 and IPv6 clients alike.
    srv = socket.create_server(("::", port), family=socket.AF_INET6, dualstack_ipv6=True,
                               reuse_port=True)
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


def pingpong(host: str, port: int, count: int, seconds: float, size: int = 64,
             gap_s: float = 0.002, report_every_s: float = 0.05) -> None:
    """Request/response round trips on one connection; prints the socket's tcp_info RTT."""
    s = _connect(host, port, seconds)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    msg = b"p" * size
    deadline = time.monotonic() + seconds
    next_report = 0.0
    with s:
        # As long as the run: on a lossy link (10 % and a delay line) a segment lost several
        # times in a row backs its RTO off past 2 s, and a 2 s timeout here ended the load
        # mid-test (CI: the probes then saw no segments at all). The stall is the network's.
        s.settimeout(max(2.0, seconds))
        for _ in range(count):
            now = time.monotonic()
            if now >= deadline:
                break
            try:
                s.sendall(msg)
                got = 0
                while got < size:
                    chunk = s.recv(size - got)
                    if not chunk:
                        return
                    got += len(chunk)
            except TimeoutError:
                return  # the run's time is up while the link still stalls
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


# ====================================================================== delay line

TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000
MAX_QUEUED = 50_000


def delayline(tun: str, config: Path) -> None:
    """Hold every packet read from TUN ``tun`` for d(src) + d(dst), then write it back.

    Delays come from ``config`` ({"addr": ms}) and are reread when it changes;
    the line exits when the file disappears (the lab is gone) and queues at
    most MAX_QUEUED packets (more are dropped, like a full queue).
    """
    import fcntl

    fd = os.open("/dev/net/tun", os.O_RDWR | os.O_NONBLOCK)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", tun.encode(), IFF_TUN | IFF_NO_PI))
    print("ready", flush=True)
    delays: dict[bytes, int] = {}
    mtime = -1.0
    next_check = 0.0
    heap: list[tuple[int, int, bytes]] = []
    seq = 0
    while True:
        now_s = time.monotonic()
        if now_s >= next_check:
            next_check = now_s + 0.1
            try:
                m = config.stat().st_mtime
            except FileNotFoundError:
                return
            if m != mtime:
                mtime = m
                with contextlib.suppress(ValueError, OSError, KeyError):
                    cfg = json.loads(config.read_text())
                    delays = {ipaddress.ip_address(a).packed: int(float(ms) * 1e6)
                              for a, ms in cfg["delays"].items()}
                    with contextlib.suppress(OSError):  # the lab process may be gone
                        print(f"applied {cfg['gen']}", flush=True)
        now = time.monotonic_ns()
        wait = 0.1 if not heap else max(0.0, (heap[0][0] - now) / 1e9)
        ready, _, _ = select.select([fd], [], [], min(wait, 0.1))
        if ready:
            for _ in range(512):
                try:
                    pkt = os.read(fd, 65536)
                except BlockingIOError:
                    break
                version = pkt[0] >> 4 if pkt else 0
                if version == 4 and len(pkt) >= 20:
                    d = delays.get(pkt[12:16], 0) + delays.get(pkt[16:20], 0)
                elif version == 6 and len(pkt) >= 40:
                    d = delays.get(pkt[8:24], 0) + delays.get(pkt[24:40], 0)
                else:
                    os.write(fd, pkt)  # nothing we can route on: pass it through
                    continue
                if len(heap) < MAX_QUEUED:
                    seq += 1
                    heapq.heappush(heap, (time.monotonic_ns() + d, seq, pkt))
        now = time.monotonic_ns()
        while heap and heap[0][0] <= now:
            with contextlib.suppress(OSError):
                os.write(fd, heapq.heappop(heap)[2])


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
    sv = sub.add_parser("serve", help="TCP echo (or sink) server (bounded)")
    sv.add_argument("--port", type=int, default=5001)
    sv.add_argument("--mode", choices=("sink", "echo"), default="echo")
    sv.add_argument("--seconds", type=float, default=30.0)
    pp = sub.add_parser("pingpong", help="request/response round trips (bounded)")
    pp.add_argument("host")
    pp.add_argument("--port", type=int, default=5002)
    pp.add_argument("--count", type=int, default=10_000)
    pp.add_argument("--seconds", type=float, default=10.0)
    pp.add_argument("--gap", type=float, default=0.002)
    pp.add_argument("--report-every", type=float, default=0.05)
    pp.add_argument("--size", type=int, default=64,
                    help="request (and echoed response) bytes; > MSS makes multi-segment RPCs")
    dl = sub.add_parser("delayline", help="(internal) the router's TUN delay line")
    dl.add_argument("--tun", default=DELAY_TUN)
    dl.add_argument("--config", type=Path, required=True)
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
        elif a.cmd == "pingpong":
            pingpong(a.host, a.port, a.count, a.seconds, size=max(1, min(a.size, 1 << 20)),
                     gap_s=a.gap, report_every_s=a.report_every)
        elif a.cmd == "delayline":
            delayline(a.tun, a.config)
    except LabError as exc:
        print(f"lab: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        raise SystemExit(main())
