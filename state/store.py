"""What every store shares: the record cache, the database write path, the changelog and the
restore path. Subclasses (key-value, window, session) define key layouts and queries. The
database is any ``OrderedBytesDatabase``: RocksDB on workers, memory in the test driver."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Generic, TypeVar

from .cache import ABSENT, NO_RECORD, CachedChanges, CachedEntry, CacheLimits, RecordCache, RecordClock, Stamps
from .changelog import ChangelogRecord, ChangelogSink, TopicPartition, changelog_topic_config
from .database import OrderedBytesDatabase, WriteBatch
from .errors import StateError

log = logging.getLogger(__name__)

ChangeT = TypeVar("ChangeT")


Forward = Callable[[list[ChangeT]], None]


class CachedStore(Generic[ChangeT]):
    """One store of one task: cache → (database batch, changelog, forward) at flush."""

    # Prepended to every composite key in the database; window and session stores also keep a
    # time index in the same database under another section byte.
    _SECTION = b""
    _GROUP_SUFFIX_BYTES = 0
    #: Whether the cache stamps every entry, forwarding or not (a timestamped store keeps its
    #: rows' timestamps there).
    _STAMPED = False

    def __init__(
        self,
        name: str,
        database: OrderedBytesDatabase,
        changelog: TopicPartition,
        sink: ChangelogSink,
        *,
        cache_limits: CacheLimits = CacheLimits(),
        forward: Forward[ChangeT] | None = None,
        send_old_values: bool = False,
        changelog_position: int | None = None,
        record_clock: RecordClock | None = None,
    ) -> None:
        """``record_clock``: where a forwarding store reads the timestamp of the record writing
        it, which each forwarded change carries (without one, changes carry None)."""
        self.name = name
        self.changelog = changelog
        # Next changelog offset this store's contents do not yet include (None: unknown,
        # restore from the beginning).
        self.changelog_position = changelog_position
        self.changelog_records_sent = 0
        self.restored_records = 0
        self._db = database
        self._sink = sink
        self._forward = forward
        self._send_old_values = send_old_values
        clock = record_clock if forward is not None or self._STAMPED else None
        if clock is None and self._STAMPED:
            clock = NO_RECORD
        self._cache = RecordCache(cache_limits, self._write_out, group_suffix_bytes=self._GROUP_SUFFIX_BYTES, clock=clock)
        self._closed = False

    # -- cache ----------------------------------------------------------------------------

    @property
    def cache(self) -> RecordCache:
        return self._cache

    def _cached_or_stored(self, composite: bytes) -> bytes | None:
        cached = self._cache.get(composite)
        if cached is not ABSENT:
            return cached
        return self._value_of_stored(self._db.get(self._SECTION + composite))

    def _value_of_stored(self, stored: bytes | None) -> bytes | None:
        """Hook: a value as the database keeps it, as reads return it."""
        return stored

    def flush(self) -> None:
        """Write every cached change to RocksDB in one batch, send each to the changelog and
        forward it downstream: one record per key since the previous flush."""
        self._check_open()
        entries, stamps = self._cache.drain_stamped()
        if entries:
            self._write_out(entries, stamps)
        self._after_flush()

    def _write_out(self, changes: CachedChanges, stamps: Stamps | None = None) -> None:
        """The write path of flush and eviction: RocksDB, then changelog, then downstream
        (oldest write first, each change with its writer's timestamp from ``stamps``)."""
        section = self._SECTION
        old_values = None
        if self._forward is not None and self._send_old_values:
            old_values = self._db.multi_get([section + key for key in changes])
        batch = self._db.new_batch()
        self._stage_changes(batch, self._stored_changes(changes, stamps))
        self._db.write(batch)
        self._log_changes(changes, stamps)
        self.changelog_records_sent += len(changes)
        if self._forward is not None:
            self._forward(self._changes(changes, old_values, stamps))

    def _stored_changes(self, changes: CachedChanges, stamps: Stamps | None) -> CachedChanges:
        """Hook: the changes as the database keeps them."""
        return changes

    def _log_changes(self, changes: CachedChanges, stamps: Stamps | None) -> None:
        """Send each change to the changelog (the record's timestamp: the producer's)."""
        topic, partition = self.changelog
        send = self._sink.send
        for key, value in changes.items():
            send(topic, partition, key, value)

    def _stage_changes(self, batch: WriteBatch, changes: CachedChanges) -> None:
        # Key order: RocksDB inserts a sorted batch into its memtable much faster.
        stage = self._stage
        for key in sorted(changes):
            stage(batch, key, changes[key])

    def _stage(self, batch: WriteBatch, composite: bytes, value: bytes | None) -> None:
        if value is None:
            batch.delete(self._SECTION + composite)
        else:
            batch.put(self._SECTION + composite, value)

    def _after_flush(self) -> None:
        """Hook: retention for window and session stores."""

    def _changes(self, changes: CachedChanges, old_values: list[bytes | None] | None, stamps: Stamps | None) -> list[ChangeT]:
        raise NotImplementedError

    # -- merged reads ---------------------------------------------------------------------

    def _merged_scan(self, lower: bytes | None, upper: bytes | None, cached: list[CachedEntry]) -> Iterator[tuple[bytes, bytes]]:
        """Composite keys in ``[lower, upper)`` from RocksDB overlaid with ``cached``."""
        section = self._SECTION
        stored = self._db.scan(
            section + lower if lower is not None else (section or None),
            section + upper if upper is not None else section_end(section),
        )
        if section:
            strip = len(section)
            stored = ((db_key[strip:], value) for db_key, value in stored)
        return overlay(self._values_of_stored(stored), cached)

    def _values_of_stored(self, stored: Iterator[tuple[bytes, bytes]]) -> Iterator[tuple[bytes, bytes]]:
        """Hook: scanned database entries as reads return them."""
        return stored

    # -- restore --------------------------------------------------------------------------

    def apply_changelog(self, records: Iterable[ChangelogRecord]) -> int:
        """Apply changelog records in one WriteBatch and advance ``changelog_position``.

        Used for start-up restore and, continuously, by standby and warm-up tasks. Bypasses
        the cache, which must hold no unflushed writes."""
        self._check_open()
        if len(self._cache):
            raise StateError(f"store {self.name}: cannot apply changelog records over {len(self._cache)} unflushed writes")
        batch = self._db.new_batch()
        count, last_offset = self._stage_restored(batch, records)
        if count:
            self._db.write(batch)
            self.changelog_position = last_offset + 1
            self.restored_records += count
            self._after_flush()
        return count

    def _stage_restored(self, batch: WriteBatch, records: Iterable[ChangelogRecord]) -> tuple[int, int]:
        count = 0
        last_offset = -1
        stage = self._stage
        for last_offset, key, value, _ in records:  # noqa: B007  (the loop leaves the last one)
            stage(batch, key, value)
            count += 1
        return count, last_offset

    def advance_position(self, next_offset: int) -> None:
        """Record that the changelog up to ``next_offset`` (exclusive) is reflected here."""
        if self.changelog_position is None or next_offset > self.changelog_position:
            self.changelog_position = next_offset

    # -- lifecycle ------------------------------------------------------------------------

    @property
    def changelog_config(self) -> dict[str, str]:
        """Configs to create this store's changelog topic with (window and session stores
        add their retention)."""
        return changelog_topic_config(None)

    def flush_to_disk(self) -> None:
        """Persist RocksDB memtables (needed before a checkpoint: the WAL is off)."""
        self._check_open()
        self._db.flush_memtables()

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        if self._closed:
            return
        if len(self._cache):
            log.warning("store %s closed with %d unflushed cached writes, dropped", self.name, len(self._cache))
        self._closed = True
        self._db.close()

    def _check_open(self) -> None:
        if self._closed:
            raise StateError(f"store {self.name} is closed")


def overlay(stored: Iterable[tuple[bytes, bytes]], cached: list[CachedEntry]) -> Iterator[tuple[bytes, bytes]]:
    """Merge two key-sorted streams; a cached entry replaces the stored one with the same
    key, and a cached None (a delete not yet flushed) hides it."""
    cached_index = 0
    cached_count = len(cached)
    for key, stored_value in stored:
        while cached_index < cached_count and cached[cached_index][0] < key:
            cached_key, cached_value = cached[cached_index]
            cached_index += 1
            if cached_value is not None:
                yield cached_key, cached_value
        if cached_index < cached_count and cached[cached_index][0] == key:
            cached_value = cached[cached_index][1]
            cached_index += 1
            if cached_value is not None:
                yield key, cached_value
        else:
            yield key, stored_value
    for cached_key, cached_value in cached[cached_index:]:
        if cached_value is not None:
            yield cached_key, cached_value


def section_end(section: bytes) -> bytes | None:
    """Smallest key after every key that starts with ``section`` (None for no section)."""
    if not section:
        return None
    return section[:-1] + bytes([section[-1] + 1])
