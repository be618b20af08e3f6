"""``placement.changes.changed_positions``: the positions whose object is new, across the
slices it compares at once."""

from __future__ import annotations

import dataclasses

import pytest

from cloud_core.placement.changes import SLICE, changed_positions
from cloud_core.placement.model import NodeInfo, Resources


def _nodes(n: int) -> tuple[NodeInfo, ...]:
    return tuple(NodeInfo(f"n{i}", "r", "z", capacity=Resources(1000, 1 << 30))
                 for i in range(n))


def test_new_objects_are_found_in_every_slice() -> None:
    old = _nodes(3 * SLICE + 7)
    now = list(old)
    want = [0, SLICE - 1, SLICE, 2 * SLICE + 3, len(old) - 1]
    for i in want:
        now[i] = dataclasses.replace(old[i], allocated=Resources(i + 1, 0))
    assert changed_positions(now, old) == want
    assert changed_positions(old, old) == []


def test_an_equal_new_object_is_read_again_only_beside_a_changed_one() -> None:
    old = _nodes(2 * SLICE)
    now = list(old)
    now[3] = dataclasses.replace(old[3])  # equal facts, another object: slice equal
    now[SLICE + 1] = dataclasses.replace(old[SLICE + 1])
    now[SLICE + 2] = dataclasses.replace(old[SLICE + 2], allocated=Resources(5, 0))
    assert changed_positions(now, old) == [SLICE + 1, SLICE + 2]


def test_lengths_must_agree() -> None:
    with pytest.raises(ValueError):
        changed_positions(_nodes(3), _nodes(4))
