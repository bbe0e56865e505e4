"""What a store needs from the database under it: an ordered map of bytes with atomic
batches. RocksDB (``rocksdb.RocksDatabase``, the worker's) and memory
(``memory.MemoryDatabase``, the test driver's) implement it; the stores above — cache,
changelog, retention, restore — are the same code over either.

Keys order as RocksDB's default comparator orders them: bytewise, a shorter key before every
longer key it prefixes. Python's ``bytes`` comparison is exactly that order, so a range scan
returns the same entries in the same order on every backend."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol


class WriteBatch(Protocol):
    """Writes applied together by ``OrderedBytesDatabase.write``, in the order staged."""

    def put(self, key: bytes, value: bytes) -> None: ...

    def delete(self, key: bytes) -> None: ...

    def delete_range(self, begin: bytes, end: bytes) -> None:
        """Delete every key in ``[begin, end)``."""
        ...

    def is_empty(self) -> bool: ...


class OrderedBytesDatabase(Protocol):
    def new_batch(self) -> WriteBatch: ...

    def get(self, key: bytes) -> bytes | None: ...

    def multi_get(self, keys: list[bytes]) -> list[bytes | None]: ...

    def write(self, batch: WriteBatch) -> None: ...

    def scan(self, lower: bytes | None = None, upper: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        """Entries with ``lower <= key < upper`` in key order (None: unbounded)."""
        ...

    def last_key(self, lower: bytes, upper: bytes) -> bytes | None:
        """Greatest key in ``[lower, upper)``, or None."""
        ...

    def estimate_num_keys(self) -> int: ...

    def flush_memtables(self) -> None:
        """Make every write durable (before a checkpoint names the offsets it covers)."""
        ...

    def close(self) -> None: ...
