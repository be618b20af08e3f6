"""What a new leader reads back is read defensively: the planned moves on the Lease
(``k8s/ledger.py``) and the pool plan on the pool object (``k8s/pools.py``), bounded in size,
count and shape; what is malformed is dropped, never expanded. The write and read-back paths
themselves run against the real API server in tests/k8s/test_leader_state.py."""

from __future__ import annotations

import json
import time

from cloud_core.k8s.ledger import MAX_BYTES, MAX_ENTRIES, decode, encode
from cloud_core.k8s.pools import MAX_NOTE_BYTES, PLAN_NOTE, PoolPlan, plan_note, read_note


def test_planned_moves_round_trip() -> None:
    exp = time.time() + 100
    entries = [(("owner", "ns", "uid-1", "h1"), "n-2", "pod-uid", exp)]
    got = decode(encode(entries))
    assert got[0][:3] == entries[0][:3] and abs(got[0][3] - exp) < 0.01


def test_planned_moves_hostile_input_is_dropped() -> None:
    good = [["owner", "ns", "u", "h"], "n", "p", 1.0]
    assert decode("x" * (MAX_BYTES + 1)) == []
    assert decode("{not json") == []
    assert decode(json.dumps({"a": 1})) == []
    bad = [[["k"] * 5, "n", "p", 1.0],  # key too long
           [["k"], "n" * 254, "p", 1.0],  # name over a DNS subdomain
           [["k"], "n", "p", True],  # a bool is no expiry
           [["k"], 3, "p", 1.0], "junk", [["k"], "n", "p"]]
    assert decode(json.dumps([*bad, good])) == [(("owner", "ns", "u", "h"), "n", "p", 1.0)]
    assert len(decode(json.dumps([good] * (MAX_ENTRIES + 50)))) == MAX_ENTRIES


def _obj(raw: str) -> dict[str, object]:
    return {"metadata": {"name": "app", "namespace": "ns", "annotations": {PLAN_NOTE: raw}}}


def test_pool_note_round_trip() -> None:
    plan = PoolPlan(app="app", flavour="openyurt", replicas=6, per_pool={"a": 2, "b": 4},
                    assignments={}, unplaced={})
    got = read_note(_obj(plan_note(plan, "m", "t")), "app", "openyurt")
    assert got is not None
    back, members, template = got
    assert (back.per_pool, back.replicas, back.placed, members, template) == \
        ({"a": 2, "b": 4}, 6, 6, "m", "t")


def test_pool_note_hostile_input_is_dropped() -> None:
    ok = {"replicas": 2, "per_pool": {"a": 2}, "members": "m", "template": "t"}
    for bad in ({**ok, "replicas": 10**9}, {**ok, "replicas": True},
                {**ok, "per_pool": {"a": 3}}, {**ok, "per_pool": {"a": 2, "b": 1}}, {**ok, "per_pool": {"a": -1}},
                {**ok, "per_pool": [1]}, {**ok, "members": 1}, [ok]):
        assert read_note(_obj(json.dumps(bad)), "app", "openyurt") is None, bad
    assert read_note(_obj("{"), "app", "openyurt") is None
    assert read_note(_obj(" " * (MAX_NOTE_BYTES + 1)), "app", "openyurt") is None
    assert read_note({"metadata": {}}, "app", "openyurt") is None
