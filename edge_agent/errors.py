"""The agent's error hierarchy: every error the agent raises on purpose is an AgentError.

Callers catch :class:`AgentError` at the loop boundary; subclasses say which
part failed. Raise them ``from`` the cause so the original traceback survives.
"""

from __future__ import annotations


class AgentError(Exception):
    """Base of every error raised deliberately by the edge agent."""


class ProbeError(AgentError):
    """A link probe could not be loaded or read (BPF compile/attach, sock_diag)."""


class ConfigError(AgentError):
    """Invalid agent configuration."""
