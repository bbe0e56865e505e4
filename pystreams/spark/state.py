"""A task's stores on Spark: the byte-store interfaces the kernels use, kept in Spark state.

The Spark runtime runs a stateful node the way a worker runs its task (grouped by task, the
node's kernel over the task's stores); these are those stores. Each keeps its entries in a
``MapBackend`` (Spark's ``MapState`` of key bytes -> bytes; a dict in tests) with a
read-through, write-back cache: a key is read from the backend at most once per micro-batch
and written back once, at ``flush``, which also returns the folded changes (one per key and
window or session) that a table forwards downstream — as the worker's record cache does at a
commit. Window and session stores keep every entry of a key in one backend value and expire
entries by the state layer's retention rule (``min_live_time``), so a node sees exactly what
it would see in the worker's RocksDB stores.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Protocol

import msgspec

from pystreams.state.session_store import Session
from pystreams.state.time_indexed import min_live_time


class MapBackend(Protocol):
    """Where a store's entries live: key bytes -> value bytes."""

    def get(self, key: bytes) -> bytes | None: ...

    def put(self, key: bytes, value: bytes) -> None: ...

    def delete(self, key: bytes) -> None: ...

    def items(self) -> Iterable[tuple[bytes, bytes]]: ...


_DELETED = object()


class SparkKeyValueStore:
    """A key-value store (a processor's, or a table's) over a backend, in bytes. Iteration is
    in key-byte order, as over RocksDB."""

    def __init__(self, name: str, backend: MapBackend) -> None:
        self.name = name
        self._backend = backend
        self._cache: dict[bytes, Any] = {}  # key bytes -> value bytes | None (absent) | _DELETED
        self._dirty: dict[bytes, None] = {}  # in order of the last write

    def get(self, key: bytes) -> bytes | None:
        if key not in self._cache:
            self._cache[key] = self._backend.get(key)
        value = self._cache[key]
        return None if value is _DELETED else value

    def put(self, key: bytes, value: bytes | None) -> None:
        self._cache[key] = _DELETED if value is None else value
        self._dirty.pop(key, None)
        self._dirty[key] = None

    def put_if_absent(self, key: bytes, value: bytes) -> bytes | None:
        existing = self.get(key)
        if existing is None:
            self.put(key, value)
        return existing

    def delete(self, key: bytes) -> None:
        self.put(key, None)

    def all(self) -> list[tuple[bytes, bytes]]:
        merged = dict(self._backend.items())
        for key in self._dirty:
            value = self._cache[key]
            if value is _DELETED:
                merged.pop(key, None)
            else:
                merged[key] = value
        return sorted(merged.items())

    def range(self, low: bytes | None, high: bytes | None) -> Iterator[tuple[bytes, bytes]]:
        return ((k, v) for k, v in self.all() if (low is None or k >= low) and (high is None or k <= high))

    def approximate_count(self) -> int:
        return len(self.all())

    def flush(self) -> list[tuple[bytes, bytes | None]]:
        """Write the changes to the backend; returns them, oldest write first."""
        changes = []
        for key in self._dirty:
            value = self._cache[key]
            if value is _DELETED:
                self._backend.delete(key)
                changes.append((key, None))
            else:
                self._backend.put(key, value)
                changes.append((key, value))
        self._dirty.clear()
        return changes


class _TimedStore:
    """What window and session stores share: the newest time seen (``observed_stream_time``,
    kept by the caller across batches) and expiry ``retention_ms`` behind it."""

    def __init__(self, name: str, backend: MapBackend, retention_ms: int, observed_stream_time: int | None) -> None:
        self.name = name
        self.retention_ms = retention_ms
        self.observed_stream_time = observed_stream_time
        self._backend = backend

    @property
    def min_live_time(self) -> int:
        return min_live_time(self.observed_stream_time, self.retention_ms)

    def _observe(self, time: int) -> bool:
        """Advance the store's time; False when ``time`` is already expired (as RocksDB's)."""
        observed = self.observed_stream_time
        if observed is None or time > observed:
            self.observed_stream_time = time
            return True
        return time >= min_live_time(observed, self.retention_ms)


_encode = msgspec.msgpack.Encoder().encode
_decode_windows = msgspec.msgpack.Decoder(list[tuple[int, bytes]]).decode
_decode_sessions = msgspec.msgpack.Decoder(list[tuple[int, int, bytes]]).decode


class SparkWindowStore(_TimedStore):
    """Values per (key, time) — an aggregation's window start, or a join record's timestamp —
    with every time of a key in one backend value."""

    def __init__(self, name: str, backend: MapBackend, retention_ms: int, observed_stream_time: int | None) -> None:
        super().__init__(name, backend, retention_ms, observed_stream_time)
        self._keys: dict[bytes, dict[int, bytes]] = {}
        self._changes: dict[tuple[bytes, int], bytes | None] = {}

    def _entries(self, key: bytes) -> dict[int, bytes]:
        entries = self._keys.get(key)
        if entries is None:
            stored = self._backend.get(key)
            entries = self._keys[key] = dict(_decode_windows(stored)) if stored is not None else {}
        return entries

    def get(self, key: bytes, window_start: int) -> bytes | None:
        if window_start < self.min_live_time:
            return None
        return self._entries(key).get(window_start)

    def put(self, key: bytes, window_start: int, value: bytes | None) -> bool:
        if not self._observe(window_start):
            return False
        entries = self._entries(key)
        if value is None:
            entries.pop(window_start, None)
        else:
            entries[window_start] = value
        self._changes.pop((key, window_start), None)
        self._changes[(key, window_start)] = value
        return True

    def fetch(self, key: bytes, time_from: int, time_to: int) -> Iterator[tuple[int, bytes]]:
        """(time, value) of ``key`` for times in ``[time_from, time_to]``, oldest first."""
        time_from = max(time_from, self.min_live_time)
        entries = self._entries(key)
        return iter([(time, entries[time]) for time in sorted(entries) if time_from <= time <= time_to])

    def flush(self) -> list[tuple[bytes, int, bytes | None]]:
        """Write the touched keys back (without expired entries); returns the changes as
        ``(key, time, value or None)``, oldest write first."""
        changes = [(key, time, value) for (key, time), value in self._changes.items()]
        live = self.min_live_time
        for key in {key for key, _ in self._changes}:
            kept = sorted((time, value) for time, value in self._keys[key].items() if time >= live)
            if kept:
                self._backend.put(key, _encode(kept))
            else:
                self._backend.delete(key)
        self._changes.clear()
        return changes

    def expire_untouched(self) -> None:
        """Drop expired entries of every key (reads already hide them; this frees the space)."""
        live = self.min_live_time
        for key, stored in list(self._backend.items()):
            entries = _decode_windows(stored)
            kept = [(time, value) for time, value in entries if time >= live]
            if not kept:
                self._backend.delete(key)
            elif len(kept) < len(entries):
                self._backend.put(key, _encode(kept))
        self._keys.clear()


class SparkSessionStore(_TimedStore):
    """Values per (key, session start, session end), retention on the end; every session of a
    key in one backend value."""

    def __init__(self, name: str, backend: MapBackend, retention_ms: int, observed_stream_time: int | None) -> None:
        super().__init__(name, backend, retention_ms, observed_stream_time)
        self._keys: dict[bytes, dict[tuple[int, int], bytes]] = {}
        self._changes: dict[tuple[bytes, int, int], bytes | None] = {}

    def _sessions(self, key: bytes) -> dict[tuple[int, int], bytes]:
        sessions = self._keys.get(key)
        if sessions is None:
            stored = self._backend.get(key)
            sessions = self._keys[key] = (
                {(start, end): value for start, end, value in _decode_sessions(stored)} if stored is not None else {}
            )
        return sessions

    def find_sessions(self, key: bytes, earliest_session_end: int, latest_session_start: int) -> list[Session]:
        """Sessions of ``key`` ending at or after ``earliest_session_end`` and starting at or
        before ``latest_session_start``, ordered by end, then start (as RocksDB's)."""
        earliest = max(earliest_session_end, self.min_live_time)
        bounds = sorted(
            ((start, end) for start, end in self._sessions(key) if end >= earliest and start <= latest_session_start),
            key=lambda session: (session[1], session[0]),
        )
        sessions = self._sessions(key)
        return [Session(key, start, end, sessions[(start, end)]) for start, end in bounds]

    def put(self, key: bytes, start: int, end: int, value: bytes | None) -> bool:
        if start > end:
            raise ValueError(f"session start {start} is after its end {end}")
        if not self._observe(end):
            return False
        sessions = self._sessions(key)
        if value is None:
            sessions.pop((start, end), None)
        else:
            sessions[(start, end)] = value
        self._changes.pop((key, start, end), None)
        self._changes[(key, start, end)] = value
        return True

    def remove(self, key: bytes, start: int, end: int) -> bool:
        return self.put(key, start, end, None)

    def flush(self) -> list[tuple[bytes, int, int, bytes | None]]:
        """Write the touched keys back; returns the changes as ``(key, start, end, value or
        None)``, oldest write first."""
        changes = [(key, start, end, value) for (key, start, end), value in self._changes.items()]
        live = self.min_live_time
        for key in {key for key, _, _ in self._changes}:
            kept = sorted(
                (start, end, value) for (start, end), value in self._keys[key].items() if end >= live
            )
            if kept:
                self._backend.put(key, _encode(kept))
            else:
                self._backend.delete(key)
        self._changes.clear()
        return changes

    def expire_untouched(self) -> None:
        live = self.min_live_time
        for key, stored in list(self._backend.items()):
            sessions = _decode_sessions(stored)
            kept = [session for session in sessions if session[1] >= live]
            if not kept:
                self._backend.delete(key)
            elif len(kept) < len(sessions):
                self._backend.put(key, _encode(kept))
        self._keys.clear()


class GroupKeyStore:
    """The store of a node Spark runs per key (``applyInPandasWithState``): it only ever
    holds the group's key, so the value is all there is."""

    def __init__(self, value: bytes | None) -> None:
        self.value = value
        self.changed = False

    def get(self, key: bytes) -> bytes | None:
        return self.value

    def put(self, key: bytes, value: bytes | None) -> None:
        self.value = value
        self.changed = True


class TaskState(msgspec.Struct, omit_defaults=True):
    """What a task operator keeps besides its stores (one ``ValueState``): the task's stream
    time, its windowed nodes' stream times, each store's newest time and how far it was last
    swept, and when each punctuation is next due."""

    stream_time: int | None = None
    node_clocks: dict[str, int | None] = {}
    store_times: dict[str, int | None] = {}
    swept_to: dict[str, int] = {}
    due: dict[str, int | None] = {}


_encode_task_state = msgspec.msgpack.Encoder().encode
_decode_task_state = msgspec.msgpack.Decoder(TaskState).decode


# Functions, not the codec's bound methods: Spark pickles what an operator refers to, and
# msgspec codecs do not pickle.
def encode_task_state(state: TaskState) -> bytes:
    return _encode_task_state(state)


def decode_task_state(data: bytes) -> TaskState:
    return _decode_task_state(data)


def needs_sweep(store: _TimedStore, swept_to: int | None) -> bool:
    """Whether expired entries of keys no batch touches should be dropped now: once the
    retention horizon moved a full retention past the last sweep, so sweeps stay rare."""
    live = store.min_live_time
    return swept_to is None or live - swept_to >= store.retention_ms
