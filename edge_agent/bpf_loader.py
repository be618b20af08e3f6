"""Thin BCC loader: finds ``bpf/``, checks capabilities, compiles with -D parameters.

BCC is imported lazily so the agent (and its sock_diag fallback) still runs
where BCC is not installed. Parameters reach the C code as ``-D`` flags only;
the C source is never templated.
"""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from edge_agent.errors import ProbeError

log = logging.getLogger(__name__)

ENV_BPF_DIR = "CFNET_BPF_DIR"


def bpf_dir() -> Path:
    """Directory holding the BPF C sources: $CFNET_BPF_DIR, else ``bpf/`` of this checkout."""
    env = os.environ.get(ENV_BPF_DIR)
    if env:
        return Path(env)
    return Path(__file__).resolve().parent.parent / "bpf"


def import_bcc() -> Any:
    try:
        import bcc  # type: ignore[import-not-found,unused-ignore]
    except Exception as exc:  # ImportError, or a broken libbcc raising OSError
        raise ProbeError(f"BCC not available: {exc}") from exc
    return bcc


def missing_tracepoints(names: Sequence[str]) -> list[str]:
    """Which of ``category:event`` tracepoints this kernel lacks (asks BCC, not uname)."""
    bcc = import_bcc()
    missing = []
    for name in names:
        category, _, event = name.partition(":")
        try:
            ok = bool(bcc.BPF.tracepoint_exists(category, event))
        except Exception:
            ok = False
        if not ok:
            missing.append(name)
    return missing


TRACEFS_DIRS = ("/sys/kernel/tracing", "/sys/kernel/debug/tracing")


def ensure_tracefs() -> str:
    """Mount tracefs if no tracing directory is there; returns what it did, for the log.

    Inside ``ip netns exec`` (how agents run in the lab, and in some
    containers) /sys is a fresh sysfs for the new network namespace, without
    tracefs. Mounting it there stays private to that mount namespace. Must run
    before BCC is imported: BCC picks its tracing directory at import time.
    """
    for d in TRACEFS_DIRS:
        if Path(d, "events").is_dir():
            return ""
    if os.geteuid() != 0:
        return "tracefs not mounted and not root"
    try:
        subprocess.run(["mount", "-t", "tracefs", "nodev", TRACEFS_DIRS[0]], check=True,
                       capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"tracefs not mounted and mounting it failed: {exc}"
    log.info("mounted tracefs at %s", TRACEFS_DIRS[0])
    return f"mounted tracefs at {TRACEFS_DIRS[0]}"


def tracepoint_fields(category: str, event: str) -> set[str]:
    """Field names of a tracepoint, from its tracefs ``format`` file (empty if unreadable)."""
    for d in TRACEFS_DIRS:
        fmt = Path(d, "events", category, event, "format")
        try:
            text = fmt.read_text()
        except OSError:
            continue
        names = set()
        for line in text.splitlines():
            line = line.strip()
            if line.startswith("field:"):
                decl = line[len("field:"):].split(";", 1)[0]
                names.add(decl.split()[-1].split("[", 1)[0])
        return names
    return set()


def check_environment(tracepoints: Sequence[str]) -> None:
    """Raise ProbeError with a one-line reason if eBPF can't work here."""
    if os.geteuid() != 0:
        raise ProbeError("not root: eBPF needs CAP_BPF/CAP_PERFMON")
    ensure_tracefs()
    if not Path("/sys/kernel/btf/vmlinux").exists():
        raise ProbeError("no BTF (/sys/kernel/btf/vmlinux)")
    missing = missing_tracepoints(tracepoints)
    if missing:
        raise ProbeError(f"missing tracepoints: {', '.join(missing)} (is tracefs mounted?)")


def load(src_name: str, cflags: Sequence[str] = ()) -> Any:
    """Compile and load ``bpf/<src_name>`` with BCC; returns the ``bcc.BPF`` object."""
    bcc = import_bcc()
    directory = bpf_dir()
    src = directory / src_name
    if not src.is_file():
        raise ProbeError(f"BPF source {src} not found (set {ENV_BPF_DIR})")
    flags = [f"-I{directory}", *cflags]
    log.debug("loading %s with %s", src, " ".join(flags))
    try:
        return bcc.BPF(src_file=str(src).encode(), cflags=flags)
    except Exception as exc:
        raise ProbeError(f"loading {src_name} failed: {exc}") from exc
