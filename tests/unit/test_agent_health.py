"""The agent's /healthz, /readyz, /status and /metrics (edge_agent.health): a real HTTP server
on loopback, a real agent loop object and buffer (SQLite), no broker (nothing acked: the
reports buffer), a stand-in probe and a clock the test moves (the I/O edges)."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from edge_agent.agent import Agent
from edge_agent.buffer import ReportBuffer
from edge_agent.health import HealthServer, Loader, loader_of, serve
from edge_agent.host import HostSampler
from edge_agent.wire.mqtt import MqttClient, MqttSettings
from edge_agent.wire.schema import LinkSample


class _Probe:
    """A probe stand-in; ``links`` as the eBPF probe's held attachments."""

    name = "ebpf"
    loader = "core"
    loader_reason = "kernel BTF at /sys/kernel/btf/vmlinux"

    def __init__(self) -> None:
        self.links = [7, 8, 9]
        self.fail = False

    @property
    def fds(self) -> dict[str, list[int]]:
        return {"maps": [], "progs": [], "links": self.links}

    def collect(self) -> list[LinkSample]:
        if self.fail:
            raise OSError("map read failed")
        return []

    def close(self) -> None:
        pass


class _Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return int(r.status), r.read().decode()
    except urllib.error.HTTPError as e:
        return int(e.code), e.read().decode()


@pytest.fixture
def setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
          ) -> Iterator[tuple[Agent, _Probe, _Clock, HealthServer, str]]:
    clock = _Clock()
    # The agent stamps its reports and acks with time.monotonic: the same clock as health's.
    monkeypatch.setattr("edge_agent.agent.time.monotonic", clock)
    probe = _Probe()
    mqtt = MqttClient(MqttSettings(port=1, tls=False, username="edge-h", client_id="edge-h"))
    agent = Agent(node="edge-h", interval_s=1.0, probe=probe, host=HostSampler(), mqtt=mqtt,
                  buffer=ReportBuffer(tmp_path / "b.db", max_bytes=64 * 1024))
    server = serve(agent, 0, "127.0.0.1")
    server.health.clock = clock
    server.health.started = clock.t
    try:
        yield agent, probe, clock, server, f"http://127.0.0.1:{server.server_port}"
    finally:
        server.stop()
        agent.host.close()
        agent.buffer.close()


def test_ready_once_a_report_is_buffered_within_bounds(setup: tuple) -> None:
    agent, _probe, _clock, _server, base = setup
    assert get(f"{base}/healthz") == (200, "ok\n")
    assert get(f"{base}/readyz") == (503, "[-]sampler: no report taken yet\n[+]probe ok\n"
                                          "[+]reports ok\nreadyz check failed\n")
    agent.tick()
    # Not connected, nothing acknowledged, but the buffer is far from its bound: ready.
    assert get(f"{base}/readyz") == (200, "[+]sampler ok\n[+]probe ok\n[+]reports ok\nok\n")
    code, body = get(f"{base}/status")
    st = json.loads(body)
    assert code == 200 and st["ready"] and st["live"] and st["failing"] == {}
    assert (st["loader"], st["loader_reason"], st["probe"]) == (
        "core", "kernel BTF at /sys/kernel/btf/vmlinux", "ebpf")
    assert st["buffer"]["reports"] == 1 and st["connected"] is False
    assert st["last_ack_age_s"] is None and st["last_report_age_s"] == 0


def test_a_stalled_sampler_fails_liveness_and_readiness(setup: tuple) -> None:
    agent, _probe, clock, server, base = setup
    agent.tick()
    clock.t += server.health.stall_bound_s() + 1
    code, body = get(f"{base}/healthz")
    assert code == 503 and "sampler stalled" in body, body
    code, body = get(f"{base}/readyz")
    assert code == 503 and "[-]sampler: the latest report was taken 31 s ago" in body, body
    agent.tick()
    assert get(f"{base}/healthz") == (200, "ok\n")


def test_probe_without_attachments_or_failing_is_not_ready(setup: tuple) -> None:
    agent, probe, clock, _server, base = setup
    agent.tick()
    probe.links = []
    code, body = get(f"{base}/readyz")
    assert code == 503 and "[-]probe: the ebpf probe holds no attachment" in body, body
    probe.links, probe.fail = [1], True
    agent.tick()
    code, body = get(f"{base}/readyz")
    assert code == 503 and "[-]probe: the ebpf probe failed 0.0 s ago (1 failures" in body
    probe.fail = False
    clock.t += 3.5
    agent.tick()
    assert get(f"{base}/readyz")[0] == 200


def test_a_buffer_thinning_its_history_is_not_ready_until_acks_flow(setup: tuple) -> None:
    agent, _probe, clock, _server, base = setup
    while agent.buffer.thinned == 0:  # 64 KiB: a few hundred reports, then thinning
        agent.tick()
    code, body = get(f"{base}/readyz")
    assert code == 503 and "[-]reports: buffer " in body and "not connected to the broker" \
        in body, body
    assert "thinned" in json.loads(get(f"{base}/status")[1])["failing"]["reports"]
    agent.stats.last_ack = clock.t  # the core acknowledges again: reports are flowing
    assert get(f"{base}/readyz")[0] == 200
    clock.t += 16  # then nothing for longer than the bound: buffering beyond bounds again
    agent.tick()
    assert get(f"{base}/readyz")[0] == 503


def test_metrics_name_the_loader_and_bad_requests_are_bounded(setup: tuple) -> None:
    agent, _probe, _clock, server, base = setup
    agent.tick()
    code, text = get(f"{base}/metrics")
    assert code == 200
    assert ('cfnet_agent_loader{loader="core",reason="kernel BTF at /sys/kernel/btf/vmlinux"}'
            ' 1.0') in text
    assert "cfnet_agent_reports_total{stage=\"taken\"} 1.0" in text
    assert get(f"{base}/nope")[0] == 404
    # A request line over the bound is refused, not read into memory.
    with socket.create_connection(("127.0.0.1", server.server_port), timeout=5) as s:
        s.sendall(b"GET /" + b"a" * 10000 + b" HTTP/1.1\r\n\r\n")
        assert s.recv(100).startswith(b"HTTP/1.1 400")
    with socket.create_connection(("127.0.0.1", server.server_port), timeout=5) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\n" + b"X: y\r\n" * 100 + b"\r\n")
        assert s.recv(100).startswith(b"HTTP/1.1 431")


def test_loader_of_a_probe_without_ebpf_says_why() -> None:
    class _Diag:
        name = "sockdiag"

    assert loader_of(_Diag(), "eBPF disabled by configuration") == Loader(
        "none", "eBPF disabled by configuration")
    assert loader_of(_Probe(), None) == Loader("core", _Probe.loader_reason)
