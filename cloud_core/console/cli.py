"""`cfnetctl`: the operator's command line, speaking only MQTT to the core.

Every command is one MQTT 5 request/response (response topic + correlation
data) with a timeout; `events --follow` and `top` also read the live event
stream. Output is `-o table` (fits 80 columns), `json` or `yaml`. Exit codes:
0 ok, 1 the core refused or failed the command, 2 bad usage or input,
3 the broker or the core could not be reached.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from cloud_core.broker_args import add_broker_args, broker_settings
from cloud_core.console.client import ConsoleClient, ConsoleUnavailable
from cloud_core.console.map import render_map
from cloud_core.console.protocol import MAX_REQUEST_BYTES
from cloud_core.errors import CoreError
from cloud_core.view import cut, links_table, nodes_table, table
from edge_agent.wire import EVENTS_TOPIC
from edge_agent.wire.bus import Message
from edge_agent.wire.logsetup import add_version_flag
from edge_agent.wire.mqtt import MqttClient, MqttSettings

WIDTH = 80


WORKLOADS_PAGE = 100  # rows of at most ~1 KiB: a page is far under one answer's size cap


def _at_least(low: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if n < low:
            raise argparse.ArgumentTypeError(f"must be {low} or more: {n}")
        return n

    return parse


def _parser() -> argparse.ArgumentParser:
    env = os.environ.get
    p = argparse.ArgumentParser(prog="cfnetctl", description="cfnet operator console (MQTT)")
    add_version_flag(p)
    add_broker_args(p)
    p.add_argument("--user", default=env("CFNET_USER", env("USER", "operator")),
                   help="operator account (also $CFNET_USER)")
    p.add_argument("--timeout", type=float, default=float(env("CFNET_TIMEOUT", "5")),
                   help="seconds to wait for the broker and the core (default 5)")
    p.add_argument("-o", "--output", choices=("table", "json", "yaml"), default="table")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    sub.add_parser("nodes", help="nodes: health, region, load, workloads")
    lk = sub.add_parser("links", help="link matrix, or one node's peers")
    lk.add_argument("node", nargs="?")
    wl = sub.add_parser("workloads", help="workloads and their state (a page at a time)")
    wl.add_argument("--limit", type=_at_least(1), default=WORKLOADS_PAGE,
                    help=f"at most N workloads (default {WORKLOADS_PAGE}; a page always fits "
                    "one answer)")
    wl.add_argument("--offset", type=_at_least(0), default=0,
                    help="skip the first K of the listing (oldest first)")
    sub.add_parser("placements", help="which workloads run where")
    ex = sub.add_parser("explain", help="why a workload runs where it does (or nowhere)")
    ex.add_argument("workload")
    sm = sub.add_parser("submit", help="submit workloads from a YAML file (- for stdin)")
    sm.add_argument("-f", "--file", required=True)
    wi = sub.add_parser("what-if", help="where workloads would go, without acting")
    wi.add_argument("-f", "--file", required=True)
    de = sub.add_parser("delete", help="delete a workload")
    de.add_argument("workload")
    for name, hlp in (("cordon", "stop placing on a node"),
                      ("uncordon", "allow placing on a node again"),
                      ("drain", "cordon a node and move its workloads away")):
        c = sub.add_parser(name, help=hlp)
        c.add_argument("node")
    ev = sub.add_parser("events", help="recent events; --follow streams them")
    ev.add_argument("--follow", "-f", action="store_true")
    ev.add_argument("--limit", type=int, default=30)
    ev.add_argument("--for", dest="follow_for", type=float, default=0.0,
                    help="with --follow: stop after N seconds (0: until Ctrl-C)")
    tp = sub.add_parser("top", help="live full-screen view of nodes, links and alerts")
    tp.add_argument("--interval", type=float, default=2.0)
    tp.add_argument("--iterations", type=int, default=0, help="stop after N refreshes (0: never)")
    mp = sub.add_parser("map", help="write a self-contained HTML/SVG topology page")
    mp.add_argument("--out", "-O", type=Path, default=Path("cfnet-map.html"))
    sub.add_parser("stats", help="ingest counters")
    rc = sub.add_parser("received", help="a node's reports the core folded in, per boot")
    rc.add_argument("node")
    au = sub.add_parser("audit", help="the audit log (admin)")
    au.add_argument("--limit", type=int, default=50)
    return p


# ---------------------------------------------------------------------- rendering


def render_workloads(data: list[dict[str, Any]] | dict[str, Any]) -> str:
    """One page of workloads; with the core's total (``{"items", "total", "offset"}``), a
    last line says when the list was cut ("showing 101-200 of 2,345"). A bare list (a
    core without paging totals) is the whole listing."""
    page: dict[str, Any] = (data if isinstance(data, dict)
                            else {"items": data, "total": len(data), "offset": 0})
    items: list[dict[str, Any]] = page.get("items") or []
    total, offset = int(page.get("total", 0)), int(page.get("offset", 0))
    rows = [(cut(f"{w['namespace']}/{w['name']}", 24), w["state"], cut(w["node"], 14),
             cut(w["reason"], 30)) for w in items]
    out = table(rows, ("WORKLOAD", "STATE", "NODE", "REASON"))
    if not items and total:
        out += f"\n(none from {offset + 1:,}: there are {total:,}; use a smaller --offset)"
    elif len(items) < total:
        out += (f"\nshowing {offset + 1:,}-{offset + len(items):,} of {total:,} "
                f"(--offset/--limit for more)")
    return out


def render_events(data: list[dict[str, Any]]) -> str:
    return "\n".join(render_event(e) for e in data) or "(no events)"


def render_event(e: dict[str, Any]) -> str:
    ts = time.strftime("%H:%M:%S", time.localtime(e.get("ts", 0)))
    sev = {"critical": "CRIT", "warning": "WARN"}.get(e.get("severity", ""), "info")
    return cut(f"{ts} {sev:4} {e.get('kind', ''):9} {e.get('message', '')}", WIDTH)


def render_explain(d: dict[str, Any]) -> str:
    """The engine's explanation (cloud_core.placement.explain.Explanation) for people:
    chosen node and runner-up with their cost terms side by side, or, where
    nothing fits, how many nodes each filter ruled out, with examples."""
    raw = d.get("explanation")
    ex: dict[str, Any] = raw if isinstance(raw, dict) else {}
    lines = [f"workload  {d.get('workload')}", f"state     {d.get('state')}",
             f"node      {d.get('node') or '-'}"]
    if d.get("reason"):
        lines.append(f"reason    {d['reason']}")
    if ex.get("summary") and ex["summary"] != d.get("reason"):
        lines.append(f"fit       {ex['summary']}")
    node, runner = ex.get("node"), ex.get("runner_up")
    if node and ex.get("node_reasons"):
        lines.append(f"          {node} no longer fits: {'; '.join(ex['node_reasons'])}")
    mine, theirs = ex.get("breakdown") or {}, ex.get("runner_up_breakdown") or {}
    if node and runner:
        lines.append(f"runner-up {runner} ({_signed(sum(theirs.values()) - sum(mine.values()))}"
                     " $/h against the chosen node)")
        rows = [(k, f"{mine.get(k, 0.0):.5f}", f"{theirs.get(k, 0.0):.5f}",
                 _signed(theirs.get(k, 0.0) - mine.get(k, 0.0)))
                for k in sorted(set(mine) | set(theirs)) if mine.get(k) or theirs.get(k)]
        rows.append(("total", f"{sum(mine.values()):.5f}", f"{sum(theirs.values()):.5f}",
                     _signed(sum(theirs.values()) - sum(mine.values()))))
        lines.append(table(rows, ("COST $/h", cut(node, 14), cut(runner, 14), "DIFFERENCE")))
    elif node and mine:
        lines.append("runner-up none: no other node fits")
        lines.append(table([(k, f"{v:.5f}") for k, v in sorted(mine.items()) if v] +
                           [("total", f"{sum(mine.values()):.5f}")], ("COST $/h", cut(node, 14))))
    counts = ex.get("counts") or {}
    if counts:
        examples: dict[str, list[str]] = {}
        for name, why in ex.get("examples") or []:
            examples.setdefault(why, []).append(name)
        why_rows = [(cut(r, 34), str(n), cut(", ".join(examples.get(r, [])), 30))
                    for r, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
        lines.append(table(why_rows, ("RULED OUT BY (first failing filter)", "NODES", "E.G.")))
    if ex.get("best") and not node:
        lines.append("cheapest fitting: " + ", ".join(f"{n} {c:.5f} $/h" for n, c in ex["best"]))
    batch = d.get("batch")
    if isinstance(batch, dict) and batch.get("text"):
        wrapped = textwrap.wrap(str(batch["text"]), WIDTH - 10, subsequent_indent="  ")
        lines.append(f"batch     {wrapped[0]}")
        lines.extend(f"{'':9} {more}" for more in wrapped[1:])
    if d.get("link"):
        lines.append(f"link      {d['link']}")
    lines.extend(render_conflict(d.get("conflict")))
    return "\n".join(lines)


def render_conflict(raw: Any) -> list[str]:
    """The minimal conflict of a pod that fits no node (``relax.Diagnosis.doc``) and the
    changes that would make it fit, each with the node it opens (wrapped to the width)."""
    c: dict[str, Any] = raw if isinstance(raw, dict) else {}
    if not c or c.get("fits"):
        return []
    if c.get("alone"):
        rows = [("conflict", "each fails on every node alone: " + "; ".join(c["alone"]))]
    elif c.get("conflict"):
        rows = [("conflict", "no node meets these together (drop any one and one does): "
                 + " + ".join(c["conflict"]))]
    else:
        rows = [("conflict", str(c.get("summary", "")))]
    rows += [("would fit" if i == 0 else "", str(s))
             for i, s in enumerate(c.get("suggestions") or [])]
    rows += [("no change", str(s)) for s in c.get("dead_ends") or []]
    out: list[str] = []
    for label, text in rows:
        wrapped = textwrap.wrap(text, WIDTH - 10, subsequent_indent="  ") or [""]
        out.append(f"{label:9} {wrapped[0]}")
        out.extend(f"{'':9} {more}" for more in wrapped[1:])
    return out


def render_received(d: dict[str, Any]) -> str:
    """The core's ``received`` answer: per boot of the node, how many reports it folded
    in, how many distinct seqs (fewer: a report folded in twice), how many seqs are
    missing between the first and the last, and the seq ranges themselves."""
    boots = d.get("boots") or []
    rows = []
    for b in boots:
        ranges = [(int(lo), int(hi)) for lo, hi in b.get("seqs") or []]
        span = ranges[-1][1] - ranges[0][0] + 1 if ranges else 0
        missing = span - sum(hi - lo + 1 for lo, hi in ranges)
        seqs = ", ".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in ranges)
        rows.append((cut(b.get("boot"), 16), b.get("count", 0), b.get("distinct", 0), missing,
                     cut(seqs or "-", 30)))
    total = sum(int(b.get("count", 0)) for b in boots)
    limit = d.get("history_limit")
    head = (f"node {d.get('node')}: {total:,} report{'s' * (total != 1)} folded in from "
            f"{len(boots)} boot{'s' * (len(boots) != 1)} "
            + (f"(the last {limit:,} the core keeps)" if isinstance(limit, int) and total >= limit
               else "since this core started"))
    if not rows:
        return head
    return head + "\n" + table(rows, ("BOOT", "REPORTS", "DISTINCT", "MISSING", "SEQS"))


def _signed(v: float) -> str:
    return f"{v:+.5f}"


def render_decisions(d: dict[str, Any]) -> str:
    rows = [(cut(x["workload_uid"], 26), cut(x.get("node"), 14), cut(x.get("runner_up"), 12),
             cut(x.get("summary"), 24)) for x in d["decisions"]]
    return table(rows, ("WORKLOAD", "WOULD GO TO", "RUNNER-UP", "WHY")) + \
        "\n(what-if: nothing was changed)"


def render(cmd: str, data: Any) -> str:
    if cmd == "nodes":
        return nodes_table(data)
    if cmd == "links":
        return links_table(data)
    if cmd == "workloads":
        return render_workloads(data)
    if cmd == "placements":
        prow = [(n, len(u), cut(", ".join(u), 55)) for n, u in sorted(data.items())]
        return table(prow, ("NODE", "N", "WORKLOADS"))
    if cmd == "explain":
        return render_explain(data)
    if cmd == "received":
        return render_received(data)
    if cmd == "what-if":
        return render_decisions(data)
    if cmd == "events":
        return render_events(data)
    if cmd in ("submit",):
        return table([(cut(r["uid"], 40), r["result"]) for r in data], ("WORKLOAD", "RESULT"))
    if cmd in ("cordon", "uncordon"):
        return f"node {data['node']} {'cordoned' if data['cordoned'] else 'uncordoned'}" + \
            ("" if data.get("changed") else " (already)")
    if cmd == "drain":
        return f"node {data['node']} cordoned; {len(data['requeued'])} workloads moving away"
    if cmd == "delete":
        return f"deleted {data['uid']}" + (f" (was on {data['was_on']})" if data["was_on"] else "")
    if cmd == "audit":
        rows = [(time.strftime("%m-%d %H:%M:%S", time.localtime(a["ts"])), cut(a["operator"], 10),
                 cut(a["cmd"], 10), cut(a["result"], 40)) for a in data]
        return table(rows, ("WHEN", "WHO", "WHAT", "RESULT"))
    return json.dumps(data, indent=2)


def emit(fmt: str, cmd: str, data: Any) -> str:
    if fmt == "json":
        return json.dumps(data, indent=2)
    if fmt == "yaml":
        return yaml.safe_dump(data, sort_keys=False).rstrip()
    return render(cmd, data)


# ---------------------------------------------------------------------- commands

MAX_FILE_BYTES = MAX_REQUEST_BYTES  # a bigger file could never be sent


class _NoAliasLoader(yaml.SafeLoader):
    """SafeLoader that refuses aliases (``*name``): a few lines of anchors and aliases
    ("billion laughs") expand to gigabytes; workload files never need them."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            ev = self.peek_event()  # type: ignore[no-untyped-call]  # PyYAML: no hints
            raise yaml.YAMLError(f"aliases (*{ev.anchor}) are not accepted{ev.start_mark}")
        return super().compose_node(parent, index)


def _finite_problem(o: Any) -> str | None:
    stack = [o]
    while stack:
        x = stack.pop()
        if isinstance(x, float) and not math.isfinite(x):
            return f"a number that is not finite ({x}: .nan, .inf, or too large such as 1e400)"
        if isinstance(x, dict):
            stack.extend(x.values())
        elif isinstance(x, list):
            stack.extend(x)
    return None


def read_docs(path: str) -> list[dict[str, Any]]:
    """Workload documents from a YAML file, bounded before parsing (size) and refused
    locally when unsafe (aliases), not representable (NaN, infinities) or too large to
    send in one request, each with a message that says so."""
    try:
        if path == "-":
            text = sys.stdin.read(MAX_FILE_BYTES + 1)
        else:
            with open(path, encoding="utf-8") as f:
                text = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path} is not UTF-8 text") from exc
    if len(text) > MAX_FILE_BYTES:
        raise ValueError(f"{path} is larger than {MAX_FILE_BYTES} bytes, the most one "
                         "request can carry; split it into several files")
    try:
        docs = [d for d in yaml.load_all(text, Loader=_NoAliasLoader) if d is not None]
    except (yaml.YAMLError, ValueError, RecursionError) as exc:
        raise ValueError(f"{path} is not valid YAML: {str(exc)[:300]}") from exc
    if not docs or not all(isinstance(d, dict) for d in docs):
        raise ValueError(f"{path}: expected one or more YAML mappings (workloads)")
    for i, d in enumerate(docs):
        if why := _finite_problem(d):
            raise ValueError(f"{path}: document {i + 1} has {why}")
    try:
        size = len(json.dumps({"cmd": "submit", "args": {"specs": docs}}, default=str))
    except ValueError as exc:  # an integer of thousands of digits
        raise ValueError(f"{path}: {exc}") from exc
    if size > MAX_REQUEST_BYTES:
        raise ValueError(f"{path}: the workloads encode to {size} bytes, more than the "
                         f"{MAX_REQUEST_BYTES} one request may carry; split the file")
    return docs


def printable(text: str) -> str:
    """``text`` with every control or format character but newline shown as '?': names,
    reasons and messages come from other people and must not drive the terminal."""
    return "".join(c if c == "\n" or c.isprintable() else "?" for c in text)


def follow_events(settings: MqttSettings, limit_s: float, out: Any) -> int:
    stop = threading.Event()

    def on_msg(m: Message) -> None:
        try:
            out.write(printable(render_event(json.loads(m.payload))) + "\n")
            out.flush()
        except (ValueError, TypeError):
            pass

    c = MqttClient(settings, on_message=on_msg)
    c.subscribe(EVENTS_TOPIC, qos=1)
    c.start()
    if not c.wait_connected(settings.keepalive_s + 5):
        raise ConsoleUnavailable(f"cannot reach broker {settings.host}:{settings.port}")
    with contextlib.suppress(KeyboardInterrupt):
        stop.wait(limit_s if limit_s > 0 else None)
    c.stop()
    return 0


def top(client: ConsoleClient, interval: float, iterations: int, timeout: float) -> int:
    n = 0
    try:
        while iterations <= 0 or n < iterations:
            nodes = client.call("nodes", timeout_s=timeout).data or []
            links = client.call("links", timeout_s=timeout).data or []
            evs = client.call("events", {"limit": 8}, timeout_s=timeout).data or []
            worst = sorted(links, key=lambda r: -(r["rtt_p95_us"] or 0))[:8]
            alerts = [e for e in evs if e.get("severity") in ("warning", "critical")]
            screen = "\n\n".join([
                time.strftime("cfnet top — %H:%M:%S") + f"   nodes {len(nodes)}  "
                f"links {len(links)}   (Ctrl-C to quit)",
                nodes_table(nodes),
                "SLOWEST LINKS\n" + links_table(worst),
                "ALERTS\n" + (render_events(alerts) if alerts else "(none)"),
            ])
            if sys.stdout.isatty():
                sys.stdout.write("\033[2J\033[H")
            print(printable(screen), flush=True)
            n += 1
            if iterations <= 0 or n < iterations:
                time.sleep(interval)
    except KeyboardInterrupt:
        pass
    return 0


def main(argv: list[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    try:
        settings = broker_settings(a, a.user, client_id="", clean_start=True,
                                   session_expiry_s=0, keepalive_s=max(5, int(a.timeout)))
    except CoreError as exc:
        print(f"cfnetctl: {exc}", file=sys.stderr)
        return 2
    args: dict[str, Any] = {}
    try:
        if a.cmd in ("submit", "what-if"):
            args["specs"] = read_docs(a.file)
        if a.cmd in ("explain", "delete"):
            args["workload"] = a.workload
        if a.cmd in ("cordon", "uncordon", "drain", "received") or (a.cmd == "links"
                                                                   and a.node):
            args["node"] = a.node
        if a.cmd in ("events", "audit"):
            args["limit"] = a.limit
        if a.cmd == "workloads":
            args.update(offset=a.offset, limit=a.limit, total=True)
    except ValueError as exc:
        print(f"cfnetctl: {exc}", file=sys.stderr)
        return 2
    try:
        if a.cmd == "events" and a.follow:
            return follow_events(settings, a.follow_for, sys.stdout)
        with ConsoleClient(settings, a.user, timeout_s=a.timeout) as c:
            if a.cmd == "top":
                return top(c, a.interval, a.iterations, a.timeout)
            cmd = "topology" if a.cmd == "map" else a.cmd
            resp = c.call(cmd, args, timeout_s=a.timeout)
    except ConsoleUnavailable as exc:
        print(f"cfnetctl: {exc}", file=sys.stderr)
        return 3
    if not resp.ok:
        print(printable(f"cfnetctl: {resp.error}"), file=sys.stderr)
        return 1
    if a.cmd == "map":
        a.out.write_text(render_map(resp.data))
        print(f"wrote {a.out} ({len(resp.data['nodes'])} nodes, {len(resp.data['links'])} links)")
        return 0
    print(printable(emit(a.output, a.cmd, resp.data)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
