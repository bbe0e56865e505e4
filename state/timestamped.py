"""Stores whose rows carry a timestamp (Kafka Streams' ``TimestampedKeyValueStore`` and
``TimestampedWindowStore``, KIP-258): a table's rows, an aggregation's results.

Each value is kept as ``ts(8 bytes, big-endian signed) + value`` in the cache and in RocksDB;
reads (``get``, scans, queries) see the value alone, ``get_timestamped`` both. The changelog
keeps Kafka Streams' layout: the plain value, with the row's timestamp as the record's
timestamp, so a restore rebuilds the same rows and the changelog reads as any table's.

Why rows need their timestamp: Kafka Streams stamps a result with the largest timestamp
folded into it (an aggregation), or the later of the two rows joined (a table–table join), and
that must survive the cache, a commit and a restart."""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from typing import Any, cast

from .cache import ABSENT, CachedChanges, CachedEntry, RecordClock, Stamps
from .changelog import ChangelogRecord
from .database import WriteBatch
from .key_value_store import KeyValueChange, KeyValueStore
from .keys import TIMESTAMP_BYTES, split_window_key, window_key
from .window_store import WindowChange, WindowedValue, WindowStore

#: A row timestamp before its value.
_STAMP = struct.Struct(">q")
_pack = _STAMP.pack
_unpack_from = _STAMP.unpack_from
STAMP_BYTES = _STAMP.size
#: Kafka's "no timestamp": a row restored from a changelog record that had none.
NO_TIMESTAMP = -1
_new_tuple = tuple.__new__


def stamped(value: bytes, timestamp: int) -> bytes:
    """How a row is kept: its timestamp, then its value."""
    return _pack(timestamp) + value


def row_timestamp(stored: bytes) -> int:
    """The timestamp of a row kept by :func:`stamped`."""
    return cast(int, _unpack_from(stored)[0])


class _TimestampedRows:
    """What both timestamped stores share: the clock that stamps a plain ``put``, values
    stripped on every scan, and the changelog's layout on the way out and back in."""

    _clock: RecordClock | None
    changelog: Any
    _sink: Any

    def _now(self) -> int:
        return self._clock.timestamp if self._clock is not None else NO_TIMESTAMP

    def _merged_scan(self, lower: bytes | None, upper: bytes | None, cached: list[CachedEntry]) -> Iterator[tuple[bytes, bytes]]:
        for key, value in super()._merged_scan(lower, upper, cached):  # type: ignore[misc]
            yield key, value[STAMP_BYTES:]

    def _log_changes(self, changes: CachedChanges, stamps: Stamps | None) -> None:
        topic, partition = self.changelog
        send = self._sink.send
        for key, value in changes.items():
            if value is None:
                send(topic, partition, key, None, stamps.get(key) if stamps else None)
            else:
                send(topic, partition, key, value[STAMP_BYTES:], _unpack_from(value)[0])

    def _stage_restored(self, batch: WriteBatch, records: Iterable[ChangelogRecord]) -> tuple[int, int]:
        rows = [(offset, key, None if value is None else _pack(timestamp) + value, timestamp) for offset, key, value, timestamp in records]
        return super()._stage_restored(batch, cast(list[ChangelogRecord], rows))  # type: ignore[misc]


class TimestampedKeyValueStore(_TimestampedRows, KeyValueStore):
    """A table's key-value store: each row with the timestamp Kafka Streams gives it."""

    def __init__(self, *args: Any, record_clock: RecordClock | None = None, **kwargs: Any) -> None:
        super().__init__(*args, record_clock=record_clock, **kwargs)
        self._clock = record_clock
        #: A plain put stamps the row with the timestamp of the record being processed.
        self.put = self._put_now

    def _put_now(self, key: bytes, value: bytes | None) -> None:
        self._cache.put(key, None if value is None else _pack(self._now()) + value)

    def put_timestamped(self, key: bytes, value: bytes | None, timestamp: int) -> None:
        """Store ``value`` (None deletes) as of ``timestamp``."""
        self._cache.put(key, None if value is None else _pack(timestamp) + value)

    def get(self, key: bytes) -> bytes | None:
        stored = KeyValueStore.get(self, key)
        return None if stored is None else stored[STAMP_BYTES:]

    def get_timestamped(self, key: bytes) -> tuple[bytes, int] | None:
        """``(value, timestamp)`` of ``key``'s row, or None."""
        stored = self._cache.get(key)  # KeyValueStore.get, inlined: an aggregation's every record
        if stored is ABSENT:
            stored = self._db.get(key)
        return None if stored is None else (stored[STAMP_BYTES:], _unpack_from(stored)[0])

    def put_if_absent(self, key: bytes, value: bytes) -> bytes | None:
        existing = self.get(key)
        if existing is None:
            self._put_now(key, value)
        return existing

    def put_all(self, entries: Iterable[tuple[bytes, bytes | None]]) -> None:
        for key, value in entries:
            self._put_now(key, value)

    def _changes(self, changes: CachedChanges, old_values: list[bytes | None] | None, stamps: Stamps | None) -> list[KeyValueChange]:
        unstamped = []
        for key, value, old, written_at, headers in KeyValueStore._changes(self, changes, old_values, stamps):
            if value is None:  # a deletion goes on with the deleting record's timestamp
                row = _new_tuple(KeyValueChange, (key, None, None if old is None else old[STAMP_BYTES:], written_at, headers))
            else:
                row = _new_tuple(KeyValueChange, (key, value[STAMP_BYTES:], None if old is None else old[STAMP_BYTES:], _unpack_from(value)[0], headers))
            unstamped.append(row)
        return unstamped


class TimestampedWindowStore(_TimestampedRows, WindowStore):
    """A windowed aggregation's store: each window's value with the largest timestamp folded
    into it."""

    def __init__(self, *args: Any, record_clock: RecordClock | None = None, **kwargs: Any) -> None:
        super().__init__(*args, record_clock=record_clock, **kwargs)
        self._clock = record_clock

    def put(self, key: bytes, window_start: int, value: bytes | None) -> bool:
        return self.put_timestamped(key, window_start, value, self._now())

    def put_timestamped(self, key: bytes, window_start: int, value: bytes | None, timestamp: int) -> bool:
        """Store one window's value (None deletes it) as of ``timestamp``; False, dropping
        the write, when the window is already past retention."""
        if not self._observe(window_start):
            return False
        self._cache.put(window_key(key, window_start), None if value is None else _pack(timestamp) + value)
        return True

    def get(self, key: bytes, window_start: int) -> bytes | None:
        stored = WindowStore.get(self, key, window_start)
        return None if stored is None else stored[STAMP_BYTES:]

    def get_timestamped(self, key: bytes, window_start: int) -> tuple[bytes, int] | None:
        """``(value, timestamp)`` of one window of ``key``, or None."""
        stored = WindowStore.get(self, key, window_start)
        return None if stored is None else (stored[STAMP_BYTES:], _unpack_from(stored)[0])

    def _scan_by_time(self, time_from: int, time_to: int) -> Iterator[tuple[bytes, bytes]]:
        for index_key, value in WindowStore._scan_by_time(self, time_from, time_to):
            yield index_key, value[STAMP_BYTES:]

    def fetch_all_timestamped(self, time_from: int, time_to: int) -> Iterator[tuple[WindowedValue, int]]:
        """``fetch_all`` with each window's timestamp (an emit-final result's)."""
        for index_key, value in WindowStore._scan_by_time(self, time_from, time_to):
            key, window_start = split_window_key(index_key[TIMESTAMP_BYTES:])
            yield WindowedValue(key, window_start, value[STAMP_BYTES:]), _unpack_from(value)[0]

    def _changes(self, changes: CachedChanges, old_values: list[bytes | None] | None, stamps: Stamps | None) -> list[WindowChange]:
        unstamped = []
        for key, window_start, value, old, written_at, headers in WindowStore._changes(self, changes, old_values, stamps):
            old_value = None if old is None else old[STAMP_BYTES:]
            if value is None:
                unstamped.append(WindowChange(key, window_start, None, old_value, written_at, headers))
            else:
                unstamped.append(WindowChange(key, window_start, value[STAMP_BYTES:], old_value, _unpack_from(value)[0], headers))
        return unstamped
