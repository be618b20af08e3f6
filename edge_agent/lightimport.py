"""Importing paho-mqtt and msgspec without the parts of them the agent never runs, and
dropping what only its start-up needs (memory).

Each module the long-lived agent imports stays resident for its life. Two of
its libraries import, at their top, something only other users of theirs need:

**paho-mqtt** 2.x imports ``urllib.request`` at its top for one thing: looking up an
``mqtt_proxy`` environment variable, which it does only when PySocks is installed
(``socks`` importable). ``urllib.request`` brings ``http.client``, ``email``,
``tempfile``, ``shutil``, ``bz2`` and ``lzma`` along: ~2 MiB of the agent's resident
memory, for nothing when PySocks is absent (the agent does not depend on it).

:func:`paho_imports` imports paho with a placeholder standing in for ``urllib.request``
for the length of that import, and only when PySocks is absent and nothing imported
``urllib.request`` yet; the placeholder is removed afterwards, so a later
``import urllib.request`` (anyone's) loads the real module. paho keeps a reference to
the ``urllib`` package only, and reaches ``urllib.request`` through it only on the
PySocks path, which is then never taken. With PySocks present, paho is imported as is.
The placeholder is visible to other threads only while paho's import runs, once per
process (the agent imports it on its main thread before starting any MQTT thread).

**msgspec** imports ``typing_extensions`` when it is installed, for two things: its
``get_type_hints`` and its ``Required``/``NotRequired``, so that types written with
``typing_extensions`` are understood. The agent's types use ``typing`` only, and on the
Python the agent runs (3.11+) msgspec's fallbacks are ``typing``'s own functions and
markers. But ``typing_extensions`` (with ``inspect``, ``ast``, ``dis`` and ``tokenize``,
which it imports) costs the agent ~1.1 MiB of RSS. It is not a dependency of the agent
(an image or ``pip install cfnet[agent]`` lacks it), and it is installed beside it wherever
something else needs it (a development virtualenv: mypy, pydantic; many distributions).
:func:`msgspec_imports` imports msgspec with ``typing_extensions`` made unimportable for
the length of that import (``None`` in ``sys.modules``, so msgspec's ``try`` takes its
fallback), and only when neither is imported yet; the entry is removed afterwards, so a
later ``import typing_extensions`` (anyone's) loads the real module.

**dataclasses** imports ``inspect`` at its top for one thing: a dataclass written without
a docstring is given one built from ``inspect.signature``. ``inspect`` brings ``ast``,
``dis`` and ``opcode``: ~0.7 MiB of the agent's resident memory, for nothing when every
dataclass has its docstring (the agent's all do; tests/unit/test_agent_imports.py keeps it
so). :func:`dataclasses_imports`, called by ``edge_agent/__init__.py`` (so before any of the
package's dataclasses), imports ``dataclasses`` with a :class:`Deferred` stand-in for
``inspect``, which imports the real module on its first attribute read and reads it there:
a dataclass without a docstring still gets its signature, at the cost of the import. The
stand-in leaves ``sys.modules`` right after, so a later ``import inspect`` (anyone's) loads
the real module. Nothing happens when ``dataclasses`` or ``inspect`` is imported already
(a test run, the core).

**argparse** (with ``gettext``) parses the command line once and is needed by nothing
after it; :func:`forget` drops such modules once the configuration is read, before the
heavier imports, which then reuse their memory (~0.35 MiB of the agent's RSS). Only
modules nothing else holds are named (``edge_agent.config.PARSE_ONLY_MODULES``; the
agent's modules import argparse inside the functions that use it); a later import of one
loads it again.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import importlib.util
import sys
import types
from collections.abc import Iterator
from typing import Any

_STANDIN = "urllib.request"
_HIDDEN = "typing_extensions"


@contextlib.contextmanager
def paho_imports() -> Iterator[None]:
    """Wrap the statements importing paho-mqtt in edge_agent.wire.mqtt (see the module
    docstring)."""
    if _STANDIN in sys.modules or "paho.mqtt.client" in sys.modules \
            or importlib.util.find_spec("socks") is not None:
        yield
        return
    import urllib

    standin = types.ModuleType(_STANDIN, "placeholder while paho-mqtt is imported "
                                         "(edge_agent.lightimport)")
    sys.modules[_STANDIN] = standin
    try:
        yield
    finally:
        if sys.modules.get(_STANDIN) is standin:
            del sys.modules[_STANDIN]
        if getattr(urllib, "request", None) is standin:
            delattr(urllib, "request")


@contextlib.contextmanager
def msgspec_imports() -> Iterator[None]:
    """Wrap the statements importing msgspec in edge_agent.config (see the module docstring)."""
    if _HIDDEN in sys.modules or "msgspec" in sys.modules:
        yield
        return
    sys.modules[_HIDDEN] = None  # type: ignore[assignment]  # import raises ImportError
    try:
        yield
    finally:
        if _HIDDEN in sys.modules and sys.modules[_HIDDEN] is None:
            del sys.modules[_HIDDEN]


class Deferred(types.ModuleType):
    """Stands in for the module of its name in one importer's namespace: the first read of
    an attribute imports the real module (and drops the stand-in from ``sys.modules`` if it
    is still there) and reads the attribute from it."""

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):  # the import system's and copy's probes: not the module's
            raise AttributeError(attr)
        if sys.modules.get(self.__name__) is self:
            del sys.modules[self.__name__]
        return getattr(importlib.import_module(self.__name__), attr)


def dataclasses_imports() -> None:
    """Import ``dataclasses`` with ``inspect`` deferred (see the module docstring)."""
    if "dataclasses" in sys.modules or "inspect" in sys.modules:
        return
    standin = Deferred("inspect", "deferred until used (edge_agent.lightimport)")
    sys.modules["inspect"] = standin
    try:
        import dataclasses  # noqa: F401 - the import is the point
    finally:
        if sys.modules.get("inspect") is standin:
            del sys.modules["inspect"]


def forget(names: tuple[str, ...]) -> list[str]:
    """Drop the modules ``names`` from ``sys.modules``, in order, and free them (a full
    collection: a module's functions and its dictionary refer to each other). Returns
    those dropped. A module something else holds (another module imported it: say the
    agent's ``main`` called inside a process that uses argparse itself) is kept, and so
    are the ones after it, which it may hold: dropped, it would stay alive and the next
    import would make a second copy."""
    dropped: list[str] = []
    for name in names:
        mod = sys.modules.get(name)
        if mod is None:
            continue
        if sys.getrefcount(mod) > 3:  # sys.modules, ``mod`` and getrefcount's argument
            break
        del sys.modules[name]
        dropped.append(name)
    mod = None
    if dropped:
        gc.collect()
    return dropped
