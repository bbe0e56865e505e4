"""The Kafka log's transactional writer: against the embedded broker, and against scripted answers
for the cases a healthy broker does not produce (retries, fencing mid-append, unknown errors)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import kafka.errors as Errors
import pytest
from kafka import KafkaConsumer, TopicPartition

from pystreams.coordinator import log_writer
from pystreams.coordinator.log_writer import Entry, TransactionalWriter, WriterError
from pystreams.protocol import messages as m
from pystreams.protocol.connection import parse_bootstrap
from tests.aio import run_within

GUARD_S = 30


def _entries(prefix: str, count: int, size: int = 10) -> list[Entry]:
    return [(f"{prefix}-{i}".encode(), b"v" * size, (("h", prefix.encode()),)) for i in range(count)]


def _read_committed(bootstrap: str, topic: str) -> list[tuple[bytes, bytes | None, list]]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, isolation_level="read_committed", enable_auto_commit=False)
    partition = TopicPartition(topic, 0)
    consumer.assign([partition])
    consumer.seek_to_beginning(partition)
    out: list[tuple[bytes, bytes | None, list]] = []
    deadline = time.monotonic() + GUARD_S
    try:
        while time.monotonic() < deadline:
            batch = consumer.poll(timeout_ms=200).get(partition, [])
            out.extend((message.key, message.value, list(message.headers)) for message in batch)
            highwater = consumer.highwater(partition)
            if highwater is not None and consumer.position(partition) >= highwater:
                return out
    finally:
        consumer.close()
    raise AssertionError("not read to the end in time")


def _writer(bootstrap: str, topic: str, transactional_id: str = "writer-test") -> TransactionalWriter:
    return TransactionalWriter(parse_bootstrap(bootstrap), topic, 0, f"{transactional_id}-{topic}", client_id="test", timeout_s=10)


@pytest.fixture
def topic(kafka_bootstrap: str, unique_topic: Callable[[str], str]) -> str:
    from pystreams.cluster import ClusterMetadata, TopicSpec

    name = unique_topic("log-writer")
    with ClusterMetadata(kafka_bootstrap) as cluster:
        cluster.ensure_topics([TopicSpec(name, 1, -1, {})])
    return name


def test_appends_are_read_back_in_order_with_their_headers_across_batches(kafka_bootstrap: str, topic: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Small batches: one append spans several record batches whose sequences must continue.
    monkeypatch.setattr(log_writer, "MAX_BATCH_BYTES", 200)
    appends: list[list[Entry]] = [_entries("a", 7, size=40), _entries("b", 1), [(b"tomb", None, ())], _entries("c", 12, size=40)]

    async def scenario() -> int:
        writer = _writer(kafka_bootstrap, topic)
        try:
            await writer.claim()
            for entries in appends:
                await writer.append(entries)
            return writer.transactions
        finally:
            await writer.close()

    assert run_within(scenario(), GUARD_S) == len(appends)
    expected = [(key, value, list(headers)) for entries in appends for key, value, headers in entries]
    assert _read_committed(kafka_bootstrap, topic) == expected


def test_a_new_claim_fences_the_old_writer_for_good(kafka_bootstrap: str, topic: str) -> None:
    async def scenario() -> None:
        old, new = _writer(kafka_bootstrap, topic), _writer(kafka_bootstrap, topic)
        try:
            await old.claim()
            await old.append(_entries("old", 2))
            await new.claim()
            with pytest.raises(WriterError) as fenced:
                await old.append(_entries("zombie", 1))
            assert fenced.value.fenced
            with pytest.raises(WriterError) as again:
                await old.append(_entries("zombie", 1))
            assert again.value.fenced
            await new.append(_entries("new", 1))
        finally:
            await old.close()
            await new.close()

    run_within(scenario(), GUARD_S)
    assert [key for key, _, _ in _read_committed(kafka_bootstrap, topic)] == [b"old-0", b"old-1", b"new-0"]


def test_a_lost_connection_between_appends_is_reopened(kafka_bootstrap: str, topic: str) -> None:
    async def scenario() -> None:
        writer = _writer(kafka_bootstrap, topic)
        try:
            await writer.claim()
            await writer.append(_entries("before", 1))
            for connection in list(writer._connections.values()):
                connection.close(ConnectionResetError("cut"))
            await writer.append(_entries("after", 1))
        finally:
            await writer.close()

    run_within(scenario(), GUARD_S)
    assert [key for key, _, _ in _read_committed(kafka_bootstrap, topic)] == [b"before-0", b"after-0"]


def test_a_produce_sent_twice_is_written_once(kafka_bootstrap: str, topic: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """What makes retrying a Produce whose answer was lost safe: the repeat carries the same
    producer id, epoch and sequence, and the broker keeps one copy."""
    original = TransactionalWriter._send

    async def twice(self, connection, request, deadline):
        if isinstance(request, m.ProduceRequest):
            await original(self, connection, request, deadline)
        return await original(self, connection, request, deadline)

    monkeypatch.setattr(TransactionalWriter, "_send", twice)

    async def scenario() -> None:
        writer = _writer(kafka_bootstrap, topic)
        try:
            await writer.claim()
            await writer.append(_entries("once", 3))
            await writer.append(_entries("again", 1))
        finally:
            await writer.close()

    run_within(scenario(), GUARD_S)
    assert [key for key, _, _ in _read_committed(kafka_bootstrap, topic)] == [b"once-0", b"once-1", b"once-2", b"again-0"]


# --------------------------------------------------------------------------- scripted answers


class ScriptedWriter(TransactionalWriter):
    """A writer whose requests are answered by ``script``: request type -> error codes to answer
    in turn (then 0). Records every request and every lookup."""

    def __init__(self, script: dict[type, list[int]], timeout_s: float = 2.0) -> None:
        super().__init__([("localhost", 1)], "t", 0, "tid", client_id="test", timeout_s=timeout_s)
        self.script = {kind: list(codes) for kind, codes in script.items()}
        self.sent: list[tuple[str, object]] = []
        self.lookups = {"coordinator": 0, "leader": 0}

    async def _coordinator_connection(self, deadline):
        if self._coordinator is None:
            self.lookups["coordinator"] += 1
            self._coordinator = ("coordinator", 1)
        return "coordinator"

    async def _leader_connection(self, deadline):
        if self._leader is None:
            self.lookups["leader"] += 1
            self._leader = ("leader", 1)
        return "leader"

    async def _send(self, connection, request, deadline):
        codes = self.script.get(type(request), [])
        code = codes.pop(0) if codes else 0
        if isinstance(request, m.EndTxnRequest):
            self.sent.append(("EndTxn", request.committed))
            return m.EndTxnResponse(error_code=code)
        if isinstance(request, m.InitProducerIdRequest):
            self.sent.append(("InitProducerId", None))
            return m.InitProducerIdResponse(error_code=code, producer_id=7, producer_epoch=3)
        if isinstance(request, m.AddPartitionsToTxnRequest):
            self.sent.append(("AddPartitionsToTxn", None))
            Result = m.AddPartitionsToTxnResponse.AddPartitionsToTxnTopicResult
            Partition = Result.AddPartitionsToTxnPartitionResult
            return m.AddPartitionsToTxnResponse(
                results_by_topic_v3_and_below=[Result(name="t", results_by_partition=[Partition(partition_index=0, partition_error_code=code)])]
            )
        assert isinstance(request, m.ProduceRequest)
        [topic] = request.topic_data
        [data] = topic.partition_data
        self.sent.append(("Produce", bytes(data.records)))
        Topic = m.ProduceResponse.TopicProduceResponse
        return m.ProduceResponse(responses=[Topic(name="t", partition_responses=[Topic.PartitionProduceResponse(index=0, error_code=code)])])


def _run(writer: ScriptedWriter, appends: int = 1) -> None:
    async def scenario() -> None:
        await writer.claim()
        for _ in range(appends):
            await writer.append(_entries("x", 2))

    asyncio.run(scenario())


def _kinds(writer: ScriptedWriter) -> list[str]:
    return [kind for kind, _ in writer.sent]


def test_busy_and_moved_coordinators_are_retried_and_looked_up_again():
    writer = ScriptedWriter(
        {
            m.InitProducerIdRequest: [Errors.CoordinatorLoadInProgressError.errno],
            m.AddPartitionsToTxnRequest: [Errors.ConcurrentTransactionsError.errno, Errors.NotCoordinatorError.errno],
            m.EndTxnRequest: [Errors.CoordinatorNotAvailableError.errno],
        }
    )
    _run(writer)
    assert _kinds(writer) == ["InitProducerId"] * 2 + ["AddPartitionsToTxn"] * 3 + ["Produce"] + ["EndTxn"] * 2
    assert writer.lookups["coordinator"] == 3  # the first, then after each "moved"
    assert writer.transactions == 1


def test_a_produce_to_a_moved_leader_is_repeated_with_the_same_batch():
    writer = ScriptedWriter({m.ProduceRequest: [Errors.NotLeaderForPartitionError.errno]})
    _run(writer)
    produced = [payload for kind, payload in writer.sent if kind == "Produce"]
    assert len(produced) == 2 and produced[0] == produced[1]
    assert writer.lookups["leader"] == 2


def test_sequences_continue_from_one_append_to_the_next():
    from kafka.record.default_records import DefaultRecordBatch

    writer = ScriptedWriter({})
    _run(writer, appends=3)
    batches = [DefaultRecordBatch(payload) for kind, payload in writer.sent if kind == "Produce"]
    assert [batch.base_sequence for batch in batches] == [0, 2, 4]
    assert {(batch.producer_id, batch.producer_epoch, batch.is_transactional) for batch in batches} == {(7, 3, True)}


def test_an_unknown_error_aborts_the_transaction_and_refuses_later_appends():
    writer = ScriptedWriter({m.ProduceRequest: [Errors.TransactionalIdAuthorizationFailedError.errno]})
    with pytest.raises(WriterError, match="TransactionalIdAuthorizationFailed") as failed:
        _run(writer)
    assert not failed.value.fenced
    assert writer.sent[-1] == ("EndTxn", False)  # aborted
    with pytest.raises(WriterError, match="failed earlier"):
        asyncio.run(writer.append(_entries("y", 1)))


def test_fencing_mid_append_is_final_and_sends_no_abort():
    writer = ScriptedWriter({m.EndTxnRequest: [Errors.ProducerFencedError.errno]})
    with pytest.raises(WriterError) as fenced:
        _run(writer)
    assert fenced.value.fenced
    assert writer.sent[-1] == ("EndTxn", True)


def test_an_answer_that_stays_retriable_fails_at_the_deadline():
    writer = ScriptedWriter({m.AddPartitionsToTxnRequest: [Errors.ConcurrentTransactionsError.errno] * 10_000}, timeout_s=0.3)
    started = time.monotonic()
    with pytest.raises(WriterError, match="still failing at its deadline .*ConcurrentTransactions"):
        _run(writer)
    assert time.monotonic() - started < 5


def test_metadata_without_a_leader_is_a_retry_not_a_crash():
    Broker = m.MetadataResponse.MetadataResponseBroker
    Topic = m.MetadataResponse.MetadataResponseTopic
    Partition = Topic.MetadataResponsePartition
    leaderless = m.MetadataResponse(
        brokers=[Broker(node_id=1, host="h", port=9092)],
        topics=[Topic(name="t", error_code=0, partitions=[Partition(partition_index=0, leader_id=-1, error_code=Errors.LeaderNotAvailableError.errno)])],
    )
    with pytest.raises(log_writer._Retry, match="no leader"):
        log_writer._leader_of(leaderless, "t", 0)
    led = m.MetadataResponse(
        brokers=[Broker(node_id=1, host="h", port=9092)],
        topics=[Topic(name="t", error_code=0, partitions=[Partition(partition_index=0, leader_id=1, error_code=0)])],
    )
    assert log_writer._leader_of(led, "t", 0) == ("h", 9092)
    with pytest.raises(log_writer._Retry, match="no metadata"):
        log_writer._leader_of(led, "other", 0)
