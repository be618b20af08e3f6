"""The cloud core's one error hierarchy: every error the core raises derives from ``CoreError``.

Other parts add their own subclasses here; keep each one small and raise it ``from`` its cause.
"""

from __future__ import annotations


class CoreError(Exception):
    """Base of every error raised by ``cloud_core``."""


class PlacementError(CoreError):
    """The placement engine was handed something it cannot work with (not: "no node fits")."""


class SpecError(PlacementError):
    """A workload spec is invalid; ``field`` names the offending field, ``reason`` says why."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason
