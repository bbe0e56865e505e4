"""The test driver itself: topics, clocks, partitions, stores and errors, as a user meets them."""

from __future__ import annotations

import tempfile
from typing import Any

import pytest
from pystreams.state import task_storage
from pystreams.topology.errors import MissingSourceError
from pystreams.topology.windows import Windowed

from pystreams import serdes
from pystreams.app import App, TumblingWindow
from pystreams.testing import TestRecord, TopologyTestDriver
from pystreams.worker import RecordProcessingError
from pystreams.worker.packing import partition_for_key


def upper_app() -> App:
    app = App("upper")
    words = app.topic("words", value=serdes.Text())
    words.map_values(lambda key, word: word.upper(), value=serdes.Text(), name="shout").to("loud")
    return app


def test_records_keep_their_timestamps_and_the_topic_clock_stamps_the_others() -> None:
    with TopologyTestDriver(upper_app()) as driver:
        words = driver.input_topic("words", start_ms=1000, auto_advance_ms=10)
        loud = driver.output_topic("loud")
        words.pipe_input("k", "a")
        words.pipe_input("k", "b")
        words.advance_time(500)
        words.pipe_input("k", "c")
        words.pipe_input("k", "d", timestamp=7)
        assert loud.queue_size == 4
        assert loud.read_record() == TestRecord("k", "A", 1000)
        assert [(r.value, r.timestamp) for r in loud.read_records()] == [("B", 1010), ("C", 1520), ("D", 7)]
        assert loud.is_empty
        with pytest.raises(LookupError, match="no record left in output topic 'loud'"):
            loud.read_record()


def test_unknown_topics_are_refused_naming_what_exists() -> None:
    with TopologyTestDriver(upper_app()) as driver:
        with pytest.raises(ValueError, match=r"'nope' is not an input topic of app 'upper' \(inputs: \['words'\]\)"):
            driver.input_topic("nope")
        with pytest.raises(ValueError, match="app 'upper' writes no topic 'words'"):
            driver.output_topic("words")
        with pytest.raises(KeyError, match="no store named 'counts'"):
            driver.store_contents("counts")
    with pytest.raises(RuntimeError, match="closed"):
        driver.pipe_input("words", None, b"x", 0)


def test_a_pattern_source_needs_the_topics_it_should_match() -> None:
    app = App("patterns")
    app.topic(pattern=r"in\..*", name="ins").to("out")
    with pytest.raises(MissingSourceError):
        TopologyTestDriver(app)
    with TopologyTestDriver(app, partitions={"in.a": 1, "in.b": 2}) as driver:
        driver.input_topic("in.b").pipe_input("k", {"n": 1}, timestamp=5)
        assert driver.output_topic("out").read_key_values() == [("k", {"n": 1})]


def count_per_minute_app() -> App:
    app = App("per-minute")
    clicks = app.topic("clicks", value=serdes.Text())
    app.count(clicks, store="per-minute", window=TumblingWindow(size=60_000, grace=10_000)).to("counts")
    return app


def keys_on_each_partition(count: int) -> list[str]:
    found: dict[int, str] = {}
    for n in range(100):
        found.setdefault(partition_for_key(f"user{n}".encode(), count), f"user{n}")
    return [found[p] for p in range(count)]


def test_each_partition_is_a_task_with_its_own_stream_time() -> None:
    on_zero, on_one = keys_on_each_partition(2)
    with TopologyTestDriver(count_per_minute_app(), partitions={"clicks": 2}) as driver:
        clicks = driver.input_topic("clicks")
        clicks.pipe_input(on_zero, "x", timestamp=200_000)  # partition 0's stream time: 200 s
        clicks.pipe_input(on_zero, "x", timestamp=30_000)  # late there: [0, 60 s) has closed
        clicks.pipe_input(on_one, "x", timestamp=30_000)  # partition 1 is still at 30 s: counted
        assert driver.late_records_dropped == 1
        assert driver.output_topic("counts").read_table() == {
            Windowed(on_zero, 180_000, 240_000): 1,
            Windowed(on_one, 0, 60_000): 1,
        }
        assert driver.store("per-minute", partition=1).get(on_one, 0) == 1
        with pytest.raises(ValueError, match="one instance per partition"):
            driver.store("per-minute")
        with pytest.raises(ValueError, match="has 2 partition"):
            clicks.pipe_input(on_zero, "x", partition=2)


def test_records_through_a_repartition_topic_reach_their_task_before_the_next_input() -> None:
    app = App("regroup")
    lines = app.topic("lines", value=serdes.Text())
    lines.flat_map(lambda key, line: [(word, 1) for word in line.split()], name="words").count(store="counts").to("out")
    with TopologyTestDriver(app, partitions={"lines": 3}) as driver:
        lines_in, out = driver.input_topic("lines"), driver.output_topic("out")
        lines_in.pipe_input("a", "x y", timestamp=1)
        assert sorted(out.read_key_values()) == [("x", 1), ("y", 1)]
        lines_in.pipe_input("b", "y z", timestamp=2)
        assert sorted(out.read_key_values()) == [("y", 2), ("z", 1)]
        assert driver.store_contents("counts") == {"x": 1, "y": 2, "z": 1}


def failing_app() -> App:
    app = App("fragile")
    numbers = app.topic("numbers", value=serdes.Json(type=int))

    @app.map_values(numbers, value=serdes.Json(type=int))
    def halve(key: Any, n: int) -> int:
        if n % 2:
            raise ValueError(f"{n} is odd")
        return n // 2

    halve.to("halves")
    return app


def test_a_failing_record_raises_naming_node_and_offset_under_the_fail_policy() -> None:
    with TopologyTestDriver(failing_app()) as driver:
        numbers = driver.input_topic("numbers")
        numbers.pipe_input("a", 4, timestamp=1)
        with pytest.raises(RecordProcessingError, match=r"numbers-0@1 in node 'halve': ValueError: 3 is odd"):
            numbers.pipe_input("b", 3, timestamp=2)


def test_dead_letters_carry_the_input_bytes_and_why() -> None:
    with TopologyTestDriver(failing_app(), processing_errors="dead-letter", dead_letter_topic="dlq") as driver:
        numbers = driver.input_topic("numbers")
        numbers.pipe_input("a", 3, timestamp=1, headers=[("trace", b"t-1")])
        numbers.pipe_input("b", 8, timestamp=2)
        assert driver.output_topic("halves").read_key_values() == [("b", 4)]
        (dead,) = driver.output_topic("dlq").read_records()
        assert (dead.key, dead.value) == (b"a", b"3")
        headers = dict(dead.headers)
        assert headers["pystreams.error.node"] == b"halve" and headers["pystreams.error.offset"] == b"0"
        assert b"3 is odd" in headers["pystreams.error.reason"]
        assert [failure.offset for failure in driver.failures] == [0]


def test_the_driver_keeps_its_stores_in_memory_and_close_ends_them(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_rocksdb(*args: Any) -> None:
        raise AssertionError("the test driver opened a RocksDB database")

    monkeypatch.setattr(task_storage, "RocksDatabase", no_rocksdb)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    driver = TopologyTestDriver(count_per_minute_app())
    driver.input_topic("clicks").pipe_input("u", "x", timestamp=1)
    assert driver.store_contents("per-minute") == {("u", 0): 1}
    assert list(tmp_path.iterdir()) == []  # nothing on disk
    driver.close()
    with pytest.raises(RuntimeError, match="closed"):
        driver.store_contents("per-minute")
    with TopologyTestDriver(upper_app()) as driver, pytest.raises(ValueError, match="only moves forward"):
        driver.advance_wall_clock(-1)
