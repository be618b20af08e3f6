"""Host metrics for one report: CPU, memory, disk (psutil), GPUs (pynvml),
interface counters (psutil, i.e. /proc/net/dev of this network namespace),
link speed and state (sysfs), and package power from RAPL.

Every source is optional on a small device: a missing GPU driver, an
unreadable RAPL counter or a netlink error yields an absent field, never an
exception out of :meth:`HostSampler.sample`.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from edge_agent.wire import MAX_GPUS, Gpu, Resources

log = logging.getLogger(__name__)

RAPL_ROOT = Path("/sys/class/powercap")


@dataclass(frozen=True, slots=True)
class InterfaceSample:
    """One network interface's counters as /sys/class/net reports them (cumulative)."""
    name: str
    rx_bytes: int
    tx_bytes: int
    rx_errors: int
    tx_errors: int
    rx_dropped: int
    tx_dropped: int
    speed_mbps: int | None
    oper_up: bool


# The NVIDIA kernel driver's marks (a container given GPUs has them too): without either,
# there is no GPU NVML could see.
NVIDIA_DRIVER_PATHS = ("/proc/driver/nvidia/version", "/dev/nvidiactl")


def nvidia_driver() -> bool:
    """Whether the NVIDIA driver is present (else NVML is not worth importing)."""
    return any(os.path.exists(p) for p in NVIDIA_DRIVER_PATHS)


class GpuReader:
    """Reads NVIDIA GPUs through NVML; no driver means an empty list."""

    def __init__(self) -> None:
        self._nvml: Any = None
        self._said_cap = False
        self.reason = ""
        driver = nvidia_driver()
        if not driver:
            # pynvml is ~1.3 MiB of the agent's resident memory once imported, and without
            # the driver's library NVML cannot init anyway: imported only where it can.
            self.reason = ("no NVIDIA GPU telemetry: no NVIDIA driver "
                           f"({' or '.join(NVIDIA_DRIVER_PATHS)} absent)")
            return
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
        except Exception as exc:  # NVML raises its own error types, or OSError for no lib
            self.reason = f"no NVIDIA GPU telemetry: {exc}"

    def read(self) -> tuple[Gpu, ...]:
        nv = self._nvml
        if nv is None:
            return ()
        out = []
        try:
            count = nv.nvmlDeviceGetCount()
            if count > MAX_GPUS and not self._said_cap:
                # the core refuses a report listing more (wire contract): the first ones
                # are reported, not the whole report lost
                log.warning("%d GPUs: reporting the first %d", count, MAX_GPUS)
                self._said_cap = True
            for i in range(min(count, MAX_GPUS)):
                h = nv.nvmlDeviceGetHandleByIndex(i)
                name = nv.nvmlDeviceGetName(h)
                util = nv.nvmlDeviceGetUtilizationRates(h)
                mem = nv.nvmlDeviceGetMemoryInfo(h)
                power = _try(lambda h=h: nv.nvmlDeviceGetPowerUsage(h) / 1000.0)
                temp = _try(
                    lambda h=h: float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))
                )
                out.append(
                    Gpu(
                        index=i,
                        name=name.decode() if isinstance(name, bytes) else str(name),
                        util=min(1.0, max(0.0, util.gpu / 100.0)),
                        mem_total_bytes=int(mem.total),
                        mem_used_bytes=min(int(mem.used), int(mem.total)),
                        power_w=power,
                        temp_c=temp,
                    )
                )
        except Exception as exc:
            log.warning("GPU read failed: %s", exc)
            return ()
        return tuple(out)

    def close(self) -> None:
        if self._nvml is not None:
            _try(self._nvml.nvmlShutdown)


def _try(fn: Any) -> Any:
    try:
        return fn()
    except Exception:
        return None


class RaplReader:
    """Package power from RAPL energy counters (µJ), as a rate between reads."""

    def __init__(self, root: Path = RAPL_ROOT) -> None:
        self._files = sorted(root.glob("intel-rapl:[0-9]*/energy_uj")) if root.exists() else []
        self._files = [f for f in self._files if os.access(f, os.R_OK)]
        self._last: tuple[float, int] | None = None

    def read_w(self) -> float | None:
        if not self._files:
            return None
        try:
            total = sum(int(f.read_text()) for f in self._files)
        except (OSError, ValueError):
            return None
        now = time.monotonic()
        last, self._last = self._last, (now, total)
        if last is None or total < last[1] or now <= last[0]:
            return None  # first read, or the counter wrapped
        return (total - last[1]) / 1e6 / (now - last[0])


def read_interfaces() -> list[InterfaceSample]:
    """Interface counters from /proc/net/dev (psutil); speed and operstate from sysfs.

    Not rtnetlink through pyroute2: that library cost the agent ~10 MiB of RSS
    and a netlink socket plus a pure-Python dump every report, for the same
    64-bit counters the kernel prints in /proc/net/dev.
    """
    out: list[InterfaceSample] = []
    try:
        counters = psutil.net_io_counters(pernic=True)
    except Exception as exc:
        log.debug("interface read failed: %s", exc)
        return out
    for name, c in sorted(counters.items()):
        if name == "lo":
            continue
        out.append(
            InterfaceSample(
                name=name,
                rx_bytes=int(c.bytes_recv),
                tx_bytes=int(c.bytes_sent),
                rx_errors=int(c.errin),
                tx_errors=int(c.errout),
                rx_dropped=int(c.dropin),
                tx_dropped=int(c.dropout),
                speed_mbps=_speed(name),
                oper_up=_operstate(name) == "up",
            )
        )
    return out


def _sysfs(name: str, attr: str) -> str | None:
    """``/sys/class/net/<name>/<attr>``, stripped, or None. ``os.open``/``os.read``: the
    sampler reads two of these per interface every report, and a text-mode ``open`` builds
    a buffered reader and a decoder and makes four more system calls (fstat, ioctl, lseek,
    a second read) for a one-line attribute (the agent's CPU per report)."""
    try:
        fd = os.open(f"/sys/class/net/{name}/{attr}", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.read(fd, 256).decode("ascii", "replace").strip()
    except OSError:  # includes EINVAL: a virtual link has no speed
        return None
    finally:
        os.close(fd)


def _operstate(name: str) -> str:
    return _sysfs(name, "operstate") or "unknown"


def _speed(name: str) -> int | None:
    try:
        v = int(_sysfs(name, "speed") or "")
    except ValueError:
        return None
    return v if v > 0 else None


def local_addresses() -> tuple[str, ...]:
    """Every non-loopback IP address of this host (or network namespace)."""
    addrs = []
    for _ifname, entries in psutil.net_if_addrs().items():
        for a in entries:
            if a.family.name in ("AF_INET", "AF_INET6"):
                ip = a.address.split("%")[0]
                if ip.startswith("127.") or ip == "::1" or ip.startswith("fe80:"):
                    continue
                addrs.append(ip)
    return tuple(sorted(set(addrs)))


class HostSampler:
    def __init__(self, disk_path: str = "/") -> None:
        self._disk_path = disk_path
        self.gpus = GpuReader()
        self.rapl = RaplReader()
        psutil.cpu_percent(interval=None)  # primes the counter: the first call returns 0

    def sample(self) -> Resources:
        vm = psutil.virtual_memory()
        try:
            du = psutil.disk_usage(self._disk_path)
            disk_total, disk_used = int(du.total), int(du.used)
        except OSError:
            disk_total = disk_used = None  # type: ignore[assignment]
        return Resources(
            cpu_cores=psutil.cpu_count() or 1,
            cpu_util=min(1.0, max(0.0, psutil.cpu_percent(interval=None) / 100.0)),
            mem_total_bytes=int(vm.total),
            mem_used_bytes=min(int(vm.total - vm.available), int(vm.total)),
            gpus=self.gpus.read(),
            disk_total_bytes=disk_total,
            disk_used_bytes=disk_used,
            power_w=self.rapl.read_w(),
            load1=os.getloadavg()[0],
        )

    def close(self) -> None:
        self.gpus.close()
