"""Compile a pystreams topology into Spark Structured Streaming queries (one per sink).

The compiled plan, per node kind:

* sources read Kafka (Spark's connector when present, else our Python data source);
* stateless steps (map, filter, flat-map, select-key, branch, peek, ...) are fused into one
  vectorized ``mapInArrow`` per chain: Arrow batches in, user functions over deserialized
  records, Arrow batches out — never one Py4J call per row;
* repartition topics disappear: Spark shuffles for the aggregation itself;
* count/reduce/aggregate run the user's function per key with ``applyInPandasWithState``
  (state = the accumulator in the store's serde) and emit the latest value of each key
  updated in a micro-batch, like the worker runtime's cached table; tumbling and hopping
  windows group by ``window()`` start with a watermark of ``grace`` and an event-time timeout
  that forgets a window once the watermark passes its end plus grace;
* session windows run the worker's own merge rule (``worker_semantics.add_to_sessions``) in
  ``applyInPandasWithState`` keyed by the grouping key, with watermark = grace: Spark's
  ``session_window`` only feeds built-in aggregates, so it cannot call the user's ``merge`` nor
  emit the tombstones the worker writes for sessions merged away;
* stream–table joins union both sides keyed by the join key into one
  ``applyInPandasWithState`` whose state is the table's latest value; windowed stream–stream
  joins do the same with both sides' records as state (watermark = before + after + grace, the
  worker's join-store retention), so matches, their order and left/outer rows follow the
  worker (Spark's native join cannot emit the worker's immediate unmatched left/outer rows);
* low-level processors run in ``transformWithStateInPandas`` grouped by source partition (the
  worker's task): each key-value store is a ``MapState``, stream time and punctuation due times
  a ``ValueState``; stream-time punctuations fire after each record as on the worker;
  wall-clock punctuations are processing-time timers;
* every sink writes through ``foreachBatch`` with a kafka-python producer (Python sinks do not
  support update mode), serializing with the sink's serdes, so outputs are byte-identical to
  the worker runtime's.

What does not compile raises ``SparkCompileError`` naming the node and the reason, before Spark
starts: two stateful steps on one sink's path (an aggregation of an aggregation, a join of an
aggregated stream: Spark allows one arbitrary-state operator per query here); a stream–table
join whose table is computed rather than read from a topic; a processor reading a repartition
topic or a stateful step's output (its task, hence its stores and stream time, would not be a
source partition), using a window or session store, or reading another node's store.

Remaining semantic differences (identical output needs inputs free of these cases):

* lateness: the worker closes windows and sessions on its task's stream time, record by
  record; Spark on a global watermark fixed per micro-batch. Records late by less than a batch,
  or late on one partition but not globally, may be kept by one runtime and dropped by the other;
* order: within a micro-batch a group's rows apply in event-time order (stable; tables before
  streams, left before right on equal timestamps); the worker applies one partition in offset
  order and merges a task's partitions by timestamp per poll. Out-of-order table updates
  (an update older than a stream record already joined) therefore give different joins;
* processors: one instance per task per micro-batch (state lives only in its stores); ``close()``
  is not called; wall-clock punctuations fire only when a micro-batch runs, and not at all in a
  backfill (``available_now``), which runs without no-data batches so that it ends.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from pystreams.topology.errors import TopologyError
from pystreams.topology.ir import (
    JoinSide,
    Node,
    NodeKind,
    PunctuationType,
    StoreKind,
    StreamStreamJoinNode,
    StreamTableJoinNode,
    Topology,
)
from pystreams.topology.kernels import initial_factory
from pystreams.topology.windows import HoppingWindow, JoinWindow, SessionWindow, TumblingWindow, Windowed

from .operators import (
    STREAM_SIDE,
    TABLE_SIDE,
    ProcessorSpec,
    processor_operator,
    session_aggregator,
    stream_stream_joiner,
    stream_table_joiner,
)
from .serdes import ShippedSerde, serde_recipe

log = logging.getLogger(__name__)

#: key, value (deserialized) and timestamp in epoch ms.
Record = tuple[Any, Any, int]
Step = Callable[[Iterable[Record]], Iterator[Record]]
ROWS = "key binary, value binary, ts long"
SINK_ROWS = "topic string, key binary, value binary, ts long"
NO_DATA_BATCHES_CONF = "spark.sql.streaming.noDataMicroBatches.enabled"


class SparkCompileError(TopologyError):
    """A node that the Spark runtime cannot execute; the message says which and why."""


def _unsupported(node: Node, reason: str) -> SparkCompileError:
    return SparkCompileError(f"node {node.name!r} ({node.kind}) cannot run on Spark: {reason}", nodes=[node.name])


# -- the plan (plain data; no Spark needed to build it) -------------------------------------------


@dataclass(frozen=True)
class SourcePlan:
    node: str
    topics: tuple[str, ...]


@dataclass(frozen=True)
class Flow:
    """Records of ``base`` (bytes in ``base_key``/``base_value``) after ``steps``, which leave
    objects that ``key_serde``/``value_serde`` serialize."""

    base: Any  # SourcePlan | UnionPlan | AggregatePlan
    base_key: ShippedSerde
    base_value: ShippedSerde
    steps: tuple[Step, ...]
    key_serde: ShippedSerde
    value_serde: ShippedSerde
    #: True once the records went through a repartition topic (which Spark elides).
    repartitioned: bool = False


@dataclass(frozen=True)
class UnionPlan:
    node: str
    inputs: tuple[Flow, ...]


@dataclass(frozen=True)
class AggregatePlan:
    node: str
    input: Flow
    kind: NodeKind
    fn: Callable[[Any, Any, Any], Any]
    initial: Any
    out_key: ShippedSerde
    accumulator: ShippedSerde
    #: Tumbling, hopping or session windows; None for a plain per-key aggregation.
    window: TumblingWindow | HoppingWindow | SessionWindow | None = None
    #: Session windows: ``merger(key, older, newer)``.
    merger: Callable[[Any, Any, Any], Any] | None = None


@dataclass(frozen=True)
class StreamTableJoinPlan:
    node: str
    stream: Flow
    table: Flow
    #: Serializes both sides' keys into the bytes they are grouped (joined) on.
    join_key: ShippedSerde
    fn: Callable[[Any, Any, Any], Any]
    left_join: bool
    out_key: ShippedSerde
    out_value: ShippedSerde


@dataclass(frozen=True)
class StreamStreamJoinPlan:
    node: str
    left: Flow
    right: Flow
    join_key: ShippedSerde
    left_value: ShippedSerde
    right_value: ShippedSerde
    fn: Callable[[Any, Any, Any], Any]
    window: JoinWindow
    how: str
    out_key: ShippedSerde
    out_value: ShippedSerde


@dataclass(frozen=True)
class ProcessorPlan:
    node: str
    source: SourcePlan
    spec: ProcessorSpec

    @property
    def processing_time_timers(self) -> bool:
        return bool(self.spec.wall_clock_punctuations)


@dataclass(frozen=True)
class SinkPlan:
    node: str
    topic: str
    input: Flow


@dataclass(frozen=True)
class SparkPlan:
    topology: Topology
    source_topics: tuple[str, ...]
    sinks: tuple[SinkPlan, ...]
    stateful_nodes: tuple[str, ...] = field(default=())


# -- steps: small generators over records, fused at run time --------------------------------------


def _map_step(fn: Callable) -> Step:
    def step(records: Iterable[Record]) -> Iterator[Record]:
        for key, value, ts in records:
            new_key, new_value = fn(key, value)
            yield new_key, new_value, ts

    return step


def _map_values_step(fn: Callable) -> Step:
    def step(records: Iterable[Record]) -> Iterator[Record]:
        for key, value, ts in records:
            yield key, fn(key, value), ts

    return step


def _flat_map_step(fn: Callable) -> Step:
    def step(records: Iterable[Record]) -> Iterator[Record]:
        for key, value, ts in records:
            for new_key, new_value in fn(key, value):
                yield new_key, new_value, ts

    return step


def _flat_map_values_step(fn: Callable) -> Step:
    def step(records: Iterable[Record]) -> Iterator[Record]:
        for key, value, ts in records:
            for new_value in fn(key, value):
                yield key, new_value, ts

    return step


def _filter_step(predicate: Callable[[Any, Any], bool]) -> Step:
    def step(records: Iterable[Record]) -> Iterator[Record]:
        return (record for record in records if predicate(record[0], record[1]))

    return step


def _peek_step(fn: Callable) -> Step:
    def step(records: Iterable[Record]) -> Iterator[Record]:
        for record in records:
            fn(record[0], record[1])
            yield record

    return step


def _select_key_step(fn: Callable) -> Step:
    def step(records: Iterable[Record]) -> Iterator[Record]:
        for key, value, ts in records:
            yield fn(key, value), value, ts

    return step


def _branch_step(fn: Callable, label: str) -> Step:
    def step(records: Iterable[Record]) -> Iterator[Record]:
        return (record for record in records if fn(record[0], record[1]) == label)

    return step


def _timestamp_step(extractor: Callable[[Any, Any, int], int]) -> Step:
    def step(records: Iterable[Record]) -> Iterator[Record]:
        for key, value, ts in records:
            yield key, value, extractor(key, value, ts)

    return step


# -- compile: topology -> plan ----------------------------------------------------------------------

_STATELESS_STEPS: dict[NodeKind, Callable[[Callable], Step]] = {
    NodeKind.MAP: _map_step,
    NodeKind.MAP_VALUES: _map_values_step,
    NodeKind.FLAT_MAP: _flat_map_step,
    NodeKind.FLAT_MAP_VALUES: _flat_map_values_step,
    NodeKind.FILTER: _filter_step,
    NodeKind.PEEK: _peek_step,
    NodeKind.SELECT_KEY: _select_key_step,
}
_PASS_THROUGH = frozenset({NodeKind.BRANCH, NodeKind.TO_STREAM})
_AGGREGATIONS = frozenset({NodeKind.COUNT, NodeKind.AGGREGATE, NodeKind.REDUCE})


def _shipped(node: Node, serde: Any) -> ShippedSerde:
    if serde_recipe(serde) is None:
        import pickle

        try:
            pickle.dumps(serde)
        except Exception as error:
            raise _unsupported(node, f"its serde {serde.name!r} cannot be shipped to Spark workers ({error})") from None
    return ShippedSerde(serde)


def compile_topology(topology: Topology, *, topics_matching: Callable[[str], list[str]] | None = None) -> SparkPlan:
    """Check every node and build the plan. ``topics_matching(pattern)`` expands pattern
    sources (the cluster's topics that fully match); without it, pattern sources fail."""
    flows: dict[str, Flow] = {}
    sinks: list[SinkPlan] = []
    source_topics: list[str] = []
    stateful: list[str] = []
    repartition_flows: dict[str, Flow] = {}

    def parent_flow(node: Node) -> Flow:
        (parent,) = node.parents
        if parent not in flows:
            raise _unsupported(node, f"it reads {parent!r} ({topology.nodes[parent].kind}), which only feeds its join")
        return flows[parent]

    def then(node: Node, flow: Flow, step: Step | None) -> Flow:
        steps = flow.steps + ((step,) if step is not None else ())
        return Flow(
            flow.base, flow.base_key, flow.base_value, steps,
            _shipped(node, node.key_serde), _shipped(node, node.value_serde), flow.repartitioned,
        )

    for node in _in_dependency_order(topology):
        kind = node.kind
        if kind in (NodeKind.SOURCE, NodeKind.TABLE_SOURCE) and node.internal:
            flow = next((repartition_flows[t] for t in node.topics if t in repartition_flows), None)
            if flow is None:
                raise _unsupported(node, f"no repartition sink writes {node.topics}")
            # Spark shuffles by key itself: the repartition topic is only a change of serdes.
            flows[node.name] = dataclasses.replace(then(node, flow, None), repartitioned=True)
        elif kind in (NodeKind.SOURCE, NodeKind.TABLE_SOURCE):
            topics = list(node.topics)
            if node.pattern is not None:
                if topics_matching is None:
                    raise _unsupported(node, f"pattern source {node.pattern!r} needs the cluster's topic list")
                topics = topics_matching(node.pattern)
                if not topics:
                    raise _unsupported(node, f"no topic matches the pattern {node.pattern!r}")
            source_topics.extend(t for t in topics if t not in source_topics)
            key, value = _shipped(node, node.key_serde), _shipped(node, node.value_serde)
            steps = (_timestamp_step(node.timestamp_extractor),) if node.timestamp_extractor else ()
            flows[node.name] = Flow(SourcePlan(node.name, tuple(topics)), key, value, steps, key, value)
        elif kind in _STATELESS_STEPS:
            assert node.fn is not None
            flows[node.name] = then(node, parent_flow(node), _STATELESS_STEPS[kind](node.fn))
        elif kind in _PASS_THROUGH:
            flows[node.name] = then(node, parent_flow(node), None)
        elif kind is NodeKind.BRANCH_OUTPUT:
            (branch_name,) = node.parents
            branch = topology.nodes[branch_name]
            assert branch.fn is not None
            flows[node.name] = then(node, flows[branch_name], _branch_step(branch.fn, node.branches[0]))
        elif kind is NodeKind.MERGE:
            if any(topology.nodes[p].kind is NodeKind.STREAM_STREAM_JOIN for p in node.parents):
                plan = _stream_stream_join_plan(topology, node, flows)
                stateful.append(node.name)
                out_key, out_value = plan.out_key, plan.out_value
                flows[node.name] = Flow(plan, out_key, out_value, (), out_key, out_value)
                continue
            key, value = _shipped(node, node.key_serde), _shipped(node, node.value_serde)
            union = UnionPlan(node.name, tuple(flows[p] for p in node.parents))
            flows[node.name] = Flow(union, key, value, (), key, value)
        elif kind in _AGGREGATIONS:
            if node.window is not None and not isinstance(node.window, TumblingWindow | HoppingWindow | SessionWindow):
                raise _unsupported(node, f"windowed aggregations over {type(node.window).__name__} have no Spark plan")
            if isinstance(node.window, SessionWindow) and node.merger is None:
                raise _unsupported(node, "a session-windowed aggregation needs a merge function")
            assert node.fn is not None
            flow = parent_flow(node)
            out_key, accumulator = _shipped(node, node.key_serde), _shipped(node, node.value_serde)
            plan = AggregatePlan(
                node.name, flow, kind, node.fn, node.initial, out_key, accumulator, node.window, node.merger
            )
            stateful.append(node.name)
            flows[node.name] = Flow(plan, out_key, accumulator, (), out_key, accumulator)
        elif kind is NodeKind.SINK:
            flow = then(node, parent_flow(node), None)
            if node.internal:
                repartition_flows[node.topics[0]] = flow
            else:
                sinks.append(SinkPlan(node.name, node.topics[0], flow))
        elif kind is NodeKind.PROCESSOR:
            plan = _processor_plan(topology, node, parent_flow(node))
            stateful.append(node.name)
            out_key, out_value = plan.spec.out_key, plan.spec.out_value
            flows[node.name] = Flow(plan, out_key, out_value, (), out_key, out_value)
        elif kind is NodeKind.STREAM_STREAM_JOIN:
            # Compiled at the MERGE node that carries the join's name (both sides are needed).
            for child in node.children:
                if topology.nodes[child].kind is not NodeKind.MERGE:
                    raise _unsupported(node, f"one side of a stream-stream join feeds {child!r}, not the join's merge")
        elif kind is NodeKind.STREAM_TABLE_JOIN:
            plan = _stream_table_join_plan(topology, node, parent_flow(node), flows)
            stateful.append(node.name)
            out_key, out_value = plan.out_key, plan.out_value
            flows[node.name] = Flow(plan, out_key, out_value, (), out_key, out_value)
        else:
            raise _unsupported(node, "this node kind is unknown to the Spark compiler")
    for sink in sinks:
        stateful_steps = _stateful_steps_feeding(sink.input)
        if len(stateful_steps) > 1:
            node = topology.nodes[stateful_steps[1]]
            raise _unsupported(
                node,
                f"it consumes the output of stateful step {stateful_steps[0]!r} on the way to sink {sink.node!r}; "
                "Spark runs one arbitrary-state step per query",
            )
    if not sinks:
        raise SparkCompileError(f"topology {topology.app_id!r} writes no topic: nothing for a Spark query to do")
    return SparkPlan(topology, tuple(source_topics), tuple(sinks), tuple(stateful))


def _stateful_steps_feeding(flow: Flow) -> list[str]:
    """Stateful nodes (aggregations, joins, processors) upstream of ``flow``, upstream first."""
    base = flow.base
    if isinstance(base, AggregatePlan):
        inputs: tuple[Flow, ...] = (base.input,)
    elif isinstance(base, StreamTableJoinPlan):
        inputs = (base.stream, base.table)
    elif isinstance(base, StreamStreamJoinPlan):
        inputs = (base.left, base.right)
    elif isinstance(base, UnionPlan):
        return [name for flow_in in base.inputs for name in _stateful_steps_feeding(flow_in)]
    elif isinstance(base, ProcessorPlan):
        return [base.node]  # its input is a source (checked when planned)
    else:
        return []
    return [*(name for flow_in in inputs for name in _stateful_steps_feeding(flow_in)), base.node]


def _stream_table_join_plan(topology: Topology, node: Node, stream: Flow, flows: dict[str, Flow]) -> StreamTableJoinPlan:
    join = node
    assert isinstance(join, StreamTableJoinNode)
    table_node = topology.nodes[join.table]
    if table_node.kind is not NodeKind.TABLE_SOURCE or table_node.internal:
        raise _unsupported(
            node,
            f"it joins table {join.table!r} ({table_node.kind}); on Spark the table side must be read from a topic "
            "(a computed table would be a second stateful step in one query)",
        )
    store = topology.stores[join.table_store]
    return StreamTableJoinPlan(
        node=node.name,
        stream=stream,
        table=flows[join.table],
        join_key=_shipped(node, store.key_serde),
        fn=join.fn,
        left_join=join.how.value == "left",
        out_key=_shipped(node, node.key_serde),
        out_value=_shipped(node, node.value_serde),
    )


def _stream_stream_join_plan(topology: Topology, merge: Node, flows: dict[str, Flow]) -> StreamStreamJoinPlan:
    sides = {
        side_node.side: side_node
        for p in merge.parents
        if isinstance(side_node := topology.nodes[p], StreamStreamJoinNode)
    }
    if len(merge.parents) != 2 or set(sides) != {JoinSide.LEFT, JoinSide.RIGHT}:
        raise _unsupported(merge, "it merges stream-stream join sides with other streams")
    left, right = sides[JoinSide.LEFT], sides[JoinSide.RIGHT]
    join = left
    (left_parent,), (right_parent,) = left.parents, right.parents
    left_store, right_store = topology.stores[join.this_store], topology.stores[join.other_store]
    return StreamStreamJoinPlan(
        node=merge.name,
        left=flows[left_parent],
        right=flows[right_parent],
        join_key=_shipped(left, left_store.key_serde),
        left_value=_shipped(left, left_store.value_serde),
        right_value=_shipped(right, right_store.value_serde),
        fn=left.fn,
        window=join.window,
        how=join.how.value,
        out_key=_shipped(merge, merge.key_serde),
        out_value=_shipped(merge, merge.value_serde),
    )


def _processor_plan(topology: Topology, node: Node, flow: Flow) -> ProcessorPlan:
    if not isinstance(flow.base, SourcePlan) or flow.repartitioned:
        raise _unsupported(
            node,
            "its input is not read straight from a source topic; Spark keeps a processor's stores per source "
            "partition (the worker's task), which a repartition or a stateful step upstream would change",
        )
    stores = []
    for name in node.stores:
        store = topology.stores[name]
        if store.owner != node.name:
            raise _unsupported(node, f"it reads store {name!r} of node {store.owner!r}; Spark state is private to one operator")
        if store.kind is not StoreKind.KEY_VALUE:
            raise _unsupported(node, f"its store {name!r} is a {store.kind} store; only key-value stores map onto Spark state")
        stores.append((name, _shipped(node, store.key_serde), _shipped(node, store.value_serde)))
    assert isinstance(node.fn, type)
    extractor = topology.nodes[flow.base.node].timestamp_extractor
    by_type = {
        kind: tuple((p.method, p.interval_ms) for p in node.punctuations if p.type is kind) for kind in PunctuationType
    }
    spec = ProcessorSpec(
        node=node.name,
        app_id=topology.app_id,
        subtopology=node.subtopology,
        processor_class=node.fn,
        stores=tuple(stores),
        stream_punctuations=by_type[PunctuationType.STREAM_TIME],
        wall_clock_punctuations=by_type[PunctuationType.WALL_CLOCK_TIME],
        base_key=flow.base_key,
        base_value=flow.base_value,
        timestamp_extractor=extractor,
        steps=flow.steps[1:] if extractor is not None else flow.steps,  # the first step extracts it
        out_key=_shipped(node, node.key_serde),
        out_value=_shipped(node, node.value_serde),
    )
    return ProcessorPlan(node.name, flow.base, spec)


def _in_dependency_order(topology: Topology) -> list[Node]:
    """Parents first; a repartition source after the sink writing its topic."""
    writers = {n.topics[0]: n.name for n in topology.nodes.values() if n.kind is NodeKind.SINK and n.internal}
    ordered: list[Node] = []
    seen: set[str] = set()

    def visit(name: str) -> None:
        if name in seen:
            return
        seen.add(name)
        node = topology.nodes[name]
        for parent in node.parents:
            visit(parent)
        if isinstance(node, StreamTableJoinNode):
            visit(node.table)  # a stream-table join reads the table's flow
        if node.is_source and node.internal:
            for topic in node.topics:
                if topic in writers:
                    visit(writers[topic])
        ordered.append(node)

    for name in topology.nodes:
        visit(name)
    return ordered


# -- build: plan -> Spark DataFrames ----------------------------------------------------------------


def _ship_app_modules(spark: Any, topology: Topology) -> None:
    """Make the app's own module importable on Spark's Python workers (``addPyFile``), so the
    user's functions and classes pickle by reference. ``load_app`` names an app loaded from a
    file ``pystreams_app_<stem>``; workers cannot import that name by themselves, and pickling
    the module by value is not an option: msgspec Struct classes lose their fields that way.

    The copy sits in a directory named after its content hash, so shipping the same app again
    is a no-op; an app edited while the session runs needs a new session."""
    import hashlib
    import shutil
    import tempfile
    from pathlib import Path

    modules = {
        module_name
        for node in topology.nodes.values()
        for thing in (node.fn, node.timestamp_extractor, node.merger, node.initial)
        if (module_name := getattr(thing, "__module__", None)) and module_name.startswith("pystreams_app_")
    }
    for module_name in sorted(modules):
        module = sys.modules.get(module_name)
        source_file = getattr(module, "__file__", None)
        if source_file is None:
            continue
        source = Path(source_file).read_bytes()
        digest = hashlib.sha256(source).hexdigest()[:16]
        shipped = Path(tempfile.gettempdir()) / "pystreams-spark-apps" / digest / f"{module_name}.py"
        if not shipped.exists():
            shipped.parent.mkdir(parents=True, exist_ok=True)
            partial = shipped.with_suffix(".tmp")
            shutil.copyfile(source_file, partial)
            partial.replace(shipped)
        spark.sparkContext.addPyFile(str(shipped))


def _arrow_rows_schema() -> Any:
    import pyarrow as pa

    return pa.schema([("key", pa.binary()), ("value", pa.binary()), ("ts", pa.int64())])


def _run_flow(
    batches: Iterator[Any],
    base_key: ShippedSerde,
    base_value: ShippedSerde,
    steps: tuple[Step, ...],
    key_serde: ShippedSerde,
    value_serde: ShippedSerde,
) -> Iterator[Any]:
    import pyarrow as pa

    schema = _arrow_rows_schema()
    for batch in batches:
        keys = batch.column(0).to_pylist()
        values = batch.column(1).to_pylist()
        stamps = batch.column(2).to_pylist()
        records: Iterable[Record] = zip(
            map(base_key.deserialize, keys), map(base_value.deserialize, values), stamps, strict=True
        )
        for step in steps:
            records = step(records)
        out_keys, out_values, out_stamps = [], [], []
        for key, value, ts in records:
            out_keys.append(key_serde.serialize(key))
            out_values.append(value_serde.serialize(value))
            out_stamps.append(ts)
        yield pa.RecordBatch.from_arrays(
            [pa.array(out_keys, pa.binary()), pa.array(out_values, pa.binary()), pa.array(out_stamps, pa.int64())],
            schema=schema,
        )


class _Builder:
    def __init__(self, spark: Any, bootstrap_servers: str, source_format: str, *, backfill: bool = False) -> None:
        self.spark = spark
        self.bootstrap_servers = bootstrap_servers
        self.source_format = source_format
        self.backfill = backfill
        self._built: dict[int, Any] = {}

    def source(self, plan: SourcePlan, *, with_position: bool = False) -> Any:
        """``key, value, ts`` rows of the plan's topics (``with_position``: also ``topic,
        partition, offset``)."""
        from pyspark.sql import functions as F

        options = source_options(self.source_format, self.bootstrap_servers, plan.topics)
        raw = self.spark.readStream.format(self.source_format).options(**options).load()
        ts = F.unix_millis("timestamp") if self.source_format == "kafka" else F.col("timestamp")
        position = ("topic", F.col("partition").cast("int").alias("partition"), "offset") if with_position else ()
        return raw.select("key", "value", ts.alias("ts"), *position)

    def base(self, plan: Any) -> Any:
        # One DataFrame per plan object, so a source feeding two branches is read once per batch.
        if id(plan) not in self._built:
            if isinstance(plan, SourcePlan):
                self._built[id(plan)] = self.source(plan)
            elif isinstance(plan, UnionPlan):
                frames = [self.rows(flow, flow.key_serde, flow.value_serde) for flow in plan.inputs]
                union = frames[0]
                for frame in frames[1:]:
                    union = union.unionByName(frame)
                self._built[id(plan)] = union
            elif isinstance(plan, AggregatePlan):
                self._built[id(plan)] = self.aggregate(plan)
            elif isinstance(plan, StreamTableJoinPlan):
                self._built[id(plan)] = self.stream_table_join(plan)
            elif isinstance(plan, StreamStreamJoinPlan):
                self._built[id(plan)] = self.stream_stream_join(plan)
            else:
                self._built[id(plan)] = self.processor(plan)
        return self._built[id(plan)]

    def _sides(self, *sides: tuple[Flow, ShippedSerde, ShippedSerde, int]) -> Any:
        """Both inputs of a join as one stream of ``key, value, ts, side`` rows."""
        from pyspark.sql import functions as F

        frames = [self.rows(flow, key, value).withColumn("side", F.lit(side)) for flow, key, value, side in sides]
        return frames[0].unionByName(frames[1])

    def stream_table_join(self, plan: StreamTableJoinPlan) -> Any:
        from pyspark.sql.streaming.state import GroupStateTimeout

        table_value = plan.table.value_serde
        rows = self._sides(
            (plan.stream, plan.join_key, plan.stream.value_serde, STREAM_SIDE),
            (plan.table, plan.join_key, table_value, TABLE_SIDE),
        )
        # No row for a null key, in a table or a join; a null table value is a delete.
        rows = rows.where(f"key IS NOT NULL AND (value IS NOT NULL OR side = {TABLE_SIDE})")
        update = stream_table_joiner(
            join_key=plan.join_key,
            stream_value=plan.stream.value_serde,
            table_value=table_value,
            out_key=plan.out_key,
            out_value=plan.out_value,
            fn=plan.fn,
            left_join=plan.left_join,
        )
        return rows.groupBy("key").applyInPandasWithState(
            update, ROWS, "table_value binary", "update", GroupStateTimeout.NoTimeout
        )

    def stream_stream_join(self, plan: StreamStreamJoinPlan) -> Any:
        from pyspark.sql import functions as F
        from pyspark.sql.streaming.state import GroupStateTimeout

        from .worker_semantics import LEFT, RIGHT

        rows = self._sides(
            (plan.left, plan.join_key, plan.left_value, LEFT), (plan.right, plan.join_key, plan.right_value, RIGHT)
        )
        window = plan.window
        retention_ms = window.before_ms + window.after_ms + window.grace_ms
        # Watermark delay = the join stores' retention: records older than that can no longer
        # join on the worker either.
        rows = (
            rows.where("key IS NOT NULL AND value IS NOT NULL")
            .withColumn("event_time", F.timestamp_millis("ts"))
            .withWatermark("event_time", f"{retention_ms} milliseconds")
        )
        update = stream_stream_joiner(
            join_key=plan.join_key,
            left_value=plan.left_value,
            right_value=plan.right_value,
            out_key=plan.out_key,
            out_value=plan.out_value,
            fn=plan.fn,
            window=window,
            how=plan.how,
        )
        return rows.groupBy("key").applyInPandasWithState(
            update, ROWS, "buffered binary", "update", GroupStateTimeout.EventTimeTimeout
        )

    def processor(self, plan: ProcessorPlan) -> Any:
        rows = self.source(plan.source, with_position=True)
        # The same time mode either way, so streaming runs and backfills share a checkpoint.
        time_mode = "ProcessingTime" if plan.processing_time_timers else "None"
        spec = dataclasses.replace(plan.spec, wall_clock_timers=not self.backfill)
        return rows.groupBy("partition").transformWithStateInPandas(
            processor_operator(spec), ROWS, "Update", time_mode
        )

    def rows(self, flow: Flow, key_serde: ShippedSerde, value_serde: ShippedSerde) -> Any:
        """The flow as ``key, value, ts`` rows serialized with the given serdes."""
        base = self.base(flow.base)
        unchanged = flow.base_key.name == key_serde.name and flow.base_value.name == value_serde.name
        if not flow.steps and unchanged:
            return base
        base_key, base_value, steps = flow.base_key, flow.base_value, flow.steps

        def run(batches: Iterator[Any]) -> Iterator[Any]:
            return _run_flow(batches, base_key, base_value, steps, key_serde, value_serde)

        return base.mapInArrow(run, ROWS)

    def aggregate(self, plan: AggregatePlan) -> Any:
        from pyspark.sql.streaming.state import GroupStateTimeout

        rows = self.rows(plan.input, plan.input.key_serde, plan.input.value_serde)
        update = _aggregator(plan)
        # Kafka Streams skips null keys and null values in aggregations.
        rows = rows.where("key IS NOT NULL AND value IS NOT NULL")
        window = plan.window
        if window is None:
            return rows.groupBy("key").applyInPandasWithState(
                update, ROWS, "accumulator binary", "update", GroupStateTimeout.NoTimeout
            )
        from pyspark.sql import functions as F

        if isinstance(window, SessionWindow):
            assert plan.merger is not None
            sessions = session_aggregator(
                in_key=plan.input.key_serde,
                in_value=plan.input.value_serde,
                out_key=plan.out_key,
                accumulator=plan.accumulator,
                fn=plan.fn,
                initial=plan.initial,
                is_reduce=plan.kind is NodeKind.REDUCE,
                merger=plan.merger,
                window=window,
            )
            rows = rows.withColumn("event_time", F.timestamp_millis("ts")).withWatermark(
                "event_time", f"{window.grace_ms} milliseconds"
            )
            return rows.groupBy("key").applyInPandasWithState(
                sessions, ROWS, "sessions binary", "update", GroupStateTimeout.EventTimeTimeout
            )

        # Watermark = grace: Spark drops rows older than (newest event time - grace) and times
        # out (forgets) a window's state once the watermark passes its end plus grace.
        windows = F.window("event_time", f"{window.size_ms} milliseconds", f"{window.advance_ms} milliseconds")
        rows = (
            rows.withColumn("event_time", F.timestamp_millis("ts"))
            .withWatermark("event_time", f"{window.grace_ms} milliseconds")
            .withColumn("window_start", F.unix_millis(windows.getField("start")))
        )
        if isinstance(window, HoppingWindow):
            # Kafka Streams has no windows starting before the epoch.
            rows = rows.where("window_start >= 0")
        return rows.groupBy("key", "window_start").applyInPandasWithState(
            update, ROWS, "accumulator binary", "update", GroupStateTimeout.EventTimeTimeout
        )


def _aggregator(plan: AggregatePlan) -> Callable[..., Iterator[Any]]:
    in_key, in_value = plan.input.key_serde, plan.input.value_serde
    out_key, accumulator = plan.out_key, plan.accumulator
    fn, is_reduce = plan.fn, plan.kind is NodeKind.REDUCE
    new_initial = initial_factory(plan.initial)
    same_key_bytes = in_key.name == out_key.name
    window = plan.window

    def update(group_key: tuple[Any, ...], frames: Iterator[Any], state: Any) -> Iterator[Any]:
        import pandas as pd

        if state.hasTimedOut:
            state.remove()  # the window closed: its final value was emitted already
            return
        key_bytes = group_key[0]
        key = in_key.deserialize(key_bytes)
        if state.exists:
            total, started = accumulator.deserialize(state.get[0]), True
        else:
            total, started = None, False
        last_ts = -1
        for frame in frames:
            # Within a micro-batch, apply records in event-time order (stable for ties).
            if len(frame) > 1 and not frame["ts"].is_monotonic_increasing:
                frame = frame.sort_values("ts", kind="stable")
            for value_bytes, ts in zip(frame["value"], frame["ts"], strict=True):
                value = in_value.deserialize(value_bytes)
                if not started:
                    if is_reduce:
                        total = value
                    else:
                        total = fn(new_initial(), key, value)
                    started = True
                else:
                    total = fn(total, key, value)
                last_ts = max(last_ts, int(ts))
        encoded = accumulator.serialize(total)
        state.update((encoded,))
        if window is None:
            out_key_bytes = key_bytes if same_key_bytes else out_key.serialize(key)
        else:
            start = int(group_key[1])
            out_key_bytes = out_key.serialize(Windowed(key, start, start + window.size_ms))
            closes_at = start + window.size_ms + window.grace_ms
            state.setTimeoutTimestamp(max(closes_at, state.getCurrentWatermarkMs() + 1))
        yield pd.DataFrame(
            {
                "key": [out_key_bytes],
                "value": [encoded],
                "ts": [last_ts],
            }
        )

    return update


# -- the query ------------------------------------------------------------------------------------


def _write_batch_to_kafka(bootstrap_servers: str) -> Callable[[Any, int], None]:
    def produce(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa
        from kafka import KafkaProducer

        producer = KafkaProducer(
            bootstrap_servers=bootstrap_servers,
            client_id="pystreams-spark-sink",
            linger_ms=20,
            batch_size=262_144,
            acks="all",
        )
        written = 0
        try:
            for batch in batches:
                columns = [batch.column(i).to_pylist() for i in range(4)]
                for topic, key, value, ts in zip(*columns, strict=True):
                    producer.send(topic, key=key, value=value, timestamp_ms=ts if ts is not None and ts >= 0 else None)
                written += batch.num_rows
            # Spark marks the batch done when foreachBatch returns: everything must be acked.
            producer.flush()
        finally:
            producer.close()
        yield pa.RecordBatch.from_pydict({"written": [written]})

    def write(batch: Any, batch_id: int) -> None:
        written = batch.mapInArrow(produce, "written long").groupBy().sum("written").collect()
        log.debug("batch %s: %s records written", batch_id, written[0][0] if written else 0)

    return write


def source_options(source_format: str, bootstrap_servers: str, topics: Iterable[str]) -> dict[str, str]:
    """The reader options for ``source_format``: Spark's connector (``kafka``) reads every
    topic from the earliest offset, as a new worker group does; ours takes the same."""
    topic_list = ",".join(topics)
    if source_format == "kafka":
        return {"kafka.bootstrap.servers": bootstrap_servers, "subscribe": topic_list, "startingOffsets": "earliest"}
    return {"bootstrap.servers": bootstrap_servers, "topics": topic_list}


def choose_source_format(spark: Any) -> str:
    """``kafka`` (Spark's connector) when its jar is on the classpath, else ours."""
    from .kafka_source import KafkaDataSource, builtin_kafka_available

    if builtin_kafka_available(spark):
        log.info("Kafka source: Spark's built-in connector (spark-sql-kafka is on the classpath)")
        return "kafka"
    spark.dataSource.register(KafkaDataSource)
    log.info("Kafka source: pystreams' Python data source on kafka-python (no spark-sql-kafka jar found)")
    return "pystreams_kafka"


def cluster_pattern_matcher(bootstrap_servers: str) -> Callable[[str], list[str]]:
    def matching(pattern: str) -> list[str]:
        import re2

        from pystreams.cluster import ClusterMetadata

        with ClusterMetadata(bootstrap_servers) as cluster:
            names = sorted(cluster.fetch_topics())
        compiled = re2.compile(pattern)
        return [name for name in names if compiled.fullmatch(name)]

    return matching


@dataclass
class SparkJob:
    """The compiled app: one streaming query per sink (Spark allows one arbitrary-state
    operator per query), each checkpointed in its own sub-directory of the checkpoint."""

    plan: SparkPlan
    spark: Any
    #: backfill? -> sink node name -> its query, configured but not started (a backfill's
    #: have no wall-clock timers: they would keep it running)
    build_writers: Callable[[bool], dict[str, Any]]
    queries: list[Any] = field(default_factory=list)

    @functools.cached_property
    def writers(self) -> dict[str, Any]:
        """Sink node name -> its streaming query, configured but not started (for callers
        that set their own trigger)."""
        return self.build_writers(False)

    def start(self, *, available_now: bool = False) -> list[Any]:
        """Start every query; ``available_now`` = a backfill up to the offsets seen now."""
        if not available_now:
            self.queries.extend(writer.start() for writer in self.writers.values())
            return self.queries
        # A backfill ends with its input: no-data batches would only evict state, and with
        # processing-time timers (transformWithState) they never stop. The setting is read
        # when a query starts and is not kept in its checkpoint.
        previous = self.spark.conf.get(NO_DATA_BATCHES_CONF, None)
        self.spark.conf.set(NO_DATA_BATCHES_CONF, "false")
        try:
            for writer in self.build_writers(True).values():
                self.queries.append(writer.trigger(availableNow=True).start())
        finally:
            if previous is None:
                self.spark.conf.unset(NO_DATA_BATCHES_CONF)
            else:
                self.spark.conf.set(NO_DATA_BATCHES_CONF, previous)
        return self.queries

    def await_termination(self, timeout_s: float | None = None) -> bool:
        """Wait for every query to end; True if all did. Raises the first query's failure."""
        import time

        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for query in self.queries:
            if deadline is None:
                query.awaitTermination()
            elif not query.awaitTermination(max(0.001, deadline - time.monotonic())):
                return False
        return True

    def stop(self) -> None:
        for query in self.queries:
            query.stop()

    def exception(self) -> Any:
        return next((q.exception() for q in self.queries if q.exception() is not None), None)


def to_spark(
    app: Any,
    spark: Any,
    *,
    bootstrap_servers: str,
    checkpoint: str,
    source_format: str | None = None,
) -> SparkJob:
    """Compile ``app`` (a pystreams ``App`` or a ``Topology``) into streaming queries on
    ``spark``; ``job.start()`` runs them (``available_now=True``: a backfill that ends).

    ``checkpoint`` holds the source offsets and the aggregation state: restarting with the same
    directory resumes exactly where the last completed micro-batch ended.
    """
    from pathlib import Path

    from pyspark.sql import functions as F

    topology = app if isinstance(app, Topology) else app.topology()
    plan = compile_topology(topology, topics_matching=cluster_pattern_matcher(bootstrap_servers))
    _ship_app_modules(spark, topology)
    source_format = source_format or choose_source_format(spark)

    def writers(backfill: bool) -> dict[str, Any]:
        built = {}
        for sink in plan.sinks:
            # A fresh builder per query: queries must not share DataFrames of stateful steps.
            builder = _Builder(spark, bootstrap_servers, source_format, backfill=backfill)
            rows = builder.rows(sink.input, sink.input.key_serde, sink.input.value_serde)
            built[sink.node] = (
                rows.select(F.lit(sink.topic).alias("topic"), "key", "value", "ts")
                .writeStream.queryName(f"pystreams-{topology.app_id}-{sink.node}")
                .foreachBatch(_write_batch_to_kafka(bootstrap_servers))
                # Update mode: aggregations emit each changed key once per batch; stateless rows pass.
                .outputMode("update")
                .option("checkpointLocation", str(Path(checkpoint) / sink.node))
            )
        return built

    return SparkJob(plan, spark, writers)
