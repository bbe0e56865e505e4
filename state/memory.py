"""The in-memory backend: an ``OrderedBytesDatabase`` in a dict plus a sorted key list, for the
test driver and tests (no RocksDB, no disk). Keys sort bytewise, as in RocksDB, so every
store over it reads exactly as over RocksDB."""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Mapping

from .changelog import TopicPartition
from .database import OrderedBytesDatabase, WriteBatch


class MemoryWriteBatch:
    __slots__ = ("operations",)

    def __init__(self) -> None:
        # ("put", key, value), ("delete", key, None) or ("delete_range", begin, end)
        self.operations: list[tuple[str, bytes, bytes | None]] = []

    def put(self, key: bytes, value: bytes) -> None:
        self.operations.append(("put", key, value))

    def delete(self, key: bytes) -> None:
        self.operations.append(("delete", key, None))

    def delete_range(self, begin: bytes, end: bytes) -> None:
        self.operations.append(("delete_range", begin, end))

    def is_empty(self) -> bool:
        return not self.operations


class MemoryDatabase:
    """Bytes to bytes, in key order. A scan reads the entries as they were when it started,
    as a RocksDB iterator does (writes during it — a cache eviction — are not seen)."""

    def __init__(self) -> None:
        self._values: dict[bytes, bytes] = {}
        self._keys: list[bytes] = []  # sorted

    def new_batch(self) -> WriteBatch:
        return MemoryWriteBatch()

    def get(self, key: bytes) -> bytes | None:
        return self._values.get(key)

    def multi_get(self, keys: list[bytes]) -> list[bytes | None]:
        values = self._values
        return [values.get(key) for key in keys]

    def write(self, batch: WriteBatch) -> None:
        assert isinstance(batch, MemoryWriteBatch)
        for operation, key, argument in batch.operations:
            if operation == "put":
                assert argument is not None
                self._put(key, argument)
            elif operation == "delete":
                self._delete(key)
            else:
                assert argument is not None
                self._delete_range(key, argument)

    def _put(self, key: bytes, value: bytes) -> None:
        if key not in self._values:
            bisect.insort(self._keys, key)
        self._values[key] = value

    def _delete(self, key: bytes) -> None:
        if self._values.pop(key, None) is not None:
            del self._keys[bisect.bisect_left(self._keys, key)]

    def _delete_range(self, begin: bytes, end: bytes) -> None:
        start, stop = self._bounds(begin, end)
        for key in self._keys[start:stop]:
            del self._values[key]
        del self._keys[start:stop]

    def _bounds(self, lower: bytes | None, upper: bytes | None) -> tuple[int, int]:
        keys = self._keys
        start = 0 if lower is None else bisect.bisect_left(keys, lower)
        stop = len(keys) if upper is None else bisect.bisect_left(keys, upper)
        return start, max(start, stop)

    def scan(self, lower: bytes | None = None, upper: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        start, stop = self._bounds(lower, upper)
        values = self._values
        return iter([(key, values[key]) for key in self._keys[start:stop]])

    def last_key(self, lower: bytes, upper: bytes) -> bytes | None:
        start, stop = self._bounds(lower, upper)
        return self._keys[stop - 1] if stop > start else None

    def estimate_num_keys(self) -> int:
        return len(self._keys)

    def flush_memtables(self) -> None:
        """Nothing to persist: memory state lives only as long as the process."""

    def close(self) -> None:
        self._values.clear()
        self._keys.clear()


class MemoryTaskStorage:
    """A task's stores in memory (``TaskState(None, ...)``): nothing to lock, nothing to
    checkpoint — its data lasts as long as the task state, and the changelogs it writes are
    all a restart would have."""

    def read_checkpoint(self) -> dict[TopicPartition, int]:
        return {}

    def open_database(self, name: str, changelog: TopicPartition, position: int | None) -> tuple[OrderedBytesDatabase, int | None]:
        return MemoryDatabase(), position

    def write_checkpoint(self, offsets: Mapping[TopicPartition, int]) -> None:
        """Nothing to write: memory state does not outlive the process."""

    def remove_checkpoint(self) -> None:
        """Nothing written, nothing to remove."""

    def release(self, *, wipe: bool) -> None:
        """The databases went with their stores' close."""
