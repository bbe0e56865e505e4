"""A kafka-python consumer whose fetched records pass through the transaction filter.

kafka-python hands a consumer neither producer ids nor transaction markers: its fetcher parses
each fetched batch in ``Fetcher.PartitionRecords`` and drops control batches. So the consumer's
fetcher gets a ``PartitionRecords`` of ours (kafka-python builds one per fetched partition
through ``self.PartitionRecords``) that reads the same batches with kafka-python's own record
parsing, feeds data batches and COMMIT/ABORT markers to the partition's
:class:`~pystreams.worker.transaction_filter.TransactionFilter`, and yields only what the filter
releases. The fetcher's position still moves past every batch it parsed, held ones included:
the filter keeps those until their marker comes (or the partition is sought, which resets it).

This relies on kafka-python 3.0's fetcher internals (``Fetcher.PartitionRecords`` with
``next_fetch_offset``, ``drain`` and ``_deserialize``); :func:`check_fetcher_supported` fails
with a clear message at start-up if another version changed them.

Use it as the KafkaConsumer it wraps: ``poll``, ``assign``, ``seek``, ``seek_to_beginning``,
``position``, ``highwater``, ``end_offsets``, ``close``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import Any

from kafka import KafkaConsumer
from kafka import TopicPartition as KafkaTopicPartition
from kafka.consumer.fetcher import ConsumerRecord, Fetcher
from kafka.errors import CorruptRecordError

from .transaction_filter import NO_TRANSACTION, TransactionFilter

log = logging.getLogger(__name__)


class UnsupportedKafkaClientError(RuntimeError):
    """The installed kafka-python's fetcher is not the one the transaction filter hooks into."""


def check_fetcher_supported() -> None:
    base = getattr(Fetcher, "PartitionRecords", None)
    needed = ("_unpack_records", "drain", "_deserialize", "take")
    if base is None or any(not hasattr(base, name) for name in needed):
        raise UnsupportedKafkaClientError(
            "exactly-once needs kafka-python 3.0's Fetcher.PartitionRecords (to see transaction markers); this kafka-python does not have it"
        )


class _FilteringPartitionRecords(Fetcher.PartitionRecords):
    """One fetched partition's batches, through its filter (set by the consumer's factory)."""

    filters: dict[KafkaTopicPartition, TransactionFilter]
    in_offset_order: bool = True

    def _maybe_skip_record(self, record: Any) -> bool:
        # Records before the fetch offset are skipped while parsing (below); what the filter
        # releases now may be older than this fetch (held since an earlier one) and must pass.
        return False

    def _unpack_records(self, tp: KafkaTopicPartition, records: Any, key_deserializer: Any, value_deserializer: Any) -> Iterator[Any]:
        transaction_filter = self.filters.get(tp)
        if transaction_filter is None:
            transaction_filter = self.filters[tp] = TransactionFilter(in_offset_order=self.in_offset_order)
        fetch_offset = self.fetch_offset
        check_crcs = self.check_crcs
        deserialize = self._deserialize
        topic, partition = tp.topic, tp.partition
        batch = records.next_batch()
        while batch is not None:
            if check_crcs and not batch.validate_crc():
                raise CorruptRecordError(f"record batch of {tp} at offset {batch.base_offset} failed its CRC check")
            if batch.magic >= 2:
                self.leader_epoch = batch.leader_epoch
            if batch.magic >= 2 and batch.is_control_batch:
                try:
                    marker = next(iter(batch), None)
                except Exception as error:  # a key that is not (version, type)
                    raise CorruptRecordError(f"control batch of {tp} at offset {batch.base_offset} is malformed: {error!r}") from error
                if marker is not None and marker.type in (0, 1):  # 0 ABORT, 1 COMMIT; others carry no outcome
                    transaction_filter.add_marker(batch.producer_id, committed=bool(marker.commit))
                self.next_fetch_offset = batch.next_offset
            else:
                parsed = []
                size = 0
                for record in batch:
                    offset = record.offset
                    if offset < fetch_offset:
                        continue  # a fetch from the middle of a batch returns it whole
                    headers = record.headers
                    parsed.append(
                        ConsumerRecord(
                            topic,
                            partition,
                            self.leader_epoch,
                            offset,
                            record.timestamp,
                            record.timestamp_type,
                            deserialize(key_deserializer, topic, headers, record.key),
                            deserialize(value_deserializer, topic, headers, record.value),
                            headers,
                            record.checksum,
                            -1,
                            -1,
                            -1,
                        )
                    )
                    size += record.size_in_bytes
                    self.next_fetch_offset = offset + 1
                if batch.magic >= 2:
                    self.next_fetch_offset = batch.next_offset  # past records compaction removed
                self.records_read += len(parsed)
                self.bytes_read += size
                producer_id = batch.producer_id if batch.magic >= 2 and batch.is_transactional else NO_TRANSACTION
                transaction_filter.add_batch(producer_id, parsed)
            released = transaction_filter.take_released()
            if released:
                yield from released
            batch = records.next_batch()
        self.drain()


class CommittedConsumer:
    """A manual-assignment KafkaConsumer that returns only committed records (see the module
    docstring). ``isolation_level`` is the broker-side setting; the filter applies either way
    (``read_uncommitted`` plus the filter also shows :meth:`pending` transactions).
    ``in_offset_order=False``: each transaction's records come out when it ends, not behind
    other writers' open transactions (for a reader that keeps the latest record per key and
    orders by offset itself; see :mod:`pystreams.worker.transaction_filter`)."""

    def __init__(self, consumer: KafkaConsumer, *, in_offset_order: bool = True) -> None:
        check_fetcher_supported()
        self._consumer = consumer
        self._filters: dict[KafkaTopicPartition, TransactionFilter] = {}
        filters = self._filters

        class Records(_FilteringPartitionRecords):
            pass

        Records.filters = filters
        Records.in_offset_order = in_offset_order
        consumer._fetcher.PartitionRecords = Records  # see check_fetcher_supported

    # -- what the engine uses of a KafkaConsumer ------------------------------------------------

    def poll(self, timeout_ms: int = 0, max_records: int | None = None) -> dict[KafkaTopicPartition, list[Any]]:
        fetched = self._consumer.poll(timeout_ms=timeout_ms, max_records=max_records)
        return {tp: records for tp, records in fetched.items() if records}

    def assign(self, partitions: Iterable[KafkaTopicPartition]) -> None:
        partitions = list(partitions)
        self._consumer.assign(partitions)
        kept = set(partitions)
        for tp in [tp for tp in self._filters if tp not in kept]:
            del self._filters[tp]

    def seek(self, partition: KafkaTopicPartition, offset: int) -> None:
        self._filters.pop(partition, None)
        self._consumer.seek(partition, offset)

    def seek_to_beginning(self, *partitions: KafkaTopicPartition) -> None:
        for tp in partitions or list(self._filters):
            self._filters.pop(tp, None)
        self._consumer.seek_to_beginning(*partitions)

    def position(self, partition: KafkaTopicPartition) -> int:
        return int(self._consumer.position(partition))

    def highwater(self, partition: KafkaTopicPartition) -> int | None:
        return self._consumer.highwater(partition)

    def beginning_offsets(self, partitions: list[KafkaTopicPartition]) -> dict[KafkaTopicPartition, int]:
        return self._consumer.beginning_offsets(partitions)

    def end_offsets(self, partitions: list[KafkaTopicPartition]) -> dict[KafkaTopicPartition, int]:
        return self._consumer.end_offsets(partitions)

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        return self._consumer.partitions_for_topic(topic)

    def close(self) -> None:
        self._consumer.close()

    # -- transactions ---------------------------------------------------------------------------

    def held(self, partition: KafkaTopicPartition) -> int:
        """Records of ``partition`` fetched but waiting for a transaction marker."""
        transaction_filter = self._filters.get(partition)
        return transaction_filter.held if transaction_filter is not None else 0

    def pending(self, partition: KafkaTopicPartition) -> list[tuple[int, Any]]:
        """(producer id, records) of the partition's transactions with no marker yet."""
        transaction_filter = self._filters.get(partition)
        return transaction_filter.pending() if transaction_filter is not None else []

    @property
    def aborted_records(self) -> int:
        """Records of aborted transactions dropped (since each partition was last sought)."""
        return sum(f.aborted_records for f in self._filters.values())
