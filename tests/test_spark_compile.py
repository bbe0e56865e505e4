"""The Spark compiler without Spark: constructs it rejects (naming the node and the reason),
the Kafka source choice and the options each source gets, and the worker rules the stateful
operators replay (``worker_semantics``), checked against the worker's behaviour on small cases."""
from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from pystreams import serdes
from pystreams.app import App, Processor, PunctuationType, kv_store, punctuate, window_store
from pystreams.spark import SparkCompileError, compile_topology
from pystreams.spark.compiler import choose_source_format, source_options
from pystreams.spark.worker_semantics import (
    LEFT,
    RIGHT,
    JoinBuffers,
    JoinRule,
    KeyValueBackend,
    ProcessorTask,
    PunctuationClock,
    ReplayedProcessorContext,
    SessionChanges,
    add_to_sessions,
    cached_key_value_store,
    decode_sessions,
    encode_sessions,
)

class DictBackend(KeyValueBackend):
    """A processor store backend in a dict (Spark keeps it in a MapState)."""

    def __init__(self, data: dict[bytes, bytes] | None = None) -> None:
        self.data = {} if data is None else data

    def get(self, key: bytes) -> bytes | None:
        return self.data.get(key)

    def put(self, key: bytes, value: bytes) -> None:
        self.data[key] = value

    def delete(self, key: bytes) -> None:
        self.data.pop(key, None)

    def items(self) -> Iterable[tuple[bytes, bytes]]:
        return list(self.data.items())


# -- constructs that cannot compile ---------------------------------------------------------------


class Remember(Processor):
    def init(self, context: Any) -> None:
        super().init(context)
        self.store = context.store("recent")

    def process(self, key: Any, value: Any) -> None:
        self.context.forward(key, value)


def test_a_processor_with_a_window_store_fails_naming_the_node_and_the_store() -> None:
    app = App("windowed-processor")
    events = app.topic("events", value=serdes.Text())
    stores = [window_store("recent", size=timedelta(minutes=1))]
    app.processor(events, stores=stores, key_changing=False, name="remember")(Remember).to("out")
    with pytest.raises(SparkCompileError, match="node 'remember' .*store 'recent' is a window store") as raised:
        compile_topology(app.topology())
    assert raised.value.nodes == ("remember",)


def test_a_processor_behind_a_repartition_fails_naming_the_node() -> None:
    app = App("rekeyed-processor")
    events = app.topic("events", value=serdes.Text())

    @app.group_by(events)
    def by_value(key: Any, value: str) -> str:
        return value

    app.processor(by_value, stores=[kv_store("recent")], name="remember")(Remember).to("out")
    with pytest.raises(SparkCompileError, match="node 'remember' .*not read straight from a source topic"):
        compile_topology(app.topology())


def test_a_join_with_a_computed_table_fails_naming_the_join() -> None:
    app = App("join-counts")
    events = app.topic("events", value=serdes.Text())
    counts = app.count(events, store="counts")

    @app.join(events, counts, value=serdes.Text())
    def with_count(key: Any, value: str, count: int) -> str:
        return f"{value}:{count}"

    with_count.to("out")
    with pytest.raises(SparkCompileError, match="node 'with_count' .*joins table 'counts' \\(count\\)"):
        compile_topology(app.topology())


# -- the Kafka source: the connector when its jar is there, else ours ------------------------------


class FakeSpark:
    """Just enough of a SparkSession for ``choose_source_format``."""

    def __init__(self, connector_on_classpath: bool) -> None:
        self.connector_on_classpath = connector_on_classpath
        self.registered: list[type] = []
        self.dataSource = self
        self._jvm = self

    def register(self, source: type) -> None:
        self.registered.append(source)

    # spark._jvm.java.lang.Thread.currentThread().getContextClassLoader().loadClass(name)
    @property
    def java(self) -> Any:
        return self

    lang = java
    Thread = java

    def currentThread(self) -> Any:
        return self

    def getContextClassLoader(self) -> Any:
        return self

    def loadClass(self, name: str) -> None:
        if not self.connector_on_classpath:
            raise RuntimeError(f"ClassNotFoundException: {name}")
        assert name == "org.apache.spark.sql.kafka010.KafkaSourceProvider"


def test_the_builtin_connector_is_chosen_when_its_jar_is_on_the_classpath(caplog: pytest.LogCaptureFixture) -> None:
    pytest.importorskip("pyspark")
    with_jar, without_jar = FakeSpark(True), FakeSpark(False)
    with caplog.at_level("INFO", logger="pystreams.spark.compiler"):
        assert choose_source_format(with_jar) == "kafka"
        assert choose_source_format(without_jar) == "pystreams_kafka"
    assert with_jar.registered == []
    assert [source.name() for source in without_jar.registered] == ["pystreams_kafka"]
    assert "built-in connector" in caplog.text and "Python data source" in caplog.text


def test_each_source_gets_the_options_it_reads() -> None:
    assert source_options("kafka", "host:9092", ("a", "b")) == {
        "kafka.bootstrap.servers": "host:9092",
        "subscribe": "a,b",
        "startingOffsets": "earliest",
    }
    assert source_options("pystreams_kafka", "host:9092", ("a", "b")) == {"bootstrap.servers": "host:9092", "topics": "a,b"}


# -- session windows: the worker's merge rule -----------------------------------------------------


def _pages(total: list[str], key: str, url: str) -> list[str]:
    return [*total, url]


def _merge(key: str, older: list[str], newer: list[str]) -> list[str]:
    return [*older, "|", *newer]


def test_a_record_bridging_two_sessions_merges_them_with_the_users_merge() -> None:
    sessions: dict[tuple[int, int], Any] = {}
    changes = SessionChanges()
    rule = dict(gap_ms=10, close_time=0, aggregate=_pages, merge=_merge, new_initial=list)
    for url, ts in (("a", 100), ("b", 115), ("c", 108)):
        assert add_to_sessions(sessions, changes, "u", url, ts, **rule)
    # As the worker: merged from a fresh initial, oldest-ending session first, then the record.
    assert sessions == {(100, 115): ["|", "a", "|", "b", "c"]}
    assert changes.removed == {(100, 100), (115, 115)} and set(changes.written) == {(100, 115)}
    assert not add_to_sessions(sessions, changes, "u", "late", 50, **{**rule, "close_time": 90})
    assert decode_sessions(encode_sessions({(1, 2): b"x", (5, 9): b"y"})) == {(1, 2): b"x", (5, 9): b"y"}


# -- stream-stream joins: the worker's window rule ------------------------------------------------


def test_join_rule_matches_within_the_window_in_time_order() -> None:
    rule = JoinRule(before_ms=0, after_ms=10, how="inner")
    buffers = JoinBuffers()
    assert rule.join(buffers, LEFT, 100, b"order", min_live_time=0) == []
    assert rule.join(buffers, RIGHT, 95, b"early", min_live_time=0) == []  # before the order
    assert rule.join(buffers, RIGHT, 110, b"pay", min_live_time=0) == [(b"order", b"pay", 110)]
    assert rule.join(buffers, RIGHT, 111, b"too-late", min_live_time=0) == []
    assert rule.join(buffers, LEFT, 50, b"old", min_live_time=60) is None  # past retention
    again = JoinBuffers.decode(buffers.encode())
    assert again.sides == buffers.sides
    buffers.expire(100)
    assert buffers.sides[RIGHT] == [(110, b"pay"), (111, b"too-late")]


def test_left_join_emits_unmatched_left_records_at_once() -> None:
    rule = JoinRule(before_ms=5, after_ms=5, how="left")
    buffers = JoinBuffers()
    assert rule.join(buffers, LEFT, 100, b"l", 0) == [(b"l", None, 100)]
    assert rule.join(buffers, RIGHT, 300, b"r", 0) == []  # the right side of a left join waits
    assert JoinRule(5, 5, "outer").join(JoinBuffers(), RIGHT, 1, b"r", 0) == [(None, b"r", 1)]


# -- processors: stores over a backend, stream-time punctuations -----------------------------------


class Counting(Processor):
    def init(self, context: Any) -> None:
        super().init(context)
        self.counts = context.store("counts")

    def process(self, key: Any, value: Any) -> None:
        count = (self.counts.get(key) or 0) + 1
        self.counts.put(key, count)
        self.context.forward(key, count)

    @punctuate(every=timedelta(milliseconds=100), on=PunctuationType.STREAM_TIME)
    def reset(self, now: int) -> None:
        for key, _ in list(self.counts.items()):
            self.counts.delete(key)
        self.context.forward("reset", now)


def test_a_processor_task_runs_records_and_stream_time_punctuations_like_the_worker() -> None:
    backend = DictBackend()
    results = []
    clock = PunctuationClock({})
    stream_time = None
    # Two "micro-batches": the store and the clock carry over, the instance does not.
    for batch in ([("a", 1000), ("a", 1050), ("b", 1099)], [("a", 1100), ("a", 1101)]):
        store = cached_key_value_store("counts", backend, serdes.Text(), serdes.Int())
        context = ReplayedProcessorContext("app", "0_0", {"counts": store})
        task = ProcessorTask(Counting, context, [("reset", 100)], clock, stream_time)
        for offset, (key, ts) in enumerate(batch):
            task.process_source_record([(key, None, ts)], ts, "events", 0, offset)
        store.raw.flush()
        stream_time = task.stream_time
        results.extend((key, value) for key, value, _ in context.forwarded)
    # The first record fires the punctuation at once (the worker's first due time is "now").
    assert results == [("a", 1), ("reset", 1000), ("a", 1), ("b", 1), ("a", 2), ("reset", 1100), ("a", 1)]
    assert backend.data == {b"a": serdes.Int().serialize(1)}
    assert clock.next_due == {"reset": 1200}

    # A source record that stateless steps dropped still moves stream time and punctuates.
    context = ReplayedProcessorContext("app", "0_0", {"counts": cached_key_value_store("counts", backend, serdes.Text(), serdes.Int())})
    task = ProcessorTask(Counting, context, [("reset", 100)], clock, stream_time)
    task.process_source_record([], 1250, "events", 0, 9)
    assert context.forwarded == [("reset", 1250, 1250)] and task.stream_time == 1250
