"""A core replica SIGKILLed mid-stream on the NATS bus: every report arrives, once.

Two replicas share ingest through the JetStream consumer (cloud_core/bus_nats_ingest.py) on
a real 3-node cluster (tools/nats/cluster.py); 60 simulated agents with end-to-end acks
(tools.simulate, ack mode: each keeps a report until a core acknowledges it and resends
what is lost, as the agent does) report at 1 Hz. Mid-stream the follower's bus connection
(its MQTT child, which also holds its JetStream fetchers) is SIGKILLed. Then:

- nothing is lost: every report of every agent is acknowledged in the end, and each is in
  one of the two replicas' states (each replica's own history of (boot, seq) per node);
- nothing is folded twice by one replica, and a report is in both replicas' histories only
  if the follower folded it in its last moments, after its last digest had gone out:
  everything it folded before that, the survivor knew from the digests' ``seqs`` and took
  as a duplicate when it arrived again (the bus's redelivery of what the dead replica had
  fetched, the agents' resends of what its lost acks did not confirm).

The bench (tools/bench_bus.py) runs the same kill at fleet scale, on both buses.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cloud_core.service import CoreService
from tests.integration.helpers import settings
from tests.integration.test_bus_replicas import replica
from tools.nats.cluster import NatsCluster

FLEET = 60
RUN_S = 16.0
KILL_AT_S = 6.0
# What the follower folded this long before the kill has surely been named in one of its
# digests (every 0.5 s here) and reached the survivor.
DIGESTED_S = 1.5


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[NatsCluster]:
    c = NatsCluster(tmp_path / "nats")
    c.start()
    yield c
    c.stop()


def histories(core: CoreService, nodes: list[str]) -> dict[str, list[tuple[str, int]]]:
    return {n: core.state.node_history(n) for n in nodes}


def test_replica_sigkill_mid_stream_every_report_once(cluster: NatsCluster,
                                                      tmp_path: Path) -> None:
    from tools.simulate import SimConfig, Simulator, World

    cores = [replica(cluster, i, tmp_path) for i in (1, 2)]
    leader, follower = cores
    sims = [settings(cluster, cluster.add_account(n, "sim"), client_id=n, session_expiry_s=0,
                     clean_start=True, keepalive_s=5, max_inflight=100)
            for n in ("sim-rk0", "sim-rk1")]
    listener = settings(cluster, cluster.add_account("sim-rk-acks", "sim"),
                        client_id="sim-rk-acks", clean_start=True, keepalive_s=5)
    world = World(SimConfig(nodes=FLEET, rate=1.0, duration_s=RUN_S, seed=11, node_prefix="rk"))
    sim = Simulator(world, sims, acks=listener, drain_s=40.0, client="paho")
    result: dict[str, Any] = {}
    runner = threading.Thread(target=lambda: result.update(sim.run()), daemon=True)
    nodes = [f"rk{i:05d}" for i in range(FLEET)]
    try:
        time.sleep(2.0)  # the shared consumers in place (they start at new messages)
        runner.start()
        # The follower's per-node history lengths, sampled until the kill.
        marks: deque[tuple[float, dict[str, int]]] = deque(maxlen=40)
        while not sim.t0 or time.time() - sim.t0 < KILL_AT_S:
            marks.append((time.time(), {n: len(h) for n, h in
                                        histories(follower, nodes).items()}))
            time.sleep(0.25)
        assert follower.ingest.counters().accepted > 0, "the follower never took a share"
        pid = follower.mqtt.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        t_kill = time.time()
        digested = next(m for t, m in reversed(marks) if t <= t_kill - DIGESTED_S)
        after_kill = leader.ingest.counters().accepted
        runner.join(RUN_S + 60)
        assert not runner.is_alive(), "simulator did not finish"
        assert result["errors"] == 0 and result["pending_dropped"] == 0, result
        assert result["unacked"] == 0, result  # every report acknowledged
        assert leader.ingest.counters().accepted > after_kill  # the survivor took over
        taken = sim.taken()
        assert sorted(taken) == nodes
        lead, foll = histories(leader, nodes), histories(follower, nodes)
        both: set[tuple[str, str, int]] = set()
        late: set[tuple[str, str, int]] = set()  # folded by the follower after `digested`
        for n, (boot, last) in taken.items():
            assert len(set(lead[n])) == len(lead[n]), n  # once per replica
            assert len(set(foll[n])) == len(foll[n]), n
            assert set(lead[n]) | set(foll[n]) == {(boot, s) for s in range(1, last + 1)}, n
            both |= {(n, b, s) for b, s in set(lead[n]) & set(foll[n])}
            late |= {(n, b, s) for b, s in foll[n][digested[n]:]}
        assert both <= late, sorted(both - late)[:10]
        print(f"\n{FLEET} agents, {result['offered']} reports, all acknowledged; follower "
              f"SIGKILLed at {t_kill - sim.t0:.1f} s after folding "
              f"{sum(map(len, foll.values()))}; in both states {len(both)} (the follower's "
              f"last {DIGESTED_S} s: {len(late)}); resent {result['resent']}")
    finally:
        sim.stop()
        if runner.is_alive():
            runner.join(10)
        for c in cores:
            c.stop()
