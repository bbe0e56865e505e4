"""Sliding windows (KIP-450) on the test driver, against Kafka Streams' own outputs.

The inputs and expected outputs are those of Kafka Streams' ``KStreamSlidingWindowAggregateTest``
(emit on update, no cache): an aggregate of strings starting at ``"0"`` that appends ``"+"``
and the value. Kafka Streams forwards every window update; the driver folds the updates of one
input record per window, and a record updates a window at most once, so each window's
sequence of values is the same.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pystreams.topology.errors import TopologyError
from pystreams.topology.windows import Windowed

from pystreams import serdes
from pystreams.app import App, SlidingWindow
from pystreams.testing import TopologyTestDriver


def string_adder(total: str, key: str, value: str) -> str:
    return f"{total}+{value}"


def sliding_app(window: SlidingWindow, *, reduce: bool = False) -> App:
    app = App("sliding")
    events = app.topic("in", value=serdes.Text())
    if reduce:
        table = app.reduce(events, store="windows", window=window)(string_adder)
    else:
        table = app.aggregate(events, initial="0", store="windows", window=window)(string_adder)
    table.to("out")
    return app


def window_histories(
    app: App, records: list[tuple[str, str, int]], partitions: dict[str, int] | None = None
) -> tuple[dict[tuple[str, int, int], list[str]], int, TopologyTestDriver]:
    """Each window's values in the order they were emitted, the records dropped as late, and
    the (closed) driver for further looks."""
    histories: dict[tuple[str, int, int], list[str]] = defaultdict(list)
    with TopologyTestDriver(app, partitions=partitions) as driver:
        source = driver.input_topic("in")
        for key, value, timestamp in records:
            source.pipe_input(key, value, timestamp=timestamp)
        for record in driver.output_topic("out").read_records():
            windowed = record.key
            histories[(windowed.key, windowed.start_ms, windowed.end_ms)].append(record.value)
        dropped = driver.late_records_dropped
    return dict(histories), dropped, driver


def test_small_input_matches_kafka_streams() -> None:
    # testAggregateSmallInput: difference 10, grace 5, in order.
    records = [("A", "1", 10), ("A", "2", 10), ("A", "3", 14), ("A", "4", 15), ("A", "5", 20), ("A", "6", 22), ("A", "7", 30)]
    histories, dropped, _ = window_histories(sliding_app(SlidingWindow(difference=10, grace=5)), records)
    # Kafka Streams emits 0+1 then 0+1+2 for [0, 10]; two records at one timestamp are one
    # input each here too, so both values appear.
    assert {(start, end): values for (_, start, end), values in histories.items()} == {
        (0, 10): ["0+1", "0+1+2"],
        (4, 14): ["0+1+2+3"],
        (5, 15): ["0+1+2+3+4"],
        (10, 20): ["0+1+2+3+4+5"],
        (11, 21): ["0+3", "0+3+4", "0+3+4+5"],
        (12, 22): ["0+3+4+5+6"],
        (15, 25): ["0+4", "0+4+5", "0+4+5+6"],
        (16, 26): ["0+5", "0+5+6"],
        (20, 30): ["0+5+6+7"],
        (21, 31): ["0+6", "0+6+7"],
        (23, 33): ["0+7"],
    }
    assert dropped == 0


def test_reduce_matches_kafka_streams() -> None:
    # testReduceSmallInput: a reduce starts each window from its first value.
    records = [("A", "1", 10), ("A", "2", 14), ("A", "3", 15), ("A", "4", 22), ("A", "5", 26), ("A", "6", 30)]
    histories, _, _ = window_histories(sliding_app(SlidingWindow(difference=10, grace=5), reduce=True), records)
    assert {start: values for (_, start, _), values in histories.items()} == {
        0: ["1"],
        4: ["1+2"],
        5: ["1+2+3"],
        11: ["2", "2+3"],
        12: ["2+3+4"],
        15: ["3", "3+4"],
        16: ["4", "4+5"],
        20: ["4+5+6"],
        23: ["5", "5+6"],
        27: ["6"],
    }


def test_out_of_order_records_match_kafka_streams() -> None:
    # testAggregateLargeInput (grace 50, so nothing is late): out-of-order records update the
    # windows after them and create their own right windows from those windows' records.
    records = [
        ("A", "1", 10), ("A", "2", 20), ("A", "3", 22), ("A", "4", 15),
        ("B", "1", 12), ("B", "2", 13), ("B", "3", 18), ("B", "4", 19), ("B", "5", 25), ("B", "6", 14),
        ("C", "1", 11), ("C", "2", 15), ("C", "3", 16), ("C", "4", 21), ("C", "5", 23),
        ("D", "4", 11), ("D", "2", 12), ("D", "3", 29), ("D", "5", 16),
    ]  # fmt: skip
    histories, dropped, _ = window_histories(sliding_app(SlidingWindow(difference=10, grace=50)), records)
    assert histories == {
        ("A", 0, 10): ["0+1"],
        ("A", 5, 15): ["0+1+4"],
        ("A", 10, 20): ["0+1+2", "0+1+2+4"],
        ("A", 11, 21): ["0+2", "0+2+4"],
        ("A", 12, 22): ["0+2+3", "0+2+3+4"],
        ("A", 16, 26): ["0+2+3"],
        ("A", 21, 31): ["0+3"],
        ("B", 2, 12): ["0+1"],
        ("B", 3, 13): ["0+1+2"],
        ("B", 4, 14): ["0+1+2+6"],
        ("B", 8, 18): ["0+1+2+3", "0+1+2+3+6"],
        ("B", 9, 19): ["0+1+2+3+4", "0+1+2+3+4+6"],
        ("B", 13, 23): ["0+2", "0+2+3", "0+2+3+4", "0+2+3+4+6"],
        ("B", 14, 24): ["0+3", "0+3+4", "0+3+4+6"],
        ("B", 15, 25): ["0+3+4+5"],
        ("B", 19, 29): ["0+4", "0+4+5"],
        ("B", 20, 30): ["0+5"],
        ("C", 1, 11): ["0+1"],
        ("C", 5, 15): ["0+1+2"],
        ("C", 6, 16): ["0+1+2+3"],
        ("C", 11, 21): ["0+1+2+3+4"],
        ("C", 12, 22): ["0+2", "0+2+3", "0+2+3+4"],
        ("C", 13, 23): ["0+2+3+4+5"],
        ("C", 16, 26): ["0+3", "0+3+4", "0+3+4+5"],
        ("C", 17, 27): ["0+4", "0+4+5"],
        ("C", 22, 32): ["0+5"],
        ("D", 1, 11): ["0+4"],
        ("D", 2, 12): ["0+4+2"],
        ("D", 6, 16): ["0+4+2+5"],
        ("D", 12, 22): ["0+2", "0+2+5"],
        ("D", 13, 23): ["0+5"],
        ("D", 19, 29): ["0+3"],
    }
    assert dropped == 0


def test_early_and_late_records_match_kafka_streams() -> None:
    # testEarlyNoGracePeriodLargeInput: records before the difference share [0, 10]; with no
    # grace, 5@10 and 7@4 miss the closed [0, 10] and [1, 11] but update the open windows,
    # and 8@2 is late for every window.
    records = [("E", "1", 0), ("E", "3", 5), ("E", "4", 6), ("E", "2", 3), ("E", "6", 13), ("E", "5", 10), ("E", "7", 4), ("E", "8", 2), ("E", "9", 15)]
    histories, dropped, _ = window_histories(sliding_app(SlidingWindow(difference=10)), records)
    assert {start: values for (_, start, _), values in histories.items()} == {
        0: ["0+1", "0+1+3", "0+1+3+4", "0+1+3+4+2"],
        1: ["0+3", "0+3+4", "0+3+4+2"],
        3: ["0+3+4+2+6", "0+3+4+2+6+5", "0+3+4+2+6+5+7"],
        4: ["0+3+4", "0+3+4+6", "0+3+4+6+5", "0+3+4+6+5+7"],
        5: ["0+3+4+6+5", "0+3+4+6+5+9"],
        6: ["0+4", "0+4+6", "0+4+6+5", "0+4+6+5+9"],
        7: ["0+6", "0+6+5", "0+6+5+9"],
        11: ["0+6", "0+6+9"],
        14: ["0+9"],
    }
    assert dropped == 5  # a closed window missed counts once (Kafka Streams' dropped-records sensor)


def test_no_grace_out_of_order_matches_kafka_streams() -> None:
    # testNoGracePeriodSmallInput: difference 50, no grace.
    records = [("A", "1", 100), ("A", "2", 105), ("A", "3", 106), ("A", "4", 103), ("A", "5", 113), ("A", "6", 110)]
    histories, _, _ = window_histories(sliding_app(SlidingWindow(difference=timedelta(milliseconds=50))), records)
    assert {start: values for (_, start, _), values in histories.items()} == {
        50: ["0+1"],
        55: ["0+1+2"],
        56: ["0+1+2+3", "0+1+2+3+4"],
        63: ["0+1+2+3+4+5", "0+1+2+3+4+5+6"],
        101: ["0+2", "0+2+3", "0+2+3+4", "0+2+3+4+5", "0+2+3+4+5+6"],
        104: ["0+2+3", "0+2+3+5", "0+2+3+5+6"],
        106: ["0+3", "0+3+5", "0+3+5+6"],
        107: ["0+5", "0+5+6"],
        111: ["0+5"],
    }


def test_lateness_is_judged_by_each_partitions_stream_time() -> None:
    # Two partitions, two tasks: the record at 5 on partition 1 is on time there (its task's
    # stream time is 5), while the same record on partition 0, behind 100, is late.
    app = sliding_app(SlidingWindow(difference=10))
    with TopologyTestDriver(app, partitions={"in": 2}) as driver:
        source = driver.input_topic("in")
        source.pipe_input("x", "1", timestamp=100, partition=0)
        source.pipe_input("x", "2", timestamp=5, partition=0)
        source.pipe_input("y", "3", timestamp=5, partition=1)
        table = driver.output_topic("out").read_table()
        assert driver.late_records_dropped == 1
    assert table == {Windowed("x", 90, 100): "0+1", Windowed("y", 0, 10): "0+3"}


def test_the_store_is_queryable_by_window_start_and_holds_aggregates() -> None:
    app = sliding_app(SlidingWindow(difference=10, grace=5))
    with TopologyTestDriver(app) as driver:
        source = driver.input_topic("in")
        for value, timestamp in (("1", 10), ("2", 14)):
            source.pipe_input("A", value, timestamp=timestamp)
        # The store's values are the aggregates (its windows' newest timestamps are internal).
        assert driver.store_contents("windows") == {("A", 0): "0+1", ("A", 4): "0+1+2", ("A", 11): "0+2"}
        assert list(driver.store("windows").fetch("A", 1, 20)) == [(4, "0+1+2"), (11, "0+2")]
        with pytest.raises(TypeError, match="read-only"):
            driver.store("windows").put("A", 30, "x")


@pytest.mark.parametrize(
    ("window", "message"),
    [
        (SlidingWindow(difference=0), "sliding window time difference must be > 0 ms, got 0"),
        (SlidingWindow(difference=10, grace=-1), "grace period must be >= 0 ms, got -1"),
    ],
)
def test_a_sliding_window_that_cannot_work_is_refused_naming_the_node(window: SlidingWindow, message: str) -> None:
    app = App("bad")
    events = app.topic("in")
    with pytest.raises(TopologyError, match=f"aggregate 'per_window': {message}") as error:
        app.aggregate(events, initial="0", window=window, name="per_window")(string_adder)
    assert error.value.nodes == ("per_window",)


def expected_sliding_windows(timestamps: list[int], difference: int) -> dict[tuple[int, int], list[int]]:
    """KIP-450's windows, from the definition: a left window ``[t - d, t]`` per record (``[0,
    d]`` for records before ``d``), a right window ``[t + 1, t + 1 + d]`` per record with a
    later record within ``d`` — each holding every record it covers."""
    starts = {max(0, t - difference) for t in timestamps}
    starts |= {t + 1 for t in timestamps if any(t < other <= t + 1 + difference for other in timestamps)}
    return {(s, s + difference): sorted(t for t in timestamps if s <= t <= s + difference) for s in starts}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(0, 60), min_size=1, max_size=12), st.randoms(use_true_random=False))
def test_any_arrival_order_within_grace_gives_the_windows_of_the_definition(timestamps: list[int], shuffle: Any) -> None:
    # With a grace longer than the input spans nothing is late, so the order records arrive
    # in must not matter: the table is KIP-450's windows over the records.
    arrival = list(timestamps)
    shuffle.shuffle(arrival)
    app = App("sliding")
    events = app.topic("in", value=serdes.Int())
    app.aggregate(events, initial=list, store="windows", value=serdes.Json(), window=SlidingWindow(difference=10, grace=1_000), name="times")(
        lambda times, key, t: sorted([*times, t])
    ).to("out")
    with TopologyTestDriver(app) as driver:
        source = driver.input_topic("in")
        for t in arrival:
            source.pipe_input("k", t, timestamp=t)
        table = driver.output_topic("out").read_table()
    assert {(w.start_ms, w.end_ms): values for w, values in table.items()} == expected_sliding_windows(timestamps, 10)
