"""Pure helpers of the link probes: address encoding, RTT histogram, estimates, sample building."""

from __future__ import annotations

from pathlib import Path

import pytest

from edge_agent.active import ActiveProber
from edge_agent.probes.base import (
    AF_INET,
    AF_INET6,
    SUB,
    PeerTotals,
    bucket_bounds,
    bucket_of,
    decode_addr,
    encode_addr,
    estimate_segs_out,
    hist_quantile,
    is_loopback,
    list_quantile,
    loss_ratio,
    rtt_stats,
)


@pytest.mark.parametrize(
    ("addr", "raw", "family", "back"),
    [
        ("10.1.2.3", bytes([10, 1, 2, 3]) + bytes(12), AF_INET, "10.1.2.3"),
        ("::ffff:10.1.2.3", bytes([10, 1, 2, 3]) + bytes(12), AF_INET, "10.1.2.3"),
        ("2001:db8::1", bytes.fromhex("20010db8000000000000000000000001"), AF_INET6,
         "2001:db8::1"),
        ("::1", bytes(15) + b"\x01", AF_INET6, "::1"),
    ],
)
def test_address_encoding(addr: str, raw: bytes, family: int, back: str) -> None:
    assert encode_addr(addr) == (raw, family)
    assert decode_addr(raw, family) == back


def test_decode_folds_mapped_and_rejects_unknown_family() -> None:
    assert decode_addr(bytes(10) + b"\xff\xff" + bytes([192, 0, 2, 1]), AF_INET6) == "192.0.2.1"
    with pytest.raises(ValueError):
        decode_addr(bytes(16), 99)


@pytest.mark.parametrize(
    ("addr", "loop"),
    [("127.0.0.1", True), ("127.3.2.1", True), ("::1", True), ("::ffff:127.0.0.1", True),
     ("10.0.0.1", False), ("2001:db8::1", False)],
)
def test_is_loopback(addr: str, loop: bool) -> None:
    assert is_loopback(addr) is loop


@pytest.mark.parametrize(
    ("value", "bucket"),
    [(0, 0), (1, 1), (15, 15), (16, 16), (17, 17), (31, 31), (32, 32), (33, 32), (34, 33),
     (64, 48), (1000, bucket_of(1000))],
)
def test_bucket_of_table(value: int, bucket: int) -> None:
    assert bucket_of(value) == bucket


@pytest.mark.parametrize("value", [0, 1, 7, 15, 16, 31, 32, 100, 999, 1024, 12345, 10**6, 2**31])
def test_bucket_contains_its_value_and_is_narrow(value: int) -> None:
    low, high = bucket_bounds(bucket_of(value))
    assert low <= value < high
    # Every bucket is at most 1/SUB of its lower bound wide (6.25 %).
    assert high - low <= max(1.0, low / SUB)


def test_buckets_are_contiguous() -> None:
    prev_high = 0.0
    for b in range(0, 40 * SUB):
        low, high = bucket_bounds(b)
        assert low == prev_high
        prev_high = high


@pytest.mark.parametrize(
    ("values", "q", "want", "tol"),
    [
        ([1000] * 100, 0.5, 1000, 0.0),        # one bucket: clamped to exact min/max
        ([1000] * 50 + [2000] * 50, 0.5, 1000, 0.07),
        ([1000] * 50 + [2000] * 50, 0.95, 2000, 0.07),
        (list(range(100, 10100, 100)), 0.5, 5000, 0.07),
        (list(range(100, 10100, 100)), 0.95, 9500, 0.07),
        ([5] * 10, 0.5, 5, 0.0),
    ],
)
def test_hist_quantile_accuracy(values: list[int], q: float, want: float, tol: float) -> None:
    hist: dict[int, int] = {}
    for v in values:
        hist[bucket_of(v)] = hist.get(bucket_of(v), 0) + 1
    got = hist_quantile(hist, q, min(values), max(values))
    assert got is not None
    assert abs(got - want) <= tol * want + 1e-9, got


def test_hist_quantile_empty() -> None:
    assert hist_quantile({}, 0.5) is None
    assert hist_quantile({3: 0}, 0.5) is None


@pytest.mark.parametrize(
    ("values", "q", "want"),
    [([], 0.5, None), ([7.0], 0.95, 7.0), ([1.0, 2.0, 3.0], 0.5, 2.0), ([1.0, 3.0], 0.5, 2.0)],
)
def test_list_quantile(values: list[float], q: float, want: float | None) -> None:
    assert list_quantile(values, q) == want


@pytest.mark.parametrize(
    ("sent", "acks", "retrans", "mss", "want"),
    [
        (0, 0, 0, 1448, 0),
        (1448 * 100, 50, 5, 1448, 105),      # bulk: bytes/MSS
        (1448 * 100 + 1, 50, 0, 1448, 101),  # a partial segment is a segment
        (20 * 12, 20, 0, 1448, 20),          # small request/response: one ACK per segment
        (1000, 0, 2, 0, 1002),               # a zero MSS can't divide by zero
    ],
)
def test_estimate_segs_out(sent: int, acks: int, retrans: int, mss: int, want: int) -> None:
    assert estimate_segs_out(sent, acks, retrans, mss) == want


@pytest.mark.parametrize(("r", "s", "want"), [(0, 0, 0.0), (5, 100, 0.05), (10, 5, 1.0)])
def test_loss_ratio(r: int, s: int, want: float) -> None:
    assert loss_ratio(r, s) == want


def test_rtt_stats_keeps_wire_invariant() -> None:
    assert rtt_stats(None, 5.0, 1.0) is None
    s = rtt_stats(100.0, 90.0, 120.0)  # inconsistent inputs are ordered, never rejected
    assert s is not None and s.min <= s.p50 <= s.p95


def test_peer_totals_sample() -> None:
    t = PeerTotals(rtt_values=[100.0, 200.0, 300.0], rtt_min=100.0, rtt_count=3,
                   bytes_acked=1_000_000, bytes_rcvd=500_000, segs_out=1000, retrans=50,
                   connects=2, connect_us_sum=300.0, opened=2, active_events=4)
    s = t.sample("10.0.0.2", 2.0)
    assert s.rtt_us is not None and s.rtt_us.p50 == 200.0 and s.rtt_us.min == 100.0
    assert s.tx_bps == 4_000_000 and s.rx_bps == 2_000_000
    assert s.loss == 0.05 and s.retrans == 50 and s.segs_out == 1000
    assert s.connect_us == 150.0 and s.conns == 2 and s.active
    t.passive_events = 1
    assert not t.sample("10.0.0.2", 2.0).active  # mixed traffic is not "active"


def test_active_prober_due_caps_and_rate_limits() -> None:
    p = ActiveProber(min_interval_s=10, max_peers_per_round=2)
    assert p.due(["a", "b", "c", "a"], now=100.0) == ["a", "b"]
    p._last.update({"a": 100.0, "b": 100.0})
    assert p.due(["a", "b", "c"], now=105.0) == ["c"]
    assert p.due(["a", "b", "c"], now=111.0) == ["c", "a"]


def test_open_probe_falls_back_to_sockdiag_when_ebpf_is_off() -> None:
    from edge_agent.probes import ProbeConfig, open_probe

    probe, reason = open_probe(ProbeConfig(ebpf=False))
    try:
        assert probe.name == "sockdiag"
        assert reason is not None and "disabled" in reason
        assert probe.collect() == []  # the first call only takes a baseline
    finally:
        probe.close()


def test_open_probe_falls_back_with_the_reason_when_ebpf_cannot_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from edge_agent.probes import ProbeConfig, open_probe

    # No BPF sources where the loader is told to look: whatever else this
    # machine lacks (root, BCC, BTF), eBPF can't load and the reason says why.
    monkeypatch.setenv("CFNET_BPF_DIR", str(tmp_path))
    probe, reason = open_probe(ProbeConfig(ebpf=True))
    try:
        assert probe.name == "sockdiag"
        assert reason
    finally:
        probe.close()


def test_python_buckets_match_the_bpf_c(tmp_path: Path) -> None:
    """Compile cf_log2/cf_bucket from the package's tcp_links.c natively; compare with bucket_of."""
    import random
    import re
    import shutil
    import subprocess

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    bpf = Path(__file__).resolve().parents[2] / "bpf"
    src = (bpf / "tcp_links.c").read_text()
    funcs = [m.group(0) for m in re.finditer(
        r"static __always_inline u32 cf_(log2|bucket)\(.*?\n}\n", src, re.S)]
    assert len(funcs) == 2
    harness = "\n".join([
        "#include <stdio.h>", "#include <stdint.h>",
        "typedef uint64_t u64; typedef uint32_t u32; typedef uint8_t __u8;",
        "typedef uint16_t __u16; typedef uint32_t __u32; typedef uint64_t __u64;",
        "#undef __always_inline", "#define __always_inline inline",
        f'#include "{bpf / "cfnet_links.h"}"', *funcs,
        'int main(void){unsigned long long v; while(scanf("%llu",&v)==1)'
        ' printf("%u\\n", cf_bucket(v)); return 0;}',
    ])
    (tmp_path / "b.c").write_text(harness)
    subprocess.run([cc, "-O1", "-o", str(tmp_path / "b"), str(tmp_path / "b.c")], check=True,
                   capture_output=True, timeout=60)
    rng = random.Random(7)
    values = list(range(0, 2100)) + [rng.randrange(0, 2**40) for _ in range(5000)]
    out = subprocess.run([str(tmp_path / "b")], input="\n".join(map(str, values)),
                         capture_output=True, text=True, check=True, timeout=60).stdout.split()
    assert [int(o) for o in out] == [bucket_of(v) for v in values]


@pytest.mark.parametrize(
    ("addr", "norm"),
    [("10.0.0.1", "10.0.0.1"), ("::ffff:10.0.0.1", "10.0.0.1"),
     ("2001:0db8:0000::0001", "2001:db8::1"), ("FD00::1", "fd00::1")],
)
def test_normalize_addr(addr: str, norm: str) -> None:
    from edge_agent.probes.base import normalize_addr

    assert normalize_addr(addr) == norm


def test_active_round_runs_in_the_background() -> None:
    """The agent's report loop must not wait for a round: a round to a slow peer would
    delay that interval's report and make the node look silent."""
    import socket
    import threading

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    held: list[socket.socket] = []
    accepted = threading.Event()

    def hold() -> None:  # accept and never echo: the round waits until we hang up
        conn, _ = srv.accept()
        held.append(conn)
        accepted.set()

    threading.Thread(target=hold, daemon=True).start()
    p = ActiveProber(port=srv.getsockname()[1], min_interval_s=60, timeout_s=30)
    try:
        assert p.start(["127.0.0.1"])  # returns while the exchange is still waiting
        assert accepted.wait(10)
        assert not p.wait_round(0)  # still running ...
        assert not p.start(["127.0.0.1"])  # ... so a second round is not started
        held[0].close()  # the peer hangs up: the exchange ends with an error
        assert p.wait_round(10)
        assert "127.0.0.1" in p.last_error  # closed or reset, by the kernel's choice
    finally:
        srv.close()
        for c in held:
            c.close()


def test_header_structs_match_the_c_layout(tmp_path: Path) -> None:
    """bpfsys parses cfnet_links.h into ctypes; a C compiler lays out the same header.

    Every struct's size and every field's offset must agree, or the agent would
    read the kernel's map values at the wrong places (sizes alone are also checked
    against the kernel at load time, offsets only here).
    """
    import ctypes
    import shutil
    import subprocess

    from edge_agent.bpf_loader import bpf_dir
    from edge_agent.bpfsys import header_structs

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    header = bpf_dir() / "cfnet_links.h"
    structs = header_structs(header)
    assert {"cf_addr", "cf_peer_stats", "cf_hist_key", "cf_sock"} <= set(structs)
    lines, want = [], []
    for name, typ in structs.items():
        lines.append(f'printf("%zu\\n", sizeof(struct {name}));')
        want.append(ctypes.sizeof(typ))
        for field, _ in typ._fields_:
            lines.append(f'printf("%zu\\n", offsetof(struct {name}, {field}));')
            want.append(getattr(typ, field).offset)
    (tmp_path / "h.c").write_text("\n".join([
        "#include <stdio.h>", "#include <stddef.h>", "#include <stdint.h>",
        "typedef uint8_t __u8; typedef uint16_t __u16; typedef uint32_t __u32;",
        "typedef uint64_t __u64;", f'#include "{header}"',
        "int main(void){", *lines, "return 0;}"]))
    subprocess.run([cc, "-o", str(tmp_path / "h"), str(tmp_path / "h.c")], check=True,
                   capture_output=True, timeout=60)
    out = subprocess.run([str(tmp_path / "h")], capture_output=True, text=True, check=True,
                         timeout=30).stdout.split()
    assert [int(o) for o in out] == want


@pytest.mark.parametrize("body", ["float x;", "__u8 a[N_UNDEFINED];", "struct nope inner;",
                                  "__u32 a b;"])
def test_header_structs_refuse_what_they_cannot_lay_out(tmp_path: Path, body: str) -> None:
    from edge_agent.bpfsys import header_structs
    from edge_agent.errors import ProbeError

    h = tmp_path / "x.h"
    h.write_text(f"struct s {{ __u32 ok; {body} }};\n")
    with pytest.raises(ProbeError):
        header_structs(h)


def test_btf_member_offsets_of_the_running_kernel() -> None:
    """The loader's BTF reader: known members (also inside anonymous unions), clear errors."""
    import struct

    from edge_agent.btf import VMLINUX, Btf, BtfError

    with pytest.raises(BtfError):
        Btf(b"\x00" * 64)  # bad magic
    with pytest.raises(BtfError):
        Btf(struct.pack("<HBBIIIII", 0xEB9F, 1, 0, 24, 0, 1 << 20, 0, 0))  # runs past the end
    if not VMLINUX.exists():
        pytest.skip("kernel without BTF")
    btf = Btf.vmlinux()
    assert btf.member_offset("tcp_skb_cb", "seq") == 0  # first member, stable for decades
    assert btf.member_offset("tcp_skb_cb", "end_seq") == 4
    # tcp_gso_segs sits in an anonymous struct inside an anonymous union.
    assert btf.member_offset("tcp_skb_cb", "tcp_gso_segs") == 8
    cb = btf.member_offset("sk_buff", "cb")
    assert 0 < cb < 256 and cb % 8 == 0
    segs_out, retrans = (btf.member_offset("tcp_sock", m) for m in ("segs_out", "total_retrans"))
    assert segs_out != retrans and segs_out % 4 == 0 and retrans % 4 == 0
    with pytest.raises(BtfError):
        btf.member_offset("tcp_sock", "no_such_member")
    with pytest.raises(BtfError):
        btf.member_offset("no_such_struct_cfnet", "x")


def test_open_probe_reports_the_loader_process_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A BPF source that doesn't compile: the loader process answers with the reason over
    its socket (as root, with BCC), the agent falls back to sock_diag and says why."""
    import os
    import shutil

    from edge_agent.bpf_loader import bpf_dir
    from edge_agent.probes import ProbeConfig, open_probe

    shutil.copy(bpf_dir() / "cfnet_links.h", tmp_path)
    (tmp_path / "tcp_links.c").write_text("this is not C;\n")
    monkeypatch.setenv("CFNET_BPF_DIR", str(tmp_path))
    before = set(os.listdir("/proc/self/fd"))
    probe, reason = open_probe(ProbeConfig(ebpf=True, bcc_fallback=True))
    try:
        assert probe.name == "sockdiag"
        assert reason
        if os.geteuid() == 0 and Path("/sys/kernel/btf/vmlinux").exists():
            assert "tcp_links.c" in reason, reason  # the loader's own words
    finally:
        probe.close()
    assert set(os.listdir("/proc/self/fd")) <= before  # the socket pair went with it
