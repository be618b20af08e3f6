"""Stopping the child processes a test, benchmark or demo started: politely, then firmly."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterable
from typing import Any


def stop_all(procs: Iterable[subprocess.Popen[Any]], grace_s: float = 15.0) -> None:
    """SIGTERM every process still running, then wait up to ``grace_s`` for each and SIGKILL
    the ones that did not exit (terminating all first lets them shut down in parallel)."""
    running = [p for p in procs if p.poll() is None]
    for p in running:
        p.terminate()
    for p in running:
        try:
            p.wait(grace_s)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def stop_group(proc: subprocess.Popen[Any], grace_s: float = 20.0) -> None:
    """SIGTERM the process group ``proc`` leads (started with ``start_new_session``), then
    SIGKILL it if ``proc`` has not exited after ``grace_s``."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
