"""Shared machinery of window and session stores: a time index and retention.

The database holds two sections:

* ``0x01 + composite``                → value   (key-major: queries by key and time)
* ``0x02 + ts(time) + composite``     → b""     (time-major: retention and fetch_all)

where ``time`` is the window start (window store) or the session end (session store).
Retention follows Kafka Streams: the store tracks the largest time it has seen
(observed stream time); entries with time < observed - retention + 1 are expired — dropped
when written, hidden from reads, and deleted from RocksDB at the next flush.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TypeVar

from .cache import CacheLimits, RecordClock
from .changelog import ChangelogRecord, ChangelogSink, TopicPartition, changelog_topic_config
from .database import OrderedBytesDatabase, WriteBatch
from .keys import MAX_TIMESTAMP, MIN_TIMESTAMP, TIMESTAMP_BYTES, decode_timestamp, encode_timestamp
from .store import CachedStore, Forward, overlay

ChangeT = TypeVar("ChangeT")

PRIMARY_SECTION = b"\x01"
TIME_INDEX_SECTION = b"\x02"
_TIME_INDEX_END = b"\x03"
# Bytes to strip from a time-index key to get the composite key back.
_INDEX_PREFIX_BYTES = len(TIME_INDEX_SECTION) + TIMESTAMP_BYTES


def min_live_time(observed_stream_time: int | None, retention_ms: int) -> int:
    """Entries of a store with this retention whose time is below the result are expired:
    Kafka Streams keeps ``retention`` behind the newest time the store has seen. (The Spark
    runtime's stores apply the same rule.)"""
    if observed_stream_time is None:
        return MIN_TIMESTAMP
    return observed_stream_time - retention_ms + 1


class Retention:
    """Kafka Streams' retention for window and session stores: the store tracks the newest
    time it has seen (``observed_stream_time``) and entries older than ``retention_ms``
    behind it are expired. Shared by the RocksDB stores and the Spark runtime's."""

    retention_ms: int
    observed_stream_time: int | None

    @property
    def min_live_time(self) -> int:
        """Entries with an indexed time below this are expired."""
        return min_live_time(self.observed_stream_time, self.retention_ms)

    def _observe(self, time: int) -> bool:
        """Advance stream time; False when ``time`` is already expired."""
        observed = self.observed_stream_time
        if observed is None or time > observed:
            self.observed_stream_time = time
            return True
        return time >= min_live_time(observed, self.retention_ms)


class TimeIndexedStore(CachedStore[ChangeT], Retention):
    _SECTION = PRIMARY_SECTION
    # Where the indexed timestamp sits in the composite key, counted from its end.
    _TIME_FROM_END = TIMESTAMP_BYTES

    def __init__(
        self,
        name: str,
        database: OrderedBytesDatabase,
        changelog: TopicPartition,
        sink: ChangelogSink,
        *,
        retention_ms: int,
        cache_limits: CacheLimits = CacheLimits(),
        forward: Forward[ChangeT] | None = None,
        send_old_values: bool = False,
        changelog_position: int | None = None,
        record_clock: RecordClock | None = None,
    ) -> None:
        if retention_ms < 1:
            raise ValueError("retention_ms must be positive")
        super().__init__(
            name,
            database,
            changelog,
            sink,
            cache_limits=cache_limits,
            forward=forward,
            send_old_values=send_old_values,
            changelog_position=changelog_position,
            record_clock=record_clock,
        )
        self.retention_ms = retention_ms
        self.observed_stream_time: int | None = self._load_observed_stream_time()

    def _load_observed_stream_time(self) -> int | None:
        # Kept implicitly: the newest time in the index. A tombstone of the newest entry
        # loses it, which only makes reads after a restart keep slightly more history.
        last = self._db.last_key(TIME_INDEX_SECTION, _TIME_INDEX_END)
        if last is None:
            return None
        return decode_timestamp(last[1:_INDEX_PREFIX_BYTES])

    @property
    def changelog_config(self) -> dict[str, str]:
        return changelog_topic_config(self.retention_ms)

    def _time_bytes(self, composite: bytes) -> bytes:
        end = len(composite) - self._TIME_FROM_END
        return composite[end : end + TIMESTAMP_BYTES]

    def _stage(self, batch: WriteBatch, composite: bytes, value: bytes | None) -> None:
        index_key = TIME_INDEX_SECTION + self._time_bytes(composite) + composite
        if value is None:
            batch.delete(PRIMARY_SECTION + composite)
            batch.delete(index_key)
        else:
            batch.put(PRIMARY_SECTION + composite, value)
            batch.put(index_key, b"")

    def _stage_restored(self, batch: WriteBatch, records: Iterable[ChangelogRecord]) -> tuple[int, int]:
        count = 0
        last_offset = -1
        stage = self._stage
        observe = self._observe
        time_of = self._time_bytes
        for last_offset, key, value, _ in records:  # noqa: B007  (the loop leaves the last one)
            count += 1
            if observe(decode_timestamp(time_of(key))):
                stage(batch, key, value)
        return count, last_offset

    def _after_flush(self) -> None:
        self.expire()

    def expire(self) -> int:
        """Delete expired entries from RocksDB; returns how many were deleted."""
        if self.observed_stream_time is None:
            return 0
        upper = TIME_INDEX_SECTION + encode_timestamp(self.min_live_time)
        batch = self._db.new_batch()
        expired = 0
        for index_key, _ in self._db.scan(TIME_INDEX_SECTION, upper):
            batch.delete(PRIMARY_SECTION + index_key[_INDEX_PREFIX_BYTES:])
            expired += 1
        if expired:
            batch.delete_range(TIME_INDEX_SECTION, upper)
            self._db.write(batch)
        return expired

    def _scan_by_time(self, time_from: int, time_to: int) -> Iterator[tuple[bytes, bytes]]:
        """(ts(time) + composite, value) for indexed times in ``[time_from, time_to]``,
        in time order, unflushed writes included."""
        time_from = max(time_from, self.min_live_time)
        if time_from > time_to:
            return iter(())
        lower = encode_timestamp(time_from)
        upper = encode_timestamp(time_to + 1) if time_to < MAX_TIMESTAMP else None
        cached = []
        for composite, value in self._cache.items():
            index_key = self._time_bytes(composite) + composite
            if lower <= index_key and (upper is None or index_key < upper):
                cached.append((index_key, value))
        cached.sort()
        return overlay(self._stored_by_time(lower, upper), cached)

    def _stored_by_time(self, lower: bytes, upper: bytes | None) -> Iterator[tuple[bytes, bytes]]:
        chunk: list[bytes] = []
        db_upper = TIME_INDEX_SECTION + upper if upper is not None else _TIME_INDEX_END
        for index_key, _ in self._db.scan(TIME_INDEX_SECTION + lower, db_upper):
            chunk.append(index_key[1:])
            if len(chunk) == 1024:
                yield from self._with_values(chunk)
                chunk = []
        if chunk:
            yield from self._with_values(chunk)

    def _with_values(self, index_keys: list[bytes]) -> Iterator[tuple[bytes, bytes]]:
        values = self._db.multi_get([PRIMARY_SECTION + key[TIMESTAMP_BYTES:] for key in index_keys])
        for key, value in zip(index_keys, values, strict=True):
            if value is not None:
                yield key, self._value_of_stored(value)  # type: ignore[misc]
