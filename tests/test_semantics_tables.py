"""Per-kind semantics of tables and aggregations (count, aggregate, reduce, table sources),
on the worker's kernels through the test driver."""

from __future__ import annotations

from typing import Any

import pytest

from pystreams import serdes
from pystreams.app import App
from pystreams.testing import TopologyTestDriver


def test_aggregate_from_a_mutable_initial_gives_every_key_its_own_accumulator() -> None:
    # The bug this rule fixes: the worker handed the same list to every new key, so key b
    # started with key a's items.
    app = App("lists")
    events = app.topic("in", value=serdes.Text())

    @app.aggregate(events, initial=[], store="seen", value=serdes.Json())
    def seen(items: list[str], key: str, value: str) -> list[str]:
        items.append(value)  # changes the accumulator in place
        return items

    seen.to("out")
    with TopologyTestDriver(app) as driver:
        source = driver.input_topic("in")
        for key, value in (("a", "a1"), ("b", "b1"), ("a", "a2"), ("c", "c1")):
            source.pipe_input(key, value, timestamp=1)
        assert driver.output_topic("out").read_table() == {"a": ["a1", "a2"], "b": ["b1"], "c": ["c1"]}
    assert seen.node.initial == []  # the declared initial itself is never changed


def test_a_callable_initial_is_called_for_every_new_key() -> None:
    calls = []

    def fresh() -> dict[str, int]:
        calls.append(1)
        return {"n": 0}

    app = App("initializer")
    events = app.topic("in", value=serdes.Int())

    @app.aggregate(events, initial=fresh, value=serdes.Json())
    def total(acc: dict[str, int], key: str, value: int) -> dict[str, int]:
        acc["n"] += value
        return acc

    total.to("out")
    with TopologyTestDriver(app) as driver:
        source = driver.input_topic("in")
        for key, value in (("a", 1), ("b", 10), ("a", 2)):
            source.pipe_input(key, value, timestamp=1)
        assert driver.output_topic("out").read_table() == {"a": {"n": 3}, "b": {"n": 10}}
    assert len(calls) == 2


def test_count_and_reduce_skip_null_keys_and_values_and_forward_each_update() -> None:
    app = App("count-reduce")
    events = app.topic("in", value=serdes.Json(type=int))
    events.count(store="counts").to("counts")
    events.reduce(lambda acc, key, value: max(acc, value), store="maxima", name="maxima").to("maxima")
    with TopologyTestDriver(app) as driver:
        source = driver.input_topic("in")
        for key, value in (("a", 3), (None, 5), ("a", None), ("a", 7), ("b", 1), ("a", 2)):
            source.pipe_input(key, value, timestamp=1)
        assert driver.output_topic("counts").read_key_values() == [("a", 1), ("a", 2), ("b", 1), ("a", 3)]
        assert driver.output_topic("maxima").read_key_values() == [("a", 3), ("a", 7), ("b", 1), ("a", 7)]
        assert driver.store_contents("counts") == {"a": 3, "b": 1}


def test_a_table_source_upserts_deletes_on_null_and_ignores_null_keys() -> None:
    app = App("table")
    prices = app.table("in", store="prices", value=serdes.Int())
    prices.to_stream(name="updates").to("updates")
    with TopologyTestDriver(app) as driver:
        source = driver.input_topic("in")
        for key, value in (("a", 1), ("b", 2), (None, 3), ("a", 4), ("b", None)):
            source.pipe_input(key, value, timestamp=1)
        assert driver.store_contents("prices") == {"a": 4}
        # The update stream carries the delete as a tombstone.
        assert driver.output_topic("updates").read_key_values() == [("a", 1), ("b", 2), ("a", 4), ("b", None)]


def test_updates_of_one_input_record_fold_into_one_table_record_per_key() -> None:
    app = App("fold")
    lines = app.topic("in", value=serdes.Text())
    words = lines.flat_map(lambda key, line: [(w, 1) for w in line.split()], name="words")
    words.count(store="counts").to("counts")
    with TopologyTestDriver(app) as driver:
        driver.input_topic("in").pipe_input(None, "x x x y", timestamp=1)
        records = driver.output_topic("counts").read_key_values()
    assert sorted(records) == [("x", 3), ("y", 1)]


def test_an_aggregator_returning_none_deletes_the_key() -> None:
    app = App("deleting")
    events = app.topic("in", value=serdes.Int())

    @app.aggregate(events, initial=0)
    def running(total: int, key: Any, value: int) -> int | None:
        return None if value < 0 else total + value

    running.to("out")
    with TopologyTestDriver(app) as driver:
        source = driver.input_topic("in")
        for key, value in (("a", 1), ("a", -1), ("a", 5)):
            source.pipe_input(key, value, timestamp=1)
        assert driver.output_topic("out").read_key_values() == [("a", 1), ("a", None), ("a", 5)]


def test_an_aggregate_whose_accumulator_outgrows_its_inferred_serde_says_so_and_what_to_pass() -> None:
    """``initial=0`` picks Int(); a float accumulator cannot be stored in it. The error names
    the node, where the serde came from and what to pass instead; ``value=`` fixes it."""
    for value_serde in (None, serdes.Json()):
        app = App("averages")
        readings = app.topic("in", value=serdes.Json())

        @app.aggregate(readings, initial=0, value=value_serde)
        def total(acc: float, key: str, value: float) -> float:
            return acc + value

        with TopologyTestDriver(app) as driver:
            if value_serde is None:
                with pytest.raises(Exception, match=r"total.*inferred from initial=0; pass value="):
                    driver.input_topic("in").pipe_input("a", 1.5, timestamp=1)
            else:
                driver.input_topic("in").pipe_input("a", 1.5, timestamp=1)
                assert driver.store_contents("total") == {"a": 1.5}


def test_tables_aggregations_and_joins_count_the_null_keys_they_skip() -> None:
    """Kafka Streams skips a record with a null key in a table, an aggregation or a join, logs
    it and counts it in its dropped-records metric."""
    app = App("null-keys")
    table = app.table("rows", value=serdes.Int())
    events = app.topic("events", value=serdes.Int())
    events.count(store="counts")
    events.join(table, lambda key, value, row: value + row, value=serdes.Int()).to("joined")
    table.group_by(lambda key, value: (key, value), value=serdes.Int()).count(store="groups")
    with TopologyTestDriver(app) as driver:
        driver.input_topic("rows").pipe_input(None, 1, timestamp=1)  # the table skips it
        driver.input_topic("events").pipe_input(None, 2, timestamp=1)  # the count and the join skip it
        driver.input_topic("events").pipe_input("a", None, timestamp=1)  # a null value is no null key
        assert driver.null_keys_dropped == 3
        assert driver.store_contents("counts") == {} and driver.store_contents("groups") == {}
