"""Compile a pystreams topology into Spark Structured Streaming queries (one per sink, or one
per sub-topology).

Spark runs the same kernels as the worker (``pystreams.topology.kernels``; see
``operators``), in the worker's record order, and judges lateness by the same per-task stream
time. The compiled plan, per node kind:

* sources read Kafka (Spark's connector when present, else our Python data source); each row
  keeps its position (topic, partition, offset) for the stateful step after it;
* stateless steps (map, filter, flat-map, select-key, branch, peek, ...) run their kernels,
  fused into one vectorized ``mapInArrow`` per source: Arrow batches in, kernels over
  deserialized records, Arrow batches out — never one Py4J call per row;
* repartition topics disappear: Spark shuffles for the stateful step itself;
* plain (unwindowed) count/reduce/aggregate, plain cogroups and stream–table joins, which no
  stream time affects, run their kernels per key in ``applyInPandasWithState`` (state: the
  key's accumulator, or the table's value), emitting each changed key once per micro-batch
  like the worker's cached table; a cogroup's inputs are its sides, each through its own
  aggregator's kernel into the key's one value;
* tumbling, hopping, sliding and session aggregations (and windowed cogroups), windowed
  stream–stream joins and processors run
  per *task* in ``transformWithStateInPandas``: grouped by the partition number a worker task
  would read (for a repartitioned input, the partition Kafka's partitioner gives its key), with
  the task's stores in ``MapState`` and its stream times in a ``ValueState``, so every window,
  session, join buffer and punctuation follows the worker's per-task stream time record by
  record (Spark's watermark, global and per micro-batch, is not used);
* every sink writes through ``foreachBatch`` with a kafka-python producer (Python sinks do not
  support update mode), serializing with the sink's serdes, so outputs are byte-identical to
  the worker runtime's.

Within a micro-batch every stateful step applies its rows in the worker's order: each input
partition in offset order, partitions merged by timestamp (``operators.ORDER_COLUMNS``).

That *fused* plan (one query per sink) holds at most one stateful step on a sink's path: an
aggregation of an aggregation, a join of an aggregated stream, a stream–table join of a
computed table, a processor behind a repartition or with window stores, ``suppress``, and the
table operators (materialized steps, a table's ``group_by``, table–table and foreign-key joins)
do not fit it. Such a topology compiles to the *chained* plan instead: one query per
sub-topology (``SubtopologyPlan``), each running its worker task graph per task
(``subtopology``), chained through the app's internal topics, which the queries write and read
as the workers do; a backfill runs them in rounds (``SparkJob._backfill_in_rounds``). Emit-final
windowed aggregations compile fused: the kernel reads each closed window from the task's Spark
state (a scan of the task's windows when stream time closes some) and its stream time is kept
there too. What neither plan runs (a serde that cannot travel to Spark's workers, a pattern
without matching topics) raises ``SparkCompileError`` naming the node and the reason, before
Spark starts.

Where the runtimes still differ (``SparkPlan.warnings`` names the nodes concerned):

* a windowed step behind a repartition topic: on a worker, its task's stream time follows the
  order in which the upstream tasks' records happen to arrive in the repartition topic, which no
  other run reproduces; Spark merges them by timestamp per micro-batch. Records that are late
  by that order alone may be kept by one runtime and dropped by the other;
* several input partitions of one task (joins, pattern sources): a worker merges them by
  timestamp within a poll, Spark within a micro-batch; ties go to the table (or left) side on
  Spark and to the fetch order on a worker;
* table updates are emitted once per micro-batch on Spark and once per commit on a worker
  (folded per key), so intermediate values differ; final tables agree, their rows' timestamps
  included (the kernels' rules: ``windowed_result``, timestamped stores);
* processors: one instance per task per micro-batch (state lives only in its stores); ``close()``
  is not called; wall-clock punctuations fire only when a micro-batch runs, and not at all in a
  backfill (``available_now``), which runs without no-data batches so that it ends;
* bad records (the error policies, ``record_errors``): a record whose processing fails in one
  branch of a fan-out stops there on a worker (Kafka Streams' rule), while on Spark the
  branches of other sinks, being other queries, still process it; a dead letter of a failure
  inside a stateful step holds the row that step was given, not the source record's bytes.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pystreams.serdes import Bytes, Serde
from pystreams.topology.errors import TopologyError
from pystreams.topology.ir import (
    AggregateNode,
    BranchNode,
    BranchOutputNode,
    CogroupAggregateNode,
    CogroupNode,
    CountNode,
    FilterNode,
    FkForeignUpdateNode,
    FkJoinNode,
    FkSubscribeNode,
    FkSubscriptionsNode,
    FlatMapNode,
    FlatMapValuesNode,
    JoinSide,
    MapNode,
    MapValuesNode,
    MergeNode,
    Node,
    NodeBase,
    PeekNode,
    ProcessorNode,
    ReduceNode,
    RepartitionNode,
    SelectKeyNode,
    SinkNode,
    SourceNode,
    Store,
    StoreKind,
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
    Topology,
    ToStreamNode,
)
from pystreams.topology.kernels import sink_partitioner

from .operators import (
    GLOBAL_ARRIVAL,
    KEYED_COLUMNS,
    KEYED_STATE_SCHEMA,
    LEFT_SIDE,
    ORDERED_ROWS,
    PROCESSOR_COLUMNS,
    RIGHT_SIDE,
    ROWS,
    SOURCE_MASK,
    SOURCE_SHIFT,
    STREAM_SIDE,
    TABLE_SIDE,
    TASK_COLUMNS,
    FlowRun,
    KeyedStep,
    ProcessorRun,
    TaskStep,
    keyed_update,
    run_flow,
    side_offset,
    task_operator,
)
from .record_errors import RecordErrors
from .serdes import ShippedSerde, serde_recipe
from .source_offsets import FAIL_ON_DATA_LOSS
from .subtopology import TOPIC_ROWS, SubtopologyStep

log = logging.getLogger(__name__)

SINK_ROWS = "topic string, key binary, value binary, ts long"
NO_DATA_BATCHES_CONF = "spark.sql.streaming.noDataMicroBatches.enabled"


class SparkCompileError(TopologyError):
    """A node that the Spark runtime cannot execute; the message says which and why."""


def _unsupported(node: NodeBase, reason: str) -> SparkCompileError:
    return SparkCompileError(f"node {node.name!r} ({node.kind}) cannot run on Spark: {reason}", nodes=[node.name])


# -- the plan (plain data; no Spark needed to build it) -------------------------------------------


@dataclass(frozen=True)
class SourcePlan:
    node: str
    topics: tuple[str, ...]


@dataclass(frozen=True)
class Flow:
    """Records of ``base`` (bytes in ``base_key``/``base_value``) after the stateless
    ``steps`` (nodes whose kernels run in ``mapInArrow``), serialized with
    ``key_serde``/``value_serde``."""

    base: SourcePlan | UnionPlan | KeyedPlan | TaskPlan
    base_key: ShippedSerde
    base_value: ShippedSerde
    steps: tuple[Node, ...]
    key_serde: ShippedSerde
    value_serde: ShippedSerde
    #: Sources with a timestamp extractor: applied before the steps.
    timestamp_extractor: Callable[[Any, Any, int], int] | None = None
    #: The repartition topic the records went through last (Spark elides it).
    repartition_topic: str | None = None

    @property
    def ordered(self) -> bool:
        """Rows carry their source positions (``ORDERED_ROWS``): read from sources only."""
        if isinstance(self.base, SourcePlan):
            return True
        return isinstance(self.base, UnionPlan) and all(flow.ordered for flow in self.base.inputs)


@dataclass(frozen=True)
class UnionPlan:
    node: str
    inputs: tuple[Flow, ...]


@dataclass(frozen=True)
class KeyedPlan:
    """A step Spark runs per key; ``inputs``: (side, flow)."""

    node: str
    inputs: tuple[tuple[int, Flow], ...]
    step: KeyedStep


@dataclass(frozen=True)
class TaskPlan:
    """A step Spark runs per task; ``inputs``: (side, flow)."""

    node: str
    inputs: tuple[tuple[int, Flow], ...]
    step: TaskStep

    @property
    def processing_time_timers(self) -> bool:
        return bool(self.step.wall_clock_punctuations)


@dataclass(frozen=True)
class SinkPlan:
    node: str
    topic: str
    input: Flow


@dataclass(frozen=True)
class SubtopologyPlan:
    """One query of a chained plan: a sub-topology run per task (``SubtopologyStep``),
    reading ``topics`` (in the step's source order) and writing ``writes``, external topics
    and internal ones alike."""

    step: SubtopologyStep
    topics: tuple[str, ...]
    writes: tuple[str, ...]

    @property
    def name(self) -> str:
        return f"subtopology-{self.step.subtopology}"

    def record_errors(self, policies: Any, bootstrap_servers: str) -> RecordErrors:
        return RecordErrors(policies, bootstrap_servers, self.topics, tuple(node for _, node in self.step.sources))

    def positions(self, errors: RecordErrors) -> FlowRun:
        """What gives its raw source rows their positions (``ORDERED_ROWS``), bytes unchanged."""
        raw = ShippedSerde(Bytes())
        sources = {topic: index for index, topic in enumerate(self.topics)}
        return FlowRun(raw, raw, None, (), raw, raw, sources=sources, errors=errors, subtopology=self.step.subtopology)


@dataclass(frozen=True)
class SparkPlan:
    topology: Topology
    #: The topics the app reads from other systems (a chained plan also reads its own
    #: internal topics).
    source_topics: tuple[str, ...]
    #: Fused plans: one query per sink.
    sinks: tuple[SinkPlan, ...]
    stateful_nodes: tuple[str, ...] = field(default=())
    #: Where this app's results on Spark may differ from a worker's, and why.
    warnings: tuple[str, ...] = field(default=())
    #: The source node reading each of ``source_topics``.
    source_nodes: tuple[str, ...] = field(default=())
    #: Chained plans: one query per sub-topology, in the order a backfill runs them.
    chained: tuple[SubtopologyPlan, ...] = field(default=())
    #: Chained plans: internal topics a query writes for one that runs before it in a
    #: backfill's round (a foreign-key join's responses): while they grow, another round runs.
    feedback_topics: tuple[str, ...] = field(default=())

    @property
    def repartition_topics_of_tasks(self) -> tuple[str, ...]:
        """Repartition topics whose partition count the task steps need."""
        topics: list[str] = []
        for sink in self.sinks:
            for plan in _stateful_plans(sink.input):
                if isinstance(plan, TaskPlan):
                    topics.extend(flow.repartition_topic for _, flow in plan.inputs if flow.repartition_topic)
        return tuple(dict.fromkeys(topics))


# -- compile: topology -> plan ----------------------------------------------------------------------


def _shipped(node: NodeBase, serde: Any) -> ShippedSerde:
    if isinstance(serde, ShippedSerde):
        return serde
    if serde_recipe(serde) is None:
        import pickle

        try:
            pickle.dumps(serde)
        except Exception as error:
            raise _unsupported(node, f"its serde {serde.name!r} cannot be shipped to Spark workers ({error})") from None
    return ShippedSerde(serde)


ShippedNode = TypeVar("ShippedNode", bound=NodeBase)


def _shipped_node(node: ShippedNode) -> ShippedNode:
    """The node with serdes that survive pickling, for the kernels on Spark's workers."""
    key, value = _shipped(node, node.key_serde), _shipped(node, node.value_serde)
    return dataclasses.replace(node, key_serde=key, value_serde=value)


def _shipped_store(node: NodeBase, store: Store) -> Store:
    key, value = _shipped(node, store.key_serde), _shipped(node, store.value_serde)
    return dataclasses.replace(store, key_serde=key, value_serde=value)


class _Compilation:
    """Walks the topology parents first, building each node's flow or plan; one method per
    node kind, chosen by ``plan``."""

    def __init__(self, topology: Topology, topics_matching: Callable[[str], list[str]] | None) -> None:
        self.topology = topology
        self.topics_matching = topics_matching
        self.flows: dict[str, Flow] = {}
        self.sinks: list[SinkPlan] = []
        self.source_topics: list[str] = []
        self.source_nodes: dict[str, str] = {}
        self.stateful: list[str] = []
        self.repartition_flows: dict[str, Flow] = {}
        self.warnings: list[str] = []

    # -- helpers ----------------------------------------------------------------------------

    def parent_flow(self, node: Node) -> Flow:
        (parent,) = node.parents
        if parent not in self.flows:
            kind = self.topology.nodes[parent].kind
            raise _unsupported(node, f"it reads {parent!r} ({kind}), which only feeds its join")
        return self.flows[parent]

    def then(self, node: Node, flow: Flow, steps: tuple[Node, ...] = ()) -> Flow:
        """``flow`` continued by ``steps``, serialized with ``node``'s serdes. After a merge the
        steps run on each of the merge's inputs (they are per record: the same outcome), so
        every ``mapInArrow`` starts at a source and numbers its rows in order."""
        return _with_serdes(flow, _shipped(node, node.key_serde), _shipped(node, node.value_serde), steps)

    def set_flow(self, node: Node, flow: Flow) -> None:
        self.flows[node.name] = flow

    # -- one method per kind ----------------------------------------------------------------

    def source(self, node: SourceNode | TableSourceNode) -> None:
        if isinstance(node, SourceNode) and node.internal:
            topic = node.topics[0]
            if topic not in self.repartition_flows:
                raise _unsupported(node, f"no repartition sink writes {node.topics}")
            # Spark shuffles by key itself: the repartition topic is only a change of serdes.
            flow = self.then(node, self.repartition_flows[topic])
            self.set_flow(node, dataclasses.replace(flow, repartition_topic=topic))
            return
        if isinstance(node, TableSourceNode) and self.topology.stores[node.store].history_ms is not None:
            raise _unsupported(node, "a versioned table (versioned=) keeps a history per key, which only a per-task query holds")
        topics = _source_topic_list(node, self.topics_matching)
        self.source_topics.extend(t for t in topics if t not in self.source_topics)
        self.source_nodes.update((t, node.name) for t in topics)
        key, value = _shipped(node, node.key_serde), _shipped(node, node.value_serde)
        base = SourcePlan(node.name, tuple(topics))
        self.set_flow(node, Flow(base, key, value, (), key, value, timestamp_extractor=node.timestamp_extractor))

    def stateless(self, node: Node) -> None:
        self.set_flow(node, self.then(node, self.parent_flow(node), (_shipped_node(node),)))

    def pass_through(self, node: Node) -> None:
        self.set_flow(node, self.then(node, self.parent_flow(node)))

    def branch_output(self, node: BranchOutputNode) -> None:
        (branch_name,) = node.parents
        branch = self.topology.nodes[branch_name]
        self.set_flow(node, self.then(node, self.flows[branch_name], (_shipped_node(branch), _shipped_node(node))))

    def merge(self, node: MergeNode) -> None:
        if any(isinstance(self.topology.nodes[p], StreamStreamJoinNode) for p in node.parents):
            self.stream_stream_join(node)
            return
        key, value = _shipped(node, node.key_serde), _shipped(node, node.value_serde)
        inputs = tuple(_with_serdes(self.flows[p], key, value) for p in node.parents)
        self.set_flow(node, Flow(UnionPlan(node.name, inputs), key, value, (), key, value))

    def aggregation(self, node: CountNode | AggregateNode | ReduceNode) -> None:
        flow = self.parent_flow(node)
        store = _shipped_store(node, self.topology.stores[node.store])
        shipped = _shipped_node(node)
        out_key, out_value = _shipped(node, node.key_serde), _shipped(node, node.value_serde)
        inputs = {0: (shipped, flow.key_serde, flow.value_serde)}
        if node.window is None:
            step = KeyedStep(self.topology.app_id, node.subtopology, store, inputs, shipped, out_key, out_value)
            plan: KeyedPlan | TaskPlan = KeyedPlan(node.name, ((0, flow),), step)
        else:
            self.warn_if_repartitioned(node, flow)
            stores = tuple(_shipped_store(node, self.topology.stores[name]) for name in node.stores)
            # Emit-final: the kernel forwards each closed window itself; the store's changes are
            # not output.
            table = None if node.emits_final else shipped
            task_step = TaskStep(self.topology.app_id, node.subtopology, inputs, stores, out_key, out_value, table=table)
            plan = TaskPlan(node.name, ((0, flow),), task_step)
        self.stateful.append(node.name)
        self.set_flow(node, Flow(plan, out_key, out_value, (), out_key, out_value))

    def cogroup_input(self, node: CogroupAggregateNode) -> None:
        # Compiled at the COGROUP node, which needs every input's flow.
        for child in node.children:
            if not isinstance(self.topology.nodes[child], CogroupNode):
                raise _unsupported(node, f"one input of a cogroup feeds {child!r}, not the cogroup's table")

    def cogroup(self, node: CogroupNode) -> None:
        """Every input's rows, each side through its own aggregator's kernel, into the one
        store: per key without a window (as a plain aggregation), per task with one."""
        topology = self.topology
        store = _shipped_store(node, topology.stores[node.store])
        out_key, out_value = _shipped(node, node.key_serde), _shipped(node, node.value_serde)
        flows = []
        inputs = {}
        for side, step_name in enumerate(node.parents):
            step = topology.nodes[step_name]
            flow = self.parent_flow(step)
            flows.append((side, flow))
            inputs[side] = (_shipped_node(step), flow.key_serde, flow.value_serde)
        table = _shipped_node(node)
        plan: KeyedPlan | TaskPlan
        if node.window is None:
            plan = KeyedPlan(node.name, tuple(flows), KeyedStep(topology.app_id, node.subtopology, store, inputs, table, out_key, out_value))
        else:
            for _, flow in flows:
                self.warn_if_repartitioned(node, flow)
            plan = TaskPlan(node.name, tuple(flows), TaskStep(topology.app_id, node.subtopology, inputs, (store,), out_key, out_value, table=table))
        self.stateful.append(node.name)
        self.set_flow(node, Flow(plan, out_key, out_value, (), out_key, out_value))

    def stream_table_join(self, node: StreamTableJoinNode) -> None:
        # The table read: a topic's table, or steps computed on read from one (node.table_view,
        # which the join's kernel applies to each row it looks up).
        table_node = self.topology.nodes[self.topology.stores[node.table_store].owner]
        if not isinstance(table_node, TableSourceNode):
            raise _unsupported(
                node,
                f"it joins table {node.table!r}, kept by {table_node.name!r} ({table_node.kind}); on Spark the table side must be "
                "read from a topic (a computed table would be a second stateful step in one query)",
            )
        if node.grace_ms is not None:
            raise _unsupported(node, "a stream-table join with a grace period buffers records per task, which only a per-task query holds")
        store = _shipped_store(node, self.topology.stores[node.table_store])
        key, table_value = _shipped(node, store.key_serde), _shipped(node, store.value_serde)  # shipped already
        stream_flow = self.parent_flow(node)
        stream = _with_serdes(stream_flow, key, stream_flow.value_serde)
        table = _with_serdes(self.flows[table_node.name], key, table_value)
        out_key, out_value = _shipped(node, node.key_serde), _shipped(node, node.value_serde)
        inputs: dict[int, tuple[Node, ShippedSerde, ShippedSerde]] = {
            TABLE_SIDE: (_shipped_node(table_node), key, table_value),
            STREAM_SIDE: (_shipped_node(node), key, stream.value_serde),
        }
        step = KeyedStep(self.topology.app_id, node.subtopology, store, inputs, None, out_key, out_value)
        plan = KeyedPlan(node.name, ((TABLE_SIDE, table), (STREAM_SIDE, stream)), step)
        self.stateful.append(node.name)
        self.set_flow(node, Flow(plan, out_key, out_value, (), out_key, out_value))

    def stream_stream_side(self, node: StreamStreamJoinNode) -> None:
        # Compiled at the MERGE node that carries the join's name (both sides are needed).
        for child in node.children:
            if not isinstance(self.topology.nodes[child], MergeNode):
                raise _unsupported(node, f"one side of a stream-stream join feeds {child!r}, not the join's merge")

    def stream_stream_join(self, merge: MergeNode) -> None:
        topology = self.topology
        sides = {side_node.side: side_node for p in merge.parents if isinstance(side_node := topology.nodes[p], StreamStreamJoinNode)}
        if len(merge.parents) != 2 or set(sides) != {JoinSide.LEFT, JoinSide.RIGHT}:
            raise _unsupported(merge, "it merges stream-stream join sides with other streams")
        left, right = sides[JoinSide.LEFT], sides[JoinSide.RIGHT]
        flows = {LEFT_SIDE: self.parent_flow(left), RIGHT_SIDE: self.parent_flow(right)}
        for flow in flows.values():
            self.warn_if_repartitioned(merge, flow)
        stores = tuple(_shipped_store(left, topology.stores[name]) for name in left.stores)
        inputs = {
            LEFT_SIDE: (_shipped_node(left), flows[LEFT_SIDE].key_serde, flows[LEFT_SIDE].value_serde),
            RIGHT_SIDE: (_shipped_node(right), flows[RIGHT_SIDE].key_serde, flows[RIGHT_SIDE].value_serde),
        }
        out_key, out_value = _shipped(merge, merge.key_serde), _shipped(merge, merge.value_serde)
        step = TaskStep(topology.app_id, left.subtopology, inputs, stores, out_key, out_value)
        plan = TaskPlan(merge.name, tuple(flows.items()), step)
        self.stateful.append(merge.name)
        self.set_flow(merge, Flow(plan, out_key, out_value, (), out_key, out_value))

    def processor(self, node: ProcessorNode) -> None:
        flow = self.parent_flow(node)
        if not isinstance(flow.base, SourcePlan) or flow.repartition_topic is not None:
            raise _unsupported(
                node,
                "its input is not read straight from a source topic; Spark keeps a processor's stores per source "
                "partition (the worker's task), which a repartition or a stateful step upstream would change",
            )
        stores = []
        for name in node.stores:
            store = self.topology.stores[name]
            if store.owner != node.name:
                raise _unsupported(node, f"it reads store {name!r} of node {store.owner!r}; Spark state is private to one operator")
            if store.kind is not StoreKind.KEY_VALUE:
                raise _unsupported(node, f"its store {name!r} is a {store.kind} store; only key-value stores map onto Spark state")
            stores.append(_shipped_store(node, store))
        # The processor's task sees every source record (each moves stream time), so its input
        # is the raw source; the stateless steps before it run inside the task.
        raw = Flow(flow.base, flow.base_key, flow.base_value, (), flow.base_key, flow.base_value)
        assert isinstance(flow.base, SourcePlan)
        run = ProcessorRun(flow.base_key, flow.base_value, flow.timestamp_extractor, flow.steps, (), flow.base.node)
        out_key, out_value = _shipped(node, node.key_serde), _shipped(node, node.value_serde)
        inputs = {0: (_shipped_node(node), flow.key_serde, flow.value_serde)}
        step = TaskStep(self.topology.app_id, node.subtopology, inputs, tuple(stores), out_key, out_value, processor=run)
        plan = TaskPlan(node.name, ((0, raw),), step)
        self.stateful.append(node.name)
        self.set_flow(node, Flow(plan, out_key, out_value, (), out_key, out_value))

    def suppress(self, node: SuppressNode) -> None:
        (parent,) = node.parents
        raise _unsupported(
            node,
            f"it buffers the updates of table {parent!r}, a stateful step of its own, and Spark runs one arbitrary-state "
            "step per query; for one result per window use emit='final' on the windowed aggregation, which Spark runs",
        )

    def sink(self, node: SinkNode) -> None:
        flow = self.then(node, self.parent_flow(node))
        if node.internal:
            self.repartition_flows[node.topic] = flow
        else:
            self.sinks.append(SinkPlan(node.name, node.topic, flow))

    def warn_if_repartitioned(self, node: Node, flow: Flow) -> None:
        if flow.repartition_topic is not None:
            self.warnings.append(
                f"node {node.name!r}: its input goes through repartition topic {flow.repartition_topic!r}; where "
                "several upstream tasks write it, a worker judges lateness by the order their records happen to "
                "arrive there, Spark merges them by timestamp (records late only by that order may be kept on one "
                "runtime and dropped on the other)"
            )

    def plan(self, node: Node) -> None:
        match node:
            case SourceNode() | TableSourceNode():
                self.source(node)
            case MapNode() | MapValuesNode() | FlatMapNode() | FlatMapValuesNode() | FilterNode() | PeekNode() | SelectKeyNode():
                self.stateless(node)
            case BranchNode() | ToStreamNode():
                self.pass_through(node)  # a branch: each output adds the branch's routing
            case BranchOutputNode():
                self.branch_output(node)
            case MergeNode():
                self.merge(node)
            case CogroupAggregateNode():
                self.cogroup_input(node)
            case CountNode() | AggregateNode() | ReduceNode():
                self.aggregation(node)
            case CogroupNode():
                self.cogroup(node)
            case StreamTableJoinNode():
                self.stream_table_join(node)
            case StreamStreamJoinNode():
                self.stream_stream_side(node)
            case ProcessorNode():
                self.processor(node)
            case SuppressNode():
                self.suppress(node)
            case TableFilterNode(store=None) | TableMapValuesNode(store=None):
                # Computed on read: per update a stateless step of the table's update flow (and
                # a lookup through it applies it to the row it reads).
                self.stateless(node)
            case (
                TableFilterNode()
                | TableMapValuesNode()
                | TableJoinSideNode()
                | TableJoinNode()
                | TableGroupByNode()
                | TableAggregateNode()
                | FkSubscribeNode()
                | FkSubscriptionsNode()
                | FkForeignUpdateNode()
                | FkJoinNode()
            ):
                raise _unsupported(
                    node,
                    "a materialized filter or map_values (store=), a table's group_by, a table-table or foreign-key join does not "
                    "compile to Spark yet (a table on Spark is read from its topic by the stream-table join that uses it); run this app on workers",
                )
            case StreamGlobalJoinNode():
                raise _unsupported(node, "a join with a global table needs the whole table in every task, which only a per-task query holds")
            case SinkNode():
                self.sink(node)
            case RepartitionNode():
                raise _unsupported(node, "a declared repartition is the builder's to expand")

    # -- the whole topology ------------------------------------------------------------------

    def run(self) -> SparkPlan:
        for node in _in_dependency_order(self.topology):
            self.plan(node)
        for sink in self.sinks:
            stateful_steps = _stateful_steps_feeding(sink.input)
            if len(stateful_steps) > 1:
                node = self.topology.nodes[stateful_steps[1]]
                raise _unsupported(
                    node,
                    f"it consumes the output of stateful step {stateful_steps[0]!r} on the way to sink {sink.node!r}; "
                    "Spark runs one arbitrary-state step per query",
                )
        if not self.sinks:
            app_id = self.topology.app_id
            raise SparkCompileError(f"topology {app_id!r} writes no topic: nothing for a Spark query to do")
        topics = tuple(self.source_topics)
        sinks = tuple(_with_topic_index(sink, topics) for sink in self.sinks)
        for warning in dict.fromkeys(self.warnings):
            log.warning("Spark: %s", warning)
        return SparkPlan(self.topology, topics, sinks, tuple(self.stateful), tuple(dict.fromkeys(self.warnings)), tuple(self.source_nodes[t] for t in topics))


def compile_topology(topology: Topology, *, topics_matching: Callable[[str], list[str]] | None = None, per_subtopology: bool = False) -> SparkPlan:
    """Check every node and build the plan. ``topics_matching(pattern)`` expands pattern
    sources (the cluster's topics that fully match); without it, pattern sources fail.

    The fused plan (one query per sink, stateless steps vectorized, plain aggregations per
    key) when the topology fits it; else, or with ``per_subtopology``, the chained plan (one
    query per sub-topology, each run per task as a worker runs it, chained through the app's
    internal topics). What neither runs raises the chained compile's reason."""
    if per_subtopology:
        return _compile_chained(topology, topics_matching)
    try:
        return _Compilation(topology, topics_matching).run()
    except SparkCompileError as fused_refusal:
        log.debug("not one query per sink (%s): one query per sub-topology", fused_refusal)
    return _compile_chained(topology, topics_matching)


#: Why a chained plan's results may differ from a worker's, beyond what every Spark job has.
CHAINED_WARNING = (
    "the app runs as one query per sub-topology, chained through its internal topics: a query that fails and "
    "repeats a micro-batch writes that batch's rows to an internal topic again (Spark's Kafka sink is at-least-once), "
    "which an aggregation downstream counts twice"
)


def _compile_chained(topology: Topology, topics_matching: Callable[[str], list[str]] | None) -> SparkPlan:
    """One ``SubtopologyPlan`` per sub-topology; refuses what the Spark state cannot hold."""
    if not topology.sink_topics:
        raise SparkCompileError(f"topology {topology.app_id!r} writes no topic: nothing for a Spark query to do")
    internal = set(topology.internal_topics)
    external: dict[str, str] = {}  # topic -> its source node
    plans = []
    for sub in topology.subtopologies:
        sources: list[tuple[str, str]] = []
        for name in sub.source_nodes:
            node = topology.source(name)
            for topic in _source_topic_list(node, topics_matching):
                sources.append((topic, name))
                if topic not in internal:
                    external.setdefault(topic, name)
        stores = tuple(topology.stores[name] for name in sub.stores)
        nodes = tuple(topology.nodes[name] for name in sub.nodes)
        for node in nodes:
            _shipped(node, node.key_serde), _shipped(node, node.value_serde)  # refuses a serde that cannot travel
        global_tables = [topology.global_tables[name] for name in dict.fromkeys(n.global_table for n in nodes if isinstance(n, StreamGlobalJoinNode))]
        for table in global_tables:
            if table.topic in {topic for topic, _ in sources}:
                raise _unsupported(nodes[0], f"it reads topic {table.topic!r} both as a stream and as global table {table.name!r}")
        global_sources = tuple((table.topic, table.name) for table in global_tables)
        stores += tuple(table.store for table in global_tables)
        step = SubtopologyStep(topology.app_id, sub.id, nodes, stores, tuple(sources), global_sources)
        topics = tuple(topic for topic, _ in (*sources, *global_sources))
        plans.append(SubtopologyPlan(step, topics, tuple(sub.sink_topics)))
        external.update((table.topic, table.name) for table in global_tables)
    ordered, feedback = _round_order(plans, internal)
    stateful = tuple(name for plan in ordered for name in (s.owner for s in plan.step.stores))
    log.warning("Spark: %s", CHAINED_WARNING)
    return SparkPlan(
        topology,
        tuple(external),
        (),
        stateful_nodes=tuple(dict.fromkeys(stateful)),
        warnings=(CHAINED_WARNING,),
        source_nodes=tuple(external.values()),
        chained=tuple(ordered),
        feedback_topics=feedback,
    )


def _round_order(plans: list[SubtopologyPlan], internal: set[str]) -> tuple[list[SubtopologyPlan], tuple[str, ...]]:
    """The queries in the order a backfill round runs them — every writer of an internal
    topic before its readers, where the topics allow (a foreign-key join's run both ways) —
    and the internal topics written for a query that ran earlier in the round."""
    writers = {topic: plan for plan in plans for topic in plan.writes if topic in internal}
    remaining = list(plans)
    ordered: list[SubtopologyPlan] = []

    def ready(plan: SubtopologyPlan, done: set[int]) -> bool:
        return all(id(writers[t]) in done for t in plan.topics if t in writers and writers[t] is not plan)

    while remaining:
        done = {id(plan) for plan in ordered}
        chosen = next((plan for plan in remaining if ready(plan, done)), remaining[0])  # a cycle: the lowest id first
        ordered.append(chosen)
        remaining.remove(chosen)
    position = {id(plan): index for index, plan in enumerate(ordered)}
    feedback = [topic for topic, writer in writers.items() for reader in ordered if topic in reader.topics and position[id(reader)] <= position[id(writer)]]
    return ordered, tuple(dict.fromkeys(feedback))


def _source_topic_list(node: SourceNode | TableSourceNode, topics_matching: Callable[[str], list[str]] | None) -> list[str]:
    """The topics a source node reads: its named ones, or its pattern's matches now."""
    if isinstance(node, SourceNode) and node.pattern is not None:
        if topics_matching is None:
            raise _unsupported(node, f"pattern source {node.pattern!r} needs the cluster's topic list")
        topics = topics_matching(node.pattern)
        if not topics:
            raise _unsupported(node, f"no topic matches the pattern {node.pattern!r}")
        return topics
    return list(node.topics)


def _with_serdes(flow: Flow, key: ShippedSerde, value: ShippedSerde, steps: tuple[Node, ...] = ()) -> Flow:
    """``flow`` continued by ``steps`` and serialized with ``key``/``value``; over a union,
    each of its inputs is."""
    if isinstance(flow.base, UnionPlan):
        union = UnionPlan(flow.base.node, tuple(_with_serdes(f, key, value, steps) for f in flow.base.inputs))
        return Flow(union, key, value, (), key, value)
    return dataclasses.replace(flow, steps=flow.steps + steps, key_serde=key, value_serde=value)


def _same_serdes(flow: Flow) -> bool:
    """The flow's rows leave as they came: no step, no change of serdes."""
    return flow.base_key.name == flow.key_serde.name and flow.base_value.name == flow.value_serde.name


def _with_topic_index(sink: SinkPlan, topics: tuple[str, ...]) -> SinkPlan:
    """Processor steps need the ``source`` column's topics; known once every source is."""

    def fix(flow: Flow) -> Flow:
        base = flow.base
        if isinstance(base, UnionPlan):
            return dataclasses.replace(flow, base=dataclasses.replace(base, inputs=tuple(fix(f) for f in base.inputs)))
        if isinstance(base, TaskPlan) and base.step.processor is not None:
            run = dataclasses.replace(base.step.processor, topics=topics)
            step = dataclasses.replace(base.step, processor=run)
            return dataclasses.replace(flow, base=dataclasses.replace(base, step=step))
        return flow

    return dataclasses.replace(sink, input=fix(sink.input))


def _stateful_plans(flow: Flow) -> Iterator[KeyedPlan | TaskPlan]:
    base = flow.base
    if isinstance(base, UnionPlan):
        for flow_in in base.inputs:
            yield from _stateful_plans(flow_in)
    elif isinstance(base, KeyedPlan | TaskPlan):
        for _, flow_in in base.inputs:
            yield from _stateful_plans(flow_in)
        yield base


def _stateful_steps_feeding(flow: Flow) -> list[str]:
    """Stateful nodes (aggregations, joins, processors) upstream of ``flow``, upstream first."""
    return [plan.node for plan in _stateful_plans(flow)]


def _in_dependency_order(topology: Topology) -> list[Node]:
    """Parents first; a repartition source after the sink writing its topic."""
    writers = {n.topic: n.name for n in topology.nodes.values() if isinstance(n, SinkNode) and n.internal}
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
        if isinstance(node, SourceNode) and node.internal:
            for topic in node.topics:
                if topic in writers:
                    visit(writers[topic])
        ordered.append(node)

    for name in topology.nodes:
        visit(name)
    return ordered


# -- build: plan -> Spark DataFrames ----------------------------------------------------------------


def _user_objects(node: Node) -> tuple[Any, ...]:
    """The user's functions, values and types a node holds (its fields, and the types its
    serdes build)."""
    values = [getattr(node, f.name) for f in dataclasses.fields(node)]
    types = [getattr(value, "struct_type", None) for value in values if isinstance(value, Serde)]
    return tuple(value for value in (*values, *types) if value is not None)


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
        for thing in _user_objects(node)
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


class _Builder:
    """Builds one query's DataFrames from its plan. ``partition_counts`` sizes the repartition
    topics that task steps group by."""

    def __init__(
        self,
        spark: Any,
        bootstrap_servers: str,
        source_format: str,
        plan: SparkPlan,
        partition_counts: Mapping[str, int],
        *,
        backfill: bool = False,
        fail_on_data_loss: bool = True,
    ) -> None:
        self.fail_on_data_loss = fail_on_data_loss
        self.spark = spark
        self.bootstrap_servers = bootstrap_servers
        self.source_format = source_format
        self.sources = {topic: index for index, topic in enumerate(plan.source_topics)}
        self.partition_counts = partition_counts
        self.backfill = backfill
        self._built: dict[int, Any] = {}
        self.topology = plan.topology
        self.errors = RecordErrors(plan.topology.errors, bootstrap_servers, plan.source_topics, plan.source_nodes)

    def source(self, plan: SourcePlan) -> Any:
        """``key, value, ts, topic, partition, offset`` rows of the plan's topics."""
        from pyspark.sql import functions as F

        if id(plan) not in self._built:
            options = source_options(self.source_format, self.bootstrap_servers, plan.topics, fail_on_data_loss=self.fail_on_data_loss)
            raw = self.spark.readStream.format(self.source_format).options(**options).load()
            ts = F.unix_millis("timestamp") if self.source_format == "kafka" else F.col("timestamp")
            self._built[id(plan)] = raw.select("key", "value", ts.alias("ts"), "topic", F.col("partition").cast("int").alias("partition"), "offset")
        return self._built[id(plan)]

    def rows(self, flow: Flow, *, task_partitions: int | None = None, lane: int = 0) -> Any:
        """The flow's rows: ``ORDERED_ROWS`` if it is read from sources, else ``ROWS``."""
        base = flow.base
        if isinstance(base, UnionPlan):
            ordered = flow.ordered
            frames = [self.rows(f, task_partitions=task_partitions, lane=lane + index) for index, f in enumerate(base.inputs)]
            if not ordered:
                frames = [frame.select("key", "value", "ts") for frame in frames]
            union = frames[0]
            for frame in frames[1:]:
                union = union.unionByName(frame)
            return union
        source_node = base.node if isinstance(base, SourcePlan) else None
        run = FlowRun(
            flow.base_key,
            flow.base_value,
            flow.timestamp_extractor,
            flow.steps,
            flow.key_serde,
            flow.value_serde,
            from_source=isinstance(base, SourcePlan),
            sources=self.sources,
            task_partitions=task_partitions,
            lane=lane,
            errors=self.errors,
            source_node=source_node,
            subtopology=self.topology.nodes[source_node or base.node].subtopology,
        )
        if isinstance(base, SourcePlan):
            return self.source(base).mapInArrow(functools.partial(run_flow, run=run), ORDERED_ROWS)
        stateful = self.stateful(base)
        if not flow.steps and _same_serdes(flow):
            return stateful
        return stateful.mapInArrow(functools.partial(run_flow, run=run), ROWS)

    def stateful(self, plan: KeyedPlan | TaskPlan) -> Any:
        if id(plan) not in self._built:
            self._built[id(plan)] = self.keyed(plan) if isinstance(plan, KeyedPlan) else self.task(plan)
        return self._built[id(plan)]

    def _inputs(self, inputs: tuple[tuple[int, Flow], ...], columns: tuple[str, ...], *, by_task: bool) -> Any:
        """The inputs' rows as one frame of ``columns``, each row's ``origin`` saying its side."""
        from pyspark.sql import functions as F

        frames = []
        for side, flow in inputs:
            task_partitions = None
            if by_task and flow.repartition_topic is not None:
                task_partitions = self.partition_counts[flow.repartition_topic]
            rows = self.rows(flow, task_partitions=task_partitions)
            frames.append(rows.withColumn("origin", F.col("origin") + F.lit(side_offset(side))).select(*columns))
        rows = frames[0]
        for frame in frames[1:]:
            rows = rows.unionByName(frame)
        return rows

    def keyed(self, plan: KeyedPlan) -> Any:
        from pyspark.sql.streaming.state import GroupStateTimeout

        # No row for a null key, in a table or an aggregation (the kernels skip them too).
        rows = self._inputs(plan.inputs, KEYED_COLUMNS, by_task=False).where("key IS NOT NULL")
        step = dataclasses.replace(plan.step, errors=self.errors)
        return rows.groupBy("key").applyInPandasWithState(keyed_update(step), ROWS, KEYED_STATE_SCHEMA, "update", GroupStateTimeout.NoTimeout)

    def task(self, plan: TaskPlan) -> Any:
        columns = PROCESSOR_COLUMNS if plan.step.processor is not None else TASK_COLUMNS
        rows = self._inputs(plan.inputs, columns, by_task=True)
        if plan.step.processor is None:
            rows = rows.where("key IS NOT NULL")  # windows and joins skip null keys
        # The same time mode either way, so streaming runs and backfills share a checkpoint.
        time_mode = "ProcessingTime" if plan.processing_time_timers else "None"
        step = dataclasses.replace(plan.step, wall_clock_timers=not self.backfill, errors=self.errors)
        return rows.groupBy("task").transformWithStateInPandas(task_operator(step), ROWS, "Update", time_mode)


def cluster_partition_counts(bootstrap_servers: str, topology: Topology) -> dict[str, int]:
    """Partition counts of the cluster's topics and of the app's internal topics (as a worker
    would create them), which task steps behind a repartition group by."""
    return dict(_resolved_against(bootstrap_servers, topology).partitions)


def _resolved_against(bootstrap_servers: str, topology: Topology) -> Any:
    from pystreams.cluster import ClusterMetadata
    from pystreams.topology.resolve import resolve

    with ClusterMetadata(bootstrap_servers) as cluster:
        counts = {name: meta.num_partitions for name, meta in cluster.fetch_topics().items()}
    return resolve(topology, counts)


# -- the query ------------------------------------------------------------------------------------


def send_rows(
    producer: Any,
    rows: Iterable[tuple[str, bytes | None, bytes | None, int | None]],
    partitioner: Callable[[bytes, int], int] | Mapping[str, Callable[[bytes, int], int]] | None,
) -> None:
    """Send (topic, key, value, timestamp) rows; a keyed row goes to ``partitioner``'s partition
    (one for every topic, or one per topic) when there is one (a windowed sink's), else where
    the producer's default puts it."""
    per_topic = partitioner if isinstance(partitioner, Mapping) else None
    for topic, key, value, ts in rows:
        partition = None
        place = per_topic.get(topic) if per_topic is not None else partitioner
        if place is not None and key is not None:
            partition = place(key, len(producer.partitions_for(topic)))  # type: ignore[operator]
        producer.send(topic, key=key, value=value, partition=partition, timestamp_ms=ts if ts is not None and ts >= 0 else None)


def _write_batch_to_kafka(
    bootstrap_servers: str,
    partitioner: Callable[[bytes, int], int] | Mapping[str, Callable[[bytes, int], int]] | None = None,
    on_written: Callable[[dict[str, int]], None] | None = None,
) -> Callable[[Any, int], None]:
    """Each micro-batch's rows to Kafka; a key's partition is ``partitioner``'s (the sink's:
    ``kernels.sink_partitioner``, the worker's rule; or one per topic) or the producer's
    default. ``on_written`` hears how many rows each topic got."""

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
        written: dict[str, int] = {}
        try:
            for batch in batches:
                columns = [batch.column(i).to_pylist() for i in range(4)]
                send_rows(producer, zip(*columns, strict=True), partitioner)
                for topic in columns[0]:
                    written[topic] = written.get(topic, 0) + 1
            # Spark marks the batch done when foreachBatch returns: everything must be acked.
            producer.flush()
        finally:
            producer.close()
        yield pa.RecordBatch.from_pydict(
            {"topic": list(written), "written": list(written.values())}, schema=pa.schema([("topic", pa.string()), ("written", pa.int64())])
        )

    def write(batch: Any, batch_id: int) -> None:
        written = {row[0]: row[1] for row in batch.mapInArrow(produce, "topic string, written long").groupBy("topic").sum("written").collect()}
        log.debug("batch %s: records written %s", batch_id, written)
        if on_written is not None:
            on_written(written)

    return write


def source_options(source_format: str, bootstrap_servers: str, topics: Iterable[str], *, fail_on_data_loss: bool = True) -> dict[str, str]:
    """The reader options for ``source_format``: Spark's connector (``kafka``) reads every
    topic from the earliest offset, as a new worker group does; ours takes the same. Both take
    Spark's ``failOnDataLoss``."""
    topic_list = ",".join(topics)
    data_loss = {FAIL_ON_DATA_LOSS: str(fail_on_data_loss).lower()}
    if source_format == "kafka":
        return {"kafka.bootstrap.servers": bootstrap_servers, "subscribe": topic_list, "startingOffsets": "earliest", **data_loss}
    return {"bootstrap.servers": bootstrap_servers, "topics": topic_list, **data_loss}


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
    operator per query), or per sub-topology for a chained plan, each checkpointed in its own
    sub-directory of the checkpoint."""

    plan: SparkPlan
    spark: Any
    #: backfill? -> sink node name -> its query, configured but not started (a backfill's
    #: have no wall-clock timers: they would keep it running)
    build_writers: Callable[[bool], dict[str, Any]]
    queries: list[Any] = field(default_factory=list)
    #: Chained plans: rows written to each topic by the queries of the current round.
    written: dict[str, int] = field(default_factory=dict)
    #: Chained backfills: how many rounds the last one ran.
    rounds: int = 0

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
            if self.plan.chained:
                self._backfill_in_rounds()
            else:
                for writer in self.build_writers(True).values():
                    self.queries.append(writer.trigger(availableNow=True).start())
        finally:
            if previous is None:
                self.spark.conf.unset(NO_DATA_BATCHES_CONF)
            else:
                self.spark.conf.set(NO_DATA_BATCHES_CONF, previous)
        return self.queries

    def _backfill_in_rounds(self) -> None:
        """Each query in turn up to the offsets there are when it starts, the writers of
        internal topics before their readers, so one round takes every input through the
        chain; while a query wrote to a topic another one read before (a foreign-key join's
        responses), another round runs the queries with rows left to read. Raises the first
        query's failure."""
        reads = {sub.name: set(sub.topics) for sub in self.plan.chained}
        unread: dict[str, set[str]] = {name: set() for name in reads}  # written since it last ran
        for self.rounds in range(1, MAX_BACKFILL_ROUNDS + 1):
            for name, writer in self.build_writers(True).items():
                if self.rounds > 1 and not unread[name] & reads[name]:
                    continue
                self.written.clear()
                started = time.monotonic()
                query = writer.trigger(availableNow=True).start()
                self.queries.append(query)
                query.awaitTermination()
                log.info("backfill round %d: %s wrote %s in %.1f s", self.rounds, name, dict(self.written) or "nothing", time.monotonic() - started)
                unread[name].clear()
                fed = {topic for topic, count in self.written.items() if count}
                for topics in unread.values():
                    topics.update(fed)
            if not any(unread[name] & reads[name] for name in reads):
                return
        raise RuntimeError(f"the backfill still fed its internal topics {self.plan.feedback_topics} after {MAX_BACKFILL_ROUNDS} rounds")

    def _count_written(self, written: Mapping[str, int]) -> None:
        for topic, count in written.items():
            self.written[topic] = self.written.get(topic, 0) + count

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
    fail_on_data_loss: bool = True,
    per_subtopology: bool = False,
) -> SparkJob:
    """Compile ``app`` (a pystreams ``App`` or a ``Topology``) into streaming queries on
    ``spark``; ``job.start()`` runs them (``available_now=True``: a backfill that ends).

    ``checkpoint`` holds the source offsets and the aggregation state: restarting with the same
    directory resumes exactly where the last completed micro-batch ended — unless its offsets do
    not fit the cluster's logs, which fails the query (``fail_on_data_loss``, Spark's
    ``failOnDataLoss``; False warns and reads on as Spark's Kafka source would).
    ``per_subtopology``: one query per sub-topology even where one per sink would do.
    """
    from pathlib import Path

    from pyspark.sql import functions as F

    topology = app if isinstance(app, Topology) else app.topology()
    topology.errors.check()
    plan = compile_topology(topology, topics_matching=cluster_pattern_matcher(bootstrap_servers), per_subtopology=per_subtopology)
    _ship_app_modules(spark, topology)
    source_format = source_format or choose_source_format(spark)
    counts = cluster_partition_counts(bootstrap_servers, topology) if plan.repartition_topics_of_tasks else {}

    if plan.chained:
        # Resolved once: every round of a backfill builds its queries with the same task counts.
        task_counts = _create_internal_topics(bootstrap_servers, topology)
        job = SparkJob(
            plan, spark, lambda backfill: _chained_writers(job, source_format, checkpoint, backfill, fail_on_data_loss, bootstrap_servers, task_counts)
        )
        return job

    def writers(backfill: bool) -> dict[str, Any]:
        built = {}
        for sink in plan.sinks:
            # A fresh builder per query: queries must not share DataFrames of stateful steps.
            builder = _Builder(spark, bootstrap_servers, source_format, plan, counts, backfill=backfill, fail_on_data_loss=fail_on_data_loss)
            rows = builder.rows(sink.input)
            built[sink.node] = (
                rows.select(F.lit(sink.topic).alias("topic"), "key", "value", "ts")
                .writeStream.queryName(f"pystreams-{topology.app_id}-{sink.node}")
                .foreachBatch(_write_batch_to_kafka(bootstrap_servers, sink_partitioner(topology.nodes[sink.node])))
                # Update mode: aggregations emit each changed key once per batch; stateless rows pass.
                .outputMode("update")
                .option("checkpointLocation", str(Path(checkpoint) / sink.node))
            )
        return built

    return SparkJob(plan, spark, writers)


def _to_every_task(rows: Any, first_global_source: int, tasks: int) -> Any:
    """A global table's rows (source index ``first_global_source`` and up) copied to each of
    ``tasks`` tasks and ordered before the batch's other rows: every task holds the whole
    table, current before it joins a record of the same micro-batch (a worker restores its
    global tables before its tasks start)."""
    from pyspark.sql import functions as F

    source = F.shiftright(F.col("origin"), SOURCE_SHIFT).bitwiseAND(SOURCE_MASK)
    table_rows = (
        rows.where(source >= first_global_source)
        .withColumn("task", F.explode(F.sequence(F.lit(0), F.lit(tasks - 1))))
        .withColumn("arrival", F.lit(GLOBAL_ARRIVAL).cast("long"))
    )
    return rows.where(source < first_global_source).unionByName(table_rows)


#: A chained backfill gives up after this many rounds (each round runs every query once).
MAX_BACKFILL_ROUNDS = 50


def _create_internal_topics(bootstrap_servers: str, topology: Topology) -> Mapping[int, int]:
    """The internal topics a chained plan's queries write and read, as workers create them
    (same names and partition counts); changelogs are not needed: Spark keeps the state.
    Returns the task count of each sub-topology."""
    from pystreams.cluster import ClusterMetadata, TopicSpec
    from pystreams.topology.ir import TopicRole

    resolved = _resolved_against(bootstrap_servers, topology)
    specs = [TopicSpec(t.name, t.partitions, configs=dict(t.config)) for t in resolved.topics_to_create() if t.role is TopicRole.REPARTITION]
    if specs:
        with ClusterMetadata(bootstrap_servers) as cluster:
            cluster.ensure_topics(specs)
    return resolved.task_counts


def _chained_writers(
    job: SparkJob, source_format: str, checkpoint: str, backfill: bool, fail_on_data_loss: bool, bootstrap_servers: str, task_counts: Mapping[int, int]
) -> dict[str, Any]:
    """A chained plan's queries, configured but not started, in round order: each reads its
    sub-topology's topics raw (rows keep their positions), runs per task
    (``transformWithStateInPandas`` over ``SubtopologyStep``) and writes every row to its
    topic, a windowed sink's keys placed as the worker places them."""
    from pathlib import Path

    from pyspark.sql import functions as F

    from .operators import ORDERED_ROWS, task_operator

    plan, spark = job.plan, job.spark
    topology = plan.topology
    partitioners = {node.topic: place for node in topology.nodes.values() if isinstance(node, SinkNode) and (place := sink_partitioner(node)) is not None}
    built: dict[str, Any] = {}
    for sub in plan.chained:
        errors = sub.record_errors(topology.errors, bootstrap_servers)
        options = source_options(source_format, bootstrap_servers, sub.topics, fail_on_data_loss=fail_on_data_loss)
        raw = spark.readStream.format(source_format).options(**options).load()
        ts = F.unix_millis("timestamp") if source_format == "kafka" else F.col("timestamp")
        raw = raw.select("key", "value", ts.alias("ts"), "topic", F.col("partition").cast("int").alias("partition"), "offset")
        rows = raw.mapInArrow(functools.partial(run_flow, run=sub.positions(errors)), ORDERED_ROWS)
        if sub.step.global_sources:
            rows = _to_every_task(rows, len(sub.step.sources), task_counts[sub.step.subtopology])
        step = dataclasses.replace(sub.step, wall_clock_timers=not backfill, errors=errors)
        # The same time mode either way, so streaming runs and backfills share a checkpoint.
        time_mode = "ProcessingTime" if step.wall_clock_punctuations else "None"
        out = rows.groupBy("task").transformWithStateInPandas(task_operator(step), TOPIC_ROWS, "Update", time_mode)
        built[sub.name] = (
            out.writeStream.queryName(f"pystreams-{topology.app_id}-{sub.name}")
            .foreachBatch(_write_batch_to_kafka(bootstrap_servers, partitioners, job._count_written))
            .outputMode("update")
            .option("checkpointLocation", str(Path(checkpoint) / sub.name))
        )
    return built
