"""The actuator entry point's JSON lines stay whole when threads write at once (the
leader-election thread's "leading" and the main thread's "started" come together at start;
tests/k8s/test_leader.py reads them from the real process)."""

from __future__ import annotations

import json
import sys
import threading

import pytest

from cloud_core.k8s.lines import say_line as _say


def test_lines_from_many_threads_stay_whole(capsys: pytest.CaptureFixture[str]) -> None:
    def burst(i: int) -> None:
        for k in range(300):
            _say("bound", pod=f"ns/p-{i}-{k}" * 20, node=f"n-{i}")

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: writes interleave
    try:
        threads = [threading.Thread(target=burst, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    finally:
        sys.setswitchinterval(old)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 8 * 300
    assert {json.loads(ln)["node"] for ln in lines} == {f"n-{i}" for i in range(8)}
