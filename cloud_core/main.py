"""`cfnet-core`: parse the command line, wire the core's parts, run until a signal."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

from cloud_core.service import CoreService
from cloud_core.view import render_links, render_nodes
from edge_agent.mqtt import MqttSettings

log = logging.getLogger("cfnet.core")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    env = os.environ.get
    p = argparse.ArgumentParser(prog="cfnet-core", description="cfnet cloud core")
    p.add_argument("--broker-host", default=env("CFNET_BROKER_HOST", "127.0.0.1"))
    p.add_argument("--broker-port", type=int, default=int(env("CFNET_BROKER_PORT", "8883")))
    p.add_argument("--username", default=env("CFNET_USERNAME", "core-0"))
    p.add_argument("--password", default=env("CFNET_PASSWORD"))
    p.add_argument("--password-file", type=Path, default=env("CFNET_PASSWORD_FILE"))
    p.add_argument("--ca-file", type=Path, default=env("CFNET_CA_FILE"))
    p.add_argument("--tls", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--share-group", default=env("CFNET_SHARE_GROUP"),
                   help="ingest through $share/<group>/ so replicas split the load")
    p.add_argument("--table-every", type=float, default=10.0,
                   help="log the node and link tables every N seconds (0: never)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    a = parse_args(argv)
    password = a.password
    if password is None and a.password_file is not None:
        try:
            password = a.password_file.read_text().strip()
        except OSError as exc:
            print(f"cfnet-core: cannot read {a.password_file}: {exc}", file=sys.stderr)
            return 2
    settings = MqttSettings(
        host=a.broker_host, port=a.broker_port, username=a.username, password=password,
        tls=a.tls, ca_file=a.ca_file, client_id=a.username, keepalive_s=5,
    )
    core = CoreService(settings, share_group=a.share_group)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    core.start()
    if not core.mqtt.wait_connected(10):
        log.warning("broker %s:%s not reachable yet (%s); retrying in the background",
                    a.broker_host, a.broker_port, core.mqtt.last_refusal or "no answer")
    while not stop.wait(a.table_every if a.table_every > 0 else 3600):
        snap = core.state.snapshot(time.time())
        c = core.ingest.counters()
        log.info("ingest: %d accepted, %d duplicate, %d rejected %s\n%s\n\n%s",
                 c.accepted, c.duplicates, c.rejected_total, c.rejected or "",
                 render_nodes(snap), render_links(snap))
    core.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
