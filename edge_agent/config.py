"""Agent configuration: one frozen dataclass, read from a YAML file, then the
environment (``CFNET_*``), then the command line — later sources win.

Every source is checked with msgspec before anything is built from it: an unknown key, or a
value of the wrong type (``CFNET_TLS=enabled``, ``tls: "yes"``), is refused with a
``ConfigError`` that names the source and the key, never read as some default."""

from __future__ import annotations

import functools
import operator
import os
import socket
import sys
import types
import typing
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edge_agent.errors import ConfigError
from edge_agent.lightimport import msgspec_imports

if TYPE_CHECKING:
    import argparse

with msgspec_imports():  # without typing_extensions, unused here: ~1.1 MiB of the agent's RSS
    import msgspec
    from msgspec import UNSET, UnsetType

from edge_agent.wire import valid_id
from edge_agent.wire.logsetup import LOG_FORMATS, add_version_flag


@dataclass(frozen=True, slots=True)
class AgentConfig:
    """The agent's configuration: command line over file over defaults (:func:`load_config`)."""
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
    # Where the CO-RE loader cannot load (no BTF, no object, no libbpf): compile with BCC on
    # the device (needs python3-bpfcc and kernel headers) instead of sock_diag. Off unless
    # asked: the agent-bcc image sets it (CFNET_BCC_FALLBACK).
    bcc_fallback: bool = False
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
    log_format: str = "text"  # text | json (edge_agent/wire/logsetup.py)
    # "mosquitto" (MQTT 5) or "nats" (a NATS cluster's MQTT 3.1.1 listener), and the
    # clustered bus's other addresses ("host:port,...") tried when a node goes away.
    bus: str = "mosquitto"
    broker_failover: tuple[str, ...] = ()
    # password (username + password, tools.certs add-agent) | certificate: a client
    # certificate of the cluster's agent CA, enrolled through a Kubernetes CSR with the pod's
    # ServiceAccount token (edge_agent/enroll.py; the Helm chart's default).
    identity: str = "password"
    identity_dir: Path | None = None  # key and certificate; default: beside buffer_path
    api_server: str = ""  # default: the pod's KUBERNETES_SERVICE_HOST/PORT
    api_token_file: Path = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")
    api_ca_file: Path = Path("/var/run/secrets/kubernetes.io/serviceaccount/ca.crt")
    enroll_timeout_s: float = 600.0

    def resolved_password(self) -> str | None:
        if self.password is not None:
            return self.password
        if self.password_file is not None:
            try:
                return self.password_file.read_text().strip()
            except OSError as exc:
                raise ConfigError(f"cannot read password file {self.password_file}") from exc
        return None


def _source_type(tp: Any) -> Any:
    """The type in which a source gives a field of ``AgentConfig`` typed ``tp``: a path as
    text, a tuple as a list, the label pairs as a mapping."""
    if tp is Path:
        return str
    args = typing.get_args(tp)
    if typing.get_origin(tp) is tuple:
        return dict[str, str] if args[0] == tuple[str, str] else list.__class_getitem__(args[0])
    if isinstance(tp, types.UnionType):
        return functools.reduce(operator.or_, (_source_type(a) for a in args))
    return tp


_HINTS = typing.get_type_hints(AgentConfig)
# What one source (the file, the environment, the command line) may say: the fields of
# ``AgentConfig`` as msgspec checks them, derived from it so that a new field is declared
# once. A key not listed is refused and named; the file is read strictly (``tls: "yes"`` is
# not a boolean), the environment and the command line leniently only as far as text must
# be (``"8883"`` is a port; a boolean is ``true``, ``false``, ``1`` or ``0``, nothing else:
# ``CFNET_TLS=enabled`` is refused, never read as false).
_Source = msgspec.defstruct(
    "_Source", [(f.name, _source_type(_HINTS[f.name]) | UnsetType, UNSET)
                for f in fields(AgentConfig)],
    forbid_unknown_fields=True, kw_only=True)
_PATHS = {n for n, tp in _HINTS.items() if Path in (tp, *typing.get_args(tp))}
_BOOLS = {n for n, tp in _HINTS.items() if tp is bool}
_LISTS = {n for n, tp in _HINTS.items() if _source_type(tp) in (list[str],)}
_BOOL_HINT = " (a boolean is true, false, 1 or 0)"


def _convert(raw: dict[str, Any], where: str, strict: bool) -> dict[str, Any]:
    """``raw`` checked against :class:`_Source`; the set fields. ``where`` names the source
    (and the key) in the error."""
    try:
        src = msgspec.convert(raw, _Source, strict=strict)
    except msgspec.ValidationError as exc:
        hint = _BOOL_HINT if any(f"$.{b}`" in str(exc) or str(exc).endswith(f"$.{b}")
                                 for b in _BOOLS) else ""
        raise ConfigError(f"{where}: {exc}{hint}") from exc
    return {k: v for k, v in msgspec.structs.asdict(src).items() if v is not UNSET}


def _text(name: str, value: str) -> Any:
    """A value given as text (environment, command line) in the shape the file would use."""
    if name in _LISTS:
        return [p for p in value.split(",") if p]
    if name == "labels":
        try:
            return dict(kv.split("=", 1) for kv in value.split(",") if kv)
        except ValueError as exc:
            raise ConfigError(f"labels {value!r}: expected key=value[,key=value...]") from exc
    return value


def _final(values: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in values.items():
        if k in _PATHS and v is not None:
            v = Path(v)
        elif k in _LISTS:
            v = tuple(v)
        elif k == "labels":
            v = tuple(sorted(v.items()))
        out[k] = v
    return out


def _columns() -> int:
    """The terminal's width as ``shutil.get_terminal_size`` finds it ($COLUMNS, then the
    terminal on stdout, else 80)."""
    try:
        return int(os.environ.get("COLUMNS", "")) or 80
    except ValueError:
        pass
    out = sys.__stdout__
    if out is None:
        return 80
    try:
        return os.get_terminal_size(out.fileno()).columns or 80
    except (AttributeError, ValueError, OSError):
        return 80


#: Imported to parse the command line and needed by nothing after it: ``cfnet-agent`` drops
#: them once its configuration is read (:func:`edge_agent.lightimport.forget`). So this
#: module imports argparse in :func:`_parse_args` only and keeps nothing of it. (Not
#: ``textwrap``, which argparse uses too: ``traceback`` holds it.)
PARSE_ONLY_MODULES = ("argparse", "gettext")


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    import argparse

    class HelpFormatter(argparse.HelpFormatter):
        """argparse's formatter, told the width: left to find it, argparse imports
        ``shutil`` on every ``add_argument``, and with it bz2, lzma and zlib (their modules
        and shared libraries), ~0.4 MiB of the long-lived agent's memory for a width only
        ``--help`` uses."""

        def __init__(self, prog: str) -> None:
            super().__init__(prog, width=max(_columns() - 2, 20))

    p = argparse.ArgumentParser(prog="cfnet-agent", description="cfnet edge agent",
                                formatter_class=HelpFormatter)
    p.add_argument("-c", "--config", type=Path, help="YAML config file")
    add_version_flag(p)
    for f in fields(AgentConfig):
        flag = "--" + f.name.replace("_", "-")
        if f.name in _BOOLS:
            p.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=None)
        else:
            p.add_argument(flag, dest=f.name, default=None)
    return p.parse_args(argv)


def load_config(argv: list[str] | None = None) -> AgentConfig:
    args = _parse_args(argv)

    values: dict[str, Any] = {}
    if args.config is not None:
        # Imported only for a file: most agents are configured by flags and environment,
        # and PyYAML is ~1 MiB of a long-lived process's memory.
        import yaml

        try:
            loaded = yaml.safe_load(args.config.read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(f"cannot read config {args.config}: {exc}") from exc
        if not isinstance(loaded, dict):
            raise ConfigError(f"{args.config}: top level must be a mapping")
        values.update(_convert(loaded, str(args.config), strict=True))
    for f in fields(AgentConfig):
        env = "CFNET_" + f.name.upper()
        text = os.environ.get(env)
        if text is not None:
            values.update(_convert({f.name: _text(f.name, text)}, f"environment {env}",
                                   strict=False))
        cli = getattr(args, f.name, None)
        if cli is not None:
            flag = "--" + f.name.replace("_", "-")
            given = cli if isinstance(cli, bool) else _text(f.name, cli)
            values.update(_convert({f.name: given}, f"command line {flag}", strict=False))
    values = _final(values)
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
    if cfg.log_format not in LOG_FORMATS:
        raise ConfigError(f"log_format {cfg.log_format!r}: expected one of {LOG_FORMATS}")
    if cfg.bus not in ("mosquitto", "nats"):
        raise ConfigError(f"bus {cfg.bus!r} must be mosquitto or nats")
    if cfg.identity not in ("password", "certificate"):
        raise ConfigError(f"identity {cfg.identity!r} must be password or certificate")
    if cfg.identity == "certificate" and not cfg.tls:
        raise ConfigError("identity certificate needs tls: true (a client certificate is "
                          "presented in the TLS handshake)")
    if not 1 <= cfg.enroll_timeout_s <= 86400:
        raise ConfigError(f"enroll_timeout_s {cfg.enroll_timeout_s} must be within 1..86400")
    for addr in cfg.broker_failover:
        host, _, port = addr.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"broker_failover entry {addr!r} is not host:port")
    if cfg.tls and cfg.ca_file is not None and not cfg.ca_file.exists():
        raise ConfigError(f"CA file {cfg.ca_file} does not exist")
    return cfg
