"""After a long uplink cut, the core re-arms the hub's source of the site by itself, so the
site's backlog reaches the core within seconds of the heal instead of after nats-server's
retry back-off (docs/scale.md measured 15.2 s after a 45 s cut and 50.6 s after 120 s).

Same lab as tests/integration/test_bus_leaf.py (hub cluster in ``cloud``, the site's leaf
node in ``edge``), plus the core's shared ingest on the hub (cloud_core/bus_nats.py
``SharedIngest``, a core account with the chart's permissions) configured as
``cfnet-core --bus nats --share-group ... --nats-sites edge`` configures it
(``build_config(parse_args(...))``). The core links the site by itself: it starts before
the site's leaf, counts the site as not answering and goes on (its ingest connected),
then creates the leaf's ``CFNET_EDGE`` through the site's JetStream domain and adds
``CFNET_INGEST``'s source of it once the leaf is up (no ``link_site``). Its
``SourceResumer`` is also what re-arms. The leaf dials only hub nodes that do not lead
``CFNET_INGEST``: a leaf connecting to the stream's leader makes that server retry the
source itself (``checkInternalSyncConsumers``, server/leafnode.go), which would hide
whether the core did. The cut lasts 45 s with a report every 0.5 s. Asserted: every report
reaches the hub stream and the core within 8 s of the leaf's uplink being back, each once
and in order, and the core re-armed the site's source exactly once.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections.abc import Iterator

import pytest

from cloud_core.bus_nats import EDGE_STREAM, STREAM, SharedIngest
from cloud_core.main import build_config, parse_args
from edge_agent.wire import TELEMETRY_WILDCARD
from tests.integration.helpers import wait_for
from tests.integration.test_bus_leaf import _agent, _exactly_once, _hub_payloads, _publish
from tools.lab import Lab, SiteSpec
from tools.nats.cluster import ADMIN_USER, NatsCluster
from tools.nats.leaf import EdgeLeaf
from tools.netns import in_netns

pytestmark = [pytest.mark.root]

NODE = "leaf-agent-1"
CORE = "core-leaf"
CUT_S = 45.0
CATCH_UP_BOUND_S = 8.0  # measured 1.1-3.1 s; without the re-arm 14-15 s
LINK_BOUND_S = 45.0  # the core's back-off is at most 30 s (bus_nats.LINK_BACKOFF_MAX_S)

Site = tuple[Lab, NatsCluster, EdgeLeaf, SharedIngest, list[bytes]]


def _stream_leader(hub: NatsCluster) -> str:
    """The server name of ``CFNET_INGEST``'s leader (admin, native NATS)."""
    async def ask() -> str:
        import ssl

        import nats

        ctx = ssl.create_default_context(cafile=str(hub.ca_file))
        nc = await nats.connect(servers=hub.nats_urls, user=ADMIN_USER,
                                password=hub.admin_password, tls=ctx, connect_timeout=5)
        try:
            msg = await nc.request(f"$JS.API.STREAM.INFO.{STREAM}", b"", timeout=5)
            return str((json.loads(msg.data).get("cluster") or {}).get("leader") or "")
        finally:
            await nc.close()

    return in_netns(hub.netns, asyncio.run, ask())


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    if os.geteuid() != 0:
        pytest.fail("needs root (network namespaces); the test machine runs as root")
    work = tmp_path_factory.mktemp("leafresume")
    with Lab([SiteSpec("edge"), SiteSpec("cloud")], prefix=f"cflr{os.getpid() % 10000}") as lab:
        hub = NatsCluster(work / "hub", host=lab.addr("cloud"), netns=lab.ns("cloud"),
                          leafnodes=True, extra_sans=(f"IP:{lab.addr('edge')}",))
        hub.add_account(NODE, "agent")
        hub.add_account(CORE, "core")
        hub.start()
        got: list[bytes] = []
        lock = threading.Lock()

        def deliver(topic: str, payload: bytes) -> None:
            with lock:
                got.append(payload)

        creds = hub.credentials(CORE)
        cfg = build_config(parse_args([
            "--bus", "nats", "--share-group", "cfnet-core", "--username", creds.username,
            f"--password={creds.password}", "--ca-file", str(hub.ca_file),
            "--broker-host", hub.host, "--broker-port", str(hub.port),
            "--nats-url", ",".join(hub.nats_urls), "--nats-sites", "edge",
            "--db", str(work / "core.db")]))
        assert cfg.nats is not None and cfg.nats.sites == ("edge",), cfg.nats
        ingest = SharedIngest(cfg.nats, deliver)
        ingest.add("cfnet-core", TELEMETRY_WILDCARD)
        leaf: EdgeLeaf | None = None
        try:
            in_netns(hub.netns, ingest.start)  # its thread lives in the cloud's namespace
            wait_for(lambda: ingest.connected, 30,
                     f"the core's shared ingest on {STREAM} (errors: {ingest.errors})")
            leader = ""

            def led() -> bool:
                nonlocal leader
                leader = _stream_leader(hub)
                return bool(leader)

            wait_for(led, 15, f"a leader for {STREAM}")
            # No leaf yet: the site does not answer; counted, and ingest goes on.
            wait_for(lambda: ingest.resumer is not None
                     and ingest.resumer.link_failures.get("edge", 0) >= 1, 15,
                     "the core's first attempt to link site edge (before its leaf is up)")
            assert ingest.connected and ingest.resumer is not None
            assert not ingest.resumer.linked, ingest.resumer.linked
            uplinks = [f"nats-leaf://{hub.host}:{n.leaf_port}" for n in hub.nodes
                       if n.name != leader]
            leaf = EdgeLeaf(work / "leaf", hub, site="edge", host=lab.addr("edge"),
                            netns=lab.ns("edge"), uplinks=uplinks)
            leaf.start()
            t_up = time.monotonic()
            resumer = ingest.resumer
            wait_for(lambda: resumer.linked.get("edge") == 1, LINK_BOUND_S,
                     f"the core to link site edge once its leaf is up ({EDGE_STREAM} on the "
                     f"leaf, {STREAM}'s source; failures: {resumer.link_failures})")
            print(f"\nsite edge linked by the core {time.monotonic() - t_up:.2f} s after its "
                  f"leaf was up ({resumer.link_failures['edge']} failed attempts before)")
            yield lab, hub, leaf, ingest, got
        finally:
            ingest.stop()
            if leaf is not None:
                leaf.stop()
            hub.stop()


def test_the_core_rearms_a_stalled_site_source_once_after_a_long_cut(site: Site) -> None:
    lab, hub, leaf, ingest, got = site
    agent = _agent(hub, leaf)
    try:
        assert agent.wait_connected(15), f"agent not connected to the leaf: {agent.last_refusal}"
        _publish(agent, 0, 5)
        wait_for(lambda: len(got) >= 5, 20, "the 5 reports sent with the link up at the core")
        lab.link_down("edge")
        t_cut = time.monotonic()
        n = 5
        while time.monotonic() - t_cut < CUT_S:  # bounded: the cut's length
            _publish(agent, n, 1)
            n += 1
            time.sleep(0.5)  # the reports' pace, not a synchronisation
        assert len(_hub_payloads(hub)) == 5, "reports crossed a cut link"
        assert ingest.resumer is not None and not ingest.resumer.resumed, \
            f"re-armed while the site was cut: {ingest.resumer and ingest.resumer.resumed}"
        lab.link_up("edge")
        t_heal = time.monotonic()
        wait_for(leaf.uplink_up, 30, "the leaf's uplink to come back")
        t_link = time.monotonic()
        wait_for(lambda: len(got) >= n, CATCH_UP_BOUND_S,
                 f"all {n} reports at the core within {CATCH_UP_BOUND_S:.0f} s of the uplink "
                 f"(have {len(got)}; re-armed: {ingest.resumer.resumed})")
        t_all = time.monotonic()
    finally:
        in_netns(leaf.netns, agent.stop)
    _exactly_once(hub, n)
    want = [f"report-{i}".encode() for i in range(n)]
    assert got == want, f"the core got {len(got)} reports, not each of {n} once in order"
    assert ingest.resumer.resumed == {"edge": 1}, ingest.resumer.resumed
    assert ingest.resumer.linked == {"edge": 1}, "linked again: its source never went away"
    print(f"\nleaf, {CUT_S:.0f} s cut, {n - 5} reports during it: uplink back "
          f"{t_link - t_heal:.2f} s after the heal, all {n} at the core "
          f"{t_all - t_heal:.2f} s after the heal (core re-armed the source once); "
          f"0 lost, 0 duplicated")
