"""Summary statistics the benchmarks share (one percentile, not one per bench)."""

from __future__ import annotations

import math
from collections.abc import Iterable


def pct(xs: Iterable[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default) of ``xs``, ``q`` in 0..1; NaN values
    are left out, and no data gives NaN."""
    s = sorted(x for x in xs if not math.isnan(x))
    if not s:
        return math.nan
    k = (len(s) - 1) * q
    lo = math.floor(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)
