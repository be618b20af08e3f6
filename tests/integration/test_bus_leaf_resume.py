"""After a long uplink cut, restarting the hub's source of the site brings its backlog up at
once (tools/nats/leaf.py ``resume_site``), instead of after nats-server's retry back-off.

Same lab as tests/integration/test_bus_leaf.py (hub cluster in ``cloud``, the site's leaf
node in ``edge``, the site linked), but the cut lasts 25 s, publishing a report every
0.5 s: long enough for the hub's source consumer to have failed several times and to be
backing off (10 s more per failure, up to 2 minutes; docs/scale.md measured 15.2 s after
a 45 s cut and 50.6 s after 120 s without this). Once the uplink is back, ``resume_site``
restarts the source: every report must be in the hub's ingest stream within 8 s, in
order, none lost, none twice (it resumes after the last one it stored).
"""

from __future__ import annotations

import time

import pytest

from cloud_core.bus_nats import STREAM
from tests.integration.helpers import wait_for
from tests.integration.test_bus_leaf import _agent, _exactly_once, _hub_payloads, _publish
from tests.integration.test_bus_leaf import site as _site_fixture
from tools.lab import Lab
from tools.nats.cluster import NatsCluster
from tools.nats.leaf import EdgeLeaf, resume_site
from tools.netns import in_netns

pytestmark = [pytest.mark.root]

site = _site_fixture
CUT_S = 25.0
RESUME_BOUND_S = 8.0


def test_resume_after_a_long_cut_brings_the_backlog_up_at_once(
        site: tuple[Lab, NatsCluster, EdgeLeaf]) -> None:
    lab, hub, leaf = site
    agent = _agent(hub, leaf)
    try:
        assert agent.wait_connected(15), f"agent not connected to the leaf: {agent.last_refusal}"
        _publish(agent, 0, 5)
        wait_for(lambda: len(_hub_payloads(hub)) >= 5, 20, f"5 reports in the hub's {STREAM}")
        lab.link_down("edge")
        t_cut = time.monotonic()
        n = 5
        while time.monotonic() - t_cut < CUT_S:  # bounded: the cut's length
            _publish(agent, n, 1)
            n += 1
            time.sleep(0.5)  # the reports' pace, not a synchronisation
        assert len(_hub_payloads(hub)) == 5, "reports crossed a cut link"
        lab.link_up("edge")
        t_heal = time.monotonic()
        wait_for(leaf.uplink_up, 30, "the leaf's uplink to come back")
        assert resume_site(leaf), "the hub stream has no source for the site"
        t_resume = time.monotonic()
        wait_for(lambda: len(_hub_payloads(hub)) >= n, RESUME_BOUND_S,
                 f"all {n} reports in the hub's {STREAM} after resume_site")
        t_all = time.monotonic()
    finally:
        in_netns(leaf.netns, agent.stop)
    _exactly_once(hub, n)
    print(f"\nleaf, {CUT_S:.0f} s cut, {n - 5} reports during it: uplink back "
          f"{t_resume - t_heal:.2f} s after the heal, all {n} in the hub stream "
          f"{t_all - t_resume:.2f} s after resume_site; 0 lost, 0 duplicated")
