"""The timestamps Kafka Streams gives results, which differ from the updating record's only
for out-of-order input: an aggregation's result carries the largest timestamp folded into it
(KStreamAggregate, KStreamWindowAggregate, KTableAggregate), a session's its end
(KStreamSessionWindowAggregate), a sliding window's its newest record's, an emit-final window
its aggregate's (KIP-825), a table–table join the later of its two rows' (KTableKTable*Join),
and a foreign-key answer the later of the subscribing row's and the foreign row's
(SubscriptionJoinProcessor). Rows keep their timestamps across commits and restores
(pystreams.state.timestamped), and a changelog keeps Kafka Streams' layout: the plain value,
stamped with the row's timestamp."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import msgspec
import pytest
from pystreams.state import CacheLimits, InMemoryChangelog, TaskState, TopicPartition
from pystreams.topology.resolve import resolve
from pystreams.topology.windows import Windowed
from spark_emulation import InputRecord, SparkEmulator

from pystreams import serdes
from pystreams.app import App, SessionWindow, SlidingWindow, TumblingWindow
from pystreams.spark import compile_topology
from pystreams.testing import TopologyTestDriver


def _stamped(app: App, inputs: list[tuple[str, str, Any, int]], topic: str = "out") -> list[tuple[Any, Any, int]]:
    """(key, value, timestamp) of every record ``topic`` received, piping ``inputs`` —
    (topic, key, value, timestamp) — one by one."""
    with TopologyTestDriver(app) as driver:
        for source, key, value, timestamp in inputs:
            driver.input_topic(source).pipe_input(key, value, timestamp=timestamp)
        return [(r.key, r.value, r.timestamp) for r in driver.output_topic(topic).read_records()]


def _counting(window: Any = None, *, emit: str = "update") -> App:
    app = App("result-timestamps")
    clicks = app.topic("in", value=serdes.Text())
    app.count(clicks, store="counts", window=window, emit=emit).to("out")
    return app


def test_a_count_carries_the_largest_timestamp_folded_into_it_not_the_last_records() -> None:
    out = _stamped(_counting(), [("in", "a", "x", 100), ("in", "b", "x", 50), ("in", "a", "x", 50), ("in", "a", "x", 120)])
    assert out == [("a", 1, 100), ("b", 1, 50), ("a", 2, 100), ("a", 3, 120)]


def test_a_tumbling_windows_result_carries_the_largest_timestamp_of_its_own_records() -> None:
    out = _stamped(_counting(TumblingWindow(size=10, grace=100)), [("in", "a", "x", 8), ("in", "a", "x", 12), ("in", "a", "x", 3)])
    # The record at 3 is late for nothing (grace 100) and joins [0, 10), whose newest is 8.
    assert out == [(Windowed("a", 0, 10), 1, 8), (Windowed("a", 10, 20), 1, 12), (Windowed("a", 0, 10), 2, 8)]


def test_an_emit_final_window_is_stamped_with_its_aggregate_not_the_record_that_closed_it() -> None:
    out = _stamped(_counting(TumblingWindow(size=10), emit="final"), [("in", "a", "x", 7), ("in", "a", "x", 2), ("in", "a", "x", 25)])
    assert out == [(Windowed("a", 0, 10), 2, 7)]


def test_a_session_is_stamped_with_its_end_whichever_record_changed_it() -> None:
    out = _stamped(_counting(SessionWindow(gap=10, grace=100)), [("in", "a", "x", 20), ("in", "a", "x", 15)])
    assert out[-1] == (Windowed("a", 15, 20), 2, 20)
    assert [timestamp for _, _, timestamp in out] == [20, 20, 20]  # the merged-away [20, 20] too


def test_a_sliding_window_is_stamped_with_its_newest_record() -> None:
    out = _stamped(_counting(SlidingWindow(difference=10, grace=100)), [("in", "a", "x", 20), ("in", "a", "x", 15)])
    final = {key: (value, timestamp) for key, value, timestamp in out}
    assert final[Windowed("a", 10, 20)] == (2, 20)  # holds both: the newest is 20, not 15
    assert final[Windowed("a", 5, 15)] == (1, 15)  # the out-of-order record's own left window


def test_a_grouped_tables_aggregate_carries_the_largest_timestamp_folded_in_subtractions_too() -> None:
    app = App("grouped-timestamps")
    table = app.table("in", value=serdes.Text())
    table.group_by(lambda key, value: (value, key), value=serdes.Text()).count().to_stream().to("out")
    out = _stamped(app, [("in", "k1", "red", 100), ("in", "k2", "red", 40), ("in", "k1", "blue", 60)])
    # k1 leaves red at 60: red's count drops, still stamped 100, the largest folded into it.
    assert out == [("red", 1, 100), ("red", 2, 100), ("red", 1, 100), ("blue", 1, 60)]


def _table_join_app(*, store: str | None) -> App:
    app = App("table-join-timestamps")
    left = app.table("left", value=serdes.Text())
    right = app.table("right", value=serdes.Text())
    left.join(right, lambda key, mine, theirs: f"{mine}-{theirs}", how="left", value=serdes.Text(), store=store, name="joined").to_stream().to("out")
    return app


def test_a_table_join_result_carries_the_later_of_its_two_rows_timestamps() -> None:
    inputs = [("left", "k", "A", 100), ("right", "k", "a", 50), ("right", "k", "b", 70), ("left", "k", "B", 60), ("right", "k", "c", 130)]
    expected = [("k", "A-None", 100), ("k", "A-a", 100), ("k", "A-b", 100), ("k", "B-b", 70), ("k", "B-c", 130)]
    assert _stamped(_table_join_app(store=None), inputs) == expected
    assert _stamped(_table_join_app(store="joined-rows"), inputs) == expected  # materialized: the row keeps it


def test_a_foreign_key_answer_carries_the_later_of_the_subscribing_row_and_the_foreign_row() -> None:
    app = App("fk-timestamps")
    orders = app.table("orders", value=serdes.Json())
    customers = app.table("customers", value=serdes.Json())
    orders.join(customers, lambda key, order, customer: customer["city"], foreign_key=lambda key, order: order["customer"], value=serdes.Text()).to_stream().to(
        "out"
    )
    inputs = [("customers", "c1", {"city": "Oslo"}, 100), ("orders", "o1", {"customer": "c1"}, 40), ("customers", "c1", {"city": "Rome"}, 90)]
    # The order at 40 meets a customer row of 100; the customer's update at 90 reaches the order as 90.
    assert _stamped(app, inputs) == [("o1", "Oslo", 100), ("o1", "Rome", 90)]


def test_a_rows_timestamp_survives_a_restore_and_its_changelog_holds_the_plain_value(tmp_path: Path) -> None:
    changelog = InMemoryChangelog()
    topic = TopicPartition("app-counts-changelog", 0)
    state = TaskState(tmp_path, "app", "0_0", 0, changelog)
    store = state.key_value_store("counts", timestamped=True)
    store.put_timestamped(b"k", b"v1", 100)
    store.put_timestamped(b"gone", b"x", 5)
    state.flush()
    store.put_timestamped(b"gone", None, 7)
    state.flush()
    # Kafka Streams' layout: the value alone, with the row's timestamp as the record's.
    assert [(r.key, r.value, r.timestamp) for r in changelog.records(topic)[:2]] == [(b"k", b"v1", 100), (b"gone", b"x", 5)]
    state.close()

    rebuilt = TaskState(tmp_path / "elsewhere", "app", "0_0", 0, changelog)
    restored = rebuilt.key_value_store("counts", timestamped=True)
    rebuilt.restore(changelog)
    assert restored.get_timestamped(b"k") == (b"v1", 100)
    assert restored.get(b"k") == b"v1"
    assert restored.get_timestamped(b"gone") is None
    assert list(restored.all()) == [(b"k", b"v1")]
    rebuilt.close()


def test_a_windows_timestamp_survives_eviction_and_a_restore(tmp_path: Path) -> None:
    changelog = InMemoryChangelog()
    state = TaskState(tmp_path, "app", "0_0", 0, changelog)
    tiny = CacheLimits(max_entries=1, evict_to_fraction=0.0)  # every second write evicts the first
    windows = state.window_store("per-10", retention_ms=1_000, cache_limits=tiny, timestamped=True)
    assert windows.put_timestamped(b"k", 0, b"two", 7)
    assert windows.put_timestamped(b"k", 10, b"one", 12)  # evicts [0, 10) to RocksDB, stamped
    assert windows.get_timestamped(b"k", 0) == (b"two", 7)  # read back from the database
    assert windows.get_timestamped(b"k", 10) == (b"one", 12)  # from the cache
    assert [(w.window_start, w.value) for w in windows.fetch_all(0, 100)] == [(0, b"two"), (10, b"one")]
    state.flush()
    state.close()

    rebuilt = TaskState(tmp_path / "elsewhere", "app", "0_0", 0, changelog)
    restored = rebuilt.window_store("per-10", retention_ms=1_000, timestamped=True)
    rebuilt.restore(changelog)
    assert [(w.window_start, w.value, at) for w, at in restored.fetch_all_timestamped(0, 100)] == [(0, b"two", 7), (10, b"one", 12)]
    assert list(restored.fetch(b"k", 0, 100)) == [(0, b"two"), (10, b"one")]
    rebuilt.close()


def test_spark_stamps_table_rows_alike_and_refuses_a_checkpoint_whose_tables_kept_no_timestamps() -> None:
    app = _counting(TumblingWindow(size=10, grace=100))
    topology = app.topology()
    emulator = SparkEmulator(compile_topology(topology), dict(resolve(topology, {"in": 1}).partitions))
    out = emulator.run_batch([InputRecord("in", 0, b"a", b"x", 8), InputRecord("in", 0, b"a", b"x", 3)])
    window = b"a" + struct.pack(">qq", 0, 10)
    assert out["out"] == [(window, struct.pack(">q", 2), 8)]  # the largest folded in, as on a worker
    # A task state written before rows kept timestamps (no store format): its window store's
    # values would be read as stamped rows, so the task refuses it.
    for task, state in emulator._task_states.items():
        emulator._task_states[task] = msgspec.structs.replace(state, store_format=1)
    with pytest.raises(ValueError, match=r"stores counts was written by an older pystreams.*new checkpoint"):
        emulator.run_batch([InputRecord("in", 0, b"a", b"x", 9)])


class _Rows(dict[bytes, bytes]):
    """A Spark state backend as a dict."""

    def put(self, key: bytes, value: bytes) -> None:
        self[key] = value

    def delete(self, key: bytes) -> None:
        self.pop(key, None)


@pytest.mark.parametrize("short", [b"", b"\x00\x01\x02"])
def test_a_stored_row_too_short_for_its_timestamp_is_a_corrupt_store_on_both_runtimes(tmp_path: Path, short: bytes) -> None:
    """A row without its 8-byte timestamp (a damaged database or Spark state) is reported as
    the store's corruption, naming the store; it is never read as an empty value, and never a
    bare struct.error."""
    from pystreams.state.errors import StoreCorruptedError

    from pystreams.spark.state import SparkTimestampedKeyValueStore

    state = TaskState(tmp_path, "app", "0_0", 0, InMemoryChangelog())
    store = state.key_value_store("counts", timestamped=True)
    store.put_timestamped(b"good", b"v", 100)
    state.flush()
    batch = store._db.new_batch()
    batch.put(b"bad", short)
    store._db.write(batch)
    assert store.get_timestamped(b"good") == (b"v", 100)
    for read in (lambda: store.get(b"bad"), lambda: store.get_timestamped(b"bad"), lambda: list(store.all())):
        with pytest.raises(StoreCorruptedError, match="store counts: a timestamped row of"):
            read()
    state.close()

    spark = SparkTimestampedKeyValueStore("counts", _Rows({b"good": struct.pack(">q", 100) + b"v", b"bad": short}))
    assert spark.get_timestamped(b"good") == (b"v", 100)
    for read in (lambda: spark.get(b"bad"), lambda: spark.get_timestamped(b"bad"), lambda: spark.all()):
        with pytest.raises(StoreCorruptedError, match="store counts: a timestamped row of"):
            read()
