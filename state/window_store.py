"""Window store: values per (key, window start), with retention.

Composite key (also the changelog key): ``escaped(key) + ts(window_start)``; see keys.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

from .cache import NO_HEADERS, CachedChanges, Headers, Stamps
from .keys import (
    MAX_TIMESTAMP,
    WINDOW_SUFFIX_BYTES,
    encode_timestamp,
    escape_key,
    key_prefix_end,
    split_window_key,
    window_key,
    window_start_of,
)
from .time_indexed import TimeIndexedStore


class WindowChange(NamedTuple):
    key: bytes
    window_start: int
    value: bytes | None  # None: the window was deleted
    old_value: bytes | None  # only with send_old_values
    timestamp: int | None = None  # of the record that last wrote it (None: the store has no clock)
    headers: Headers = NO_HEADERS  # that record's


class WindowedValue(NamedTuple):
    key: bytes
    window_start: int
    value: bytes


def _window_upper(escaped: bytes, time_to: int) -> bytes:
    """Exclusive upper bound of composite keys of one key up to ``time_to`` inclusive."""
    if time_to >= MAX_TIMESTAMP:
        return key_prefix_end(escaped)
    # Every composite key of ``escaped`` has exactly 8 suffix bytes, so appending a byte
    # gives the immediate successor of the last key wanted.
    return escaped + encode_timestamp(time_to) + b"\x00"


class WindowStore(TimeIndexedStore[WindowChange]):
    _GROUP_SUFFIX_BYTES = WINDOW_SUFFIX_BYTES
    _TIME_FROM_END = WINDOW_SUFFIX_BYTES

    def put(self, key: bytes, window_start: int, value: bytes | None) -> bool:
        """Store the value of one window (None deletes it). Returns False, dropping the
        write, when the window is already past retention (Kafka Streams drops it too)."""
        if not self._observe(window_start):
            return False
        self._cache.put(window_key(key, window_start), value)
        return True

    def get(self, key: bytes, window_start: int) -> bytes | None:
        if window_start < self.min_live_time:
            return None
        return self._cached_or_stored(window_key(key, window_start))

    def fetch(self, key: bytes, time_from: int, time_to: int) -> Iterator[tuple[int, bytes]]:
        """(window_start, value) of ``key`` for window starts in ``[time_from, time_to]``,
        oldest first."""
        time_from = max(time_from, self.min_live_time)
        if time_from > time_to:
            return iter(())
        escaped = escape_key(key)
        lower = escaped + encode_timestamp(time_from)
        upper = _window_upper(escaped, time_to)
        cached = self._cache.in_group(escaped, lower, upper)
        return ((window_start_of(composite), value) for composite, value in self._merged_scan(lower, upper, cached))

    def fetch_key_range(self, key_from: bytes, key_to: bytes, time_from: int, time_to: int) -> Iterator[WindowedValue]:
        """Windows of keys in ``[key_from, key_to]`` with starts in ``[time_from, time_to]``,
        by key then time."""
        time_from = max(time_from, self.min_live_time)
        if time_from > time_to or key_from > key_to:
            return iter(())
        lower = escape_key(key_from)
        upper = key_prefix_end(escape_key(key_to))
        return self._windows(lower, upper, time_from, time_to)

    def fetch_all(self, time_from: int, time_to: int) -> Iterator[WindowedValue]:
        """Windows of every key with starts in ``[time_from, time_to]``, by time then key
        (served from the time index)."""
        for index_key, value in self._scan_by_time(time_from, time_to):
            key, window_start = split_window_key(index_key[8:])
            yield WindowedValue(key, window_start, value)

    def all(self) -> Iterator[WindowedValue]:
        """Every live window, by key then time."""
        return self._windows(None, None, self.min_live_time, MAX_TIMESTAMP)

    def _windows(self, lower: bytes | None, upper: bytes | None, time_from: int, time_to: int) -> Iterator[WindowedValue]:
        for composite, value in self._merged_scan(lower, upper, self._cache.in_range(lower, upper)):
            key, window_start = split_window_key(composite)
            if time_from <= window_start <= time_to:
                yield WindowedValue(key, window_start, value)

    def _changes(self, changes: CachedChanges, old_values: list[bytes | None] | None, stamps: Stamps | None) -> list[WindowChange]:
        result = []
        for index, (composite, value) in enumerate(changes.items()):
            key, window_start = split_window_key(composite)
            old = old_values[index] if old_values is not None else None
            if stamps is None:
                result.append(WindowChange(key, window_start, value, old))
            else:
                result.append(WindowChange(key, window_start, value, old, stamps.times[composite], stamps.headers.get(composite, NO_HEADERS)))
        return result
