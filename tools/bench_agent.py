"""Benchmark: what the real ``cfnet-agent`` process costs, per probe mode, on the same traffic.

Three lab namespaces: ``a`` runs the agent, ``b`` sinks a paced bulk flow from
``a`` (~10,000 MSS-sized segments/s), ``cloud`` runs Mosquitto (tools/broker.py,
TLS, ACL). Each repetition starts a fresh ``cfnet-agent`` (the installed entry
point, with its SQLite buffer, host metrics and MQTT) in ``a``, reporting every
second, and measures:

- start-up: from exec to the first report arriving at the broker (a
  subscriber in ``cloud`` sees it);
- peak RSS during start-up: the agent's own high-water mark (VmHWM) and,
  for BCC, the one-shot loader process (BCC/LLVM compile; sampled every
  20 ms while it lives; CO-RE loads in the agent's process, there is none);
- steady RSS: the agent's RSS, median over the measured window;
- CPU % of one core over the window: the process (its threads' on-CPU time from
  schedstat, ns, not 10 ms ticks: CPU-seconds of the agent per second of traffic, which
  the machine's other load hardly changes) plus, for
  eBPF, the in-kernel run time of its BPF programs (``kernel.bpf_stats_enabled``,
  read from the program fds' fdinfo), since tracepoint programs run in the
  context of the traffic, not of the agent. "BPF runs/s" counts every run,
  including those the local-address filter turns away: in this one-host lab
  about half are the sink's socket in ``b`` (a device's peers are remote).

Modes ``ebpf-core`` (the prebuilt CO-RE object loaded by libbpf, the default),
``ebpf-bcc`` (the BCC fallback, forced with ``CFNET_BPF_LOADER=bcc``) and ``sockdiag``
(``--no-ebpf``, the baseline) alternate, so all see the same machine load; each eBPF run
checks from the agent's log that it got the loader it asked for. Prints median and
spread (min..max) per mode.
Run as root: ``python -m tools.bench_agent [--reps 5] [--phase-seconds 10]`` (3 starts per
mode by default, which `make bench` runs in its time budget). ``--before-tree DIR`` adds the
CO-RE agent run from another checkout's ``edge_agent`` (``git archive`` of an earlier commit
plus its ``bpf/obj``), alternating with the others: a change's before and after in one run.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
MSS = 1448
STATS_SYSCTL = Path("/proc/sys/kernel/bpf_stats_enabled")
PY = sys.executable
AGENT = Path(sys.executable).parent / "cfnet-agent"
CLK_TCK = os.sysconf("SC_CLK_TCK")
MODES = ("ebpf-core", "ebpf-bcc", "sockdiag")
# ``--before-tree DIR``: the CO-RE agent once more, from another checkout of the package (say,
# ``git archive`` of the commit before a change, with its bpf/obj), in the same run.
BEFORE = "ebpf-core-before"


def _status_kb(pid: int, key: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _cpu_s(pid: int) -> float:
    """CPU seconds of a process: the on-CPU nanoseconds of its threads (the first field of
    /proc/<pid>/task/<tid>/schedstat), summed. Not utime + stime from /proc/<pid>/stat:
    those count 10 ms clock ticks, so over a 6 s window one tick is 0.17 % of a core, the
    size of the differences measured here. The agent's threads live as long as it does, so
    none's time is lost between two reads. Falls back to the ticks without schedstat."""
    total = 0
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                total += int((task / "schedstat").read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue
    except OSError:
        total = 0
    if total:
        return total / 1e9
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def _bpf_run(pid: int) -> tuple[int, int]:
    """(run_time_ns, run_cnt) summed over the BPF programs a process holds (0 unless stats on)."""
    total = count = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            if os.readlink(fd) != "anon_inode:bpf-prog":
                continue
            info = Path(f"/proc/{pid}/fdinfo/{fd.name}").read_text()
        except OSError:
            continue
        m = re.search(r"^run_time_ns:\s*(\d+)", info, re.M)
        c = re.search(r"^run_cnt:\s*(\d+)", info, re.M)
        if m and c:
            total += int(m.group(1))
            count += int(c.group(1))
    return total, count


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(x) for x in text.split()]


def run_agent_once(lab: Any, broker: Any, tmp: Path, mode: str, seconds: float,
                   seen: dict[str, float], node: str,
                   before_tree: Path | None = None) -> dict[str, Any]:
    """One agent process: start, first report, steady window, stop."""
    creds = broker.add_account(node, "agent")
    pw = tmp / f"{node}.pw"
    pw.write_text(creds.password)
    argv = [str(AGENT), "--node", node, "--broker-host", broker.host,
            "--broker-port", str(broker.port), "--password-file", str(pw),
            "--ca-file", str(broker.ca_file), "--buffer-path", str(tmp / f"{node}.db"),
            "--interval-s", "1", "--ebpf" if mode.startswith("ebpf") else "--no-ebpf"]
    env = {k: v for k, v in os.environ.items() if k not in ("CFNET_BPF_LOADER",
                                                            "CFNET_BTF_PATH")}
    loader = mode.split("-")[1] if "-" in mode else ""
    if mode == BEFORE:
        if before_tree is None:
            raise ValueError(f"{BEFORE} needs --before-tree")
        env["PYTHONPATH"] = str(before_tree)  # ahead of the editable install's path
    if loader:
        env["CFNET_BPF_LOADER"] = loader
    log = open(tmp / f"{node}.log", "wb")  # noqa: SIM115 - the process owns it
    t0 = time.monotonic()
    proc = lab.popen("a", argv, stdout=log, stderr=subprocess.STDOUT, env=env)
    log.close()
    loader_peak = 0
    try:
        # Start-up: until the first report reaches the broker (bounded).
        while node not in seen:
            if proc.poll() is not None or time.monotonic() - t0 > 120:
                raise RuntimeError(f"{mode} agent gave no report: "
                                   + (tmp / f"{node}.log").read_text()[-2000:])
            for child in _children(proc.pid):
                loader_peak = max(loader_peak, _status_kb(child, "VmHWM"))
            time.sleep(0.02)
        startup = seen[node] - t0
        peak_startup = _status_kb(proc.pid, "VmHWM")
        time.sleep(3.0)  # past the first intervals (sock_diag's baseline dump, imports)
        cpu0, bpf0, w0 = _cpu_s(proc.pid), _bpf_run(proc.pid), time.monotonic()
        rss: list[int] = []
        while time.monotonic() - w0 < seconds:
            time.sleep(0.5)
            rss.append(_status_kb(proc.pid, "VmRSS"))
        cpu1, bpf1, w1 = _cpu_s(proc.pid), _bpf_run(proc.pid), time.monotonic()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    wall = w1 - w0
    text = (tmp / f"{node}.log").read_text(errors="replace")
    if loader and f"loader {loader} " not in text:
        raise RuntimeError(f"{mode}: the agent did not use the {loader} loader: {text[-2000:]}")
    return {"mode": mode, "startup_s": startup, "peak_agent_kb": peak_startup,
            "peak_loader_kb": loader_peak, "rss_kb": statistics.median(rss),
            "proc_pct": 100 * (cpu1 - cpu0) / wall,
            "bpf_pct": 100 * (bpf1[0] - bpf0[0]) / 1e9 / wall,
            "bpf_runs_per_s": (bpf1[1] - bpf0[1]) / wall}


def run_bench(reps: int, phase_s: float, segs_per_s: float,
              before_tree: Path | None = None) -> list[dict[str, Any]]:
    from edge_agent.wire.bus import Message
    from edge_agent.wire.mqtt import MqttClient, MqttSettings
    from tools.broker import Broker
    from tools.lab import Lab, SiteSpec
    from tools.netns import in_netns

    rate_mbit = segs_per_s * MSS * 8 / 1e6
    modes = MODES + ((BEFORE,) if before_tree is not None else ())
    traffic_s = reps * len(modes) * (phase_s + 15) + 20
    stats_before = STATS_SYSCTL.read_text().strip() if STATS_SYSCTL.exists() else None
    results: list[dict[str, Any]] = []
    seen: dict[str, float] = {}
    lock = threading.Lock()

    def on_message(m: Message) -> None:
        node = m.topic.split("/")[3]
        with lock:
            seen.setdefault(node, time.monotonic())

    with tempfile.TemporaryDirectory(prefix="cfbench-agent-") as tmpd, \
            Lab([SiteSpec("a"), SiteSpec("b"), SiteSpec("cloud")],
                prefix=f"cfba{os.getpid() % 10000}") as lab:
        tmp = Path(tmpd)
        broker = Broker(tmp / "broker", host=lab.addr("cloud"), netns=lab.ns("cloud"))
        broker.start()
        core = broker.add_account("core-bench", "core")
        watcher = MqttClient(MqttSettings(host=broker.host, port=broker.port,
                                          username=core.username, password=core.password,
                                          tls=True, ca_file=core.ca_file,
                                          client_id=core.username), on_message=on_message)
        in_netns(lab.ns("cloud"), watcher.start)
        sink = sender = None
        try:
            if not watcher.wait_connected(10):
                raise RuntimeError(f"watcher not connected: {watcher.last_refusal}")
            watcher.subscribe("cfnet/v1/nodes/+/telemetry")
            sink = lab.popen("b", [PY, "-m", "tools.traffic", "sink", "--port", "5100",
                                   "--duration", str(traffic_s + 5)], stderr=subprocess.DEVNULL)
            sender = lab.popen("a", [PY, "-m", "tools.traffic", "send", lab.addr("b"), "--port",
                                     "5100", "--duration", str(traffic_s),
                                     "--max-mb", f"{rate_mbit / 8 * traffic_s:.0f}",
                                     "--rate-mbit", f"{rate_mbit:.1f}"],
                               stderr=subprocess.DEVNULL)
            time.sleep(3.0)
            if stats_before is not None:
                STATS_SYSCTL.write_text("1")
            for rep in range(reps):
                for mode in modes:
                    node = f"bench-{mode}-{rep}"
                    results.append(run_agent_once(lab, broker, tmp, mode, phase_s, seen, node,
                                                  before_tree))
        finally:
            if stats_before is not None:
                STATS_SYSCTL.write_text(stats_before)
            for p in (sender, sink):
                if p is not None:
                    p.kill()
                    p.wait(timeout=10)
            watcher.stop()
            broker.stop()
    return results


def _fmt(values: Sequence[float], spec: str) -> str:
    med = statistics.median(values)
    return f"{med:{spec}} ({min(values):{spec}}..{max(values):{spec}})"


def table(results: Sequence[dict[str, Any]]) -> str:
    cols = ["mode", "steady RSS MiB", "start-up peak MiB (agent / loader)",
            "CPU % of 1 core (process + BPF)", "BPF runs/s", "first report s"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for mode in (*MODES, BEFORE):
        rs = [r for r in results if r["mode"] == mode]
        if not rs:
            continue
        peak = _fmt([r["peak_agent_kb"] / 1024 for r in rs], ".1f")
        if mode == "ebpf-bcc":
            peak += " / " + _fmt([r["peak_loader_kb"] / 1024 for r in rs], ".0f")
        elif mode in ("ebpf-core", BEFORE):
            peak += " / none (in-process)"
        cpu = _fmt([r["proc_pct"] + r["bpf_pct"] for r in rs], ".2f")
        cpu += (f" = {statistics.median(r['proc_pct'] for r in rs):.2f}"
                f" + {statistics.median(r['bpf_pct'] for r in rs):.2f}")
        name = mode + (" (baseline)" if mode == "sockdiag" else "")
        lines.append(f"| {name} | {_fmt([r['rss_kb'] / 1024 for r in rs], '.1f')} | {peak} "
                     f"| {cpu} | {statistics.median(r['bpf_runs_per_s'] for r in rs):.0f} "
                     f"| {_fmt([r['startup_s'] for r in rs], '.2f')} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.bench_agent", description=__doc__)
    ap.add_argument("--reps", type=int, default=3, help="agent starts per mode")
    ap.add_argument("--phase-seconds", type=float, default=10.0, help="measured window per start")
    ap.add_argument("--segs-per-s", type=float, default=10_000)
    ap.add_argument("--json", action="store_true", help="also print the raw results")
    ap.add_argument("--before-tree", type=Path, default=None,
                    help="also run the CO-RE agent from this checkout's edge_agent (a before/after"
                         " comparison in the same run)")
    a = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("bench_agent: needs root (network namespaces, eBPF)", file=sys.stderr)
        return 2
    if not 1 <= a.reps <= 20 or not 1 <= a.phase_seconds <= 300:
        print("bench_agent: --reps 1..20, --phase-seconds 1..300", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING)
    before = a.before_tree.resolve() if a.before_tree else None
    if before is not None and not (before / "edge_agent" / "main.py").is_file():
        print(f"bench_agent: --before-tree {before}: no edge_agent/main.py there", file=sys.stderr)
        return 2
    results = run_bench(a.reps, a.phase_seconds, a.segs_per_s, before)
    print(f"cfnet-agent process cost (broker, buffer, host metrics, report every 1 s), "
          f"~{a.segs_per_s:.0f} segments/s from its namespace, {a.reps} starts per mode, "
          f"{a.phase_seconds:.0f} s window; median (min..max)")
    print(table(results))
    if a.json:
        print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
