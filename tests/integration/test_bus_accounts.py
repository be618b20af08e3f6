"""Accounts on both test buses, through their one shared surface (tools/accounts.py).

``tools.broker.Broker`` (Mosquitto) and ``tools.nats.cluster.NatsCluster`` (3 nodes)
share ``add_account``/``remove_account``/``credentials`` (``BusAccounts``) and differ
only in how a running bus re-reads its accounts and how the harness waits for it. On
each, for real: an account added to the running bus is accepted at once (every node,
on NATS), a wrong password is refused, ``credentials`` gives the same account back, a
removed account is refused at once, an invalid name is refused with the bus's own
error class (the cert store's reason, chained), and adding an account again is a no-op.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tools.broker import Broker, BrokerError
from tools.nats.cluster import NatsCluster, NatsError

Bus = Broker | NatsCluster


@pytest.fixture(scope="module", params=("mosquitto", "nats"))
def bus(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bus]:
    work: Path = tmp_path_factory.mktemp(f"acc-{request.param}")
    b: Bus = Broker(work) if request.param == "mosquitto" else NatsCluster(work)
    b.start()
    try:
        yield b
    finally:
        b.stop()


def _accepted(bus: Bus, username: str, password: str | None) -> bool:
    if isinstance(bus, NatsCluster):  # every node must agree
        return all(bus._probe(n, username, password) == 0 for n in bus.nodes)
    return bus.probe(username, password) == 0


def test_add_credentials_remove_on_a_running_bus(bus: Bus) -> None:
    creds = bus.add_account("acc-node-1", "agent")
    assert _accepted(bus, creds.username, creds.password), "a new account refused"
    assert not _accepted(bus, creds.username, "not-" + (creds.password or "")), \
        "a wrong password accepted"
    assert bus.credentials("acc-node-1") == creds
    assert bus.add_account("acc-node-1", "agent") == creds, "adding again changed the account"
    bus.remove_account("acc-node-1")
    assert not _accepted(bus, creds.username, creds.password), "a removed account accepted"


def test_an_invalid_name_is_refused_with_the_buses_error(bus: Bus) -> None:
    error = BrokerError if isinstance(bus, Broker) else NatsError
    with pytest.raises(error, match="not a valid id") as info:
        bus.add_account("Bad/Name", "agent")
    assert info.value.__cause__ is not None, "the cert store's error is not chained"
