"""Lifecycle lines of ``cfnet-core --kubernetes --json-lines``: one JSON object per line on
stdout (``started``, ``leading``, ``ready``, ``synced``, ``warm``, ``following``, ``bound``,
``alert``, ``stats``, ``stopped``), for supervisors, tests and benchmarks. ``warm``: CP-SAT
imported in the background after the sync (wiring.warm_up_when_quiet), the start-up's last
tail."""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

_SAY_LOCK = threading.Lock()


def say_line(event: str, **kw: Any) -> None:
    """One JSON line on stdout. Whole lines under a lock: the leader-election thread's
    "leading" and the main thread's "started" come at the same moment, and ``print`` writes
    the text and its newline separately, so two lines could interleave into one that no
    reader parses (CI lost a "leading" so)."""
    line = json.dumps({"event": event, "t": time.time(), **kw}, default=str) + "\n"
    with _SAY_LOCK:
        sys.stdout.write(line)
        sys.stdout.flush()


def no_line(event: str, **kw: Any) -> None:
    """``say_line`` switched off."""
