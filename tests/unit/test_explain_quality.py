"""The gap of the batch that placed a pod, as explain shows it (placement/quality.py)."""

from __future__ import annotations

import math

import pytest

from cloud_core.console.cli import render_explain
from cloud_core.placement.quality import BatchQuality, QualityBook


@pytest.mark.parametrize(("stats", "want"), [
    ({"gap": 0.004, "bound": 0.996, "cost": 1.0, "pods": 12.0}, (1.0, 0.996, 0.004, 12)),
    ({"gap": 0.0, "bound": 0.0, "cost": 0.0, "pods": 1.0}, (0.0, 0.0, 0.0, 1)),
    ({"bound": 1.0}, None),  # the engine priced nothing: no gap to show
    ({"gap": math.nan}, None),
])
def test_batch_quality_of_stats(stats: dict[str, float],
                                want: tuple[float, float, float, int] | None) -> None:
    q = BatchQuality.of(stats, at=100.0)
    if want is None:
        assert q is None
        return
    assert q is not None and (q.cost, q.bound, q.gap, q.pods) == want


def test_doc_and_text_say_the_gap_its_batch_and_age() -> None:
    q = BatchQuality(cost=1.0, bound=0.996, gap=0.004, pods=12, at=100.0)
    d = q.doc(now=103.2)
    assert (d["gap"], d["pods"], d["age_s"]) == (0.004, 12, 3.2)
    assert d["text"] == ("within 0.4 % of the best possible for its batch of 12 pods "
                         "(cost 1.00000 $/h, bound 0.99600 $/h, 3 s ago)")
    assert q.doc(now=50.0)["age_s"] == 0.0  # a clock stepping back is not a negative age


def test_book_keeps_the_latest_batch_per_pod_bounded() -> None:
    book = QualityBook(limit=3)
    a = BatchQuality(1.0, 1.0, 0.0, 2, 1.0)
    b = BatchQuality(2.0, 1.0, 0.5, 3, 2.0)
    book.record(["p1", "p2"], a)
    book.record(["p2", "p3", "p4"], b)  # p2 placed again by a later batch
    assert book.get("p2") is b and book.get("p4") is b
    assert book.get("p1") is None and len(book) == 3  # the oldest forgotten past the limit
    book.record(["p5"], None)  # a batch without a gap changes nothing
    assert book.get("p5") is None
    book.forget("p3")
    assert book.get("p3") is None and len(book) == 2


def test_console_shows_the_batch_line_wrapped() -> None:
    q = BatchQuality(cost=0.00413, bound=0.00413, gap=0.0, pods=3, at=10.0)
    out = render_explain({"workload": "default/near", "state": "placed", "node": "edge-b",
                          "explanation": {}, "batch": q.doc(now=14.0),
                          "link": "edge-b -> edge-a: p95 5.5 ms, 10 samples, 0 s old"})
    lines = out.splitlines()
    assert lines[3] == ("batch     within 0.0 % of the best possible for its batch of 3 pods "
                        "(cost")
    assert lines[4] == "            0.00413 $/h, bound 0.00413 $/h, 4 s ago)"
    assert lines[5].startswith("link      edge-b -> edge-a")
    assert all(len(ln) <= 80 for ln in lines)
    pending = render_explain({"workload": "x", "state": "pending", "explanation": {}})
    assert "batch" not in pending
