"""Shared pytest fixtures. Add yours below, in a section of your own.

Broker fixtures (``tools.broker``):

- ``broker``: one TLS Mosquitto with the cfnet ACL per test module, started once.
  Do not stop, kill or restart it; use ``broker_factory`` for that.
- ``make_account(name, role)``: add an account to the module's ``broker`` and
  return its :class:`tools.broker.Credentials` (idempotent for the same role).
- ``broker_factory(**kwargs)``: a fresh :class:`tools.broker.Broker` per call,
  function-scoped, in its own temp dir, started, and stopped at teardown
  (kwargs go to ``Broker``: ``tls``, ``port``, ``persistence``,
  ``username_as_clientid``, ``extra_conf``).

As in production, the broker uses the username as the MQTT client id: a second
connection with the same account kicks the first off. Give every client its
own account, or use ``broker_factory(username_as_clientid=False)``.

Tests that need Mosquitto are skipped when ``/usr/sbin/mosquitto`` is missing.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tools.broker import MOSQUITTO, Broker, Credentials, Role


def _need_mosquitto() -> None:
    if not os.access(MOSQUITTO, os.X_OK):
        pytest.skip(f"{MOSQUITTO} not installed (run tools/setup.sh)")


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    """A TLS broker with password auth and the cfnet ACL, shared by one test module."""
    _need_mosquitto()
    b = Broker(tmp_path_factory.mktemp("broker"))
    b.start()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture(scope="module")
def make_account(broker: Broker) -> Callable[[str, Role], Credentials]:
    """``make_account(name, role)`` on the module's broker; live when it returns."""
    return broker.add_account


@pytest.fixture
def broker_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Broker]]:
    """Start fresh brokers for tests that stop, kill or restart them."""
    _need_mosquitto()
    made: list[Broker] = []

    def make(**kwargs: Any) -> Broker:
        b = Broker(Path(tmp_path_factory.mktemp("broker")), **kwargs)
        made.append(b)
        b.start()
        return b

    try:
        yield make
    finally:
        for b in made:
            b.stop()
