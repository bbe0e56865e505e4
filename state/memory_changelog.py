"""Changelog partitions held in memory: a ChangelogSink and ChangelogReader for tests, the
simulation harness and benchmarks (no broker involved)."""

from __future__ import annotations

import bisect
from collections.abc import Iterator

from .changelog import ChangelogRecord, TopicPartition


class InMemoryChangelog:
    def __init__(self, read_batch_size: int = 1000) -> None:
        self.read_batch_size = read_batch_size
        self._records: dict[TopicPartition, list[ChangelogRecord]] = {}
        self._end_offsets: dict[TopicPartition, int] = {}
        self._written_since_taken: dict[TopicPartition, int] = {}

    # ChangelogSink
    def send(self, topic: str, partition: int, key: bytes, value: bytes | None, timestamp: int | None = None) -> None:
        changelog = TopicPartition(topic, partition)
        offset = self._end_offsets.get(changelog, 0)
        self._records.setdefault(changelog, []).append(ChangelogRecord(offset, key, value, -1 if timestamp is None else timestamp))
        self._end_offsets[changelog] = offset + 1
        self._written_since_taken[changelog] = offset

    def take_written_offsets(self) -> dict[TopicPartition, int]:
        """Last offset written per partition since the previous call — what a producer's
        delivery reports give the runtime for TaskState.checkpoint()."""
        written, self._written_since_taken = self._written_since_taken, {}
        return written

    # ChangelogReader
    def end_offset(self, changelog: TopicPartition) -> int:
        return self._end_offsets.get(changelog, 0)

    def read(self, changelog: TopicPartition, start_offset: int | None, end_offset: int) -> Iterator[list[ChangelogRecord]]:
        records = self._records.get(changelog, [])
        offsets = [record.offset for record in records]
        position = 0 if start_offset is None else bisect.bisect_left(offsets, start_offset)
        stop = bisect.bisect_left(offsets, end_offset)
        while position < stop:
            batch_end = min(position + self.read_batch_size, stop)
            yield records[position:batch_end]
            position = batch_end

    # inspection and test helpers
    def records(self, changelog: TopicPartition) -> list[ChangelogRecord]:
        return list(self._records.get(changelog, []))

    def partitions(self) -> list[TopicPartition]:
        return sorted(self._records)

    def compact(self, changelog: TopicPartition, *, drop_tombstones: bool = False) -> None:
        """Keep only the latest record per key, offsets unchanged (what log compaction does)."""
        latest: dict[bytes, ChangelogRecord] = {}
        for record in self._records.get(changelog, []):
            latest[record.key] = record
        kept = sorted(latest.values(), key=lambda record: record.offset)
        if drop_tombstones:
            kept = [record for record in kept if record.value is not None]
        self._records[changelog] = kept
