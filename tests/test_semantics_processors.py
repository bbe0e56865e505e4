"""Per-kind semantics of low-level processors: the context, stores, forwards and both kinds
of punctuation, on the worker's kernels through the test driver."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from pystreams import serdes
from pystreams.app import App, Processor, PunctuationType, kv_store, punctuate
from pystreams.testing import TopologyTestDriver
from pystreams.worker import RecordProcessingError

SEEN: list[tuple[Any, ...]] = []


class Tracker(Processor):
    """Counts per key in its store, forwards every record's count, and reports on punctuations."""

    def init(self, context: Any) -> None:
        super().init(context)
        self.counts = context.store("counts")

    def process(self, key: Any, value: Any) -> None:
        ctx = self.context
        SEEN.append(("process", key, ctx.timestamp, ctx.topic, ctx.partition, ctx.offset, str(ctx.task_id)))
        count = (self.counts.get(key) or 0) + 1
        self.counts.put(key, count)
        ctx.forward(key, count)
        if value == "echo-later":
            ctx.forward(key, -1, timestamp=ctx.timestamp + 5)

    @punctuate(every=timedelta(milliseconds=100), on=PunctuationType.STREAM_TIME)
    def on_stream_time(self, now: int) -> None:
        ctx = self.context
        SEEN.append(("stream", now, ctx.timestamp, ctx.topic, ctx.offset))
        self.context.forward("total", sum(count for _, count in self.counts.items()))

    @punctuate(every=timedelta(seconds=1), on=PunctuationType.WALL_CLOCK_TIME)
    def on_wall_clock(self, now: int) -> None:
        SEEN.append(("wall", now))


def tracker_app() -> App:
    app = App("tracker")
    events = app.topic("in", value=serdes.Text())
    app.processor(events, stores=[kv_store("counts", value=serdes.Int())], value=serdes.Int(), key_changing=False)(Tracker).to("out")
    return app


@pytest.fixture(autouse=True)
def clear_seen() -> None:
    SEEN.clear()


def test_process_sees_the_records_position_and_forwards_with_its_timestamp() -> None:
    with TopologyTestDriver(tracker_app()) as driver:
        events = driver.input_topic("in")
        events.pipe_input("a", "x", timestamp=1000)
        events.pipe_input("a", "echo-later", timestamp=1010)
        records = driver.output_topic("out").read_records()
        assert [(r.key, r.value, r.timestamp) for r in records] == [
            ("a", 1, 1000),
            ("total", 1, 1000),  # the stream-time punctuation fires at the first record
            ("a", 2, 1010),
            ("a", -1, 1015),  # forward(timestamp=...) overrides the record's
        ]
        assert SEEN[0] == ("process", "a", 1000, "in", 0, 0, "0_0")
        assert SEEN[2] == ("process", "a", 1010, "in", 0, 1, "0_0")
        assert driver.store_contents("counts") == {"a": 2}


def test_stream_time_punctuations_follow_the_highest_timestamp_and_skip_missed_intervals() -> None:
    with TopologyTestDriver(tracker_app()) as driver:
        events = driver.input_topic("in")
        for timestamp in (1000, 1050, 1099, 1100, 1030, 1450):
            events.pipe_input("k", "x", timestamp=timestamp)
        fired = [entry for entry in SEEN if entry[0] == "stream"]
        # A punctuation sees its own time and no current record; 1030 does not move stream time;
        # at 1450 the intervals due at 1200..1400 are skipped: it fires once, next due at 1500.
        assert fired == [("stream", 1000, 1000, None, None), ("stream", 1100, 1100, None, None), ("stream", 1450, 1450, None, None)]


def test_stream_time_punctuations_fire_on_kafka_streams_epoch_aligned_schedule() -> None:
    # Kafka Streams schedules a stream-time punctuation from 0 (StreamTask.schedule): it fires at
    # the first record, then whenever stream time reaches the next multiple of the interval; after
    # a gap it fires once and the schedule continues on the same grid.
    with TopologyTestDriver(tracker_app()) as driver:
        events = driver.input_topic("in")
        for timestamp in (1050, 1099, 1120, 1199, 1450, 1499, 1510):
            events.pipe_input("k", "x", timestamp=timestamp)
        fired = [entry[1] for entry in SEEN if entry[0] == "stream"]
        assert fired == [1050, 1120, 1450, 1510]


def test_wall_clock_punctuations_run_only_as_the_wall_clock_moves() -> None:
    with TopologyTestDriver(tracker_app(), initial_wall_clock_ms=5_000) as driver:
        driver.input_topic("in").pipe_input("k", "x", timestamp=1)
        driver.advance_wall_clock(999)
        assert [entry for entry in SEEN if entry[0] == "wall"] == []
        driver.advance_wall_clock(1)
        driver.advance_wall_clock(3_500)
        assert [entry for entry in SEEN if entry[0] == "wall"] == [("wall", 6_000), ("wall", 9_500)]
        driver.advance_wall_clock(500)  # 10_000: the schedule's grid (6_000 + k * 1_000), not 9_500 + 1_000
        assert [entry for entry in SEEN if entry[0] == "wall"][-1] == ("wall", 10_000)


class Snooper(Processor):
    def process(self, key: Any, value: Any) -> None:
        self.context.store("counts")


def test_a_processor_cannot_use_a_store_it_did_not_declare() -> None:
    app = App("snoop")
    events = app.topic("in", value=serdes.Text())
    app.count(events, store="counts")
    app.processor(events, name="snooper")(Snooper)
    with TopologyTestDriver(app) as driver:
        with pytest.raises(RecordProcessingError, match="in node 'snooper': KeyError: .*'counts' is not declared"):
            driver.input_topic("in").pipe_input("k", "x", timestamp=1)


class Router(Processor):
    """Every reading to the child named "all"; high ones also to "alerts" (Kafka's To.child)."""

    def process(self, key: Any, value: Any) -> None:
        self.context.forward(key, value, to="all")
        if value > 100:
            self.context.forward(key, value, to="alerts")
        if value < 0:
            self.context.forward(key, value, to="nowhere")


def test_a_processor_forwards_to_a_named_child_only_and_a_wrong_name_is_the_nodes_error() -> None:
    app = App("router")
    readings = app.topic("in", value=serdes.Int())
    routed = app.processor(readings, value=serdes.Int(), key_changing=False, name="route")(Router)
    routed.to("all-out", name="all")
    routed.to("alerts-out", name="alerts")
    with TopologyTestDriver(app) as driver:
        source = driver.input_topic("in")
        source.pipe_input("t1", 20, timestamp=1)
        source.pipe_input("t2", 120, timestamp=2)
        assert driver.output_topic("all-out").read_key_values() == [("t1", 20), ("t2", 120)]
        assert driver.output_topic("alerts-out").read_key_values() == [("t2", 120)]
        with pytest.raises(
            RecordProcessingError, match=r"route.*forward\(to='nowhere'\): not a child of this processor \(its children here: \['alerts', 'all'\]\)"
        ):
            source.pipe_input("t3", -5, timestamp=3)
