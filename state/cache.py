"""The record cache in front of a store: it folds writes to the same key between commits.

Only dirty entries are held (a write-back cache, emptied at every flush), so a put is one dict
operation and a flush hands the store exactly one change per key. Entries are kept in
least-recently-written order; when the cache outgrows its limits the oldest entries are
evicted through the store's normal write path (RocksDB, changelog, forward), as Kafka Streams'
NamedCache does.

A store that forwards its changes also stamps each entry with the timestamp of the record that
last wrote it (read from the task's ``RecordClock``), so every flushed change goes downstream
with its own record's time, in write order, as Kafka Streams' cache forwards each entry with its
record context. Stamping them all with the stream time at the flush would let a node downstream
(a suppression) see a time past a window's close before that window's last update arrives.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol

# Rough per-entry cost of a dict slot plus the two bytes objects, so that many tiny records
# still count against max_bytes.
ENTRY_OVERHEAD_BYTES = 64


class _Absent(enum.Enum):
    ABSENT = "absent"


#: "Not in the cache"; a cached None means "deleted in this interval". An enum member, so that
#: ``value is not ABSENT`` narrows the type without a call on the hot path.
ABSENT: Final = _Absent.ABSENT

CachedEntry = tuple[bytes, "bytes | None"]
# Changes handed to the store's write path: key → latest value (None: delete), oldest first.
CachedChanges = dict[bytes, "bytes | None"]
#: Record headers: (name, value bytes) pairs.
Headers = tuple[tuple[str, "bytes | None"], ...]
NO_HEADERS: Headers = ()


class Stamps:
    """The timestamp of the record that last wrote each key (``times``), and in ``headers`` its
    headers when it had any (stores that forward their changes): Kafka Streams' cache keeps
    both, and a table's update goes downstream with them. Two plain dicts, not a dict
    subclass: CPython specializes reads and writes of exact dicts only, and the cache writes a
    timestamp for every record."""

    __slots__ = ("times", "headers")

    def __init__(self) -> None:
        self.times: dict[bytes, int] = {}
        self.headers: dict[bytes, Headers] = {}


class RecordClock(Protocol):
    """The record being processed (the task's context): its timestamp and headers."""

    timestamp: int
    headers: Any


@dataclass(frozen=True, slots=True)
class CacheLimits:
    max_entries: int = 100_000
    max_bytes: int = 10 * 1024 * 1024  # Kafka Streams' statestore.cache.max.bytes default
    # Eviction writes out the oldest entries until the cache is at this fraction of its
    # limits, so an overflowing cache costs one WriteBatch per slice, not one per record.
    evict_to_fraction: float = 0.9

    def __post_init__(self) -> None:
        if self.max_entries < 1 or self.max_bytes < 1:
            raise ValueError("cache limits must be positive")
        if not 0.0 <= self.evict_to_fraction < 1.0:
            raise ValueError("evict_to_fraction must be in [0, 1)")


class _NoRecord:
    """The clock of a cache that has none, or of a stamped store opened without one (a
    standby's, which restores but never writes): no record is being processed."""

    timestamp = -1
    headers = NO_HEADERS


NO_RECORD: Final = _NoRecord()


def _size(key: bytes, value: bytes | None) -> int:
    return len(key) + ENTRY_OVERHEAD_BYTES + (len(value) if value is not None else 0)


class RecordCache:
    """Dirty entries of one store, keyed by the store's composite key.

    ``group_suffix_bytes`` > 0 additionally indexes entries by their key prefix (the
    composite key minus its timestamp suffix), so window and session stores can find the
    cached entries of one user key without scanning the whole cache."""

    __slots__ = ("_entries", "_bytes", "_limits", "_evict", "_groups", "_group_suffix_bytes", "_clock", "_stamps", "_times", "evicted_entries")

    def __init__(
        self,
        limits: CacheLimits,
        evict: Callable[[CachedChanges, Stamps | None], None],
        *,
        group_suffix_bytes: int = 0,
        clock: RecordClock | None = None,
    ) -> None:
        self._entries: dict[bytes, bytes | None] = {}
        self._bytes = 0
        self._limits = limits
        self._evict = evict
        self._group_suffix_bytes = group_suffix_bytes
        self._groups: dict[bytes, set[bytes]] | None = {} if group_suffix_bytes else None
        self._clock: RecordClock = clock if clock is not None else NO_RECORD
        self._stamps: Stamps | None = Stamps() if clock is not None else None
        #: ``_stamps.times``, held directly for the per-record path.
        self._times: dict[bytes, int] | None = None if self._stamps is None else self._stamps.times
        self.evicted_entries = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def size_bytes(self) -> int:
        return self._bytes

    @property
    def limits(self) -> CacheLimits:
        return self._limits

    def get(self, key: bytes) -> bytes | None | Literal[_Absent.ABSENT]:
        """The cached value (None for a delete) or ABSENT."""
        return self._entries.get(key, ABSENT)

    def put(self, key: bytes, value: bytes | None) -> None:
        """Cache ``value`` (None: a delete), stamped with the clock's record."""
        self.put_at(key, value, self._clock.timestamp)

    def put_at(self, key: bytes, value: bytes | None, timestamp: int) -> None:
        """Cache ``value`` stamped with ``timestamp`` (a timestamped store's row timestamp)
        and the headers of the clock's record."""
        entries = self._entries
        previous: Any = entries.pop(key, ABSENT)  # re-inserting moves the key to the young end
        entries[key] = value
        times = self._times
        if times is not None:
            times[key] = timestamp
            headers = self._clock.headers
            if headers:
                self._stamps.headers[key] = tuple(headers)  # type: ignore[union-attr]
            elif self._stamps.headers:  # type: ignore[union-attr]
                self._stamps.headers.pop(key, None)  # type: ignore[union-attr]
        if previous is ABSENT:
            self._bytes += len(key) + ENTRY_OVERHEAD_BYTES + (len(value) if value is not None else 0)
            if self._groups is not None:
                self._add_to_group(self._groups, key)
            if len(entries) > self._limits.max_entries or self._bytes > self._limits.max_bytes:
                self._evict_oldest()
        else:
            self._bytes += (len(value) if value is not None else 0) - (len(previous) if previous is not None else 0)
            if self._bytes > self._limits.max_bytes:
                self._evict_oldest()

    def _add_to_group(self, groups: dict[bytes, set[bytes]], key: bytes) -> None:
        prefix = key[: -self._group_suffix_bytes]
        group = groups.get(prefix)
        if group is None:
            groups[prefix] = {key}
        else:
            group.add(key)

    def _remove_from_group(self, groups: dict[bytes, set[bytes]], key: bytes) -> None:
        prefix = key[: -self._group_suffix_bytes]
        group = groups[prefix]
        group.discard(key)
        if not group:
            del groups[prefix]

    def _evict_oldest(self) -> None:
        target_entries = int(self._limits.max_entries * self._limits.evict_to_fraction)
        target_bytes = int(self._limits.max_bytes * self._limits.evict_to_fraction)
        entries = self._entries
        evicted: CachedChanges = {}
        for key, value in entries.items():
            if len(entries) - len(evicted) <= target_entries and self._bytes <= target_bytes:
                break
            evicted[key] = value
            self._bytes -= _size(key, value)
        groups = self._groups
        for key in evicted:
            del entries[key]
            if groups is not None:
                self._remove_from_group(groups, key)
        stamps = self._stamps
        evicted_stamps = None
        if stamps is not None:
            evicted_stamps = Stamps()
            for key in evicted:
                evicted_stamps.times[key] = stamps.times.pop(key)
                if stamps.headers and key in stamps.headers:
                    evicted_stamps.headers[key] = stamps.headers.pop(key)
        self.evicted_entries += len(evicted)
        self._evict(evicted, evicted_stamps)

    def drain(self) -> CachedChanges:
        """All entries, oldest first, leaving the cache empty."""
        return self.drain_stamped()[0]

    def drain_stamped(self) -> tuple[CachedChanges, Stamps | None]:
        """All entries, oldest first, and their stamps (None: the cache keeps none), leaving
        the cache empty."""
        drained, stamps = self._entries, self._stamps
        self._entries = {}
        self._bytes = 0
        if self._groups is not None:
            self._groups = {}
        if stamps is not None:
            self._stamps = Stamps()
            self._times = self._stamps.times
        return drained, stamps

    def in_range(self, lower: bytes | None, upper: bytes | None) -> list[CachedEntry]:
        """Cached entries with ``lower <= key < upper``, sorted by key (O(cache size))."""
        selected = [(key, value) for key, value in self._entries.items() if (lower is None or key >= lower) and (upper is None or key < upper)]
        selected.sort()
        return selected

    def in_group(self, prefix: bytes, lower: bytes, upper: bytes) -> list[CachedEntry]:
        """Cached entries of one key prefix with ``lower <= key < upper``, sorted by key."""
        assert self._groups is not None, "cache built without group_suffix_bytes"
        group = self._groups.get(prefix)
        if not group:
            return []
        entries = self._entries
        selected = [(key, entries[key]) for key in group if lower <= key < upper]
        selected.sort()
        return selected

    def items(self) -> Iterable[CachedEntry]:
        return self._entries.items()
