"""A core replica's bus connection SIGKILLed mid-stream, on both buses: every report
arrives, and is folded once.

Two replicas share ingest, through the JetStream consumer (cloud_core/bus_nats_ingest.py) on
a real 3-node NATS cluster (tools/nats/cluster.py), or through ``$share`` on Mosquitto
(TLS, the cfnet ACL, sessions as ``cfnet-core --share-group`` sets them); 60 simulated agents with end-to-end acks
(tools.simulate, ack mode: each keeps a report until a core acknowledges it and resends
what is lost, as the agent does) report at 1 Hz. Mid-stream the follower's bus connection
(its MQTT child, which on NATS also holds its JetStream fetchers) is SIGKILLed; the
follower starts a new one (cloud_core/mqtt_process.py). Then:

- nothing is lost: every report of every agent is acknowledged in the end, and each is in
  one of the two replicas' states (each replica's own history of (boot, seq) per node);
- nothing is folded twice, by one replica or by both: JetStream never redelivers what the
  follower folded (it folds only what the server confirmed acknowledged), its end-to-end
  acks and its digest's seqs wait for its new connection instead of being lost with the
  old one, so the agents resend nothing it folded and the survivor takes as a duplicate
  whatever comes twice. While the follower is away and just back, each node's reports
  are folded by its owner only (cloud_core/ownership.py). Before, what the follower folded
  in its last moments (after its last digest) was folded again by the survivor: on NATS
  until the child was started again, on Mosquitto until now (the follower stayed without a
  connection, its last acks never sent, and the agents' resends went to the survivor).

The bench (tools/bench_bus.py) runs the same kill at fleet scale, on both buses.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cloud_core.service import CoreConfig, CoreService
from tests.integration.helpers import settings, wait_for
from tests.integration.test_bus_replicas import replica
from tools.broker import Broker
from tools.nats.cluster import NatsCluster

FLEET = 60
RUN_S = 16.0
KILL_AT_S = 3.0
# The follower digests every 2 s and acknowledges every 5 s, and is killed this long after
# a digest and within 5 s of an ack flush: its last ~UNDIGESTED_S of folds are then neither
# named in a digest nor acknowledged to their agents when its connection dies (with the
# defaults, 1 s each, the same window exists, only shorter and at a random phase).
UNDIGESTED_S = 1.2


@pytest.fixture(params=["mosquitto", "nats"])
def bus(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Broker | NatsCluster]:
    if request.param == "mosquitto":  # a fresh broker (tests/conftest.py), stopped after
        yield request.getfixturevalue("broker_factory")()
        return
    c = NatsCluster(tmp_path / "nats")
    c.start()
    yield c
    c.stop()


def make_replica(b: Broker | NatsCluster, i: int, tmp: Path, **kw: float) -> CoreService:
    """Replica ``i`` (1 places, 2 follows); on Mosquitto with the session ``cfnet-core
    --share-group`` gives a `$share` member (none kept: a dead member leaves the group)."""
    if isinstance(b, NatsCluster):
        return replica(b, i, tmp, **kw)
    creds = b.add_account(f"core-r{i}", "core")
    core = CoreService(CoreConfig(
        mqtt=settings(b, creds, client_id=creds.username, session_expiry_s=0, clean_start=True),
        db_path=tmp / f"core{i}.db", share_group="cfnet", place=i == 1, console=i == 1,
        digest_interval_s=kw.get("digest_interval_s", 0.5),
        ack_interval_s=kw.get("ack_interval_s", 1.0)))
    core.start()
    assert core.mqtt.wait_connected(15)
    return core


def histories(core: CoreService, nodes: list[str]) -> dict[str, list[tuple[str, int]]]:
    return {n: core.state.node_history(n) for n in nodes}


def test_replica_sigkill_mid_stream_every_report_once(bus: Broker | NatsCluster,
                                                      tmp_path: Path) -> None:
    from tools.simulate import SimConfig, Simulator, World

    leader = make_replica(bus, 1, tmp_path)
    follower = make_replica(bus, 2, tmp_path, digest_interval_s=2.0, ack_interval_s=5.0)
    cores = [leader, follower]
    digests = follower.digests
    assert digests is not None
    sims = [settings(bus, bus.add_account(n, "sim"), client_id=n, session_expiry_s=0,
                     clean_start=True, keepalive_s=5, max_inflight=100)
            for n in ("sim-rk0", "sim-rk1")]
    listener = settings(bus, bus.add_account("sim-rk-acks", "sim"),
                        client_id="sim-rk-acks", clean_start=True, keepalive_s=5)
    world = World(SimConfig(nodes=FLEET, rate=1.0, duration_s=RUN_S, seed=11, node_prefix="rk"))
    sim = Simulator(world, sims, acks=listener, drain_s=40.0, client="paho")
    result: dict[str, Any] = {}
    runner = threading.Thread(target=lambda: result.update(sim.run()), daemon=True)
    nodes = [f"rk{i:05d}" for i in range(FLEET)]
    try:
        time.sleep(2.0)  # the shared consumers in place (they start at new messages)
        runner.start()
        while not sim.t0 or time.time() - sim.t0 < KILL_AT_S:
            time.sleep(0.25)
        assert follower.ingest.counters().accepted > 0, "the follower never took a share"
        acked = follower.acks.messages
        wait_for(lambda: follower.acks.messages != acked, 10, "the follower's ack flush")
        sent = digests.sent_items
        wait_for(lambda: digests.sent_items != sent, 10, "the follower's next digest")
        at_digest = follower.ingest.counters().accepted
        time.sleep(UNDIGESTED_S)
        pid = follower.mqtt.pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        t_kill = time.time()
        after_kill = leader.ingest.counters().accepted
        runner.join(RUN_S + 60)
        assert not runner.is_alive(), "simulator did not finish"
        assert result["errors"] == 0 and result["pending_dropped"] == 0, result
        assert result["unacked"] == 0, result  # every report acknowledged
        assert leader.ingest.counters().accepted > after_kill  # the survivor took over
        assert follower.mqtt.restarts == 1 and follower.mqtt.connected  # and it came back
        taken = sim.taken()
        assert sorted(taken) == nodes
        lead, foll = histories(leader, nodes), histories(follower, nodes)
        both: set[tuple[str, str, int]] = set()
        for n, (boot, last) in taken.items():
            assert len(set(lead[n])) == len(lead[n]), n  # once per replica
            assert len(set(foll[n])) == len(foll[n]), n
            assert set(lead[n]) | set(foll[n]) == {(boot, s) for s in range(1, last + 1)}, n
            both |= {(n, b, s) for b, s in set(lead[n]) & set(foll[n])}
        assert not both, sorted(both)[:10]  # each report in one replica's state only
        print(f"\n{FLEET} agents, {result['offered']} reports, all acknowledged; follower "
              f"SIGKILLed at {t_kill - sim.t0:.1f} s after folding "
              f"{sum(map(len, foll.values()))} ({at_digest} by its last digest); in both "
              f"states {len(both)}; resent {result['resent']}; fold gates "
              f"{[c.gate.counts() if c.gate else None for c in cores]}")
    finally:
        sim.stop()
        if runner.is_alive():
            runner.join(10)
        for c in cores:
            c.stop()
