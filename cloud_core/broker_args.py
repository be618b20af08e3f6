"""The broker connection flags `cfnet-core` and `cfnetctl` share, and the settings they make.

Each flag also reads an environment variable (``CFNET_BROKER_HOST``, ...), so a
systemd unit or a Kubernetes manifest can configure either without a command line.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from cloud_core.errors import CoreError
from edge_agent.wire.errors import MqttError
from edge_agent.wire.mqtt import BUSES, MqttSettings, protocol_for_bus


def add_broker_args(p: argparse.ArgumentParser) -> None:
    env = os.environ.get
    p.add_argument("--broker-host", default=env("CFNET_BROKER_HOST", "127.0.0.1"))
    p.add_argument("--broker-port", type=int, default=int(env("CFNET_BROKER_PORT", "8883")))
    p.add_argument("--password", default=env("CFNET_PASSWORD"))
    p.add_argument("--password-file", type=Path, default=env("CFNET_PASSWORD_FILE"))
    p.add_argument("--ca-file", type=Path, default=env("CFNET_CA_FILE"))
    p.add_argument("--tls", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--bus", choices=BUSES, default=env("CFNET_BUS", "mosquitto"),
                   help="mosquitto (MQTT 5, the default) or nats (a NATS JetStream cluster's "
                        "MQTT 3.1.1 listener; docs/nats.md)")
    p.add_argument("--broker-failover", default=env("CFNET_BROKER_FAILOVER", ""),
                   help="other host:port addresses of a clustered bus, comma-separated, "
                        "tried in turn when the connection drops")


def parse_failover(text: str) -> tuple[tuple[str, int], ...]:
    """``host:port,host:port`` as address pairs; a malformed entry is a CoreError."""
    out = []
    for item in filter(None, (t.strip() for t in text.split(","))):
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise CoreError(f"--broker-failover: {item!r} is not host:port")
        out.append((host.strip("[]"), int(port)))
    if len(out) > 16:
        raise CoreError("--broker-failover: at most 16 addresses")
    return tuple(out)


def broker_settings(a: argparse.Namespace, username: str, **kw: Any) -> MqttSettings:
    """MqttSettings from the flags above; an unreadable password file is a CoreError."""
    password = a.password
    if password is None and a.password_file is not None:
        try:
            password = a.password_file.read_text().strip()
        except OSError as exc:
            raise CoreError(f"cannot read password file {a.password_file}: {exc.strerror}") \
                from exc
    try:
        protocol = protocol_for_bus(getattr(a, "bus", "mosquitto"))
    except MqttError as exc:
        raise CoreError(str(exc)) from exc
    kw.setdefault("protocol", protocol)
    kw.setdefault("failover", parse_failover(getattr(a, "broker_failover", "") or ""))
    return MqttSettings(host=a.broker_host, port=a.broker_port, username=username,
                        password=password, tls=a.tls, ca_file=a.ca_file, **kw)
