"""Agent configuration: one frozen dataclass, read from a YAML file, then the
environment (``CFNET_*``), then the command line — later sources win."""

from __future__ import annotations

import argparse
import os
import socket
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import yaml

from edge_agent.errors import ConfigError
from edge_agent.wire import valid_id


@dataclass(frozen=True, slots=True)
class AgentConfig:
    node: str
    broker_host: str = "127.0.0.1"
    broker_port: int = 8883
    username: str | None = None
    password: str | None = None
    password_file: Path | None = None
    tls: bool = True
    ca_file: Path | None = None
    certfile: Path | None = None
    keyfile: Path | None = None
    interval_s: float = 1.0
    keepalive_s: int = 3
    ebpf: bool = True
    include_loopback: bool = False
    probe_port: int = 7946
    probe_bind: str = "0.0.0.0"
    active_probing: bool = True
    peers: tuple[str, ...] = ()
    labels: tuple[tuple[str, str], ...] = ()
    buffer_path: Path = Path("/var/lib/cfnet-agent/buffer.db")
    buffer_max_bytes: int = 16 * 1024 * 1024
    buffer_max_age_s: float = 7 * 86400.0
    metrics_port: int = 0
    # "mosquitto" (MQTT 5) or "nats" (a NATS cluster's MQTT 3.1.1 listener), and the
    # clustered bus's other addresses ("host:port,...") tried when a node goes away.
    bus: str = "mosquitto"
    broker_failover: tuple[str, ...] = ()

    def resolved_password(self) -> str | None:
        if self.password is not None:
            return self.password
        if self.password_file is not None:
            try:
                return self.password_file.read_text().strip()
            except OSError as exc:
                raise ConfigError(f"cannot read password file {self.password_file}") from exc
        return None


_PATHS = {"password_file", "ca_file", "certfile", "keyfile", "buffer_path"}
_BOOLS = {"tls", "ebpf", "include_loopback", "active_probing"}
_INTS = {"broker_port", "keepalive_s", "probe_port", "buffer_max_bytes", "metrics_port"}
_FLOATS = {"interval_s", "buffer_max_age_s"}


def _coerce(name: str, value: Any) -> Any:
    try:
        if value is None:
            return None
        if name in _PATHS:
            return Path(value)
        if name in _BOOLS:
            if isinstance(value, str):
                return value.strip().lower() in ("1", "true", "yes", "on")
            return bool(value)
        if name in _INTS:
            return int(value)
        if name in _FLOATS:
            return float(value)
        if name in ("peers", "broker_failover"):
            return tuple(value.split(",") if isinstance(value, str) else value)
        if name == "labels":
            if isinstance(value, str):
                value = dict(kv.split("=", 1) for kv in value.split(",") if kv)
            return tuple(sorted((str(k), str(v)) for k, v in dict(value).items()))
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"config field {name}: bad value {value!r}") from exc
    return value


def load_config(argv: list[str] | None = None) -> AgentConfig:
    p = argparse.ArgumentParser(prog="cfnet-agent", description="cfnet edge agent")
    p.add_argument("-c", "--config", type=Path, help="YAML config file")
    for f in fields(AgentConfig):
        flag = "--" + f.name.replace("_", "-")
        if f.name in _BOOLS:
            p.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=None)
        else:
            p.add_argument(flag, dest=f.name, default=None)
    args = p.parse_args(argv)

    values: dict[str, Any] = {}
    if args.config is not None:
        try:
            loaded = yaml.safe_load(args.config.read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"cannot read config {args.config}: {exc}") from exc
        if not isinstance(loaded, dict):
            raise ConfigError(f"{args.config}: top level must be a mapping")
        known = {f.name for f in fields(AgentConfig)}
        unknown = set(loaded) - known
        if unknown:
            raise ConfigError(f"{args.config}: unknown keys {sorted(unknown)}")
        values.update(loaded)
    for f in fields(AgentConfig):
        env = os.environ.get("CFNET_" + f.name.upper())
        if env is not None:
            values[f.name] = env
        cli = getattr(args, f.name, None)
        if cli is not None:
            values[f.name] = cli
    values = {k: _coerce(k, v) for k, v in values.items()}
    values.setdefault("node", socket.gethostname().lower())
    cfg = AgentConfig(**values)
    if cfg.username is None:
        cfg = replace(cfg, username=cfg.node)
    return validate(cfg)


def validate(cfg: AgentConfig) -> AgentConfig:
    if not valid_id(cfg.node):
        raise ConfigError(
            f"node id {cfg.node!r} is invalid: lower-case letters, digits, '.', '_', '-'; max 63"
        )
    if not 0.05 <= cfg.interval_s <= 3600:
        raise ConfigError(f"interval_s {cfg.interval_s} must be within 0.05..3600")
    if cfg.bus not in ("mosquitto", "nats"):
        raise ConfigError(f"bus {cfg.bus!r} must be mosquitto or nats")
    for addr in cfg.broker_failover:
        host, _, port = addr.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"broker_failover entry {addr!r} is not host:port")
    if cfg.tls and cfg.ca_file is not None and not cfg.ca_file.exists():
        raise ConfigError(f"CA file {cfg.ca_file} does not exist")
    return cfg
