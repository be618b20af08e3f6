"""How good a placement is: the gap of the batch that placed a pod, kept per pod for
``explain``.

The engine reports each batch's cost and its lower bound (``PlacementResult.stats``:
``bound``, the cost of placing each pod on the cheapest node that fitted it before the batch,
capacity the batch shares ignored; ``gap``, the cost above it as a share of the cost). A
:class:`BatchQuality` is that pair with the batch's size and wall-clock time, and
:class:`QualityBook` keeps the one of the batch that placed each pod, bounded (the oldest
pods forgotten first), so ``explain`` can say "within 0.4 % of the best possible for its
batch of 12 pods" of any pod placed since the core started.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

MAX_PODS = 100_000  # pods whose batch is kept; past it the oldest are forgotten


@dataclass(frozen=True, slots=True)
class BatchQuality:
    """One batch: its cost and lower bound ($/h), the gap between them, its size, when."""

    cost: float
    bound: float
    gap: float  # (cost - bound) / cost; 0: as good as the bound
    pods: int
    at: float  # wall-clock seconds (time.time()) of the decision

    @classmethod
    def of(cls, stats: Mapping[str, float], at: float) -> BatchQuality | None:
        """From a batch's stats (``gap``, ``bound``, ``cost``, ``pods``); None when the
        engine reported no gap (nothing priced)."""
        gap = stats.get("gap")
        if gap is None or not math.isfinite(gap):
            return None
        return cls(float(stats.get("cost", math.nan)), float(stats.get("bound", math.nan)),
                   float(gap), int(stats.get("pods", 0)), at)

    def text(self, now: float) -> str:
        """``within 0.4 % of the best possible for its batch of 12 pods (cost ..., bound
        ..., 3 s ago)``."""
        age = max(0.0, now - self.at)
        return (f"within {self.gap * 100:.1f} % of the best possible for its batch of "
                f"{self.pods} pods (cost {self.cost:.5f} $/h, bound {self.bound:.5f} $/h, "
                f"{age:.0f} s ago)")

    def doc(self, now: float) -> dict[str, float | int | str]:
        """The answer's ``batch`` field: the figures and the sentence."""
        return {"gap": self.gap, "cost": self.cost, "bound": self.bound, "pods": self.pods,
                "age_s": round(max(0.0, now - self.at), 1), "text": self.text(now)}


class QualityBook:
    """Pod uid -> the :class:`BatchQuality` of the batch that placed it (thread-safe,
    at most ``limit`` pods)."""

    def __init__(self, limit: int = MAX_PODS) -> None:
        self._limit = limit
        self._lock = threading.Lock()
        self._by_uid: OrderedDict[str, BatchQuality] = OrderedDict()

    def record(self, uids: Iterable[str], q: BatchQuality | None) -> None:
        if q is None:
            return
        with self._lock:
            for u in uids:
                self._by_uid[u] = q
                self._by_uid.move_to_end(u)
            while len(self._by_uid) > self._limit:
                self._by_uid.popitem(last=False)

    def get(self, uid: str) -> BatchQuality | None:
        with self._lock:
            return self._by_uid.get(uid)

    def forget(self, uid: str) -> None:
        with self._lock:
            self._by_uid.pop(uid, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._by_uid)
