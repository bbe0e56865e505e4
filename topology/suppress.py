"""Suppression (Kafka Streams' ``Suppressed``): what a ``table.suppress(...)`` holds back, and
for how long.

* ``until_window_closes()``: a windowed table's updates are held until the window closes
  (stream time reaches its end + grace; a session's end + gap + grace, by the same rule as the
  session aggregation's lateness), then its final value is emitted once;
* ``until_time_limit(duration, max_records=, max_bytes=, when_full=)``: each key's updates are
  held until stream time reaches the time of the first update buffered for it + ``duration``
  (the key keeps that place while later updates replace its value: Kafka Streams'
  non-resetting buffer), then its latest value is emitted.

The buffer is a changelogged key-value store, mirrored in memory as Kafka Streams' in-memory
buffer is: every buffered key is written to it, every emitted key is deleted, so a new owner
restores exactly the keys still to emit. The stream time the node has seen is kept in the
same store, so a restart decides what to emit as the previous owner would have.

A buffer over its limit (``max_records``, ``max_bytes``: serialized key + value + 8 bytes of
timestamp per key, Kafka Streams counts a similar estimate) either emits its oldest keys early
(``when_full="emit_early"``) or stops the task (``"shut_down"``) with an error naming the
store, the limit and the setting to change. ``until_window_closes`` only shuts down: emitting
a window early would break its promise of one final result (Kafka Streams' strict buffer).
"""

from __future__ import annotations

import enum
import heapq
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import msgspec

from .windows import Duration, HoppingWindow, SessionWindow, SlidingWindow, TumblingWindow, Windowed, to_millis


class WhenFull(enum.StrEnum):
    EMIT_EARLY = "emit_early"
    SHUT_DOWN = "shut_down"


@dataclass(frozen=True, slots=True)
class BufferLimits:
    """How much a suppression buffer may hold (None: no limit) and what happens beyond it."""

    max_records: int | None = None
    max_bytes: int | None = None
    when_full: WhenFull = WhenFull.SHUT_DOWN

    @classmethod
    def checked(cls, max_records: int | None, max_bytes: int | None, when_full: str, what: str) -> BufferLimits:
        for name, limit in (("max_records", max_records), ("max_bytes", max_bytes)):
            if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
                raise ValueError(f"{what}: {name} must be a positive int or None, got {limit!r}")
        try:
            policy = WhenFull(when_full)
        except ValueError:
            raise ValueError(f"{what}: when_full must be one of {[w.value for w in WhenFull]}, got {when_full!r}") from None
        return cls(max_records, max_bytes, policy)

    @property
    def bounded(self) -> bool:
        return self.max_records is not None or self.max_bytes is not None


@dataclass(frozen=True, slots=True)
class UntilWindowCloses:
    """Hold a windowed table's updates until their window closes; emit its final value once."""

    buffer: BufferLimits = BufferLimits()


@dataclass(frozen=True, slots=True)
class UntilTimeLimit:
    """Hold each key's updates for ``duration_ms`` of stream time after its first buffered one."""

    duration_ms: int
    buffer: BufferLimits = BufferLimits()


Suppression = UntilWindowCloses | UntilTimeLimit


def until_window_closes(*, max_records: int | None = None, max_bytes: int | None = None) -> UntilWindowCloses:
    """Kafka Streams' ``Suppressed.untilWindowCloses``: one final result per window of a
    windowed table, when stream time passes its end + grace. A buffer with limits that fills
    stops the task (a window emitted early would not be final)."""
    return UntilWindowCloses(BufferLimits.checked(max_records, max_bytes, WhenFull.SHUT_DOWN, "until_window_closes"))


def until_time_limit(
    duration: Duration, *, max_records: int | None = None, max_bytes: int | None = None, when_full: str = WhenFull.EMIT_EARLY
) -> UntilTimeLimit:
    """Kafka Streams' ``Suppressed.untilTimeLimit``: each key's latest value, ``duration`` of
    stream time after the key's first update was buffered. ``when_full``: what a full buffer
    does, ``"emit_early"`` (its oldest keys now; the default, as Kafka Streams' eager buffer)
    or ``"shut_down"`` (stop the task with an error)."""
    return UntilTimeLimit(to_millis(duration, "until_time_limit duration"), BufferLimits.checked(max_records, max_bytes, when_full, "until_time_limit"))


def suppression_fields(suppression: Suppression) -> dict[str, Any]:
    """The spec as plain data, for the topology hash and descriptions."""
    buffer = suppression.buffer
    fields: dict[str, Any] = {"kind": type(suppression).__name__}
    if isinstance(suppression, UntilTimeLimit):
        fields["duration_ms"] = suppression.duration_ms
    fields.update(max_records=buffer.max_records, max_bytes=buffer.max_bytes, when_full=buffer.when_full.value)
    return fields


def describe_suppression(suppression: Suppression) -> str:
    return " ".join(f"{name}={value}" for name, value in suppression_fields(suppression).items() if value is not None)


# ============================================================================ when a key is due


def window_closing_time(window: TumblingWindow | HoppingWindow | SlidingWindow | SessionWindow, windowed: Windowed) -> int:
    """The stream time at which a window (a session) closes, which is when its final value may
    go out: a fixed window at end + grace (Kafka Streams); a sliding window, whose end is
    inclusive, once end + grace is before stream time (its sliding aggregate); a session once it
    ends before stream time - grace - gap (the session aggregation's rule for lateness)."""
    if isinstance(window, SessionWindow):
        return windowed.end_ms + window.gap_ms + window.grace_ms + 1
    if isinstance(window, SlidingWindow):
        return windowed.end_ms + window.grace_ms + 1
    return windowed.end_ms + window.grace_ms


def due_time_rule(suppression: Suppression, window: TumblingWindow | HoppingWindow | SlidingWindow | SessionWindow | None) -> Callable[[Any, int], int]:
    """``due(key, record_time)``: the stream time at which a key buffered now is emitted."""
    if isinstance(suppression, UntilTimeLimit):
        duration = suppression.duration_ms

        def after_time_limit(key: Any, record_time: int) -> int:
            return record_time + duration

        return after_time_limit
    assert window is not None, "until_window_closes needs the table's window"
    windowed_window = window

    def when_window_closes(key: Any, record_time: int) -> int:
        return window_closing_time(windowed_window, key)

    return when_window_closes


# ============================================================================ the buffer


# Layout of the buffer store: one reserved key for the node's stream time, and every buffered
# key under another prefix, so no table key can collide with the reserved one.
STREAM_TIME_KEY = b"\x00stream-time"
_ENTRY_PREFIX = b"\x01"
_TIMESTAMP_BYTES = 8


class _Entry(msgspec.Struct, array_like=True):
    due: int
    #: Insertion number: orders keys due at the same time, oldest first.
    seq: int
    timestamp: int
    value: bytes | None


_encode_entry = msgspec.msgpack.Encoder().encode
_decode_entry = msgspec.msgpack.Decoder(_Entry).decode


def encode_stream_time(stream_time: int) -> bytes:
    return stream_time.to_bytes(8, "big", signed=True)


def decode_stream_time(data: bytes | None) -> int | None:
    return None if data is None else int.from_bytes(data, "big", signed=True)


class SuppressionBuffer:
    """Buffered table updates by serialized key, due in order, mirrored into a key-value byte
    store (``get``/``put``/``all``; ``put(key, None)`` deletes) through ``write``.

    Loaded lazily from the store (``load``): a runtime builds nodes before it restores their
    stores."""

    def __init__(self, limits: BufferLimits, store: Any) -> None:
        self.limits = limits
        self._store = store
        self._entries: dict[bytes, _Entry] = {}
        self._due_order: list[tuple[int, int, bytes]] = []  # heap; stale items are skipped
        self._seq = 0
        self.bytes = 0
        self.stream_time: int | None = None
        self.loaded = False

    def load(self) -> None:
        self.stream_time = decode_stream_time(self._store.get(STREAM_TIME_KEY))
        for stored_key, data in self._store.all():
            if not stored_key.startswith(_ENTRY_PREFIX):
                continue
            entry = _decode_entry(data)
            key = stored_key[len(_ENTRY_PREFIX) :]
            self._entries[key] = entry
            self.bytes += _size(key, entry.value)
            self._seq = max(self._seq, entry.seq + 1)
            self._due_order.append((entry.due, entry.seq, key))
        heapq.heapify(self._due_order)
        self.loaded = True

    def __len__(self) -> int:
        return len(self._entries)

    def observe(self, timestamp: int) -> int:
        """Advance (and persist) the node's stream time; returns it."""
        if self.stream_time is None or timestamp > self.stream_time:
            self.stream_time = timestamp
            self._store.put(STREAM_TIME_KEY, encode_stream_time(timestamp))
        return self.stream_time

    def put(self, key: bytes, due: int, timestamp: int, value: bytes | None) -> None:
        """Buffer a key's latest value; a key already buffered keeps its due time."""
        existing = self._entries.get(key)
        if existing is not None:
            self.bytes += _size(key, value) - _size(key, existing.value)
            entry = _Entry(existing.due, existing.seq, timestamp, value)
        else:
            entry = _Entry(due, self._seq, timestamp, value)
            self._seq += 1
            self.bytes += _size(key, value)
            heapq.heappush(self._due_order, (entry.due, entry.seq, key))
        self._entries[key] = entry
        self._store.put(_ENTRY_PREFIX + key, _encode_entry(entry))

    def pop_due(self, stream_time: int) -> Iterator[tuple[bytes, int, bytes | None]]:
        """Remove and yield ``(key, timestamp, value)`` of every key due at ``stream_time``,
        in due order."""
        order = self._due_order
        while order and order[0][0] <= stream_time:
            popped = self._pop_oldest()
            if popped is not None:
                yield popped

    def over_limit(self) -> str | None:
        """Which limit the buffer exceeds, said for an error message; None within them."""
        limits = self.limits
        if limits.max_records is not None and len(self._entries) > limits.max_records:
            return f"{len(self._entries)} records, over max_records={limits.max_records}"
        if limits.max_bytes is not None and self.bytes > limits.max_bytes:
            return f"{self.bytes} bytes, over max_bytes={limits.max_bytes}"
        return None

    def pop_oldest_while_over_limit(self) -> Iterator[tuple[bytes, int, bytes | None]]:
        """Emit-early: remove and yield the keys due first until the buffer is within limits."""
        while self.over_limit() is not None:
            popped = self._pop_oldest()
            if popped is None:
                return
            yield popped

    def _pop_oldest(self) -> tuple[bytes, int, bytes | None] | None:
        order = self._due_order
        while order:
            _, seq, key = heapq.heappop(order)
            entry = self._entries.get(key)
            if entry is None or entry.seq != seq:
                continue  # emitted already
            del self._entries[key]
            self.bytes -= _size(key, entry.value)
            self._store.put(_ENTRY_PREFIX + key, None)
            return key, entry.timestamp, entry.value
        return None

    def keys(self) -> Iterable[bytes]:
        return self._entries.keys()


def _size(key: bytes, value: bytes | None) -> int:
    return len(key) + (len(value) if value is not None else 0) + _TIMESTAMP_BYTES
