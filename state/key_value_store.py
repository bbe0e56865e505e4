"""Key-value store: bytes keys in RocksDB order, the composite key is the key itself."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from operator import itemgetter
from typing import Any, NamedTuple

from .cache import ABSENT, NO_HEADERS, CachedChanges, Headers, Stamps
from .changelog import ChangelogRecord
from .database import WriteBatch
from .store import CachedStore


class KeyValueChange(NamedTuple):
    """Forwarded at flush/eviction: the key's latest value (None: deleted) and, when the store
    was opened with send_old_values, the value it replaced."""

    key: bytes
    value: bytes | None
    old_value: bytes | None
    #: The timestamp of the record that last wrote the key (None: the store has no clock).
    timestamp: int | None = None
    #: That record's headers.
    headers: Headers = NO_HEADERS


_new_tuple = tuple.__new__
_record_key = itemgetter(1)


def _successor(key: bytes) -> bytes:
    """Smallest key greater than ``key``."""
    return key + b"\x00"


def _prefix_end(prefix: bytes) -> bytes | None:
    """Smallest key greater than every key starting with ``prefix`` (None: no such key)."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])


class KeyValueStore(CachedStore[KeyValueChange]):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: Store ``value`` under ``key`` (None deletes, as in Kafka Streams). The cache's own
        #: method: one Python call less on the hottest path.
        self.put: Callable[[bytes, bytes | None], None] = self._cache.put

    def get(self, key: bytes) -> bytes | None:
        cached = self._cache.get(key)
        if cached is not ABSENT:
            return cached
        return self._db.get(key)

    def put_if_absent(self, key: bytes, value: bytes) -> bytes | None:
        """Put only when the key has no value; returns the existing value or None."""
        existing = self.get(key)
        if existing is None:
            self._cache.put(key, value)
        return existing

    def put_all(self, entries: Iterable[tuple[bytes, bytes | None]]) -> None:
        put = self._cache.put
        for key, value in entries:
            put(key, value)

    def delete(self, key: bytes) -> None:
        self._cache.put(key, None)

    def range(self, key_from: bytes | None, key_to: bytes | None) -> Iterator[tuple[bytes, bytes]]:
        """Entries with ``key_from <= key <= key_to`` (both inclusive, as in Kafka Streams;
        None: unbounded), in key order, unflushed writes included."""
        upper = _successor(key_to) if key_to is not None else None
        return self._merged_scan(key_from, upper, self._cache.in_range(key_from, upper))

    def prefix_scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        upper = _prefix_end(prefix)
        return self._merged_scan(prefix, upper, self._cache.in_range(prefix, upper))

    def all(self) -> Iterator[tuple[bytes, bytes]]:
        return self.range(None, None)

    def approximate_count(self) -> int:
        """RocksDB's estimate plus cached writes (may over- or under-count, as in Kafka)."""
        return self._db.estimate_num_keys() + len(self._cache)

    def _changes(self, changes: CachedChanges, old_values: list[bytes | None] | None, stamps: Stamps | None) -> list[KeyValueChange]:
        # tuple.__new__ skips the namedtuple's Python-level __new__: this runs once per key
        # per flush.
        if stamps is None:
            if old_values is None:
                return [_new_tuple(KeyValueChange, (key, value, None, None, NO_HEADERS)) for key, value in changes.items()]
            return [_new_tuple(KeyValueChange, (key, value, old, None, NO_HEADERS)) for (key, value), old in zip(changes.items(), old_values, strict=True)]
        headers = stamps.headers
        if old_values is None:
            return [_new_tuple(KeyValueChange, (key, value, None, stamps.times[key], headers.get(key, NO_HEADERS))) for key, value in changes.items()]
        return [
            _new_tuple(KeyValueChange, (key, value, old, stamps.times[key], headers.get(key, NO_HEADERS)))
            for (key, value), old in zip(changes.items(), old_values, strict=True)
        ]

    def _stage_changes(self, batch: WriteBatch, changes: CachedChanges) -> None:
        put = batch.put
        delete = batch.delete
        for key in sorted(changes):  # key order: faster memtable inserts
            value = changes[key]
            if value is None:
                delete(key)
            else:
                put(key, value)

    def _stage_restored(self, batch: WriteBatch, records: Iterable[ChangelogRecord]) -> tuple[int, int]:
        # The hot loop of restore: no per-record method dispatch, and key order for faster
        # memtable inserts (a stable sort keeps the offset order of records of one key).
        records = records if isinstance(records, list) else list(records)
        if not records:
            return 0, -1
        put = batch.put
        delete = batch.delete
        for _, key, value, _ in sorted(records, key=_record_key):
            if value is None:
                delete(key)
            else:
                put(key, value)
        return len(records), records[-1][0]
