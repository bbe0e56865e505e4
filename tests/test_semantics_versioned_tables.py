"""Versioned tables (KIP-889/914) and the stream–table join's grace period (KIP-923) on the
test driver: a stream record joins the table's value as of its own timestamp, out-of-order
table updates included; updates older than the history retention are dropped (counted as
late); the table emits only updates of its current value; and a join with a grace period
holds records until stream time is the grace past them, with the inputs and outputs of Kafka
Streams' KStreamKTableJoinTest (shouldDelayJoinByGracePeriod, shouldHandleLateJoinsWithGracePeriod)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from pystreams.state import VersionedPut
from pystreams.state.versioned_store import put_version, version_as_of
from pystreams.topology.errors import TopologyError

from pystreams import App, serdes
from pystreams.testing import TopologyTestDriver


def versioned_app(how: str = "left", history: int = 100, grace: int | None = None) -> App:
    app = App("versioned")
    stream = app.topic("stream", key=serdes.Int(), value=serdes.Text())
    table = app.table("table", key=serdes.Int(), value=serdes.Text(), versioned=history)
    options: dict[str, Any] = {} if grace is None else {"grace": grace}
    stream.join(table, lambda key, value, row: f"{value}+{'null' if row is None else row}", how=how, value=serdes.Text(), name="joined", **options).to("out")
    table.to_stream().to("table-updates")
    return app


@pytest.fixture
def driver() -> Iterator[TopologyTestDriver]:
    with TopologyTestDriver(versioned_app()) as running:
        yield running


def results(driver: TopologyTestDriver, topic: str = "out") -> list[tuple[Any, Any, int]]:
    return [(r.key, r.value, r.timestamp) for r in driver.output_topic(topic).read_records()]


def test_a_stream_record_joins_the_value_as_of_its_timestamp_out_of_order_updates_included(driver: TopologyTestDriver) -> None:
    table, stream = driver.input_topic("table"), driver.input_topic("stream")
    table.pipe_input(1, "A", timestamp=10)
    table.pipe_input(1, "B", timestamp=20)
    table.pipe_input(1, "C", timestamp=12)  # out of order: A's validity now ends at 12
    for timestamp in (5, 11, 13, 19, 25):
        stream.pipe_input(1, f"x{timestamp}", timestamp=timestamp)
    assert results(driver) == [(1, "x5+null", 5), (1, "x11+A", 11), (1, "x13+C", 13), (1, "x19+C", 19), (1, "x25+B", 25)]
    # The table's stream: each update of its current value, not the out-of-order C.
    assert results(driver, "table-updates") == [(1, "A", 10), (1, "B", 20)]
    assert driver.store("table").get(1) == "B"
    assert driver.store("table").get_as_of(1, 12) == "C"
    assert driver.store_contents("table") == {1: "B"}


def test_a_tombstone_is_a_version_too(driver: TopologyTestDriver) -> None:
    table, stream = driver.input_topic("table"), driver.input_topic("stream")
    table.pipe_input(1, "A", timestamp=10)
    table.pipe_input(1, None, timestamp=30)
    stream.pipe_input(1, "before", timestamp=20)
    stream.pipe_input(1, "after", timestamp=40)
    assert results(driver) == [(1, "before+A", 20), (1, "after+null", 40)]
    assert driver.store_contents("table") == {}


def test_an_update_older_than_the_history_retention_is_dropped_and_lookups_that_old_find_nothing(driver: TopologyTestDriver) -> None:
    table, stream = driver.input_topic("table"), driver.input_topic("stream")
    table.pipe_input(1, "A", timestamp=0)
    table.pipe_input(2, "OLD", timestamp=0)
    table.pipe_input(1, "B", timestamp=200)  # the table's stream time is 200; history 100
    table.pipe_input(1, "LATE", timestamp=50)  # older than 200 - 100: not put
    assert driver.late_records_dropped == 1
    stream.pipe_input(1, "x", timestamp=50)  # beyond the history: A is gone, B is not yet valid
    stream.pipe_input(2, "y", timestamp=50)  # key 2's latest version is that old: still found
    stream.pipe_input(1, "z", timestamp=150)  # within the history: A was valid until 200
    assert results(driver) == [(1, "x+null", 50), (2, "y+OLD", 50), (1, "z+A", 150)]
    assert results(driver, "table-updates") == [(1, "A", 0), (2, "OLD", 0), (1, "B", 200)]


def grace_harness(grace: int) -> TopologyTestDriver:
    return TopologyTestDriver(versioned_app(how="inner", history=5 * 60_000, grace=grace))


def push_to_table(driver: TopologyTestDriver, count: int, prefix: str) -> None:
    for key in range(count):
        driver.input_topic("table").pipe_input(key, f"{prefix}{key}", timestamp=0)


def push_to_stream(driver: TopologyTestDriver, count: int, prefix: str) -> None:
    for key in range(count):
        driver.input_topic("stream").pipe_input(key, f"{prefix}{key}", timestamp=key)


def test_kafka_should_delay_join_by_grace_period() -> None:
    with grace_harness(2) as driver:
        push_to_table(driver, 4, "Y")
        assert results(driver) == []
        push_to_stream(driver, 4, "X")
        assert results(driver) == [(0, "X0+Y0", 0), (1, "X1+Y1", 1)]
        push_to_table(driver, 4, "YY")
        assert results(driver) == []
        push_to_stream(driver, 4, "X")
        assert results(driver) == [(0, "X0+YY0", 0), (1, "X1+YY1", 1)]
        driver.input_topic("stream").pipe_input(5, "test", timestamp=7)
        assert results(driver) == [(2, "X2+YY2", 2), (2, "X2+YY2", 2), (3, "X3+YY3", 3), (3, "X3+YY3", 3)]
        push_to_table(driver, 4, "YYY")
        assert results(driver) == []


def test_kafka_should_handle_late_joins_with_grace_period() -> None:
    with grace_harness(2) as driver:
        push_to_table(driver, 4, "Y")
        push_to_stream(driver, 4, "X")
        assert results(driver) == [(0, "X0+Y0", 0), (1, "X1+Y1", 1)]
        push_to_stream(driver, 1, "X")  # too late to wait: joined at once, evicting nothing
        assert results(driver) == [(0, "X0+Y0", 0)]


def test_a_table_update_arriving_within_the_grace_period_still_counts() -> None:
    """What grace is for: the stream record at 10 waits; the table's value for 10 arrives at 12
    (out of order for the table); when stream time passes 10 + 5 the record joins it."""
    with TopologyTestDriver(versioned_app(how="inner", history=1000, grace=5)) as driver:
        table, stream = driver.input_topic("table"), driver.input_topic("stream")
        table.pipe_input(1, "old", timestamp=0)
        table.pipe_input(1, "newest", timestamp=20)
        stream.pipe_input(1, "order", timestamp=10)
        assert results(driver) == []
        table.pipe_input(1, "right-one", timestamp=9)  # late, but inside the history
        stream.pipe_input(2, "tick", timestamp=16)  # buffer stream time 16: 10 is due
        assert results(driver) == [(1, "order+right-one", 10)]


def test_the_builder_refuses_a_grace_it_cannot_honour() -> None:
    app = App("graceless")
    stream = app.topic("stream")
    plain = app.table("plain")
    with pytest.raises(TopologyError, match="needs a versioned table"):
        stream.join(plain, lambda k, v, r: v, grace=10)
    short = app.table("short", versioned=5)
    with pytest.raises(TopologyError, match="history must cover the grace"):
        stream.join(short, lambda k, v, r: v, grace=10, name="too-long")
    with pytest.raises(TypeError, match="versioned table"):
        stream.join(app.topic("other"), lambda k, left, right: left, grace=10)


def test_the_history_rules() -> None:
    history, outcome = put_version([], 10, b"A", None, 100)
    assert (history, outcome) == ([(10, b"A")], VersionedPut.LATEST)
    history, outcome = put_version(history, 5, b"early", 10, 100)
    assert (history, outcome) == ([(5, b"early"), (10, b"A")], VersionedPut.HISTORY)
    history, outcome = put_version(history, 10, b"A2", 10, 100)  # same timestamp: replaced
    assert history == [(5, b"early"), (10, b"A2")] and outcome is VersionedPut.LATEST
    assert put_version(history, -200, b"x", 10, 100)[1] is VersionedPut.NOT_PUT
    # A version whose successor starts before stream time - history is unreachable: pruned;
    # one still valid at that time is kept (a read at 200..299 finds A2).
    history, _ = put_version(history, 300, b"B", 10, 100)
    assert history == [(10, b"A2"), (300, b"B")]
    history, _ = put_version(history, 500, b"C", 300, 100)
    assert history == [(300, b"B"), (500, b"C")]
    assert version_as_of([(0, b"A"), (50, None), (60, b"C")], 55, 60, 100) is None
    assert version_as_of([(0, b"A"), (50, None), (60, b"C")], 49, 60, 100) == b"A"
    assert version_as_of([(0, b"A"), (500, b"B")], 100, 500, 100) is None  # beyond the history
    assert version_as_of([(0, b"A")], 100, 500, 100) == b"A"  # the latest version always answers
    # A key whose only version left is an unreachable tombstone is gone.
    assert put_version([(0, b"A")], 10, None, 1000, 100)[1] is VersionedPut.NOT_PUT
    assert put_version([(0, b"A")], 10, None, 10, 0) == ([], VersionedPut.LATEST)


def test_an_unreadable_history_is_a_clear_state_error() -> None:
    from pystreams.state import CacheLimits, InMemoryChangelog, StateError, TaskState

    with TaskState(None, "app", "0_0", 0, InMemoryChangelog()) as state:
        store = state.versioned_store("table", history_ms=10, cache_limits=CacheLimits())
        assert store.put_version(b"k", b"v", 5) is VersionedPut.LATEST
        store._write(b"\x01k", b"\xc1 garbage")  # what no writer of ours produces
        with pytest.raises(StateError, match="history of key b'k' is unreadable"):
            store.get(b"k")


def grace_app_with_sibling(joiner: Any) -> App:
    app = App("grace-siblings")
    stream = app.topic("stream", key=serdes.Int(), value=serdes.Text())
    table = app.table("table", key=serdes.Int(), value=serdes.Text(), versioned=1000)
    stream.join(table, joiner, how="left", value=serdes.Text(), name="joined", grace=10).to("out")
    stream.group_by_key().count(name="counted").to_stream().to("counts")
    return app


def test_an_evicted_record_joins_with_its_own_timestamp_and_headers_and_leaves_the_current_ones_alone() -> None:
    with TopologyTestDriver(grace_app_with_sibling(lambda key, value, row: f"{value}+{row}")) as driver:
        driver.pipe_input("stream", serdes.Int().serialize(1), b"a", 0, headers=[("h", b"first")])
        driver.pipe_input("stream", serdes.Int().serialize(2), b"b", 100, headers=[("h", b"second")])  # evicts a
        assert [(r.key, r.value, r.timestamp, r.headers) for r in driver.output_topic("out").read_records()] == [(1, "a+None", 0, (("h", b"first"),))]
        # The count of the evicting record, a sibling of the join, keeps that record's time.
        assert [(r.key, r.value, r.timestamp) for r in driver.output_topic("counts").read_records()] == [(1, 1, 0), (2, 1, 100)]


def test_a_joiner_failing_on_one_evicted_record_loses_none_of_the_others() -> None:
    def joiner(key: int, value: str, row: str | None) -> str:
        if value == "poison":
            raise ValueError("bad record")
        return f"{value}+{row}"

    with TopologyTestDriver(grace_app_with_sibling(joiner), processing_errors="log-and-continue") as driver:
        stream = driver.input_topic("stream")
        stream.pipe_input(1, "poison", timestamp=0)
        stream.pipe_input(2, "b", timestamp=1)
        stream.pipe_input(3, "c", timestamp=2)
        stream.pipe_input(4, "d", timestamp=100)  # 0, 1 and 2 are due: the first fails
        assert [(r.key, r.value) for r in driver.output_topic("out").read_records()] == [(2, "b+None"), (3, "c+None")]
        assert [failure.node for failure in driver.failures] == ["joined"]


def test_a_buffered_record_that_cannot_be_read_back_fails_alone() -> None:
    """A serde change across a deploy (or damage) makes one buffered value unreadable: that
    entry is reported, the others due with it still join."""

    class Picky(serdes.Serde):
        name = "picky"

        def _to_bytes(self, value: Any) -> bytes:
            return str(value).encode()

        def _from_bytes(self, data: bytes) -> Any:
            if data == b"unreadable":
                raise ValueError("cannot read")
            return data.decode()

    app = App("grace-unreadable")
    stream = app.topic("stream", key=serdes.Int(), value=serdes.Text()).map_values(lambda key, value: value, value=Picky(), name="picky")
    table = app.table("table", key=serdes.Int(), value=serdes.Text(), versioned=1000)
    stream.join(table, lambda key, value, row: f"{value}+{row}", how="left", value=serdes.Text(), name="joined", grace=10).to("out")
    with TopologyTestDriver(app, processing_errors="log-and-continue") as driver:
        source = driver.input_topic("stream")
        for key, value, timestamp in ((1, "unreadable", 0), (2, "b", 1), (3, "c", 2), (4, "trigger", 100)):
            source.pipe_input(key, value, timestamp=timestamp)
        assert [(r.key, r.value) for r in driver.output_topic("out").read_records()] == [(2, "b+None"), (3, "c+None")]
        assert [failure.node for failure in driver.failures] == ["joined"]
