"""The cluster's PodDisruptionBudgets, for answers that suggest evicting pods.

A pending pod's answer (``cloud_core/conflicts.py``: the FailedScheduling event, the console's
``explain``) may suggest evicting pods of lower priority (``placement/preempt.py``); it
respects the budgets as kube-scheduler's preemption does, so it needs them. They are listed
on demand, at most once per ``ttl_s`` (answers are rare and bounded; a watch would cost
every replica a stream for them), at most :data:`MAX_BUDGETS`. Without them (the role lacks
``list``, the API server is away) the answer is ``None``: no eviction is suggested rather
than one that might break a budget.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from cloud_core.errors import KubeError, KubeForbidden
from cloud_core.k8s.client import KubeClient
from cloud_core.placement.preempt import DisruptionBudget, budget_of

log = logging.getLogger(__name__)

PATH = "/apis/policy/v1/poddisruptionbudgets"
MAX_BUDGETS = 10_000  # budgets read; past it no eviction is suggested (not all are known)
PAGE = 500


class BudgetReader:
    """``reader()``: the budgets now (cached ``ttl_s``), or None when they are not known."""

    def __init__(self, client: KubeClient, ttl_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._client = client
        self._ttl_s = ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._at: float | None = None
        self._budgets: list[DisruptionBudget] | None = None
        self.errors = 0  # lists that failed (a metric's worth; logged once per kind)
        self._said: set[str] = set()

    def __call__(self) -> list[DisruptionBudget] | None:
        with self._lock:
            if self._at is not None and self._clock() - self._at < self._ttl_s:
                return self._budgets
            self._budgets = self._read()
            self._at = self._clock()
            return self._budgets

    def _read(self) -> list[DisruptionBudget] | None:
        out: list[DisruptionBudget] = []
        try:
            for page, _rv in self._client.list_pages(PATH, limit=PAGE):
                for obj in page:
                    # a selector that does not parse is skipped, as preemption skips it
                    if (b := budget_of(obj)) is not None:
                        out.append(b)
                if len(out) > MAX_BUDGETS:
                    self._fail("too-many", f"more than {MAX_BUDGETS} budgets")
                    return None
        except KubeForbidden as exc:
            self._fail("forbidden", f"listing PodDisruptionBudgets refused: {exc}")
            return None
        except KubeError as exc:
            self._fail("error", f"listing PodDisruptionBudgets failed: {exc}")
            return None
        return out

    def _fail(self, kind: str, why: str) -> None:
        self.errors += 1
        if kind not in self._said:
            self._said.add(kind)
            log.warning("%s: no eviction is suggested while they are not known", why)
