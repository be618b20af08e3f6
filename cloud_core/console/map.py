"""`cfnetctl map`: one self-contained HTML page with an SVG picture of the topology.

Nodes are drawn in columns by region, links as lines coloured by p95 latency
(green < 5 ms, amber < 50 ms, red beyond) and dashed when loss exceeds 1 %,
with each node's workloads listed under it. Everything is inline — no fonts,
scripts or styles from the network — so the page works offline and can be
attached to an incident ticket. A few lines of inline script only record what
the browser actually laid out (``data-drawn`` on ``<body>``), which the tests
read back from headless Chromium.
"""

from __future__ import annotations

import html
import json
import time
from typing import Any

COL_W = 230
ROW_H = 150
TOP = 70
NODE_R = 22

HEALTH_FILL = {
    "online": "#2e7d32", "suspect": "#f9a825", "unreachable": "#ef6c00",
    "down": "#c62828", "unknown": "#757575",
}


def latency_colour(rtt_p95_us: float | None) -> str:
    if rtt_p95_us is None:
        return "#9e9e9e"
    if rtt_p95_us < 5_000:
        return "#43a047"
    if rtt_p95_us < 50_000:
        return "#fb8c00"
    return "#e53935"


def _layout(nodes: list[dict[str, Any]]) -> dict[str, tuple[float, float]]:
    regions: dict[str, list[str]] = {}
    for n in nodes:
        regions.setdefault(str(n.get("region") or "unregistered"), []).append(n["node"])
    pos: dict[str, tuple[float, float]] = {}
    for col, region in enumerate(sorted(regions)):
        for row, name in enumerate(sorted(regions[region])):
            pos[name] = (COL_W * col + COL_W / 2, TOP + ROW_H * row + NODE_R)
    return pos


def _pairs(links: list[dict[str, Any]], pos: dict[str, tuple[float, float]]
           ) -> dict[tuple[str, str], dict[str, Any]]:
    """Each undirected pair of drawn nodes once, with the worse of its two directions."""
    pairs: dict[tuple[str, str], dict[str, Any]] = {}
    for lk in links:
        if lk["src"] not in pos or lk["dst"] not in pos:
            continue
        key = (min(lk["src"], lk["dst"]), max(lk["src"], lk["dst"]))
        old = pairs.get(key)
        if old is None or (lk.get("rtt_p95_us") or 0) > (old.get("rtt_p95_us") or 0):
            pairs[key] = lk
    return pairs


def _link_svg(a: str, b: str, lk: dict[str, Any], pos: dict[str, tuple[float, float]]) -> str:
    e = html.escape
    (x1, y1), (x2, y2) = pos[a], pos[b]
    colour = latency_colour(lk.get("rtt_p95_us"))
    dash = ' stroke-dasharray="6 4"' if (lk.get("loss") or 0) > 0.01 else ""
    rtt = lk.get("rtt_p95_us")
    label = f"{a} ↔ {b}: p95 {rtt / 1000:.1f} ms" if rtt is not None else f"{a} ↔ {b}"
    label += f", loss {(lk.get('loss') or 0) * 100:.1f}%"
    return (
        f'<line class="link" data-link="{e(a)}|{e(b)}" data-colour="{colour}" '
        f'x1="{x1}" y1="{y1}" x2="{x2}" y2="{y2}" stroke="{colour}" stroke-width="3"{dash}>'
        f"<title>{e(label)}</title></line>"
    )


def _node_svg(n: dict[str, Any], pos: dict[str, tuple[float, float]],
              placed: list[str]) -> list[str]:
    """One node's circle and name, and up to six of its workloads under it."""
    e = html.escape
    name = n["node"]
    x, y = pos[name]
    fill = HEALTH_FILL.get(str(n.get("health")), "#757575")
    ring = ' stroke="#000" stroke-width="3" stroke-dasharray="3 3"' if n.get("cordoned") else ""
    parts = [
        f'<g class="node" data-node="{e(name)}" data-health="{e(str(n.get("health")))}">'
        f'<circle cx="{x}" cy="{y}" r="{NODE_R}" fill="{fill}"{ring}>'
        f"<title>{e(name)} — {e(str(n.get('health')))}, security "
        f"{e(str(n.get('security_level', '-')))}</title></circle>"
        f'<text x="{x}" y="{y + NODE_R + 16}" text-anchor="middle">{e(name)}</text>'
    ]
    for i, uid in enumerate(sorted(placed)[:6]):
        parts.append(f'<text class="workload" data-workload="{e(uid)}" x="{x}" '
                     f'y="{y + NODE_R + 32 + 13 * i}" text-anchor="middle">▪ {e(uid)}</text>')
    more = len(placed) - 6
    if more > 0:
        parts.append(f'<text class="workload-more" x="{x}" y="{y + NODE_R + 32 + 13 * 6}" '
                     f'text-anchor="middle">+{more} more</text>')
    parts.append("</g>")
    return parts


LEGEND = (
    '<p class="legend"><b>links</b> (p95 RTT): <span style="color:#43a047">■ &lt; 5 ms</span> '
    '<span style="color:#fb8c00">■ &lt; 50 ms</span> <span style="color:#e53935">■ ≥ 50 ms'
    '</span> · dashed: loss &gt; 1 % · <b>nodes</b>: '
    + " ".join(f'<span style="color:{c}">● {h}</span>' for h, c in HEALTH_FILL.items())
    + "</p>"
)


def render_map(topo: dict[str, Any]) -> str:
    nodes: list[dict[str, Any]] = list(topo.get("nodes") or [])
    links: list[dict[str, Any]] = list(topo.get("links") or [])
    placements: dict[str, list[str]] = dict(topo.get("placements") or {})
    pos = _layout(nodes)
    regions = sorted({str(n.get("region") or "unregistered") for n in nodes})
    rows = max([sum(1 for n in nodes if (n.get("region") or "unregistered") == r)
                for r in regions] or [1])
    width = max(COL_W * max(len(regions), 1), 400)
    height = TOP + ROW_H * rows + 40
    e = html.escape
    parts: list[str] = []
    for col, region in enumerate(regions):
        parts.append(f'<text class="region" x="{COL_W * col + COL_W / 2}" y="30" '
                     f'text-anchor="middle">{e(region)}</text>')
    pairs = _pairs(links, pos)
    parts += [_link_svg(a, b, lk, pos) for (a, b), lk in sorted(pairs.items())]
    for n in nodes:
        parts += _node_svg(n, pos, placements.get(n["node"], []))
    generated = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(topo.get("generated", 0)))
    summary = {"nodes": len(nodes), "links": len(pairs),
               "workloads": sum(len(v) for v in placements.values())}
    return _page(generated, summary, width, height, parts)


def _page(generated: str, summary: dict[str, int], width: int, height: int,
          parts: list[str]) -> str:
    """The whole page around the SVG's ``parts`` (inline style and the layout recorder)."""
    e = html.escape
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>cfnet topology</title>
<style>
body {{ font: 13px sans-serif; margin: 16px; color: #222; }}
svg text {{ font: 12px sans-serif; fill: #222; }}
svg text.region {{ font-weight: bold; font-size: 15px; }}
svg text.workload {{ font-size: 10px; fill: #37474f; }}
.legend span {{ margin-right: 8px; }}
</style></head>
<body data-summary='{e(json.dumps(summary))}'>
<h1 style="font-size:18px">cfnet topology — {e(generated)}</h1>
{LEGEND}
<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}"
     viewBox="0 0 {width} {height}" role="img" aria-label="cfnet topology">
{chr(10).join(parts)}
</svg>
<script>
// Record what was laid out, for automated checks; the page needs no script to display.
(function () {{
  var svg = document.querySelector("svg"), r = svg.getBoundingClientRect();
  var inside = 0, nodes = document.querySelectorAll("g.node circle");
  nodes.forEach(function (c) {{
    var b = c.getBoundingClientRect();
    if (b.width > 0 && b.left >= r.left && b.right <= r.right + 1 && b.bottom <= r.bottom + 1)
      inside++;
  }});
  var colours = {{}};
  document.querySelectorAll("line.link").forEach(function (l) {{
    var c = getComputedStyle(l).stroke; colours[c] = (colours[c] || 0) + 1;
  }});
  document.body.setAttribute("data-drawn", JSON.stringify({{
    nodes: nodes.length, nodes_inside: inside,
    links: document.querySelectorAll("line.link").length,
    workloads: document.querySelectorAll("text.workload").length,
    link_colours: colours, width: r.width, height: r.height
  }}));
}})();
</script>
</body></html>
"""
