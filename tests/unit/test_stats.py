"""tools.stats.pct against numpy's percentile (its default, linear interpolation)."""

from __future__ import annotations

import math
import random

import numpy as np

from tools.stats import pct


def test_pct_is_numpys_linear_percentile() -> None:
    rnd = random.Random(7)
    for n in (1, 2, 3, 10, 101):
        xs = [rnd.uniform(0, 50) for _ in range(n)]
        for q in (0.0, 0.5, 0.95, 0.99, 1.0):
            assert math.isclose(pct(xs, q), float(np.percentile(xs, q * 100)))


def test_pct_leaves_out_nan_and_has_none_for_no_data() -> None:
    assert pct([1.0, math.nan, 3.0], 0.5) == 2.0
    assert math.isnan(pct([], 0.5))
    assert math.isnan(pct([math.nan], 0.5))
