"""Liveness and readiness of a ``cfnet-core`` process: ``/healthz`` and ``/readyz``.

``/healthz`` answers 200 while the process serves HTTP at all (the kubelet restarts a core
that stops answering). ``/readyz`` answers 200 only when every registered check passes, and
503 with one ``[-]name: reason`` line per failing check otherwise (the shape of
kube-apiserver's ``/readyz?verbose``), so ``kubectl describe pod`` shows why. What
``cfnet-core`` registers (``cloud_core.main``):

* ``broker``: the MQTT connection is up — on a Kubernetes replica only while it leads, since
  followers do not connect (only the Lease holder uses the shared account);
* ``kubernetes-caches``: the pod and node informers hold a full list;
* ``kubernetes-api``: the last successful call to the API server (the leader election's
  round every retry period) is at most one lease duration old.

A check is a function returning ``None`` when fine or the reason it is not; one that raises
fails with the exception's text (a probe must never take the process down). Until the owner
calls ``started()`` (once every check is registered) the answer is 503 ``[-]startup``: the
HTTP server comes up before the Kubernetes parts, and an empty set of checks must not read
as ready.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

Check = Callable[[], str | None]


class Readiness:
    """Named readiness checks; thread-safe (the HTTP server calls from its own threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._checks: dict[str, Check] = {}
        self._started = threading.Event()
        self.add("startup", lambda: None if self._started.is_set() else "still starting")

    def add(self, name: str, check: Check) -> None:
        with self._lock:
            self._checks[name] = check

    def started(self) -> None:
        """Every check is registered: from now on they alone decide."""
        self._started.set()

    def failures(self) -> dict[str, str]:
        """Failing checks, name -> reason; empty when ready."""
        with self._lock:
            checks = list(self._checks.items())
        out: dict[str, str] = {}
        for name, check in checks:
            try:
                why = check()
            except Exception as exc:  # a probe reports, never raises
                why = f"check raised {type(exc).__name__}: {exc}"
            if why:
                out[name] = why
        return out

    def report(self) -> tuple[bool, str]:
        """(ready, body): ``[+]name ok`` / ``[-]name: reason`` lines, then the verdict."""
        with self._lock:
            names = list(self._checks)
        failed = self.failures()
        lines = [f"[-]{n}: {failed[n]}" if n in failed else f"[+]{n} ok" for n in names]
        lines.append("readyz check failed" if failed else "ok")
        return not failed, "\n".join(lines) + "\n"
