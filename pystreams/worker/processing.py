"""The node graph of one task, compiled into plain closures.

Each node becomes ``emit(key, value, timestamp)``, which does the node's work and calls its
children's ``emit`` depth-first, as Kafka Streams forwards records. What each kind does is
its kernel in ``pystreams.topology.kernels`` (the rules both runtimes share); this module
wires kernels to the task's RocksDB stores, sinks to the producer, and wraps every node so
that an exception escaping user code names the node it came from (``NodeFailure``). The
graph is built once per task, so the per-record path is a chain of closures with no dispatch
on node kinds. One record, from poll to sink (a map, then a count written to a topic)::

    TaskEngine.poll                       a consumer batch, in each task's order (engine.py)
      -> StreamTask.process(records)      sets ctx.topic, partition, offset (tasks.py)
        -> source step                    deserialize, timestamp, stream time
                                          (topology/source_step.py)
          -> guarded(map emit)            a raise in user code becomes NodeFailure(node)
            -> guarded(count emit)        updates the count in the store's cache
      ... at commit (or when the cache evicts):
      cache flush -> _Forwarder -> _table_forwarder
        -> sink                           serializes, RecordSender.send to the producer
    A NodeFailure unwinds to the source step: the error policy runs, then punctuations.

A stateless sink is called directly by its parent's emit; a repartition sink appends to the
task's repartition buffer (``packing``), sent packed by ``RecordSender.send_repartition_buffers``.

Tables (aggregations, table sources) write to their store's cache; the cache folds updates
per key and, when it flushes (commit, or eviction), the store hands the folded changes to a
*forwarder* that sends them downstream — straight to the sink's topic as raw bytes when every
child is a sink with the same serdes, which is the common ``table.to(topic)`` case. Each change
goes in the order it was last written, with the timestamp of the record that wrote it (the
store reads it from the task's context), as Kafka Streams' cache forwards.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pystreams.state import CacheLimits, KeyValueChange, SessionChange, TaskState, WindowChange
from pystreams.topology.ir import (
    BranchOutputNode,
    MergeNode,
    Node,
    SinkNode,
    SourceNode,
    StoreKind,
    TaskId,
    window_of,
)
from pystreams.topology.kernels import (
    Emit,
    NodeFailure,
    NodeWiring,
    ProcessorInstance,
    ScheduledPunctuation,
    TaskPosition,
    fan_out,
    fixed_window_key,
    guard,
    node_emit,
    node_routes,
    sink_partitioner,
    table_output_store,
    windowed_result,
)
from pystreams.topology.resolve import ResolvedTopology
from pystreams.topology.stores import TypedStore, typed
from pystreams.topology.windows import HoppingWindow, SessionWindow, SlidingWindow, TumblingWindow, Windowed

if TYPE_CHECKING:
    from .kafka_io import Sender

log = logging.getLogger(__name__)

_WINDOW_BOUNDS = struct.Struct(">qq").pack
#: Kinds whose emit only moves records on: no work to guard.
_PASS_THROUGH = (SourceNode, MergeNode, BranchOutputNode)


class TaskContext(TaskPosition):
    """Mutable per-task state the compiled nodes share: the record being processed (as
    ``TaskPosition``), the sender, and what to do with a failed forward of a flushed table."""

    def __init__(self, app_id: str, task_id: TaskId, sender: Sender) -> None:
        super().__init__(app_id, task_id)
        self.sender = sender
        #: Set by the task: called for an exception while forwarding a flushed store change.
        self.on_forward_error: Callable[[NodeFailure], None] = _reraise

    def forward_timestamp(self) -> int:
        return self.stream_time if self.stream_time is not None else 0


def _reraise(failure: NodeFailure) -> None:
    raise failure


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
class TaskGraph:
    sources: dict[str, SourceEntry]  # by topic
    processors: list[ProcessorInstance] = field(default_factory=list)
    punctuations: list[ScheduledPunctuation] = field(default_factory=list)
    typed_stores: dict[str, TypedStore] = field(default_factory=dict)


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
    record_clock: TaskContext | None = None,
) -> dict[str, Any]:
    """Open every store of the task's sub-topology in ``state``: for active tasks (with their
    forwarders, and the context whose record timestamp stamps each forwarded change) and for
    standby replicas (none: they only apply changelogs)."""
    topology = resolved.topology
    stores: dict[str, Any] = {}
    for store_name in topology.subtopologies[task_id.subtopology].stores:
        spec = topology.stores[store_name]
        forward = forwarder_for(store_name) if forwarder_for is not None else None
        if spec.kind is StoreKind.KEY_VALUE and spec.history_ms is not None:
            stores[store_name] = state.versioned_store(store_name, history_ms=spec.history_ms, cache_limits=cache_limits, record_clock=record_clock)
            continue
        timestamped = spec.timestamped
        if spec.kind is StoreKind.KEY_VALUE:
            stores[store_name] = state.key_value_store(
                store_name, cache_limits=cache_limits, forward=forward, record_clock=record_clock, timestamped=timestamped
            )
            continue
        retention = spec.retention_ms or (spec.window.retention_ms if spec.window is not None else None)
        if retention is None:
            raise ValueError(f"store {store_name!r} has no retention")
        if spec.kind is StoreKind.WINDOW:
            stores[store_name] = state.window_store(
                store_name, retention_ms=retention, cache_limits=cache_limits, forward=forward, record_clock=record_clock, timestamped=timestamped
            )
        else:
            stores[store_name] = state.session_store(store_name, retention_ms=retention, cache_limits=cache_limits, forward=forward, record_clock=record_clock)
    return stores


def build_task_graph(
    resolved: ResolvedTopology,
    task_id: TaskId,
    state: TaskState,
    ctx: TaskContext,
    *,
    cache_limits: CacheLimits,
    global_stores: Mapping[str, Any] | None = None,
) -> TaskGraph:
    """Open the task's stores in ``state`` and compile its sub-topology into closures; the
    global tables' stores (``global_stores``, the process's) are read beside them."""
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
        if table_output_store(owner, topology.stores) == store_name and children_of(owner):
            forwarders[store_name] = _Forwarder()
            return forwarders[store_name]
        return None

    raw_stores = open_task_stores(resolved, task_id, state, cache_limits=cache_limits, forwarder_for=forwarder_for, record_clock=ctx)
    typed_stores = {name: typed(raw_stores[name], topology.stores[name]) for name in raw_stores}
    graph = TaskGraph(sources={}, typed_stores=typed_stores)
    sender = ctx.sender
    repartition_topics = frozenset(topology.repartition_topics)
    send = sender.send
    forward_send: Callable[[str, bytes | None, bytes | None, int | None, Any], None]
    if repartition_topics:
        # Table forwarders may write several topics through one send; route per topic.
        repartition_sinks = {topic: sender.repartition_sink(topic) for topic in repartition_topics}

        def send_any(topic: str, key: bytes | None, value: bytes | None, timestamp: int | None, headers: Any = ()) -> None:
            sink = repartition_sinks.get(topic)
            if sink is None:
                send(topic, key, value, timestamp, headers)
            else:
                sink(key, value, timestamp if timestamp is not None else ctx.forward_timestamp(), headers)

        forward_send = send_any
    else:
        forward_send = send

    def build_sink(node: SinkNode) -> Emit:
        if node.topic in repartition_topics:
            return _repartition_sink(node, sender.repartition_sink(node.topic), ctx)
        partitioner = sink_partitioner(node)
        if partitioner is not None:
            return _partitioned_sink(node, sender.send_partitioned, partitioner, ctx)
        return _sink(node, send, ctx)

    emits: dict[str, Emit] = {}
    processors: list[ProcessorInstance] = []
    shared: dict[str, Any] = {}  # what the task's nodes share (NodeWiring.shared)
    readable_stores: Mapping[str, Any] = raw_stores
    store_specs: Mapping[str, Any] = topology.stores
    if topology.global_tables:
        held = global_stores or {}
        readable_stores = {**raw_stores, **{name: held[name] for name in topology.global_tables if name in held}}
        store_specs = {**topology.stores, **{name: table.store for name, table in topology.global_tables.items()}}
    for name in reversed(sub.nodes):
        node = nodes[name]
        child_names = children_of(node)
        children = fan_out([emits[c] for c in child_names])
        if isinstance(node, SinkNode):
            emit = build_sink(node)
        else:
            wiring = NodeWiring(
                node=node,
                forward=children,
                routes=node_routes(node, [nodes[c] for c in child_names], emits),
                stores=readable_stores,
                specs=store_specs,
                typed_stores=typed_stores,
                position=ctx,
                processors=processors,
                shared=shared,
            )
            emit = node_emit(node, wiring)
        output_store = table_output_store(node, topology.stores)
        if output_store in forwarders:
            # The store's owner forwards its flushed changes (a cogroup's inputs write the
            # store its table node owns).
            spec = topology.stores[output_store]
            forwarders[output_store].target = _table_forwarder(
                node,
                spec.key_serde,
                [nodes[c] for c in child_names],
                children,
                forward_send,
                ctx,
                sender.send_partitioned,
            )
        emits[name] = emit if isinstance(node, _PASS_THROUGH) else guard(name, emit)
    # Built children first; init and punctuate in processing order, as Kafka Streams does.
    graph.processors = processors[::-1]
    graph.punctuations = [scheduled for processor in graph.processors for scheduled in processor.punctuations]

    for name in sub.source_nodes:
        source = topology.source(name)
        for topic in resolved.source_topics[name]:
            graph.sources[topic] = SourceEntry(
                node=name,
                deserialize_key=source.key_serde.deserialize,
                deserialize_value=source.value_serde.deserialize,
                timestamp_extractor=source.timestamp_extractor,
                emit=emits[name],
                packed=topic in repartition_topics,
            )
    return graph


# --------------------------------------------------------------------------- sinks


# Sinks write the headers of the record being processed (``TaskPosition.headers``), as Kafka
# Streams' sinks write the record context's.


def _sink(node: SinkNode, send: Callable[..., None], ctx: TaskContext) -> Emit:
    topic = node.topic
    key_bytes = node.key_serde.serialize
    value_bytes = node.value_serde.serialize

    def sink(key: Any, value: Any, timestamp: int) -> None:
        send(topic, key_bytes(key), value_bytes(value), timestamp, ctx.headers)

    return sink


def _partitioned_sink(node: SinkNode, send: Callable[..., None], partitioner: Callable[[bytes, int], int], ctx: TaskContext) -> Emit:
    topic = node.topic
    key_bytes = node.key_serde.serialize
    value_bytes = node.value_serde.serialize

    def sink(key: Any, value: Any, timestamp: int) -> None:
        send(topic, key_bytes(key), value_bytes(value), timestamp, partitioner, ctx.headers)

    return sink


def _repartition_sink(node: SinkNode, append: Callable[..., None], ctx: TaskContext) -> Emit:
    key_bytes = node.key_serde.serialize
    value_bytes = node.value_serde.serialize

    def repartition_sink(key: Any, value: Any, timestamp: int) -> None:
        append(key_bytes(key), value_bytes(value), timestamp, ctx.headers)

    return repartition_sink


# --------------------------------------------------------------------------- tables


def _table_forwarder(
    node: Node,
    store_key_serde: Any,
    child_nodes: list[Node],
    children: Emit,
    send: Callable[[str, bytes | None, bytes | None, int | None, Any], None],
    ctx: TaskContext,
    send_partitioned: Callable[..., None],
) -> Callable[[list[Any]], None]:
    """Turns a store's flushed changes into records for the table node's children."""
    window = window_of(node)
    raw_sinks = [
        (child.topic, sink_partitioner(child))
        for child in child_nodes
        if isinstance(child, SinkNode) and child.key_serde == node.key_serde and child.value_serde == node.value_serde
    ]
    all_raw = len(raw_sinks) == len(child_nodes)
    key_of = store_key_serde.deserialize
    value_of = node.value_serde.deserialize
    guarded_children = guard(node.name, children)

    # Each store kind's changes: the bytes a sink writes as the key, and the key object.
    raw_key: Callable[[Any], bytes]
    key_object: Callable[[Any], Any]
    if window is None:

        def kv_raw_key(change: KeyValueChange) -> bytes:
            return change.key

        def kv_key_object(change: KeyValueChange) -> Any:
            return key_of(change.key)

        raw_key, key_object = kv_raw_key, kv_key_object

    elif isinstance(window, SessionWindow):

        def session_raw_key(change: SessionChange) -> bytes:
            return change.key + _WINDOW_BOUNDS(change.start, change.end)

        def session_key_object(change: SessionChange) -> Any:
            return Windowed(key_of(change.key), change.start, change.end)

        raw_key, key_object = session_raw_key, session_key_object

    else:
        assert isinstance(window, TumblingWindow | HoppingWindow | SlidingWindow)
        fixed_window = window
        size = fixed_window.size_ms

        def window_raw_key(change: WindowChange) -> bytes:
            return change.key + _WINDOW_BOUNDS(change.window_start, change.window_start + size)

        def window_key_object(change: WindowChange) -> Any:
            return fixed_window_key(fixed_window, key_of(change.key), change.window_start)

        raw_key, key_object = window_raw_key, window_key_object

    forward_changes = _table_forward(raw_key, key_object, raw_sinks, all_raw, guarded_children, send, send_partitioned, ctx, value_of)
    if window is None:
        return forward_changes
    windowed = window
    end_of = _change_end(windowed)

    def forward_windowed(changes: list[Any]) -> None:
        results = []
        for change in changes:
            value, timestamp = windowed_result(windowed, change.value, end_of(change), change.timestamp)
            results.append(change._replace(value=value, timestamp=timestamp))
        forward_changes(results)

    return forward_windowed


def _change_end(window: Any) -> Callable[[Any], int]:
    """Where a windowed store's change says its window ends."""
    if isinstance(window, SessionWindow):
        return lambda change: change.end
    size = window.size_ms
    return lambda change: change.window_start + size


def _table_forward(
    raw_key: Callable[[Any], bytes],
    key_object: Callable[[Any], Any],
    raw_sinks: list[tuple[str, Callable[[bytes, int], int] | None]],
    all_raw: bool,
    guarded_children: Emit,
    send: Callable[[str, bytes | None, bytes | None, int | None, Any], None],
    send_partitioned: Callable[..., None],
    ctx: TaskContext,
    value_of: Callable[[Any], Any],
) -> Callable[[list[Any]], None]:
    """The forward of a table's flushed changes: raw bytes straight to the sinks when every
    child is a sink with the table's serdes, else deserialized to the children. Each change
    goes with the headers of the record that last wrote its row (Kafka Streams' cache keeps
    them with the row's record context)."""
    if all_raw:
        # table.to(topic): the store already holds the sink's bytes; skip deserialize/serialize.
        def forward_raw(changes: list[Any]) -> None:
            fallback = ctx.forward_timestamp()
            for change in changes:
                key = raw_key(change)
                timestamp = change.timestamp
                if timestamp is None:
                    timestamp = fallback
                for topic, partitioner in raw_sinks:
                    if partitioner is None:
                        send(topic, key, change.value, timestamp, change.headers)
                    else:  # a windowed key: placed by its user key, as the sink node would
                        send_partitioned(topic, key, change.value, timestamp, partitioner, change.headers)

        return forward_raw

    def forward(changes: list[Any]) -> None:
        fallback = ctx.forward_timestamp()
        headers = ctx.headers
        try:
            for change in changes:
                timestamp = change.timestamp
                ctx.headers = change.headers
                try:
                    guarded_children(key_object(change), value_of(change.value), fallback if timestamp is None else timestamp)
                except NodeFailure as failure:
                    ctx.on_forward_error(failure)
        finally:
            ctx.headers = headers

    return forward
