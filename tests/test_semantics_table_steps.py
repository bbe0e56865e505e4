"""A table's row-by-row steps — ``filter``, ``filter_not``, ``map_values`` — with Kafka Streams'
outputs (its KTableFilterTest / KTableMapValuesTest inputs), computed on read or materialized,
on the worker's kernels through the test driver."""

from __future__ import annotations

from typing import Any

import pytest
from pystreams.topology.errors import TopologyError

from pystreams import serdes
from pystreams.app import App, TumblingWindow
from pystreams.spark import compile_topology
from pystreams.testing import TopologyTestDriver

#: KTableFilterTest's input: (key, value, timestamp); None deletes.
UPDATES = [("A", 1, 10), ("B", 2, 5), ("C", 3, 8), ("D", 4, 14), ("A", None, 18), ("B", None, 15)]


def _even(key: str, value: int) -> bool:
    return value % 2 == 0


def _run(app: App, out: str = "out") -> list[tuple[Any, Any, int]]:
    with TopologyTestDriver(app) as driver:
        source = driver.input_topic("in")
        for key, value, timestamp in UPDATES:
            source.pipe_input(key, value, timestamp=timestamp)
        return [(r.key, r.value, r.timestamp) for r in driver.output_topic(out).read_records()]


def test_a_filter_computed_on_read_sends_a_tombstone_for_every_row_it_drops() -> None:
    """Kafka Streams without old values: it cannot know whether the key was there."""
    app = App("filter")
    table = app.table("in", value=serdes.Int())
    table.filter(_even).to_stream().to("out")
    assert _run(app) == [("A", None, 10), ("B", 2, 5), ("C", None, 8), ("D", 4, 14), ("A", None, 18), ("B", None, 15)]


def test_filter_not_keeps_the_rows_the_predicate_is_false_for() -> None:
    app = App("filter-not")
    table = app.table("in", value=serdes.Int())
    table.filter_not(_even).to_stream().to("out")
    assert _run(app) == [("A", 1, 10), ("B", None, 5), ("C", 3, 8), ("D", None, 14), ("A", None, 18), ("B", None, 15)]


def test_a_materialized_filter_keeps_its_rows_and_sends_tombstones_only_for_keys_it_held() -> None:
    """Kafka Streams' materialized (cached) filter: no old value, no new value, nothing sent."""
    app = App("filter-materialized")
    table = app.table("in", value=serdes.Int())
    evens = table.filter(_even, store="evens")
    assert evens.store == "evens"
    evens.to_stream().to("out")
    with TopologyTestDriver(app) as driver:
        source = driver.input_topic("in")
        for key, value, timestamp in UPDATES[:4]:
            source.pipe_input(key, value, timestamp=timestamp)
        assert driver.store_contents("evens") == {"B": 2, "D": 4}
        for key, value, timestamp in UPDATES[4:]:
            source.pipe_input(key, value, timestamp=timestamp)
        assert driver.store_contents("evens") == {"D": 4}
        assert [(r.key, r.value, r.timestamp) for r in driver.output_topic("out").read_records()] == [("B", 2, 5), ("D", 4, 14), ("B", None, 15)]


def test_a_row_that_stops_passing_the_filter_becomes_a_tombstone() -> None:
    app = App("filter-update")
    table = app.table("in", value=serdes.Int())
    table.filter(_even, store="evens").to_stream().to("out")
    with TopologyTestDriver(app) as driver:
        source = driver.input_topic("in")
        for key, value in (("A", 2), ("A", 4), ("A", 5), ("A", 7), ("A", 8)):
            source.pipe_input(key, value, timestamp=1)
        assert driver.output_topic("out").read_key_values() == [("A", 2), ("A", 4), ("A", None), ("A", 8)]


@pytest.mark.parametrize("store", [None, "lengths"])
def test_map_values_maps_rows_and_passes_tombstones_without_calling_the_function(store: str | None) -> None:
    calls: list[Any] = []

    def length(key: str, value: str) -> int:
        calls.append(value)
        return len(value)

    app = App("map-values")
    table = app.table("in", value=serdes.Text())
    lengths = table.map_values(length, value=serdes.Int(), store=store)
    assert lengths.store == store
    lengths.to_stream().to("out")
    with TopologyTestDriver(app) as driver:
        source = driver.input_topic("in")
        for key, value in (("A", "01"), ("B", "02345"), ("A", None), ("B", "6")):
            source.pipe_input(key, value, timestamp=1)
        assert driver.output_topic("out").read_key_values() == [("A", 2), ("B", 5), ("A", None), ("B", 1)]
        if store is not None:
            assert driver.store_contents("lengths") == {"B": 1}
    assert calls == ["01", "02345", "6"]


@pytest.mark.parametrize("store", [None, "rich"])
def test_a_stream_table_join_reads_a_filtered_mapped_table_as_its_rows_are(store: str | None) -> None:
    """Computed on read, a lookup runs the parent's row through the steps (Kafka Streams'
    value getters); materialized, it reads the step's store. Either way the same answers."""
    app = App("join-view")
    balances = app.table("balances", value=serdes.Int())
    rich = balances.filter(lambda key, value: value >= 100, name="rich").map_values(lambda key, value: f"{key}:{value}", value=serdes.Text(), store=store)
    orders = app.topic("orders", value=serdes.Text())
    orders.join(rich, lambda key, order, row: f"{order}/{row}", how="left", value=serdes.Text()).to("out")
    with TopologyTestDriver(app) as driver:
        table, stream = driver.input_topic("balances"), driver.input_topic("orders")
        table.pipe_input("ann", 500, timestamp=1)
        table.pipe_input("bob", 50, timestamp=1)
        stream.pipe_input("ann", "o1", timestamp=2)
        stream.pipe_input("bob", "o2", timestamp=2)
        table.pipe_input("ann", 20, timestamp=3)
        stream.pipe_input("ann", "o3", timestamp=4)
        assert driver.output_topic("out").read_key_values() == [("ann", "o1/ann:500"), ("bob", "o2/None"), ("ann", "o3/None")]


def test_table_steps_are_queryable_only_when_materialized() -> None:
    app = App("queryable")
    table = app.table("in", value=serdes.Int())
    computed = table.filter(_even, name="computed")
    kept = table.filter(_even, store="kept")
    topology = app.topology()
    assert computed.store is None and "computed" not in topology.stores
    assert kept.store == "kept" and topology.stores["kept"].owner == kept.name and topology.stores["kept"].changelog_topic


def test_a_stream_filter_not_drops_what_the_predicate_is_true_for() -> None:
    app = App("stream-filter-not")
    events = app.topic("in", value=serdes.Int())
    events.filter_not(_even).to("out")
    with TopologyTestDriver(app) as driver:
        for key, value in (("a", 1), ("b", 2), ("c", 3)):
            driver.input_topic("in").pipe_input(key, value, timestamp=1)
        assert driver.output_topic("out").read_key_values() == [("a", 1), ("c", 3)]


def test_table_steps_say_what_they_cannot_do() -> None:
    app = App("errors")
    table = app.table("in", value=serdes.Int())
    events = app.topic("events", value=serdes.Int())
    with pytest.raises(TypeError, match="store= materializes a table"):
        events.filter(_even, store="nope")
    windowed = events.count(window=TumblingWindow(size=1000), name="per-second")
    with pytest.raises(TopologyError, match="windowed table 'per-second'"):
        windowed.filter(lambda key, value: value > 1, store="busy")
    busy = windowed.filter(lambda key, value: value > 1, name="busy")
    assert busy.windowed and busy.store is None
    with pytest.raises(TopologyError, match="windowed table"):
        events.join(busy, lambda key, value, row: value)
    assert table.filter(_even).windowed is False


def test_spark_runs_a_table_step_computed_on_read_in_one_query_per_sink_and_a_materialized_one_per_task() -> None:
    computed = App("spark-table-steps")
    computed.table("in", value=serdes.Int()).filter(_even, name="evens").to_stream().to("out")
    assert {sink.topic for sink in compile_topology(computed.topology()).sinks} == {"out"}
    materialized = App("spark-table-steps-kept")
    materialized.table("in", value=serdes.Int()).filter(_even, name="evens", store="evens").to_stream().to("out")
    (query,) = compile_topology(materialized.topology()).chained
    assert "evens" in {store.name for store in query.step.stores}


def test_a_filter_of_a_windowed_table_is_still_windowed_for_suppress() -> None:
    from pystreams import until_window_closes

    app = App("suppress-filtered")
    events = app.topic("in", value=serdes.Int())
    busy = events.count(window=TumblingWindow(size=10), name="per-10").filter(lambda window, count: count > 1, name="busy")
    busy.suppress(until_window_closes(), name="final-busy").to_stream().to("out")
    with TopologyTestDriver(app) as driver:
        for timestamp in (1, 2, 3, 12):
            driver.input_topic("in").pipe_input("k", 1, timestamp=timestamp)
        assert [(key.start_ms, count) for key, count in driver.output_topic("out").read_key_values()] == [(0, 3)]
