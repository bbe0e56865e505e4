"""Source timestamps as Kafka Streams reads them: a record whose (extracted) timestamp is
negative is skipped with a warning and counted as dropped, on the worker's tasks (the test
driver) and on Spark's operators alike; an extractor that raises goes through the
deserialization error policy."""

from __future__ import annotations

import struct
from typing import Any

from pystreams.topology.resolve import resolve
from pystreams.topology.windows import Windowed
from spark_emulation import InputRecord, SparkEmulator

from pystreams import serdes
from pystreams.app import App, TumblingWindow
from pystreams.spark import compile_topology
from pystreams.testing import TopologyTestDriver

INT = struct.Struct(">q")


def app_with_a_window_and_a_map() -> App:
    app = App("timestamps")
    clicks = app.topic("in", value=serdes.Int())
    app.count(clicks, store="per-10", window=TumblingWindow(size=10)).to("counts")
    clicks.map_values(lambda key, n: n * 2, value=serdes.Int(), name="doubled").to("doubled")
    return app


INPUT = [("k", 1, 5), ("k", 2, -5), ("k", 3, 7), ("k", 4, -1)]


def test_a_negative_timestamp_is_skipped_and_counted_on_the_test_driver(caplog: Any) -> None:
    with TopologyTestDriver(app_with_a_window_and_a_map()) as driver:
        source = driver.input_topic("in")
        for key, value, timestamp in INPUT:
            source.pipe_input(key, value, timestamp=timestamp)
        # Not counted into [-10, 0): the two negative records never reach a window or a map.
        assert driver.output_topic("counts").read_table() == {Windowed("k", 0, 10): 2}
        assert driver.output_topic("doubled").read_values() == [2, 6]
        assert driver.invalid_timestamps_dropped == 2
        assert driver.late_records_dropped == 0
    assert sum("negative timestamp -5" in message for message in caplog.messages) == 1


def test_a_negative_extracted_timestamp_is_skipped_like_a_negative_record_timestamp() -> None:
    app = App("extracted")
    events = app.topic("in", value=serdes.Json(), timestamp=lambda key, value, record_ts: value["ts"])
    app.count(events, store="per-10", window=TumblingWindow(size=10)).to("counts")
    with TopologyTestDriver(app) as driver:
        source = driver.input_topic("in")
        for ts in (3, -5, 12):
            source.pipe_input("k", {"ts": ts}, timestamp=100)
        assert driver.output_topic("counts").read_table() == {Windowed("k", 0, 10): 1, Windowed("k", 10, 20): 1}
        assert driver.invalid_timestamps_dropped == 1


def test_spark_skips_the_records_the_workers_skip() -> None:
    app = app_with_a_window_and_a_map()
    topology = app.topology()
    emulator = SparkEmulator(compile_topology(topology), dict(resolve(topology, {"in": 1}).partitions))
    out = emulator.run_batch([InputRecord("in", 0, key.encode(), INT.pack(value), ts) for key, value, ts in INPUT])
    doubled = [INT.unpack(value)[0] for _, value, _ in out["doubled"]]
    assert doubled == [2, 6]
    # One micro-batch: the window [0, 10) of "k" once, counted 2 (the key: "k", start, end).
    assert out["counts"] == [(b"k" + INT.pack(0) + INT.pack(10), INT.pack(2), 7)]
