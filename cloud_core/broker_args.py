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
from edge_agent.mqtt import MqttSettings


def add_broker_args(p: argparse.ArgumentParser) -> None:
    env = os.environ.get
    p.add_argument("--broker-host", default=env("CFNET_BROKER_HOST", "127.0.0.1"))
    p.add_argument("--broker-port", type=int, default=int(env("CFNET_BROKER_PORT", "8883")))
    p.add_argument("--password", default=env("CFNET_PASSWORD"))
    p.add_argument("--password-file", type=Path, default=env("CFNET_PASSWORD_FILE"))
    p.add_argument("--ca-file", type=Path, default=env("CFNET_CA_FILE"))
    p.add_argument("--tls", action=argparse.BooleanOptionalAction, default=True)


def broker_settings(a: argparse.Namespace, username: str, **kw: Any) -> MqttSettings:
    """MqttSettings from the flags above; an unreadable password file is a CoreError."""
    password = a.password
    if password is None and a.password_file is not None:
        try:
            password = a.password_file.read_text().strip()
        except OSError as exc:
            raise CoreError(f"cannot read password file {a.password_file}: {exc.strerror}") \
                from exc
    return MqttSettings(host=a.broker_host, port=a.broker_port, username=username,
                        password=password, tls=a.tls, ca_file=a.ca_file, **kw)
