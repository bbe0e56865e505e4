"""A table's ``group_by`` and its grouped ``count`` / ``reduce`` / ``aggregate`` (Kafka Streams'
KGroupedTable), with the outputs of its KTableAggregateTest for the same inputs, on the
worker's kernels through the test driver."""

from __future__ import annotations

from typing import Any

import pytest

from pystreams import serdes
from pystreams.app import App, GroupedTable
from pystreams.testing import TopologyTestDriver


def _add(acc: str, key: Any, value: str) -> str:
    return f"{acc}+{value}"


def _subtract(acc: str, key: Any, value: str) -> str:
    return f"{acc}-{value}"


def _outputs(app: App, updates: list[tuple[str, str | None, int]]) -> list[tuple[Any, Any]]:
    with TopologyTestDriver(app) as driver:
        source = driver.input_topic("in")
        for key, value, timestamp in updates:
            source.pipe_input(key, value, timestamp=timestamp)
        return driver.output_topic("out").read_key_values()


def test_an_update_within_its_group_subtracts_the_old_value_and_adds_the_new_in_one_result() -> None:
    app = App("same-key")
    table = app.table("in", value=serdes.Text())
    grouped = table.group_by(lambda key, value: (key, value), value=serdes.Text())
    assert isinstance(grouped, GroupedTable)
    grouped.aggregate("0", _add, _subtract, value=serdes.Text()).to_stream().to("out")
    updates = [("A", "1", 10), ("B", "2", 15), ("A", "3", 20), ("B", "4", 18), ("C", "5", 5), ("D", "6", 25), ("B", "7", 15), ("C", "8", 10)]
    assert _outputs(app, updates) == [
        ("A", "0+1"),
        ("B", "0+2"),
        ("A", "0+1-1+3"),
        ("B", "0+2-2+4"),
        ("C", "0+5"),
        ("D", "0+6"),
        ("B", "0+2-2+4-4+7"),
        ("C", "0+5-5+8"),
    ]


def test_a_row_that_changes_group_leaves_the_old_one_first_and_a_tombstone_only_leaves() -> None:
    app = App("key-changes")
    table = app.table("in", value=serdes.Text())

    @app.group_by(table, value=serdes.Text())
    def by_value(key: str, value: str) -> tuple[str, str]:
        return value, value

    @app.aggregate(by_value, initial="0", subtractor=_subtract, value=serdes.Text())
    def joined(acc: str, key: str, value: str) -> str:
        return _add(acc, key, value)

    joined.to_stream().to("out")
    updates = [("A", "1", 10), ("A", None, 15), ("A", "1", 12), ("B", "2", 20), ("B", "4", 23), ("B", "7", 22)]
    assert _outputs(app, updates) == [
        ("1", "0+1"),
        ("1", "0+1-1"),
        ("1", "0+1-1+1"),
        ("2", "0+2"),
        ("2", "0+2-2"),
        ("4", "0+4"),
        ("4", "0+4-4"),
        ("7", "0+7"),
    ]


def test_count_by_value_moves_rows_between_groups_and_keeps_empty_groups_at_zero() -> None:
    app = App("count-by-colour")
    table = app.table("in", value=serdes.Text())
    counts = table.group_by(lambda key, colour: (colour, key), value=serdes.Text()).count(store="per-colour")
    counts.to_stream().to("out")
    with TopologyTestDriver(app) as driver:
        source = driver.input_topic("in")
        for key, colour in (("A", "green"), ("B", "green"), ("A", "blue"), ("C", "yellow"), ("D", "green")):
            source.pipe_input(key, colour, timestamp=1)
        assert driver.output_topic("out").read_key_values() == [
            ("green", 1),
            ("green", 2),
            ("green", 1),
            ("blue", 1),
            ("yellow", 1),
            ("green", 2),
        ]
        source.pipe_input("C", None, timestamp=2)
        assert driver.output_topic("out").read_key_values() == [("yellow", 0)]
        assert driver.store_contents("per-colour") == {"green": 2, "blue": 1, "yellow": 0}


def test_reduce_starts_a_group_from_its_first_value_and_again_once_the_subtractor_empties_it() -> None:
    app = App("reduce-grouped")
    table = app.table("in", value=serdes.Int())

    def subtract(total: int, key: str, value: int) -> int | None:
        return None if total == value else total - value

    table.group_by(lambda key, value: (key[0], value), value=serdes.Int()).reduce(
        lambda total, key, value: total + value, subtract, store="totals"
    ).to_stream().to("out")
    with TopologyTestDriver(app) as driver:
        source = driver.input_topic("in")
        for key, value in (("a1", 5), ("a2", 7), ("a1", None), ("a2", None), ("a3", 4)):
            source.pipe_input(key, value, timestamp=1)
        assert driver.output_topic("out").read_key_values() == [("a", 5), ("a", 12), ("a", 7), ("a", None), ("a", 4)]
        assert driver.store_contents("totals") == {"a": 4}


def test_a_selector_answering_none_groups_nothing_and_a_wrong_answer_is_the_nodes_error() -> None:
    app = App("selector")
    table = app.table("in", value=serdes.Json())
    table.group_by(
        lambda key, value: None if value == "skip" else (value.get("k"), 1) if isinstance(value, dict) else value, name="select"
    ).count().to_stream().to("out")
    with TopologyTestDriver(app) as driver:
        source = driver.input_topic("in")
        source.pipe_input("a", "skip", timestamp=1)
        source.pipe_input("b", {"k": None}, timestamp=1)  # a null group key: no group
        source.pipe_input("c", {"k": "x"}, timestamp=1)
        assert driver.output_topic("out").read_key_values() == [("x", 1)]
        with pytest.raises(Exception, match="select.*group_by must return a \\(key, value\\) tuple"):
            source.pipe_input("d", "xy", timestamp=1)


def test_grouped_table_aggregations_need_a_subtractor_and_take_no_windows() -> None:
    app = App("grouped-errors")
    grouped = app.table("in", value=serdes.Int()).group_by(lambda key, value: (key, value), value=serdes.Int())
    with pytest.raises(TypeError, match="needs subtractor="):
        app.reduce(grouped)(lambda acc, key, value: acc + value)
    with pytest.raises(TypeError, match="no window="):
        app.count(grouped, emit="final")
    events = app.topic("events")
    with pytest.raises(TypeError, match="subtractor= is for a grouped table"):
        app.aggregate(events, initial=0, subtractor=lambda acc, key, value: acc)(lambda acc, key, value: acc)


def test_spark_runs_a_grouped_table_as_two_queries_chained_through_its_repartition_topic() -> None:
    from pystreams.spark import compile_topology

    app = App("spark-grouped")
    app.table("in", value=serdes.Int()).group_by(lambda key, value: (key, value), value=serdes.Int(), name="regroup").count().to_stream().to("out")
    topology = app.topology()
    regroup, count = compile_topology(topology).chained
    (repartition,) = topology.repartition_topics
    assert (regroup.topics, regroup.writes, count.topics, count.writes) == (("in",), (repartition,), (repartition,), ("out",))


def test_a_grouped_aggregate_keeps_its_accumulator_in_the_app_default_serde_not_the_grouped_values() -> None:
    app = App("grouped-lists")
    table = app.table("in", value=serdes.Json())
    grouped = table.group_by(lambda key, row: (row["g"], row["n"]), value=serdes.Int())
    grouped.aggregate(list, lambda acc, key, n: [*acc, n], lambda acc, key, n: [x for x in acc if x != n], store="members")
    with TopologyTestDriver(app) as driver:
        source = driver.input_topic("in")
        source.pipe_input("a", {"g": "x", "n": 1}, timestamp=1)
        source.pipe_input("b", {"g": "x", "n": 2}, timestamp=1)
        source.pipe_input("a", {"g": "y", "n": 1}, timestamp=2)
        assert driver.store_contents("members") == {"x": [2], "y": [1]}
