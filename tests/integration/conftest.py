"""Fixtures for integration tests: a running in-process core on the module's broker and
three simulated agents (FakeAgent, a named stand-in) reporting twice a second."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from cloud_core.registry import parse_registry
from cloud_core.service import CoreConfig, CoreService
from tests.integration.helpers import FakeAgent, nats_console, settings
from tools.broker import Broker

REGISTRY = """
nodes:
  - {name: edge-a, region: eu, zone: eu-1, security_level: 2, price_per_hour: 0.10}
  - {name: edge-b, region: eu, zone: eu-2, security_level: 1, price_per_hour: 0.05}
  - {name: edge-c, region: us, zone: us-1, security_level: 3, price_per_hour: 0.02}
"""


@pytest.fixture
def core(broker: Broker, tmp_path: Path) -> Iterator[CoreService]:
    creds = broker.add_account("core-0", "core")
    cfg = CoreConfig(
        mqtt=settings(broker, creds, client_id="core-0"), db_path=tmp_path / "core.db",
        registry=parse_registry(REGISTRY),
        roles={"alice": "operator", "carol": "operator", "victor": "viewer", "root": "admin"},
        step_interval_s=0.2, nats_console=nats_console(broker, creds),
    )
    c = CoreService(cfg)
    c.start()
    assert c.mqtt.wait_connected(10)
    yield c
    c.stop()


@pytest.fixture
def agents(broker: Broker) -> Iterator[dict[str, FakeAgent]]:
    addrs = {"edge-a": "10.9.0.1", "edge-b": "10.9.0.2", "edge-c": "10.9.0.3"}
    out = {}
    for n, a in addrs.items():
        peers = {p: (5.0 if n[-1] in "ab" and p[-1] in "12" else 80.0)
                 for m, p in addrs.items() if m != n}
        out[n] = FakeAgent(broker, broker.add_account(n, "agent"), a, peers)
    for ag in out.values():
        ag.announce()
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(0.5):
            for ag in out.values():
                ag.report()

    for ag in out.values():
        ag.report()
    t = threading.Thread(target=beat, daemon=True)
    t.start()
    yield out
    stop.set()
    t.join(5)
    for ag in out.values():
        ag.close()


