"""The record cache in front of a store: it folds writes to the same key between commits.

Only dirty entries are held (a write-back cache, emptied at every flush), so a put is one dict
operation and a flush hands the store exactly one change per key. Entries are kept in
least-recently-written order; when the cache outgrows its limits the oldest entries are
evicted through the store's normal write path (RocksDB, changelog, forward), as Kafka Streams'
NamedCache does.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final, Literal

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


def _size(key: bytes, value: bytes | None) -> int:
    return len(key) + ENTRY_OVERHEAD_BYTES + (len(value) if value is not None else 0)


class RecordCache:
    """Dirty entries of one store, keyed by the store's composite key.

    ``group_suffix_bytes`` > 0 additionally indexes entries by their key prefix (the
    composite key minus its timestamp suffix), so window and session stores can find the
    cached entries of one user key without scanning the whole cache."""

    __slots__ = ("_entries", "_bytes", "_limits", "_evict", "_groups", "_group_suffix_bytes", "evicted_entries")

    def __init__(
        self,
        limits: CacheLimits,
        evict: Callable[[CachedChanges], None],
        *,
        group_suffix_bytes: int = 0,
    ) -> None:
        self._entries: dict[bytes, bytes | None] = {}
        self._bytes = 0
        self._limits = limits
        self._evict = evict
        self._group_suffix_bytes = group_suffix_bytes
        self._groups: dict[bytes, set[bytes]] | None = {} if group_suffix_bytes else None
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
        entries = self._entries
        previous: Any = entries.pop(key, ABSENT)  # re-inserting moves the key to the young end
        entries[key] = value
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
        self.evicted_entries += len(evicted)
        self._evict(evicted)

    def drain(self) -> CachedChanges:
        """All entries, oldest first, leaving the cache empty."""
        drained = self._entries
        self._entries = {}
        self._bytes = 0
        if self._groups is not None:
            self._groups = {}
        return drained

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
