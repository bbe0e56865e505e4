"""Table–table joins on the key, inner, left and outer, with Kafka Streams' outputs: every row
of the join-semantics table of its DSL guide (records in timestamp order) and every step of its
TableTableJoinIntegrationTest (the result table uncached), on the worker's kernels through the
test driver."""

from __future__ import annotations

from typing import Any

import pytest
from pystreams.topology.errors import TopologyError

from pystreams import serdes
from pystreams.app import App, Table
from pystreams.testing import TopologyTestDriver


def _shown(value: Any) -> str:
    return "null" if value is None else str(value)


def _joiner(key: Any, left: Any, right: Any) -> str:
    return f"{_shown(left)}-{_shown(right)}"


def _join_app(how: str, *, store: str | None = None) -> App:
    app = App(f"table-join-{how}")
    left = app.table("left", value=serdes.Text())
    right = app.table("right", value=serdes.Text())
    left.join(right, _joiner, how=how, value=serdes.Text(), store=store, name="joined").to_stream().to("out")
    return app


def _steps(app: App, steps: list[tuple[str, str | None, int]]) -> list[list[tuple[Any, int]]]:
    """Each step's output as (value, timestamp) records; every record has key 0."""
    outputs = []
    with TopologyTestDriver(app) as driver:
        topics = {"L": driver.input_topic("left"), "R": driver.input_topic("right")}
        out = driver.output_topic("out")
        for side, value, timestamp in steps:
            topics[side].pipe_input("0", value, timestamp=timestamp)
            records = out.read_records()
            assert all(r.key == "0" for r in records)
            outputs.append([(r.value, r.timestamp) for r in records])
    return outputs


#: The DSL guide's "Semantics of table-table equi-joins": (side, value, timestamp) and the
#: INNER, LEFT and OUTER outputs ("" an empty cell: the joiner is not called, nothing is sent;
#: None a tombstone).
GUIDE = [
    ("L", None, 1, "", "", ""),
    ("R", None, 2, "", "", ""),
    ("L", "A", 3, "", "A-null", "A-null"),
    ("R", "a", 4, "A-a", "A-a", "A-a"),
    ("L", "B", 5, "B-a", "B-a", "B-a"),
    ("R", "b", 6, "B-b", "B-b", "B-b"),
    ("L", None, 7, None, None, "null-b"),
    ("R", None, 8, "", "", None),
    ("L", "C", 9, "", "C-null", "C-null"),
    ("R", "c", 10, "C-c", "C-c", "C-c"),
    ("R", None, 11, None, "C-null", "C-null"),
    ("L", None, 12, "", None, None),
    ("R", None, 13, "", "", ""),
    ("R", "d", 14, "", "", "null-d"),
    ("L", "D", 15, "D-d", "D-d", "D-d"),
]


@pytest.mark.parametrize("store", [None, "joined-rows"])
@pytest.mark.parametrize(("how", "column"), [("inner", 3), ("left", 4), ("outer", 5)])
def test_every_row_of_the_guides_table_table_join_table(how: str, column: int, store: str | None) -> None:
    outputs = _steps(_join_app(how, store=store), [(side, value, ts) for side, value, ts, *_ in GUIDE])
    expected = [[] if row[column] == "" else [(row[column], row[2])] for row in GUIDE]
    assert outputs == expected


#: TableTableJoinIntegrationTest, caching off: (side, value, timestamp) and the INNER, LEFT and
#: OUTER values ("" nothing sent). Steps 14 on arrive out of timestamp order.
INTEGRATION = [
    *[(side, value, ts, inner, left, outer) for side, value, ts, inner, left, outer in GUIDE[:13]],
    ("R", "d", 7, "", "", "null-d"),
    ("L", "D", 6, "D-d", "D-d", "D-d"),
    ("L", None, 2, None, None, "null-d"),
    ("R", None, 3, "", "", None),
    ("R", "e", 14, "", "", "null-e"),
    ("L", "E", 15, "E-e", "E-e", "E-e"),
    ("L", None, 10, None, None, "null-e"),
    ("R", None, 9, "", "", None),
    ("L", "F", 4, "", "F-null", "F-null"),
    ("R", "f", 3, "F-f", "F-f", "F-f"),
]


@pytest.mark.parametrize(("how", "column"), [("inner", 3), ("left", 4), ("outer", 5)])
def test_every_step_of_kafkas_table_table_join_integration_test(how: str, column: int) -> None:
    """The values of every step. A result's timestamp is the updating record's here, where
    Kafka Streams takes the larger of both sides' (its stores keep each row's timestamp): they
    differ only on the out-of-order steps."""
    outputs = _steps(_join_app(how), [(side, value, ts) for side, value, ts, *_ in INTEGRATION])
    expected = [[] if row[column] == "" else [row[column]] for row in INTEGRATION]
    assert [[value for value, _ in step] for step in outputs] == expected


def test_a_materialized_join_is_queryable_and_ends_as_the_join_of_the_final_tables() -> None:
    app = App("join-table")
    left = app.table("left", value=serdes.Int())
    right = app.table("right", value=serdes.Int())
    left.join(right, lambda key, a, b: (a or 0) + (b or 0), how="outer", value=serdes.Int(), store="sums")
    final_left, final_right = {"a": 1, "c": 3}, {"b": 20, "c": 30}
    with TopologyTestDriver(app) as driver:
        for key, value in (("a", 1), ("b", 2), ("c", 3), ("b", None)):
            driver.input_topic("left").pipe_input(key, value, timestamp=1)
        for key, value in (("a", 10), ("b", 20), ("c", 30), ("a", None)):
            driver.input_topic("right").pipe_input(key, value, timestamp=2)
        expected = {k: final_left.get(k, 0) + final_right.get(k, 0) for k in {*final_left, *final_right}}
        assert driver.store_contents("sums") == expected


def test_table_joins_read_their_sides_through_filters_computed_on_read() -> None:
    app = App("join-through-filter")
    left = app.table("left", value=serdes.Int())
    right = app.table("right", value=serdes.Int()).filter(lambda key, value: value > 0, name="positive")
    left.join(right, lambda key, a, b: a * b, value=serdes.Int()).to_stream().to("out")
    with TopologyTestDriver(app) as driver:
        driver.input_topic("right").pipe_input("k", 5, timestamp=1)
        driver.input_topic("left").pipe_input("k", 2, timestamp=2)
        driver.input_topic("right").pipe_input("k", -1, timestamp=3)  # filtered out: a tombstone
        driver.input_topic("left").pipe_input("k", 3, timestamp=4)  # the right row is gone
        assert driver.output_topic("out").read_key_values() == [("k", 10), ("k", None)]


def test_table_joins_say_what_they_cannot_do() -> None:
    app = App("join-errors")
    left = app.table("left", value=serdes.Int())
    right = app.table("right", value=serdes.Int())
    computed = left.join(right, lambda key, a, b: a, value=serdes.Int(), name="computed")
    assert isinstance(computed, Table) and computed.store is None
    with pytest.raises(TopologyError, match="give 'computed' store="):
        app.topic("events").join(computed, lambda key, value, row: row)
    with pytest.raises(TopologyError, match="outer"):
        app.topic("events2").join(left, lambda key, value, row: row, how="outer")
    with pytest.raises(TopologyError, match="unknown|how"):
        left.join(right, lambda key, a, b: a, how="sideways")
