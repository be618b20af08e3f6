"""Logging set-up and ``--version`` shared by every cfnet command (agent, core, console).

Dependency-free (the agent imports it). ``--log-format json`` writes one JSON object per
line (``ts``, ``level``, ``logger``, ``msg``, and ``exc`` when there is a traceback), the
shape log collectors such as Fluent Bit or Loki parse without a regex; ``text`` (the default)
is the human-readable line the commands always wrote.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import TYPE_CHECKING, Any

from edge_agent import __version__

if TYPE_CHECKING:
    import argparse  # the caller's parser; not imported here (the agent drops argparse)

LOG_FORMATS = ("text", "json")
# Child processes (the core's MQTT process) read the format here, so they log as the parent.
ENV = "CFNET_LOG_FORMAT"
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record; never raises on odd arguments (they are str()-ed)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False, default=str)


def configure_logging(fmt: str = "text", level: int = logging.INFO) -> None:
    """(Re)configure the root logger to write ``fmt`` lines to stderr."""
    if fmt not in LOG_FORMATS:
        raise ValueError(f"log format {fmt!r}: expected one of {', '.join(LOG_FORMATS)}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    os.environ[ENV] = fmt


def configure_child_logging(level: int) -> None:
    """In a child process: the format its parent chose (``configure_logging``), else text."""
    fmt = os.environ.get(ENV, "text")
    configure_logging(fmt if fmt in LOG_FORMATS else "text", level)


def add_version_flag(p: argparse.ArgumentParser) -> None:
    """``--version``: prints ``<prog> <version>`` and exits 0."""
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
