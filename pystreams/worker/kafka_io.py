"""kafka-python plumbing of the engine: one producer for every output, a manual-assignment
consumer for inputs, a second one for restoring changelogs.

Embedded-broker quirk designed around here: ListOffsets LATEST (``end_offsets``) may return
the last *batch's* base offset + 1 rather than the high watermark, so the true end of a
changelog is found by fetching its last batch (``pystreams.log_ends``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KafkaTopicPartition
from kafka.errors import KafkaTimeoutError

from pystreams.log_ends import true_end_offsets
from pystreams.state import ChangelogRecord, TopicPartition

from .errors import ProduceError
from .packing import RecordHeaders, RepartitionBuffers, RepartitionSink

log = logging.getLogger(__name__)

#: kafka-python's producer is the throughput ceiling; big batches and a short linger matter
#: more than anything else (≈ 29k → 42k rec/s on the embedded broker).
DEFAULT_PRODUCER_CONFIG: dict[str, Any] = {
    "acks": "all",
    "linger_ms": 20,
    "batch_size": 262_144,
}
DEFAULT_CONSUMER_CONFIG: dict[str, Any] = {
    "enable_auto_commit": False,
    "auto_offset_reset": "earliest",
    "max_poll_records": 10_000,
    "fetch_max_wait_ms": 100,
    "max_partition_fetch_bytes": 4 * 1024 * 1024,
}


class BoundedTransactionsProducer(KafkaProducer):
    """kafka-python's producer whose transaction ends can be given a bound.

    kafka-python waits for EndTxn without one, where Kafka's producer gives up after
    ``max.block.ms``. A broker that drops the connection instead of answering (the embedded
    broker does so to a fenced producer's EndTxn; Apache Kafka answers PRODUCER_FENCED) would
    otherwise hold the stream thread for good, and with it the member's tasks."""

    def commit_transaction(self, timeout_ms: int | None = None) -> None:
        self._end_transaction(commit=True, timeout_ms=timeout_ms)

    def abort_transaction(self, timeout_ms: int | None = None) -> None:
        self._end_transaction(commit=False, timeout_ms=timeout_ms)

    def _end_transaction(self, *, commit: bool, timeout_ms: int | None) -> None:
        if timeout_ms is None or self._transaction_manager is None:
            super().commit_transaction() if commit else super().abort_transaction()
            return
        manager = self._transaction_manager
        result = manager.begin_commit() if commit else manager.begin_abort()
        self._sender.wakeup()
        if not result.wait(timeout_ms=timeout_ms):  # raises the request's error if it failed
            raise KafkaTimeoutError(f"{'committing' if commit else 'aborting'} the transaction got no answer in {timeout_ms} ms")


def make_producer(bootstrap_servers: str, client_id: str, overrides: Mapping[str, Any], topics: Iterable[str] = ()) -> KafkaProducer:
    """A producer that keeps metadata for ``topics`` (every topic the caller will write).

    kafka-python tracks a topic only once a send finds it missing from its metadata. The
    embedded broker answers the bootstrap request (no topics) with every topic, so a topic
    can be written without being tracked; the next targeted refresh then drops it and sends
    to it wait for a leader forever. Tracking them all up front closes that race."""
    producer = BoundedTransactionsProducer(
        bootstrap_servers=bootstrap_servers,
        client_id=f"{client_id}-producer",
        **{**DEFAULT_PRODUCER_CONFIG, **overrides},
    )
    for topic in sorted(set(topics)):
        producer._sender.add_topic(topic)  # no public API: what a send does for an unknown topic
    return producer


def make_consumer(bootstrap_servers: str, client_id: str, overrides: Mapping[str, Any]) -> KafkaConsumer:
    # group_id=None: manual assignment only; the group (and its offsets) is ours, not the broker's.
    return KafkaConsumer(
        bootstrap_servers=bootstrap_servers,
        client_id=client_id,
        group_id=None,
        **{**DEFAULT_CONSUMER_CONFIG, **overrides},
    )


class Sender(Protocol):
    """What a task writes through: a worker's ``RecordSender``, or the test driver's
    stand-in (``pystreams.testing``), which keeps records in memory."""

    def send(self, topic: str, key: bytes | None, value: bytes | None, timestamp_ms: int | None, headers: RecordHeaders = ()) -> None: ...

    def send_partitioned(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        timestamp_ms: int | None,
        partitioner: Callable[[bytes, int], int],
        headers: RecordHeaders = (),
    ) -> None:
        """``send``, with a key's partition chosen by ``partitioner(key, partition count)``
        (Kafka Streams' StreamPartitioner) instead of the producer's default."""
        ...

    def send_to_partition(self, topic: str, partition: int, key: bytes | None, value: bytes | None, timestamp_ms: int | None = None) -> Any:
        """Returns the send's future (``is_done``, ``failed()``, ``value.offset``)."""
        ...

    def send_with_headers(self, topic: str, key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes]]) -> None: ...

    def repartition_sink(self, topic: str) -> RepartitionSink: ...


class RecordSender:
    """Sends records through the shared producer and keeps their futures until the next
    ``flush``, which raises if any failed: an output record that was never written must fail
    the commit. (A list append per record; kafka-python's add_errback takes a lock per call.)

    Records for repartition topics are buffered per partition instead and sent packed, one
    Kafka record per partition, by ``send_repartition_buffers`` (and by ``flush``, first)."""

    #: Futures kept between flushes before completed ones are checked and dropped early.
    PRUNE_AT = 200_000

    def __init__(self, producer: KafkaProducer, repartition_partitions: Mapping[str, int] | None = None) -> None:
        self.producer = producer
        self.records_sent = 0
        self._pending: list[Any] = []
        self._send = producer.send
        self.repartition_buffers = RepartitionBuffers(repartition_partitions or {})
        #: Partition counts of topics written with a partitioner of their own (from metadata).
        self._partition_counts: dict[str, int] = {}

    def replace_producer(self, producer: KafkaProducer) -> None:
        """Send through ``producer`` from now on (exactly-once replaces a fenced one); what
        was pending on the old one is forgotten (its transaction is gone)."""
        self.producer = producer
        self._send = producer.send
        self.discard()

    def discard(self) -> None:
        """Forget unsent repartition buffers and unchecked sends (an aborted transaction)."""
        self._pending = []
        self.repartition_buffers.clear()

    def repartition_sink(self, topic: str) -> RepartitionSink:
        return self.repartition_buffers.sink(topic)

    def send_repartition_buffers(self) -> None:
        """Send every buffered repartition record, packed: one Kafka record per partition."""
        send, pending = self._send, self._pending
        for topic, partition, value, headers in self.repartition_buffers.drain():
            pending.append(send(topic, key=None, value=value, partition=partition, headers=headers))

    def send(self, topic: str, key: bytes | None, value: bytes | None, timestamp_ms: int | None, headers: RecordHeaders = ()) -> None:
        pending = self._pending
        pending.append(self._send(topic, key=key, value=value, timestamp_ms=timestamp_ms, headers=list(headers) if headers else None))
        if len(pending) >= self.PRUNE_AT:
            self._check(only_done=True)

    def send_partitioned(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        timestamp_ms: int | None,
        partitioner: Callable[[bytes, int], int],
        headers: RecordHeaders = (),
    ) -> None:
        if key is None:  # no key, nothing to place by: the producer spreads them
            self.send(topic, key, value, timestamp_ms, headers)
            return
        count = self._partition_counts.get(topic)
        if count is None:
            count = self._partition_counts[topic] = len(self.producer.partitions_for(topic))
        self._pending.append(
            self._send(topic, key=key, value=value, timestamp_ms=timestamp_ms, partition=partitioner(key, count), headers=list(headers) if headers else None)
        )

    def send_to_partition(self, topic: str, partition: int, key: bytes | None, value: bytes | None, timestamp_ms: int | None = None) -> Any:
        future = self._send(topic, key=key, value=value, partition=partition, timestamp_ms=timestamp_ms)
        self._pending.append(future)
        return future

    def send_with_headers(self, topic: str, key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes]]) -> None:
        self._pending.append(self._send(topic, key=key, value=value, headers=headers))

    def _check(self, *, only_done: bool) -> None:
        still_pending = []
        sent = 0
        for future in self._pending:
            if not future.is_done:
                if only_done:
                    still_pending.append(future)
                    continue
                raise ProduceError("a produced record is still pending after the producer flushed")
            if future.exception is not None:
                self._pending = []
                raise ProduceError(f"a produced record was not written: {future.exception}") from future.exception
            sent += 1
        self.records_sent += sent
        self._pending = still_pending

    def flush(self, timeout_s: float | None = None) -> None:
        self.send_repartition_buffers()
        self.producer.flush(timeout=timeout_s)
        self._check(only_done=False)


class ProducerChangelogSink:
    """The ``ChangelogSink`` of one task: sends folded store changes to their changelog
    partition and keeps the last send per partition, whose offset (after a producer flush) is
    what ``TaskState.checkpoint(written_offsets)`` needs. Unlogged stores are dropped here."""

    def __init__(self, sender: Sender, logged_topics: frozenset[str]) -> None:
        self._sender = sender
        self._logged_topics = logged_topics
        self._last_send: dict[TopicPartition, Any] = {}

    def send(self, topic: str, partition: int, key: bytes, value: bytes | None, timestamp: int | None = None) -> None:
        if topic not in self._logged_topics:
            return
        self._last_send[TopicPartition(topic, partition)] = self._sender.send_to_partition(topic, partition, key, value, timestamp)

    def take_written_offsets(self) -> dict[TopicPartition, int]:
        """Offsets of the last record written per changelog since the previous call; call
        after the producer flushed (so every future has completed)."""
        written: dict[TopicPartition, int] = {}
        for changelog, future in self._last_send.items():
            if not future.is_done:
                raise ProduceError(f"changelog write to {changelog.topic}-{changelog.partition} is still pending")
            if future.failed():
                raise ProduceError(f"changelog write to {changelog.topic}-{changelog.partition} failed: {future.exception}")
            written[changelog] = future.value.offset
        self._last_send.clear()
        return written

    def discard(self) -> None:
        self._last_send.clear()


def _held(consumer: Any, tp: KafkaTopicPartition) -> int:
    """Records a filtered consumer fetched that wait for their transaction's marker."""
    held = getattr(consumer, "held", None)
    return held(tp) if held is not None else 0


class ChangelogRestorer:
    """Reads changelog partitions for restore with its own manual-assignment consumer.

    Under exactly-once the reading consumer is ``read_committed`` with the transaction filter,
    and ``end_consumer`` (``read_uncommitted``) finds the ends: the embedded broker answers a
    ``read_committed`` ListOffsets with 0 while any transaction is open on the partition."""

    def __init__(self, consumer: Any, *, fetch_timeout_s: float = 30.0, end_consumer: Any = None) -> None:
        self._consumer = consumer
        self._end_consumer = consumer if end_consumer is None else end_consumer
        self._fetch_timeout_s = fetch_timeout_s

    def true_end_offset(self, changelog: TopicPartition) -> int:
        """One past the last record of the partition, checked by fetching the last batch."""
        tp = KafkaTopicPartition(*changelog)
        return true_end_offsets(self._end_consumer, [tp], timeout_s=self._fetch_timeout_s)[tp]

    #: Exactly-once: a read_committed restore that makes no progress this long goes on through
    #: the end consumer (read_uncommitted) behind the transaction filter, which waits for the same
    #: markers. The embedded broker was seen holding its last stable offset back for tens of
    #: seconds after the transactions below it had ended.
    STALL_FALLBACK_S = 5.0

    def read(self, changelog: TopicPartition, start_offset: int | None, end_offset: int) -> Iterator[Sequence[ChangelogRecord]]:
        """Batches of changelog records from ``start_offset`` (None: the beginning) up to
        ``end_offset`` exclusive."""
        tp = KafkaTopicPartition(*changelog)
        consumer = self._consumer
        self._start(consumer, tp, start_offset)
        deadline = time.monotonic() + self._fetch_timeout_s
        stalled_since = time.monotonic()
        next_offset = start_offset
        while consumer.position(tp) < end_offset or _held(consumer, tp):
            records = consumer.poll(timeout_ms=200).get(tp)
            if not records:
                now = time.monotonic()
                if now - stalled_since > self.STALL_FALLBACK_S and consumer is not self._end_consumer and hasattr(self._end_consumer, "held"):
                    log.warning(
                        "restoring %s-%d: read_committed makes no progress at offset %d (end %d); reading on read_uncommitted behind the transaction filter",
                        changelog.topic,
                        changelog.partition,
                        consumer.position(tp),
                        end_offset,
                    )
                    consumer = self._end_consumer
                    self._start(consumer, tp, next_offset)
                    stalled_since = now
                if now > deadline:
                    raise TimeoutError(
                        f"restoring {changelog.topic}-{changelog.partition}: stuck at offset "
                        f"{consumer.position(tp)} before the end {end_offset}"
                        + (f" ({_held(consumer, tp)} records of a transaction not resolved yet)" if _held(consumer, tp) else "")
                    )
                continue
            deadline = time.monotonic() + self._fetch_timeout_s
            stalled_since = time.monotonic()
            next_offset = records[-1].offset + 1
            yield [ChangelogRecord(r.offset, r.key, r.value, r.timestamp) for r in records if r.offset < end_offset]

    @staticmethod
    def _start(consumer: Any, tp: KafkaTopicPartition, offset: int | None) -> None:
        consumer.assign([tp])
        if offset is None:
            consumer.seek_to_beginning(tp)
        else:
            consumer.seek(tp, offset)

    def close(self) -> None:
        self._consumer.close()
        if self._end_consumer is not self._consumer:
            self._end_consumer.close()
