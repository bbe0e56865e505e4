"""The semantics of every node kind, written once; both runtimes run these.

Two layers:

* **rules** over plain values: a fresh initial accumulator for every new key, which windows a
  record falls in and which of them have closed, how a record merges sessions, which records
  a windowed join pairs and what a left or outer join emits for a miss, when a punctuation is
  due next, what a processor's context shows;
* **kernels**: ``node_emit(node, wiring)`` returns the node's ``emit(key, value,
  timestamp)``, a push function that applies the rules to one record and calls the node's
  children (``wiring.forward``), over byte stores behind small protocols.

The worker compiles each task's nodes with the kernels over its RocksDB stores
(``pystreams.worker.processing``); the Spark runtime runs the same kernels in its operators
(stateless steps inside ``mapInArrow``, stateful nodes per task over Spark state); the test
driver (``pystreams.testing``) runs the worker's tasks. Sinks and repartitions are the
runtimes' own; which partition a sink's record goes to (Kafka's default partitioner, Kafka
Streams' windowed partitioner) and what a record that cannot be deserialized or processed does
(the error policies: fail, log-and-continue, dead-letter with its headers) are rules here.

Stream time is Kafka Streams': the highest timestamp seen, per task (a processor's context and
punctuations) or per windowed node of a task (what decides that a window has closed). Times
are epoch milliseconds.
"""

from __future__ import annotations

import copy
import enum
import heapq
import logging
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import msgspec
from kafka.partitioner.default import murmur2

from pystreams import serdes

from . import foreign_key as fk
from .ir import (
    AggregationNode,
    BranchNode,
    BranchOutputNode,
    CogroupNode,
    ErrorPolicies,
    ErrorPolicy,
    FilterNode,
    FkForeignUpdateNode,
    FkJoinNode,
    FkSubscribeNode,
    FkSubscriptionsNode,
    FlatMapNode,
    FlatMapValuesNode,
    JoinHow,
    JoinSide,
    MapNode,
    MapValuesNode,
    MergeNode,
    Node,
    NodeBase,
    PeekNode,
    ProcessorNode,
    Punctuation,
    ReduceNode,
    RepartitionNode,
    SelectKeyNode,
    SinkNode,
    SourceNode,
    Store,
    StreamGlobalJoinNode,
    StreamStreamJoinNode,
    StreamTableJoinNode,
    SuppressNode,
    TableAggregateNode,
    TableFilterNode,
    TableGroupByNode,
    TableJoinNode,
    TableJoinSideNode,
    TableMapValuesNode,
    TableSourceNode,
    TableViewNode,
    TaskId,
    ToStreamNode,
    is_materialized,
    stores_of,
)
from .sliding import SlidingWindowValue, aggregate_bytes, is_late, lookup_bounds, pack, sliding_window_updates, unpack
from .suppress import (
    SuppressionBuffer,
    UntilWindowCloses,
    WhenFull,
    decode_stream_time,
    due_time_rule,
    encode_stream_time,
)
from .windows import HoppingWindow, JoinWindow, SessionWindow, SlidingWindow, TimeWindow, TumblingWindow, Windowed

log = logging.getLogger(__name__)

#: A node's push function: ``emit(key, value, timestamp)``.
Emit = Callable[[Any, Any, int], None]


def drop(key: Any, value: Any, timestamp: int) -> None:
    """The emit of a node without children."""


def fan_out(emits: list[Emit]) -> Emit:
    """One emit calling every child in order (depth-first, as Kafka Streams forwards)."""
    if not emits:
        return drop
    if len(emits) == 1:
        return emits[0]

    def fanned_out(key: Any, value: Any, timestamp: int) -> None:
        for emit in emits:
            emit(key, value, timestamp)

    return fanned_out


def null_key_counter(wiring: NodeWiring) -> Callable[[], None]:
    """What a node calls when it skips a record for its null key, as Kafka Streams does: counted
    in its task's ``null_keys_dropped`` (Kafka's dropped-records metric), logged once per node."""
    position, name = wiring.position, wiring.node.name
    warned = False

    def dropped() -> None:
        nonlocal warned
        if position is not None:
            position.null_keys_dropped += 1
        if not warned:
            warned = True
            log.warning("node %s skips records with a null key, as Kafka Streams does (counted in null_keys_dropped)", name)

    return dropped


def record_skipper(wiring: NodeWiring) -> Callable[[Any, Any], bool]:
    """Whether an aggregation or join skips a record: a null key or value (Kafka Streams
    does); a null key is counted (``null_key_counter``)."""
    dropped = null_key_counter(wiring)

    def skips(key: Any, value: Any) -> bool:
        if key is None:
            dropped()
            return True
        return value is None

    return skips


def source_timestamp(
    extractor: Callable[[Any, Any, int], int] | None, key: Any, value: Any, record_timestamp: int, *, node: str | None, position: TaskPosition | None
) -> int | None:
    """The event time a source gives a deserialized record: its extractor's answer, or the
    record's own timestamp. None when it is negative: Kafka Streams skips such a record with a
    warning and counts it as dropped (``position.invalid_timestamps_dropped``), so it moves no
    stream time and lands in no window. An extractor that raises raises here (the runtime
    sends it through the deserialization error policy)."""
    timestamp = record_timestamp if extractor is None else extractor(key, value, record_timestamp)
    if timestamp >= 0:
        return timestamp
    if position is not None:
        position.invalid_timestamps_dropped += 1
    log.warning(
        "source %s: skipping a record with negative timestamp %d (topic %s, partition %s, offset %s)",
        node,
        timestamp,
        *((position.topic, position.partition, position.offset) if position is not None else (None, None, None)),
    )
    return None


def advance_stream_time(stream_time: int | None, timestamp: int) -> int:
    """Stream time after a record: it only moves forward."""
    return timestamp if stream_time is None or timestamp > stream_time else stream_time


# ============================================================================ stateless steps
# Each takes the user's function and the downstream emit. Record timestamps pass unchanged.


def key_value_pair(result: Any, rule: str) -> tuple[Any, Any]:
    """``result`` as the ``(key, value)`` pair a map or flat map must return: anything else —
    a string, whose two characters would unpack as key and value, a dict, a 3-tuple — is a
    TypeError the node's error policy reports with the node's name."""
    if isinstance(result, tuple) and len(result) == 2:
        return result
    shown = repr(result)
    raise TypeError(f"{rule}, got {type(result).__name__} {shown[:80]}{'...' if len(shown) > 80 else ''}")


def map_kernel(fn: Callable[[Any, Any], tuple[Any, Any]], forward: Emit) -> Emit:
    def map_(key: Any, value: Any, timestamp: int) -> None:
        new_key, new_value = key_value_pair(fn(key, value), "map must return a (key, value) tuple")
        forward(new_key, new_value, timestamp)

    return map_


def map_values_kernel(fn: Callable[[Any, Any], Any], forward: Emit) -> Emit:
    def map_values(key: Any, value: Any, timestamp: int) -> None:
        forward(key, fn(key, value), timestamp)

    return map_values


def flat_map_kernel(fn: Callable[[Any, Any], Iterable[tuple[Any, Any]]], forward: Emit) -> Emit:
    def flat_map(key: Any, value: Any, timestamp: int) -> None:
        for pair in fn(key, value):
            new_key, new_value = key_value_pair(pair, "flat_map must return (key, value) tuples")
            forward(new_key, new_value, timestamp)

    return flat_map


def flat_map_values_kernel(fn: Callable[[Any, Any], Iterable[Any]], forward: Emit) -> Emit:
    def flat_map_values(key: Any, value: Any, timestamp: int) -> None:
        for new_value in fn(key, value):
            forward(key, new_value, timestamp)

    return flat_map_values


def filter_kernel(fn: Callable[[Any, Any], Any], forward: Emit) -> Emit:
    def filter_(key: Any, value: Any, timestamp: int) -> None:
        if fn(key, value):
            forward(key, value, timestamp)

    return filter_


def peek_kernel(fn: Callable[[Any, Any], Any], forward: Emit) -> Emit:
    def peek(key: Any, value: Any, timestamp: int) -> None:
        fn(key, value)
        forward(key, value, timestamp)

    return peek


def select_key_kernel(fn: Callable[[Any, Any], Any], forward: Emit) -> Emit:
    def select_key(key: Any, value: Any, timestamp: int) -> None:
        forward(fn(key, value), value, timestamp)

    return select_key


def branch_kernel(fn: Callable[[Any, Any], str | None], routes: Mapping[str, Emit]) -> Emit:
    """Routes each record to the branch whose label ``fn`` returns (None drops it); a label
    that is not a branch is an error, naming the branches."""

    def branch(key: Any, value: Any, timestamp: int) -> None:
        label = fn(key, value)
        if label is None:
            return
        route = routes.get(label)
        if route is None:
            raise ValueError(f"branch function returned {label!r}, not one of {sorted(routes)}")
        route(key, value, timestamp)

    return branch


# ============================================================================ aggregation

#: Initial values shared safely between keys: nothing can change them in place.
_IMMUTABLE_INITIALS = (int, float, complex, str, bytes, bool, type(None))


def initial_factory(initial: Any) -> Callable[[], Any]:
    """A factory of a *fresh* starting accumulator for each new key (window, session): a
    callable ``initial`` is Kafka Streams' Initializer and is called; any other value is
    copied, so an aggregator that changes its accumulator in place (``acc.append(v)``) never
    hands one key's items to another."""
    if callable(initial):
        return initial
    if type(initial) in _IMMUTABLE_INITIALS:
        return lambda: initial
    return lambda: copy.deepcopy(initial)


@dataclass(frozen=True, slots=True)
class Aggregator:
    """COUNT/AGGREGATE/REDUCE: ``fn(acc, key, value) -> acc``; a key's first record starts from
    a fresh initial (REDUCE: the first value is the accumulator)."""

    fn: Callable[[Any, Any, Any], Any]
    #: None for a reduce.
    new_initial: Callable[[], Any] | None

    @classmethod
    def of(cls, node: AggregationNode) -> Aggregator:
        return cls(node.fn, None if isinstance(node, ReduceNode) else initial_factory(node.initial))

    def first(self, key: Any, value: Any) -> Any:
        """The accumulator after a key's (window's) first record."""
        if self.new_initial is None:
            return value
        return self.fn(self.new_initial(), key, value)


# ============================================================================ windows


def close_time(stream_time: int, grace_ms: int) -> int:
    """Windows ending at or before this, and sessions ending before it, accept no more records."""
    return stream_time - grace_ms


def open_windows(window: TumblingWindow | HoppingWindow, timestamp: int, closed_before: int) -> tuple[list[TimeWindow], list[TimeWindow]]:
    """The windows a record at ``timestamp`` falls in, split into (still open, closed): a
    window ``[start, end)`` is closed once ``end <= close_time`` (Kafka Streams: end + grace
    <= stream time). Oldest first."""
    still_open: list[TimeWindow] = []
    closed: list[TimeWindow] = []
    for bounds in window.windows_for(timestamp):
        (closed if bounds.end_ms <= closed_before else still_open).append(bounds)
    return still_open, closed


def forwards_store_updates(node: Node, store: Store) -> bool:
    """Whether a table node's updates go downstream when its store's cache flushes (emit on
    update, folded per commit). An emit-final aggregation forwards each window once itself,
    when it closes; a suppression forwards from its buffer; a table computed on read, and a
    versioned table (only an update that is its key's latest goes on), forward each update as
    it comes."""
    if store.history_ms is not None:
        return False
    return is_materialized(node) and not (isinstance(node, AggregationNode) and node.emits_final)


def table_output_store(node: Node, specs: Mapping[str, Store]) -> str | None:
    """The store whose flushed changes are ``node``'s output (``forwards_store_updates``):
    its first store, when it owns it (a cogroup's inputs write their table node's store)."""
    names = stores_of(node)
    if not names:
        return None
    spec = specs[names[0]]
    return names[0] if spec.owner == node.name and forwards_store_updates(node, spec) else None


def node_routes(node: Node, child_nodes: Sequence[Node], emits: Mapping[str, Emit]) -> dict[str, Emit]:
    """A branch's children by the label each takes; a processor's by name (``forward(to=)``)."""
    if isinstance(node, ProcessorNode):
        return {child.name: emits[child.name] for child in child_nodes}
    if not isinstance(node, BranchNode):
        return {}
    return {child.label: emits[child.name] for child in child_nodes if isinstance(child, BranchOutputNode)}


def table_view_value(node: TableViewNode, key: Any, value: Any) -> Any:
    """A derived table's row for ``key`` given its parent's row ``value`` (None: no row).
    Kafka Streams' KTableFilter / KTableMapValues: a row the filter drops, or a parent's
    tombstone, is a tombstone; the functions never see a None value."""
    if value is None:
        return None
    if isinstance(node, TableFilterNode):
        return value if bool(node.fn(key, value)) is node.keep else None
    return node.fn(key, value)


def table_view_reader(view: tuple[TableViewNode, ...]) -> Callable[[Any, Any], Any]:
    """A lookup's value getter: the stored row through every step of ``view``, in order."""

    def read(key: Any, value: Any) -> Any:
        for step in view:
            value = table_view_value(step, key, value)
        return value

    return read


#: The one key of an emit-final aggregation's ``emitted_store``: the node's stream time.
EMITTED_STREAM_TIME_KEY = b"stream-time"
#: "Nothing emitted yet": below every window end.
_NOTHING_CLOSED = -(2**63)


def newly_closed_window_starts(window: TumblingWindow | HoppingWindow, closed_before: int, closed_now: int) -> tuple[int, int] | None:
    """Emit-final: the window starts ``[first, last]`` of the windows that closed when the
    close time moved from ``closed_before`` to ``closed_now`` (a window ``[start, start +
    size)`` is closed once ``end <= close time``); None when no window of the grid (starts are
    multiples of the advance) ends in between, which is most moves: no store scan then."""
    size, advance = window.size_ms, window.advance_ms
    first, last = closed_before - size + 1, closed_now - size
    first_on_grid = -(-first // advance) * advance
    return (first, last) if first_on_grid <= last else None


def newly_closed_session_ends(closed_before: int, closed_now: int) -> tuple[int, int]:
    """Emit-final: the session ends ``[first, last]`` of the sessions that closed when the
    session close time moved from ``closed_before`` to ``closed_now`` (closed: ending before it)."""
    return closed_before, closed_now - 1


def session_close_time(stream_time: int, grace_ms: int, gap_ms: int) -> int:
    """Merged sessions ending before this accept no more records: a session stays open for
    ``gap`` after its end (a record may still extend it) plus ``grace`` (Kafka Streams'
    session aggregate: stream time - grace - gap)."""
    return stream_time - grace_ms - gap_ms


def fixed_window_key(window: TumblingWindow | HoppingWindow | SlidingWindow, key: Any, start: int) -> Windowed:
    """The key of a tumbling, hopping or sliding window's table record: end = start + size
    (exclusive for tumbling and hopping windows, inclusive for sliding ones)."""
    return Windowed(key, start, start + window.size_ms)


def session_result_timestamp(end: int) -> int:
    """A session's result is stamped with the session's end, its newest record's timestamp
    (Kafka Streams' KStreamSessionWindowAggregate), whichever record last changed it."""
    return end


def windowed_result(window: Any, stored: bytes | None, end: int, kept_timestamp: int | None) -> tuple[bytes | None, int | None]:
    """A windowed table's flushed row as its record: (value bytes, timestamp), as Kafka
    Streams stamps it. A sliding window's stored value carries its newest record timestamp
    first, which stamps it; a session is stamped with its end; a tumbling or hopping window
    with the timestamp its store kept (the largest folded into it)."""
    if isinstance(window, SlidingWindow):
        if stored is None:
            return None, kept_timestamp
        newest, aggregate = unpack(stored)
        return aggregate, newest
    if isinstance(window, SessionWindow):
        return stored, session_result_timestamp(end)
    return stored, kept_timestamp


def table_value_reader(window: Any) -> Callable[[bytes | None], bytes | None] | None:
    """How a windowed table's store value becomes the table's value bytes: None when it is
    them already; a sliding window's store value carries its newest record timestamp first."""
    return aggregate_bytes if isinstance(window, SlidingWindow) else None


def session_lookup_bounds(timestamp: int, gap_ms: int) -> tuple[int, int]:
    """(earliest session end, latest session start) of the sessions a record may join or
    bridge: those within ``gap`` of it."""
    return timestamp - gap_ms, timestamp + gap_ms


def merge_into_session(
    overlapping: Iterable[tuple[int, int, Any]],
    key: Any,
    value: Any,
    timestamp: int,
    *,
    close_time: int,
    aggregate: Callable[[Any, Any, Any], Any],
    merge: Callable[[Any, Any, Any], Any],
    new_initial: Callable[[], Any] | None,
) -> tuple[int, int, Any] | None:
    """The session a record joins: ``(start, end, aggregate)``, or None when it is late.

    ``overlapping``: the key's sessions within the gap of ``timestamp`` as ``(start, end,
    value)``, ordered by end then start. They merge in that order, starting from a fresh
    initial (``new_initial=None``: a reduce, starting from the oldest session), and the record
    is aggregated last; a merged session ending before ``close_time`` is late (Kafka Streams).
    """
    start = end = timestamp
    started = new_initial is not None
    total: Any = new_initial() if new_initial is not None else None
    for session_start, session_end, older in overlapping:
        total = merge(key, total, older) if started else older
        started = True
        start, end = min(start, session_start), max(end, session_end)
    if end < close_time:
        return None
    return start, end, (aggregate(total, key, value) if started else value)


# ============================================================================ joins


def join_lookup_bounds(window: JoinWindow, side: JoinSide, timestamp: int) -> tuple[int, int]:
    """The other side's records a record at ``timestamp`` meets: a left record at t meets
    right records in ``[t - before, t + after]``; a right record, the mirror image."""
    if side is JoinSide.LEFT:
        return timestamp - window.before_ms, timestamp + window.after_ms
    return timestamp - window.after_ms, timestamp + window.before_ms


def emits_unmatched(how: JoinHow, side: JoinSide) -> bool:
    """Whether a record that meets no partner is emitted with ``None`` for the other side: an
    outer join's records, and a left join's left records."""
    return how is JoinHow.OUTER or (how is JoinHow.LEFT and side is JoinSide.LEFT)


_OUTER_KEY = struct.Struct(">QB")
_TIME_ORDER = 1 << 63  # added to a timestamp so that its unsigned big-endian bytes sort as it does


def outer_join_key(timestamp: int, side: JoinSide, key: bytes) -> bytes:
    """Where an unmatched record waits in a join's outer store: ordered by timestamp, then
    side (left first), then key, as Kafka Streams' TimestampedKeyAndJoinSide."""
    return _OUTER_KEY.pack(timestamp + _TIME_ORDER, side is JoinSide.RIGHT) + key


def outer_join_entry(stored_key: bytes) -> tuple[int, JoinSide, bytes]:
    """``outer_join_key``'s parts: (timestamp, side, key)."""
    time, right = _OUTER_KEY.unpack_from(stored_key)
    return time - _TIME_ORDER, JoinSide.RIGHT if right else JoinSide.LEFT, stored_key[_OUTER_KEY.size :]


@dataclass(slots=True)
class HeldSince:
    """A lower bound of the times a join's outer store holds (None: unknown, after a start or
    restore, until the next scan reads it; ``EMPTY``: nothing held), which both sides keep, so
    a record that closes nothing reads nothing (Kafka Streams' sharedTimeTracker.minTime)."""

    time: int | None = None


#: ``HeldSince.time`` of an outer store known to hold nothing.
EMPTY = 2**63


def unmatched_window_open(window: JoinWindow, side: JoinSide, timestamp: int, stream_time: int) -> bool:
    """Whether an unmatched record may still meet a partner: a left record at t while stream
    time has not passed t + after + grace (a right one, t + before + grace). Kafka Streams'
    KStreamKStreamJoin keeps it open up to and including that time; its DSL guide's table
    shows it closing one tick earlier."""
    look_ahead = window.after_ms if side is JoinSide.LEFT else window.before_ms
    return timestamp + look_ahead + window.grace_ms >= stream_time


def joined_timestamp(timestamp: int, other_timestamp: int) -> int:
    """A join result's timestamp: the later of the two records'."""
    return timestamp if timestamp >= other_timestamp else other_timestamp


def join_pair(side: JoinSide, value: Any, other: Any) -> tuple[Any, Any]:
    """(left value, right value) of a record of ``side`` and its partner."""
    return (value, other) if side is JoinSide.LEFT else (other, value)


# ============================================================================ punctuations


def next_punctuation_due(due: int | None, now: int, interval_ms: int) -> int:
    """When a punctuation that fired at ``now`` is due next — Kafka Streams'
    ``PunctuationSchedule.next``: the next point after ``now`` on the schedule's grid (``due``
    + k * interval), so missed intervals are skipped, not replayed, and the grid is kept.
    ``due`` None: a stream-time schedule's first firing; Kafka Streams starts those at 0
    (``StreamTask.schedule``), so their grid is aligned to the epoch."""
    base = 0 if due is None else due
    next_due = base + interval_ms
    if now >= next_due:
        next_due = base + ((now - base) // interval_ms + 1) * interval_ms
    return next_due


@dataclass(slots=True)
class ScheduledPunctuation:
    """One ``@punctuate`` method of one processor instance and when it is next due (None: at
    the next opportunity)."""

    punctuation: Punctuation
    method: Callable[[int], None]
    context: NodeProcessorContext
    node: str
    next_due: int | None = None

    def due(self, now: int) -> bool:
        """Stream-time punctuations: due now (the first check fires at once)."""
        return self.next_due is None or now >= self.next_due

    def wall_clock_due(self, now: int) -> bool:
        """Wall-clock punctuations: the first check only schedules one interval ahead."""
        if self.next_due is None:
            self.next_due = now + self.punctuation.interval_ms
            return False
        return now >= self.next_due

    def fire(self, now: int) -> None:
        """Reschedule, then call the method with ``now`` as a punctuation sees it: no current
        record (topic, partition and offset None) and ``context.timestamp == now``."""
        self.next_due = next_punctuation_due(self.next_due, now, self.punctuation.interval_ms)
        position = self.context.position
        saved = position.topic, position.partition, position.offset, position.headers
        position.topic = position.partition = position.offset = None
        position.headers = ()  # what a punctuation forwards carries no record's headers
        self.context.timestamp = now
        try:
            self.method(now)
        finally:
            position.topic, position.partition, position.offset, position.headers = saved


# ============================================================================ stores and tasks


class KeyValueBytes(Protocol):
    def get(self, key: bytes) -> bytes | None: ...

    def put(self, key: bytes, value: bytes | None) -> None: ...

    def all(self) -> Iterable[tuple[bytes, bytes]]:
        """Every entry, in key-byte order."""
        ...


class WindowBytes(Protocol):
    #: The newest time written (window start, or join record time); None when empty.
    observed_stream_time: int | None

    def get(self, key: bytes, window_start: int) -> bytes | None: ...

    def put(self, key: bytes, window_start: int, value: bytes | None) -> bool: ...

    def fetch(self, key: bytes, time_from: int, time_to: int) -> Iterable[tuple[int, bytes]]: ...


class TimestampedKeyValueBytes(KeyValueBytes, Protocol):
    """A table's store (``rows_carry_timestamps``): each row with its timestamp."""

    def get_timestamped(self, key: bytes) -> tuple[bytes, int] | None: ...

    def put_timestamped(self, key: bytes, value: bytes | None, timestamp: int) -> None: ...


class TimestampedWindowBytes(WindowBytes, Protocol):
    """A tumbling or hopping aggregation's store: each window with its timestamp."""

    def get_timestamped(self, key: bytes, window_start: int) -> tuple[bytes, int] | None: ...

    def put_timestamped(self, key: bytes, window_start: int, value: bytes | None, timestamp: int) -> bool: ...

    def fetch_all_timestamped(self, time_from: int, time_to: int) -> Iterable[tuple[Any, int]]:
        """(window with ``key``, ``window_start`` and ``value``, its timestamp), by start."""
        ...


class SessionBytes(Protocol):
    observed_stream_time: int | None

    def find_sessions(self, key: bytes, earliest_session_end: int, latest_session_start: int) -> Iterable[Any]:
        """Sessions (with ``start``, ``end`` and ``value``) ordered by end, then start."""
        ...

    def put(self, key: bytes, start: int, end: int, value: bytes | None) -> bool: ...

    def remove(self, key: bytes, start: int, end: int) -> bool: ...


#: Record headers: (name, value bytes) pairs, in order; names may repeat.
Headers = Sequence[tuple[str, bytes | None]]


def checked_headers(headers: Iterable[tuple[str, bytes | None]], where: str) -> tuple[tuple[str, bytes | None], ...]:
    """``headers`` as a tuple of (str, bytes) pairs, or a TypeError naming ``where``."""
    checked = tuple(headers)
    for pair in checked:
        if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str) and (pair[1] is None or isinstance(pair[1], bytes | bytearray))):
            raise TypeError(f"{where}: headers are (str name, bytes value) pairs (a value may be None), got {pair!r}")
    return tuple((name, None if value is None else bytes(value)) for name, value in checked)


class VersionedBytes(Protocol):
    """A versioned table's store (pystreams.state.VersionedStore)."""

    def put_version(self, key: bytes, value: bytes | None, timestamp: int) -> str:
        """``"latest"`` (the key's current value changed), ``"history"`` (an out-of-order
        version) or ``"not-put"`` (older than the history retention)."""
        ...

    def get(self, key: bytes) -> bytes | None: ...

    def get_as_of(self, key: bytes, timestamp: int) -> bytes | None: ...


class TaskPosition:
    """What a task is processing: the record's topic, partition, offset (None inside a
    punctuation) and timestamp, the task's stream time, and the records it dropped (late, or
    with an invalid timestamp). The runtime updates it per record; kernels and processor
    contexts read it."""

    __slots__ = (
        "app_id",
        "task_id",
        "topic",
        "partition",
        "offset",
        "stream_time",
        "timestamp",
        "late_records_dropped",
        "invalid_timestamps_dropped",
        "null_keys_dropped",
        "headers",
        "on_forward_error",
    )

    def __init__(self, app_id: str, task_id: TaskId) -> None:
        self.app_id = app_id
        self.task_id = task_id
        self.topic: str | None = None
        self.partition: int | None = None
        self.offset: int | None = None
        #: Highest record timestamp this task has processed (Kafka Streams' stream time).
        self.stream_time: int | None = None
        #: The timestamp of the record being processed (stamps the store writes it causes).
        self.timestamp = 0
        self.late_records_dropped = 0
        #: Records skipped because their timestamp was negative (``source_timestamp``).
        self.invalid_timestamps_dropped = 0
        #: Records a table, aggregation or join skipped for their null key (``null_key_counter``).
        self.null_keys_dropped = 0
        #: The headers of the record being processed: what a sink writes with what it derived
        #: from it (Kafka Streams' record context). Empty for a table's flushed updates and
        #: inside punctuations.
        self.headers: Headers = ()
        #: Called for a child's failure on a record forwarded outside processing (a flushed
        #: table update, a final result, an evicted buffer entry); the runtime applies its
        #: error policy. By default it re-raises.
        self.on_forward_error: Callable[[NodeFailure], None] = _reraise_failure


def _reraise_failure(failure: NodeFailure) -> None:
    raise failure


class NodeProcessorContext:
    """What a PROCESSOR node's instance sees (``pystreams.topology.processor.ProcessorContext``):
    the current record's position, its timestamp (inside a punctuation: the punctuation time),
    the stores the node declared, and ``forward`` to its children (by default with the current
    timestamp)."""

    def __init__(self, position: TaskPosition, stores: Mapping[str, Any], allowed: tuple[str, ...]) -> None:
        self.position = position
        self._stores = stores
        self._allowed = allowed
        self.emit: Emit = drop
        #: The node's children by name, for ``forward(..., to=name)``.
        self.routes: Mapping[str, Emit] = {}
        self.timestamp: int = 0

    @property
    def app_id(self) -> str:
        return self.position.app_id

    @property
    def task_id(self) -> TaskId:
        return self.position.task_id

    @property
    def topic(self) -> str | None:
        return self.position.topic

    @property
    def partition(self) -> int | None:
        return self.position.partition

    @property
    def offset(self) -> int | None:
        return self.position.offset

    @property
    def headers(self) -> Headers:
        """The current record's headers; assigning replaces them for what this processor
        forwards from now on while it handles this record."""
        return self.position.headers

    @headers.setter
    def headers(self, headers: Iterable[tuple[str, bytes]]) -> None:
        self.position.headers = checked_headers(headers, "context.headers")

    def store(self, name: str) -> Any:
        if name not in self._allowed:
            raise KeyError(f"store {name!r} is not declared by this processor (it may use {list(self._allowed)})")
        return self._stores[name]

    def forward(self, key: Any, value: Any, *, timestamp: int | None = None, to: str | None = None, headers: Iterable[tuple[str, bytes]] | None = None) -> None:
        at = self.timestamp if timestamp is None else timestamp
        if to is None:
            target = self.emit
        else:
            route = self.routes.get(to)
            if route is None:
                raise ValueError(f"forward(to={to!r}): not a child of this processor (its children here: {sorted(self.routes) or 'none'})")
            target = route
        if headers is None:
            target(key, value, at)
            return
        position = self.position
        saved = position.headers
        position.headers = checked_headers(headers, "forward(headers=...)")
        try:
            target(key, value, at)
        finally:
            position.headers = saved


@dataclass(slots=True)
class ProcessorInstance:
    """One processor node's instance in one task; the runtime calls ``init`` (after restore),
    runs ``punctuations`` when due, and ``close``."""

    node: str
    instance: Any
    context: NodeProcessorContext
    punctuations: list[ScheduledPunctuation]

    def init(self) -> None:
        self.instance.init(self.context)


@dataclass(slots=True)
class NodeClock:
    """A windowed node's stream time: the highest timestamp of the records that reached it.
    A runtime that rebuilds nodes between batches keeps it across them; otherwise it starts
    from the store's newest time (after a restart, a safe lower bound: it never makes an
    on-time record look late)."""

    observed: int | None = None


@dataclass(slots=True)
class NodeWiring:
    """Everything a kernel needs to build one node of one task."""

    node: NodeBase
    #: The node's children, fanned out.
    forward: Emit = drop
    #: BRANCH: each label's child.
    routes: Mapping[str, Emit] = field(default_factory=dict)
    #: The task's byte stores by name, and their specs.
    stores: Mapping[str, Any] = field(default_factory=dict)
    specs: Mapping[str, Store] = field(default_factory=dict)
    #: PROCESSOR: the stores as processors see them (typed views).
    typed_stores: Mapping[str, Any] = field(default_factory=dict)
    position: TaskPosition | None = None
    #: PROCESSOR nodes add their instance here.
    processors: list[ProcessorInstance] = field(default_factory=list)
    #: Windowed nodes' stream times by node name (missing ones start from their store).
    clocks: dict[str, NodeClock] = field(default_factory=dict)
    #: What the nodes of one task share, by name (a stream-stream join's two sides: the
    #: earliest time their outer store may hold). A runtime passes one dict per task.
    shared: dict[str, Any] = field(default_factory=dict)

    def clock(self, store: WindowBytes | SessionBytes) -> NodeClock:
        clock = self.clocks.get(self.node.name)
        if clock is None:
            clock = self.clocks[self.node.name] = NodeClock(store.observed_stream_time)
        return clock

    def task(self) -> TaskPosition:
        if self.position is None:
            raise ValueError(f"node {self.node.name!r} ({self.node.kind}) needs its task")
        return self.position


def node_emit(node: Node, wiring: NodeWiring) -> Emit:
    """The kernel of every node kind both runtimes run alike, applied to ``node``. Sinks and
    repartitions are the runtimes' own (they write to Kafka, or to Spark's next step)."""
    forward = wiring.forward
    match node:
        case SourceNode() | MergeNode() | ToStreamNode() | BranchOutputNode():
            return forward
        case MapNode():
            return map_kernel(node.fn, forward)
        case MapValuesNode():
            return map_values_kernel(node.fn, forward)
        case FlatMapNode():
            return flat_map_kernel(node.fn, forward)
        case FlatMapValuesNode():
            return flat_map_values_kernel(node.fn, forward)
        case FilterNode():
            return filter_kernel(node.fn, forward)
        case PeekNode():
            return peek_kernel(node.fn, forward)
        case SelectKeyNode():
            return select_key_kernel(node.fn, forward)
        case BranchNode():
            return branch_kernel(node.fn, wiring.routes)
        case TableSourceNode():
            return _table_source(node, wiring)
        case TableFilterNode() | TableMapValuesNode():
            return _derived_table(node, wiring)
        case TableJoinSideNode():
            return _table_join_side(node, wiring)
        case TableJoinNode():
            return _table_join(node, wiring)
        case TableGroupByNode():
            return _table_group_by(node, wiring)
        case TableAggregateNode():
            return _table_aggregate(node, wiring)
        case FkSubscribeNode():
            return _fk_subscribe(node, wiring)
        case FkSubscriptionsNode():
            return _fk_subscriptions(node, wiring)
        case FkForeignUpdateNode():
            return _fk_foreign_update(node, wiring)
        case FkJoinNode():
            return _fk_join(node, wiring)
        case AggregationNode():
            return _aggregation(node, wiring)
        case CogroupNode():
            # Its inputs write the store; its updates reach its children when the store's cache
            # flushes, as an aggregation's do, so records reaching it carry nothing more.
            return drop
        case StreamTableJoinNode():
            return _stream_table_join(node, wiring)
        case StreamGlobalJoinNode():
            return _stream_global_join(node, wiring)
        case StreamStreamJoinNode():
            return _stream_stream_join(node, wiring)
        case ProcessorNode():
            return _processor(node, wiring)
        case SuppressNode():
            return _suppress(node, wiring)
        case SinkNode() | RepartitionNode():
            raise ValueError(f"node {node.name!r} ({node.kind}) is the runtime's own to build")


# ============================================================================ table kernels


def _table_source(node: TableSourceNode, wiring: NodeWiring) -> Emit:
    if wiring.specs[node.store].history_ms is not None:
        return _versioned_table_source(node, wiring)
    keep = _row_keeper(node.store, wiring)
    dropped = null_key_counter(wiring)

    def table_source(key: Any, value: Any, timestamp: int) -> None:
        if key is None:
            dropped()  # a table has no row for a null key
            return
        keep(key, value, timestamp)

    return table_source


def _versioned_table_source(node: TableSourceNode, wiring: NodeWiring) -> Emit:
    """A versioned table (KIP-914): every update goes into the key's history at its timestamp;
    one that becomes the key's latest value goes downstream at once (a versioned store has
    no cache), an out-of-order one changes only the past and emits nothing, and one older than
    the history retention is dropped, counted as late (Kafka Streams' NOT_PUT)."""
    spec = wiring.specs[node.store]
    key_bytes = spec.key_serde.serialize
    value_bytes = spec.value_serde.serialize
    put_version = wiring.stores[node.store].put_version
    forward = wiring.forward
    dropped = null_key_counter(wiring)
    position = wiring.position
    warned: list[bool] = []

    def versioned_table_source(key: Any, value: Any, timestamp: int) -> None:
        if key is None:
            dropped()  # a table has no row for a null key
            return
        outcome = put_version(key_bytes(key), None if value is None else value_bytes(value), timestamp)
        if outcome == "latest":
            forward(key, value, timestamp)
        elif outcome == "not-put":
            if position is not None:
                position.late_records_dropped += 1
            if not warned:
                warned.append(True)
                log.warning("versioned table %s drops updates older than its history retention (counted as late), e.g. %r at %d", node.name, key, timestamp)

    return versioned_table_source


def _derived_table(node: TableViewNode, wiring: NodeWiring) -> Emit:
    """A filtered or mapped table. Computed on read, it forwards every update, a filtered-out
    one as a tombstone (Kafka Streams without old values). Materialized, it keeps its rows in
    its store, whose flushes forward them, and writes nothing for a key it never held (Kafka
    Streams' materialized filter: no tombstone without an old value)."""
    if node.store is None:
        forward = wiring.forward

        def computed_on_read(key: Any, value: Any, timestamp: int) -> None:
            forward(key, table_view_value(node, key, value), timestamp)

        return computed_on_read
    keep = _row_keeper(node.store, wiring)

    def materialized(key: Any, value: Any, timestamp: int) -> None:
        if key is not None:  # a table has no row for a null key
            keep(key, table_view_value(node, key, value), timestamp)

    return materialized


def _row_keeper(store_name: str, wiring: NodeWiring) -> Callable[[Any, Any, int], None]:
    """Writes a materialized table's row for a key (None deletes it) as of a timestamp, which
    its flush forwards it with; writes nothing for a tombstone of a key the table never held,
    so its flush sends none (Kafka Streams' cached table stores: no old value and no new
    value, nothing forwarded)."""
    spec = wiring.specs[store_name]
    key_bytes = spec.key_serde.serialize
    value_bytes = spec.value_serde.serialize
    store = wiring.stores[store_name]
    get, put = store.get, store.put_timestamped

    def keep(key: Any, row: Any, timestamp: int) -> None:
        stored_key = key_bytes(key)
        if row is None and get(stored_key) is None:
            return
        put(stored_key, value_bytes(row), timestamp)

    return keep


#: What a table–table join side forwards when the join has no row to change for the key.
NO_CHANGE = object()


def table_join_row(how: JoinHow, side: JoinSide, this_row: Any, other_row: Any) -> tuple[Any, Any] | None:
    """The ``(left, right)`` rows a table–table join joins after an update of ``side`` left it
    with ``this_row`` and the other table holds ``other_row`` (None: no row); None when the
    join has no row for the key. Inner: both rows; left: a left row; outer: either row."""
    left, right = (this_row, other_row) if side is JoinSide.LEFT else (other_row, this_row)
    if left is None and right is None:
        return None
    if how is JoinHow.INNER and (left is None or right is None):
        return None
    if how is JoinHow.LEFT and left is None:
        return None
    return left, right


def table_join_update(how: JoinHow, side: JoinSide, this_row: Any, other_row: Any) -> tuple[Any, Any] | None | object:
    """What an update of one side of a table–table join sends (Kafka Streams'
    KTableKTable*Join processors, without old values): the rows to join; None, a tombstone
    for the key; or ``NO_CHANGE`` when the other side's row means the join had no row to
    change and gets none (an inner join whose other side is empty; a left join's right side
    whose left is empty)."""
    must_have_other = how is JoinHow.INNER or (how is JoinHow.LEFT and side is JoinSide.RIGHT)
    if must_have_other and other_row is None:
        return NO_CHANGE
    return table_join_row(how, side, this_row, other_row)


def table_row_as_of_reader(store_name: str, view: tuple[TableViewNode, ...], wiring: NodeWiring) -> Callable[[Any, int], Any]:
    """A versioned table's row for a key as of a time, through the steps computed on read
    (Kafka Streams' versioned value getter)."""
    spec = wiring.specs[store_name]
    key_bytes = spec.key_serde.serialize
    value_of = spec.value_serde.deserialize
    get_as_of = wiring.stores[store_name].get_as_of
    through = table_view_reader(view) if view else None

    def row(key: Any, timestamp: int) -> Any:
        stored = get_as_of(key_bytes(key), timestamp)
        value = None if stored is None else value_of(stored)
        return value if through is None else through(key, value)

    return row


def table_row_reader(store_name: str, view: tuple[TableViewNode, ...], wiring: NodeWiring) -> Callable[[Any], Any]:
    """A table's row for a key, for a lookup: read from ``store_name``, then through the
    steps computed on read (``view``); None when there is none (Kafka Streams' value getter)."""
    spec = wiring.specs[store_name]
    key_bytes = spec.key_serde.serialize
    value_of = spec.value_serde.deserialize
    get = wiring.stores[store_name].get
    through = table_view_reader(view) if view else None

    def row(key: Any) -> Any:
        stored = get(key_bytes(key))
        value = None if stored is None else value_of(stored)
        return value if through is None else through(key, value)

    return row


def table_row_and_time_reader(store_name: str, view: tuple[TableViewNode, ...], wiring: NodeWiring) -> Callable[[Any], tuple[Any, int | None]]:
    """``table_row_reader`` with the row's timestamp (None: no row, or its store keeps none —
    a versioned table's or a suppression's): what a table–table or foreign-key join stamps
    its result with (Kafka Streams' timestamped value getter). A step computed on read keeps
    the stored row's timestamp."""
    get_timestamped = getattr(wiring.stores[store_name], "get_timestamped", None)
    if get_timestamped is None:
        row_of = table_row_reader(store_name, view, wiring)
        return lambda key: (row_of(key), None)
    spec = wiring.specs[store_name]
    key_bytes = spec.key_serde.serialize
    value_of = spec.value_serde.deserialize
    through = table_view_reader(view) if view else None

    def row_and_time(key: Any) -> tuple[Any, int | None]:
        stored = get_timestamped(key_bytes(key))
        if stored is None:
            return None, None  # a step computed on read has no row for no row either
        value = value_of(stored[0])
        return (value if through is None else through(key, value)), stored[1]

    return row_and_time


def _table_join_side(node: TableJoinSideNode, wiring: NodeWiring) -> Emit:
    """On an update of its table, reads the other table's row and sends the join's row for
    the key (joined with ``fn(key, left, right)``), a tombstone, or nothing."""
    fn, how, side = node.fn, node.how, node.side
    other_row_of = table_row_and_time_reader(node.other_store, node.other_view, wiring)
    forward = wiring.forward
    dropped = null_key_counter(wiring)

    def table_join_side(key: Any, value: Any, timestamp: int) -> None:
        if key is None:
            dropped()  # a table has no row for a null key
            return
        other_row, other_timestamp = other_row_of(key)
        rows = table_join_update(how, side, value, other_row)
        if rows is NO_CHANGE:
            return
        # Kafka Streams' KTableKTable*Join: the later of the update's and the other row's.
        at = timestamp if other_timestamp is None or timestamp >= other_timestamp else other_timestamp
        forward(key, None if rows is None else fn(key, *cast(tuple[Any, Any], rows)), at)

    return table_join_side


def _table_join(node: TableJoinNode, wiring: NodeWiring) -> Emit:
    """The join's table: computed on read it forwards its sides' rows as they come;
    materialized it keeps them, and writes nothing for a key it never held."""
    if node.store is None:
        return wiring.forward
    keep = _row_keeper(node.store, wiring)

    def table_join(key: Any, value: Any, timestamp: int) -> None:
        keep(key, value, timestamp)

    return table_join


def grouped_pair(result: Any) -> tuple[Any, Any] | None:
    """A table ``group_by`` selector's answer as the ``(key, value)`` it groups the row under;
    None (the row joins no group) when it is None or either half is, as Kafka Streams drops
    such a pair. Anything but a pair is a TypeError the node's error policy reports."""
    if result is None:
        return None
    key, value = key_value_pair(result, "a table's group_by must return a (key, value) tuple")
    return None if key is None or value is None else (key, value)


def grouped_updates(new: tuple[bytes, bytes] | None, old: tuple[bytes, bytes] | None) -> list[tuple[bytes, bytes | None, bytes | None]]:
    """What a table ``group_by`` sends for a row that moved from the ``old`` to the ``new``
    (key bytes, value bytes) pair: ``(key, new value, old value)`` records. One when the key
    stays; else the old group's subtraction first, then the new group's addition (Kafka
    Streams' KTableRepartitionMap since 3.5)."""
    if new is not None and old is not None and new[0] == old[0]:
        return [(new[0], new[1], old[1])]
    updates: list[tuple[bytes, bytes | None, bytes | None]] = []
    if old is not None:
        updates.append((old[0], None, old[1]))
    if new is not None:
        updates.append((new[0], new[1], None))
    return updates


_encode_pair = msgspec.msgpack.Encoder().encode
_decode_pair = msgspec.msgpack.Decoder(tuple[bytes, bytes]).decode


def _table_group_by(node: TableGroupByNode, wiring: NodeWiring) -> Emit:
    """Re-keys each row and sends its group's change; the row's last pair, kept in the node's
    store, is what the next update of the row subtracts."""
    fn = node.fn
    store = wiring.stores[node.store]
    get, put = store.get, store.put
    row_key_bytes = wiring.specs[node.store].key_serde.serialize
    change = cast(serdes.Change, node.value_serde)
    group_key_bytes, group_key_of = node.key_serde.serialize, node.key_serde.deserialize
    value_bytes, value_of = change.inner.serialize, change.inner.deserialize
    forward = wiring.forward
    dropped = null_key_counter(wiring)

    def table_group_by(key: Any, value: Any, timestamp: int) -> None:
        if key is None:
            dropped()  # a table has no row for a null key
            return
        row_key = row_key_bytes(key)
        stored = get(row_key)
        old = None if stored is None else _decode_pair(stored)
        pair = None if value is None else grouped_pair(fn(key, value))
        new = None if pair is None else (cast(bytes, group_key_bytes(pair[0])), cast(bytes, value_bytes(pair[1])))
        if new != old:
            put(row_key, None if new is None else _encode_pair(new))
        for group_key, new_value, old_value in grouped_updates(new, old):
            forward(group_key_of(group_key), (value_of(new_value), value_of(old_value)), timestamp)

    return table_group_by


def table_aggregate_value(node: TableAggregateNode, key: Any, accumulator: Any, new: Any, old: Any) -> Any:
    """A grouped table's accumulator after one change (Kafka Streams' KTableAggregate and
    KTableReduce): subtract ``old`` from the accumulator there is, then add ``new`` — to a
    fresh ``initial`` (``reduce``: ``new`` is the accumulator) when there is none, or the
    subtraction left None. None deletes the key."""
    if old is not None and accumulator is not None:
        accumulator = node.subtractor(accumulator, key, old)
    if new is None:
        return accumulator
    if accumulator is None:
        return new if node.reduce else node.adder(initial_factory(node.initial)(), key, new)
    return node.adder(accumulator, key, new)


def _table_aggregate(node: TableAggregateNode, wiring: NodeWiring) -> Emit:
    spec = wiring.specs[node.store]
    key_bytes = spec.key_serde.serialize
    value_bytes, value_of = spec.value_serde.serialize, spec.value_serde.deserialize
    store = wiring.stores[node.store]
    get, put = store.get_timestamped, store.put_timestamped

    def table_aggregate(key: Any, change: Any, timestamp: int) -> None:
        if key is None or change is None:
            return
        new, old = change
        stored_key = key_bytes(key)
        stored = get(stored_key)
        accumulator = table_aggregate_value(node, key, None if stored is None else value_of(stored[0]), new, old)
        if accumulator is None and stored is None:
            return
        # Kafka Streams' KTableAggregate: the largest timestamp folded in (subtractions too).
        at = timestamp if stored is None or timestamp >= stored[1] else stored[1]
        put(stored_key, value_bytes(accumulator), at)

    return table_aggregate


# ============================================================================ foreign-key join


def _fk_subscribe(node: FkSubscribeNode, wiring: NodeWiring) -> Emit:
    """A left row's subscriptions (``foreign_key.subscriptions``), keyed by foreign key, with
    the hash of the row's value; the store keeps the row's last foreign key."""
    fn = node.fn
    store = wiring.stores[node.store]
    get, put = store.get, store.put
    row_key_bytes = wiring.specs[node.store].key_serde.serialize
    foreign_key_bytes, foreign_key_of = node.key_serde.serialize, node.key_serde.deserialize
    left_value_bytes = node.left_value_serde.serialize
    forward = wiring.forward
    dropped = null_key_counter(wiring)

    def fk_subscribe(key: Any, value: Any, timestamp: int) -> None:
        if key is None:
            dropped()  # a table has no row for a null key
            return
        row_key = row_key_bytes(key)
        stored = get(row_key)
        old = None if stored is None else fk.decode_row(stored)
        new = None if value is None else (foreign_key_bytes(fn(key, value)),)
        if new != old:
            put(row_key, None if new is None else fk.encode_row(new))
        hashed = fk.value_hash(left_value_bytes(value))
        for foreign_key, instruction in fk.subscriptions(old, new):
            forward(foreign_key_of(foreign_key), fk.Subscription(hashed, instruction, key), timestamp)

    return fk_subscribe


def _fk_subscriptions(node: FkSubscriptionsNode, wiring: NodeWiring) -> Emit:
    """Keeps (or drops) a subscription and answers it with the right row, as its instruction
    says; a None foreign key (a left join's) is answered at once, never kept."""
    store = wiring.stores[node.store]
    put = store.put
    foreign_row_of = table_row_and_time_reader(node.foreign_store, node.foreign_view, wiring)
    foreign_key_bytes = wiring.specs[node.foreign_store].key_serde.serialize
    subscription_bytes = cast(fk.SubscriptionSerde, wiring.specs[node.store].value_serde)
    primary_key_bytes = subscription_bytes.key.serialize
    forward = wiring.forward
    keep = {fk.Instruction.PROPAGATE_NULL_IF_NO_FK_VAL_AVAILABLE}

    def fk_subscriptions(foreign_key: Any, subscription: Any, timestamp: int) -> None:
        if subscription is None:
            return
        instruction = subscription.instruction
        if foreign_key is None:
            if instruction is not fk.Instruction.PROPAGATE_NULL_IF_NO_FK_VAL_AVAILABLE:
                return
            forward(subscription.primary_key, fk.SubscriptionResponse(subscription.hash, None), timestamp)
            return
        stored_key = fk.subscription_key(cast(bytes, foreign_key_bytes(foreign_key)), cast(bytes, primary_key_bytes(subscription.primary_key)))
        put(stored_key, subscription_bytes.serialize(subscription) if instruction in keep else None)
        foreign_row, foreign_timestamp = foreign_row_of(foreign_key)
        answered, row = fk.answers(instruction, foreign_row)
        if answered:
            # Kafka Streams' SubscriptionJoinProcessor: the later of the subscription's and the row's.
            at = timestamp if foreign_timestamp is None or timestamp >= foreign_timestamp else foreign_timestamp
            forward(subscription.primary_key, fk.SubscriptionResponse(subscription.hash, row), at)

    return fk_subscriptions


def _fk_foreign_update(node: FkForeignUpdateNode, wiring: NodeWiring) -> Emit:
    """A right row changed: every subscriber of it gets the new row (None: gone)."""
    spec = wiring.specs[node.subscriptions_store]
    store = wiring.stores[node.subscriptions_store]
    subscription_of = spec.value_serde.deserialize
    foreign_key_bytes = node.foreign_key_serde.serialize
    forward = wiring.forward
    dropped = null_key_counter(wiring)

    def fk_foreign_update(foreign_key: Any, value: Any, timestamp: int) -> None:
        if foreign_key is None:
            dropped()  # a table has no row for a null key
            return
        for _, packed in store.prefix_scan(fk.subscription_prefix(cast(bytes, foreign_key_bytes(foreign_key)))):
            subscription = subscription_of(packed)
            forward(subscription.primary_key, fk.SubscriptionResponse(subscription.hash, value), timestamp)

    return fk_foreign_update


def _fk_join(node: FkJoinNode, wiring: NodeWiring) -> Emit:
    """An answer becomes the join's row for its left key unless it answers an earlier left
    value (its hash is not the current row's): then it is stale and dropped."""
    fn, left_join = node.fn, node.left_join
    left_row_of = table_row_reader(node.left_store, node.left_view, wiring)
    left_value_bytes = node.left_value_serde.serialize
    keep = _row_keeper(node.store, wiring) if node.store is not None else None
    forward = wiring.forward

    def fk_join(key: Any, response: Any, timestamp: int) -> None:
        if key is None or response is None:
            return
        current = left_row_of(key)
        if fk.value_hash(left_value_bytes(current)) != response.hash:
            return  # a stale answer
        row = fk.joined_row(left_join, fn, key, current, response.foreign_value)
        if keep is not None:
            keep(key, row, timestamp)
        else:
            forward(key, row, timestamp)

    return fk_join


def _aggregation(node: AggregationNode, wiring: NodeWiring) -> Emit:
    """Aggregations write their store; its cache forwards the folded updates downstream when
    it flushes (the runtime wires that), so the emit itself forwards nothing."""
    store = wiring.stores[node.store]
    key_serde = wiring.specs[node.store].key_serde
    skips = record_skipper(wiring)
    if node.window is None:
        return _key_value_aggregation(node, store, key_serde, null_key_counter(wiring))
    task, clock = wiring.task(), wiring.clock(store)
    window = node.window
    if isinstance(window, SessionWindow):
        aggregate = _session_aggregation(node, window, store, key_serde, task, clock, skips)
    elif isinstance(window, SlidingWindow):
        # Emit-final over sliding windows is refused where the app declares it (app.py).
        return _sliding_aggregation(node, window, store, key_serde, task, clock, skips)
    else:
        aggregate = _windowed_aggregation(node, window, store, key_serde, task, clock, skips)
    if not node.emits_final:
        return aggregate
    assert node.emitted_store is not None, f"emit-final aggregation {node.name!r} has no emitted store"
    key_of = key_serde.deserialize
    closed_by: Callable[[int], int]
    closed_between: Callable[[int, int], Iterable[tuple[Windowed, bytes, int]]]
    if isinstance(window, SessionWindow):
        gap, grace = window.gap_ms, window.grace_ms

        def session_closed_by(stream_time: int) -> int:
            return session_close_time(stream_time, grace, gap)

        def sessions_closed_between(before: int, now: int) -> Iterable[tuple[Windowed, bytes, int]]:
            ending = store.fetch_all_ending(*newly_closed_session_ends(before, now))
            return [(Windowed(key_of(s.key), s.start, s.end), s.value, session_result_timestamp(s.end)) for s in ending]

        closed_by, closed_between = session_closed_by, sessions_closed_between
    else:
        fixed = window

        def window_closed_by(stream_time: int) -> int:
            return close_time(stream_time, fixed.grace_ms)

        def windows_closed_between(before: int, now: int) -> Iterable[tuple[Windowed, bytes, int]]:
            starts = newly_closed_window_starts(fixed, before, now)
            if starts is None:
                return ()
            return [(fixed_window_key(fixed, key_of(w.key), w.window_start), w.value, at) for w, at in store.fetch_all_timestamped(*starts)]

        closed_by, closed_between = window_closed_by, windows_closed_between
    return _emit_final(node, wiring.stores[node.emitted_store], task, clock, wiring.forward, aggregate, closed_by, closed_between)


def _emit_final(
    node: AggregationNode,
    emitted: KeyValueBytes,
    task: TaskPosition,
    clock: NodeClock,
    forward: Emit,
    aggregate: Emit,
    closed_by: Callable[[int], int],
    closed_between: Callable[[int, int], Iterable[tuple[Windowed, bytes, int]]],
) -> Emit:
    """Emit-final (KIP-825): when a record moves the node's stream time, every window (session)
    it closes is read from the store and forwarded once, oldest first, before the record is
    aggregated (its own windows are open, or it is late). The stream time goes into
    ``emitted`` with each move, in the same commit as the outputs: a new owner knows which
    windows are out — under exactly-once, exactly those whose outputs committed — and judges
    lateness by the same clock, so it neither repeats a final result nor reopens a window."""
    value_of = node.value_serde.deserialize
    closed_up_to = _NOTHING_CLOSED
    loaded = False

    def load() -> None:
        nonlocal closed_up_to, loaded
        persisted = decode_stream_time(emitted.get(EMITTED_STREAM_TIME_KEY))
        if persisted is not None:
            clock.observed = advance_stream_time(clock.observed, persisted)
            closed_up_to = closed_by(persisted)
        loaded = True

    def aggregate_final(key: Any, value: Any, timestamp: int) -> None:
        nonlocal closed_up_to
        if key is None or value is None:
            aggregate(key, value, timestamp)  # skips it (and counts a null key): it moves no stream time
            return
        if not loaded:
            load()
        if clock.observed is None or timestamp > clock.observed:
            clock.observed = timestamp
            emitted.put(EMITTED_STREAM_TIME_KEY, encode_stream_time(timestamp))
            closed_now = closed_by(timestamp)
            if closed_now > closed_up_to:
                finals = closed_between(closed_up_to, closed_now)
                closed_up_to = closed_now
                # Each final result keeps its own timestamp (KIP-825), not the closing record's.
                _forward_each(forward, ((windowed, value_of(data), at) for windowed, data, at in finals), task)
        aggregate(key, value, timestamp)

    return aggregate_final


def _report(task: TaskPosition | None, failure: NodeFailure) -> None:
    """A failure on a record that left a store for good goes to the task's error policy."""
    if task is None:
        raise failure
    task.on_forward_error(failure)


def _forward_each(forward: Emit, records: Iterable[tuple[Any, Any, int]], task: TaskPosition) -> None:
    """Forward records that leave a store for good (final results, evicted buffer entries): a
    child failing on one is reported by the task's error policy and the others still go."""
    for key, value, timestamp in records:
        try:
            forward(key, value, timestamp)
        except NodeFailure as failure:
            task.on_forward_error(failure)


def _aggregation_functions(
    node: AggregationNode, key_serde: Any
) -> tuple[Callable[..., Any], Callable[[Any, Any], Any], Callable[..., Any], Callable[..., Any], Callable[..., Any]]:
    """``fn``, the first-record rule, and the codecs an aggregation kernel binds locally."""
    return (node.fn, Aggregator.of(node).first, key_serde.serialize, node.value_serde.serialize, node.value_serde.deserialize)


def _key_value_aggregation(node: AggregationNode, store: TimestampedKeyValueBytes, key_serde: Any, dropped: Callable[[], None]) -> Emit:
    fn, first, key_bytes, value_bytes, value_of = _aggregation_functions(node, key_serde)
    get = store.get_timestamped
    put = store.put_timestamped

    def aggregate(key: Any, value: Any, timestamp: int) -> None:
        if key is None or value is None:  # record_skipper, inlined: this is the hottest stateful path
            if key is None:
                dropped()
            return
        stored_key = key_bytes(key)
        previous = get(stored_key)
        if previous is None:
            put(stored_key, value_bytes(first(key, value)), timestamp)
            return
        # Kafka Streams' KStreamAggregate: the result carries the largest timestamp folded in.
        row, at = previous
        put(stored_key, value_bytes(fn(value_of(row), key, value)), timestamp if timestamp > at else at)

    return aggregate


def _windowed_aggregation(
    node: AggregationNode,
    window: TumblingWindow | HoppingWindow,
    store: TimestampedWindowBytes,
    key_serde: Any,
    task: TaskPosition,
    clock: NodeClock,
    skips: Callable[[Any, Any], bool],
) -> Emit:
    fn, first, key_bytes, value_bytes, value_of = _aggregation_functions(node, key_serde)
    grace = window.grace_ms

    def aggregate_windowed(key: Any, value: Any, timestamp: int) -> None:
        if skips(key, value):
            return
        observed = clock.observed = advance_stream_time(clock.observed, timestamp)
        still_open, closed = open_windows(window, timestamp, close_time(observed, grace))
        for bounds in closed:
            task.late_records_dropped += 1
            log.debug(
                "task %s node %s: record at %d is late for window [%d, %d) (stream time %d, grace %d)",
                task.task_id,
                node.name,
                timestamp,
                bounds.start_ms,
                bounds.end_ms,
                observed,
                grace,
            )
        stored_key = key_bytes(key)
        for bounds in still_open:
            start = bounds.start_ms
            previous = store.get_timestamped(stored_key, start)
            if previous is None:
                store.put_timestamped(stored_key, start, value_bytes(first(key, value)), timestamp)
                continue
            # Kafka Streams' KStreamWindowAggregate: the largest timestamp folded into the window.
            row, at = previous
            store.put_timestamped(stored_key, start, value_bytes(fn(value_of(row), key, value)), timestamp if timestamp > at else at)

    return aggregate_windowed


def _sliding_aggregation(
    node: AggregationNode,
    window: SlidingWindow,
    store: WindowBytes,
    key_serde: Any,
    task: TaskPosition,
    clock: NodeClock,
    skips: Callable[[Any, Any], bool],
) -> Emit:
    """Sliding windows: ``pystreams.topology.sliding`` decides which windows a record updates
    and creates; the store keeps each window's newest record timestamp with its aggregate."""
    fn, first, key_bytes, value_bytes, value_of = _aggregation_functions(node, key_serde)
    difference, grace = window.difference_ms, window.grace_ms

    def aggregate_sliding(key: Any, value: Any, timestamp: int) -> None:
        if skips(key, value):
            return
        observed = clock.observed = advance_stream_time(clock.observed, timestamp)
        closes = close_time(observed, grace)
        if is_late(timestamp, difference, closes):
            task.late_records_dropped += 1
            log.debug("task %s node %s: record at %d is late for every sliding window (stream time %d)", task.task_id, node.name, timestamp, observed)
            return
        stored_key = key_bytes(key)
        existing = []
        for start, stored in store.fetch(stored_key, *lookup_bounds(timestamp, difference)):
            max_timestamp, aggregate = unpack(stored)
            existing.append(SlidingWindowValue(start, max_timestamp, value_of(aggregate)))
        writes, closed = sliding_window_updates(
            existing,
            timestamp,
            difference,
            closes,
            add=lambda aggregate: fn(aggregate, key, value),
            first=lambda: first(key, value),
        )
        task.late_records_dropped += closed
        for start, max_timestamp, aggregate in writes:
            store.put(stored_key, start, pack(max_timestamp, value_bytes(aggregate)))

    return aggregate_sliding


def _session_aggregation(
    node: AggregationNode,
    window: SessionWindow,
    store: SessionBytes,
    key_serde: Any,
    task: TaskPosition,
    clock: NodeClock,
    skips: Callable[[Any, Any], bool],
) -> Emit:
    fn, _, key_bytes, value_bytes, value_of = _aggregation_functions(node, key_serde)
    merger = node.merger
    assert merger is not None, f"session aggregation {node.name!r} has no merger"
    new_initial = Aggregator.of(node).new_initial
    gap, grace = window.gap_ms, window.grace_ms

    def aggregate_sessions(key: Any, value: Any, timestamp: int) -> None:
        if skips(key, value):
            return
        observed = clock.observed = advance_stream_time(clock.observed, timestamp)
        stored_key = key_bytes(key)
        overlapping = list(store.find_sessions(stored_key, *session_lookup_bounds(timestamp, gap)))
        merged = merge_into_session(
            [(session.start, session.end, value_of(session.value)) for session in overlapping],
            key,
            value,
            timestamp,
            close_time=session_close_time(observed, grace, gap),
            aggregate=fn,
            merge=merger,
            new_initial=new_initial,
        )
        if merged is None:
            task.late_records_dropped += 1
            return
        start, end, total = merged
        for session in overlapping:
            if (session.start, session.end) != (start, end):
                store.remove(stored_key, session.start, session.end)
        store.put(stored_key, start, end, value_bytes(total))

    return aggregate_sessions


# ============================================================================ suppression


def _suppress(node: SuppressNode, wiring: NodeWiring) -> Emit:
    """Buffers each table update (non-resetting: a key keeps its first due time), then emits
    what is due by the node's stream time, oldest first; over a limit, emits the oldest early
    or stops the task (``pystreams.topology.suppress``)."""
    task = wiring.task()
    buffer = SuppressionBuffer(node.suppression.buffer, wiring.stores[node.store])
    # Keys are never None here (a table has no row for a null key), so their bytes are not either.
    key_bytes = cast(Callable[[Any], bytes], node.key_serde.serialize)
    key_of = node.key_serde.deserialize
    value_bytes, value_of = node.value_serde.serialize, node.value_serde.deserialize
    due = due_time_rule(node.suppression, node.window)
    bounded = buffer.limits.bounded
    shut_down = buffer.limits.when_full is WhenFull.SHUT_DOWN
    forward = wiring.forward

    # A window whose row was deleted before it closed (a session merged into another) was
    # never emitted, so its tombstone is safe to drop (Kafka Streams' final results do).
    drops_tombstones = isinstance(node.suppression, UntilWindowCloses)

    def emit_entries(entries: list[tuple[bytes, int, bytes | None]]) -> None:
        records = ((key_of(k), None if v is None else value_of(v), ts) for k, ts, v in entries if v is not None or not drops_tombstones)
        _forward_each(forward, records, task)

    def suppress(key: Any, value: Any, timestamp: int) -> None:
        if not buffer.loaded:
            buffer.load()
        if key is None:
            return  # a table has no row for a null key
        stream_time = buffer.observe(timestamp)
        buffer.put(key_bytes(key), due(key, timestamp), timestamp, None if value is None else value_bytes(value))
        emit_entries(list(buffer.pop_due(stream_time)))
        if not bounded:
            return
        over = buffer.over_limit()
        if over is None:
            return
        if shut_down:
            raise SuppressionBufferFullError(_buffer_full(node, task, over))
        emit_entries(list(buffer.pop_oldest_while_over_limit()))

    return suppress


def _buffer_full(node: SuppressNode, task: TaskPosition, over: str) -> RecordFailure:
    setting = (
        "until_window_closes(max_records=..., max_bytes=...)"
        if isinstance(node.suppression, UntilWindowCloses)
        else ("until_time_limit(..., max_records=..., max_bytes=...), or when_full='emit_early'")
    )
    reason = f"suppression buffer store {node.store!r} is full ({over}) and when_full is shut_down; raise the limit in {setting}"
    return RecordFailure(ErrorKind.PROCESSING, str(task.task_id), task.topic, task.partition, task.offset, node.name, reason)


# ============================================================================ join kernels


def _stream_table_join(node: StreamTableJoinNode, wiring: NodeWiring) -> Emit:
    """Looks each record up in the table's store — a versioned table's as of the record's
    timestamp; an inner join drops misses, a left join calls ``fn`` with None, a null-key
    record included (KIP-962: an inner join skips it, counted). Table updates trigger nothing.
    With a grace period the records wait in a buffer first (``_join_buffer``)."""
    fn = node.fn
    left_join = node.how is JoinHow.LEFT
    forward = wiring.forward
    dropped = null_key_counter(wiring)
    if wiring.specs[node.table_store].history_ms is not None:
        row_as_of = table_row_as_of_reader(node.table_store, node.table_view, wiring)

        def row_at(key: Any, timestamp: int) -> Any:
            return row_as_of(key, timestamp)

    else:
        row_now = table_row_reader(node.table_store, node.table_view, wiring)

        def row_at(key: Any, timestamp: int) -> Any:
            return row_now(key)

    def join_now(key: Any, value: Any, timestamp: int) -> None:
        row = row_at(key, timestamp)
        if row is None:
            if left_join:
                forward(key, fn(key, value, None), timestamp)
            return
        forward(key, fn(key, value, row), timestamp)

    join: Emit = join_now
    if node.buffer_store is not None:
        assert node.grace_ms is not None  # the builder sets both
        join = _join_buffer(node.name, node.buffer_store, node.grace_ms, join, wiring)

    def stream_table_join(key: Any, value: Any, timestamp: int) -> None:
        if value is None:
            if key is None:
                dropped()
            return
        if key is None:
            if left_join:
                forward(key, fn(key, value, None), timestamp)  # no table row has a null key
            else:
                dropped()
            return
        join(key, value, timestamp)

    return stream_table_join


_BUFFER_META = b"\x00"
_BUFFERED = b"\x01"
_encode_buffer_meta = msgspec.msgpack.Encoder().encode
_decode_buffer_meta = msgspec.msgpack.Decoder(tuple[int, int]).decode
_BUFFERED_END = b"\x02"
#: A buffered record's value bytes and headers.
_encode_buffered = msgspec.msgpack.Encoder().encode
_decode_buffered = msgspec.msgpack.Decoder(tuple[bytes | None, list[tuple[str, bytes | None]]]).decode


def _join_buffer(node_name: str, store_name: str, grace_ms: int, join: Emit, wiring: NodeWiring) -> Emit:
    """Kafka Streams' stream–table join grace (KIP-923): a record waits in a changelogged
    buffer until the buffer's stream time is ``grace_ms`` past it, then joins as of its own
    timestamp, in timestamp order (ties by key bytes, then arrival), with its own timestamp and
    headers as the record being processed; a record already that far behind joins at once. A
    joiner failing on one evicted record is reported by the task's error policy and the others
    still join. The buffer keeps ``[stream time, next sequence number]`` and the records under
    ``timestamp | key bytes | sequence`` keys, each as ``[value bytes, headers]``; a heap of
    those keys, read from the store once (after a restore it holds records), finds the due
    ones without scanning the store per record."""
    spec = wiring.specs[store_name]
    key_bytes = cast(Callable[[Any], bytes], spec.key_serde.serialize)
    value_bytes = spec.value_serde.serialize
    key_of, value_of = spec.key_serde.deserialize, spec.value_serde.deserialize
    buffer = wiring.stores[store_name]
    position = wiring.position
    join_guarded = guard(node_name, join)
    #: The buffered records' keys, smallest (earliest) first; None until read from the store.
    buffered: list[list[bytes] | None] = [None]

    def heap() -> list[bytes]:
        keys = buffered[0]
        if keys is None:
            keys = buffered[0] = [key for key, _ in buffer.range(_BUFFERED, _BUFFERED_END)]
            heapq.heapify(keys)
        return keys

    def evict(until: int) -> None:
        keys = heap()
        if until < 0 or not keys:
            return
        # Keys are longer than this bound, so every key below it is at time until or earlier.
        bound = _BUFFERED + (until + 1).to_bytes(8, "big")
        due = []
        while keys and keys[0] < bound:
            stored_key = heapq.heappop(keys)
            stored = buffer.get(stored_key)
            buffer.delete(stored_key)
            if stored is not None:
                due.append((stored_key, stored))
        saved = (position.timestamp, position.headers) if position is not None else None
        try:
            for stored_key, stored in due:
                timestamp = int.from_bytes(stored_key[1:9], "big")
                try:
                    try:  # an entry that cannot be read fails alone, like a failing joiner
                        raw_value, headers = _decode_buffered(stored)
                        key, value = key_of(stored_key[9:-8]), value_of(raw_value)
                    except Exception as error:
                        raise NodeFailure(node_name, error) from error
                    if position is not None:
                        position.timestamp, position.headers = timestamp, headers
                    join_guarded(key, value, timestamp)
                except NodeFailure as failure:
                    if position is None:
                        raise
                    position.on_forward_error(failure)
        finally:
            if position is not None and saved is not None:
                position.timestamp, position.headers = saved

    def buffered_join(key: Any, value: Any, timestamp: int) -> None:
        meta = buffer.get(_BUFFER_META)
        observed, sequence = _decode_buffer_meta(meta) if meta is not None else (None, 0)
        if observed is not None and timestamp < observed - grace_ms:
            join(key, value, timestamp)  # too far behind to wait: joined at once
            return
        keys = heap()
        headers = list(position.headers) if position is not None else []
        stored_key = _BUFFERED + timestamp.to_bytes(8, "big") + key_bytes(key) + sequence.to_bytes(8, "big")
        buffer.put(stored_key, _encode_buffered((value_bytes(value), headers)))
        heapq.heappush(keys, stored_key)
        observed = timestamp if observed is None else max(observed, timestamp)
        buffer.put(_BUFFER_META, _encode_buffer_meta((observed, sequence + 1)))
        evict(observed - grace_ms)

    return buffered_join


def _stream_global_join(node: StreamGlobalJoinNode, wiring: NodeWiring) -> Emit:
    """Looks each record up in the global table by its foreign key (Kafka Streams'
    KStreamGlobalKTableJoin): a record with a null value, or a null foreign key, is skipped —
    counted as a null key — except that a left join still joins a null-key record, with None
    when its foreign key is null too; an inner join drops misses, a left join calls ``fn``
    with None. Table updates trigger nothing."""
    fn = node.fn
    if node.global_table not in wiring.stores:
        raise ValueError(f"join {node.name!r}: the runtime holds no global table {node.global_table!r}")
    row_of = table_row_reader(node.global_table, (), wiring)
    foreign_key = node.foreign_key
    left_join = node.how is JoinHow.LEFT
    forward = wiring.forward
    dropped = null_key_counter(wiring)

    def stream_global_join(key: Any, value: Any, timestamp: int) -> None:
        if value is None:
            return
        table_key = key if foreign_key is None else foreign_key(key, value)
        if table_key is None:
            if left_join and key is None:
                forward(key, fn(key, value, None), timestamp)
            else:
                dropped()
            return
        row = row_of(table_key)
        if row is None:
            if left_join:
                forward(key, fn(key, value, None), timestamp)
            return
        forward(key, fn(key, value, row), timestamp)

    return stream_global_join


# Stream–stream join stores keep every record of a (key, timestamp): the stored value is a
# MessagePack list of the records' value bytes.
encode_join_values = msgspec.msgpack.Encoder().encode
decode_join_values = msgspec.msgpack.Decoder(list[bytes]).decode


def _stream_stream_join(node: StreamStreamJoinNode, wiring: NodeWiring) -> Emit:
    """Kafka Streams' KStreamKStreamJoin (>= 3.1), one side: stores the record in this side's
    store (a record older than its retention is not kept, but still joins what the other side
    holds), emits the outer store's records whose window has closed, then pairs the record
    with the other side's records within the join window, oldest first. A left or outer join
    holds a record that met no partner in the outer store until its window closes — a partner
    arriving first takes it out — or emits it with None at once when its window has closed
    already (out of order); a null-key record of such a side is emitted with None at once."""
    fn = node.fn
    this_store: WindowBytes = wiring.stores[node.this_store]
    other_store: WindowBytes = wiring.stores[node.other_store]
    this_spec = wiring.specs[node.this_store]
    # Keys are never None past the first check, so their bytes are not either.
    key_bytes = cast(Callable[[Any], bytes], this_spec.key_serde.serialize)
    this_value_bytes = cast(Callable[[Any], bytes], this_spec.value_serde.serialize)
    other_value_of = wiring.specs[node.other_store].value_serde.deserialize
    side, window = node.side, node.window
    other_side = JoinSide.RIGHT if side is JoinSide.LEFT else JoinSide.LEFT
    unmatched = emits_unmatched(node.how, side)
    other_unmatched = emits_unmatched(node.how, other_side)
    key_of = this_spec.key_serde.deserialize
    value_of = {side: this_spec.value_serde.deserialize, other_side: other_value_of}
    outer: KeyValueBytes | None = wiring.stores[node.outer_store] if node.outer_store is not None else None
    forward = wiring.forward
    dropped = null_key_counter(wiring)
    holding = frozenset(s for s in (JoinSide.LEFT, JoinSide.RIGHT) if emits_unmatched(node.how, s))
    # The shortest time a held record stays open after its own time.
    least_open_ms = min(window.after_ms if s is JoinSide.LEFT else window.before_ms for s in holding) + window.grace_ms if holding else 0
    held_since: HeldSince = wiring.shared.setdefault(f"{node.outer_store}:held-since", HeldSince())
    task = wiring.position
    node_name = node.name

    def stream_time() -> int:
        times = [t for t in (this_store.observed_stream_time, other_store.observed_stream_time) if t is not None]
        return max(times)

    def emit_closed(now: int) -> None:
        """The outer store's records whose window has closed, oldest first, each gone once sent
        (a joiner or child failing on one goes to the task's error policy; the others still
        go). Reads nothing while the earliest record held is still open."""
        assert outer is not None
        if held_since.time is not None and held_since.time + least_open_ms >= now:
            return
        open_sides: set[JoinSide] = set()
        earliest = EMPTY
        for stored, packed in outer.all():
            time, held_side, held_key = outer_join_entry(stored)
            if unmatched_window_open(window, held_side, time, now):
                earliest = min(earliest, time)
                open_sides.add(held_side)
                if open_sides == holding:
                    break  # every later record is open too
                continue
            key = key_of(held_key)
            for held_bytes in decode_join_values(packed):
                try:
                    forward(key, fn(key, *join_pair(held_side, value_of[held_side](held_bytes), None)), time)
                except NodeFailure as failure:
                    _report(task, failure)
                except Exception as error:
                    _report(task, NodeFailure(node_name, error))
            outer.put(stored, None)
        held_since.time = earliest

    def stream_stream_join(key: Any, value: Any, timestamp: int) -> None:
        if value is None:
            return
        if key is None:
            if unmatched:
                forward(None, fn(None, *join_pair(side, value, None)), timestamp)
            else:
                dropped()
            return
        stored_key = key_bytes(key)
        existing = this_store.get(stored_key, timestamp)
        values = decode_join_values(existing) if existing is not None else []
        values.append(this_value_bytes(value))
        this_store.put(stored_key, timestamp, encode_join_values(values))  # False: too old to keep
        now = stream_time()
        if outer is not None and timestamp == now:
            emit_closed(now)
        low, high = join_lookup_bounds(window, side, timestamp)
        matched = False
        for other_time, packed in other_store.fetch(stored_key, low, high):
            if outer is not None and other_unmatched:
                outer.put(outer_join_key(other_time, other_side, stored_key), None)  # met a partner
            for other_bytes in decode_join_values(packed):
                left, right = join_pair(side, value, other_value_of(other_bytes))
                forward(key, fn(key, left, right), joined_timestamp(timestamp, other_time))
                matched = True
        if matched or not unmatched:
            return
        if outer is None or high < now:
            forward(key, fn(key, *join_pair(side, value, None)), timestamp)  # its window has closed already
            return
        held_key = outer_join_key(timestamp, side, stored_key)
        held = outer.get(held_key)
        outer.put(held_key, encode_join_values([*(decode_join_values(held) if held is not None else []), this_value_bytes(value)]))
        if held_since.time is not None:
            held_since.time = min(held_since.time, timestamp)

    return stream_stream_join


# ============================================================================ processors


def _processor(node: ProcessorNode, wiring: NodeWiring) -> Emit:
    """One instance of the node's Processor class per task; ``process`` sees the record's
    timestamp in its context."""
    instance = node.fn()
    context = NodeProcessorContext(wiring.task(), wiring.typed_stores, node.stores)
    context.emit = wiring.forward
    context.routes = wiring.routes
    punctuations = [ScheduledPunctuation(punctuation, getattr(instance, punctuation.method), context, node.name) for punctuation in node.punctuations]
    wiring.processors.append(ProcessorInstance(node.name, instance, context, punctuations))
    process = instance.process

    def run_processor(key: Any, value: Any, timestamp: int) -> None:
        context.timestamp = timestamp
        process(key, value)

    return run_processor


# ============================================================================ partitioners


def partition_for_key(key: bytes, partitions: int) -> int:
    """The partition Kafka's default partitioner (Java's and kafka-python's) gives ``key``."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def windowed_partition_for_key(windowed_key: bytes, partitions: int) -> int:
    """Kafka Streams' ``WindowedStreamPartitioner``: a windowed key's partition is its *user*
    key's (the serialized key without the window bounds), so every window of one key lands in
    one partition and a consumer of one user's windows reads one partition."""
    return partition_for_key(serdes.WindowedKey.base_key_bytes(windowed_key), partitions)


def sink_partitioner(node: NodeBase) -> Callable[[bytes, int], int] | None:
    """How a sink picks the partition of a (non-null) key's record: None for the producer's
    default partitioner, else Kafka Streams' windowed partitioner for windowed keys."""
    return windowed_partition_for_key if isinstance(node.key_serde, serdes.WindowedKey) else None


# ============================================================================ bad records


class ErrorKind(enum.StrEnum):
    DESERIALIZATION = "deserialization"
    PROCESSING = "processing"


@dataclass(frozen=True, slots=True)
class RecordFailure:
    """One failed record: where it was read from and why it failed (``topic`` None: the record
    was forwarded by a store flush or a punctuation, not read)."""

    kind: ErrorKind
    task_id: str
    topic: str | None
    partition: int | None
    offset: int | None
    node: str | None
    reason: str

    def describe(self) -> str:
        where = f"{self.topic}-{self.partition}@{self.offset}" if self.topic is not None else "a record forwarded from a store flush"
        node = f" in node {self.node!r}" if self.node else ""
        return f"task {self.task_id}: {self.kind} error on {where}{node}: {self.reason}"


class RecordProcessingError(RuntimeError):
    """Raised under the ``fail`` policy; carries the failure (topic, partition, offset, node)."""

    def __init__(self, failure: RecordFailure) -> None:
        super().__init__(failure.describe())
        self.failure = failure


class SuppressionBufferFullError(RecordProcessingError):
    """A ``when_full="shut_down"`` suppression buffer went over its limit: the task stops,
    whatever the error policy (Kafka Streams' behaviour); nothing is dropped silently."""


class NodeFailure(Exception):
    """An exception raised inside a node, annotated with the node's name."""

    def __init__(self, node: str, error: BaseException) -> None:
        super().__init__(f"{type(error).__name__}: {error}")
        self.node = node
        self.error = error


def guard(name: str, emit: Emit) -> Emit:
    """``emit`` whose exceptions (the user's code failing) name node ``name``."""

    def guarded(key: Any, value: Any, timestamp: int) -> None:
        try:
            emit(key, value, timestamp)
        except (NodeFailure, RecordProcessingError):
            raise  # already named; or fatal whatever the error policy (a full suppression buffer)
        except Exception as error:
            raise NodeFailure(name, error) from error

    return guarded


#: Headers of a dead letter: ``pystreams.error.kind``, ``.topic``, ``.partition``, ``.offset``,
#: ``.task``, ``.node``, ``.reason``.
DEAD_LETTER_HEADER_PREFIX = "pystreams.error."


def dead_letter_headers(failure: RecordFailure) -> list[tuple[str, bytes]]:
    """Where a dead letter came from and why it failed; its key and value are the record's
    original bytes."""
    fields = (
        ("kind", str(failure.kind)),
        ("topic", failure.topic or ""),
        ("partition", str(failure.partition)),
        ("offset", str(failure.offset)),
        ("task", failure.task_id),
        ("node", failure.node or ""),
        ("reason", failure.reason),
    )
    return [(DEAD_LETTER_HEADER_PREFIX + name, text.encode()) for name, text in fields]


def failure_policy(errors: ErrorPolicies, failure: RecordFailure, error: BaseException | None = None) -> ErrorPolicy:
    """Apply the error policy to a failed record, as Kafka Streams' handlers do: ``fail``
    raises :class:`RecordProcessingError`; the others log the failure (a warning naming topic,
    partition, offset, node and reason) and return the policy, the runtime then skips the
    record — after writing it to ``errors.dead_letter_topic`` with
    :func:`dead_letter_headers` for ``dead-letter`` (when it was read, not forwarded)."""
    if failure.kind is ErrorKind.DESERIALIZATION:
        policy = errors.deserialization_policy(failure.node)
    else:
        policy = errors.processing
    if policy is ErrorPolicy.FAIL:
        raise RecordProcessingError(failure) from error
    log.warning("%s (skipped: %s)", failure.describe(), policy)
    return policy


def skip_hint(kind: ErrorKind) -> str:
    """How to have records that fail this way skipped rather than stop processing."""
    option = "deserialization" if kind is ErrorKind.DESERIALIZATION else "processing"
    return f"to skip such records: --{option}-errors log-and-continue, or dead-letter with --dead-letter-topic; App({option}_errors=...) in code"
