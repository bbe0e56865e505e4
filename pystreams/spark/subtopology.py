"""A whole sub-topology per task on Spark, as a worker runs its task.

What the compiler's *chained* plan runs (``compiler``): one streaming query per sub-topology,
reading its source topics — external ones and the internal topics other sub-topologies write
(repartition, foreign-key subscription and response topics) — and writing its sinks, external
and internal, so the queries chain through the same topics the workers use. Inside the query,
rows are grouped by task (the partition number), and each task's micro-batch goes through the
sub-topology's node graph wired from the kernels (``node_emit``) exactly as the worker wires it
(``pystreams.worker.processing``): records flow depth-first from the source step to the sinks;
a materialized table's changes go downstream when its store flushes, at the end of the
micro-batch (the worker's commit); every store lives in Spark state (``pystreams.spark.state``).

So every operator the workers run compiles, tables and joins included, with the worker's rules:
there is no second implementation of an operator here, only the wiring.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pystreams.topology.ir import BranchOutputNode, MergeNode, Node, PunctuationType, SinkNode, SourceNode, Store, TableSourceNode
from pystreams.topology.kernels import (
    Emit,
    ErrorKind,
    NodeFailure,
    fan_out,
    guard,
    node_emit,
    node_routes,
    table_output_store,
)
from pystreams.topology.source_step import SourceStep, source_step

from .operators import (
    PROCESSOR_COLUMNS,
    _OpenTask,
    flushed_changes,
    origin_parts,
    table_records,
    wall_clock_punctuations,
)
from .record_errors import RecordErrors
from .state import MapBackend, TaskClocks

#: A row a sub-topology writes: its topic, key bytes, value bytes (None: a tombstone), timestamp.
TopicRow = tuple[str, bytes | None, bytes | None, int]
TOPIC_ROWS = "topic string, key binary, value binary, ts long"
#: Kinds whose emit only moves records on: no work to guard (as on the worker).
_PASS_THROUGH = (SourceNode, MergeNode, BranchOutputNode)
#: Flush rounds at the end of a batch: a table's flushed changes may write a downstream table,
#: whose flush is the next round. A sub-topology has fewer tables than this.
_MAX_FLUSH_ROUNDS = 1000


@dataclass(frozen=True)
class SubtopologyStep:
    """One sub-topology, run per task: its nodes in processing order (parents first), its
    stores, and, by source index (the ``origin`` of a row), the topic read and its source
    node."""

    app_id: str
    subtopology: int
    nodes: tuple[Node, ...]
    stores: tuple[Store, ...]
    sources: tuple[tuple[str, str], ...]
    #: Global tables its joins read: (topic, store), by source index after ``sources``. Every
    #: task keeps the whole table in its state: each of the topic's rows reaches every task.
    global_sources: tuple[tuple[str, str], ...] = ()
    #: False in backfills: wall-clock punctuations neither run nor get scheduled.
    wall_clock_timers: bool = True
    errors: RecordErrors = field(default_factory=RecordErrors)

    @property
    def wall_clock_punctuations(self) -> tuple[tuple[str, int], ...]:
        return wall_clock_punctuations(self.nodes)

    @property
    def columns(self) -> tuple[str, ...]:
        return PROCESSOR_COLUMNS  # raw source rows with their positions

    def open(self, partition: int, backends: Mapping[str, MapBackend], state: TaskClocks) -> _OpenSubtopology:
        return _OpenSubtopology(self, partition, backends, state)

    def rows_frame(self, rows: list[TopicRow]) -> Any:
        import pandas as pd

        return pd.DataFrame({"topic": [r[0] for r in rows], "key": [r[1] for r in rows], "value": [r[2] for r in rows], "ts": [r[3] for r in rows]})


class _OpenSubtopology(_OpenTask):
    """One task of a sub-topology opened over its Spark state for one micro-batch (or timer):
    the worker's task graph, with sinks that collect rows."""

    step: SubtopologyStep

    def __init__(self, step: SubtopologyStep, partition: int, backends: Mapping[str, MapBackend], state: TaskClocks) -> None:
        self._open(step, partition, backends, state)
        position, specs = self.position, self.specs
        self.out: list[Any] = []
        #: Table stores whose flushed changes go to their owner's children: store -> forward.
        self.forwards: dict[str, Callable[[list[Any]], None]] = {}
        nodes = {node.name: node for node in step.nodes}
        emits: dict[str, Emit] = {}
        for node in reversed(step.nodes):  # children first
            child_nodes = [nodes[child] for child in node.children if child in nodes]
            children = fan_out([emits[child.name] for child in child_nodes])
            if isinstance(node, SinkNode):
                emit = self._sink(node)
            else:
                emit = node_emit(node, self._wiring(node, children, node_routes(node, child_nodes, emits)))
            output_store = table_output_store(node, specs)
            if output_store is not None and child_nodes:
                self.forwards[output_store] = self._table_forward(node, specs[output_store], guard(node.name, children))
            emits[node.name] = emit if isinstance(node, _PASS_THROUGH) else guard(node.name, emit)
        self.processors.reverse()  # init and punctuate in processing order, as the worker does
        self._start_processors()
        stream_punctuations = [p for p in self.punctuations if p.punctuation.type is PunctuationType.STREAM_TIME]
        self.source_steps: list[SourceStep] = []
        for _, name in step.sources:
            source = nodes[name]
            assert isinstance(source, SourceNode | TableSourceNode)
            self.source_steps.append(
                source_step(
                    name,
                    source.key_serde.deserialize,
                    source.value_serde.deserialize,
                    source.timestamp_extractor,
                    emits[name],
                    position,
                    failed=self._record_failed,
                    stream_punctuations=stream_punctuations,
                    fire=self._fire,
                )
            )
        for _, store_name in step.global_sources:
            self.source_steps.append(_global_table_update(self.stores[store_name]))

    def _sink(self, node: SinkNode) -> Emit:
        topic, out = node.topic, self.out
        key_bytes, value_bytes = node.key_serde.serialize, node.value_serde.serialize

        def sink(key: Any, value: Any, timestamp: int) -> None:
            out.append((topic, key_bytes(key), value_bytes(value), timestamp))

        return sink

    def _table_forward(self, node: Node, spec: Store, children: Emit) -> Callable[[list[Any]], None]:
        """A table's flushed changes, deserialized, to its children (the worker's forwarder)."""
        key_of, value_of = spec.key_serde.deserialize, node.value_serde.deserialize
        position, errors = self.position, self.step.errors

        def forward(changes: list[Any]) -> None:
            stream_time = -1 if position.stream_time is None else position.stream_time
            for key, value, timestamp in table_records(node, key_of, changes, stream_time):
                try:
                    children(key, value_of(value), timestamp)
                except NodeFailure as failure:  # no source record to dead-letter: report it
                    errors.failed(ErrorKind.PROCESSING, failure.error, task=str(position.task_id), node=failure.node)

        return forward

    def _record_failed(self, kind: ErrorKind, node: str | None, error: BaseException, _record: Any, key: Any, value: Any, _timestamp: int) -> None:
        position = self.position
        self.step.errors.failed(
            kind, error, task=str(position.task_id), node=node, topic=position.topic, partition=position.partition, offset=position.offset, key=key, value=value
        )

    def process(self, frame: Any) -> None:
        """Raw source rows, in worker order, each through its source's step."""
        position, steps = self.position, self.source_steps
        topics = [topic for topic, _ in (*self.step.sources, *self.step.global_sources)]
        for key_bytes, value_bytes, raw_ts, origin, offset in zip(frame["key"], frame["value"], frame["ts"], frame["origin"], frame["offset"], strict=True):
            _, source, partition = origin_parts(int(origin))
            position.topic, position.partition, position.offset = topics[source], partition, int(offset)
            steps[source](key_bytes, value_bytes, int(raw_ts), None)

    def finish(self) -> tuple[TaskClocks, list[Any]]:
        """Flush the stores as a worker's commit does: each table's changes go to its
        children, which may change a table downstream, flushed in the next round."""
        # In processing order (they were wired children first): an upstream table's changes
        # reach a downstream one before that one flushes, so it emits once per batch.
        forwards = dict(reversed(self.forwards.items()))
        for _ in range(_MAX_FLUSH_ROUNDS):
            pending = [name for name in forwards if self.stores[name].has_changes]
            if not pending:
                break
            for name in pending:
                forwards[name](flushed_changes(self.stores[name]))
        for store in self.stores.values():
            if store.has_changes:
                flushed_changes(store)
        return self._kept_state(), self.out


def _global_table_update(store: Any) -> SourceStep:
    """A global table's topic is its changelog: a row's bytes are applied as written (a null
    value deletes, a null key is skipped), moving no stream time, as a worker's global thread
    applies them."""
    put = store.put

    def update(key: Any, value: Any, _timestamp: int, _record: Any) -> None:
        if key is not None:
            put(key, value)

    return update
