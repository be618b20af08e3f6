"""A real agent with a tiny store-and-forward buffer and no broker, in a network namespace.

Phase 1: ``cfnet-agent`` samples every 50 ms into a 32 KiB buffer while its
broker is absent. The buffer thins the oldest half (keeps every 2nd) whenever
it is over the bound. Checked: every report taken is either still buffered or
counted as thinned -- the count is exact -- the oldest report and the newest
run survive, the agent's memory and the buffer's files stop growing.

Phase 2: the agent is restarted (new boot, larger bound, same buffer file) with
a broker and a core in the namespace: the previous boot's surviving reports
reach the core exactly once, oldest first, and the new reports carry the
thinned count; the core's end-to-end acks empty the buffer of them. The core
runs as ``cfnet-core`` runs it (MQTT in its child process).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from cloud_core.service import CoreConfig, CoreService
from tests.integration.helpers import settings, wait_for
from tools.broker import Broker
from tools.lab import Lab, SiteSpec
from tools.netns import in_netns

pytestmark = [pytest.mark.root, pytest.mark.slow]

VENV_BIN = Path(sys.executable).parent
MAX_BYTES = 32 * 1024
TAKE = 600  # reports in phase 1 (about 30 s at 20/s)
NODE = "edge-tiny"


@pytest.fixture(scope="module")
def lab() -> Iterator[Lab]:
    if os.geteuid() != 0:
        pytest.fail("needs root for network namespaces (run as root)")
    with Lab([SiteSpec("edge")], prefix=f"bb{os.getpid() % 1000}") as lb:
        yield lb


def rows(db: Path, q: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5)
    except sqlite3.OperationalError:  # not created yet
        return []
    try:
        return con.execute(q, params).fetchall()
    except sqlite3.OperationalError:
        return []
    finally:
        con.close()


def disk(db: Path) -> int:
    return sum(p.stat().st_size for p in (db, Path(f"{db}-wal"), Path(f"{db}-shm"))
               if p.exists())


def agent(lab: Lab, b: Broker, tmp: Path, interval: float, max_bytes: int,
          log: str) -> subprocess.Popen[bytes]:
    creds = b.add_account(NODE, "agent")
    (tmp / "a.pw").write_text(creds.password)
    out = open(tmp / log, "wb")  # noqa: SIM115 - the process owns it
    try:
        return lab.popen("edge", [
            str(VENV_BIN / "cfnet-agent"), "--node", NODE, "--broker-host", b.host,
            "--broker-port", str(b.port), "--password-file", str(tmp / "a.pw"),
            "--ca-file", str(b.ca_file), "--buffer-path", str(tmp / "buffer.db"),
            "--buffer-max-bytes", str(max_bytes), "--interval-s", str(interval),
            "--no-ebpf", "--no-active-probing"], stdout=out, stderr=subprocess.STDOUT)
    finally:
        out.close()


def stop(p: subprocess.Popen[bytes]) -> None:
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(20)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait(10)


def test_tiny_buffer_thins_exactly_stays_bounded_then_drains_oldest_first(
        lab: Lab, tmp_path: Path) -> None:
    db = tmp_path / "buffer.db"
    # The broker exists (port, accounts) but does not run during phase 1.
    b = Broker(tmp_path / "broker", host=lab.addr("edge"), netns=lab.ns("edge"))
    p = agent(lab, b, tmp_path, 0.05, MAX_BYTES, "agent1.log")
    rss: list[int] = []
    sizes: list[int] = []
    try:
        proc = psutil.Process(p.pid)  # `ip netns exec` execs the agent in place

        def progress() -> int:
            rss.append(proc.memory_info().rss)
            sizes.append(disk(db))
            got = rows(db, "SELECT MAX(seq) FROM reports")
            return int(got[0][0] or 0) if got else 0

        wait_for(lambda: progress() >= TAKE, 240, f"{TAKE} reports taken")
    finally:
        stop(p)
    log1 = (tmp_path / "agent1.log").read_text(errors="replace")
    assert "Traceback" not in log1, log1[-3000:]
    m = [ln for ln in log1.splitlines() if "stopped:" in ln]
    taken = int(m[-1].split("stopped: ")[1].split()[0])
    survivors = [int(r[0]) for r in rows(db, "SELECT seq FROM reports ORDER BY id")]
    meta = dict(rows(db, "SELECT k, v FROM meta"))
    total = int(rows(db, "SELECT SUM(size) FROM reports")[0][0])
    payloads = [json.loads(r[0]) for r in rows(db, "SELECT payload FROM reports ORDER BY id")]
    boot = payloads[0]["boot"]
    thinned, expired = int(meta["thinned"]), int(meta["expired"])
    print(f"\nphase 1: taken {taken}, buffered {len(survivors)} ({total} B of {MAX_BYTES}), "
          f"thinned {thinned}, expired {expired}; agent RSS max {max(rss[:len(rss) // 2]) >> 20}"
          f" MiB (first half) / {max(rss[len(rss) // 2:]) >> 20} MiB (second half); buffer files"
          f" max {max(sizes[:len(sizes) // 2]) >> 10} / {max(sizes[len(sizes) // 2:]) >> 10} KiB")
    # Exact: every report taken is buffered or counted, and the gaps are the count.
    assert expired == 0 and thinned > 0
    assert taken == len(survivors) + thinned
    assert survivors == sorted(survivors) and survivors[-1] == taken
    assert len(set(range(1, taken + 1)) - set(survivors)) == thinned
    # Oldest-first thinning: the very first report is kept, the newest run is intact.
    assert survivors[0] == 1
    tail = survivors[-(len(survivors) // 3):]
    assert tail == list(range(tail[0], tail[0] + len(tail)))
    assert total <= MAX_BYTES
    # Each report says how many were dropped before it; never more than in the end.
    drops = [pl["dropped"] for pl in payloads]
    assert drops == sorted(drops) and drops[-1] <= thinned and drops[-1] > 0
    assert all("buffered" in pl for pl in payloads)
    # Bounded: memory and disk stop growing once the buffer is full (second half vs first).
    half = len(rss) // 2
    assert max(rss[half:]) <= max(rss[:half]) + 8 * 1024 * 1024, (max(rss[:half]), max(rss[half:]))
    assert max(sizes[half:]) <= max(sizes[:half]) + 64 * 1024, (max(sizes[:half]),
                                                                 max(sizes[half:]))
    # ... and disk stays in proportion to the configured bound (database, log, index).
    assert max(sizes) <= 16 * MAX_BYTES, max(sizes)

    # Phase 2: broker and core up; the agent restarts with room to spare.
    b.start()
    core_creds = b.add_account("core-bb", "core")
    cfg = CoreConfig(mqtt=settings(b, core_creds), db_path=tmp_path / "core.db")
    core: CoreService = in_netns(lab.ns("edge"), lambda: CoreService(cfg))
    in_netns(lab.ns("edge"), core.start)
    p2 = agent(lab, b, tmp_path, 1.0, 1 << 20, "agent2.log")
    try:
        got = wait_for(lambda: (lambda h: h if len(h) >= len(survivors) else None)(
            [s for bt, s in core.state.node_history(NODE) if bt == boot]), 90,
            "previous boot's buffered reports at the core")
        assert got == survivors, "not exactly the survivors, oldest first"
        wait_for(lambda: (lambda v: v is not None and v.boot != boot)(
            core.state.snapshot(time.time()).nodes.get(NODE)), 30, "new boot reporting")
        v = core.state.snapshot(time.time()).nodes[NODE]
        print(f"phase 2: {len(got)} buffered reports delivered in order; new boot reports "
              f"dropped={v.dropped}")
        assert v.dropped == thinned
        assert core.ingest.counters().rejected_total == 0
        # The core acknowledged them after ingest: the agent deleted them.
        wait_for(lambda: rows(db, "SELECT COUNT(*) FROM reports WHERE boot=?", (boot,))[0][0]
                 == 0, 30, "previous boot's reports acknowledged and deleted")
    finally:
        stop(p2)
        core.stop()
        b.stop()
    log2 = (tmp_path / "agent2.log").read_text(errors="replace")
    assert "Traceback" not in log2, log2[-3000:]
