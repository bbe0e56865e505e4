"""The node graph of one task, compiled into plain closures.

Each node becomes ``emit(key, value, timestamp)``, which does the node's work and calls its
children's ``emit`` depth-first, as Kafka Streams forwards records. The compiled graph is
built once per task, so the per-record path is a chain of local-variable closures with no
dispatch on node kinds. Every node is wrapped so that an exception escaping user code names
the node it came from (``NodeFailure``).

Tables (aggregations, table sources) write to their store's cache; the cache folds updates
per key and, when it flushes (commit, or eviction), the store hands the folded changes to a
*forwarder* that sends them downstream — straight to the sink's topic as raw bytes when every
child is a sink with the same serdes, which is the common ``table.to(topic)`` case.
"""
from __future__ import annotations

import logging
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec

from pystreams.state import CacheLimits, KeyValueChange, SessionChange, TaskState, WindowChange
from pystreams.topology.ir import (
    JoinHow,
    JoinSide,
    Node,
    NodeKind,
    Punctuation,
    StoreKind,
    TaskId,
)
from pystreams.topology.resolve import ResolvedTopology
from pystreams.topology.windows import HoppingWindow, SessionWindow, TumblingWindow, Windowed, merge_into_session

from .stores import TypedStore, typed

if TYPE_CHECKING:
    from .kafka_io import RecordSender

log = logging.getLogger(__name__)

Emit = Callable[[Any, Any, int], None]
_WINDOW_BOUNDS = struct.Struct(">qq").pack
# Stream–stream join stores keep every record of a (key, timestamp): the stored value is a
# MessagePack list of the records' value bytes.
_encode_values = msgspec.msgpack.Encoder().encode
_decode_values = msgspec.msgpack.Decoder(list[bytes]).decode


_TABLE_OWNER_KINDS = frozenset({NodeKind.TABLE_SOURCE, NodeKind.COUNT, NodeKind.AGGREGATE, NodeKind.REDUCE})


class NodeFailure(Exception):
    """An exception raised inside a node, annotated with the node's name."""

    def __init__(self, node: str, error: BaseException) -> None:
        super().__init__(f"{type(error).__name__}: {error}")
        self.node = node
        self.error = error


class TaskContext:
    """Mutable per-task state the compiled nodes share: the record being processed, stream
    time, the sender, and counters."""

    def __init__(self, app_id: str, task_id: TaskId, sender: RecordSender) -> None:
        self.app_id = app_id
        self.task_id = task_id
        self.sender = sender
        self.topic: str | None = None
        self.partition: int | None = None
        self.offset: int | None = None
        self.timestamp: int = 0
        #: Highest record timestamp this task has processed (Kafka Streams' stream time).
        self.stream_time: int | None = None
        self.late_records_dropped = 0
        #: Set by the task: called for an exception while forwarding a flushed store change.
        self.on_forward_error: Callable[[NodeFailure], None] = _reraise

    def forward_timestamp(self) -> int:
        return self.stream_time if self.stream_time is not None else 0


def _reraise(failure: NodeFailure) -> None:
    raise failure


class TaskProcessorContext:
    """What a PROCESSOR node's instance sees (``pystreams.topology.processor.ProcessorContext``)."""

    def __init__(self, ctx: TaskContext, stores: Mapping[str, TypedStore], allowed: tuple[str, ...]) -> None:
        self._ctx = ctx
        self._stores = stores
        self._allowed = allowed
        self._emit: Emit = _drop
        self.timestamp: int = 0

    @property
    def app_id(self) -> str:
        return self._ctx.app_id

    @property
    def task_id(self) -> TaskId:
        return self._ctx.task_id

    @property
    def topic(self) -> str | None:
        return self._ctx.topic

    @property
    def partition(self) -> int | None:
        return self._ctx.partition

    @property
    def offset(self) -> int | None:
        return self._ctx.offset

    def store(self, name: str) -> TypedStore:
        if name not in self._allowed:
            raise KeyError(f"store {name!r} is not declared by this processor (it may use {list(self._allowed)})")
        return self._stores[name]

    def forward(self, key: Any, value: Any, *, timestamp: int | None = None) -> None:
        self._emit(key, value, self.timestamp if timestamp is None else timestamp)


def _drop(key: Any, value: Any, timestamp: int) -> None:
    pass


@dataclass(slots=True)
class SourceEntry:
    """How records of one input topic enter the graph."""

    node: str
    deserialize_key: Callable[[Any], Any]
    deserialize_value: Callable[[Any], Any]
    timestamp_extractor: Callable[[Any, Any, int], int] | None
    emit: Emit
    #: A repartition topic: its records may be packed (``packing``).
    packed: bool = False


@dataclass(slots=True)
class ScheduledPunctuation:
    punctuation: Punctuation
    method: Callable[[int], None]
    context: TaskProcessorContext
    node: str
    next_due: int | None = None


@dataclass(slots=True)
class TaskGraph:
    sources: dict[str, SourceEntry]  # by topic
    processors: list[tuple[str, Any, TaskProcessorContext]] = field(default_factory=list)
    punctuations: list[ScheduledPunctuation] = field(default_factory=list)
    typed_stores: dict[str, TypedStore] = field(default_factory=dict)


def _guard(name: str, emit: Emit) -> Emit:
    def guarded(key: Any, value: Any, timestamp: int) -> None:
        try:
            emit(key, value, timestamp)
        except NodeFailure:
            raise
        except Exception as error:
            raise NodeFailure(name, error) from error

    return guarded


def _fan_out(emits: list[Emit]) -> Emit:
    if not emits:
        return _drop
    if len(emits) == 1:
        return emits[0]

    def fan_out(key: Any, value: Any, timestamp: int) -> None:
        for emit in emits:
            emit(key, value, timestamp)

    return fan_out


class _Forwarder:
    """A store's forward callback; its target is bound once the owner's children are built."""

    def __init__(self) -> None:
        self.target: Callable[[list[Any]], None] = lambda changes: None

    def __call__(self, changes: list[Any]) -> None:
        self.target(changes)


def open_task_stores(
    resolved: ResolvedTopology,
    task_id: TaskId,
    state: TaskState,
    *,
    cache_limits: CacheLimits,
    forwarder_for: Callable[[str], Any] | None = None,
) -> dict[str, Any]:
    """Open every store of the task's sub-topology in ``state``: for active tasks (with their
    forwarders) and for standby replicas (none: they only apply changelogs)."""
    topology = resolved.topology
    stores: dict[str, Any] = {}
    for store_name in topology.subtopologies[task_id.subtopology].stores:
        spec = topology.stores[store_name]
        forward = forwarder_for(store_name) if forwarder_for is not None else None
        if spec.kind is StoreKind.KEY_VALUE:
            stores[store_name] = state.key_value_store(store_name, cache_limits=cache_limits, forward=forward)
            continue
        retention = spec.retention_ms or (spec.window.retention_ms if spec.window is not None else None)
        if retention is None:
            raise ValueError(f"store {store_name!r} has no retention")
        open_store = state.window_store if spec.kind is StoreKind.WINDOW else state.session_store
        stores[store_name] = open_store(store_name, retention_ms=retention, cache_limits=cache_limits, forward=forward)
    return stores


def build_task_graph(
    resolved: ResolvedTopology,
    task_id: TaskId,
    state: TaskState,
    ctx: TaskContext,
    *,
    cache_limits: CacheLimits,
) -> TaskGraph:
    """Open the task's stores in ``state`` and compile its sub-topology into closures."""
    topology = resolved.topology
    sub = topology.subtopologies[task_id.subtopology]
    members = set(sub.nodes)
    nodes = topology.nodes

    def children_of(node: Node) -> list[str]:
        return [child for child in node.children if child in members]

    # -- stores: opened first, since nodes may use stores owned by nodes built later ----------
    forwarders: dict[str, _Forwarder] = {}

    def forwarder_for(store_name: str) -> _Forwarder | None:
        owner = nodes[topology.stores[store_name].owner]
        if owner.kind in _TABLE_OWNER_KINDS and children_of(owner):
            forwarders[store_name] = _Forwarder()
            return forwarders[store_name]
        return None

    raw_stores = open_task_stores(resolved, task_id, state, cache_limits=cache_limits, forwarder_for=forwarder_for)
    typed_stores = {
        name: typed(raw_stores[name], topology.stores[name].key_serde, topology.stores[name].value_serde)
        for name in raw_stores
    }
    graph = TaskGraph(sources={}, typed_stores=typed_stores)
    sender = ctx.sender
    repartition_topics = frozenset(topology.repartition_topics)
    send = sender.send
    if repartition_topics:
        # Table forwarders may write several topics through one send; route per topic.
        repartition_sinks = {topic: sender.repartition_sink(topic) for topic in repartition_topics}

        def send_any(topic: str, key: bytes | None, value: bytes | None, timestamp: int | None) -> None:
            sink = repartition_sinks.get(topic)
            if sink is None:
                send(topic, key, value, timestamp)
            else:
                sink(key, value, timestamp if timestamp is not None else ctx.forward_timestamp())

        forward_send = send_any
    else:
        forward_send = send

    emits: dict[str, Emit] = {}
    branch_children: dict[str, dict[str, Emit]] = {}
    for name in reversed(sub.nodes):
        node = nodes[name]
        child_names = children_of(node)
        children = _fan_out([emits[c] for c in child_names])
        kind = node.kind
        fn = node.fn

        if kind is NodeKind.SINK:
            if node.topics[0] in repartition_topics:
                emit = _repartition_sink(node, sender.repartition_sink(node.topics[0]))
            else:
                emit = _sink(node, send)
        elif kind in (NodeKind.SOURCE, NodeKind.MERGE, NodeKind.TO_STREAM, NodeKind.BRANCH_OUTPUT):
            emit = children
        elif kind is NodeKind.TABLE_SOURCE:
            emit = _table_source(node, raw_stores[node.stores[0]], topology.stores[node.stores[0]])
        elif kind is NodeKind.MAP:
            emit = _map(fn, children)
        elif kind is NodeKind.MAP_VALUES:
            emit = _map_values(fn, children)
        elif kind is NodeKind.FLAT_MAP:
            emit = _flat_map(fn, children)
        elif kind is NodeKind.FLAT_MAP_VALUES:
            emit = _flat_map_values(fn, children)
        elif kind is NodeKind.FILTER:
            emit = _filter(fn, children)
        elif kind is NodeKind.PEEK:
            emit = _peek(fn, children)
        elif kind is NodeKind.SELECT_KEY:
            emit = _select_key(fn, children)
        elif kind is NodeKind.BRANCH:
            routes = {nodes[c].branches[0]: emits[c] for c in child_names}
            emit = _branch(fn, routes)
        elif kind in (NodeKind.COUNT, NodeKind.AGGREGATE, NodeKind.REDUCE):
            store_name = node.stores[0]
            spec = topology.stores[store_name]
            store = raw_stores[store_name]
            emit = _aggregation(node, store, spec.key_serde, ctx)
            if store_name in forwarders:
                forwarders[store_name].target = _table_forwarder(
                    node, spec.key_serde, [nodes[c] for c in child_names], children, forward_send, ctx
                )
        elif kind is NodeKind.STREAM_TABLE_JOIN:
            assert node.join is not None and node.join.table_store is not None
            spec = topology.stores[node.join.table_store]
            emit = _stream_table_join(node, raw_stores[spec.name], spec, children)
        elif kind is NodeKind.STREAM_STREAM_JOIN:
            emit = _stream_stream_join(node, raw_stores, topology.stores, children)
        elif kind is NodeKind.PROCESSOR:
            emit = _processor(node, ctx, typed_stores, children, graph)
        else:
            raise NotImplementedError(f"node kind {kind} ({name!r}) is not supported by the worker")
        if kind is NodeKind.TABLE_SOURCE and node.stores[0] in forwarders:
            spec = topology.stores[node.stores[0]]
            forwarders[node.stores[0]].target = _table_forwarder(
                node, spec.key_serde, [nodes[c] for c in child_names], children, forward_send, ctx
            )
        emits[name] = emit if kind in (NodeKind.SOURCE, NodeKind.MERGE, NodeKind.BRANCH_OUTPUT) else _guard(name, emit)

    for name in sub.source_nodes:
        node = nodes[name]
        for topic in resolved.source_topics[name]:
            graph.sources[topic] = SourceEntry(
                node=name,
                deserialize_key=node.key_serde.deserialize,
                deserialize_value=node.value_serde.deserialize,
                timestamp_extractor=node.timestamp_extractor,
                emit=emits[name],
                packed=topic in repartition_topics,
            )
    return graph


# --------------------------------------------------------------------------- stateless


def _sink(node: Node, send: Callable[[str, bytes | None, bytes | None, int | None], None]) -> Emit:
    topic = node.topics[0]
    key_bytes = node.key_serde.serialize
    value_bytes = node.value_serde.serialize

    def sink(key: Any, value: Any, timestamp: int) -> None:
        send(topic, key_bytes(key), value_bytes(value), timestamp)

    return sink


def _repartition_sink(node: Node, append: Callable[[bytes | None, bytes | None, int], None]) -> Emit:
    key_bytes = node.key_serde.serialize
    value_bytes = node.value_serde.serialize

    def repartition_sink(key: Any, value: Any, timestamp: int) -> None:
        append(key_bytes(key), value_bytes(value), timestamp)

    return repartition_sink


def _map(fn: Any, children: Emit) -> Emit:
    def map_(key: Any, value: Any, timestamp: int) -> None:
        new_key, new_value = fn(key, value)
        children(new_key, new_value, timestamp)

    return map_


def _map_values(fn: Any, children: Emit) -> Emit:
    def map_values(key: Any, value: Any, timestamp: int) -> None:
        children(key, fn(key, value), timestamp)

    return map_values


def _flat_map(fn: Any, children: Emit) -> Emit:
    def flat_map(key: Any, value: Any, timestamp: int) -> None:
        for new_key, new_value in fn(key, value):
            children(new_key, new_value, timestamp)

    return flat_map


def _flat_map_values(fn: Any, children: Emit) -> Emit:
    def flat_map_values(key: Any, value: Any, timestamp: int) -> None:
        for new_value in fn(key, value):
            children(key, new_value, timestamp)

    return flat_map_values


def _filter(fn: Any, children: Emit) -> Emit:
    def filter_(key: Any, value: Any, timestamp: int) -> None:
        if fn(key, value):
            children(key, value, timestamp)

    return filter_


def _peek(fn: Any, children: Emit) -> Emit:
    def peek(key: Any, value: Any, timestamp: int) -> None:
        fn(key, value)
        children(key, value, timestamp)

    return peek


def _select_key(fn: Any, children: Emit) -> Emit:
    def select_key(key: Any, value: Any, timestamp: int) -> None:
        children(fn(key, value), value, timestamp)

    return select_key


def _branch(fn: Any, routes: dict[str, Emit]) -> Emit:
    def branch(key: Any, value: Any, timestamp: int) -> None:
        label = fn(key, value)
        if label is None:
            return
        route = routes.get(label)
        if route is None:
            raise ValueError(f"branch function returned {label!r}, not one of {sorted(routes)}")
        route(key, value, timestamp)

    return branch


# --------------------------------------------------------------------------- tables


def _table_source(node: Node, store: Any, spec: Any) -> Emit:
    key_bytes = spec.key_serde.serialize
    value_bytes = spec.value_serde.serialize
    put = store.put

    def table_source(key: Any, value: Any, timestamp: int) -> None:
        if key is None:
            return  # a table has no row for a null key
        put(key_bytes(key), value_bytes(value))  # None deletes

    return table_source


def _initial_factory(node: Node) -> Callable[[], Any]:
    initial = node.initial
    if callable(initial):
        return initial
    return lambda: initial


def _aggregation(node: Node, store: Any, key_serde: Any, ctx: TaskContext) -> Emit:
    fn = node.fn
    assert fn is not None
    key_bytes = key_serde.serialize
    value_bytes = node.value_serde.serialize
    value_of = node.value_serde.deserialize
    is_reduce = node.kind is NodeKind.REDUCE
    new_initial = _initial_factory(node)
    window = node.window

    if window is None:
        get = store.get
        put = store.put

        def aggregate(key: Any, value: Any, timestamp: int) -> None:
            if key is None or value is None:
                return  # Kafka Streams skips records with a null key or value here
            stored_key = key_bytes(key)
            previous = get(stored_key)
            if previous is None:
                total = value if is_reduce else fn(new_initial(), key, value)
            else:
                total = fn(value_of(previous), key, value)
            put(stored_key, value_bytes(total))

        return aggregate

    if isinstance(window, TumblingWindow | HoppingWindow):
        windows_for = window.windows_for
        grace = window.grace_ms
        # Stream time as this node saw it; after a restart the newest stored window start is a
        # safe lower bound (it never makes an on-time record look late).
        observed = store.observed_stream_time if store.observed_stream_time is not None else -(2**63)

        def aggregate_windowed(key: Any, value: Any, timestamp: int) -> None:
            nonlocal observed
            if key is None or value is None:
                return
            if timestamp > observed:
                observed = timestamp
            close_time = observed - grace
            stored_key = key_bytes(key)
            for window_bounds in windows_for(timestamp):
                if window_bounds.end_ms <= close_time:
                    ctx.late_records_dropped += 1
                    log.debug(
                        "task %s node %s: record at %d is late for window [%d, %d) (stream time %d, grace %d)",
                        ctx.task_id, node.name, timestamp, window_bounds.start_ms, window_bounds.end_ms,
                        observed, grace,
                    )
                    continue
                start = window_bounds.start_ms
                previous = store.get(stored_key, start)
                if previous is None:
                    total = value if is_reduce else fn(new_initial(), key, value)
                else:
                    total = fn(value_of(previous), key, value)
                store.put(stored_key, start, value_bytes(total))

        return aggregate_windowed

    assert isinstance(window, SessionWindow)
    merger = node.merger
    gap = window.gap_ms
    grace = window.grace_ms
    observed = store.observed_stream_time if store.observed_stream_time is not None else -(2**63)

    def aggregate_sessions(key: Any, value: Any, timestamp: int) -> None:
        nonlocal observed
        if key is None or value is None:
            return
        if timestamp > observed:
            observed = timestamp
        stored_key = key_bytes(key)
        overlapping = list(store.find_sessions(stored_key, timestamp - gap, timestamp + gap))  # by end, start
        merged = merge_into_session(
            [(session.start, session.end, value_of(session.value)) for session in overlapping],
            key, value, timestamp,
            close_time=observed - grace, aggregate=fn, merge=merger, new_initial=None if is_reduce else new_initial,
        )
        if merged is None:
            ctx.late_records_dropped += 1
            return
        start, end, total = merged
        for session in overlapping:
            if (session.start, session.end) != (start, end):
                store.remove(stored_key, session.start, session.end)
        store.put(stored_key, start, end, value_bytes(total))

    return aggregate_sessions


def _table_forwarder(
    node: Node,
    store_key_serde: Any,
    child_nodes: list[Node],
    children: Emit,
    send: Callable[[str, bytes | None, bytes | None, int | None], None],
    ctx: TaskContext,
) -> Callable[[list[Any]], None]:
    """Turns a store's flushed changes into records for the table node's children."""
    window = node.window
    raw_sink_topics = [
        child.topics[0]
        for child in child_nodes
        if child.kind is NodeKind.SINK
        and child.key_serde == node.key_serde
        and child.value_serde == node.value_serde
    ]
    all_raw = len(raw_sink_topics) == len(child_nodes)
    key_of = store_key_serde.deserialize
    value_of = node.value_serde.deserialize
    guarded_children = _guard(node.name, children)

    if window is None:

        def raw_key(change: KeyValueChange) -> bytes:
            return change.key

        def key_object(change: KeyValueChange) -> Any:
            return key_of(change.key)

    elif isinstance(window, SessionWindow):

        def raw_key(change: SessionChange) -> bytes:  # type: ignore[misc]
            return change.key + _WINDOW_BOUNDS(change.start, change.end)

        def key_object(change: SessionChange) -> Any:  # type: ignore[misc]
            return Windowed(key_of(change.key), change.start, change.end)

    else:
        size = window.size_ms  # type: ignore[union-attr]

        def raw_key(change: WindowChange) -> bytes:  # type: ignore[misc]
            return change.key + _WINDOW_BOUNDS(change.window_start, change.window_start + size)

        def key_object(change: WindowChange) -> Any:  # type: ignore[misc]
            return Windowed(key_of(change.key), change.window_start, change.window_start + size)

    if all_raw:
        # table.to(topic): the store already holds the sink's bytes; skip deserialize/serialize.
        def forward_raw(changes: list[Any]) -> None:
            timestamp = ctx.forward_timestamp()
            for change in changes:
                key = raw_key(change)
                for topic in raw_sink_topics:
                    send(topic, key, change.value, timestamp)

        return forward_raw

    def forward(changes: list[Any]) -> None:
        timestamp = ctx.forward_timestamp()
        for change in changes:
            try:
                guarded_children(key_object(change), value_of(change.value), timestamp)
            except NodeFailure as failure:
                ctx.on_forward_error(failure)

    return forward


# --------------------------------------------------------------------------- joins


def _stream_table_join(node: Node, store: Any, spec: Any, children: Emit) -> Emit:
    assert node.join is not None and node.fn is not None
    fn = node.fn
    key_bytes = spec.key_serde.serialize
    table_value_of = spec.value_serde.deserialize
    get = store.get
    left_join = node.join.how is JoinHow.LEFT

    def stream_table_join(key: Any, value: Any, timestamp: int) -> None:
        if key is None or value is None:
            return
        stored = get(key_bytes(key))
        if stored is None:
            if left_join:
                children(key, fn(key, value, None), timestamp)
            return
        children(key, fn(key, value, table_value_of(stored)), timestamp)

    return stream_table_join


def _stream_stream_join(node: Node, raw_stores: Mapping[str, Any], specs: Mapping[str, Any], children: Emit) -> Emit:
    join = node.join
    assert join is not None and join.window is not None and node.fn is not None
    assert join.this_store is not None and join.other_store is not None
    fn = node.fn
    this_store = raw_stores[join.this_store]
    other_store = raw_stores[join.other_store]
    this_spec = specs[join.this_store]
    key_bytes = this_spec.key_serde.serialize
    this_value_bytes = this_spec.value_serde.serialize
    other_value_of = specs[join.other_store].value_serde.deserialize
    is_left_side = join.side is JoinSide.LEFT
    # A left record at t meets right records in [t - before, t + after]; mirrored for the right.
    before, after = join.window.before_ms, join.window.after_ms
    look_back, look_ahead = (before, after) if is_left_side else (after, before)
    # Left/outer joins emit an unmatched record at once (Kafka Streams before 3.1 did too);
    # the later result with its partner follows when the partner arrives.
    emit_unmatched = join.how is JoinHow.OUTER or (join.how is JoinHow.LEFT and is_left_side)

    def stream_stream_join(key: Any, value: Any, timestamp: int) -> None:
        if key is None or value is None:
            return
        stored_key = key_bytes(key)
        existing = this_store.get(stored_key, timestamp)
        values = _decode_values(existing) if existing is not None else []
        values.append(this_value_bytes(value))
        if not this_store.put(stored_key, timestamp, _encode_values(values)):
            return  # older than the join window's retention: too late to join
        matched = False
        for other_time, packed in other_store.fetch(stored_key, timestamp - look_back, timestamp + look_ahead):
            for other_bytes in _decode_values(packed):
                other = other_value_of(other_bytes)
                result = fn(key, value, other) if is_left_side else fn(key, other, value)
                children(key, result, max(timestamp, other_time))
                matched = True
        if not matched and emit_unmatched:
            children(key, fn(key, value, None) if is_left_side else fn(key, None, value), timestamp)

    return stream_stream_join


# --------------------------------------------------------------------------- processors


def _processor(
    node: Node, ctx: TaskContext, typed_stores: Mapping[str, TypedStore], children: Emit, graph: TaskGraph
) -> Emit:
    processor_class = node.fn
    assert processor_class is not None
    instance = processor_class()
    context = TaskProcessorContext(ctx, typed_stores, node.stores)
    context._emit = children
    graph.processors.append((node.name, instance, context))
    for punctuation in node.punctuations:
        graph.punctuations.append(
            ScheduledPunctuation(punctuation, getattr(instance, punctuation.method), context, node.name)
        )
    process = instance.process

    def run_processor(key: Any, value: Any, timestamp: int) -> None:
        context.timestamp = timestamp
        process(key, value)

    return run_processor
