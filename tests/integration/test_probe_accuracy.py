"""Accuracy of the link probes against the kernel's own figures, on a real lab.

Site ``a`` is the measuring node; the probes count only its sockets (eBPF via
``local_addrs``, sock_diag by living in ``a``'s namespace). Each test runs a
bounded load generator (``python -m tools.lab ...``) between lab namespaces
and compares what the probe reports with what the kernel says:

- RTT: the probe's p50 against the connection's own ``tcp_info`` RTT, over a
  link with 2 ms of one-way delay (the lab's delay line) so RTT is ~4 ms;
- loss: 5 % random nftables drop on the receiver's link (and, for eBPF, the
  kernel's own tcp_info retransmit ratio over the same intervals); and, for
  eBPF, a spread of cases against the kernel's ratio of the same flows: 1-15 %
  loss, bulk and request/response, IPv4 and IPv6, GSO/TSO on and off, with and
  without a tbf and a delay line (sub-ms RTT + GSO is where counting
  retransmitted skbs instead of segments read 15-30 % of the kernel's loss);
- throughput: a saturating transfer through a 20 Mbit/s tbf.

Every eBPF case runs with both loaders (``ebpf-core``: the prebuilt CO-RE object by
libbpf; ``ebpf-bcc``: the same C compiled by BCC, the fallback), forced with
``CFNET_BPF_LOADER``; each checks it got the loader it asked for.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest

from edge_agent.errors import ProbeError
from edge_agent.probes.base import LinkProbe
from edge_agent.wire import LinkSample
from tools.lab import Lab, SiteSpec, delay_supported

pytestmark = [pytest.mark.root, pytest.mark.slow]

RATE_MBIT = 20.0
DELAY_MS = 2.0
PY = sys.executable


def _need_root() -> None:
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("nft") is None:
        pytest.skip("needs root, iproute2 and nftables")


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    _need_root()
    sites = [SiteSpec("a"), SiteSpec("b"), SiteSpec("c", rate_mbit=RATE_MBIT)]
    with Lab(sites, prefix=f"cfpa{os.getpid() % 100000}") as lab_:
        yield lab_


def _ebpf(lab: Lab, loader: str) -> LinkProbe:
    from edge_agent.probes.ebpf import EbpfProbe

    old = os.environ.get("CFNET_BPF_LOADER")
    os.environ["CFNET_BPF_LOADER"] = loader  # read once, while the probe loads
    try:
        probe = EbpfProbe(local_addrs=(lab.addr("a"), lab.addr6("a")))
    except ProbeError as exc:
        # Root, libbpf, BCC, BTF and tracefs are what setup provides: eBPF not loading
        # here is a failure to report, not a reason to skip.
        pytest.fail(f"eBPF probe ({loader} loader) failed to load: {exc}")
    finally:
        if old is None:
            os.environ.pop("CFNET_BPF_LOADER", None)
        else:
            os.environ["CFNET_BPF_LOADER"] = old
    assert probe.loader == loader, (probe.loader, probe.loader_reason)
    return probe


def _sockdiag(lab: Lab) -> LinkProbe:
    from edge_agent.probes.sockdiag import SockDiagProbe

    return SockDiagProbe(netns=lab.ns("a"))


PROBES: dict[str, Callable[[Lab], LinkProbe]] = {
    "ebpf-core": lambda lab: _ebpf(lab, "core"),
    "ebpf-bcc": lambda lab: _ebpf(lab, "bcc"),
    "sockdiag": _sockdiag,
}
probe_param = pytest.mark.parametrize(
    "probe_name", [pytest.param("ebpf-core", marks=pytest.mark.ebpf),
                   pytest.param("ebpf-bcc", marks=pytest.mark.ebpf), "sockdiag"])
# For the eBPF-only tests: make_probe(f"ebpf-{loader}").
loader_param = pytest.mark.parametrize("loader", ["core", "bcc"])


@pytest.fixture
def make_probe(lab: Lab) -> Iterator[Callable[[str], LinkProbe]]:
    opened: list[LinkProbe] = []

    def make(name: str) -> LinkProbe:
        p = PROBES[name](lab)
        opened.append(p)
        return p

    yield make
    for p in opened:
        p.close()


def _server(lab: Lab, site: str, port: int, mode: str, seconds: float) -> subprocess.Popen[str]:
    p = lab.popen(site, [PY, "-m", "tools.lab", "serve", "--port", str(port), "--mode", mode,
                         "--seconds", str(seconds)], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None
    assert "listening" in p.stdout.readline()  # ready before the client starts
    return p


def _sink(lab: Lab, site: str, port: int, seconds: float) -> subprocess.Popen[str]:
    return lab.popen(site, [PY, "-m", "tools.traffic", "sink", "--port", str(port),
                            "--duration", str(seconds)], stderr=subprocess.DEVNULL, text=True)


def _send(lab: Lab, src: str, dst: str, port: int, *, seconds: float, rate_mbit: float,
          max_mb: float) -> subprocess.Popen[str]:
    """Bounded bulk sender (tools.traffic; it retries until the sink listens)."""
    return lab.popen(src, [PY, "-m", "tools.traffic", "send", lab.addr(dst), "--port", str(port),
                           "--duration", str(seconds), "--rate-mbit", str(rate_mbit),
                           "--max-mb", str(max_mb)], stderr=subprocess.DEVNULL, text=True)


def _intervals(probe: LinkProbe, peer: str, n: int, interval_s: float = 1.0) -> list[LinkSample]:
    """``n`` consecutive collect() intervals; the samples for ``peer``."""
    out: list[LinkSample] = []
    for _ in range(n):
        time.sleep(interval_s)
        out.extend(s for s in probe.collect() if s.peer == peer)
    return out


def _finish(*procs: subprocess.Popen[str]) -> None:
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=5)


@probe_param
@pytest.mark.parametrize("family", ["ipv4", "ipv6"])
def test_rtt_matches_tcp_info(lab: Lab, make_probe: Callable[[str], LinkProbe],
                              probe_name: str, family: str) -> None:
    probe = make_probe(probe_name)
    peer = lab.addr("b") if family == "ipv4" else lab.addr6("b")
    delayed = delay_supported()
    if delayed:
        lab.set_delay("b", DELAY_MS)  # RTT a<->b of a few ms, as between real sites
    try:
        srv = _server(lab, "b", 5002, "echo", 12)
        probe.collect()
        cli = lab.popen("a", [PY, "-m", "tools.lab", "pingpong", peer, "--port",
                              "5002", "--seconds", "6", "--count", "5000", "--gap", "0.002",
                              "--report-every", "0.005"],
                        stdout=subprocess.PIPE, text=True)
        marks = [time.time()]
        per_interval: list[list[LinkSample]] = []
        for _ in range(5):
            per_interval.append(_intervals(probe, peer, 1))
            marks.append(time.time())
        out, _ = cli.communicate(timeout=30)
        _finish(srv)
    finally:
        if delayed:
            lab.set_delay("b", 0.0)
    # The client reports its socket's tcp_info RTT every 5 ms. Compare like
    # with like, interval by interval: the eBPF p50 summarises the interval,
    # so against the median of that interval's reports; sock_diag reads the
    # RTT at the moment of collect(), which lies somewhere in the last ~150 ms
    # before the mark taken after it returns (more on a loaded machine), so
    # against the report of that window closest to what it read. (On a loaded
    # machine the delay line's RTT swings by several ms within seconds, and
    # the smoothed RTT follows it ack by ack: the single report nearest the
    # mark was 13 % off once while the suite ran beside it.)
    reports = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    samples = [s for got in per_interval for s in got]
    assert reports and len(samples) >= 3, (reports[:5], samples)
    have_i = [got[0].rtt_us.p50 if got and got[0].rtt_us else float("nan")
              for got in per_interval]
    want_i: list[float] = []
    for (t0, t1), have_one in zip(itertools.pairwise(marks), have_i, strict=True):
        if probe_name.startswith("ebpf"):
            inside = [r["rtt_us"] for r in reports if t0 <= r["t"] < t1]
            want_i.append(statistics.median(inside) if inside else float("nan"))
        else:
            window = [r for r in reports if t1 - 0.15 <= r["t"] <= t1 + 0.01]
            window = window or [min(reports, key=lambda r: abs(r["t"] - t1))]
            want_i.append(min(window, key=lambda r: abs(r["rtt_us"] - have_one))["rtt_us"]
                          if have_one == have_one else float("nan"))
    pairs = [(h, w) for h, w in zip(have_i, want_i, strict=False) if h == h and w == w]
    assert len(pairs) >= 3, (have_i, want_i)
    have = statistics.median(h for h, _ in pairs)
    want = statistics.median(w for _, w in pairs)
    print(f"{probe_name}/{family}: rtt p50 {have:.0f} us vs tcp_info {want:.0f} us")
    assert abs(have - want) <= max(0.10 * want, 50.0), pairs
    if delayed:
        assert want >= 2 * DELAY_MS * 1000 * 0.95  # the delay line really was in the path
    for s in samples:
        assert s.rtt_us is None or s.rtt_us.min <= s.rtt_us.p50 <= s.rtt_us.p95


@probe_param
def test_loss_under_random_drop(lab: Lab, make_probe: Callable[[str], LinkProbe],
                                probe_name: str) -> None:
    probe = make_probe(probe_name)
    # The kernel's own counters (tcp_info) over the same interval, as a reference.
    kernel = make_probe("sockdiag") if probe_name != "sockdiag" else None
    lab.set_loss("b", 0.05)
    # A few ms of RTT: on a loaded machine a sub-ms RTT lets scheduling stalls
    # fire tail-loss probes and RTOs, spurious retransmits the link didn't cause.
    delayed = delay_supported()
    if delayed:
        lab.set_delay("b", DELAY_MS)
    try:
        srv = _sink(lab, "b", 5003, 12)
        probe.collect()
        if kernel is not None:
            kernel.collect()
        cli = _send(lab, "a", "b", 5003, seconds=6, rate_mbit=40, max_mb=60)
        samples: list[LinkSample] = []
        ref: list[LinkSample] = []
        for _ in range(7):
            samples += _intervals(probe, lab.addr("b"), 1)
            if kernel is not None:
                ref += [s for s in kernel.collect() if s.peer == lab.addr("b")]
        _finish(cli, srv)
    finally:
        lab.set_loss("b", 0.0)
        if delayed:
            lab.set_delay("b", 0.0)
    retrans = sum(s.retrans for s in samples)
    segs = sum(s.segs_out for s in samples)
    assert segs > 1000, samples
    loss = retrans / segs
    print(f"{probe_name}: loss {loss:.4f} ({retrans}/{segs})")
    assert 0.03 <= loss <= 0.07, (loss, samples)
    assert all(0.0 <= s.loss <= 1.0 for s in samples)
    if kernel is not None:
        k_loss = sum(s.retrans for s in ref) / max(1, sum(s.segs_out for s in ref))
        print(f"{probe_name}: kernel's tcp_info loss {k_loss:.4f}")
        assert abs(loss - k_loss) <= 0.01, (loss, k_loss)


@probe_param
def test_throughput_through_tbf(lab: Lab, make_probe: Callable[[str], LinkProbe],
                                probe_name: str) -> None:
    probe = make_probe(probe_name)
    srv = _sink(lab, "c", 5004, 14)
    probe.collect()
    cli = _send(lab, "a", "c", 5004, seconds=8, rate_mbit=0, max_mb=40)
    samples = _intervals(probe, lab.addr("c"), 7)
    _finish(cli, srv)
    # Skip the first two intervals: slow start and the tbf burst.
    steady = [s.tx_bps for s in samples[2:6]]
    assert len(steady) >= 3, samples
    tx = statistics.median(steady)
    print(f"{probe_name}: throughput {tx / 1e6:.2f} Mbit/s vs tbf {RATE_MBIT} Mbit/s")
    assert abs(tx - RATE_MBIT * 1e6) <= 0.15 * RATE_MBIT * 1e6, steady


@pytest.mark.ebpf
@loader_param
def test_active_probe_is_measured_and_marked(lab: Lab,
                                             make_probe: Callable[[str], LinkProbe],
                                             loader: str) -> None:
    from edge_agent.active import ActiveProber, EchoServer
    from edge_agent.probes.base import DEFAULT_PROBE_PORT
    from tools.netns import in_netns

    probe = make_probe(f"ebpf-{loader}")
    # The lab's namespaces are private, so the default probe port is free there.
    server = EchoServer(lab.addr("b"), DEFAULT_PROBE_PORT)
    in_netns(lab.ns("b"), server.start)
    try:
        prober = ActiveProber(min_interval_s=60, timeout_s=3)
        probe.collect()
        in_netns(lab.ns("a"), prober.probe, [lab.addr("b")])
        assert not prober.last_error, prober.last_error
        assert prober.due([lab.addr("b")]) == []  # probed within min_interval_s: skipped
        samples = [s for s in probe.collect() if s.peer == lab.addr("b")]
    finally:
        server.stop()
    assert len(samples) == 1, samples
    s = samples[0]
    assert s.active, s
    assert s.rtt_us is not None and s.samples >= 10, s
    assert s.conns == 1 and s.connect_us is not None and s.connect_us > 0, s


# (traffic, family, gso, loss, tbf rate, one-way delay): the failing
# conditions (sub-ms RTT, GSO on, tbf) and the easy ones, each family and mode.
LOSS_CASES = [
    pytest.param("bulk", "ipv4", True, 0.02, 50.0, 0.0, id="bulk-v4-gso-2pct-50mbit"),
    pytest.param("bulk", "ipv6", True, 0.12, 7.0, 0.0, id="bulk-v6-gso-12pct-7mbit"),
    pytest.param("bulk", "ipv4", False, 0.15, 20.0, DELAY_MS, id="bulk-v4-nogso-15pct-delay"),
    pytest.param("bulk", "ipv6", False, 0.01, 30.0, 0.0, id="bulk-v6-nogso-1pct-30mbit"),
    pytest.param("rr", "ipv4", True, 0.05, None, 0.0, id="rr-v4-gso-5pct"),
    pytest.param("rr", "ipv6", False, 0.10, None, DELAY_MS, id="rr-v6-nogso-10pct-delay"),
]


@pytest.mark.ebpf
@loader_param
@pytest.mark.parametrize(("traffic", "family", "gso", "loss", "rate", "delay"), LOSS_CASES)
def test_ebpf_loss_matches_kernel(lab: Lab, make_probe: Callable[[str], LinkProbe],
                                  traffic: str, family: str, gso: bool, loss: float,
                                  rate: float | None, delay: float, loader: str) -> None:
    """eBPF loss vs the kernel's tcp_info retrans/segs_out of the same flows, same intervals."""
    probe = make_probe(f"ebpf-{loader}")
    kernel = make_probe("sockdiag")  # tcp_info of a's sockets: the kernel's own counters
    peer = lab.addr("b") if family == "ipv4" else lab.addr6("b")
    port = 5100 + LOSS_CASES.index(next(c for c in LOSS_CASES if c.values[:4] == (
        traffic, family, gso, loss)))
    window = 6

    def measure(port: int) -> tuple[list[LinkSample], list[LinkSample]]:
        """One run of the load and the window: the eBPF probe's and the kernel's samples."""
        procs: list[subprocess.Popen[str]] = []
        try:
            lab.set_gso("b", gso)
            lab.set_gso("a", gso)
            lab.set_rate("b", rate)
            lab.set_loss("b", loss)
            if delay and delay_supported():
                lab.set_delay("b", delay)
            if traffic == "bulk":
                procs.append(_sink(lab, "b", port, window + 6))
                procs.append(lab.popen("a", [PY, "-m", "tools.traffic", "send", peer, "--port",
                                             str(port), "--duration", str(window + 4),
                                             "--rate-mbit", "0", "--max-mb", "200"],
                                       stderr=subprocess.DEVNULL, text=True))
            else:
                procs.append(_server(lab, "b", port, "echo", window + 6))
                # 6000-byte requests and responses: each RPC is several segments.
                procs.append(lab.popen("a", [PY, "-m", "tools.lab", "pingpong", peer, "--port",
                                             str(port), "--seconds", str(window + 4), "--count",
                                             "100000", "--gap", "0.001", "--size", "6000",
                                             "--report-every", "60"],
                                       stdout=subprocess.DEVNULL, text=True))
            # Connected and past the handshake before the window opens: at 12 % loss a SYN or
            # SYN-ACK is lost often enough, and the sender's retries (tools.traffic) late enough,
            # that a fixed second left the whole window empty once (0 segments for both probes).
            # Flowing means data, not a retransmitted SYN (1 segment out, 1 retransmitted: a
            # handshake still backing off passed a "> 0" check once, in CI, and the window stayed
            # empty): once connected the load sends hundreds of segments a second.
            flowing = time.monotonic() + 15.0
            seen = 0
            while time.monotonic() < flowing and seen <= 20:
                seen += sum(s.segs_out for s in kernel.collect() if s.peer == peer)
                time.sleep(0.5)
            probe.collect()
            kernel.collect()
            got: list[LinkSample] = []
            ref: list[LinkSample] = []
            for _ in range(window):
                time.sleep(1.0)
                got += [s for s in probe.collect() if s.peer == peer]
                ref += [s for s in kernel.collect() if s.peer == peer]
        finally:
            # Measured: stop the load now rather than wait for its own deadline.
            for p in procs:
                if p.poll() is None:
                    p.kill()
                p.wait(10)
            lab.set_loss("b", 0.0)
            lab.set_rate("b", None)
            lab.set_gso("b", False)
            lab.set_gso("a", False)
            if delay and delay_supported():
                lab.set_delay("b", 0.0)
        return got, ref

    # The load is the lab's, not what this test measures: a window in which the kernel itself
    # counted no flow (the echo or the client gave up on a lossy link: CI, once, the
    # connection was gone within the window) is measured again, once. A window the kernel
    # saw flowing and the probe did not is a failure, never retried.
    got, ref = measure(port)
    if sum(s.segs_out for s in ref) <= 300:
        print(f"the kernel counted {sum(s.segs_out for s in ref)} segments in the window: "
              "the load did not flow; measured again")
        got, ref = measure(port + 50)  # a port of its own: the first load's may linger
    e_re, e_segs = sum(s.retrans for s in got), sum(s.segs_out for s in got)
    k_re, k_segs = sum(s.retrans for s in ref), sum(s.segs_out for s in ref)
    assert k_segs > 300, f"the load did not flow twice: the kernel counted {k_segs} segments"
    assert e_segs > 300, f"eBPF counted {e_segs} segments where the kernel counted {k_segs}: {got}"
    e_loss, k_loss = e_re / e_segs, k_re / k_segs
    tol = max(0.01, 0.15 * k_loss)
    print(f"{traffic}/{family}/gso={gso}/loss={loss}: ebpf {e_loss:.4f} ({e_re}/{e_segs}) vs "
          f"kernel {k_loss:.4f} ({k_re}/{k_segs}); tolerance {tol:.4f}")
    assert k_re > 0, ref  # the lab really dropped packets
    assert abs(e_loss - k_loss) <= tol, (e_loss, k_loss, got, ref)


@pytest.mark.ebpf
@loader_param
def test_ebpf_folds_ipv4_mapped_addresses(lab: Lab,
                                          make_probe: Callable[[str], LinkProbe],
                                          loader: str) -> None:
    """A dual-stack server's sockets carry ::ffff:a.b.c.d; the program folds both ends to
    IPv4, so the local filter (IPv4 addresses of a) matches and the peer is b's IPv4."""
    probe = make_probe(f"ebpf-{loader}")
    srv = _server(lab, "a", 5090, "echo", 8)  # AF_INET6 dual-stack listener in a
    probe.collect()
    cli = lab.popen("b", [PY, "-m", "tools.lab", "pingpong", lab.addr("a"), "--port", "5090",
                          "--seconds", "3", "--count", "500", "--gap", "0.002",
                          "--report-every", "60"], stdout=subprocess.DEVNULL, text=True)
    got = _intervals(probe, lab.addr("b"), 3)
    _finish(cli)
    srv.kill()
    srv.wait(10)
    assert got and sum(s.samples for s in got) >= 50, got
    assert sum(s.rx_bps for s in got) > 0 and sum(s.conns for s in got) == 1, got
