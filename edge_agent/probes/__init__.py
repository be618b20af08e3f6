"""Link probes: eBPF (preferred) or sock_diag (fallback), behind one small protocol.

``open_probe`` picks the eBPF probe when the config asks for it and it loads,
and otherwise falls back to sock_diag, returning why (logged once).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from edge_agent.errors import ProbeError
from edge_agent.probes.base import LinkProbe, ProbeConfig

if TYPE_CHECKING:
    from edge_agent.bpf_loader import Pending

__all__ = ["LinkProbe", "ProbeConfig", "open_probe"]

log = logging.getLogger(__name__)


def open_probe(
    cfg: ProbeConfig, pending: Pending | None = None
) -> tuple[LinkProbe, str | None]:
    """Return (probe, fallback reason or None).

    ``pending``: an eBPF loader the agent started early; the eBPF probe claims
    it (or cancels it if it does not fit), and it is cancelled when eBPF is off.
    Raises ProbeError only if no probe works, ConfigError for a bad local address.
    """
    reason: str | None = None
    if cfg.ebpf:
        try:
            from edge_agent.probes.ebpf import EbpfProbe

            return (
                EbpfProbe(include_loopback=cfg.include_loopback, local_addrs=cfg.local_addrs,
                          probe_port=cfg.probe_port, pending=pending,
                          bcc_fallback=cfg.bcc_fallback),
                None,
            )
        except ProbeError as exc:
            reason = str(exc)
    else:
        if pending is not None:
            pending.cancel()
        reason = "eBPF disabled by configuration"
    # Said before sock_diag is tried: if that fails too, why eBPF was not used is not lost.
    # An error where eBPF was asked for: the reason names the cause and the fix.
    log.log(logging.ERROR if cfg.ebpf else logging.WARNING, "link probe: eBPF not used: %s",
            reason)
    # Imported only when used: pyroute2 costs the eBPF agent a few MiB for nothing.
    from edge_agent.probes.sockdiag import SockDiagProbe

    try:
        probe = SockDiagProbe(include_loopback=cfg.include_loopback,
                              local_addrs=cfg.local_addrs, probe_port=cfg.probe_port)
    except ProbeError as exc:
        raise ProbeError(f"no link probe: eBPF not used ({reason}); {exc}") from exc
    log.warning("link probe: using sock_diag fallback (%s)", reason)
    return probe, reason
