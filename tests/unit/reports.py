"""Builders of valid telemetry reports (as dicts and bytes) for tests."""

from __future__ import annotations

import json
import time
from typing import Any


def report_dict(node: str = "edge-a", seq: int = 1, boot: str = "b1", **over: Any) -> dict[str, Any]:
    d: dict[str, Any] = {
        "v": 1,
        "node": node,
        "seq": seq,
        "boot": boot,
        "ts": time.time(),
        "interval_s": 1.0,
        "probe": "ebpf",
        "resources": {
            "cpu_cores": 4,
            "cpu_util": 0.25,
            "mem_total_bytes": 8 << 30,
            "mem_used_bytes": 2 << 30,
            "gpus": [],
        },
        "links": [
            {
                "peer": "10.77.2.2",
                "rtt_us": {"p50": 1200.0, "p95": 1500.0, "min": 900.0},
                "retrans": 5,
                "segs_out": 100,
                "loss": 0.05,
                "tx_bps": 20e6,
                "rx_bps": 1e5,
                "samples": 50,
            }
        ],
        "buffered": 0,
    }
    d.update(over)
    return d


def report_bytes(**kw: Any) -> bytes:
    return json.dumps(report_dict(**kw)).encode()
