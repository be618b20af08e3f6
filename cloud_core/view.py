"""Plain-text rendering of nodes and links for terminals (the core's log and cfnetctl).

Tables fit 80 columns; units are chosen per value (µs/ms, kb/s/Mb/s) so a
tired operator reads them without arithmetic. Rows are built as plain dicts
first so the same data serves ``-o json``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cloud_core.health import HealthConfig, node_health
from cloud_core.state import StateSnapshot


def fmt_us(us: float | None) -> str:
    if us is None:
        return "-"
    if us < 1000:
        return f"{us:.0f}µs"
    if us < 100_000:
        return f"{us / 1000:.1f}ms"
    return f"{us / 1000:.0f}ms"


def fmt_bps(bps: float | None) -> str:
    if bps is None or bps <= 0:
        return "-"
    for unit, div in (("Gb/s", 1e9), ("Mb/s", 1e6), ("kb/s", 1e3)):
        if bps >= div:
            return f"{bps / div:.1f}{unit}"
    return f"{bps:.0f}b/s"


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, div in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{n / div:.1f}{unit}"
    return f"{n:.0f}B"


def fmt_age(s: float) -> str:
    if s == float("inf"):
        return "never"
    if s < 60:
        return f"{s:.0f}s"
    if s < 3600:
        return f"{s / 60:.0f}m"
    return f"{s / 3600:.1f}h"


def table(rows: Sequence[Sequence[Any]], header: Sequence[str]) -> str:
    cells = [[str(c) for c in header]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines)


def node_rows(snap: StateSnapshot, cfg: HealthConfig = HealthConfig()) -> list[dict[str, Any]]:
    out = []
    for name in sorted(snap.nodes):
        v = snap.nodes[name]
        r = v.resources
        out.append(
            {
                "node": name,
                "health": str(node_health(snap, name, cfg)),
                "probe": v.probe or "-",
                "cpu_util": r.cpu_util if r else None,
                "cpu_cores": r.cpu_cores if r else None,
                "mem_used_bytes": r.mem_used_bytes if r else None,
                "mem_total_bytes": r.mem_total_bytes if r else None,
                "gpus": len(r.gpus) if r else 0,
                "age_s": snap.node_age(name),
                "reports": v.reports,
                "buffered": v.buffered,
                "dropped": v.dropped,
                "addresses": list(v.addresses),
            }
        )
    return out


def render_nodes(snap: StateSnapshot, cfg: HealthConfig = HealthConfig()) -> str:
    rows = [
        (
            r["node"], r["health"], r["probe"],
            f"{r['cpu_util'] * 100:.0f}%/{r['cpu_cores']}" if r["cpu_util"] is not None else "-",
            f"{fmt_bytes(r['mem_used_bytes'])}/{fmt_bytes(r['mem_total_bytes'])}",
            r["gpus"], fmt_age(r["age_s"]), r["reports"], r["buffered"],
        )
        for r in node_rows(snap, cfg)
    ]
    return table(rows, ("NODE", "HEALTH", "PROBE", "CPU", "MEMORY", "GPU", "AGE", "REPORTS", "BUF"))


def link_rows(snap: StateSnapshot, node: str | None = None) -> list[dict[str, Any]]:
    out = []
    for (src, dst), lk in sorted(snap.links.items()):
        if node is not None and node not in (src, dst):
            continue
        out.append(
            {
                "src": src, "dst": dst, "peer_addr": lk.peer_addr,
                "rtt_p50_us": lk.rtt_p50_us, "rtt_p95_us": lk.rtt_p95_us,
                "loss": lk.loss, "tx_bps": lk.tx_bps, "rx_bps": lk.rx_bps,
                "age_s": snap.now - lk.updated, "probe": lk.probe,
            }
        )
    return out


def render_links(snap: StateSnapshot, node: str | None = None) -> str:
    rows = [
        (
            r["src"], r["dst"], fmt_us(r["rtt_p50_us"]), fmt_us(r["rtt_p95_us"]),
            f"{r['loss'] * 100:.1f}%", fmt_bps(r["tx_bps"]), fmt_bps(r["rx_bps"]),
            fmt_age(r["age_s"]),
        )
        for r in link_rows(snap, node)
    ]
    return table(rows, ("FROM", "TO", "RTT p50", "p95", "LOSS", "TX", "RX", "AGE"))
