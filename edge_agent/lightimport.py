"""Importing paho-mqtt without the part of it the agent never runs (a memory measure).

paho-mqtt 2.x imports ``urllib.request`` at its top for one thing: looking up an
``mqtt_proxy`` environment variable, which it does only when PySocks is installed
(``socks`` importable). ``urllib.request`` brings ``http.client``, ``email``,
``tempfile``, ``shutil``, ``bz2`` and ``lzma`` along: ~2 MiB of the agent's resident
memory (issue 27), for nothing when PySocks is absent (the agent does not depend on it).

:func:`paho_imports` imports paho with a placeholder standing in for ``urllib.request``
for the length of that import, and only when PySocks is absent and nothing imported
``urllib.request`` yet; the placeholder is removed afterwards, so a later
``import urllib.request`` (anyone's) loads the real module. paho keeps a reference to
the ``urllib`` package only, and reaches ``urllib.request`` through it only on the
PySocks path, which is then never taken. With PySocks present, paho is imported as is.
The placeholder is visible to other threads only while paho's import runs, once per
process (the agent imports it on its main thread before starting any MQTT thread).
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import types
from collections.abc import Iterator

_STANDIN = "urllib.request"


@contextlib.contextmanager
def paho_imports() -> Iterator[None]:
    """Wrap the statements importing paho-mqtt in edge_agent.mqtt (see the module docstring)."""
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
