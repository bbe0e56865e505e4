"""The one store interface: what kernels, processors (through the typed views of
topology/stores.py) and interactive queries may do with a store of bytes, whatever holds it.

Backends behind it:

* ``KeyValueStore``, ``WindowStore``, ``SessionStore`` (this package) over an
  ``OrderedBytesDatabase`` — RocksDB on workers, memory in the test driver — with a record
  cache, a changelog, restore and checkpoints;
* ``SparkKeyValueStore``, ``SparkWindowStore``, ``SparkSessionStore``
  (pystreams/spark/state.py) over Spark's ``MapState``, which Spark checkpoints itself.

The semantics are one set, tested once against every backend (tests/test_store_semantics.py):
ranges are inclusive and in key-byte order; window and session stores keep ``retention_ms``
behind the newest time they have seen (``min_live_time``), hide and drop what is older, and
refuse writes older than that (``put`` returns False); writing None deletes. Writes are
visible to reads at once; durability (flush, changelog) is the backend's, not part of this
interface.

Versioned key-value stores and suppression buffers are expected to join as further protocols
here, over the same backends.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Protocol

from .session_store import Session
from .window_store import WindowedValue


class KeyValueBytesStore(Protocol):
    @property
    def name(self) -> str: ...

    def get(self, key: bytes) -> bytes | None: ...

    def put(self, key: bytes, value: bytes | None) -> None:
        """Store ``value`` under ``key``; None deletes it."""
        ...

    def put_if_absent(self, key: bytes, value: bytes) -> bytes | None:
        """Put only when the key has no value; returns the existing value or None."""
        ...

    def delete(self, key: bytes) -> None: ...

    def range(self, key_from: bytes | None, key_to: bytes | None) -> Iterable[tuple[bytes, bytes]]:
        """Entries with ``key_from <= key <= key_to`` (None: unbounded), in key order."""
        ...

    def all(self) -> Iterable[tuple[bytes, bytes]]: ...

    def approximate_count(self) -> int: ...


class TimeRetainingStore(Protocol):
    """Retention, shared by window and session stores (``state.time_indexed.Retention``)."""

    retention_ms: int
    observed_stream_time: int | None

    @property
    def name(self) -> str: ...

    @property
    def min_live_time(self) -> int:
        """Entries whose time (window start, session end) is below this are expired."""
        ...


class WindowBytesStore(TimeRetainingStore, Protocol):
    def get(self, key: bytes, window_start: int) -> bytes | None: ...

    def put(self, key: bytes, window_start: int, value: bytes | None) -> bool:
        """Store one window's value (None deletes); False, dropping the write, when the
        window is already past retention."""
        ...

    def fetch(self, key: bytes, time_from: int, time_to: int) -> Iterable[tuple[int, bytes]]:
        """(window_start, value) of ``key`` for starts in ``[time_from, time_to]``, oldest
        first."""
        ...

    def fetch_all(self, time_from: int, time_to: int) -> Iterable[WindowedValue]:
        """Windows of every key with starts in ``[time_from, time_to]``, by start then key."""
        ...

    def all(self) -> Iterable[WindowedValue]:
        """Every live window, by key then start."""
        ...


class SessionBytesStore(TimeRetainingStore, Protocol):
    def put(self, key: bytes, start: int, end: int, value: bytes | None) -> bool:
        """Store a session's value (None removes it); False, dropping the write, when the
        session ended before the retention horizon."""
        ...

    def remove(self, key: bytes, start: int, end: int) -> bool: ...

    def find_sessions(self, key: bytes, earliest_session_end: int, latest_session_start: int) -> Iterable[Session]:
        """Sessions of ``key`` ending at or after ``earliest_session_end`` and starting at or
        before ``latest_session_start``, by end then start."""
        ...

    def fetch(self, key: bytes) -> Iterable[Session]:
        """Every live session of ``key``, by end then start."""
        ...

    def fetch_all_ending(self, end_from: int, end_to: int) -> Iterable[Session]:
        """Sessions of every key ending in ``[end_from, end_to]``, by end, then key, then
        start."""
        ...

    def all(self) -> Iterable[Session]:
        """Every live session, by key, then end, then start."""
        ...


BytesStore = KeyValueBytesStore | WindowBytesStore | SessionBytesStore


if TYPE_CHECKING:  # mypy checks that the stores over a database implement the interface
    from .key_value_store import KeyValueStore
    from .session_store import SessionStore
    from .window_store import WindowStore

    _key_value_store: type[KeyValueBytesStore] = KeyValueStore
    _window_store: type[WindowBytesStore] = WindowStore
    _session_store: type[SessionBytesStore] = SessionStore
