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
    return nodes_table(node_rows(snap, cfg))


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
    return links_table(link_rows(snap, node))


def cut(s: Any, n: int) -> str:
    """``s`` in at most ``n`` characters ('-' for None), an ellipsis marking a cut."""
    t = "-" if s is None else str(s)
    return t if len(t) <= n else t[: n - 1] + "…"


def nodes_table(data: list[dict[str, Any]]) -> str:
    """Node rows (``node_rows`` or the console's richer ones) as an 80-column table."""
    rows = [
        (cut(r["node"], 16), r["health"] + ("/cordon" if r.get("cordoned") else ""),
         cut(r.get("region"), 8), r.get("security_level", "-"),
         f"{(r['cpu_util'] or 0) * 100:.0f}%" if r.get("cpu_util") is not None else "-",
         fmt_bytes(r.get("mem_used_bytes")), r.get("workloads", 0),
         fmt_age(r["age_s"]) if r.get("age_s") is not None else "never",
         r.get("probe", "-"))
        for r in data
    ]
    return table(rows, ("NODE", "HEALTH", "REGION", "SEC", "CPU", "MEM", "WL", "SEEN", "PROBE"))


def links_table(data: list[dict[str, Any]]) -> str:
    rows = [
        (cut(r["src"], 14), cut(r["dst"], 14), fmt_us(r["rtt_p50_us"]),
         fmt_us(r["rtt_p95_us"]), f"{r['loss'] * 100:.1f}%", fmt_bps(r["tx_bps"]),
         fmt_age(r["age_s"]))
        for r in data
    ]
    return table(rows, ("FROM", "TO", "RTT p50", "p95", "LOSS", "TX", "AGE"))
