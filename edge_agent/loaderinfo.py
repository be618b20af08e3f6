"""Which eBPF loader the agent runs (``core``, ``bcc``, or ``none``) and why: reported by the
health server's ``/status`` and by the metrics (``cfnet_agent_loader``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Loader:
    """The eBPF loader in use (``core``, ``bcc``; ``none``: a probe without eBPF) and why."""

    name: str
    why: str


def loader_of(probe: Any, fallback: str | None) -> Loader:
    """The loader of ``probe`` (the eBPF probe records it), or ``none`` with the reason the
    agent did not use eBPF (``fallback``, from :func:`edge_agent.probes.open_probe`)."""
    name = getattr(probe, "loader", None)
    if isinstance(name, str) and name:
        return Loader(name, str(getattr(probe, "loader_reason", "") or ""))
    return Loader("none", fallback or f"the {probe.name} probe uses no eBPF loader")
