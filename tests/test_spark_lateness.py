"""Late and out-of-order input on several partitions gives the same windows on Spark as on the
workers, and both give Kafka Streams' answer: lateness is decided by each task's stream time
(one task per partition), record by record.

Apps and inputs the other tests do not use: a 1-minute tumbling count with 10 s grace over
3,000 records (out of order within and beyond the grace, some minutes late) and a session
count, both on three partitions, Spark running as two backfills so that state carries across
micro-batches; and an aggregation whose function appends to its accumulator in place, which
must start from a fresh copy of ``initial=[]`` for every key on both runtimes.
"""

from __future__ import annotations

import collections
import hashlib
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from spark_parity import SPARK_TIMEOUT_S, decoded, read_final_table, read_log, run_on_spark, run_on_workers
from test_spark_examples import Record, create_topics, produce

from pystreams import serdes
from pystreams.app import load_app
from pystreams.broker import EmbeddedBroker
from pystreams.worker.packing import partition_for_key

pytestmark = pytest.mark.integration

PARTITIONS = 3
MINUTE, GRACE = 60_000, 10_000
BASE_MS = 1_700_000_000_000 - 1_700_000_000_000 % MINUTE

APP = """
from pystreams import serdes
from pystreams.app import App, SessionWindow, TumblingWindow

app = App("lateness")
clicks = app.topic("clicks", value=serdes.Text())
app.count(clicks, store="per-minute", window=TumblingWindow(size=60_000, grace=10_000)).to("per-minute")
app.count(clicks, store="sessions", window=SessionWindow(gap=30_000, grace=10_000)).to("sessions")
"""

LISTS_APP = """
from pystreams import serdes
from pystreams.app import App

app = App("lists")
events = app.topic("events", value=serdes.Text())


@app.aggregate(events, initial=[], store="seen", value=serdes.Json())
def seen(items, key, value):
    items.append(value)  # changes the accumulator in place
    return items


seen.to("seen")
"""


SLIDING_COGROUP_APP = """
from pystreams import serdes
from pystreams.app import App, SlidingWindow, TumblingWindow

app = App("sliding_cogroup")
clicks = app.topic("clicks", value=serdes.Text())
views = app.topic("views", value=serdes.Text())
app.count(clicks, store="recent", window=SlidingWindow(difference=30_000, grace=10_000)).to("recent")
(
    clicks.cogroup(lambda score, user, page: score + 1)
    .cogroup(views, lambda score, user, page: score + 100)
    .aggregate(initial=0, store="activity", window=TumblingWindow(size=60_000, grace=10_000))
    .to("activity")
)
"""


def clicks(count: int, seed: int = 14) -> list[Record]:
    """Keyed clicks, each key on the partition Kafka's partitioner gives it; mostly moving
    forward, with records out of order within the grace, beyond it, and minutes late."""
    rng = random.Random(seed)
    users = [f"user{n}" for n in range(40)]
    records = []
    clock = BASE_MS
    for _ in range(count):
        clock += rng.randint(0, 1_200)
        roll = rng.random()
        if roll < 0.08:
            timestamp = clock - rng.randint(1_000, 9_000)  # out of order, within the grace
        elif roll < 0.14:
            timestamp = clock - rng.randint(11_000, 50_000)  # late beyond the grace, for some windows
        elif roll < 0.17:
            timestamp = clock - rng.randint(2 * MINUTE, 10 * MINUTE)  # very late
        else:
            timestamp = clock
        user = rng.choice(users)
        key = user.encode()
        records.append(("clicks", partition_for_key(key, PARTITIONS), key, b"x", timestamp))
    return records


def kafka_streams_tumbling_counts(records: list[Record]) -> dict[tuple[str, int], int]:
    """What Kafka Streams counts: per partition (task), in offset order, a record is late for
    its window once the task's stream time reaches the window's end plus the grace."""
    stream_time: dict[int, int] = {}
    counts: collections.Counter[tuple[str, int]] = collections.Counter()
    for _, partition, key, _, timestamp in records:
        assert partition is not None
        now = stream_time[partition] = max(stream_time.get(partition, timestamp), timestamp)
        start = timestamp - timestamp % MINUTE
        if start + MINUTE > now - GRACE:
            counts[(key.decode(), start)] += 1
    return dict(counts)


def run_both(
    spark: Any,
    tmp_path: Path,
    app_source: str,
    topics: dict[str, int],
    outputs: list[str],
    phases: list[list[Record]],
    *,
    spark_timeout_s: float = SPARK_TIMEOUT_S,
    read: Callable[[str, str], Any] = read_final_table,
) -> dict[str, dict[str, Any]]:
    """Each output as ``read`` reads it (default: its final table), per runtime."""
    # One module name per app: Spark ships it by name into a session the tests share, and a
    # second app under a name already shipped would be refused (and poison the session).
    app_file = tmp_path / f"app_under_test_{hashlib.sha256(app_source.encode()).hexdigest()[:12]}.py"
    app_file.write_text(app_source)
    tables: dict[str, dict[str, Any]] = {}
    with EmbeddedBroker() as workers_broker, EmbeddedBroker() as spark_broker:
        for bootstrap in (workers_broker.bootstrap_servers, spark_broker.bootstrap_servers):
            create_topics(bootstrap, topics)
        total = produce(workers_broker.bootstrap_servers, [r for phase in phases for r in phase])
        run_on_workers(load_app(str(app_file)), workers_broker.bootstrap_servers, tmp_path / "state", until_processed=total).close()
        tables["workers"] = {t: read(workers_broker.bootstrap_servers, t) for t in outputs}
        # One backfill per phase from one checkpoint: task state carries across micro-batches.
        for phase in phases:
            produce(spark_broker.bootstrap_servers, phase)
            run_on_spark(load_app(str(app_file)), spark, spark_broker.bootstrap_servers, tmp_path / "checkpoint", timeout_s=spark_timeout_s)
        tables["spark"] = {t: read(spark_broker.bootstrap_servers, t) for t in outputs}
    return tables


def test_late_and_out_of_order_clicks_give_the_same_windows_on_both_runtimes(spark: Any, tmp_path: Path) -> None:
    records = clicks(3_000)
    outputs = ["per-minute", "sessions"]
    topics = {"clicks": PARTITIONS, **{topic: PARTITIONS for topic in outputs}}
    tables = run_both(spark, tmp_path, APP, topics, outputs, [records[:1_400], records[1_400:]])

    windowed = serdes.WindowedKey(serdes.Text())
    per_minute = decoded(tables["workers"]["per-minute"], windowed, serdes.Int())
    expected = kafka_streams_tumbling_counts(records)
    assert {(w.key, w.start_ms): count for w, count in per_minute.items()} == expected
    dropped = len(records) - sum(expected.values())
    assert dropped > 100, "the input must exercise lateness"
    assert len(expected) > 1_000
    # Every window exact on Spark too (the whole table, byte for byte).
    assert tables["spark"]["per-minute"] == tables["workers"]["per-minute"]

    sessions = decoded(tables["workers"]["sessions"], windowed, serdes.Int())
    assert len(sessions) > 100 and sum(sessions.values()) < len(records)  # some clicks were too late
    assert tables["spark"]["sessions"] == tables["workers"]["sessions"]


def test_an_in_place_aggregator_starts_every_key_from_a_fresh_initial_on_both_runtimes(spark: Any, tmp_path: Path) -> None:
    rng = random.Random(3)
    events = []
    for n in range(60):
        key = f"k{rng.randrange(6)}".encode()
        events.append(("events", partition_for_key(key, 2), key, f"{key.decode()}-{n}".encode(), BASE_MS + n))
    tables = run_both(spark, tmp_path, LISTS_APP, {"events": 2, "seen": 2}, ["seen"], [events[:25], events[25:]])

    expected: dict[str, list[str]] = collections.defaultdict(list)
    for _, _, key, value, _ in events:
        expected[key.decode()].append(value.decode())
    for runtime in ("workers", "spark"):
        assert decoded(tables[runtime]["seen"], serdes.Text(), serdes.Json()) == expected, runtime


def test_sliding_windows_and_a_windowed_cogroup_give_the_same_tables_on_both_runtimes(spark: Any, tmp_path: Path) -> None:
    records = clicks(1_200)
    views = [("views", partition, key, value, timestamp) for _, partition, key, value, timestamp in clicks(600, seed=5)]
    # Interleaved by arrival: clicks and views share the users, so the cogroup sees both.
    merged = sorted(records + views, key=lambda record: record[4] + (5_000 if record[0] == "views" else 0))
    outputs = ["recent", "activity"]
    topics = {"clicks": PARTITIONS, "views": PARTITIONS, **{topic: PARTITIONS for topic in outputs}}
    tables = run_both(spark, tmp_path, SLIDING_COGROUP_APP, topics, outputs, [merged[:900], merged[900:]])

    windowed = serdes.WindowedKey(serdes.Text())
    recent = decoded(tables["workers"]["recent"], windowed, serdes.Int())
    assert len(recent) > 1_000 and all(w.end_ms - w.start_ms == 30_000 for w in recent)
    assert tables["spark"]["recent"] == tables["workers"]["recent"]
    activity = decoded(tables["workers"]["activity"], windowed, serdes.Int())
    assert any(score >= 100 and score % 100 for score in activity.values()), "windows holding both streams"
    assert tables["spark"]["activity"] == tables["workers"]["activity"]


EMIT_FINAL_APP = """
from pystreams import serdes
from pystreams.app import App, SessionWindow, TumblingWindow

app = App("emit_final")
clicks = app.topic("clicks", value=serdes.Text())
app.count(clicks, store="per-minute", window=TumblingWindow(size=60_000, grace=10_000), emit="final").to("per-minute")
app.count(clicks, store="sessions", window=SessionWindow(gap=30_000, grace=10_000), emit="final").to("sessions")
"""


def test_emit_final_writes_the_same_final_records_on_both_runtimes(spark: Any, tmp_path: Path) -> None:
    """Every record, not just the last per key: one final result per closed window, the same
    set on Spark (two backfills, state and stream time carried between them) as on the workers,
    and on the workers Kafka Streams' answer for the tumbling count."""
    records = clicks(1_500, seed=23)
    outputs = ["per-minute", "sessions"]
    topics = {"clicks": PARTITIONS, **{topic: PARTITIONS for topic in outputs}}
    logs = run_both(spark, tmp_path, EMIT_FINAL_APP, topics, outputs, [records[:700], records[700:]], read=read_log)

    windowed = serdes.WindowedKey(serdes.Text())
    for output in outputs:
        worker_log, spark_log = logs["workers"][output], logs["spark"][output]
        assert all(value is not None for _, _, value in worker_log), f"{output}: emit-final writes no tombstones"
        windows = [key for _, key, _ in worker_log]
        assert len(windows) == len(set(windows)), f"{output}: a window's final result appeared twice on the workers"
        # The same records on the same partitions; the order within a partition may differ
        # (a micro-batch closes several windows at once).
        assert sorted(spark_log) == sorted(worker_log), f"{output}: Spark's final records differ from the workers'"

    stream_time: dict[int, int] = {}
    for _, partition, _, _, timestamp in records:
        assert partition is not None
        stream_time[partition] = max(stream_time.get(partition, timestamp), timestamp)
    closed = {
        (user, start): count
        for (user, start), count in kafka_streams_tumbling_counts(records).items()
        if start + MINUTE + GRACE <= stream_time[partition_for_key(user.encode(), PARTITIONS)]
    }
    finals = {
        (w.key, w.start_ms): count
        for w, count in decoded(dict((k, v) for _, k, v in logs["workers"]["per-minute"] if v is not None), windowed, serdes.Int()).items()
    }
    assert finals == closed
    assert 100 < len(closed) < len(kafka_streams_tumbling_counts(records)), "some windows closed, the newest did not"
    sessions = decoded(dict((k, v) for _, k, v in logs["workers"]["sessions"] if v is not None), windowed, serdes.Int())
    assert len(sessions) > 50 and sum(sessions.values()) < len(records)
