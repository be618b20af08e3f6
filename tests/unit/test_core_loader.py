"""The CO-RE loader on the real kernel: the prebuilt object, libbpf1 through ctypes.

- The object the agent ships is what the sources build to (compiled again here, for x86
  and for arm64: byte-identical, which is what makes one object serve both arches).
- It loads in the agent's process, relocated against this kernel's BTF, with the
  parameters set in .rodata; it counts loopback traffic with the kernel's own counters;
  closing it detaches the programs. Once attached, libbpf is done with: its descriptors
  are the agent's and libbpf (with libelf) is unmapped (the agent's memory); closing leaves
  no descriptor behind. Where libbpf's link does not read as expected, the object is kept
  and closing it detaches through libbpf.
- The early load (cfnet-agent starts it in a thread right after its configuration): the
  probe claims it once; one it does not claim (other parameters, eBPF off) is detached;
  libbpf's reason for a failure reaches the probe's fallback.
- The choice between CO-RE and BCC, and its reason: a missing BTF (the CFNET_BTF_PATH
  test seam) sends the probe to BCC, which says why; forcing CO-RE there fails over to
  sock_diag with the reason.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from edge_agent import bpf_loader, libbpf_loader
from edge_agent.bpfsys import map_info, prog_alive
from edge_agent.errors import ProbeError
from tools import build_bpf

pytestmark = [pytest.mark.root, pytest.mark.ebpf]


def _need_root_btf() -> None:
    if os.geteuid() != 0 or not Path("/sys/kernel/btf/vmlinux").exists():
        pytest.fail("needs root and a kernel with BTF (setup provides both here)")


def _obj() -> Path:
    return libbpf_loader.object_path(bpf_loader.bpf_dir())


def _prog_id(fd: int) -> int:
    with open(f"/proc/self/fdinfo/{fd}") as f:
        for line in f:
            if line.startswith("prog_id:"):
                return int(line.split()[1])
    raise AssertionError(f"no prog_id in fdinfo of {fd}")


def _loopback_traffic(rounds: int = 100) -> None:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    with srv, socket.create_connection(srv.getsockname()) as c:
        a, _ = srv.accept()
        with a:
            for _ in range(rounds):
                c.sendall(b"x" * 1000)
                got = 0
                while got < 1000:
                    got += len(a.recv(65536))
                a.sendall(b"y")
                c.recv(10)


def test_shipped_object_is_what_the_sources_build_for_both_arches() -> None:
    obj = _obj()
    assert obj.is_file(), f"{obj} missing: tools/setup.sh builds it (python -m tools.build_bpf)"
    include = build_bpf.vmlinux_h(build_bpf.DEFAULT_BTF, obj.parent).parent
    with tempfile.TemporaryDirectory() as d:
        for arch in ("x86", "arm64"):
            out = Path(d, f"{arch}.o")
            build_bpf.compile_object(out, include, arch)
            assert out.read_bytes() == obj.read_bytes(), (
                f"the {arch} build differs from {obj}: stale (rerun tools/build_bpf.py) or, "
                "for arm64, arch-specific")


def _bpf_fds() -> list[str]:
    """This process's BPF and perf event descriptors, by kind."""
    kinds = []
    for name in os.listdir("/proc/self/fd"):
        try:
            kind = os.readlink(f"/proc/self/fd/{name}")
        except OSError:  # listdir's own descriptor, gone
            continue
        if kind.startswith(("anon_inode:bpf", "anon_inode:[perf_event]")):
            kinds.append(kind)
    return sorted(kinds)


def _libbpf_mapped() -> bool:
    with open("/proc/self/maps") as f:
        return any("/libbpf.so" in line or "/libelf" in line for line in f)


def test_core_probe_loads_in_process_counts_and_detaches_on_close(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _need_root_btf()
    monkeypatch.delenv("CFNET_BPF_LOADER", raising=False)
    monkeypatch.delenv("CFNET_BTF_PATH", raising=False)
    from edge_agent.probes.ebpf import EbpfProbe

    fds_before = _bpf_fds()
    t0 = time.monotonic()
    probe = EbpfProbe(include_loopback=True, max_peers=128)
    load_s = time.monotonic() - t0
    try:
        assert probe.loader == "core", probe.loader_reason
        assert probe._hand is not None and probe._hand.loader_pid == os.getpid()
        assert probe.kernel_counters
        fds = probe.fds
        assert len(fds["progs"]) == 3 and len(fds["links"]) == 3, fds
        # bpf_map__set_max_entries reached the kernel
        assert map_info(probe._hand.maps["peers"]).max_entries == 128
        ids = [_prog_id(fd) for fd in fds["progs"]]
        assert load_s < 5, f"CO-RE load took {load_s:.2f} s"
        probe.collect()
        _loopback_traffic()
        samples = {s.peer: s for s in probe.collect()}
        lo = samples.get("127.0.0.1")
        assert lo is not None, f"no loopback sample: {samples}"
        assert lo.samples > 50 and lo.segs_out > 50 and lo.conns >= 1, lo
        # The descriptors are the agent's and libbpf is gone: a BPF link over a perf event
        # per program (this kernel has BPF links), no libbpf object kept.
        hand = probe._hand
        assert hand.owner is None and len(hand.events) == 3, (hand.owner, hand.events)
        assert not _libbpf_mapped(), "libbpf still mapped after the load"
        assert libbpf_loader._users == 0 and libbpf_loader._lib is None
        # The loader choice's check (the probe's, after the load) does not map it again.
        assert bpf_loader.choose()[0] == "core" and not _libbpf_mapped()
    finally:
        probe.close()
    assert not any(prog_alive(i) for i in ids), "programs still loaded after close"
    assert _bpf_fds() == fds_before, "BPF or perf event descriptors left open after close"


def test_where_libbpfs_link_reads_otherwise_the_object_is_kept_and_detaches(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The perf event descriptor libbpf's link names is checked before the descriptors are
    # taken from libbpf; failing that, the object stays libbpf's, as does libbpf.
    _need_root_btf()
    monkeypatch.delenv("CFNET_BPF_LOADER", raising=False)
    monkeypatch.delenv("CFNET_BTF_PATH", raising=False)
    monkeypatch.setattr(libbpf_loader, "_fd_kind", lambda fd: "not a perf event")
    from edge_agent.probes.ebpf import EbpfProbe

    fds_before = _bpf_fds()
    probe = EbpfProbe(include_loopback=True, max_peers=128)
    try:
        hand = probe._hand
        assert probe.loader == "core" and hand is not None
        assert isinstance(hand.owner, libbpf_loader.CoreObject) and not hand.events
        ids = [_prog_id(fd) for fd in probe.fds["progs"]]
        assert all(prog_alive(i) for i in ids) and _libbpf_mapped()
        assert libbpf_loader._users == 1
    finally:
        probe.close()
    assert not any(prog_alive(i) for i in ids), "programs still loaded after close"
    assert _bpf_fds() == fds_before, "BPF or perf event descriptors left open after close"
    assert libbpf_loader._users == 0 and not _libbpf_mapped(), "libbpf kept after close"


def test_rodata_parameters_reach_the_programs(monkeypatch: pytest.MonkeyPatch) -> None:
    _need_root_btf()
    monkeypatch.delenv("CFNET_BPF_LOADER", raising=False)
    from edge_agent.probes.ebpf import EbpfProbe

    # include_loopback off (the default): loopback traffic is not counted at all.
    probe = EbpfProbe(include_loopback=False)
    try:
        assert probe.loader == "core"
        probe.collect()
        _loopback_traffic(30)
        assert [s for s in probe.collect() if s.peer == "127.0.0.1"] == []
    finally:
        probe.close()
    # filter_local with an address nothing uses: loopback included, still nothing counted.
    probe = EbpfProbe(include_loopback=True, local_addrs=("10.255.0.1",))
    try:
        probe.collect()
        _loopback_traffic(30)
        assert probe.collect() == []
    finally:
        probe.close()


def test_without_btf_the_probe_falls_back_to_bcc_only_where_asked_and_says_why(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _need_root_btf()
    monkeypatch.delenv("CFNET_BPF_LOADER", raising=False)
    missing = tmp_path / "no-btf"
    monkeypatch.setenv("CFNET_BTF_PATH", str(missing))  # the test seam: a kernel without BTF
    with pytest.raises(ProbeError, match=r"no kernel BTF .* bcc_fallback: true"):
        bpf_loader.choose()  # not asked: no compiler is run on the device
    loader, why = bpf_loader.choose(bcc_fallback=True)
    assert loader == "bcc" and str(missing) in why and "BTF" in why, why
    from edge_agent.probes.ebpf import EbpfProbe

    probe = EbpfProbe(include_loopback=True, bcc_fallback=True)
    try:
        assert probe.loader == "bcc" and "no kernel BTF" in probe.loader_reason
        # BCC without BTF: no offsets for the kernel's counters, the loss is estimated
        assert not probe.kernel_counters
        assert probe._hand is not None and probe._hand.loader_pid != os.getpid()
    finally:
        probe.close()


def test_core_forced_without_btf_falls_back_to_sockdiag_with_the_reason(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CFNET_BTF_PATH", str(tmp_path / "no-btf"))
    monkeypatch.setenv("CFNET_BPF_LOADER", "core")
    with pytest.raises(ProbeError, match="no kernel BTF"):
        bpf_loader.choose()
    monkeypatch.setenv("CFNET_BPF_LOADER", "nonsense")
    with pytest.raises(ProbeError, match="one of auto, core, bcc"):
        bpf_loader.choose()
    if os.geteuid() != 0:
        return
    monkeypatch.setenv("CFNET_BPF_LOADER", "core")
    from edge_agent.probes import ProbeConfig, open_probe

    probe, reason = open_probe(ProbeConfig(ebpf=True, local_addrs=("10.255.0.1",)))
    try:
        assert probe.name == "sockdiag" and reason and "no kernel BTF" in reason, reason
    finally:
        probe.close()


def test_a_missing_object_names_the_cause_and_the_fix_and_bcc_waits_to_be_asked(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # An agent installed without the object (a bpf directory with the sources only).
    for f in ("tcp_links.c", "cfnet_links.h", "cfnet_compat.h"):
        (tmp_path / f).write_bytes((bpf_loader.bpf_dir() / f).read_bytes())
    monkeypatch.setenv("CFNET_BPF_DIR", str(tmp_path))
    monkeypatch.delenv("CFNET_BPF_LOADER", raising=False)
    monkeypatch.delenv("CFNET_BTF_PATH", raising=False)
    if not libbpf_loader.btf_path().exists():
        pytest.skip("this kernel has no BTF: the reason is the BTF's, tested above")
    with pytest.raises(ProbeError) as err:
        bpf_loader.choose()
    msg = str(err.value)
    assert f"no CO-RE object at {tmp_path}/obj/tcp_links.bpf.o" in msg, msg
    assert "python -m tools.build_bpf" in msg and "bcc_fallback: true" in msg, msg
    assert bpf_loader.choose(bcc_fallback=True)[0] == "bcc"
    from edge_agent.probes import ProbeConfig, open_probe

    with caplog.at_level(logging.WARNING, logger="edge_agent.probes"):
        probe, reason = open_probe(ProbeConfig(ebpf=True, local_addrs=("10.255.0.1",)))
    try:
        assert probe.name == "sockdiag" and reason and "no CO-RE object" in reason, reason
    finally:
        probe.close()
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert errors and "no CO-RE object" in errors[0].getMessage()


def test_a_broken_object_is_refused_with_libbpfs_reason(tmp_path: Path) -> None:
    _need_root_btf()
    bad = tmp_path / "tcp_links.bpf.o"
    bad.write_bytes(b"\x7fELF not really")
    with pytest.raises(ProbeError, match="libbpf cannot open"):
        libbpf_loader.load(bad, config=bytes(16), max_entries={}, maps=[])


def test_the_early_core_load_is_claimed_by_the_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    # cfnet-agent starts the CO-RE load in a thread right after its configuration
    # (edge_agent.main.start_loader_early) and the probe takes that load's descriptors.
    _need_root_btf()
    monkeypatch.delenv("CFNET_BPF_LOADER", raising=False)
    monkeypatch.delenv("CFNET_BTF_PATH", raising=False)
    from edge_agent.probes.ebpf import EbpfProbe, start_early

    pending, why = start_early(filter_local=True)
    assert isinstance(pending, bpf_loader.PendingCore), why
    probe = EbpfProbe(local_addrs=("10.255.0.1",), pending=pending)
    try:
        assert probe.loader == "core" and probe._hand is not None
        assert probe._hand.loader_pid == os.getpid()
        ids = [_prog_id(fd) for fd in probe.fds["progs"]]
        assert len(ids) == 3
        with pytest.raises(ProbeError, match="already claimed"):
            pending.result()  # claimed once
        pending.cancel()  # a no-op once claimed: the probe's programs stay
        assert all(prog_alive(i) for i in ids)
        assert probe.collect() == []
    finally:
        probe.close()
    assert not any(prog_alive(i) for i in ids), "programs still loaded after close"


def test_an_unclaimed_early_core_load_is_detached_on_cancel(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _need_root_btf()
    monkeypatch.delenv("CFNET_BPF_LOADER", raising=False)
    monkeypatch.delenv("CFNET_BTF_PATH", raising=False)
    from edge_agent.probes import ProbeConfig, open_probe
    from edge_agent.probes.ebpf import EbpfProbe, start_early

    # A node without addresses needs the program without the local filter: the early
    # load (made with it) is dropped, and detached, and the probe loads its own.
    pending, why = start_early(filter_local=True)
    assert isinstance(pending, bpf_loader.PendingCore), why
    assert pending._done.wait(30), "the early CO-RE load did not finish in 30 s"
    early = pending._hand
    assert early is not None, pending._error
    early_ids = [_prog_id(fd) for fd in early.progs.values()]
    probe = EbpfProbe(local_addrs=(), pending=pending)
    try:
        assert probe._hand is not early and probe.loader == "core"
        assert not any(prog_alive(i) for i in early_ids), "the dropped early load is attached"
    finally:
        probe.close()
    # eBPF off after all: open_probe cancels the early load, which detaches it.
    pending, why = start_early(filter_local=True)
    assert isinstance(pending, bpf_loader.PendingCore), why
    probe2, reason = open_probe(ProbeConfig(ebpf=False), pending=pending)
    probe2.close()
    assert reason and "disabled" in reason
    assert pending._hand is None and pending._done.is_set()
    with pytest.raises(ProbeError, match="already claimed or cancelled"):
        pending.result()


def test_a_failing_early_core_load_gives_libbpfs_reason_to_the_probe(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _need_root_btf()
    monkeypatch.delenv("CFNET_BPF_LOADER", raising=False)
    monkeypatch.setenv("CFNET_BPF_LOADER", "core")
    (tmp_path / "obj").mkdir()
    (tmp_path / "obj" / "tcp_links.bpf.o").write_bytes(b"\x7fELF not really")
    for name in ("cfnet_links.h", "tcp_links.c"):
        (tmp_path / name).write_bytes((bpf_loader.bpf_dir() / name).read_bytes())
    monkeypatch.setenv("CFNET_BPF_DIR", str(tmp_path))
    from edge_agent.probes import ProbeConfig, open_probe
    from edge_agent.probes.ebpf import start_early

    pending, why = start_early(filter_local=True)
    assert isinstance(pending, bpf_loader.PendingCore), why
    probe, reason = open_probe(ProbeConfig(ebpf=True, local_addrs=("10.255.0.1",)),
                               pending=pending)
    try:
        assert probe.name == "sockdiag" and reason and "libbpf cannot open" in reason, reason
    finally:
        probe.close()


# Two threads in a process of their own (a segfault ends the process, not the suite): the
# probe's check (``available()``: maps libbpf, unmaps it when nothing uses it) against a
# load (counts itself in, calls libbpf, counts itself out), for a bounded time.
_RACE = """
import sys, threading, time
from edge_agent import libbpf_loader as L
stop = time.monotonic() + float(sys.argv[1])
n = [0, 0]
def check():
    while time.monotonic() < stop:
        L.available(); n[0] += 1
def load():
    while time.monotonic() < stop:
        lib = L._use(+1)
        try:
            lib.lib.bpf_object__open_file(b"/nonexistent/x.bpf.o", None)
        finally:
            L._use(-1)
            L._unload_if_idle()
        n[1] += 1
ts = [threading.Thread(target=check), threading.Thread(target=load)]
[t.start() for t in ts]
[t.join() for t in ts]
print(n[0], n[1])
"""


def test_the_probes_check_never_unmaps_libbpf_under_a_load() -> None:
    """The early load (a thread) and the probe's libbpf check (the agent's main thread) ran
    side by side: the check unmapped libbpf between the load's mapping it and counting
    itself in, and the load's next libbpf call segfaulted the agent (half the runs of this
    race for 2 s, every one for 5 s). Mapping and counting in are one step now."""
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", _RACE, "4"], cwd=root, capture_output=True,
                          text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(root)})
    assert done.returncode == 0, f"rc {done.returncode}: {done.stderr[-2000:]}"
    checks, loads = map(int, done.stdout.split())
    assert checks > 0 and loads > 0
