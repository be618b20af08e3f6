"""The placement engine's naming rule is the wire's: two copies (the engine imports nothing
from the agent), held equal here on a table of names and on generated ones."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cloud_core.placement import names as engine
from edge_agent.wire import names as wire

TABLE = ["", "a", "A", "edge-1", "edge_1", "edge.1", "-edge", "edge-", "e" * 63, "e" * 64,
         "e" * 253, "e" * 254, "ns/name", "ns/x/y", "/name", "ns/", "é", "a b", "a\x1b[2J",
         "example.com/key", "Example.com/key", "k" * 64, "a/" + "k" * 63, "x" * 254 + "/k",
         "_a", "a_", "a..b", "0", "9z"]
NAMEISH = st.text(alphabet="aZ09._-/ é\x00", max_size=70)


@pytest.mark.parametrize("value", TABLE)
def test_the_same_answer_for_each_name_in_the_table(value: str) -> None:
    for max_len in (engine.ID_MAX, engine.NAME_MAX, 5):
        assert engine.name_problem(value, max_len) == wire.name_problem(value, max_len)
    assert engine.uid_problem(value) == wire.uid_problem(value)
    assert engine.label_key_problem(value) == wire.label_key_problem(value)
    assert engine.label_value_problem(value) == wire.label_value_problem(value)


def test_the_same_bounds_and_a_refusal_for_what_is_not_a_string() -> None:
    assert (engine.ID_MAX, engine.NAME_MAX) == (wire.ID_MAX, wire.NAME_MAX) == (63, 253)
    assert engine.name_problem(7) == wire.name_problem(7) == "must be a string, not int"
    assert engine.name_problem("edge-1") is None and engine.name_problem("Edge") is not None


@settings(max_examples=300, deadline=None)
@given(NAMEISH)
def test_the_same_answer_for_generated_names(value: str) -> None:
    assert engine.name_problem(value) == wire.name_problem(value)
    assert engine.uid_problem(value) == wire.uid_problem(value)
    assert engine.label_key_problem(value) == wire.label_key_problem(value)
    assert engine.label_value_problem(value) == wire.label_value_problem(value)
