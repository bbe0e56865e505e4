"""The worker runtime's stateful node behaviour as pure functions over plain Python state.

Spark's stateful operators (``applyInPandasWithState``, ``transformWithStateInPandas``) call
these with the state they keep per group, so a Spark job applies exactly the rules the worker's
``pystreams.worker.processing`` applies with its stores: session merging (including the user's
``merge``), windowed stream–stream matching, and processors with key-value stores and
stream-time punctuations. No Spark, no I/O here: everything is unit-testable on its own.

Times are epoch milliseconds. Where the worker tracks *stream time per task*, Spark only has a
global watermark per micro-batch; callers pass it in as the expiry horizon.
"""
from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import msgspec

from pystreams.topology.kernels import merge_into_session, next_punctuation_due
from pystreams.topology.stores import TypedKeyValueStore

# -- session windows ------------------------------------------------------------------------------

#: ``(start, end)`` of a session; ``end`` is its last record's timestamp (inclusive).
Bounds = tuple[int, int]


@dataclass
class SessionChanges:
    """What one batch did to a key's sessions: the bounds to write and the ones to delete."""

    written: dict[Bounds, Any] = field(default_factory=dict)
    removed: set[Bounds] = field(default_factory=set)

    def write(self, bounds: Bounds, value: Any) -> None:
        self.removed.discard(bounds)
        self.written[bounds] = value

    def remove(self, bounds: Bounds) -> None:
        self.written.pop(bounds, None)
        self.removed.add(bounds)


def add_to_sessions(
    sessions: dict[Bounds, Any],
    changes: SessionChanges,
    key: Any,
    value: Any,
    timestamp: int,
    *,
    gap_ms: int,
    close_time: int,
    aggregate: Callable[[Any, Any, Any], Any],
    merge: Callable[[Any, Any, Any], Any],
    new_initial: Callable[[], Any] | None,
) -> bool:
    """Add one record to ``sessions`` (mutated) by the worker's rule (``merge_into_session``);
    returns False when it is late and dropped."""
    overlapping = sorted(
        (bounds for bounds in sessions if bounds[1] >= timestamp - gap_ms and bounds[0] <= timestamp + gap_ms),
        key=lambda bounds: (bounds[1], bounds[0]),
    )
    merged = merge_into_session(
        [(bounds[0], bounds[1], sessions[bounds]) for bounds in overlapping], key, value, timestamp,
        close_time=close_time, aggregate=aggregate, merge=merge, new_initial=new_initial,
    )
    if merged is None:
        return False
    start, end, total = merged
    for bounds in overlapping:
        if bounds != (start, end):
            del sessions[bounds]
            changes.remove(bounds)
    sessions[(start, end)] = total
    changes.write((start, end), total)
    return True


def expire_sessions(sessions: dict[Bounds, Any], min_live_end: int) -> None:
    """Forget sessions ending before ``min_live_end`` (the session store's retention)."""
    for bounds in [b for b in sessions if b[1] < min_live_end]:
        del sessions[bounds]


_encode_state = msgspec.msgpack.Encoder().encode
_decode_sessions = msgspec.msgpack.Decoder(list[tuple[int, int, bytes]]).decode


def encode_sessions(sessions: dict[Bounds, bytes]) -> bytes:
    return _encode_state([(start, end, value) for (start, end), value in sorted(sessions.items())])


def decode_sessions(data: bytes) -> dict[Bounds, bytes]:
    return {(start, end): value for start, end, value in _decode_sessions(data)}


# -- windowed stream–stream joins -----------------------------------------------------------------

LEFT, RIGHT = 0, 1
_decode_buffers = msgspec.msgpack.Decoder(list[tuple[int, int, bytes]]).decode


@dataclass
class JoinBuffers:
    """Both sides' records of one key, as the worker's two join window stores hold them:
    per side, ``(timestamp, value bytes)`` in time order, arrival order within a timestamp."""

    sides: tuple[list[tuple[int, bytes]], list[tuple[int, bytes]]] = field(default_factory=lambda: ([], []))

    def add(self, side: int, timestamp: int, value: bytes) -> None:
        records = self.sides[side]
        # After every record of the same timestamp: the worker appends to that time's list.
        at = bisect.bisect_right(records, timestamp, key=lambda record: record[0])
        records.insert(at, (timestamp, value))

    def fetch(self, side: int, time_from: int, time_to: int) -> Iterator[tuple[int, bytes]]:
        records = self.sides[side]
        at = bisect.bisect_left(records, time_from, key=lambda record: record[0])
        for timestamp, value in records[at:]:
            if timestamp > time_to:
                return
            yield timestamp, value

    def expire(self, min_live_time: int) -> None:
        for records in self.sides:
            at = bisect.bisect_left(records, min_live_time, key=lambda record: record[0])
            del records[:at]

    @property
    def newest(self) -> int | None:
        times = [records[-1][0] for records in self.sides if records]
        return max(times) if times else None

    def encode(self) -> bytes:
        return _encode_state([(side, ts, value) for side, records in enumerate(self.sides) for ts, value in records])

    @classmethod
    def decode(cls, data: bytes) -> JoinBuffers:
        buffers = cls()
        for side, ts, value in _decode_buffers(data):
            buffers.sides[side].append((ts, value))
        return buffers


@dataclass(frozen=True)
class JoinRule:
    """A stream–stream join as the worker runs it: a left record at t meets right records in
    ``[t - before, t + after]`` (mirrored for right records); left/outer joins also emit an
    unmatched record at once, with ``None`` for the missing side."""

    before_ms: int
    after_ms: int
    how: str  # "inner" | "left" | "outer"

    def join(
        self, buffers: JoinBuffers, side: int, timestamp: int, value: bytes, min_live_time: int
    ) -> list[tuple[bytes | None, bytes | None, int]] | None:
        """Store the record, then its matches as ``(left bytes, right bytes, timestamp)``;
        None when the record is older than the join stores' retention (dropped)."""
        if timestamp < min_live_time:
            return None
        buffers.add(side, timestamp, value)
        look_back, look_ahead = (self.before_ms, self.after_ms) if side == LEFT else (self.after_ms, self.before_ms)
        other = RIGHT if side == LEFT else LEFT
        results: list[tuple[bytes | None, bytes | None, int]] = []
        for other_time, other_value in buffers.fetch(other, timestamp - look_back, timestamp + look_ahead):
            if other_time < min_live_time:
                continue
            pair = (value, other_value) if side == LEFT else (other_value, value)
            results.append((pair[0], pair[1], max(timestamp, other_time)))
        if not results and (self.how == "outer" or (self.how == "left" and side == LEFT)):
            results.append((value, None, timestamp) if side == LEFT else (None, value, timestamp))
        return results


# -- low-level processors ---------------------------------------------------------------------------


class KeyValueBackend:
    """Where a processor's key-value store lives: bytes in, bytes out (Spark's MapState, or
    a dict in tests)."""

    def get(self, key: bytes) -> bytes | None:
        raise NotImplementedError

    def put(self, key: bytes, value: bytes) -> None:
        raise NotImplementedError

    def delete(self, key: bytes) -> None:
        raise NotImplementedError

    def items(self) -> Iterable[tuple[bytes, bytes]]:
        raise NotImplementedError


_DELETED = object()


class CachedBytesStore:
    """A processor's key-value store over a backend, in bytes, with a write-back cache: each
    key goes to the backend at most once per batch each way (``flush`` writes). Iteration is in
    key-byte order, as over RocksDB. Processors see it through the worker's typed view
    (``cached_key_value_store``), so both runtimes give them the same store API."""

    def __init__(self, name: str, backend: KeyValueBackend) -> None:
        self.name = name
        self._backend = backend
        self._cache: dict[bytes, Any] = {}  # key bytes -> value bytes | None (absent) | _DELETED
        self._dirty: set[bytes] = set()

    def get(self, key: bytes) -> bytes | None:
        if key not in self._cache:
            self._cache[key] = self._backend.get(key)
        value = self._cache[key]
        return None if value is _DELETED else value

    def put(self, key: bytes, value: bytes | None) -> None:
        self._cache[key] = _DELETED if value is None else value
        self._dirty.add(key)

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

    def flush(self) -> None:
        for key in self._dirty:
            value = self._cache[key]
            if value is _DELETED:
                self._backend.delete(key)
            else:
                self._backend.put(key, value)
        self._dirty.clear()


def cached_key_value_store(name: str, backend: KeyValueBackend, key_serde: Any, value_serde: Any) -> TypedKeyValueStore:
    """The typed store a processor sees; ``.raw.flush()`` writes it to the backend."""
    return TypedKeyValueStore(CachedBytesStore(name, backend), key_serde, value_serde)


class ReplayedProcessorContext:
    """The ``ProcessorContext`` a processor sees, with forwards collected for the caller."""

    def __init__(self, app_id: str, task_id: Any, stores: dict[str, TypedKeyValueStore]) -> None:
        self.app_id = app_id
        self.task_id = task_id
        self._stores = stores
        self.topic: str | None = None
        self.partition: int | None = None
        self.offset: int | None = None
        self.timestamp = 0
        self.forwarded: list[tuple[Any, Any, int]] = []

    def store(self, name: str) -> TypedKeyValueStore:
        if name not in self._stores:
            raise KeyError(f"store {name!r} is not declared by this processor (it may use {list(self._stores)})")
        return self._stores[name]

    def forward(self, key: Any, value: Any, *, timestamp: int | None = None) -> None:
        self.forwarded.append((key, value, self.timestamp if timestamp is None else timestamp))


@dataclass
class PunctuationClock:
    """When each punctuation is next due (None: at the next opportunity), as the worker keeps it."""

    next_due: dict[str, int | None]

    def due(self, method: str, now: int) -> bool:
        next_due = self.next_due.get(method)
        return next_due is None or now >= next_due

    def fired(self, method: str, now: int, interval_ms: int) -> None:
        self.next_due[method] = next_punctuation_due(self.next_due.get(method), now, interval_ms)


class ProcessorTask:
    """One task's processor instance, driven like the worker's ``StreamTask`` drives it:
    ``process`` per record in order, then every stream-time punctuation that is due."""

    def __init__(
        self,
        processor_class: type,
        context: ReplayedProcessorContext,
        stream_punctuations: Iterable[tuple[str, int]],
        clock: PunctuationClock,
        stream_time: int | None,
    ) -> None:
        self.instance = processor_class()
        self.context = context
        self.stream_punctuations = tuple(stream_punctuations)
        self.clock = clock
        self.stream_time = stream_time
        self.instance.init(context)

    def process_source_record(
        self, records: Iterable[tuple[Any, Any, int]], timestamp: int, topic: str, partition: int, offset: int
    ) -> None:
        """One source record at ``timestamp`` (after timestamp extraction), which stateless
        steps turned into ``records`` for the processor (maybe none: stream time still
        advances and punctuations still run, as on the worker)."""
        context = self.context
        if self.stream_time is None or timestamp > self.stream_time:
            self.stream_time = timestamp
        context.topic, context.partition, context.offset = topic, partition, offset
        for key, value, record_timestamp in records:
            context.timestamp = record_timestamp
            self.instance.process(key, value)
        for method, interval_ms in self.stream_punctuations:
            if self.clock.due(method, self.stream_time):
                self.fire(method, self.stream_time, interval_ms)

    def fire(self, method: str, now: int, interval_ms: int) -> None:
        self.clock.fired(method, now, interval_ms)
        context = self.context
        saved = context.topic, context.partition, context.offset, context.timestamp
        context.topic = context.partition = context.offset = None
        context.timestamp = now
        try:
            getattr(self.instance, method)(now)
        finally:
            context.topic, context.partition, context.offset, context.timestamp = saved
