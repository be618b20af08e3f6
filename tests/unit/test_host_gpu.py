"""GPU telemetry (``edge_agent.host.GpuReader``): NVML's answers as the report carries
them, what a device without the driver or with a failing NVML reports, and -- where the
NVIDIA driver is -- the same reader against the real NVML.

The fake NVML stands at the I/O edge (the module the reader imports); the last test runs
the same path against the real NVML on a machine with an NVIDIA GPU (``python -m pytest
tests/unit/test_host_gpu.py`` there)."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest

from edge_agent import host
from edge_agent.host import GpuReader, nvidia_driver
from edge_agent.wire.schema import MAX_GPUS, Gpu

GIB = 1 << 30


class NVMLError(Exception):
    pass


def _fake_nvml(gpus: list[dict[str, Any]], init_error: Exception | None = None,
               count_error: Exception | None = None) -> types.ModuleType:
    """A stand-in ``pynvml`` answering for ``gpus`` (name, util, total, used, power_mw,
    temp; a value that is an exception is raised when asked)."""
    m = types.ModuleType("pynvml")
    calls: list[str] = []

    def ask(i: int, key: str) -> Any:
        v = gpus[i][key]
        if isinstance(v, Exception):
            raise v
        return v

    def init() -> None:
        calls.append("init")
        if init_error is not None:
            raise init_error

    def count() -> int:
        if count_error is not None:
            raise count_error
        return len(gpus)

    m.NVML_TEMPERATURE_GPU = 0  # type: ignore[attr-defined]
    m.nvmlInit = init  # type: ignore[attr-defined]
    m.nvmlShutdown = lambda: calls.append("shutdown")  # type: ignore[attr-defined]
    m.nvmlDeviceGetCount = count  # type: ignore[attr-defined]
    m.nvmlDeviceGetHandleByIndex = lambda i: i  # type: ignore[attr-defined]
    m.nvmlDeviceGetName = lambda h: ask(h, "name")  # type: ignore[attr-defined]
    m.nvmlDeviceGetUtilizationRates = (  # type: ignore[attr-defined]
        lambda h: types.SimpleNamespace(gpu=ask(h, "util")))
    m.nvmlDeviceGetMemoryInfo = (  # type: ignore[attr-defined]
        lambda h: types.SimpleNamespace(total=ask(h, "total"), used=ask(h, "used")))
    m.nvmlDeviceGetPowerUsage = lambda h: ask(h, "power_mw")  # type: ignore[attr-defined]
    m.nvmlDeviceGetTemperature = lambda h, kind: ask(h, "temp")  # type: ignore[attr-defined]
    m.calls = calls  # type: ignore[attr-defined]
    return m


@pytest.fixture
def with_driver(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(host, "nvidia_driver", lambda: True)
    yield


def _install(monkeypatch: pytest.MonkeyPatch, nv: types.ModuleType) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", nv)


@pytest.mark.parametrize(("gpu", "want"), [
    # NVML as it is: bytes names from old bindings, str from new ones
    ({"name": b"NVIDIA H200", "util": 37, "total": 141 * GIB, "used": 20 * GIB,
      "power_mw": 123_456, "temp": 41},
     Gpu(0, "NVIDIA H200", 0.37, 141 * GIB, 20 * GIB, 123.456, 41.0)),
    ({"name": "NVIDIA A2", "util": 0, "total": 16 * GIB, "used": 0,
      "power_mw": 9_000, "temp": 30},
     Gpu(0, "NVIDIA A2", 0.0, 16 * GIB, 0, 9.0, 30.0)),
    # out of range from a driver bug: clamped, never past the contract's bounds
    ({"name": "g", "util": 140, "total": 8 * GIB, "used": 9 * GIB, "power_mw": 1, "temp": 1},
     Gpu(0, "g", 1.0, 8 * GIB, 8 * GIB, 0.001, 1.0)),
    # power and temperature unsupported (NVML_ERROR_NOT_SUPPORTED on many boards): absent
    ({"name": "g", "util": 5, "total": GIB, "used": 0, "power_mw": NVMLError("n/s"),
      "temp": NVMLError("n/s")},
     Gpu(0, "g", 0.05, GIB, 0, None, None)),
])
def test_a_gpu_is_reported_as_nvml_tells_it(monkeypatch: pytest.MonkeyPatch, with_driver: None,
                                            gpu: dict[str, Any], want: Gpu) -> None:
    nv = _fake_nvml([gpu])
    _install(monkeypatch, nv)
    r = GpuReader()
    assert r.reason == ""
    assert r.read() == (want,)
    r.close()
    assert nv.calls == ["init", "shutdown"]  # type: ignore[attr-defined]


def test_every_gpu_is_read_in_index_order(monkeypatch: pytest.MonkeyPatch,
                                          with_driver: None) -> None:
    base = {"util": 10, "total": GIB, "used": 0, "power_mw": 1000, "temp": 20}
    _install(monkeypatch, _fake_nvml([{**base, "name": f"g{i}"} for i in range(4)]))
    got = GpuReader().read()
    assert [(g.index, g.name) for g in got] == [(i, f"g{i}") for i in range(4)]


def test_no_more_gpus_are_read_than_the_wire_contract_carries(
        monkeypatch: pytest.MonkeyPatch, with_driver: None,
        caplog: pytest.LogCaptureFixture) -> None:
    """A host with more GPUs than a report may list (``MAX_GPUS``): the first are reported,
    said once, and the report stays one the core accepts."""
    base = {"util": 10, "total": GIB, "used": 0, "power_mw": 1000, "temp": 20}
    _install(monkeypatch, _fake_nvml([{**base, "name": f"g{i}"} for i in range(MAX_GPUS + 3)]))
    r = GpuReader()
    with caplog.at_level("WARNING"):
        got = r.read()
        again = r.read()
    assert [g.index for g in got] == list(range(MAX_GPUS))
    assert again == got
    assert caplog.text.count(f"reporting the first {MAX_GPUS}") == 1


def test_a_failing_read_reports_no_gpus_and_says_why(monkeypatch: pytest.MonkeyPatch,
                                                     with_driver: None,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    """A GPU that falls off the bus mid-read (NVML_ERROR_GPU_IS_LOST): the report goes out
    without GPUs, the agent goes on, the log says why."""
    _install(monkeypatch, _fake_nvml([], count_error=NVMLError("GPU is lost")))
    with caplog.at_level("WARNING"):
        assert GpuReader().read() == ()
    assert "GPU is lost" in caplog.text


def test_an_nvml_that_does_not_start_gives_its_reason(monkeypatch: pytest.MonkeyPatch,
                                                      with_driver: None) -> None:
    _install(monkeypatch, _fake_nvml([], init_error=NVMLError("Driver Not Loaded")))
    r = GpuReader()
    assert r.read() == ()
    assert r.reason == "no NVIDIA GPU telemetry: Driver Not Loaded"
    r.close()  # nothing to shut down


def test_without_the_driver_nvml_is_not_imported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host, "nvidia_driver", lambda: False)
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    r = GpuReader()
    assert r.read() == ()
    assert "no NVIDIA driver" in r.reason
    assert "pynvml" not in sys.modules


@pytest.mark.skipif(not nvidia_driver(), reason="needs an NVIDIA GPU and its driver")
def test_the_real_nvml_reports_every_gpu_within_the_contract() -> None:
    """On a machine with NVIDIA GPUs: one entry per GPU ``nvidia-smi`` lists, each within
    what the wire contract accepts."""
    import subprocess

    listed = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total",
                             "--format=csv,noheader,nounits"], capture_output=True, text=True,
                            check=True, timeout=60).stdout.strip().splitlines()
    r = GpuReader()
    assert r.reason == ""
    got = r.read()
    r.close()
    assert len(got) == len(listed) >= 1
    for g, line in zip(got, listed, strict=True):
        name, mib = (x.strip() for x in line.split(","))
        assert g.name == name
        # nvidia-smi's MiB against NVML's bytes (the driver reserves a little of the total)
        assert abs(g.mem_total_bytes / (1 << 20) - int(mib)) <= max(64, int(mib) // 100)
        assert 0.0 <= g.util <= 1.0
        assert 0 <= g.mem_used_bytes <= g.mem_total_bytes
        assert g.power_w is None or 0.0 < g.power_w < 2000.0
        assert g.temp_c is None or 0.0 < g.temp_c < 120.0
