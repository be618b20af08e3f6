"""What the NATS auth callout costs per connect (cloud_core/bus_callout.py), against its baseline.

One 3-node cluster with the callout (``NatsCluster(callout=True)``); rounds alternate
connects that the server admits itself (the harness's bypass user: the baseline, a plain
config's password check) and connects of an agent account, which go through the callout
(with its own client ID). Each connect is a full TLS MQTT CONNECT/CONNACK/DISCONNECT by
``tools.broker.mqtt_connect_probe``, one at a time. Per mode: the median and p90 connect
latency and, per 1,000 connects, the CPU seconds of the nats-servers and of the callout
process (psutil: process time, not wall). Median and spread over ``--rounds``.

    python -m tools.bench_callout [--connects 200] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import psutil

from tools.broker import mqtt_connect_probe
from tools.nats.cluster import READY_USER, NatsCluster


def _cpu(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        t = psutil.Process(pid).cpu_times()
        total += t.user + t.system
    return total


def _round(c: NatsCluster, user: str, password: str, client_id: str, n: int,
           callout_pid: int) -> tuple[list[float], float, float]:
    host, port = c.addresses[0]
    servers = c.pids()
    s0, k0 = _cpu(servers), _cpu([callout_pid])
    lat = []
    for _ in range(n):
        t = time.perf_counter()
        rc = mqtt_connect_probe(host, port, username=user, password=password,
                                ca_file=c.ca_file, client_id=client_id, timeout_s=10)
        lat.append(time.perf_counter() - t)
        if rc != 0:
            raise SystemExit(f"{user} refused (CONNACK {rc})")
    return lat, _cpu(servers) - s0, _cpu([callout_pid]) - k0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.bench_callout")
    ap.add_argument("--connects", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args(argv)
    n = max(1, min(a.connects, 5000))
    with tempfile.TemporaryDirectory(prefix="bench-callout-") as tmp, \
            NatsCluster(Path(tmp), callout=True) as c:
        creds = c.add_account("bench-node", "agent")
        assert c._callout_proc is not None
        kpid = c._callout_proc.pid
        modes = {"config (baseline)": (READY_USER, c._ready_password, "bench-probe"),
                 "callout": (creds.username, creds.password, "agent-bench-node")}
        res: dict[str, list[tuple[float, float, float, float]]] = {m: [] for m in modes}
        for _ in range(max(1, min(a.rounds, 20))):
            for mode, (user, pw, cid) in modes.items():  # alternated, same cluster
                lat, srv, kal = _round(c, user, pw, cid, n, kpid)
                q = statistics.quantiles(lat, n=10)
                res[mode].append((statistics.median(lat) * 1e3, q[8] * 1e3,
                                  srv / n * 1000, kal / n * 1000))
    print(f"{n} connects per round, {len(res['callout'])} rounds, load "
          f"{psutil.getloadavg()[0]:.1f}; median (min-max) over rounds")
    print(f"{'mode':<20} {'p50 ms':>18} {'p90 ms':>18} {'servers CPU s/1k':>20} "
          f"{'callout CPU s/1k':>20}")
    for mode, rows in res.items():
        cols = []
        for i in range(4):
            v = [r[i] for r in rows]
            cols.append(f"{statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f})")
        print(f"{mode:<20} {cols[0]:>18} {cols[1]:>18} {cols[2]:>20} {cols[3]:>20}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
