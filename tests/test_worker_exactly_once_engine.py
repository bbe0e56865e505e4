"""Exactly-once in one process: task engines with transactional producers against a real broker
(the embedded one, and Apache Kafka in Docker where an engine runs). An engine that "crashes"
mid-transaction is left running, unclosed, like a zombie; a second engine with another
transactional id takes its tasks over, must fence it, and the output read ``read_committed``
must count every word exactly once, each word's counts only going up."""

from __future__ import annotations

import collections
import contextlib
import struct
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from conftest import KafkaUnderTest
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KafkaTopicPartition
from pystreams.state import TopicPartition
from pystreams.topology.ir import TaskId

from pystreams import serdes
from pystreams.app import App
from pystreams.cluster import ClusterMetadata, TopicSpec
from pystreams.guarantee import ProcessingGuarantee
from pystreams.worker import EngineConfig, TaskEngine, resolve_against_cluster
from pystreams.worker.commits import TaskMigratedError
from pystreams.worker.committed_consumer import CommittedConsumer
from pystreams.worker.position_reader import REFENCE_AFTER_S, PositionReader
from pystreams.worker.positions import PositionKind, Resume, encode_position, positions_partition
from pystreams.worker.transaction import CommitOutcome, TransactionState
from pystreams.worker.transactional_producer import fence_transactional_id

pytestmark = pytest.mark.integration

WAIT_S = 60.0
_LONG = struct.Struct(">q")
LINES = [f"w{i % 7} w{i % 3} common" for i in range(300)]


def expected(lines: Iterable[str]) -> collections.Counter[str]:
    return collections.Counter(w for line in lines for w in line.split())


def wordcount(app_id: str, source: str, sink: str) -> App:
    app = App(app_id)
    lines = app.topic(source, value=serdes.Text())

    @app.flat_map(lines)
    def words(key: Any, line: str) -> Iterable[tuple[str, int]]:
        for word in line.split():
            yield word, 1

    @app.aggregate(words, store="counts", initial=0)
    def counts(total: int, key: str, value: int) -> int:
        return total + value

    counts.to(sink)
    return app


def produce(bootstrap: str, topic: str, lines: list[str]) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    for i, line in enumerate(lines):
        producer.send(topic, key=str(i).encode(), value=line.encode())
    producer.flush()
    producer.close()


def read_committed(bootstrap: str, topic: str) -> list[Any]:
    """Every committed record of ``topic`` (read_committed + the transaction filter, to the
    end: no record held for a marker)."""
    ends_reader = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
    consumer = CommittedConsumer(
        KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, isolation_level="read_committed", enable_auto_commit=False, auto_offset_reset="earliest")
    )
    try:
        partitions = [KafkaTopicPartition(topic, p) for p in sorted(ends_reader.partitions_for_topic(topic) or ())]
        ends = ends_reader.end_offsets(partitions)
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        records: list[Any] = []
        deadline = time.monotonic() + WAIT_S
        while any(consumer.position(p) < ends[p] or consumer.held(p) for p in partitions):
            assert time.monotonic() < deadline, f"could not read {topic} to its end read_committed"
            for batch in consumer.poll(timeout_ms=200).values():
                records.extend(batch)
        return records
    finally:
        consumer.close()
        ends_reader.close()


def count_sequences(records: Iterable[Any]) -> dict[str, list[int]]:
    sequences: dict[str, list[int]] = collections.defaultdict(list)
    for record in sorted(records, key=lambda r: (r.partition, r.offset)):
        sequences[record.key.decode()].append(_LONG.unpack(record.value)[0])
    return sequences


def fresh_wordcount(bootstrap: str, label: str) -> tuple[App, str, str]:
    """A word count app on topics of its own: (app, source topic, sink topic)."""
    run = uuid.uuid4().hex[:8]
    source, sink = f"eos-lines-{run}", f"eos-counts-{run}"
    with ClusterMetadata(bootstrap) as cluster:
        cluster.ensure_topics([TopicSpec(source, 2), TopicSpec(sink, 2)])
    return wordcount(f"eos-{label}-{run}", source, sink), source, sink


def engine_for(app: App, bootstrap: str, state_dir: Path, name: str) -> TaskEngine:
    resolved = resolve_against_cluster(app.topology(), bootstrap)
    engine = TaskEngine(
        resolved,
        EngineConfig(
            bootstrap,
            state_dir,
            client_id=name,
            commit_interval_ms=100,
            processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE_V2,
            transactional_id=f"{app.app_id}-{name}",
        ),
    )
    engine.start()
    engine.add_tasks(resolved.tasks)
    return engine


def test_a_takeover_fences_the_crashed_owner_and_every_count_is_exact(any_kafka: KafkaUnderTest, tmp_path: Path) -> None:
    bootstrap = any_kafka.bootstrap_servers
    app, source, sink = fresh_wordcount(bootstrap, "engine")
    half = len(LINES) // 2
    words_in_first_half = sum(expected(LINES[:half]).values())

    first = engine_for(app, bootstrap, tmp_path / "a", "a")
    produce(bootstrap, source, LINES[:half])
    first.run(until=lambda: first.records_processed >= half + words_in_first_half, timeout_s=WAIT_S)
    assert first.records_processed == half + words_in_first_half
    # More input, processed into the open transaction, never committed: then the "crash".
    produce(bootstrap, source, LINES[half:])
    # (Its words go to the repartition topic inside that transaction, so only the lines get
    # processed: the counting side reads read_committed and never sees them.)
    lines_read = half + words_in_first_half + (len(LINES) - half)
    deadline = time.monotonic() + WAIT_S
    while first.records_processed < lines_read and time.monotonic() < deadline:
        first.poll()
    assert first.records_processed == lines_read

    second = engine_for(app, bootstrap, tmp_path / "b", "b")
    total = len(LINES) - half + sum(expected(LINES[half:]).values())
    second.run(until=lambda: second.records_processed >= total, timeout_s=WAIT_S)
    assert second.store_contents("counts") == expected(LINES)
    # The crashed owner comes back to life. Its producer hears it was fenced (as its sender thread
    # would from any batch in flight), after which kafka-python refuses every send: processing
    # new input must drop the tasks (TaskMigrated), not fail the thread, and nothing shows.
    with contextlib.suppress(Exception):
        first._producer.send(sink, key=b"probe", value=b"probe").get(timeout=10)
    produce(bootstrap, source, LINES[:20])
    with pytest.raises(TaskMigratedError, match="producer was fenced"):
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            first.poll()
    assert not first.tasks and first.counters.task_migrations == 1
    first.close()
    more = LINES + LINES[:20]

    try:
        total += 20 + sum(expected(LINES[:20]).values())
        second.run(until=lambda: second.records_processed >= total, timeout_s=WAIT_S)
        assert second.store_contents("counts") == expected(more)
    finally:
        second.close()
    sequences = count_sequences(read_committed(bootstrap, sink))
    assert {w: s[-1] for w, s in sequences.items()} == expected(more)
    for word, counts in sequences.items():
        assert all(a < b for a, b in zip(counts, counts[1:])), f"{word}: counts repeat or go back: {counts}"


def test_positions_commit_with_the_outputs_and_a_restart_resumes_from_them(any_kafka: KafkaUnderTest, tmp_path: Path) -> None:
    bootstrap = any_kafka.bootstrap_servers
    app, source, _ = fresh_wordcount(bootstrap, "resume")
    produce(bootstrap, source, LINES[:50])
    engine = engine_for(app, bootstrap, tmp_path / "state", "a")
    try:
        engine.run(until=lambda: engine.records_processed >= 50 + sum(expected(LINES[:50]).values()), timeout_s=WAIT_S)
    finally:
        engine.close()  # a clean close: releases, checkpoints
    produce(bootstrap, source, LINES[50:80])
    again = engine_for(app, bootstrap, tmp_path / "state", "a")
    try:
        new_work = 30 + sum(expected(LINES[50:80]).values())
        again.run(until=lambda: again.records_processed >= new_work, timeout_s=WAIT_S)
        assert again.records_processed == new_work  # nothing before the positions is redone
        assert again.store_contents("counts") == expected(LINES[:80])
        source_positions = {tp: o for task in again.tasks.values() for tp, o in task.next_offsets.items() if tp.topic == source}
        assert sum(source_positions.values()) == 80
        assert all(isinstance(tp, TopicPartition) for tp in source_positions)
    finally:
        again.close()


# -- the takeover reads positions past other tasks' open transactions -----------------------------


def _transactional_producer(bootstrap: str, transactional_id: str) -> KafkaProducer:
    producer = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=transactional_id, enable_idempotence=True)
    producer.init_transactions()
    return producer


def _write_positions(
    producer: KafkaProducer, topic: str, records: list[tuple[TaskId, PositionKind, str, dict[TopicPartition, int]]], *, commit: bool = True
) -> None:
    producer.begin_transaction()
    for task_id, kind, writer, offsets in records:
        key, value = encode_position(task_id, kind, writer, offsets)
        producer.send(topic, key=key, value=value, partition=positions_partition(task_id))
    producer.flush()
    if commit:
        producer.commit_transaction()


def _positions_topic(bootstrap: str, unique_topic: Any) -> str:
    """A one-partition positions topic of the test's own."""
    topic = unique_topic("positions")
    with ClusterMetadata(bootstrap) as cluster:
        cluster.ensure_topics([TopicSpec(topic, 1)])
    return topic


def _fence(bootstrap: str, transactional_id: str) -> None:
    fence_transactional_id(transactional_id, lambda t: KafkaProducer(bootstrap_servers=bootstrap, transactional_id=t, enable_idempotence=True))


def _position_reader(bootstrap: str, topic: str, fence: Any, timeout_s: float) -> PositionReader:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, auto_offset_reset="earliest")
    return PositionReader(consumer, topic, fence=fence, timeout_s=timeout_s)


@pytest.mark.parametrize("previous_owner_ended", ["released", "crashed"])
def test_a_takeover_sees_positions_committed_behind_another_tasks_open_transaction(
    any_kafka: KafkaUnderTest,
    unique_topic: Any,
    previous_owner_ended: str,
) -> None:
    """Tasks 0_0 and 1_0 share positions partition 0. The owner of 0_0 died with a transaction
    open that holds a position record of 0_0; 1_0's owner committed positions after it. Whoever
    takes 1_0 over must resume from 1_0's latest committed positions: resuming from older ones
    would process again input whose effects its restored store already holds (over-counting)."""
    bootstrap = any_kafka.bootstrap_servers
    topic = _positions_topic(bootstrap, unique_topic)
    run = uuid.uuid4().hex[:8]
    stateless, counting = TaskId(0, 0), TaskId(1, 0)
    lines, words = TopicPartition("lines", 0), TopicPartition("words", 0)
    owner_id, dead_id = f"owner-{run}", f"dead-{run}"
    owner, dead = _transactional_producer(bootstrap, owner_id), _transactional_producer(bootstrap, dead_id)
    _write_positions(owner, topic, [(counting, PositionKind.COMMIT, owner_id, {words: 5})])
    _write_positions(dead, topic, [(stateless, PositionKind.COMMIT, dead_id, {lines: 3})], commit=False)
    _write_positions(owner, topic, [(counting, PositionKind.COMMIT, owner_id, {words: 9})])
    if previous_owner_ended == "released":
        _write_positions(owner, topic, [(counting, PositionKind.RELEASE, owner_id, {words: 12})])
    resume_at = 12 if previous_owner_ended == "released" else 9
    owner.close()
    fenced: list[str] = []

    def fence(writer: str) -> None:
        fenced.append(writer)
        _fence(bootstrap, writer)

    reader = _position_reader(bootstrap, topic, fence, WAIT_S)
    try:
        plans = reader.takeover([counting], me=f"new-{run}")
    finally:
        reader.close()
        dead.close(timeout=2)
    assert plans == {counting: Resume({words: resume_at})}
    assert fenced == ([] if previous_owner_ended == "released" else [owner_id])


def test_a_writer_fenced_once_is_fenced_again_when_its_transactional_id_comes_back(any_kafka: KafkaUnderTest, unique_topic: Any) -> None:
    """A worker restarted on its state directory keeps its transactional id. Fenced once by a
    takeover, it comes back, owns the task again and dies with a transaction open: the next
    takeover by the same thread must fence it again (the first fence cannot have aborted a
    transaction begun after it), not wait for the open transaction until it gives up."""
    bootstrap = any_kafka.bootstrap_servers
    topic = _positions_topic(bootstrap, unique_topic)
    run = uuid.uuid4().hex[:8]
    task, words = TaskId(1, 0), TopicPartition("words", 0)
    writer, me = f"restarting-{run}", f"taker-{run}"
    first = _transactional_producer(bootstrap, writer)
    _write_positions(first, topic, [(task, PositionKind.COMMIT, writer, {words: 5})])
    fenced: list[str] = []

    def fence(transactional_id: str) -> None:
        fenced.append(transactional_id)
        _fence(bootstrap, transactional_id)

    reader = _position_reader(bootstrap, topic, fence, 15.0)
    second = None
    try:
        assert reader.takeover([task], me=me) == {task: Resume({words: 5})}
        assert fenced == [writer]
        second = _transactional_producer(bootstrap, writer)  # the same id, restarted
        _write_positions(second, topic, [(task, PositionKind.COMMIT, writer, {words: 9})])
        _write_positions(second, topic, [(task, PositionKind.COMMIT, writer, {words: 11})], commit=False)
        assert reader.takeover([task], me=me) == {task: Resume({words: 9})}
        assert fenced == [writer, writer]
    finally:
        reader.close()
        first.close(timeout=2)
        if second is not None:
            second.close(timeout=2)


def test_a_takeover_that_waits_too_long_on_a_fenced_writer_fences_it_again(any_kafka: KafkaUnderTest, unique_topic: Any) -> None:
    """A fence that did not reach a writer's open transaction (an incarnation it raced with)
    leaves its position records pending; the takeover fences that writer again after a few
    seconds of waiting instead of stalling until its timeout."""
    bootstrap = any_kafka.bootstrap_servers
    topic = _positions_topic(bootstrap, unique_topic)
    run = uuid.uuid4().hex[:8]
    task, words = TaskId(1, 0), TopicPartition("words", 0)
    writer, me = f"dying-{run}", f"taker-{run}"
    dying = _transactional_producer(bootstrap, writer)
    _write_positions(dying, topic, [(task, PositionKind.COMMIT, writer, {words: 5})])
    _write_positions(dying, topic, [(task, PositionKind.COMMIT, writer, {words: 8})], commit=False)
    fenced: list[str] = []

    def fence(transactional_id: str) -> None:
        fenced.append(transactional_id)
        if len(fenced) > 1:  # the first fence misses (as one racing a new incarnation would)
            _fence(bootstrap, transactional_id)

    reader = _position_reader(bootstrap, topic, fence, REFENCE_AFTER_S * 3)
    try:
        assert reader.takeover([task], me=me) == {task: Resume({words: 5})}
        assert fenced == [writer, writer]
    finally:
        reader.close()
        dying.close(timeout=2)


def test_a_fenced_producer_refused_by_the_coordinator_ends_its_transaction_and_is_replaced(any_kafka: KafkaUnderTest, unique_topic: Any) -> None:
    """A zombie resumed after a takeover fenced it: its records were acknowledged before the
    fence, then the group coordinator refuses its offsets, so it aborts. The broker must not
    hold that abort: Apache Kafka answers PRODUCER_FENCED, the embedded broker drops the
    connection (kafka-python alone would retry for ever). Either way the thread hears that
    its tasks migrated and gets a new producer."""
    import threading

    from pystreams.worker.kafka_io import make_producer
    from pystreams.worker.transaction import MembershipLost
    from pystreams.worker.transactional_producer import TransactionalProducer

    bootstrap = any_kafka.bootstrap_servers
    topic = _positions_topic(bootstrap, unique_topic)
    transactional_id = f"zombie-{uuid.uuid4().hex[:8]}"
    overrides = {"transactional_id": transactional_id, "enable_idempotence": True}
    replaced: list[Any] = []
    zombie = TransactionalProducer(
        transactional_id, lambda: make_producer(bootstrap, "zombie", overrides, [topic]), end_timeout_ms=2_000, on_new_producer=replaced.append
    )
    zombie.ensure_open()
    zombie.producer.send(topic, key=b"k", value=b"v", partition=0)
    zombie.producer.flush()
    _fence(bootstrap, transactional_id)

    def refuse() -> None:
        raise MembershipLost("FENCED_MEMBER_EPOCH")

    outcomes: list[Any] = []
    ending = threading.Thread(target=lambda: outcomes.append(zombie.commit(flush=lambda: None, confirm=refuse)), daemon=True)
    ending.start()
    ending.join(60)
    try:
        assert not ending.is_alive(), "the abort of a fenced producer never ended"
        assert outcomes == [CommitOutcome.MIGRATED]
        assert len(replaced) == 1 and zombie.transaction.state is TransactionState.UNINITIALIZED
    finally:
        zombie.close()
