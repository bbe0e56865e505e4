"""Cogroup: several grouped streams into one aggregate with one store, each stream with its own
aggregator — on the test driver, against Kafka Streams' outputs for the same inputs
(``CogroupedKStreamImplTest``, ``TimeWindowedCogroupedKStreamImplTest``)."""

from __future__ import annotations

from typing import Any

import pytest
from pystreams.topology.errors import TopologyError
from pystreams.topology.ir import CogroupAggregateNode, CogroupNode
from pystreams.topology.windows import Windowed

from pystreams import serdes
from pystreams.app import App, SessionWindow, SlidingWindow, TumblingWindow
from pystreams.testing import TopologyTestDriver


def plus(total: str, key: str, value: str) -> str:
    return f"{total}+{value}"


def minus(total: str, key: str, value: str) -> str:
    return f"{total}-{value}"


def two_stream_app(window: Any = None, *, fluent: bool = False, merge: Any = None) -> App:
    app = App("cogrouped")
    one = app.topic("one", value=serdes.Text())
    two = app.topic("two", value=serdes.Text())
    if fluent:
        table = one.cogroup(plus).cogroup(two, minus).aggregate(initial="0", store="both", window=window, merge=merge)
    else:
        both = app.cogroup()

        @both.cogroup(one)
        def from_one(total: str, key: str, value: str) -> str:
            return plus(total, key, value)

        @both.cogroup(two)
        def from_two(total: str, key: str, value: str) -> str:
            return minus(total, key, value)

        table = both.aggregate(initial="0", store="both", window=window, merge=merge)
    table.to("out")
    return app


def pipe(driver: TopologyTestDriver, records: list[tuple[str, str, str, int]]) -> list[tuple[Any, Any]]:
    topics = {"one": driver.input_topic("one"), "two": driver.input_topic("two")}
    for topic, key, value, timestamp in records:
        topics[topic].pipe_input(key, value, timestamp=timestamp)
    return driver.output_topic("out").read_key_values()


@pytest.mark.parametrize("fluent", [False, True])
def test_two_streams_with_their_own_aggregators_share_one_accumulator(fluent: bool) -> None:
    # CogroupedKStreamImplTest-style: each stream's records go through its own aggregator
    # into the key's one value; the table emits every update.
    app = two_stream_app(fluent=fluent)
    with TopologyTestDriver(app) as driver:
        updates = pipe(driver, [("one", "k1", "A", 0), ("one", "k2", "A", 0), ("two", "k1", "B", 3), ("one", "k1", "A", 4), ("two", "k2", "B", 1)])
        assert driver.store_contents("both") == {"k1": "0+A-B+A", "k2": "0+A-B"}
    assert updates == [("k1", "0+A"), ("k2", "0+A"), ("k1", "0+A-B"), ("k1", "0+A-B+A"), ("k2", "0+A-B")]
    topology = app.topology()
    kinds = [type(node) for node in topology.nodes.values()]
    assert kinds.count(CogroupAggregateNode) == 2 and kinds.count(CogroupNode) == 1
    assert list(topology.stores) == ["both"]  # one store for both streams


def test_time_windowed_cogroup_matches_kafka_streams() -> None:
    # timeWindowMixAggregatorsManyWindowsTest: tumbling windows of 500 ms.
    app = two_stream_app(TumblingWindow(size=500, grace=1000))
    with TopologyTestDriver(app) as driver:
        updates = pipe(
            driver,
            [
                ("one", "k1", "A", 0), ("one", "k2", "A", 0), ("one", "k2", "A", 1), ("one", "k1", "A", 2),
                ("two", "k1", "B", 3), ("two", "k2", "B", 3), ("two", "k2", "B", 501), ("two", "k1", "B", 501),
            ],
        )  # fmt: skip
    assert [(key.key, value) for key, value in updates] == [
        ("k1", "0+A"), ("k2", "0+A"), ("k2", "0+A+A"), ("k1", "0+A+A"),
        ("k1", "0+A+A-B"), ("k2", "0+A+A-B"), ("k2", "0-B"), ("k1", "0-B"),
    ]  # fmt: skip
    assert updates[-1][0] == Windowed("k1", 500, 1000)


def test_each_input_judges_lateness_by_the_records_it_has_seen() -> None:
    # Kafka Streams builds one windowed aggregate processor per cogrouped stream, each with
    # its own observed stream time: a record of stream two at 85 is not late because stream
    # one has reached 100 (its sessions close at 100 - gap = 90); a record of stream one at
    # 84 is. (Sessions show it: a window store keeps only what every input may still use.)
    app = two_stream_app(SessionWindow(gap=10), merge=lambda key, older, newer: older + newer.removeprefix("0"))
    with TopologyTestDriver(app) as driver:
        pipe(driver, [("one", "k", "A", 100), ("two", "k", "B", 85), ("one", "k", "C", 84)])
        assert driver.store_contents("both") == {("k", 100, 100): "0+A", ("k", 85, 85): "0-B"}
        assert driver.late_records_dropped == 1


def test_sliding_cogroup_creates_windows_from_both_streams() -> None:
    app = two_stream_app(SlidingWindow(difference=10, grace=100))
    with TopologyTestDriver(app) as driver:
        pipe(driver, [("one", "k", "A", 10), ("two", "k", "B", 14)])
        # A@10 [0, 10]; B@14 [4, 14] seeded with A, and A's right window [11, 21] with B.
        assert driver.store_contents("both") == {("k", 0): "0+A", ("k", 4): "0+A-B", ("k", 11): "0-B"}


def test_session_cogroup_merges_sessions_across_streams() -> None:
    app = two_stream_app(SessionWindow(gap=10), merge=lambda key, older, newer: older + newer.removeprefix("0"))
    with TopologyTestDriver(app) as driver:
        pipe(driver, [("one", "k", "A", 0), ("two", "k", "B", 20), ("one", "k", "C", 10)])
        # C@10 bridges A@0's session and B@20's: one session [0, 20].
        assert driver.store_contents("both") == {("k", 0, 20): "0+A-B+C"}


def test_a_rekeyed_stream_is_repartitioned_and_cogrouped_on_several_partitions() -> None:
    app = App("cogrouped")
    one = app.topic("one", value=serdes.Text())
    two = app.topic("two", value=serdes.Text())
    by_value = two.group_by(lambda key, value: value.split(":")[0], name="by_user")
    table = one.cogroup(plus).cogroup(by_value, minus).aggregate(initial="0", store="both")
    table.to("out")
    topology = app.topology()
    assert len(topology.repartition_topics) == 1
    (group,) = topology.copartition_groups
    assert group.required_by == ("both",)
    with TopologyTestDriver(app, partitions={"one": 3, "two": 3}) as driver:
        driver.input_topic("one").pipe_input("u1", "A", timestamp=0)
        driver.input_topic("two").pipe_input("whatever", "u1:B", timestamp=1)
        driver.input_topic("two").pipe_input("other", "u2:C", timestamp=2)
        assert driver.output_topic("out").read_table() == {"u1": "0+A-u1:B", "u2": "0-u2:C"}


def test_bad_cogroups_are_refused_naming_the_nodes() -> None:
    app = App("bad")
    one = app.topic("one")
    ints = app.topic("ints", key=serdes.Int())
    with pytest.raises(TopologyError, match="has no input streams"):
        app.cogroup().aggregate(initial=0, name="empty")
    with pytest.raises(TopologyError, match="already one of its inputs"):
        one.cogroup(plus).cogroup(one, minus)
    with pytest.raises(TopologyError, match="must share one key serde") as error:
        one.cogroup(plus).cogroup(ints, minus).aggregate(initial="0", name="mixed")
    assert error.value.nodes == ("mixed", "one", "ints")
    with pytest.raises(TopologyError, match="over session windows needs merge="):
        one.cogroup(plus).aggregate(initial="0", window=SessionWindow(gap=5), name="sessions")
    with pytest.raises(TopologyError, match="cogroup 'tiny': tumbling window size must be > 0 ms"):
        one.cogroup(plus).aggregate(initial="0", window=TumblingWindow(0), name="tiny")
