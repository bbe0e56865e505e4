"""Session store: values per (key, session start, session end), with retention on the end.

Composite key (also the changelog key): ``escaped(key) + ts(end) + ts(start)``; see keys.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

from .cache import NO_HEADERS, CachedChanges, Headers, Stamps
from .keys import (
    MAX_TIMESTAMP,
    SESSION_SUFFIX_BYTES,
    TIMESTAMP_BYTES,
    encode_timestamp,
    escape_key,
    key_prefix_end,
    session_end_of,
    session_key,
    session_start_of,
    split_session_key,
)
from .time_indexed import TimeIndexedStore


class SessionChange(NamedTuple):
    key: bytes
    start: int
    end: int
    value: bytes | None  # None: the session was removed (merged into another, usually)
    old_value: bytes | None  # only with send_old_values
    timestamp: int | None = None  # of the record that last wrote it (None: the store has no clock)
    headers: Headers = NO_HEADERS  # that record's


class Session(NamedTuple):
    key: bytes
    start: int
    end: int
    value: bytes


def _check_bounds(start: int, end: int) -> None:
    if start > end:
        raise ValueError(f"session start {start} is after its end {end}")


class SessionStore(TimeIndexedStore[SessionChange]):
    _GROUP_SUFFIX_BYTES = SESSION_SUFFIX_BYTES
    _TIME_FROM_END = SESSION_SUFFIX_BYTES  # the end time comes first in the suffix

    def put(self, key: bytes, start: int, end: int, value: bytes | None) -> bool:
        """Store a session's value (None removes it). Returns False, dropping the write,
        when the session ended before the retention horizon."""
        _check_bounds(start, end)
        if not self._observe(end):
            return False
        self._cache.put(session_key(key, start, end), value)
        return True

    def remove(self, key: bytes, start: int, end: int) -> bool:
        return self.put(key, start, end, None)

    def fetch_session(self, key: bytes, start: int, end: int) -> bytes | None:
        _check_bounds(start, end)
        if end < self.min_live_time:
            return None
        return self._cached_or_stored(session_key(key, start, end))

    def find_sessions(self, key: bytes, earliest_session_end: int, latest_session_start: int) -> Iterator[Session]:
        """Sessions of ``key`` that end at or after ``earliest_session_end`` and start at or
        before ``latest_session_start`` — the sessions a record at time t may merge with for
        (t - gap, t + gap). Ordered by end, then start."""
        escaped = escape_key(key)
        lower = escaped + encode_timestamp(max(earliest_session_end, self.min_live_time))
        upper = key_prefix_end(escaped)
        cached = self._cache.in_group(escaped, lower, upper)
        for composite, value in self._merged_scan(lower, upper, cached):
            session_start = session_start_of(composite)
            if session_start <= latest_session_start:
                yield Session(key, session_start, session_end_of(composite), value)

    def fetch(self, key: bytes) -> Iterator[Session]:
        """Every live session of ``key``."""
        return self.find_sessions(key, self.min_live_time, MAX_TIMESTAMP)

    def find_sessions_in_key_range(self, key_from: bytes, key_to: bytes, earliest_session_end: int, latest_session_start: int) -> Iterator[Session]:
        if key_from > key_to:
            return iter(())
        lower = escape_key(key_from)
        upper = key_prefix_end(escape_key(key_to))
        return self._sessions(lower, upper, max(earliest_session_end, self.min_live_time), latest_session_start)

    def fetch_all_ending(self, end_from: int, end_to: int) -> Iterator[Session]:
        """Sessions of every key ending in ``[end_from, end_to]``, by end, then key and start
        (served from the time index; what closes when stream time moves)."""
        for index_key, value in self._scan_by_time(end_from, end_to):
            key, start, end = split_session_key(index_key[TIMESTAMP_BYTES:])
            yield Session(key, start, end, value)

    def all(self) -> Iterator[Session]:
        """Every live session, by key, then end, then start."""
        return self._sessions(None, None, self.min_live_time, MAX_TIMESTAMP)

    def _sessions(self, lower: bytes | None, upper: bytes | None, earliest_end: int, latest_start: int) -> Iterator[Session]:
        for composite, value in self._merged_scan(lower, upper, self._cache.in_range(lower, upper)):
            key, start, end = split_session_key(composite)
            if end >= earliest_end and start <= latest_start:
                yield Session(key, start, end, value)

    def _changes(self, changes: CachedChanges, old_values: list[bytes | None] | None, stamps: Stamps | None) -> list[SessionChange]:
        result = []
        for index, (composite, value) in enumerate(changes.items()):
            key, start, end = split_session_key(composite)
            old = old_values[index] if old_values is not None else None
            if stamps is None:
                result.append(SessionChange(key, start, end, value, old))
            else:
                result.append(SessionChange(key, start, end, value, old, stamps.times[composite], stamps.headers.get(composite, NO_HEADERS)))
        return result
