"""A task's stores on Spark: the Spark backend of the one store interface
(``pystreams.state.interface``), kept in Spark state.

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

import bisect
import itertools
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

import msgspec

from pystreams.state.interface import KeyValueBytesStore, SessionBytesStore, WindowBytesStore
from pystreams.state.keys import MAX_TIMESTAMP
from pystreams.state.session_store import Session
from pystreams.state.time_indexed import Retention
from pystreams.state.timestamped import NO_TIMESTAMP, row_value, split_row, stamped
from pystreams.state.versioned_store import _KEYS as _VERSIONED_KEYS
from pystreams.state.versioned_store import VersionedHistories
from pystreams.state.window_store import WindowedValue


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
        #: Every entry in key order, read once and kept until the next write: scans between
        #: writes (a foreign-key join's subscribers of each updated row) share one read.
        self._ordered: list[tuple[bytes, bytes]] | None = None
        self._ordered_keys: list[bytes] = []

    def get(self, key: bytes) -> bytes | None:
        if key not in self._cache:
            self._cache[key] = self._backend.get(key)
        value = self._cache[key]
        return None if value is _DELETED else value

    def put(self, key: bytes, value: bytes | None) -> None:
        self._cache[key] = _DELETED if value is None else value
        self._dirty.pop(key, None)
        self._dirty[key] = None
        self._ordered = None

    def put_if_absent(self, key: bytes, value: bytes) -> bytes | None:
        existing = self.get(key)
        if existing is None:
            self.put(key, value)
        return existing

    def delete(self, key: bytes) -> None:
        self.put(key, None)

    def all(self) -> list[tuple[bytes, bytes]]:
        if self._ordered is None:
            merged = dict(self._backend.items())
            for key in self._dirty:
                value = self._cache[key]
                if value is _DELETED:
                    merged.pop(key, None)
                else:
                    merged[key] = value
            self._ordered = sorted(merged.items())
            self._ordered_keys = [key for key, _ in self._ordered]
        return self._ordered

    def range(self, low: bytes | None, high: bytes | None) -> Iterator[tuple[bytes, bytes]]:
        entries = self.all()
        start = 0 if low is None else bisect.bisect_left(self._ordered_keys, low)
        end = len(entries) if high is None else bisect.bisect_right(self._ordered_keys, high)
        return iter(entries[start:end])

    def prefix_scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Entries whose key starts with ``prefix``, in key order (Spark's ``MapState`` has no
        order to seek in: the first scan after a write reads every key)."""
        entries = self.all()
        start = bisect.bisect_left(self._ordered_keys, prefix)
        return itertools.takewhile(lambda entry: entry[0].startswith(prefix), itertools.islice(entries, start, None))

    def approximate_count(self) -> int:
        return len(self.all())

    @property
    def has_changes(self) -> bool:
        """Writes not flushed yet."""
        return bool(self._dirty)

    def flush(self) -> list[tuple[bytes, bytes | None]]:
        """Write the changes to the backend; returns them, oldest write first."""
        changes: list[tuple[bytes, bytes | None]] = []
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


class SparkTimestampedKeyValueStore(SparkKeyValueStore):
    """A table's key-value store on Spark: each row kept as ``stamped(value, timestamp)``
    (pystreams.state.timestamped's layout); reads see the value alone."""

    def __init__(self, name: str, backend: MapBackend, clock: Any = None) -> None:
        super().__init__(name, backend)
        self._clock = clock
        #: When each deleted row was deleted: its tombstone goes on with that timestamp, as
        #: the worker's cache forwards it.
        self._deleted_at: dict[bytes, int] = {}

    def get(self, key: bytes) -> bytes | None:
        stored = super().get(key)
        return None if stored is None else row_value(stored, self.name)

    def get_timestamped(self, key: bytes) -> tuple[bytes, int] | None:
        stored = super().get(key)
        return None if stored is None else split_row(stored, self.name)

    def put(self, key: bytes, value: bytes | None) -> None:
        self.put_timestamped(key, value, self._clock.timestamp if self._clock is not None else NO_TIMESTAMP)

    def put_timestamped(self, key: bytes, value: bytes | None, timestamp: int) -> None:
        if value is None:
            self._deleted_at[key] = timestamp
        super().put(key, None if value is None else stamped(value, timestamp))

    def all(self) -> list[tuple[bytes, bytes]]:
        return [(key, row_value(value, self.name)) for key, value in super().all()]

    def flush_timestamped(self) -> list[tuple[bytes, bytes | None, int | None]]:
        """The changes as ``(key, value or None, row timestamp or None)``, oldest first; a
        deletion has the timestamp it was made with (None: not known)."""
        deleted_at, self._deleted_at = self._deleted_at, {}
        return [(key, None, _known(deleted_at.get(key))) if value is None else (key, *split_row(value, self.name)) for key, value in super().flush()]


class SparkVersionedStore(VersionedHistories):
    """A versioned table's store on Spark (KIP-889): the worker's rows and rules
    (``state.versioned_store``) over a key-value store in Spark state."""

    def __init__(self, name: str, backend: MapBackend, history_ms: int) -> None:
        self.name = name
        self.history_ms = history_ms
        self._rows = SparkKeyValueStore(name, backend)

    def _read_row(self, key: bytes) -> bytes | None:
        return self._rows.get(key)

    def _write_row(self, key: bytes, value: bytes | None) -> None:
        self._rows.put(key, value)

    def all(self) -> Iterator[tuple[bytes, bytes]]:
        return self._latest((key, value) for key, value in self._rows.all() if key.startswith(_VERSIONED_KEYS))

    def range(self, low: bytes | None, high: bytes | None) -> Iterator[tuple[bytes, bytes]]:
        return ((k, v) for k, v in self.all() if (low is None or k >= low) and (high is None or k <= high))

    def prefix_scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        return ((k, v) for k, v in self.all() if k.startswith(prefix))

    @property
    def has_changes(self) -> bool:
        return self._rows.has_changes

    def flush(self) -> list[tuple[bytes, bytes | None]]:
        """Write back; a versioned table forwards on ``put_version``, not at a flush."""
        return self._rows.flush()


def _known(timestamp: int | None) -> int | None:
    return None if timestamp is None or timestamp == NO_TIMESTAMP else timestamp


class _TimedStore(Retention):
    """What window and session stores share: every entry of a key in one backend value
    (decoded once per batch), the newest time seen (``observed_stream_time``, kept by the
    caller across batches) and expiry ``retention_ms`` behind it. An entry is identified by
    ``Slot`` (a window start or join time; a session's (start, end)); ``_time_of`` gives the
    time retention applies to."""

    def __init__(self, name: str, backend: MapBackend, retention_ms: int, observed_stream_time: int | None) -> None:
        self.name = name
        self.retention_ms = retention_ms
        self.observed_stream_time = observed_stream_time
        self._backend = backend
        self._keys: dict[bytes, dict[Any, bytes]] = {}
        self._changes: dict[tuple[bytes, Any], bytes | None] = {}

    @staticmethod
    def _time_of(slot: Any) -> int:
        raise NotImplementedError

    @staticmethod
    def _encode_entries(entries: dict[Any, bytes]) -> bytes:
        raise NotImplementedError

    @staticmethod
    def _decode_entries(data: bytes) -> dict[Any, bytes]:
        raise NotImplementedError

    def _entries(self, key: bytes) -> dict[Any, bytes]:
        entries = self._keys.get(key)
        if entries is None:
            stored = self._backend.get(key)
            entries = self._keys[key] = self._decode_entries(stored) if stored is not None else {}
        return entries

    def _write(self, key: bytes, slot: Any, value: bytes | None) -> bool:
        if not self._observe(self._time_of(slot)):
            return False
        entries = self._entries(key)
        if value is None:
            entries.pop(slot, None)
        else:
            entries[slot] = value
        self._changes.pop((key, slot), None)
        self._changes[(key, slot)] = value
        return True

    def _live(self, entries: dict[Any, bytes]) -> dict[Any, bytes]:
        live = self.min_live_time
        return {slot: value for slot, value in entries.items() if self._time_of(slot) >= live}

    @property
    def has_changes(self) -> bool:
        """Writes not flushed yet."""
        return bool(self._changes)

    def _flush(self) -> list[tuple[bytes, Any, bytes | None]]:
        """Write the touched keys back (without expired entries); the changes, oldest write
        first."""
        changes = [(key, slot, value) for (key, slot), value in self._changes.items()]
        for key in {key for key, _ in self._changes}:
            self._put_entries(key, self._live(self._keys[key]))
        self._changes.clear()
        return changes

    def _put_entries(self, key: bytes, entries: dict[Any, bytes]) -> None:
        if entries:
            self._backend.put(key, self._encode_entries(entries))
        else:
            self._backend.delete(key)

    def _every_key(self) -> Iterator[tuple[bytes, dict[Any, bytes]]]:
        """Every key's entries: this batch's writes over the stored state."""
        touched = self._keys
        for key, stored in self._backend.items():
            if key not in touched:
                yield key, self._decode_entries(stored)
        yield from touched.items()

    def expire_untouched(self) -> None:
        """Drop expired entries of every key (reads already hide them; this frees the space)."""
        for key, stored in list(self._backend.items()):
            entries = self._decode_entries(stored)
            live = self._live(entries)
            if len(live) < len(entries):
                self._put_entries(key, live)
        self._keys.clear()


_encode = msgspec.msgpack.Encoder().encode
_decode_windows = msgspec.msgpack.Decoder(list[tuple[int, bytes]]).decode
_decode_sessions = msgspec.msgpack.Decoder(list[tuple[int, int, bytes]]).decode


class SparkWindowStore(_TimedStore):
    """Values per (key, time) — an aggregation's window start, or a join record's timestamp."""

    @staticmethod
    def _time_of(slot: int) -> int:
        return slot

    @staticmethod
    def _encode_entries(entries: dict[int, bytes]) -> bytes:
        return _encode(sorted(entries.items()))

    @staticmethod
    def _decode_entries(data: bytes) -> dict[int, bytes]:
        return dict(_decode_windows(data))

    def get(self, key: bytes, window_start: int) -> bytes | None:
        if window_start < self.min_live_time:
            return None
        return self._entries(key).get(window_start)

    def put(self, key: bytes, window_start: int, value: bytes | None) -> bool:
        """Store one window's value (None deletes); False, dropping the write, when it is
        already past retention."""
        return self._write(key, window_start, value)

    def fetch(self, key: bytes, time_from: int, time_to: int) -> Iterator[tuple[int, bytes]]:
        """(time, value) of ``key`` for times in ``[time_from, time_to]``, oldest first."""
        time_from = max(time_from, self.min_live_time)
        entries = self._entries(key)
        return iter([(time, entries[time]) for time in sorted(entries) if time_from <= time <= time_to])

    def flush(self) -> list[tuple[bytes, int, bytes | None]]:
        """The changes as ``(key, time, value or None)``, oldest write first."""
        return self._flush()

    def fetch_all(self, time_from: int, time_to: int) -> list[WindowedValue]:
        """Windows of every key with starts in ``[time_from, time_to]``, by time then key (as
        RocksDB's time index): a scan of the task's whole state, which emit-final pays only
        when stream time closes windows."""
        time_from = max(time_from, self.min_live_time)
        found = [WindowedValue(key, start, value) for key, entries in self._every_key() for start, value in entries.items() if time_from <= start <= time_to]
        found.sort(key=lambda window: (window.window_start, window.key))
        return found

    def all(self) -> list[WindowedValue]:
        """Every live window, by key then start."""
        live = self.min_live_time
        found = [WindowedValue(key, start, value) for key, entries in self._every_key() for start, value in entries.items() if start >= live]
        found.sort(key=lambda window: (window.key, window.window_start))
        return found


class SparkTimestampedWindowStore(SparkWindowStore):
    """A tumbling or hopping aggregation's store on Spark: each window's value kept as
    ``stamped(value, timestamp)``; reads see the value alone."""

    def __init__(self, name: str, backend: MapBackend, retention_ms: int, observed_stream_time: int | None, clock: Any = None) -> None:
        super().__init__(name, backend, retention_ms, observed_stream_time)
        self._clock = clock

    def get(self, key: bytes, window_start: int) -> bytes | None:
        stored = super().get(key, window_start)
        return None if stored is None else row_value(stored, self.name)

    def get_timestamped(self, key: bytes, window_start: int) -> tuple[bytes, int] | None:
        stored = super().get(key, window_start)
        return None if stored is None else split_row(stored, self.name)

    def put(self, key: bytes, window_start: int, value: bytes | None) -> bool:
        return self.put_timestamped(key, window_start, value, self._clock.timestamp if self._clock is not None else NO_TIMESTAMP)

    def put_timestamped(self, key: bytes, window_start: int, value: bytes | None, timestamp: int) -> bool:
        return super().put(key, window_start, None if value is None else stamped(value, timestamp))

    def fetch(self, key: bytes, time_from: int, time_to: int) -> Iterator[tuple[int, bytes]]:
        return ((start, row_value(value, self.name)) for start, value in super().fetch(key, time_from, time_to))

    def fetch_all(self, time_from: int, time_to: int) -> list[WindowedValue]:
        return [window._replace(value=row_value(window.value, self.name)) for window in super().fetch_all(time_from, time_to)]

    def fetch_all_timestamped(self, time_from: int, time_to: int) -> list[tuple[WindowedValue, int]]:
        return [
            (window._replace(value=value), timestamp)
            for window in super().fetch_all(time_from, time_to)
            for value, timestamp in (split_row(window.value, self.name),)
        ]

    def all(self) -> list[WindowedValue]:
        return [window._replace(value=row_value(window.value, self.name)) for window in super().all()]

    def flush_timestamped(self) -> list[tuple[bytes, int, bytes | None, int | None]]:
        """The changes as ``(key, window start, value or None, its timestamp or None)``."""
        return [(key, start, None, None) if value is None else (key, start, *split_row(value, self.name)) for key, start, value in super().flush()]


class SparkSessionStore(_TimedStore):
    """Values per (key, session start, session end), retention on the end."""

    @staticmethod
    def _time_of(slot: tuple[int, int]) -> int:
        return slot[1]

    @staticmethod
    def _encode_entries(entries: dict[tuple[int, int], bytes]) -> bytes:
        return _encode(sorted((start, end, value) for (start, end), value in entries.items()))

    @staticmethod
    def _decode_entries(data: bytes) -> dict[tuple[int, int], bytes]:
        return {(start, end): value for start, end, value in _decode_sessions(data)}

    def find_sessions(self, key: bytes, earliest_session_end: int, latest_session_start: int) -> list[Session]:
        """Sessions of ``key`` ending at or after ``earliest_session_end`` and starting at or
        before ``latest_session_start``, ordered by end, then start (as RocksDB's)."""
        earliest = max(earliest_session_end, self.min_live_time)
        sessions = self._entries(key)
        bounds = sorted(
            ((start, end) for start, end in sessions if end >= earliest and start <= latest_session_start),
            key=lambda session: (session[1], session[0]),
        )
        return [Session(key, start, end, sessions[(start, end)]) for start, end in bounds]

    def fetch(self, key: bytes) -> list[Session]:
        """Every live session of ``key``, by end then start."""
        return self.find_sessions(key, self.min_live_time, MAX_TIMESTAMP)

    def put(self, key: bytes, start: int, end: int, value: bytes | None) -> bool:
        if start > end:
            raise ValueError(f"session start {start} is after its end {end}")
        return self._write(key, (start, end), value)

    def remove(self, key: bytes, start: int, end: int) -> bool:
        return self.put(key, start, end, None)

    def fetch_all_ending(self, end_from: int, end_to: int) -> list[Session]:
        """Sessions of every key ending in ``[end_from, end_to]``, by end, then key and start."""
        end_from = max(end_from, self.min_live_time)
        found = [Session(key, start, end, value) for key, entries in self._every_key() for (start, end), value in entries.items() if end_from <= end <= end_to]
        found.sort(key=lambda session: (session.end, session.key, session.start))
        return found

    def all(self) -> list[Session]:
        """Every live session, by key, then end, then start."""
        live = self.min_live_time
        found = [Session(key, start, end, value) for key, entries in self._every_key() for (start, end), value in entries.items() if end >= live]
        found.sort(key=lambda session: (session.key, session.end, session.start))
        return found

    def flush(self) -> list[tuple[bytes, int, int, bytes | None]]:
        """The changes as ``(key, start, end, value or None)``, oldest write first."""
        return [(key, start, end, value) for key, (start, end), value in self._flush()]


class GroupKeyStore:
    """The store of a node Spark runs per key (``applyInPandasWithState``): it only ever
    holds the group's key, so its row — the value and its timestamp (a table's row, an
    aggregation's result: ``Store.timestamped``) — is all there is."""

    def __init__(self, value: bytes | None, timestamp: int | None = None) -> None:
        self.value = value
        #: The row's timestamp; None: not known (a plain put).
        self.timestamp = timestamp
        self.changed = False

    def get(self, key: bytes) -> bytes | None:
        return self.value

    def put(self, key: bytes, value: bytes | None) -> None:
        self.value, self.timestamp = value, None
        self.changed = True

    def get_timestamped(self, key: bytes) -> tuple[bytes, int] | None:
        if self.value is None:
            return None
        return self.value, NO_TIMESTAMP if self.timestamp is None else self.timestamp

    def put_timestamped(self, key: bytes, value: bytes | None, timestamp: int) -> None:
        self.value, self.timestamp = value, None if value is None else timestamp
        self.changed = True


#: 2: tumbling and hopping aggregations keep each window with its timestamp (``stamped``).
STORE_FORMAT = 2


class TaskClocks(msgspec.Struct, omit_defaults=True):
    """What a task operator keeps besides its stores (one ``ValueState``), all times: the
    task's stream
    time, its windowed nodes' stream times, each store's newest time and how far it was last
    swept, and when each punctuation is next due."""

    #: The layout of the task's stores (``STORE_FORMAT``); 1: before table rows kept their
    #: timestamps (a state without the field).
    store_format: int = 1
    stream_time: int | None = None
    node_clocks: dict[str, int | None] = {}
    store_times: dict[str, int | None] = {}
    swept_to: dict[str, int] = {}
    due: dict[str, int | None] = {}


_encode_task_clocks = msgspec.msgpack.Encoder().encode
_decode_task_clocks = msgspec.msgpack.Decoder(TaskClocks).decode


# Functions, not the codec's bound methods: Spark pickles what an operator refers to, and
# msgspec codecs do not pickle.
def encode_task_clocks(clocks: TaskClocks) -> bytes:
    return _encode_task_clocks(clocks)


def decode_task_clocks(data: bytes) -> TaskClocks:
    return _decode_task_clocks(data)


def needs_sweep(store: Retention, swept_to: int | None) -> bool:
    """Whether expired entries of keys no batch touches should be dropped now: once the
    retention horizon moved a full retention past the last sweep, so sweeps stay rare."""
    live = store.min_live_time
    return swept_to is None or live - swept_to >= store.retention_ms


if TYPE_CHECKING:  # mypy checks that the Spark stores sit behind the one store interface
    _key_value_store: type[KeyValueBytesStore] = SparkKeyValueStore
    _window_store: type[WindowBytesStore] = SparkWindowStore
    _session_store: type[SessionBytesStore] = SparkSessionStore
