"""The agent starts its BCC loader process first thing and the probe claims it later.

(BCC is the fallback loader, forced here with CFNET_BPF_LOADER=bcc; the CO-RE load
starts early too, in a thread of the agent: tests/unit/test_core_loader.py.)

``cfnet-agent`` starts the one-shot BCC loader right after reading its
configuration (``edge_agent.main.start_loader_early``), so the compile runs
beside the agent's imports, buffer and broker connect; ``EbpfProbe`` then
takes that loader's descriptors over. These tests check, with the real loader
and the kernel (root, BCC, BTF, which setup provides here): the descriptors
come from the early loader; a loader started for another request is replaced
and reaped; a failing load still falls back to sock_diag with the loader's
reason; a cancelled loader (the agent not needing it after all) is reaped and
leaves no descriptor behind. And that ``edge_agent.main`` imports none of the
heavy modules before it starts the loader.
"""

from __future__ import annotations

import os
import re
import select
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from edge_agent.bpf_loader import PendingLoad, bpf_dir
from edge_agent.bpfsys import prog_alive
from edge_agent.errors import ProbeError

REPO = Path(__file__).resolve().parents[2]
LOCAL = ("10.255.0.1",)  # a filter address nothing uses: the programs load, count nothing


@pytest.fixture(autouse=True)
def _bcc_loader(monkeypatch: pytest.MonkeyPatch) -> None:
    """The early loader process is the BCC loader's (CO-RE's early load is a thread)."""
    monkeypatch.setenv("CFNET_BPF_LOADER", "bcc")


def _need_ebpf() -> None:
    if os.geteuid() != 0 or not Path("/sys/kernel/btf/vmlinux").exists():
        pytest.skip("needs root and a kernel with BTF")


def _fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@pytest.fixture
def pending() -> Iterator[PendingLoad]:
    _need_ebpf()
    from edge_agent.probes.ebpf import start_early

    p, why = start_early(filter_local=True)
    assert p is not None, why
    try:
        yield p
    finally:
        p.cancel()


def test_main_imports_nothing_heavy_before_the_loader_starts() -> None:
    code = ("import sys, edge_agent.main; "
            "print(sorted(m for m in ('paho', 'psutil', 'sqlite3', 'edge_agent.wire.mqtt', "
            "'edge_agent.host', 'edge_agent.buffer', 'edge_agent.agent', 'bcc') "
            "if m in sys.modules))")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                       timeout=60, check=True)
    assert r.stdout.strip() == "[]", r.stdout + r.stderr


@pytest.mark.root
@pytest.mark.ebpf
def test_probe_claims_the_early_loader(pending: PendingLoad) -> None:
    from edge_agent.probes.ebpf import EbpfProbe

    probe = EbpfProbe(local_addrs=LOCAL, pending=pending)
    try:
        assert probe._hand is not None and probe._hand.loader_pid == pending.pid
        fds = probe.fds
        assert len(fds["progs"]) == 3 and len(fds["links"]) == 3, fds
        assert probe.collect() == []  # the maps read through bpf(2)
        with pytest.raises(ProbeError, match="already answered"):
            pending.result()  # claimed once
    finally:
        probe.close()
    assert pending._proc.returncode is not None  # the loader was reaped, no zombie


@pytest.mark.root
@pytest.mark.ebpf
def test_an_early_loader_for_another_request_is_replaced(pending: PendingLoad) -> None:
    from edge_agent.probes.ebpf import EbpfProbe

    # Started with the local-address filter; a node without addresses needs the
    # program without it: another compile, and the early one is reaped.
    probe = EbpfProbe(local_addrs=(), pending=pending)
    try:
        assert probe._hand is not None and probe._hand.loader_pid != pending.pid
        assert pending._proc.returncode is not None
        assert "-DCFNET_FILTER_LOCAL" not in probe._hand.cflags
    finally:
        probe.close()


@pytest.mark.root
@pytest.mark.ebpf
def test_a_failing_early_load_falls_back_with_the_loaders_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _need_ebpf()
    from edge_agent.probes import ProbeConfig, open_probe
    from edge_agent.probes.ebpf import start_early

    shutil.copy(bpf_dir() / "cfnet_links.h", tmp_path)
    (tmp_path / "tcp_links.c").write_text("this is not C;\n")
    monkeypatch.setenv("CFNET_BPF_DIR", str(tmp_path))  # before the loader starts: it inherits
    before = _fds()
    p, why = start_early(filter_local=True)
    assert p is not None, why
    probe, reason = open_probe(ProbeConfig(ebpf=True, local_addrs=LOCAL), pending=p)
    try:
        assert probe.name == "sockdiag"
        assert reason and "tcp_links.c" in reason, reason  # the early loader's own words
    finally:
        probe.close()
    assert p._proc.returncode is not None
    assert _fds() <= before


@pytest.mark.root
@pytest.mark.ebpf
def test_a_cancelled_loader_is_reaped_and_leaves_no_descriptor(pending: PendingLoad) -> None:
    from edge_agent.probes import ProbeConfig, open_probe

    before = _fds()
    # eBPF off after all: open_probe cancels the early loader (killed mid-compile).
    probe, reason = open_probe(ProbeConfig(ebpf=False), pending=pending)
    probe.close()
    assert reason and "disabled" in reason
    assert pending._proc.returncode is not None
    assert _fds() < before  # our end of the socket pair is closed
    with pytest.raises(ProbeError):
        pending.result()


@pytest.mark.root
@pytest.mark.ebpf
def test_a_loader_cancelled_after_it_answered_frees_its_programs() -> None:
    """Descriptors the loader sent and nobody received die with the socket pair."""
    _need_ebpf()
    from edge_agent.probes.ebpf import start_early

    p, why = start_early(filter_local=True)
    assert p is not None, why
    assert p._sock is not None
    ready, _, _ = select.select([p._sock], [], [], 120)  # the loader has sent its descriptors
    assert ready
    progs = _loaded_cfnet_prog_ids(p.pid)
    assert len(progs) == 3, progs
    p.cancel()
    assert p._proc.returncode is not None
    # The kernel frees programs after an RCU grace period: wait, bounded.
    deadline = time.monotonic() + 10
    while any(prog_alive(i) for i in progs):
        assert time.monotonic() < deadline, f"programs {progs} still loaded"
        time.sleep(0.1)


def _loaded_cfnet_prog_ids(pid: int) -> set[int]:
    """Program ids the (still waiting) loader process holds."""
    ids = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            if os.readlink(fd) != "anon_inode:bpf-prog":
                continue
            m = re.search(r"^prog_id:\s*(\d+)", Path(f"/proc/{pid}/fdinfo/{fd.name}").read_text(),
                          re.M)
        except OSError:
            continue
        if m:
            ids.add(int(m.group(1)))
    return ids
