"""/healthz and /readyz on the core's metrics server (a real HTTP server on loopback, real
prometheus_client), the JSON log format, and `--version` of every installed command.

The readiness checks here are plain functions; the same server with the real checks, a real
API server and a real broker is tests/k8s/test_core_probes.py."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
import tomllib
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from cloud_core.ingest import Ingest
from cloud_core.metrics import CoreMetrics
from cloud_core.readiness import Readiness
from cloud_core.state import ClusterState
from edge_agent import __version__
from edge_agent.wire.logsetup import JsonFormatter, configure_logging

ROOT = Path(__file__).resolve().parents[2]


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return int(r.status), r.read().decode()
    except urllib.error.HTTPError as e:
        return int(e.code), e.read().decode()


def test_readiness_reports_each_failing_check_with_its_reason() -> None:
    r = Readiness()
    # Not ready before its owner says every check is registered.
    assert r.report() == (False, "[-]startup: still starting\nreadyz check failed\n")
    r.started()
    assert r.report() == (True, "[+]startup ok\nok\n")
    state = {"broker": "down"}
    r.add("broker", lambda: None if state["broker"] == "up" else "not connected")
    r.add("caches", lambda: None)

    def boom() -> str | None:
        raise RuntimeError("kaput")

    r.add("odd", boom)
    ready, body = r.report()
    assert not ready
    assert body.splitlines() == ["[+]startup ok", "[-]broker: not connected", "[+]caches ok",
                                 "[-]odd: check raised RuntimeError: kaput",
                                 "readyz check failed"]
    state["broker"] = "up"
    r.add("odd", lambda: None)
    assert r.report()[0]


def test_metrics_server_answers_healthz_readyz_and_metrics() -> None:
    state = ClusterState()
    m = CoreMetrics(Ingest(state), state)
    leader = {"v": False}
    m.set_leader(lambda: leader["v"])
    broken = {"v": "no broker"}
    m.readiness.add("broker", lambda: broken["v"])
    port = m.serve(0, "127.0.0.1")
    assert get(f"http://127.0.0.1:{port}/readyz")[0] == 503  # before started()
    m.readiness.started()
    try:
        base = f"http://127.0.0.1:{port}"
        assert get(f"{base}/healthz") == (200, "ok\n")
        assert get(f"{base}/readyz") == (503, "[+]startup ok\n[-]broker: no broker\n"
                                                "readyz check failed\n")
        broken["v"] = ""
        assert get(f"{base}/readyz") == (200, "[+]startup ok\n[+]broker ok\nok\n")
        code, text = get(f"{base}/metrics")
        assert code == 200
        assert "cfnet_leader 0.0" in text
        assert f'cfnet_build_info{{python="{sys.version.split()[0]}",version="{__version__}"}} 1.0' \
            in text
        assert "process_resident_memory_bytes" in text and "process_cpu_seconds_total" in text
        leader["v"] = True
        assert "cfnet_leader 1.0" in get(f"{base}/metrics")[1]
    finally:
        m.close()


def test_json_log_lines_parse() -> None:
    rec = logging.LogRecord("cfnet.core", logging.WARNING, __file__, 1, 'a "quoted"\nline %s',
                            ("x",), None)
    out = json.loads(JsonFormatter().format(rec))
    assert out["level"] == "warning" and out["logger"] == "cfnet.core"
    assert out["msg"] == 'a "quoted"\nline x' and out["ts"].endswith("Z")
    try:
        raise ValueError("bad")
    except ValueError:
        rec.exc_info = sys.exc_info()
    assert "ValueError: bad" in json.loads(JsonFormatter().format(rec))["exc"]
    with pytest.raises(ValueError, match="log format 'xml'"):
        configure_logging("xml")


def test_configure_logging_json_writes_one_object_per_line(monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    buf = io.StringIO()
    monkeypatch.setattr(sys, "stderr", buf)
    monkeypatch.setenv("CFNET_LOG_FORMAT", "text")  # configure_logging sets it; restored after
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        configure_logging("json")
        logging.getLogger("cfnet.test").info("hello %d", 3)
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
    assert json.loads(buf.getvalue().strip())["msg"] == "hello 3"
    assert os.environ["CFNET_LOG_FORMAT"] == "json"  # what the core's MQTT child reads


def test_every_command_answers_version() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert set(scripts) >= {"cfnet-core", "cfnet-agent", "cfnetctl"}
    bindir = Path(sys.executable).parent
    for name in scripts:
        exe = bindir / name
        assert exe.exists(), f"{name} is not installed in {bindir} (pip install -e .)"
        r = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == f"{name} {__version__}"
