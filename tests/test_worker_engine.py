"""The worker's task engine against the embedded broker, running the four example apps.

Each test owns one example app; example topic names are fixed, and the embedded broker lives
for the session, so every example is used by exactly one test here. A dict stands in for our
coordinator's committed offsets (OffsetFetch / OffsetCommit)."""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import msgspec
import pytest
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KafkaTopicPartition
from pystreams.state import RestoreProgress, TopicPartition
from pystreams.topology.ir import TaskId
from pystreams.topology.windows import Windowed

from pystreams import serdes
from pystreams.app import load_app
from pystreams.cluster import ClusterMetadata, TopicSpec
from pystreams.worker import (
    EngineConfig,
    ErrorPolicy,
    RecordProcessingError,
    TaskEngine,
    resolve_against_cluster,
)
from pystreams.worker.packing import unpack
from tests.aio import within

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
WAIT_S = 30.0

pytestmark = pytest.mark.integration


# -- helpers ------------------------------------------------------------------------------------


class OffsetStore:
    """Stands in for the coordinator: committed input offsets."""

    def __init__(self) -> None:
        self.offsets: dict[TopicPartition, int] = {}
        self.commits = 0

    def fetch(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return {p: self.offsets[p] for p in partitions if p in self.offsets}

    def commit(self, offsets: Mapping[TopicPartition, int]) -> None:
        self.offsets.update(offsets)
        self.commits += 1


def create_topics(bootstrap: str, *specs: TopicSpec) -> None:
    with ClusterMetadata(bootstrap) as cluster:
        cluster.ensure_topics(specs)


def produce(bootstrap: str, topic: str, records: Iterable[tuple[bytes | None, bytes | None, int | None]]) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    try:
        for key, value, timestamp in records:
            producer.send(topic, key=key, value=value, timestamp_ms=timestamp)
        producer.flush()
    finally:
        producer.close()


def read_all(bootstrap: str, topic: str, *, timeout_s: float = WAIT_S) -> list[Any]:
    """Every record of ``topic`` now, in partition then offset order. The end is found by
    fetching (the embedded broker's end_offsets can stop short of the high watermark)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
    try:
        partitions = [KafkaTopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        assert partitions, f"topic {topic} has no partitions"
        consumer.assign(partitions)
        ends = consumer.end_offsets(partitions)
        consumer.seek_to_beginning(*partitions)
        records: dict[KafkaTopicPartition, list[Any]] = collections.defaultdict(list)
        deadline = time.monotonic() + timeout_s
        while any(consumer.position(p) < ends[p] for p in partitions):
            assert time.monotonic() < deadline, f"could not read {topic} to its end"
            for tp, batch in consumer.poll(timeout_ms=200).items():
                records[tp].extend(batch)
        return [r for p in partitions for r in records[p]]
    finally:
        consumer.close()


def latest_by_key(records: Iterable[Any], key_serde: serdes.Serde, value_serde: serdes.Serde) -> dict[Any, Any]:
    latest: dict[Any, Any] = {}
    for record in records:
        latest[key_serde.deserialize(record.key)] = value_serde.deserialize(record.value)
    return latest


def make_engine(app_file: str, bootstrap: str, state_dir: Path, offsets: OffsetStore, **config: Any) -> TaskEngine:
    topology = load_app(str(EXAMPLES / app_file)).topology()
    resolved = resolve_against_cluster(topology, bootstrap)
    engine = TaskEngine(
        resolved,
        EngineConfig(bootstrap, state_dir, commit_interval_ms=200, **config),
        committed_offsets=offsets.fetch,
        commit_offsets=offsets.commit,
    )
    engine.start()
    engine.add_tasks(resolved.tasks)
    return engine


def run_until(engine: TaskEngine, done: Callable[[], bool], what: str) -> None:
    """Run the engine until ``done()``; fail (not hang) after WAIT_S."""
    engine.run(until=done, timeout_s=WAIT_S)
    assert done(), f"timed out waiting for {what}"


# -- word count ---------------------------------------------------------------------------------

CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "The dog barks",
    "a fox a dog a cat",
    "   spaced    out   words  ",
    "the end",
] * 7


def expected_counts(lines: Iterable[str]) -> collections.Counter[str]:
    return collections.Counter(word for line in lines for word in line.lower().split())


def test_wordcount_counts_exactly_survives_restart_and_rebuilds_from_changelog(kafka_bootstrap: str, tmp_path: Path) -> None:
    create_topics(kafka_bootstrap, TopicSpec("text-lines", 3), TopicSpec("word-counts", 3))
    produce(kafka_bootstrap, "text-lines", ((str(i).encode(), line.encode(), None) for i, line in enumerate(CORPUS)))
    offsets = OffsetStore()
    state_dir = tmp_path / "state"
    words_total = sum(expected_counts(CORPUS).values())

    # 1. One engine owning every task counts the corpus exactly.
    engine = make_engine("wordcount.py", kafka_bootstrap, state_dir, offsets)
    try:
        assert {str(t) for t in engine.tasks} == {"0_0", "0_1", "0_2", "1_0", "1_1", "1_2"}
        run_until(engine, lambda: engine.records_processed >= len(CORPUS) + words_total, "the corpus")
        assert engine.records_processed == len(CORPUS) + words_total
        assert engine.store_contents("counts") == expected_counts(CORPUS)
    finally:
        engine.close()
    counts = latest_by_key(read_all(kafka_bootstrap, "word-counts"), serdes.Text(), serdes.Int())
    assert counts == expected_counts(CORPUS)
    # Committed offsets cover every input line (sum over the three partitions).
    assert sum(o for tp, o in offsets.offsets.items() if tp.topic == "text-lines") == len(CORPUS)
    # The repartition topic is partitioned like Kafka's default partitioner (murmur2 of the key);
    # its records are packed, so every entry of every record is checked.
    from kafka.partitioner.default import murmur2

    repartitioned = [(record.partition, key) for record in read_all(kafka_bootstrap, "wordcount-words-repartition") for key, _, _ in unpack(record)]
    assert len(repartitioned) == words_total
    assert all(partition == (murmur2(key) & 0x7FFFFFFF) % 3 for partition, key in repartitioned)
    # The output was folded by the cache: far fewer updates than words.
    assert len(read_all(kafka_bootstrap, "word-counts")) < words_total

    # 2. Restarting on the same state dir continues from the commit: nothing is recounted.
    more = ["fox fox fox", "zebra"]
    produce(kafka_bootstrap, "text-lines", ((b"more", line.encode(), None) for line in more))
    progress: list[RestoreProgress] = []
    engine = make_engine("wordcount.py", kafka_bootstrap, state_dir, offsets)
    try:
        run_until(engine, lambda: engine.records_processed >= len(more) + 4, "the new lines")
        assert engine.records_processed == len(more) + 4  # only the new lines and their words
        assert engine.store_contents("counts") == expected_counts(CORPUS + more)
    finally:
        engine.close()
    counts = latest_by_key(read_all(kafka_bootstrap, "word-counts"), serdes.Text(), serdes.Int())
    assert counts == expected_counts(CORPUS + more)

    # 3. A wiped state dir is rebuilt from the changelog, identically, before processing.
    wiped_dir = tmp_path / "wiped"
    topology = load_app(str(EXAMPLES / "wordcount.py")).topology()
    resolved = resolve_against_cluster(topology, kafka_bootstrap)
    engine = TaskEngine(
        resolved,
        EngineConfig(kafka_bootstrap, wiped_dir, commit_interval_ms=200),
        committed_offsets=offsets.fetch,
        commit_offsets=offsets.commit,
        on_restore_progress=progress.append,
    )
    engine.start()
    try:
        restored = engine.add_tasks(resolved.tasks)
        restored_records = sum(n for per_store in restored.values() for n in per_store.values())
        assert restored_records >= len(expected_counts(CORPUS + more))
        assert engine.store_contents("counts") == expected_counts(CORPUS + more)
        assert any(p.done and p.restored_records > 0 for p in progress)
        assert all(p.lag == 0 for p in progress if p.done)
        # An out-of-order line (timestamp 1 s): the counts it changes keep the largest
        # timestamp folded into them, restored with each row from its changelog record.
        produce(kafka_bootstrap, "text-lines", [(b"last", b"zebra fox", 1_000)])
        run_until(engine, lambda: engine.records_processed >= 3, "the last line")
        assert engine.records_processed == 3
    finally:
        engine.close()
    output = read_all(kafka_bootstrap, "word-counts")
    counts = latest_by_key(output, serdes.Text(), serdes.Int())
    assert counts == expected_counts(CORPUS + more + ["zebra fox"])
    assert counts["zebra"] == 2 and counts["fox"] == expected_counts(CORPUS)["fox"] + 4
    zebras = [record for record in output if record.key == b"zebra"]
    assert zebras[-1].timestamp == zebras[-2].timestamp > 1_000, "the restored row's timestamp was lost"


# -- packed repartition records -----------------------------------------------------------------


def sequence_app() -> Any:
    """Each input line "k:i k:j ..." becomes one record per token, re-keyed by k (so through a
    repartition topic); the table concatenates each key's indices in the order they arrive."""
    from pystreams.app import App

    app = App("packing")
    lines = app.topic("packing-lines", value=serdes.Text())

    @app.flat_map(lines, key=serdes.Text(), value=serdes.Text())
    def tokens(key, line):
        for token in line.split():
            name, index = token.split(":")
            yield name, index

    @app.aggregate(tokens, store="sequences", initial="", value=serdes.Text())
    def sequences(joined, key, index):
        return f"{joined} {index}".strip()

    sequences.to("packing-sequences")
    return app


def test_packed_repartition_records_keep_per_key_order_and_are_not_recounted_after_restart(kafka_bootstrap: str, tmp_path: Path) -> None:
    # Two input partitions size the repartition topic at two; one key puts every line on one of
    # them, so each word's indices reach the repartition sink in order.
    create_topics(kafka_bootstrap, TopicSpec("packing-lines", 2), TopicSpec("packing-sequences", 2))
    keys = [f"key{k}" for k in range(12)]
    per_line = 6
    # Line i holds indices i*6 .. i*6+5, spread over the keys: every key gets increasing indices.
    lines = [" ".join(f"{keys[n % len(keys)]}:{n}" for n in range(i * per_line, (i + 1) * per_line)) for i in range(50)]
    produce(kafka_bootstrap, "packing-lines", ((b"same", line.encode(), None) for line in lines))
    expected = {key: [str(n) for n in range(len(lines) * per_line) if keys[n % len(keys)] == key] for key in keys}
    offsets = OffsetStore()
    state_dir = tmp_path / "state"

    def engine_for() -> TaskEngine:
        resolved = resolve_against_cluster(sequence_app().topology(), kafka_bootstrap)
        engine = TaskEngine(
            resolved,
            EngineConfig(kafka_bootstrap, state_dir, commit_interval_ms=200),
            committed_offsets=offsets.fetch,
            commit_offsets=offsets.commit,
        )
        engine.start()
        engine.add_tasks(resolved.tasks)
        return engine

    tokens_total = len(lines) * per_line
    engine = engine_for()
    try:
        run_until(engine, lambda: engine.records_processed >= len(lines) + tokens_total, "the lines")
        assert engine.records_processed == len(lines) + tokens_total  # entries, not packed records
        assert {k: v.split() for k, v in engine.store_contents("sequences").items()} == expected
    finally:
        engine.close()

    # The repartition topic holds packed records: fewer Kafka records than tokens, several keys
    # per record, each key on its murmur2 partition and in its original order.
    from kafka.partitioner.default import murmur2

    packed = read_all(kafka_bootstrap, "packing-tokens-repartition")
    entries = [(record.partition, key.decode(), value.decode()) for record in packed for key, value, _ in unpack(record)]
    assert len(entries) == tokens_total
    assert len(packed) < tokens_total
    assert any(len({key for key, _, _ in unpack(record)}) > 1 for record in packed)
    assert all(dict(record.headers)["pystreams.packed"] == b"1" for record in packed)
    assert {record.partition for record in packed} == {0, 1}
    assert all(partition == (murmur2(key.encode()) & 0x7FFFFFFF) % 2 for partition, key, _ in entries)
    for key in keys:
        assert [index for _, k, index in entries if k == key] == expected[key]

    # A restart continues after the commit: no packed record is processed twice.
    more = ["key0:1000 key1:1001 key0:1002"]
    produce(kafka_bootstrap, "packing-lines", ((b"same", line.encode(), None) for line in more))
    engine = engine_for()
    try:
        run_until(engine, lambda: engine.records_processed >= 1 + 3, "the new line")
        engine.commit()
        assert engine.records_processed == 1 + 3
        sequences = {k: v.split() for k, v in engine.store_contents("sequences").items()}
    finally:
        engine.close()
    assert sequences == {**expected, "key0": expected["key0"] + ["1000", "1002"], "key1": expected["key1"] + ["1001"]}
    output = latest_by_key(read_all(kafka_bootstrap, "packing-sequences"), serdes.Text(), serdes.Text())
    assert {k: v.split() for k, v in output.items()} == sequences


# -- windowed aggregations ----------------------------------------------------------------------


def click(user: str, url: str, ts_ms: int) -> bytes:
    return msgspec.json.encode({"user": user, "url": url, "ts": ts_ms})


def test_clicks_windowed_matches_hand_computed_windows_with_grace(kafka_bootstrap: str, tmp_path: Path) -> None:
    # One partition per input, so records reach the windowed tasks in this order.
    create_topics(
        kafka_bootstrap,
        TopicSpec("clicks.eu", 1),
        TopicSpec("clicks.us", 1),
        *(TopicSpec(t, 1) for t in ("clicks-per-minute", "url-views-5m", "user-sessions")),
    )
    second = 1000
    produce(
        kafka_bootstrap,
        "clicks.eu",
        [
            (None, click("alice", "/a", 0), None),
            (None, click("alice", "/b", 30 * second), None),
            (None, click("alice", "/c", 65 * second), None),  # stream time 65 s
            (None, click("alice", "/d", 55 * second), None),  # late, inside 10 s grace: counted
            (None, click("alice", "/e", 80 * second), None),  # stream time 80 s
            (None, click("alice", "/f", 50 * second), None),  # late beyond grace: [0, 60 s) is closed
        ],
    )
    # A second topic matched by the pattern; at 60 s it can never close a window early.
    produce(kafka_bootstrap, "clicks.us", [(None, click("bob", "/a", 60 * second), None)])
    offsets = OffsetStore()
    engine = make_engine("clicks_windowed.py", kafka_bootstrap, tmp_path / "state", offsets)
    try:
        # 7 clicks read, then 7 through each of the two repartition topics.
        run_until(engine, lambda: engine.records_processed >= 21, "the clicks")

        assert engine.tasks[TaskId(1, 0)].ctx.late_records_dropped == 1
    finally:
        engine.close()

    windowed_text = serdes.WindowedKey(serdes.Text())
    minute = 60 * second
    per_minute = latest_by_key(read_all(kafka_bootstrap, "clicks-per-minute"), windowed_text, serdes.Int())
    assert per_minute == {
        Windowed("alice", 0, minute): 3,  # 0 s, 30 s and the late 55 s; not the 50 s one
        Windowed("alice", minute, 2 * minute): 2,  # 65 s, 80 s
        Windowed("bob", minute, 2 * minute): 1,
    }

    five = 5 * minute  # hopping: 5-minute windows every minute; none start before 0
    views = latest_by_key(read_all(kafka_bootstrap, "url-views-5m"), windowed_text, serdes.Int())
    assert views == {
        Windowed("/a", 0, five): 2,  # alice at 0 s, bob at 60 s
        Windowed("/a", minute, minute + five): 1,  # bob at 60 s
        Windowed("/b", 0, five): 1,
        Windowed("/c", 0, five): 1,
        Windowed("/c", minute, minute + five): 1,
        Windowed("/d", 0, five): 1,
        Windowed("/e", 0, five): 1,
        Windowed("/e", minute, minute + five): 1,
        Windowed("/f", 0, five): 1,  # grace 0, but the window is still open at 80 s
    }

    session_type = load_app(str(EXAMPLES / "clicks_windowed.py")).topology().nodes["user_sessions"].value_serde
    sessions = latest_by_key(read_all(kafka_bootstrap, "user-sessions"), windowed_text, session_type)
    live = {key: (s.pages, s.first_url, s.last_url) for key, s in sessions.items() if s is not None}
    # One session per user (gaps < 30 min); the 50 s click is within the 1-minute session grace.
    assert live == {
        Windowed("alice", 0, 80 * second): (6, "/a", "/f"),
        Windowed("bob", 60 * second, 60 * second): (1, "/a", "/a"),
    }


# -- joins --------------------------------------------------------------------------------------


def test_orders_enriched_by_table_join_and_paid_by_windowed_join(kafka_bootstrap: str, tmp_path: Path) -> None:
    app = load_app(str(EXAMPLES / "orders_enrich_join.py"))
    nodes = app.topology().nodes
    order_serde = nodes["orders"].value_serde
    Order = order_serde.struct_type
    Customer = nodes["customers"].value_serde.struct_type
    Payment = nodes["payments"].value_serde.struct_type
    create_topics(
        kafka_bootstrap,
        *(TopicSpec(t, 2) for t in ("orders", "payments", "customers", "orders-enriched", "orders-paid")),
    )
    now = int(time.time() * 1000)
    hour, minute = 3_600_000, 60_000
    customer_serde, payment_serde = serdes.Struct(Customer), serdes.Struct(Payment)
    produce(
        kafka_bootstrap,
        "customers",
        [
            (b"c1", customer_serde.serialize(Customer("c1", "Ada", "gold")), now - hour),
            (b"c2", customer_serde.serialize(Customer("c2", "Bob", "silver")), now - hour),
        ],
    )
    orders = {
        "o1": Order("o1", "c1", 1000),
        "o2": Order("o2", "c2", 2000),
        "o3": Order("o3", "c9", 3000),  # no such customer: an inner join drops it
        "o4": Order("o4", "c1", 4000),
    }
    produce(kafka_bootstrap, "orders", [(k.encode(), order_serde.serialize(o), now) for k, o in orders.items()])
    produce(
        kafka_bootstrap,
        "payments",
        [
            (b"o1", payment_serde.serialize(Payment("o1", 1000)), now + 5 * minute),  # within 15 min
            (b"o2", payment_serde.serialize(Payment("o2", 2000)), now + 20 * minute),  # too late
            (b"o3", payment_serde.serialize(Payment("o3", 3000)), now + 1 * minute),
            (b"o4", payment_serde.serialize(Payment("o4", 4000)), now - 1 * minute),  # before the order
        ],
    )
    engine = make_engine("orders_enrich_join.py", kafka_bootstrap, tmp_path / "state", OffsetStore())
    try:
        # 2 customers + 4 orders + 4 payments read, then 4 orders through the repartition topic.
        run_until(engine, lambda: engine.records_processed >= 14, "orders, payments and customers")
    finally:
        engine.close()

    enriched_serde = nodes["enriched"].value_serde
    enriched = sorted(
        ((r.key.decode(), enriched_serde.deserialize(r.value)) for r in read_all(kafka_bootstrap, "orders-enriched")),
        key=lambda kv: kv[1].order.order_id,
    )
    assert [(key, e.order.order_id, e.customer_name, e.tier) for key, e in enriched] == [
        ("c1", "o1", "Ada", "gold"),
        ("c2", "o2", "Bob", "silver"),
        ("c1", "o4", "Ada", "gold"),
    ]
    paid_serde = nodes["paid"].value_serde
    paid = {r.key.decode(): paid_serde.deserialize(r.value) for r in read_all(kafka_bootstrap, "orders-paid")}
    assert {k: (p.order, p.paid_cents) for k, p in paid.items()} == {
        "o1": (orders["o1"], 1000),
        "o3": (orders["o3"], 3000),
    }


# -- low-level processor ------------------------------------------------------------------------


def test_dedupe_processor_forwards_first_sightings_and_its_punctuation_forgets_old_ids(kafka_bootstrap: str, tmp_path: Path) -> None:
    create_topics(kafka_bootstrap, TopicSpec("events", 1), TopicSpec("events-unique", 1))
    t0, second, hour = 1_700_000_000_000, 1000, 3_600_000
    events = [
        ("e1", t0),
        ("e2", t0 + 1 * second),
        ("e1", t0 + 2 * second),  # duplicate within the hour: dropped
        ("e3", t0 + 3 * second),
        ("e1", t0 + 2 * hour),  # an hour later: forwarded again; stream time jumps, ids expire
        ("e4", t0 + 2 * hour + 5 * second),
    ]
    produce(
        kafka_bootstrap,
        "events",
        [(k.encode(), msgspec.json.encode({"n": i}), ts) for i, (k, ts) in enumerate(events)],
    )
    engine = make_engine("dedupe_processor.py", kafka_bootstrap, tmp_path / "state", OffsetStore())
    try:
        run_until(engine, lambda: engine.records_processed >= len(events), "the events")
        # The stream-time punctuation forgot e2 and e3 (first seen > 1 h before stream time).
        assert engine.store_contents("seen-ids") == {"e1": t0 + 2 * hour, "e4": t0 + 2 * hour + 5 * second}
    finally:
        engine.close()
    unique = [(r.key.decode(), msgspec.json.decode(r.value)["n"], r.timestamp) for r in read_all(kafka_bootstrap, "events-unique")]
    assert unique == [
        ("e1", 0, t0),
        ("e2", 1, t0 + second),
        ("e3", 3, t0 + 3 * second),
        ("e1", 4, t0 + 2 * hour),
        ("e4", 5, t0 + 2 * hour + 5 * second),
    ]


# -- error policies -----------------------------------------------------------------------------


def _doubling_app(app_id: str, source: str, sink: str) -> Any:
    from pystreams.app import App

    app = App(app_id)
    numbers = app.topic(source, value=serdes.Json(type=int))

    @app.map_values(numbers, value=serdes.Json(type=int))
    def doubled(key: Any, n: int) -> int:
        if n == 13:
            raise ValueError("unlucky number")
        return 2 * n

    doubled.to(sink)
    return app


@pytest.mark.parametrize("policy", [ErrorPolicy.LOG_AND_CONTINUE, ErrorPolicy.DEAD_LETTER, ErrorPolicy.FAIL])
def test_error_policies_name_topic_partition_offset_and_reason(
    kafka_bootstrap: str, tmp_path: Path, unique_topic: Callable[[str], str], policy: ErrorPolicy
) -> None:
    source, sink, dead = unique_topic("numbers"), unique_topic("doubled"), unique_topic("dead")
    create_topics(kafka_bootstrap, TopicSpec(source, 1), TopicSpec(sink, 1), TopicSpec(dead, 1))
    # offset 1 cannot be deserialized; offset 3 fails in the map.
    produce(kafka_bootstrap, source, [(None, v, None) for v in (b"1", b"not json", b"2", b"13", b"3")])
    app = _doubling_app(f"errors-{policy}".replace("-", "_"), source, sink)
    resolved = resolve_against_cluster(app.topology(), kafka_bootstrap)
    offsets = OffsetStore()
    engine = TaskEngine(
        resolved,
        EngineConfig(
            kafka_bootstrap,
            tmp_path / "state",
            deserialization_errors=policy,
            processing_errors=policy,
            dead_letter_topic=dead if policy is ErrorPolicy.DEAD_LETTER else None,
        ),
        committed_offsets=offsets.fetch,
        commit_offsets=offsets.commit,
    )
    engine.start()
    try:
        engine.add_tasks(resolved.tasks)
        if policy is ErrorPolicy.FAIL:
            with pytest.raises(RecordProcessingError) as raised:
                engine.run(until=lambda: False, timeout_s=WAIT_S)
            failure = raised.value.failure
            assert (failure.topic, failure.partition, failure.offset) == (source, 0, 1)
            assert "deserialization" in str(raised.value) and f"{source}-0@1" in str(raised.value)
            assert offsets.offsets == {}  # nothing committed past the bad record
            engine.lose_tasks(list(engine.tasks))
            return
        run_until(engine, lambda: engine.records_processed >= 5, "the numbers")
    finally:
        engine.close()
    assert offsets.offsets[TopicPartition(source, 0)] == 5  # skipped records are committed past
    out = [msgspec.json.decode(r.value) for r in read_all(kafka_bootstrap, sink)]
    assert out == [2, 4, 6]
    failures = list(engine.errors.recent_failures)
    assert [(f.kind, f.topic, f.partition, f.offset) for f in failures] == [
        ("deserialization", source, 0, 1),
        ("processing", source, 0, 3),
    ]
    assert failures[1].node == "doubled" and "unlucky number" in failures[1].reason
    if policy is ErrorPolicy.DEAD_LETTER:
        letters = read_all(kafka_bootstrap, dead)
        assert [r.value for r in letters] == [b"not json", b"13"]
        headers = dict(letters[1].headers)
        assert headers["pystreams.error.offset"] == b"3"
        assert headers["pystreams.error.topic"] == source.encode()
        assert b"unlucky number" in headers["pystreams.error.reason"]


def test_revoked_task_commits_and_a_new_owner_continues_where_it_stopped(kafka_bootstrap: str, tmp_path: Path, unique_topic: Callable[[str], str]) -> None:
    source, sink = unique_topic("numbers"), unique_topic("doubled")
    create_topics(kafka_bootstrap, TopicSpec(source, 2), TopicSpec(sink, 1))
    app = _doubling_app("revoke_test", source, sink)
    resolved = resolve_against_cluster(app.topology(), kafka_bootstrap)
    offsets = OffsetStore()
    first, second = (
        TaskEngine(
            resolved,
            EngineConfig(kafka_bootstrap, tmp_path / name),
            committed_offsets=offsets.fetch,
            commit_offsets=offsets.commit,
        )
        for name in ("a", "b")
    )
    first.start()
    second.start()
    try:
        first.add_tasks(resolved.tasks)
        produce(kafka_bootstrap, source, [(str(i).encode(), str(100 + i).encode(), None) for i in range(20)])
        run_until(first, lambda: first.records_processed >= 20, "the first batch")
        revoked = first.revoke_tasks(resolved.tasks)
        assert sum(revoked.values()) == 20 and offsets.offsets == revoked
        assert not first.tasks
        second.add_tasks(resolved.tasks)
        produce(kafka_bootstrap, source, [(str(i).encode(), str(100 + i).encode(), None) for i in range(20, 30)])
        run_until(second, lambda: second.records_processed >= 10, "the second batch")
        assert second.records_processed == 10
    finally:
        first.close()
        second.close()
    out = sorted(msgspec.json.decode(r.value) for r in read_all(kafka_bootstrap, sink))
    assert out == [2 * (100 + i) for i in range(30)]  # each exactly once


def test_lost_tasks_are_dropped_uncommitted_and_rebuilt_from_the_changelog(kafka_bootstrap: str, tmp_path: Path, unique_topic: Callable[[str], str]) -> None:
    from pystreams.app import App

    source, sink = unique_topic("keys"), unique_topic("counts")
    create_topics(kafka_bootstrap, TopicSpec(source, 1), TopicSpec(sink, 1))
    app = App("lose_test")
    app.count(app.topic(source), store="per-key").to(sink)
    resolved = resolve_against_cluster(app.topology(), kafka_bootstrap)
    offsets = OffsetStore()
    engine = TaskEngine(resolved, EngineConfig(kafka_bootstrap, tmp_path / "state"), committed_offsets=offsets.fetch, commit_offsets=offsets.commit)
    engine.start()
    try:
        engine.add_tasks(resolved.tasks)
        produce(kafka_bootstrap, source, [(b"k", b"1", None)] * 3)
        run_until(engine, lambda: engine.records_processed >= 3, "the first records")
        assert offsets.offsets[TopicPartition(source, 0)] == 3
        produce(kafka_bootstrap, source, [(b"k", b"1", None)] * 2)
        deadline = time.monotonic() + WAIT_S
        while engine.records_processed < 5 and time.monotonic() < deadline:
            engine.poll()  # processed, not committed
        assert engine.store_contents("per-key") == {"k": 5}
        engine.lose_tasks(resolved.tasks)
        assert not engine.tasks and offsets.offsets[TopicPartition(source, 0)] == 3
        # Back again: the state is rebuilt from the changelog as of the last commit, and the two
        # uncommitted records are processed again, so each record counts once.
        engine.add_tasks(resolved.tasks)
        assert engine.store_contents("per-key") == {"k": 3}
        run_until(engine, lambda: engine.records_processed >= 2, "the uncommitted records")
        assert engine.store_contents("per-key") == {"k": 5}
    finally:
        engine.close()
    assert latest_by_key(read_all(kafka_bootstrap, sink), serdes.Text(), serdes.Int()) == {"k": 5}


def test_wall_clock_punctuation_fires_without_records(kafka_bootstrap: str, tmp_path: Path, unique_topic: Callable[[str], str]) -> None:
    from pystreams.app import App, Processor, PunctuationType, punctuate

    source, sink = unique_topic("in"), unique_topic("ticks")
    create_topics(kafka_bootstrap, TopicSpec(source, 1), TopicSpec(sink, 1))

    class Ticker(Processor):
        def process(self, key: Any, value: Any) -> None:
            pass

        @punctuate(every=100, on=PunctuationType.WALL_CLOCK_TIME)
        def tick(self, now_ms: int) -> None:
            self.context.forward(str(self.context.task_id), now_ms, timestamp=now_ms)

    app = App("ticker_test")
    app.processor(app.topic(source))(Ticker).to(sink)
    resolved = resolve_against_cluster(app.topology(), kafka_bootstrap)
    engine = TaskEngine(resolved, EngineConfig(kafka_bootstrap, tmp_path / "state", poll_timeout_ms=20))
    engine.start()
    try:
        engine.add_tasks(resolved.tasks)
        started = int(time.time() * 1000)
        engine.run(timeout_s=1.0)
    finally:
        engine.close()
    ticks = [msgspec.json.decode(r.value) for r in read_all(kafka_bootstrap, sink)]
    assert 3 <= len(ticks) <= 11  # every 100 ms for about a second, no records needed
    assert all(t >= started for t in ticks) and ticks == sorted(ticks)


def hourly_committing_engine(resolved: Any, bootstrap: str, tmp_path: Path, offsets: OffsetStore) -> TaskEngine:
    """A started engine whose commit interval (an hour) never comes in a test: every commit it
    makes is one the rule under test asked for."""
    engine = TaskEngine(
        resolved,
        EngineConfig(bootstrap, tmp_path / "state", commit_interval_ms=3_600_000, poll_timeout_ms=50),
        committed_offsets=offsets.fetch,
        commit_offsets=offsets.commit,
    )
    engine.start()
    return engine


def test_a_started_task_commits_its_first_records_at_once_then_at_the_interval(
    kafka_bootstrap: str, tmp_path: Path, unique_topic: Callable[[str], str]
) -> None:
    """A task that just started (it moved here, or its worker restarted) commits as soon as it
    has processed records, so its cached table output shows without waiting a whole commit
    interval; after that, commits come at the interval again."""
    from pystreams.app import App

    source, sink = unique_topic("words"), unique_topic("counts")
    create_topics(kafka_bootstrap, TopicSpec(source, 1), TopicSpec(sink, 1))
    app = App("first_commit_test")
    app.topic(source, key=serdes.Text(), value=serdes.Text()).count(store="counts").to(sink)
    resolved = resolve_against_cluster(app.topology(), kafka_bootstrap)
    offsets = OffsetStore()
    engine = hourly_committing_engine(resolved, kafka_bootstrap, tmp_path, offsets)

    def poll_until(done: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + WAIT_S
        while not done():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            engine.poll()
            engine.maybe_commit()

    try:
        engine.add_tasks(resolved.tasks)
        produce(kafka_bootstrap, source, [(b"fox", b"x", None), (b"dog", b"x", None), (b"fox", b"x", None)])
        poll_until(lambda: engine.records_processed >= 3, "the first records")
        engine.maybe_commit()
        assert offsets.commits == 1 and sum(offsets.offsets.values()) == 3
        assert latest_by_key(read_all(kafka_bootstrap, sink), serdes.Text(), serdes.Int()) == {"fox": 2, "dog": 1}
        produce(kafka_bootstrap, source, [(b"cat", b"x", None)])
        poll_until(lambda: engine.records_processed >= 4, "the next record")
        assert engine.maybe_commit() is None and offsets.commits == 1  # the interval again
    finally:
        engine.close()


def test_a_downstream_task_commits_its_first_records_at_once_too(kafka_bootstrap: str, tmp_path: Path, unique_topic: Callable[[str], str]) -> None:
    """Behind a repartition topic, the count's tasks get their first records only after the
    re-keying tasks committed theirs. Each started task commits its own first records at once:
    the counts show with an hour-long commit interval, without waiting for it."""
    from pystreams.app import App

    source, sink = unique_topic("lines"), unique_topic("counts")
    create_topics(kafka_bootstrap, TopicSpec(source, 1), TopicSpec(sink, 1))
    app = App("downstream_first_commit_test")
    lines = app.topic(source, key=serdes.Text(), value=serdes.Text())

    @app.flat_map(lines)
    def words(key: Any, line: str) -> Any:
        for word in line.split():
            yield word, 1

    app.count(words, store="counts").to(sink)
    resolved = resolve_against_cluster(app.topology(), kafka_bootstrap)
    assert len({task.subtopology for task in resolved.tasks}) == 2
    offsets = OffsetStore()
    engine = hourly_committing_engine(resolved, kafka_bootstrap, tmp_path, offsets)
    try:
        engine.add_tasks(resolved.tasks)
        produce(kafka_bootstrap, source, [(b"1", b"fox dog fox", None)])
        deadline = time.monotonic() + WAIT_S

        def count_task_committed() -> bool:
            return any(tp.topic != source and offset > 0 for tp, offset in offsets.offsets.items())

        while not count_task_committed():
            assert time.monotonic() < deadline, f"the count's tasks did not commit: {offsets.offsets}"
            engine.poll()
            engine.maybe_commit()
        assert engine.store_contents("counts") == {"fox": 2, "dog": 1}
        assert latest_by_key(read_all(kafka_bootstrap, sink), serdes.Text(), serdes.Int()) == {"fox": 2, "dog": 1}
    finally:
        engine.close()


@pytest.mark.parametrize("with_task", [False, True], ids=["idle", "fetching-for-a-task"])
def test_an_engine_thread_runs_a_command_without_waiting_out_its_poll(
    kafka_bootstrap: str, tmp_path: Path, unique_topic: Callable[[str], str], with_task: bool
) -> None:
    """A stream thread waits in its poll: with no tasks, for commands; with tasks and no input,
    for records. The command that brings its first tasks, revokes some in a rebalance, a query
    or stop must not wait the poll out. With a ten-minute poll timeout, only the wake (idle) or
    the fetch's command checks (fetching) can answer inside the test's bound."""
    import asyncio

    from pystreams.worker.engine_thread import EngineThread

    source, sink = unique_topic("numbers"), unique_topic("doubled")
    create_topics(kafka_bootstrap, TopicSpec(source, 1), TopicSpec(sink, 1))
    resolved = resolve_against_cluster(_doubling_app("idle_wake_test", source, sink).topology(), kafka_bootstrap)
    engine = TaskEngine(resolved, EngineConfig(kafka_bootstrap, tmp_path / "state", poll_timeout_ms=600_000))

    async def scenario() -> tuple[int, int]:
        thread = EngineThread(
            "idle-wake",
            engine,
            loop=asyncio.get_running_loop(),
            lag_check_interval_ms=600_000,
            check_lags=lambda now_ms: None,
            on_tasks_migrated=lambda error: None,
            on_failure=lambda error: None,
        )
        await within(thread.start(), WAIT_S)
        if with_task:
            await within(thread.call(lambda: engine.add_tasks([TaskId(0, 0)])), WAIT_S)
        await asyncio.sleep(0.2)  # the thread is inside its poll now
        assert bool(engine.tasks) is with_task
        polls_before = engine.counters.polls
        answer = await within(thread.call(lambda: 41 + 1), WAIT_S)
        await within(thread.stop(WAIT_S), WAIT_S)
        assert not thread.alive, "stop did not end the poll"
        return polls_before, answer

    polls_before, answer = asyncio.run(scenario())
    assert answer == 42
    assert polls_before >= 1  # the command did wait in a poll, and was let in before its end
