"""Run Python code inside a named network namespace without leaving the test process.

``setns(2)`` switches the network namespace of the calling *thread* only, and
threads it then creates inherit it. So a function run through :func:`in_netns`
executes on a fresh thread that first joins the namespace; sockets it opens,
and threads it starts (paho's network loop), live in that namespace for good,
while the rest of the process stays where it was.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")
CLONE_NEWNET = 0x40000000
NETNS_RUN_DIR = "/run/netns"


class NetnsError(OSError):
    """Joining a network namespace failed."""


def _setns(name: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(os.path.join(NETNS_RUN_DIR, name), os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise NetnsError(err, f"setns({name}): {os.strerror(err)}")
    finally:
        os.close(fd)


def in_netns(name: str | None, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Call ``fn(*args, **kwargs)`` on a thread inside netns ``name`` (None: here)."""
    if name is None:
        return fn(*args, **kwargs)
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            _setns(name)
            box["value"] = fn(*args, **kwargs)
        except BaseException as exc:
            box["error"] = exc

    t = threading.Thread(target=run, name=f"netns-{name}", daemon=True)
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]
    value: T = box["value"]
    return value
