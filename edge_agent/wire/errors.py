"""The wire package's error hierarchy: every error it raises on purpose is a WireBaseError.

:class:`WireError` is a message that breaks the contract (its ``reason`` is the stable
code the core counts drops by); :class:`MqttError` is a connection, publish or subscribe
that failed. Each keeps the builtin base its callers catch (``ValueError``,
``RuntimeError``). Raise them ``from`` the cause so the original traceback survives.
"""

from __future__ import annotations


class WireBaseError(Exception):
    """Base of every error raised deliberately by the wire package."""


class WireError(WireBaseError, ValueError):
    """A message that breaks the wire contract. ``reason`` is a stable counter key."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class MqttError(WireBaseError, RuntimeError):
    """Connecting, publishing or subscribing failed."""
