"""The agent's ``probe_port`` (the chart's ``agent.probePort``, 7950 by default there) reaches
every probe, not only the echo server and the prober: connections on that port count as
active samples, others as passive (sock_diag, real sockets on loopback), and the eBPF loader
the agent starts early is asked for the program with that port, so the probe claims it
instead of compiling again (real loader, real kernel)."""

from __future__ import annotations

import os
import random
import socket
import threading
from pathlib import Path

import pytest

from edge_agent.config import load_config
from edge_agent.probes import ProbeConfig, open_probe

# Addresses of 127/8 that nothing else on the machine uses: sock_diag sees every socket of the
# namespace, and other processes' 127.0.0.1 connections must not join the peers measured.
_NET = f"127.{random.randint(100, 250)}.{random.randint(1, 250)}"
SERVER, CLIENT = f"{_NET}.1", f"{_NET}.2"


def _listener() -> tuple[socket.socket, int]:
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((SERVER, 0))
    srv.listen(4)
    return srv, int(srv.getsockname()[1])


def _active(port_of_probe: int, port: int, srv: socket.socket) -> bool:
    """Whether sock_diag, configured with ``port_of_probe``, reports the loopback peer as
    measured by active probing only, with one connection to ``port`` open."""
    probe, _ = open_probe(ProbeConfig(ebpf=False, include_loopback=True,
                                      probe_port=port_of_probe))
    try:
        probe.collect()  # baseline
        done = threading.Event()

        def serve() -> None:
            conn, _ = srv.accept()
            conn.recv(16)
            conn.sendall(b"pong")
            done.wait(10)
            conn.close()

        t = threading.Thread(target=serve, daemon=True)
        t.start()
        with socket.create_connection((SERVER, port), timeout=5, source_address=(CLIENT, 0)) as c:
            c.sendall(b"ping")
            assert c.recv(4) == b"pong"
            samples = probe.collect()
            done.set()
        t.join(10)
        loop = [s for s in samples if s.peer in (SERVER, CLIENT)]
        assert {s.peer for s in loop} == {SERVER, CLIENT}, f"loopback samples: {samples}"
        return all(s.active for s in loop)
    finally:
        probe.close()


def test_sockdiag_counts_the_configured_probe_port_as_active() -> None:
    srv, port = _listener()
    with srv:
        assert _active(port, port, srv)
        assert not _active(7946, port, srv)  # another port configured: passive traffic


@pytest.mark.root
@pytest.mark.ebpf
def test_early_loader_is_asked_for_the_configured_port(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    if os.geteuid() != 0 or not Path("/sys/kernel/btf/vmlinux").exists():
        pytest.fail("root and BTF are provided by this machine's setup", pytrace=False)
    # The early loader is BCC's (CO-RE loads in the probe itself, in tens of milliseconds):
    # force it, as a kernel without BTF would choose it.
    monkeypatch.setenv("CFNET_BPF_LOADER", "bcc")
    from edge_agent.main import start_loader_early
    from edge_agent.probes.ebpf import load_request

    cfg = load_config(["--node", "n1", "--probe-port", "7950",
                       "--buffer-path", str(tmp_path / "b.db")])
    pending = start_loader_early(cfg)
    assert pending is not None
    try:
        assert pending.request == load_request(filter_local=True, probe_port=7950)
        assert "-DCFNET_PROBE_PORT=7950" in pending.request.cflags
    finally:
        pending.cancel()
