"""`cfnetctl`: the operator's command line, speaking only MQTT to the core."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from cloud_core.console.client import ConsoleClient, ConsoleUnavailable
from cloud_core.view import fmt_age, fmt_bps, fmt_bytes, fmt_us, table
from edge_agent.mqtt import MqttSettings


def _parser() -> argparse.ArgumentParser:
    env = os.environ.get
    p = argparse.ArgumentParser(prog="cfnetctl", description="cfnet operator console (MQTT)")
    p.add_argument("--broker-host", default=env("CFNET_BROKER_HOST", "127.0.0.1"))
    p.add_argument("--broker-port", type=int, default=int(env("CFNET_BROKER_PORT", "8883")))
    p.add_argument("--user", default=env("CFNET_USER", env("USER", "operator")))
    p.add_argument("--password", default=env("CFNET_PASSWORD"))
    p.add_argument("--password-file", type=Path, default=env("CFNET_PASSWORD_FILE"))
    p.add_argument("--ca-file", type=Path, default=env("CFNET_CA_FILE"))
    p.add_argument("--tls", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the core")
    p.add_argument("-o", "--output", choices=("table", "json"), default="table")
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("nodes", help="nodes and their health")
    lk = sub.add_parser("links", help="measured links (all, or one node's)")
    lk.add_argument("node", nargs="?")
    sub.add_parser("stats", help="ingest counters")
    return p


def _render(cmd: str, data: Any) -> str:
    if cmd == "nodes":
        rows = [
            (r["node"], r["health"], r["probe"],
             f"{(r['cpu_util'] or 0) * 100:.0f}%/{r['cpu_cores'] or '-'}",
             f"{fmt_bytes(r['mem_used_bytes'])}/{fmt_bytes(r['mem_total_bytes'])}",
             r["gpus"], fmt_age(r["age_s"] if r["age_s"] is not None else float("inf")),
             r["buffered"])
            for r in data
        ]
        return table(rows, ("NODE", "HEALTH", "PROBE", "CPU", "MEMORY", "GPU", "AGE", "BUF"))
    if cmd == "links":
        rows = [
            (r["src"], r["dst"], fmt_us(r["rtt_p50_us"]), fmt_us(r["rtt_p95_us"]),
             f"{r['loss'] * 100:.1f}%", fmt_bps(r["tx_bps"]), fmt_bps(r["rx_bps"]),
             fmt_age(r["age_s"]))
            for r in data
        ]
        return table(rows, ("FROM", "TO", "RTT p50", "p95", "LOSS", "TX", "RX", "AGE"))
    return json.dumps(data, indent=2)


def main(argv: list[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    password = a.password
    if password is None and a.password_file is not None:
        password = a.password_file.read_text().strip()
    settings = MqttSettings(
        host=a.broker_host, port=a.broker_port, username=a.user, password=password,
        tls=a.tls, ca_file=a.ca_file, client_id="", clean_start=True, session_expiry_s=0,
    )
    args = {k: v for k, v in vars(a).items() if k == "node" and v is not None}
    try:
        with ConsoleClient(settings, a.user) as c:
            resp = c.call(a.cmd, args, timeout_s=a.timeout)
    except ConsoleUnavailable as exc:
        print(f"cfnetctl: {exc}", file=sys.stderr)
        return 3
    if not resp.ok:
        print(f"cfnetctl: {resp.error}", file=sys.stderr)
        return 1
    print(json.dumps(resp.data, indent=2) if a.output == "json" else _render(a.cmd, resp.data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
