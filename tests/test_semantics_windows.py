"""Per-kind semantics of windowed aggregations: window assignment, grace and lateness by the
task's stream time, and session merging, on the worker's kernels through the test driver."""

from __future__ import annotations

from typing import Any

from pystreams.topology.kernels import partition_for_key
from pystreams.topology.windows import Windowed

from pystreams import serdes
from pystreams.app import App, HoppingWindow, SessionWindow, TumblingWindow
from pystreams.testing import TopologyTestDriver

S = 1000


def windowed_counts(window: Any, records: list[tuple[str, int]]) -> tuple[dict[Windowed, int], int]:
    app = App("windowed")
    clicks = app.topic("in", value=serdes.Text())
    app.count(clicks, store="counts", window=window).to("out")
    with TopologyTestDriver(app) as driver:
        source = driver.input_topic("in")
        for key, timestamp in records:
            source.pipe_input(key, "x", timestamp=timestamp)
        return driver.output_topic("out").read_table(), driver.late_records_dropped


def test_tumbling_windows_accept_late_records_within_grace_only() -> None:
    table, dropped = windowed_counts(
        TumblingWindow(size=60 * S, grace=10 * S),
        [
            ("u", 5 * S),
            ("u", 65 * S),  # stream time 65 s
            ("u", 59 * S),  # late, but [0, 60 s) closes only at 70 s: counted
            ("v", 70 * S),  # stream time 70 s: [0, 60 s) has closed, for every key of the task
            ("u", 58 * S),  # too late: dropped
        ],
    )
    assert table == {Windowed("u", 0, 60 * S): 2, Windowed("u", 60 * S, 120 * S): 1, Windowed("v", 60 * S, 120 * S): 1}
    assert dropped == 1


def test_a_record_counts_in_every_hopping_window_still_open() -> None:
    table, dropped = windowed_counts(
        HoppingWindow(size=30 * S, advance=10 * S, grace=0),
        [("u", 25 * S), ("u", 45 * S), ("u", 22 * S)],  # at 45 s, windows ending by 45 s are closed
    )
    assert table == {
        Windowed("u", 0, 30 * S): 1,
        Windowed("u", 10 * S, 40 * S): 1,
        Windowed("u", 20 * S, 50 * S): 3,  # 25 s, 45 s and the late 22 s
        Windowed("u", 30 * S, 60 * S): 1,
        Windowed("u", 40 * S, 70 * S): 1,
    }
    assert dropped == 2  # the 22 s record was too late for [0, 30 s) and [10 s, 40 s)


def session_app(grace_s: int = 0) -> App:
    app = App("sessions")
    clicks = app.topic("in", value=serdes.Text())

    @app.aggregate(
        clicks,
        initial=list,
        store="pages",
        value=serdes.Json(),
        window=SessionWindow(gap=10 * S, grace=grace_s * S),
        merge=lambda key, older, newer: older + newer,
    )
    def pages(visited: list[str], key: str, page: str) -> list[str]:
        return [*visited, page]

    pages.to("out")
    return app


def test_a_record_bridging_two_sessions_merges_them_and_deletes_the_old_ones() -> None:
    # Grace 10 s: the store keeps sessions gap + grace = 20 s behind stream time, so [0, 0]
    # is still there to merge when stream time is 15 s.
    with TopologyTestDriver(session_app(grace_s=10)) as driver:
        source = driver.input_topic("in")
        for page, timestamp in (("a", 0), ("b", 15 * S), ("c", 8 * S)):
            source.pipe_input("u", page, timestamp=timestamp)
        records = driver.output_topic("out").read_key_values()
        assert records == [
            (Windowed("u", 0, 0), ["a"]),
            (Windowed("u", 15 * S, 15 * S), ["b"]),
            # "c" at 8 s is within 10 s of both: one session, the two old ones deleted.
            (Windowed("u", 0, 0), None),
            (Windowed("u", 15 * S, 15 * S), None),
            (Windowed("u", 0, 15 * S), ["a", "b", "c"]),
        ]
        assert driver.store_contents("pages") == {("u", 0, 15 * S): ["a", "b", "c"]}


def test_a_record_bridges_sessions_the_default_store_still_keeps() -> None:
    # Grace 0, gap 10 s: at stream time 15 s the session [0, 0] still accepts records (it closes
    # at stream time - grace - gap = 5 s), so "c" at 8 s merges all three, as Kafka Streams'
    # default (RocksDB) session store answers; the output agrees with the store.
    with TopologyTestDriver(session_app(grace_s=0)) as driver:
        source = driver.input_topic("in")
        for page, timestamp in (("a", 0), ("b", 15 * S), ("c", 8 * S)):
            source.pipe_input("u", page, timestamp=timestamp)
        assert driver.output_topic("out").read_table() == {Windowed("u", 0, 15 * S): ["a", "b", "c"]}
        assert driver.store_contents("pages") == {("u", 0, 15 * S): ["a", "b", "c"]}


def test_a_record_is_late_only_when_its_merged_session_ends_before_stream_time_minus_grace_and_gap() -> None:
    # The issue's case: gap 10 s, grace 0, "a"@20 s then "b"@12 s. The close time is
    # 20 - 0 - 10 = 10 s and b's session ends after it: kept (Kafka Streams' session aggregate)
    # and merged with a. "old"@1 s is 11 s from b: a session [1, 1] of its own, before 10 s: late.
    with TopologyTestDriver(session_app(grace_s=0)) as driver:
        source = driver.input_topic("in")
        for page, timestamp in (("a", 20 * S), ("b", 12 * S), ("old", 1 * S)):
            source.pipe_input("u", page, timestamp=timestamp)
        assert driver.output_topic("out").read_table() == {Windowed("u", 12 * S, 20 * S): ["a", "b"]}
        assert driver.late_records_dropped == 1


def test_the_three_records_of_the_issue_merge_into_one_session() -> None:
    # k@0, k@20, k@10 with gap 10: the default store still holds [0, 0] at stream time 20, so
    # the record at 10 bridges both: [0, 20] with three records.
    app = App("session-count-three")
    clicks = app.topic("in", value=serdes.Text())
    app.count(clicks, store="c", window=SessionWindow(gap=10)).to("out")
    with TopologyTestDriver(app) as driver:
        source = driver.input_topic("in")
        for timestamp in (0, 20, 10):
            source.pipe_input("k", "x", timestamp=timestamp)
        assert driver.output_topic("out").read_table() == {Windowed("k", 0, 20): 3}
        assert driver.late_records_dropped == 0


def test_a_session_closed_by_stream_time_drops_late_records() -> None:
    with TopologyTestDriver(session_app(grace_s=5)) as driver:
        source = driver.input_topic("in")
        for page, timestamp in (("a", 0), ("b", 100 * S), ("late", 3 * S), ("ok", 96 * S)):
            source.pipe_input("u", page, timestamp=timestamp)
        table = driver.output_topic("out").read_table()
        # At stream time 100 s with 5 s grace, a session ending before 95 s is closed.
        assert table == {Windowed("u", 0, 0): ["a"], Windowed("u", 96 * S, 100 * S): ["b", "ok"]}
        assert driver.late_records_dropped == 1


def test_a_count_over_sessions_sums_the_merged_sessions() -> None:
    app = App("session-count")
    clicks = app.topic("in", value=serdes.Text())
    app.count(clicks, store="c", window=SessionWindow(gap=5 * S, grace=20 * S)).to("out")
    with TopologyTestDriver(app) as driver:
        source = driver.input_topic("in")
        for timestamp in (0, 2 * S, 20 * S, 24 * S, 11 * S, 15 * S):
            source.pipe_input("u", "x", timestamp=timestamp)
        # 11 s is 9 s from 2 s: a session of its own; 15 s bridges it with 20-24 s.
        assert driver.output_topic("out").read_table() == {
            Windowed("u", 0, 2 * S): 2,
            Windowed("u", 11 * S, 24 * S): 4,
        }


# -- where windowed results go ---------------------------------------------------------------------

USERS = [f"user-{n}" for n in range(40)]


def test_windowed_results_are_partitioned_by_the_user_key_as_kafka_streams_does() -> None:
    # Kafka Streams' WindowedStreamPartitioner hashes the user key only, so every window of one
    # user is in one partition; the default partitioner would hash key and window bounds.
    app = App("windowed")
    app.count(app.topic("in", value=serdes.Text()), store="counts", window=TumblingWindow(size=60 * S)).to("out")
    placed: dict[str, set[int]] = {}
    with TopologyTestDriver(app, partitions={"in": 3, "out": 4}) as driver:
        source = driver.input_topic("in")
        for minute in range(3):
            for user in USERS:
                source.pipe_input(user, "x", timestamp=minute * 60 * S)
        records = driver.output_topic("out").read_records()
    for record in records:
        placed.setdefault(record.key.key, set()).add(record.partition)
    assert placed == {user: {partition_for_key(user.encode(), 4)} for user in USERS}
    by_default = {partition_for_key(serdes.WindowedKey(serdes.Text()).serialize(r.key), 4) for r in records if r.key.key == USERS[0]}
    assert len(by_default) > 1  # the old rule would have spread one user's windows


def test_spark_sinks_place_keyed_rows_with_the_sinks_partitioner() -> None:
    from pystreams.topology.kernels import windowed_partition_for_key

    from pystreams.spark.compiler import send_rows

    class Producer:
        def __init__(self) -> None:
            self.sent: list[tuple[str, bytes | None, int | None]] = []

        def partitions_for(self, topic: str) -> set[int]:
            return {0, 1, 2, 3}

        def send(self, topic: str, *, key: bytes | None, value: bytes | None, partition: int | None, timestamp_ms: int | None) -> None:
            self.sent.append((topic, key, partition))

    windowed = serdes.WindowedKey(serdes.Text())
    keys = [windowed.serialize(Windowed(user, minute * 60 * S, (minute + 1) * 60 * S)) for user in USERS for minute in range(3)]
    producer = Producer()
    send_rows(producer, [("out", key, b"1", 5) for key in keys] + [("out", None, b"1", 5)], windowed_partition_for_key)
    assert [p for _, _, p in producer.sent[:-1]] == [partition_for_key(windowed.deserialize(k).key.encode(), 4) for k in keys]
    assert producer.sent[-1] == ("out", None, None)  # no key: the producer spreads it
    plain = Producer()
    send_rows(plain, [("out", b"k", b"1", 5)], None)
    assert plain.sent == [("out", b"k", None)]  # no partitioner: the producer's default
