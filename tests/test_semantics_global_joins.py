"""Stream–global table joins on the test driver, with the inputs and outputs of Kafka Streams'
KStreamGlobalKTableJoinTest and KStreamGlobalKTableLeftJoinTest: the stream record's value
names the global key (``X0,FKey0``; no second token: a null foreign key), table updates emit
nothing, a tombstone removes the row, a null foreign key skips the record (counted), and a
null-key record still joins by its foreign key. Then what makes a global table global: no
co-partitioning, any number of partitions, a store readable whole, and the declarations the
builder refuses."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from pystreams.topology.describe import describe
from pystreams.topology.errors import InvalidNameError, MissingSourceError, TopologyError

from pystreams import App, JoinWindow, serdes
from pystreams.testing import TopologyTestDriver

EXPECTED_KEYS = (0, 1, 2, 3)


def foreign_key(key: Any, value: str) -> str | None:
    tokens = value.split(",")
    return tokens[1] if len(tokens) > 1 else None


def to_string_joiner(key: Any, value: str, row: str | None) -> str:
    return f"{value}+{'null' if row is None else row}"


def join_app(how: str, *, global_partitions_topic: str = "global-table") -> App:
    app = App("global-join")
    stream = app.topic("stream", key=serdes.Int(), value=serdes.Text())
    table = app.global_table(global_partitions_topic, key=serdes.Text(), value=serdes.Text())
    stream.join(table, to_string_joiner, foreign_key=foreign_key, how=how, value=serdes.Text(), name="joined").to("output")
    return app


class Harness:
    """Kafka's test's helpers: both input topics auto-advance by 1 ms from 0."""

    def __init__(self, driver: TopologyTestDriver) -> None:
        self.driver = driver
        self.stream = driver.input_topic("stream", auto_advance_ms=1)
        self.table = driver.input_topic("global-table", auto_advance_ms=1)
        self.output = driver.output_topic("output")

    def push_to_stream(self, count: int, prefix: str, *, with_foreign_key: bool, null_key_first: bool = False) -> None:
        for i in range(count):
            value = f"{prefix}{EXPECTED_KEYS[i]}" + (f",FKey{EXPECTED_KEYS[i]}" if with_foreign_key else "")
            key = None if null_key_first and i == 0 else EXPECTED_KEYS[i]
            self.stream.pipe_input(key, value)

    def push_to_table(self, count: int, prefix: str) -> None:
        for i in range(count):
            self.table.pipe_input(f"FKey{EXPECTED_KEYS[i]}", f"{prefix}{EXPECTED_KEYS[i]}")

    def push_deletes_to_table(self, count: int) -> None:
        for i in range(count):
            self.table.pipe_input(f"FKey{EXPECTED_KEYS[i]}", None)

    def results(self) -> list[tuple[Any, str, int]]:
        return [(r.key, r.value, r.timestamp) for r in self.output.read_records()]


@pytest.fixture(params=["inner", "left"])
def how(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def harness(how: str) -> Iterator[Harness]:
    with TopologyTestDriver(join_app(how)) as driver:
        yield Harness(driver)


def test_an_empty_global_table_joins_nothing_inner_and_everything_with_null_left(harness: Harness, how: str) -> None:
    harness.push_to_stream(2, "X", with_foreign_key=True)
    expected = [(0, "X0,FKey0+null", 0), (1, "X1,FKey1+null", 1)] if how == "left" else []
    assert harness.results() == expected


def test_global_table_updates_emit_nothing_and_later_records_see_them(harness: Harness, how: str) -> None:
    harness.push_to_stream(2, "X", with_foreign_key=True)
    harness.results()
    harness.push_to_table(2, "Y")
    assert harness.results() == []
    harness.push_to_stream(4, "X", with_foreign_key=True)
    joined = [(0, "X0,FKey0+Y0", 2), (1, "X1,FKey1+Y1", 3)]
    assert harness.results() == (joined + [(2, "X2,FKey2+null", 4), (3, "X3,FKey3+null", 5)] if how == "left" else joined)
    harness.push_to_table(4, "YY")
    assert harness.results() == []
    harness.push_to_stream(4, "X", with_foreign_key=True)
    assert harness.results() == [(0, "X0,FKey0+YY0", 6), (1, "X1,FKey1+YY1", 7), (2, "X2,FKey2+YY2", 8), (3, "X3,FKey3+YY3", 9)]


def test_a_tombstone_removes_the_global_row(harness: Harness, how: str) -> None:
    harness.push_to_table(4, "Y")
    harness.push_to_stream(4, "X", with_foreign_key=True)
    assert [v for _, v, _ in harness.results()] == ["X0,FKey0+Y0", "X1,FKey1+Y1", "X2,FKey2+Y2", "X3,FKey3+Y3"]
    harness.push_deletes_to_table(2)
    assert harness.results() == []
    harness.push_to_stream(4, "XX", with_foreign_key=True)
    kept = [(2, "XX2,FKey2+Y2", 6), (3, "XX3,FKey3+Y3", 7)]
    assert harness.results() == ([(0, "XX0,FKey0+null", 4), (1, "XX1,FKey1+null", 5)] + kept if how == "left" else kept)
    assert harness.driver.store_contents("global-table") == {"FKey2": "Y2", "FKey3": "Y3"}


def test_a_null_foreign_key_skips_the_record_and_counts_it(harness: Harness) -> None:
    harness.push_to_table(4, "Y")
    harness.push_to_stream(4, "XXX", with_foreign_key=False)
    assert harness.results() == []
    assert harness.driver.null_keys_dropped == 4


def test_a_null_key_record_joins_by_its_foreign_key(harness: Harness, how: str) -> None:
    harness.push_to_table(2 if how == "inner" else 4, "Y")
    harness.push_to_stream(4, "X", with_foreign_key=True, null_key_first=True)
    if how == "inner":
        assert harness.results() == [(None, "X0,FKey0+Y0", 0), (1, "X1,FKey1+Y1", 1)]
    else:
        assert harness.results() == [(None, "X0,FKey0+Y0", 0), (1, "X1,FKey1+Y1", 1), (2, "X2,FKey2+Y2", 2), (3, "X3,FKey3+Y3", 3)]


def test_a_left_join_joins_a_null_key_record_without_foreign_key_with_none_but_an_inner_join_skips_it(how: str) -> None:
    with TopologyTestDriver(join_app(how)) as driver:
        harness = Harness(driver)
        harness.stream.pipe_input(None, "X0")
        assert harness.results() == ([(None, "X0+null", 0)] if how == "left" else [])
        assert driver.null_keys_dropped == (0 if how == "left" else 1)


def test_without_a_foreign_key_the_record_key_is_looked_up() -> None:
    app = App("global-join-by-key")
    stream = app.topic("orders")
    rates = app.global_table("rates", value=serdes.Json())
    stream.join(rates, lambda key, order, rate: order["amount"] * rate, value=serdes.Json()).to("converted")
    with TopologyTestDriver(app) as driver:
        driver.input_topic("rates").pipe_input("EUR", 2.0)
        driver.input_topic("orders").pipe_input("EUR", {"amount": 3})
        driver.input_topic("orders").pipe_input("USD", {"amount": 5})
        assert driver.output_topic("converted").read_key_values() == [("EUR", 6.0)]


def test_a_global_topic_of_several_partitions_is_whole_in_every_task() -> None:
    """Orders on 4 partitions (4 tasks) all see customers written to any of the global
    topic's 3 partitions: no co-partitioning, no repartition."""
    app = App("global-everywhere")
    orders = app.topic("orders")
    customers = app.global_table("customers")
    orders.join(customers, lambda key, order, customer: customer["city"], foreign_key=lambda key, order: order["customer"], value=serdes.Text()).to("cities")
    topology = app.topology()
    assert topology.copartition_groups == ()
    assert topology.repartition_topics == ()
    with TopologyTestDriver(app, partitions={"orders": 4, "customers": 3}) as driver:
        customer_topic = driver.input_topic("customers")
        for n in range(6):
            customer_topic.pipe_input(f"c{n}", {"city": f"city-{n}"})
        order_topic = driver.input_topic("orders")
        for n in range(24):
            order_topic.pipe_input(f"o{n}", {"customer": f"c{n % 6}"})
        assert sorted(driver.output_topic("cities").read_key_values()) == sorted((f"o{n}", f"city-{n % 6}") for n in range(24))
        assert driver.store("customers").get("c3") == {"city": "city-3"}


def test_a_global_table_is_listed_apart_and_changes_the_topology_hash() -> None:
    with_global = join_app("left").topology()
    assert "Global tables" in describe(with_global)
    assert "left join with global table 'global-table'" in describe(with_global)
    other_topic = join_app("left", global_partitions_topic="other-global").topology()
    assert with_global.hash != other_topic.hash
    assert with_global.global_topics == ("global-table",)
    assert "global-table" not in with_global.external_source_topics


def test_declarations_the_builder_refuses() -> None:
    app = App("bad-globals")
    stream = app.topic("orders")
    table = app.global_table("customers")
    with pytest.raises(InvalidNameError, match="already read"):
        app.global_table("orders")
    with pytest.raises(InvalidNameError, match="already read"):
        app.topic("customers")
    with pytest.raises(InvalidNameError, match="taken"):
        app.global_table("other", store="customers")
    with pytest.raises(TopologyError, match="inner or left, not outer"):
        stream.join(table, to_string_joiner, how="outer")
    with pytest.raises(TopologyError, match="takes no window"):
        stream.join(table, to_string_joiner, window=JoinWindow(1000))
    with pytest.raises(MissingSourceError, match="belongs to app"):
        App("another").topic("x").join(table, to_string_joiner)
    pattern_app = App("pattern-global")
    pattern_app.topic(pattern="cust.*", name="any")
    pattern_app.global_table("customers")
    with pytest.raises(InvalidNameError, match="source 'any' reads too"):
        pattern_app.topology()


def test_a_global_row_that_cannot_be_read_goes_through_the_processing_error_policy() -> None:
    """The table keeps the topic's bytes as written: a row its value serde cannot read fails
    the lookup that reads it, which the app's processing policy handles, naming the join."""
    from pystreams.worker import RecordProcessingError

    for policy in ("fail", "log-and-continue"):
        with TopologyTestDriver(join_app("left"), processing_errors=policy) as driver:
            harness = Harness(driver)
            driver.pipe_input("global-table", b"FKey0", b"\xff\xfe not utf-8", 0)
            if policy == "fail":
                with pytest.raises(RecordProcessingError, match="joined"):
                    harness.push_to_stream(1, "X", with_foreign_key=True)
                continue
            harness.push_to_stream(2, "X", with_foreign_key=True)
            assert harness.results() == [(1, "X1,FKey1+null", 1)]
            assert [failure.node for failure in driver.failures] == ["joined"]
