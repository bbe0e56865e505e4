"""Sliding windows (Kafka Streams' ``SlidingWindows``, KIP-450): which windows a record's
arrival updates and creates, as a rule over plain values that both runtimes' kernels run.

A sliding window is ``[start, start + difference]``, both ends inclusive, and exists only for
the sets of records that fit in it: each record at ``t`` has its *left* window ``[t -
difference, t]`` and, once a later record lies within ``difference`` of it, its *right* window
``[t + 1, t + 1 + difference]``. A record therefore:

* updates every stored window that covers it (and is not closed);
* creates its own left window, seeded with the aggregate of the window holding its predecessor
  when that predecessor is within ``difference`` (else from a fresh initial);
* creates the right window of its predecessor when that window does not exist yet and reaches
  the record;
* creates its own right window from the records after it (an out-of-order record), which the
  latest window covering it already holds.

Records before ``difference`` (whose left window would start before 0) all go into ``[0,
difference]``, as in Kafka Streams. A record is late (dropped whole) when even its right
window has closed; a window closed by stream time is not updated, even when the record is
not late for the others (each counts as a dropped record, as in Kafka Streams).

Deciding all this needs each window's newest record timestamp besides its aggregate (Kafka
Streams keeps a ``ValueAndTimestamp``): a sliding aggregation's store value is the 8-byte
timestamp, then the aggregate's bytes. Readers of the store (the table's records, queries,
the test driver, processors) see the aggregate only: ``aggregate_bytes``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

_MAX_TIMESTAMP = struct.Struct(">q")
_TIMESTAMP_BYTES = _MAX_TIMESTAMP.size


class SlidingWindowValue(NamedTuple):
    """One stored sliding window of a key: its start, its newest record's timestamp and its
    aggregate (deserialized)."""

    start: int
    max_timestamp: int
    aggregate: Any


def pack(max_timestamp: int, aggregate: bytes) -> bytes:
    """A sliding window's store value."""
    return _MAX_TIMESTAMP.pack(max_timestamp) + aggregate


def unpack(stored: bytes) -> tuple[int, bytes]:
    """(newest record timestamp, aggregate bytes) of a sliding window's store value."""
    return _MAX_TIMESTAMP.unpack_from(stored)[0], stored[_TIMESTAMP_BYTES:]


def aggregate_bytes(stored: bytes | None) -> bytes | None:
    """The aggregate's bytes of a sliding window's store value (None stays None)."""
    return None if stored is None else stored[_TIMESTAMP_BYTES:]


def lookup_bounds(timestamp: int, difference_ms: int) -> tuple[int, int]:
    """Window starts a record at ``timestamp`` reads: from the window holding its predecessor
    (at most two differences back) to its own right window (``timestamp + 1``)."""
    if timestamp < difference_ms:
        return 0, timestamp + 1
    return max(0, timestamp - 2 * difference_ms), timestamp + 1


def is_late(timestamp: int, difference_ms: int, close_time: int) -> bool:
    """Whether every window a record at ``timestamp`` could touch has closed: its right
    window ``[t + 1, t + 1 + difference]`` ends at or before ``close_time``."""
    return timestamp + 1 + difference_ms <= close_time


def sliding_window_updates(
    existing: Iterable[SlidingWindowValue],
    timestamp: int,
    difference_ms: int,
    close_time: int,
    *,
    add: Callable[[Any], Any],
    first: Callable[[], Any],
) -> tuple[list[SlidingWindowValue], int]:
    """The windows to write for a record at ``timestamp`` that is not late (``is_late``), and
    how many windows it missed because they had closed.

    ``existing``: the key's stored windows starting in ``lookup_bounds``, by start.
    ``add(aggregate)``: the aggregate with the record added; ``first()``: the aggregate of a
    window holding only the record. Windows ending before ``close_time`` are not written.
    """
    writes: list[SlidingWindowValue] = []
    closed = 0

    def update(start: int, max_timestamp: int, aggregate: Any) -> None:
        nonlocal closed
        if start + difference_ms < close_time:
            closed += 1
            return
        writes.append(SlidingWindowValue(start, max(max_timestamp, timestamp), add(aggregate)))

    def create(start: int) -> None:
        nonlocal closed
        if start + difference_ms < close_time:
            closed += 1
            return
        writes.append(SlidingWindowValue(start, timestamp, first()))

    starts: set[int] = set()
    #: The window holding the record's predecessor (its aggregate seeds the left window).
    left_seed: SlidingWindowValue | None = None
    #: The latest window covering the record: it holds the records after it.
    right_seed: SlidingWindowValue | None = None
    right_exists = False
    #: The newest record timestamp before this record's, if a stored window shows one.
    previous: int | None = None

    if timestamp < difference_ms:
        # An early record: [0, difference] stands in for its left window.
        combined: SlidingWindowValue | None = None
        for window in existing:
            starts.add(window.start)
            if window.start == 0:
                combined = window
                if window.max_timestamp < timestamp:
                    previous = window.max_timestamp
            elif window.start <= timestamp:
                right_seed = window
                update(*window)
            elif window.start == timestamp + 1:
                right_exists = True
        if right_seed is None and combined is not None and combined.max_timestamp > timestamp:
            right_seed = combined
        if not right_exists and right_seed is not None and right_seed.max_timestamp > timestamp:
            writes.append(SlidingWindowValue(timestamp + 1, right_seed.max_timestamp, right_seed.aggregate))
        if previous is not None and previous + 1 not in starts:
            create(previous + 1)
        if combined is None:
            create(0)
        else:
            update(*combined)
        return writes, closed

    left_exists = False
    for window in existing:
        starts.add(window.start)
        end = window.start + difference_ms
        if end < timestamp:
            left_seed = window
            previous = window.max_timestamp
        elif end == timestamp:
            left_exists = True
            if window.max_timestamp < timestamp:
                previous = window.max_timestamp
            update(*window)
        elif window.start <= timestamp:
            right_seed = window
            update(*window)
        elif window.start == timestamp + 1:
            right_exists = True
    if previous is not None:
        previous_right = previous + 1
        if previous_right not in starts and previous_right + difference_ms >= timestamp:
            create(previous_right)
    if not left_exists:
        left_start = timestamp - difference_ms
        if previous is not None and left_seed is not None and left_start <= previous:
            update(left_start, timestamp, left_seed.aggregate)
        else:
            create(left_start)
    if not right_exists and right_seed is not None and right_seed.max_timestamp > timestamp:
        # Its end is after the record's, which is not late: never closed.
        writes.append(SlidingWindowValue(timestamp + 1, right_seed.max_timestamp, right_seed.aggregate))
    return writes, closed
