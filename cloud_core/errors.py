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


class KubeError(CoreError):
    """A Kubernetes API call failed; ``status`` is the HTTP status (0: no response at all)."""

    def __init__(self, message: str, status: int = 0, reason: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason


class KubeUnavailable(KubeError):
    """The API server could not be reached or answered 5xx/429: retry with backoff."""


class KubeConflict(KubeError):
    """409: a precondition failed (stale resourceVersion, pod already bound, already exists)."""


class KubeGone(KubeError):
    """410: the watch's resourceVersion is too old; relist."""


class KubeForbidden(KubeError):
    """401/403: the credentials lack a verb (RBAC) or are not accepted."""


class KubeNotFound(KubeError):
    """404: the object (or the API group of a CRD) does not exist."""
