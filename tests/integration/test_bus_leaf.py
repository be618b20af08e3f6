"""An edge site behind a NATS leaf node keeps taking its agents' reports while its uplink is
cut, and the core's ingest stream gets every one of them, once, after the link heals.

The lab (tools/lab.py): site ``edge`` and site ``cloud``, each a network namespace behind
the lab's router. The hub is a 3-node NATS JetStream cluster (tools/nats/cluster.py) in
``cloud`` with its leafnode listener; the site's leaf node (tools/nats/leaf.py) runs in
``edge`` with its own JetStream domain and MQTT listener, and the site is linked
(``link_site``): the leaf's ``CFNET_EDGE`` stream, sourced by the hub's ``CFNET_INGEST``
(the stream the core replicas fetch from, cloud_core/bus_nats_ingest.py).

An agent's MQTT client (edge_agent.wire.mqtt, MQTT 3.1.1 as on the clustered bus, TLS, its own
account and ACL) in ``edge`` publishes numbered QoS 1 reports to the leaf: some with the
link up, then many with the site's link down at the router (``Lab.link_down``), each
acknowledged by the leaf, then the link comes back. Measured and asserted: every report
reaches the hub stream exactly once and in order; none of the ones published during the
cut reaches it before the heal; how long after the heal the last one arrives (printed).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

from cloud_core.bus_nats import STREAM
from edge_agent.wire import telemetry_topic
from edge_agent.wire.mqtt import MqttClient, MqttSettings
from tests.integration.helpers import wait_for
from tools.lab import Lab, SiteSpec
from tools.nats.cluster import ADMIN_USER, NatsCluster
from tools.nats.leaf import EDGE_STREAM, EdgeLeaf, link_site
from tools.netns import in_netns

pytestmark = [pytest.mark.root]

NODE = "leaf-agent-1"
BEFORE, DURING = 10, 40


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Lab, NatsCluster,
                                                                      EdgeLeaf]]:
    if os.geteuid() != 0:
        pytest.fail("needs root (network namespaces); the test machine runs as root")
    work = tmp_path_factory.mktemp("leaf")
    with Lab([SiteSpec("edge"), SiteSpec("cloud")], prefix=f"cflf{os.getpid() % 10000}") as lab:
        hub = NatsCluster(work / "hub", host=lab.addr("cloud"), netns=lab.ns("cloud"),
                          leafnodes=True, extra_sans=(f"IP:{lab.addr('edge')}",))
        hub.add_account(NODE, "agent")
        hub.start()
        try:
            leaf = EdgeLeaf(work / "leaf", hub, site="edge", host=lab.addr("edge"),
                            netns=lab.ns("edge"))
            leaf.start()
            try:
                link_site(leaf)
                yield lab, hub, leaf
            finally:
                leaf.stop()
        finally:
            hub.stop()


def _exactly_once(hub: NatsCluster, n: int) -> list[bytes]:
    """The hub stream holds report-0 .. report-(n-1), each once, in order (asserted)."""
    got = _hub_payloads(hub)
    want = [f"report-{i}".encode() for i in range(n)]
    assert got == want, f"lost: {sorted(set(want) - set(got))}; extra or out of order: {got}"
    return got


def _hub_payloads(hub: NatsCluster) -> list[bytes]:
    """Every message in the hub's ingest stream, in stream order (admin, native NATS)."""
    async def read() -> list[bytes]:
        import ssl

        import nats

        ctx = ssl.create_default_context(cafile=str(hub.ca_file))
        nc = await nats.connect(servers=hub.nats_urls, user=ADMIN_USER,
                                password=hub.admin_password, tls=ctx, connect_timeout=5)
        try:
            js = nc.jetstream()
            state = (await js.stream_info(STREAM)).state
            out = []
            for seq in range(state.first_seq, state.last_seq + 1):
                if state.messages == 0:
                    break
                msg = await js.get_msg(STREAM, seq)
                out.append(msg.data or b"")
            return out
        finally:
            await nc.close()

    return in_netns(hub.netns, asyncio.run, read())


def _edge_stream_count(leaf: EdgeLeaf) -> int:
    """Messages in the leaf's CFNET_EDGE stream (its monitoring endpoint)."""
    jsz = leaf.monitor("jsz?streams=true")
    for acc in jsz.get("account_details") or []:
        for st in acc.get("stream_detail") or []:
            if st.get("name") == EDGE_STREAM:
                return int(st["state"]["messages"])
    raise AssertionError(f"no {EDGE_STREAM} on the leaf: {jsz}")


def _agent(hub: NatsCluster, leaf: EdgeLeaf) -> MqttClient:
    creds = hub.credentials(NODE)
    c = MqttClient(MqttSettings(host=leaf.host, port=leaf.port, username=creds.username,
                                password=creds.password, tls=True, ca_file=creds.ca_file,
                                client_id=NODE, protocol="mqtt311"))
    in_netns(leaf.netns, c.start)  # paho's network thread lives in the site's namespace
    return c


def _publish(agent: MqttClient, n0: int, n: int) -> None:
    for i in range(n0, n0 + n):
        h: Any = agent.publish(telemetry_topic(NODE), f"report-{i}".encode(), qos=1)
        assert h.wait(10), f"report {i} not acknowledged by the leaf within 10 s"


def test_reports_published_during_a_cut_uplink_reach_the_core_once_after_it_heals(
        site: tuple[Lab, NatsCluster, EdgeLeaf]) -> None:
    lab, hub, leaf = site
    agent = _agent(hub, leaf)
    try:
        assert agent.wait_connected(15), f"agent not connected to the leaf: {agent.last_refusal}"
        _publish(agent, 0, BEFORE)
        wait_for(lambda: len(_hub_payloads(hub)) >= BEFORE, 20,
                 f"the {BEFORE} reports sent with the link up in the hub's {STREAM}")

        lab.link_down("edge")
        wait_for(lambda: not leaf.uplink_up(), 15, "the leaf to notice its uplink is cut")
        t_cut = time.monotonic()
        _publish(agent, BEFORE, DURING)  # each one acknowledged by the leaf: the site works
        cut_s = time.monotonic() - t_cut
        stored = _edge_stream_count(leaf)
        assert stored >= BEFORE + DURING, f"the leaf's {EDGE_STREAM} holds {stored} messages"
        assert len(_hub_payloads(hub)) == BEFORE, "reports crossed a cut link"

        lab.link_up("edge")
        t_heal = time.monotonic()
        wait_for(leaf.uplink_up, 30, "the leaf's uplink to come back")
        t_link = time.monotonic() - t_heal
        total = BEFORE + DURING
        wait_for(lambda: len(_hub_payloads(hub)) >= total, 40,
                 f"all {total} reports in the hub's {STREAM} after the heal "
                 f"(leaf: {leaf.log_tail(5)})")
        t_all = time.monotonic() - t_heal
    finally:
        in_netns(leaf.netns, agent.stop)
    got = _exactly_once(hub, total)
    print(f"\nleaf: {DURING} reports taken in {cut_s:.2f} s with the uplink cut "
          f"(the leaf's {EDGE_STREAM} then held {stored}); after the heal the "
          f"uplink was back in {t_link:.2f} s and the last report in the hub stream in "
          f"{t_all:.2f} s; {len(got)} of {total} there, 0 lost, 0 duplicated")
