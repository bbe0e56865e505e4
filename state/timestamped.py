"""Stores whose rows carry a timestamp (Kafka Streams' ``TimestampedKeyValueStore`` and
``TimestampedWindowStore``, KIP-258): a table's rows, an aggregation's results.

Where the timestamp lives:

* in the record cache, beside the plain value: the cache stamps every entry, here with the
  row's timestamp, so the hot path (an aggregation reading and writing one row per record)
  packs nothing;
* in RocksDB, before the value: ``ts(8 bytes, big-endian signed) + value`` (``stamped``),
  packed once per key per flush;
* in the changelog, as Kafka Streams keeps it: the plain value, with the row's timestamp as
  the record's, so a restore rebuilds the same rows and the changelog reads as any table's.

Reads (``get``, scans, queries) see the value alone, ``get_timestamped`` both.

Why rows need their timestamp: Kafka Streams stamps a result with the largest timestamp
folded into it (an aggregation), or the later of the two rows joined (a table–table join), and
that must survive the cache, a commit and a restart."""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from typing import Any, cast

from .cache import ABSENT, CachedChanges, Stamps
from .changelog import ChangelogRecord
from .database import WriteBatch
from .errors import StoreCorruptedError
from .key_value_store import KeyValueChange, KeyValueStore
from .keys import window_key
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
    """How a row is kept outside the cache: its timestamp, then its value."""
    return _pack(timestamp) + value


def row_value(stored: bytes, store: str) -> bytes:
    """The value of a row kept by :func:`stamped`; a row too short for its timestamp is a
    corrupt store (StoreCorruptedError, naming it), never a value read as empty."""
    if len(stored) < STAMP_BYTES:
        raise _short_row(stored, store)
    return stored[STAMP_BYTES:]


def split_row(stored: bytes, store: str) -> tuple[bytes, int]:
    """``(value, timestamp)`` of a row kept by :func:`stamped` (see :func:`row_value`)."""
    if len(stored) < STAMP_BYTES:
        raise _short_row(stored, store)
    return stored[STAMP_BYTES:], cast(int, _unpack_from(stored)[0])


def _short_row(stored: bytes, store: str) -> StoreCorruptedError:
    return StoreCorruptedError(f"store {store}: a timestamped row of {len(stored)} bytes cannot hold its {STAMP_BYTES}-byte timestamp")


class _TimestampedRows:
    """What both timestamped stores share: the database and changelog layouts on the way out
    and back in, and stored values stripped on every read."""

    _STAMPED = True
    name: str
    changelog: Any
    _sink: Any

    def _value_of_stored(self, stored: bytes | None) -> bytes | None:
        return None if stored is None else row_value(stored, self.name)

    def _values_of_stored(self, stored: Iterator[tuple[bytes, bytes]]) -> Iterator[tuple[bytes, bytes]]:
        name = self.name
        for key, value in stored:
            yield key, row_value(value, name)

    def _stored_changes(self, changes: CachedChanges, stamps: Stamps | None) -> CachedChanges:
        assert stamps is not None, "a timestamped store's cache stamps every entry"
        return {key: None if value is None else _pack(stamps.times[key]) + value for key, value in changes.items()}

    def _log_changes(self, changes: CachedChanges, stamps: Stamps | None) -> None:
        assert stamps is not None, "a timestamped store's cache stamps every entry"
        topic, partition = self.changelog
        send = self._sink.send
        for key, value in changes.items():
            send(topic, partition, key, value, stamps.times[key])

    def _stage_restored(self, batch: WriteBatch, records: Iterable[ChangelogRecord]) -> tuple[int, int]:
        rows = [(offset, key, None if value is None else _pack(timestamp) + value, timestamp) for offset, key, value, timestamp in records]
        return super()._stage_restored(batch, cast(list[ChangelogRecord], rows))  # type: ignore[misc]


class TimestampedKeyValueStore(_TimestampedRows, KeyValueStore):
    """A table's key-value store: each row with the timestamp Kafka Streams gives it. A plain
    ``put`` stamps the row with the timestamp of the record being processed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: Store ``value`` (None deletes) as of ``timestamp``: the cache's own method.
        self.put_timestamped = self._cache.put_at

    def get(self, key: bytes) -> bytes | None:
        cached = self._cache.get(key)
        if cached is not ABSENT:
            return cached
        stored = self._db.get(key)
        return None if stored is None else row_value(stored, self.name)

    def get_timestamped(self, key: bytes) -> tuple[bytes, int] | None:
        """``(value, timestamp)`` of ``key``'s row, or None."""
        # The cache's dicts read here, not through its methods: an aggregation calls this for
        # every record, and each Python call more costs it a few percent of its throughput.
        cache = self._cache
        cached = cache._entries.get(key, ABSENT)
        if cached is not ABSENT:
            return None if cached is None else (cached, cache._times[key])  # type: ignore[index]
        stored = self._db.get(key)
        return None if stored is None else split_row(stored, self.name)

    def _changes(self, changes: CachedChanges, old_values: list[bytes | None] | None, stamps: Stamps | None) -> list[KeyValueChange]:
        result = KeyValueStore._changes(self, changes, old_values, stamps)
        if old_values is None:
            return result
        return [change._replace(old_value=None if change.old_value is None else row_value(change.old_value, self.name)) for change in result]


class TimestampedWindowStore(_TimestampedRows, WindowStore):
    """A windowed aggregation's store: each window's value with the largest timestamp folded
    into it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._put_at = self._cache.put_at

    def put_timestamped(self, key: bytes, window_start: int, value: bytes | None, timestamp: int) -> bool:
        """Store one window's value (None deletes it) as of ``timestamp``; False, dropping
        the write, when the window is already past retention."""
        if not self._observe(window_start):
            return False
        self._put_at(window_key(key, window_start), value, timestamp)
        return True

    def get_timestamped(self, key: bytes, window_start: int) -> tuple[bytes, int] | None:
        """``(value, timestamp)`` of one window of ``key``, or None."""
        if window_start < self.min_live_time:
            return None
        composite = window_key(key, window_start)
        cache = self._cache  # its dicts read directly, as in TimestampedKeyValueStore
        cached = cache._entries.get(composite, ABSENT)
        if cached is not ABSENT:
            return None if cached is None else (cached, cache._times[composite])  # type: ignore[index]
        stored = self._db.get(self._SECTION + composite)
        return None if stored is None else split_row(stored, self.name)

    def fetch_all_timestamped(self, time_from: int, time_to: int) -> Iterator[tuple[WindowedValue, int]]:
        """``fetch_all`` with each window's timestamp (an emit-final result's)."""
        for window in self.fetch_all(time_from, time_to):
            found = self.get_timestamped(window.key, window.window_start)
            if found is not None:
                yield window, found[1]

    def _changes(self, changes: CachedChanges, old_values: list[bytes | None] | None, stamps: Stamps | None) -> list[WindowChange]:
        result = WindowStore._changes(self, changes, old_values, stamps)
        if old_values is None:
            return result
        return [change._replace(old_value=None if change.old_value is None else row_value(change.old_value, self.name)) for change in result]
