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

Order and workers: the tests that need a build (the Kubernetes binaries, helm, the images:
tests/envbuild.py) run after those that need none, so that a cold build runs beside them.
Under pytest-xdist with ``--dist loadgroup`` (``make test``: two workers), the modules of
``WAITING`` (outages, holds: they mostly sleep) run on one worker and everything else, in
order, on the other.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import envbuild
from tools.broker import MOSQUITTO, Broker, Credentials, Role

# Modules that mostly wait (outages, holds, restarts) and need no build: under ``make test``
# they run on a worker of their own, beside the others (``pytest_xdist_make_scheduler``).
WAITING = frozenset({
    "tests/integration/test_bus.py",  # 60 s outages on both buses
    "tests/integration/test_core_outage.py",
    "tests/integration/test_outage.py",
    "tests/integration/test_core_crash.py",
    "tests/integration/test_bus_leaf_resume.py",
    "tests/integration/test_buffer_bounds.py",
    "tests/integration/test_bus_replica_kill.py",
})


def _xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def _xdist_controller(config: pytest.Config) -> bool:
    return (not _xdist_worker(config)
            and bool(getattr(config.option, "numprocesses", None))
            and getattr(config.option, "dist", "no") != "no")


def pytest_configure(config: pytest.Config) -> None:
    if _xdist_controller(config):
        # The controller collects nothing: it starts the builds the run's paths select, and
        # shows their progress; the workers wait on the scripts' locks (tests/envbuild.py).
        for build in envbuild.selected(config.args, config.rootpath):
            build.start()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # tryfirst, and registered before the directories' conftests: called after their own
    # reordering (tests/cluster).
    envbuild.order(items)
    if not _xdist_worker(config):
        for build in {id(b): b for i in items for b in envbuild.needed(i)}.values():
            build.start()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Two lanes for ``--dist loadgroup``: ``WAITING``'s modules, and the rest in order.

    By module path rather than by ``xdist_group`` marks: the controller sees node ids only,
    and xdist's marks-to-ids path does not take effect with pytest 9's structured node ids
    (pytest-dev/pytest-xdist#1386)."""
    if getattr(config.option, "dist", "no") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Lanes(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return "waits" if nodeid.split("::", 1)[0] in WAITING else "main"

    return Lanes(config, log)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> object:
    # Before pytest-timeout starts the test's timer: a cold build is not the test's time.
    for build in envbuild.needed(item):
        build.wait()
    return (yield)


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
