"""What Spark's operators run: the node kernels (``pystreams.topology.kernels``) in Spark's
calling conventions.

* ``run_flow`` — inside ``mapInArrow``: a chain of stateless kernels over the records of one
  source partition (or of a stateful step's output), serialized back to rows. Rows read from
  a source carry their *position* (see ``ORDER_COLUMNS``) so that stateful steps can replay
  them in the worker's order.
* ``keyed_update`` — inside ``applyInPandasWithState``, grouped by key: the nodes whose state
  is one value per key and which no stream time affects (a plain aggregation, a stream–table
  join), over a one-key store in the group's state.
* ``TaskRunner`` / ``task_operator`` — inside ``transformWithStateInPandas``, grouped by task
  (the partition number a worker task reads): windowed and session aggregations, windowed
  stream–stream joins and processors, whose outcome depends on stream time. The task's
  stores live in Spark state (``pystreams.spark.state``) and its stream times in a value
  state, so lateness is judged per task, record by record, exactly as on a worker — not by
  Spark's watermark, which is global and moves per micro-batch.

``TaskRunner`` and the functions under ``keyed_*`` and ``run_flow`` need no Spark: the tests
drive them with dict-backed state to check them against the test driver.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from pystreams.topology.ir import (
    AggregationNode,
    BranchNode,
    BranchOutputNode,
    CogroupNode,
    Node,
    ProcessorNode,
    PunctuationType,
    Store,
    StoreKind,
    TaskId,
    window_of,
)
from pystreams.topology.kernels import (
    Emit,
    ErrorKind,
    NodeClock,
    NodeFailure,
    NodeWiring,
    ProcessorInstance,
    ScheduledPunctuation,
    TaskPosition,
    drop,
    fixed_window_key,
    guard,
    node_emit,
    partition_for_key,
    source_timestamp,
    windowed_result,
)
from pystreams.topology.source_step import source_step
from pystreams.topology.stores import typed
from pystreams.topology.windows import HoppingWindow, SessionWindow, SlidingWindow, TumblingWindow, Windowed

from .record_errors import RecordErrors
from .serdes import ShippedSerde
from .state import (
    STORE_FORMAT,
    GroupKeyStore,
    MapBackend,
    SparkKeyValueStore,
    SparkSessionStore,
    SparkTimestampedKeyValueStore,
    SparkTimestampedWindowStore,
    SparkVersionedStore,
    SparkWindowStore,
    TaskClocks,
    needs_sweep,
)

#: A row a step emits: key bytes, value bytes (None: a tombstone), timestamp.
OutputRow = tuple[bytes | None, bytes | None, int]
ROWS = "key binary, value binary, ts long"
#: A per-key step's state: its one row and the row's timestamp (None: not known). Before
#: rows kept their timestamps it was "value binary": Spark refuses such a checkpoint's state.
KEYED_STATE_SCHEMA = "value binary, timestamp long"
#: Rows of a flow read from a source: the record's position, so stateful steps can replay a
#: micro-batch in the worker's order, and the task (partition number) it belongs to.
ORDERED_ROWS = ROWS + ", arrival long, origin long, seq long, offset long, task int"
#: The order a stateful step applies its rows in, within a micro-batch — the order a worker's
#: task processes them: each input partition in offset order, partitions merged by timestamp
#: within a poll. ``arrival``: the highest source timestamp of the row's partition so far in
#: the batch (what merging by timestamp amounts to); ``origin``: its input (``side``: a table
#: before the stream it feeds, a join's left before its right, on equal arrival), source topic
#: and partition; ``seq``: the source record's index in the batch, then the merge input it
#: took (``lane``), then its place among the records that source record became.
ORDER_COLUMNS = ("arrival", "origin", "seq")
#: Join inputs say which side a row is from.
TABLE_SIDE, STREAM_SIDE = 0, 1
LEFT_SIDE, RIGHT_SIDE = 0, 1
# The bit layout of ``origin`` (side, 24 bits of source topic index, 16 of partition) and of
# ``seq`` (record index, 4 bits of merge input, 20 of place: a record that becomes more than a
# million rows keeps the order of the first million).
_SIDE_SHIFT, _SOURCE_SHIFT, _SOURCE_MASK, _PARTITION_MASK = 40, 16, (1 << 24) - 1, (1 << 16) - 1
SOURCE_SHIFT, SOURCE_MASK = _SOURCE_SHIFT, _SOURCE_MASK
#: The ``arrival`` of a global table's rows: before every record of the batch.
GLOBAL_ARRIVAL = -(2**62)
_RECORD_SHIFT, _LANE_SHIFT, _MAX_OUTPUT_INDEX = 24, 20, (1 << 20) - 1


def side_offset(side: int) -> int:
    """What a side adds to ``origin``."""
    return side << _SIDE_SHIFT


def origin_parts(origin: int) -> tuple[int, int, int]:
    """(side, source, partition) of an ``origin``."""
    return origin >> _SIDE_SHIFT, (origin >> _SOURCE_SHIFT) & _SOURCE_MASK, origin & _PARTITION_MASK


def chain(steps: Iterable[Node], forward: Emit) -> Emit:
    """The stateless kernels of ``steps`` (in order), ending in ``forward``; an exception in
    one of them is a ``NodeFailure`` naming it."""
    emit = forward
    steps = list(steps)
    for index in range(len(steps) - 1, -1, -1):
        node = steps[index]
        if isinstance(node, BranchOutputNode):
            continue  # the branch before it routes
        routes: dict[str, Emit] = {}
        if isinstance(node, BranchNode):
            following = steps[index + 1] if index + 1 < len(steps) else None
            assert isinstance(following, BranchOutputNode), f"branch {node.name!r} must be followed by one output"
            routes = {label: (emit if label == following.label else drop) for label in node.branches}
        emit = guard(node.name, node_emit(node, NodeWiring(node=node, forward=emit, routes=routes)))
    return emit


# ============================================================================ stateless flows


@dataclass(frozen=True)
class FlowRun:
    """How ``run_flow`` turns input rows into output rows."""

    base_key: ShippedSerde
    base_value: ShippedSerde
    timestamp_extractor: Callable[[Any, Any, int], int] | None
    steps: tuple[Node, ...]
    key_serde: ShippedSerde
    value_serde: ShippedSerde
    #: Source rows (key, value, ts, topic, partition, offset) in; ``ORDERED_ROWS`` out. Else
    #: ``ROWS`` in and out.
    from_source: bool = True
    #: Source topic -> its index (the ``source`` column).
    sources: Mapping[str, int] | None = None
    #: The task of a row: its key's partition among this many (a repartition topic's), or,
    #: when None, the source partition it was read from.
    task_partitions: int | None = None
    lane: int = 0
    #: The error policies, and where the rows come from (their source node, its sub-topology).
    errors: RecordErrors = field(default_factory=RecordErrors)
    source_node: str | None = None
    subtopology: int = 0


def run_flow(batches: Iterator[Any], run: FlowRun) -> Iterator[Any]:
    """``mapInArrow``: the records of one Spark partition (one Kafka partition's slice of the
    batch, in offset order) through the stateless kernels."""
    import pyarrow as pa

    extractor = run.timestamp_extractor
    base_key: Callable[[Any], Any] = run.base_key.deserialize
    base_value: Callable[[Any], Any] = run.base_value.deserialize
    key_bytes: Callable[[Any], Any] = run.key_serde.serialize
    value_bytes: Callable[[Any], Any] = run.value_serde.serialize
    if not run.steps and extractor is None:
        # Rows only gain their positions (a processor's input): the bytes pass as they are.
        if run.base_key.name == run.key_serde.name:
            base_key = key_bytes = _same
        if run.base_value.name == run.value_serde.name:
            base_value = value_bytes = _same
    out_keys: list[bytes | None] = []
    out_values: list[bytes | None] = []
    out_stamps: list[int] = []

    def collect(key: Any, value: Any, timestamp: int) -> None:
        out_keys.append(key_bytes(key))
        out_values.append(value_bytes(value))
        out_stamps.append(timestamp)

    emit = chain(run.steps, collect)
    errors = run.errors
    if not run.from_source:
        # A stateful step's output: its records were forwarded, not read (no position).
        schema = pa.schema([("key", pa.binary()), ("value", pa.binary()), ("ts", pa.int64())])
        task = f"{run.subtopology}_-1"
        for batch in batches:
            out_keys.clear()
            out_values.clear()
            out_stamps.clear()
            columns = batch.column(0).to_pylist(), batch.column(1).to_pylist(), batch.column(2).to_pylist()
            for key, value, timestamp in zip(*columns, strict=True):
                try:
                    emit(base_key(key), base_value(value), timestamp)
                except NodeFailure as failure:
                    errors.failed(ErrorKind.PROCESSING, failure.error, task=task, node=failure.node)
                except Exception as error:  # the forwarded bytes do not deserialize
                    errors.failed(ErrorKind.DESERIALIZATION, error, task=task, node=None)
            yield pa.RecordBatch.from_arrays(
                [pa.array(out_keys, pa.binary()), pa.array(out_values, pa.binary()), pa.array(out_stamps, pa.int64())],
                schema=schema,
            )
        return

    import numpy as np
    import pyarrow.compute as pc

    # Where each output row came from: its source record's index in the Arrow batch, and its
    # place among the rows that record became.
    out_index: list[int] = []
    out_place: list[int] = []
    at = [0, 0]

    def collect_at(key: Any, value: Any, timestamp: int) -> None:
        out_keys.append(key_bytes(key))
        out_values.append(value_bytes(value))
        out_stamps.append(timestamp)
        out_index.append(at[0])
        out_place.append(at[1])
        at[1] += 1

    emit = chain(run.steps, collect_at)
    sources = run.sources or {}
    task_partitions = run.task_partitions
    arrival: Any = None  # the running maximum carries over from one Arrow batch to the next
    first_record = 0  # index of the batch's first record in this Spark partition
    lane = run.lane << _LANE_SHIFT
    for batch in batches:
        out_keys.clear()
        out_values.clear()
        out_stamps.clear()
        out_index.clear()
        out_place.clear()
        keys, values, stamps = (batch.column(i).to_pylist() for i in range(3))
        for index, (key, value, raw_ts) in enumerate(zip(keys, values, stamps, strict=True)):
            at[0], at[1] = index, 0
            try:
                record_key, record_value = base_key(key), base_value(value)
                timestamp = source_timestamp(extractor, record_key, record_value, raw_ts, node=run.source_node, position=None)
            except Exception as error:
                _source_row_failed(run, batch, index, ErrorKind.DESERIALIZATION, run.source_node, error, key, value)
                continue
            if timestamp is None:
                continue
            try:
                emit(record_key, record_value, timestamp)
            except NodeFailure as failure:
                _source_row_failed(run, batch, index, ErrorKind.PROCESSING, failure.node, failure.error, key, value)
        index_array = np.asarray(out_index, dtype=np.int64)
        taken = pa.array(index_array)
        if len(stamps):
            running = np.maximum.accumulate(batch.column(2).to_numpy())
            if arrival is not None:
                running = np.maximum(running, arrival)
            arrival = running[-1]
            arrivals = running[index_array]
        else:
            arrivals = np.zeros(0, dtype=np.int64)
        partitions = batch.column(4).take(taken)
        if len(stamps) and pc.max(batch.column(4)).as_py() > _PARTITION_MASK:
            raise ValueError(f"partition numbers above {_PARTITION_MASK} do not fit the Spark runtime's row positions")
        topics = batch.column(3)
        if len(stamps) and len(topics.unique()) == 1:  # one Kafka partition per Spark partition
            sources_of_rows: Any = sources[topics[0].as_py()]
        else:
            sources_of_rows = np.array([sources[topic] for topic in topics.take(taken).to_pylist()], dtype=np.int64)
        origins = sources_of_rows << _SOURCE_SHIFT | partitions.to_numpy().astype(np.int64)
        places = np.minimum(np.asarray(out_place, dtype=np.int64), _MAX_OUTPUT_INDEX)
        seqs = (index_array + first_record) << _RECORD_SHIFT | lane | places
        first_record += len(stamps)
        if task_partitions is None:
            tasks = partitions
        else:
            tasks = pa.array([0 if key is None else partition_for_key(key, task_partitions) for key in out_keys], pa.int32())
        yield pa.RecordBatch.from_arrays(
            [
                pa.array(out_keys, pa.binary()),
                pa.array(out_values, pa.binary()),
                pa.array(out_stamps, pa.int64()),
                pa.array(arrivals, pa.int64()),
                pa.array(np.asarray(origins, dtype=np.int64)),
                pa.array(seqs, pa.int64()),
                batch.column(5).take(taken),
                tasks,
            ],
            schema=ORDERED_SCHEMA,
        )
    errors.flush()


def _source_row_failed(
    run: FlowRun, batch: Any, index: int, kind: ErrorKind, node: str | None, error: BaseException, key: bytes | None, value: bytes | None
) -> None:
    """A source row (``topic, partition, offset`` in columns 3-5) failed: apply the policy."""
    partition = batch.column(4)[index].as_py()
    run.errors.failed(
        kind,
        error,
        task=f"{run.subtopology}_{partition}",
        node=node,
        topic=batch.column(3)[index].as_py(),
        partition=partition,
        offset=batch.column(5)[index].as_py(),
        key=key,
        value=value,
    )


def _same(data: Any) -> Any:
    return data


def _ordered_schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [
            ("key", pa.binary()),
            ("value", pa.binary()),
            ("ts", pa.int64()),
            ("arrival", pa.int64()),
            ("origin", pa.int64()),
            ("seq", pa.int64()),
            ("offset", pa.int64()),
            ("task", pa.int32()),
        ]
    )


ORDERED_SCHEMA = _ordered_schema()


def in_worker_order(frames: Iterable[Any], columns: Iterable[str]) -> dict[str, Any]:
    """``columns`` of the rows of one group in this micro-batch (they may come in several
    frames, in any order after a shuffle), sorted by ``ORDER_COLUMNS``."""
    import numpy as np
    import pandas as pd

    frames = list(frames)
    frame = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
    # One object array for the whole group: a pandas column costs tens of µs the first time it
    # is read, and a micro-batch has a group per key.
    rows = frame.to_numpy()
    at = {name: index for index, name in enumerate(frame.columns)}
    if len(rows) > 1:
        order = np.lexsort([rows[:, at[column]] for column in reversed(ORDER_COLUMNS)])
        if not (order[1:] > order[:-1]).all():
            rows = rows[order]
    return {name: rows[:, at[name]] for name in columns}


#: The columns each kind of step is given (``in_worker_order`` reads them); ``origin`` and
#: ``offset`` say where a failing row was read.
KEYED_COLUMNS = ("key", "value", "ts", "arrival", "origin", "seq", "offset")
TASK_COLUMNS = (*KEYED_COLUMNS, "task")
PROCESSOR_COLUMNS = TASK_COLUMNS


def _rows_frame(rows: list[OutputRow]) -> Any:
    import pandas as pd

    return pd.DataFrame({"key": [r[0] for r in rows], "value": [r[1] for r in rows], "ts": [r[2] for r in rows]})


# ============================================================================ per-key steps


@dataclass(frozen=True)
class KeyedStep:
    """A node Spark runs per key: its kernel (and, for a stream–table join, the table's) over
    a store that holds the group's one value. ``inputs``: per side, the node its rows feed and
    their serdes."""

    app_id: str
    subtopology: int
    store: Store
    inputs: Mapping[int, tuple[Node, ShippedSerde, ShippedSerde]]
    #: Aggregations and cogroups: the table node whose store is the output (else the
    #: forwards are).
    table: AggregationNode | CogroupNode | None
    out_key: ShippedSerde
    out_value: ShippedSerde
    errors: RecordErrors = field(default_factory=RecordErrors)


def keyed_batch(
    step: KeyedStep, key_bytes: bytes, frame: Any, stored: bytes | None, stored_timestamp: int | None = None
) -> tuple[GroupKeyStore, list[OutputRow]]:
    """One group's rows of one micro-batch (in worker order) through the kernels; the group's
    store after them, and the rows to emit."""
    store = GroupKeyStore(stored, stored_timestamp)
    out: list[OutputRow] = []
    key_out, value_out = step.out_key.serialize, step.out_value.serialize

    def collect(key: Any, value: Any, timestamp: int) -> None:
        out.append((key_out(key), value_out(value), timestamp))

    position = TaskPosition(step.app_id, TaskId(step.subtopology, -1))
    emits = {}
    for side, (node, key_serde, value_serde) in step.inputs.items():
        wiring = NodeWiring(node=node, forward=collect, stores={step.store.name: store}, specs={step.store.name: step.store}, position=position)
        emits[side] = (guard(node.name, node_emit(node, wiring)), key_serde.deserialize, value_serde.deserialize)
    errors = step.errors
    last_ts = -1
    for value_bytes, timestamp, origin, offset in zip(frame["value"], frame["ts"], frame["origin"], frame["offset"], strict=True):
        emit, key_of, value_of = emits[int(origin) >> _SIDE_SHIFT]
        timestamp = int(timestamp)
        try:
            # Bytes a source read, passed on unchanged when no step came between.
            key, value = key_of(key_bytes), value_of(value_bytes)
        except Exception as error:
            _row_failed(errors, step.subtopology, None, ErrorKind.DESERIALIZATION, None, error, origin, offset, key_bytes, value_bytes)
            continue
        try:
            emit(key, value, timestamp)
        except NodeFailure as failure:
            _row_failed(errors, step.subtopology, None, ErrorKind.PROCESSING, failure.node, failure.error, origin, offset, key_bytes, value_bytes)
            continue
        last_ts = max(last_ts, timestamp)
    if step.table is not None and store.changed:
        key_of_table = step.inputs[0][1].deserialize(key_bytes)
        # The row's own timestamp (the largest folded into it), as the worker's store forwards it.
        out.append((step.out_key.serialize(key_of_table), store.value, last_ts if store.timestamp is None else store.timestamp))
    return store, out


def _row_failed(
    errors: RecordErrors,
    subtopology: int,
    task_partition: int | None,
    kind: ErrorKind,
    node: str | None,
    error: BaseException,
    origin: Any,
    offset: Any,
    key: bytes | None,
    value: bytes | None,
) -> None:
    """A stateful step's row failed (``origin``, ``offset``: where it was read): apply the
    policy. A row that does not deserialize failed at its source (``node`` None)."""
    _, source, partition = origin_parts(int(origin))
    topic = errors.topics[source] if source < len(errors.topics) else None
    if node is None and source < len(errors.source_nodes):
        node = errors.source_nodes[source]
    errors.failed(
        kind,
        error,
        node=node,
        topic=topic,
        partition=partition,
        offset=int(offset),
        key=key,
        value=value,
        task=f"{subtopology}_{partition if task_partition is None else task_partition}",
    )


def keyed_update(step: KeyedStep) -> Callable[..., Iterator[Any]]:
    """``applyInPandasWithState``'s update function (state: the store's one value)."""

    def update(group_key: tuple[Any, ...], frames: Iterator[Any], state: Any) -> Iterator[Any]:
        stored, stored_timestamp = state.get if state.exists else (None, None)
        store, out = keyed_batch(step, group_key[0], in_worker_order(frames, KEYED_COLUMNS), stored, stored_timestamp)
        step.errors.flush()
        if store.changed:
            if store.value is None:
                if state.exists:
                    state.remove()
            else:
                state.update((store.value, store.timestamp))
        if out:
            yield _rows_frame(out)

    return update


# ============================================================================ per-task steps


@dataclass(frozen=True)
class ProcessorRun:
    """How a processor task turns raw source rows into the processor's input: deserialize,
    extract the timestamp (it moves stream time even for records the steps drop), run the
    stateless steps."""

    base_key: ShippedSerde
    base_value: ShippedSerde
    timestamp_extractor: Callable[[Any, Any, int], int] | None
    steps: tuple[Node, ...]
    #: The ``source`` column's topics, by index.
    topics: tuple[str, ...]
    #: The source node (whose deserialization policy applies).
    source_node: str | None = None


@dataclass(frozen=True)
class TaskStep:
    """A node (or a join's two side nodes) Spark runs per task, with the task's stores."""

    app_id: str
    subtopology: int
    #: side -> (node its rows feed, key serde, value serde of the rows).
    inputs: Mapping[int, tuple[Node, ShippedSerde, ShippedSerde]]
    stores: tuple[Store, ...]
    out_key: ShippedSerde
    out_value: ShippedSerde
    #: Windowed aggregations and cogroups: the table node whose store's changes are the output.
    table: AggregationNode | CogroupNode | None = None
    #: Processors: how raw source rows reach it (then ``inputs`` has one entry, the processor).
    processor: ProcessorRun | None = None
    #: False in backfills: wall-clock punctuations neither run nor get scheduled.
    wall_clock_timers: bool = True
    errors: RecordErrors = field(default_factory=RecordErrors)

    @property
    def wall_clock_punctuations(self) -> tuple[tuple[str, int], ...]:
        return wall_clock_punctuations([self.inputs[0][0]])

    @property
    def columns(self) -> tuple[str, ...]:
        """What the task is given of its rows (``in_worker_order`` reads them)."""
        return PROCESSOR_COLUMNS if self.processor is not None else TASK_COLUMNS

    def open(self, partition: int, backends: Mapping[str, MapBackend], state: TaskClocks) -> _OpenTask:
        return _OpenTask(self, partition, backends, state)

    def rows_frame(self, rows: list[OutputRow]) -> Any:
        return _rows_frame(rows)


def wall_clock_punctuations(nodes: Iterable[Node]) -> tuple[tuple[str, int], ...]:
    """The wall-clock punctuations of the processors among ``nodes``: (method, interval)."""
    return tuple(
        (p.method, p.interval_ms) for node in nodes if isinstance(node, ProcessorNode) for p in node.punctuations if p.type is PunctuationType.WALL_CLOCK_TIME
    )


def open_spark_stores(specs: Iterable[Store], backends: Mapping[str, MapBackend], state: TaskClocks, position: TaskPosition) -> dict[str, Any]:
    """A task's stores over their Spark state (``backends``), each as the worker would open it:
    key-value (timestamped for tables), window or session, with the retention and newest time
    ``state`` keeps for it."""
    stores: dict[str, Any] = {}
    for spec in specs:
        backend = backends[spec.name]
        if spec.kind is StoreKind.KEY_VALUE:
            if spec.history_ms is not None:
                stores[spec.name] = SparkVersionedStore(spec.name, backend, spec.history_ms)
                continue
            stores[spec.name] = SparkTimestampedKeyValueStore(spec.name, backend, position) if spec.timestamped else SparkKeyValueStore(spec.name, backend)
            continue
        retention = spec.retention_ms or (spec.window.retention_ms if spec.window is not None else 0)
        observed = state.store_times.get(spec.name)
        if spec.kind is StoreKind.SESSION:
            stores[spec.name] = SparkSessionStore(spec.name, backend, retention, observed)
        elif spec.timestamped:
            stores[spec.name] = SparkTimestampedWindowStore(spec.name, backend, retention, observed, position)
        else:
            stores[spec.name] = SparkWindowStore(spec.name, backend, retention, observed)
    return stores


def flushed_changes(store: Any) -> list[Any]:
    """A store's flushed changes, with each row's timestamp where the store keeps one."""
    timestamped = isinstance(store, SparkTimestampedWindowStore | SparkTimestampedKeyValueStore)
    return store.flush_timestamped() if timestamped else store.flush()


def table_records(
    table: Node | AggregationNode | CogroupNode, key_of: Callable[[Any], Any], changes: Iterable[Any], stream_time: int
) -> Iterator[tuple[Any, bytes | None, int]]:
    """A table's flushed changes as its records — key objects (``Windowed`` for a windowed
    table), value bytes (None: deleted, or a session merged away) and the timestamps the worker
    gives them (a row's own; a windowed row's by ``windowed_result``); ``stream_time`` for a
    change that carries none."""
    window = window_of(cast(Node, table))
    for change in changes:
        if window is None:
            key, value, *kept_timestamp = change
            timestamp = kept_timestamp[0] if kept_timestamp else None
            yield key_of(key), value, stream_time if timestamp is None else timestamp
            continue
        if isinstance(window, SessionWindow):
            key, start, end, stored = change
            windowed, kept = Windowed(key_of(key), start, end), None
        else:
            assert isinstance(window, TumblingWindow | HoppingWindow | SlidingWindow)
            key, start, stored, *kept_timestamp = change  # a timestamped store's changes carry it
            windowed, kept = fixed_window_key(window, key_of(key), start), (kept_timestamp[0] if kept_timestamp else None)
            end = start + window.size_ms
        value, timestamp = windowed_result(window, stored, end, kept)
        yield windowed, value, stream_time if timestamp is None else timestamp


class _OpenTask:
    """One task of a ``TaskStep`` opened over its state for one micro-batch (or timer)."""

    def __init__(self, step: TaskStep, partition: int, backends: Mapping[str, MapBackend], state: TaskClocks) -> None:
        self._open(step, partition, backends, state)
        self.out: list[OutputRow] = []
        key_out, value_out = step.out_key.serialize, step.out_value.serialize
        out = self.out

        def collect(key: Any, value: Any, timestamp: int) -> None:
            out.append((key_out(key), value_out(value), timestamp))

        self.emits: dict[int, tuple[Emit, Callable[[Any], Any], Callable[[Any], Any]]] = {}
        for side, (node, key_serde, value_serde) in step.inputs.items():
            wiring = self._wiring(node, collect)
            self.emits[side] = (guard(node.name, node_emit(node, wiring)), key_serde.deserialize, value_serde.deserialize)
        self._start_processors()

    def _wiring(self, node: Node, forward: Emit, routes: Mapping[str, Emit] | None = None) -> NodeWiring:
        """What ``node_emit`` needs to build ``node`` in this task."""
        return NodeWiring(
            node=node,
            forward=forward,
            routes=routes or {},
            stores=self.stores,
            specs=self.specs,
            typed_stores=self.typed_stores,
            position=self.position,
            processors=self.processors,
            clocks=self.clocks,
            shared=self.shared,
        )

    def _open(self, step: Any, partition: int, backends: Mapping[str, MapBackend], state: TaskClocks) -> None:
        """The task's position, stores (with their specs and typed views) and clocks over its
        state."""
        self.step = step
        self.state = state
        self.position = position = TaskPosition(step.app_id, TaskId(step.subtopology, partition))
        position.stream_time = state.stream_time
        self.stores = open_spark_stores(step.stores, backends, state, position)
        self.specs = specs = {spec.name: spec for spec in step.stores}
        self.typed_stores = {name: typed(store, specs[name]) for name, store in self.stores.items()}
        self.clocks = {name: NodeClock(observed) for name, observed in state.node_clocks.items()}
        self.processors: list[ProcessorInstance] = []
        self.shared: dict[str, Any] = {}  # what the task's nodes share (NodeWiring.shared)

    def _start_processors(self) -> None:
        """Schedule the processors' punctuations where the state left them, then ``init`` them."""
        self.punctuations: list[ScheduledPunctuation] = [p for proc in self.processors for p in proc.punctuations]
        for scheduled in self.punctuations:
            scheduled.next_due = self.state.due.get(scheduled.punctuation.method)
        for processor in self.processors:
            processor.init()

    def process(self, frame: Any) -> None:
        """Rows in worker order: for a processor raw source rows, else a node's input rows."""
        if self.step.processor is not None:
            self._process_source_rows(frame)
            return
        emits, step, partition = self.emits, self.step, self.position.task_id.partition
        for key_bytes, value_bytes, timestamp, origin, offset in zip(frame["key"], frame["value"], frame["ts"], frame["origin"], frame["offset"], strict=True):
            emit, key_of, value_of = emits[int(origin) >> _SIDE_SHIFT]
            try:
                # Bytes a source read, passed on unchanged when no step came between.
                key, value = key_of(key_bytes), value_of(value_bytes)
            except Exception as error:
                _row_failed(step.errors, step.subtopology, partition, ErrorKind.DESERIALIZATION, None, error, origin, offset, key_bytes, value_bytes)
                continue
            try:
                emit(key, value, int(timestamp))
            except NodeFailure as failure:
                _row_failed(step.errors, step.subtopology, partition, ErrorKind.PROCESSING, failure.node, failure.error, origin, offset, key_bytes, value_bytes)

    def _process_source_rows(self, frame: Any) -> None:
        run = self.step.processor
        assert run is not None
        position = self.position
        topics, errors, task = run.topics, self.step.errors, str(position.task_id)

        def failed(kind: ErrorKind, node: str | None, error: BaseException, _record: None, key_bytes: Any, value_bytes: Any, _timestamp: int) -> None:
            # The step runs with the position of the row it failed on (punctuations restore it).
            errors.failed(
                kind, error, task=task, node=node, topic=position.topic, partition=position.partition, offset=position.offset, key=key_bytes, value=value_bytes
            )

        step = source_step(
            run.source_node,
            run.base_key.deserialize,
            run.base_value.deserialize,
            run.timestamp_extractor,
            chain(run.steps, self.emits[0][0]),
            position,
            failed=failed,
            stream_punctuations=[p for p in self.punctuations if p.punctuation.type is PunctuationType.STREAM_TIME],
            fire=self._fire,
        )
        for key_bytes, value_bytes, raw_ts, origin, offset in zip(frame["key"], frame["value"], frame["ts"], frame["origin"], frame["offset"], strict=True):
            _, source, partition = origin_parts(int(origin))
            position.topic, position.partition, position.offset = topics[source], partition, int(offset)
            step(key_bytes, value_bytes, int(raw_ts), None)

    def _fire(self, scheduled: ScheduledPunctuation, now: int) -> None:
        try:
            scheduled.fire(now)
        except Exception as error:  # a punctuation reads no record: nothing to dead-letter
            self.step.errors.failed(ErrorKind.PROCESSING, error, task=str(self.position.task_id), node=scheduled.node)

    def fire_wall_clock(self, now_ms: int) -> list[int]:
        """Run the wall-clock punctuations due at ``now_ms``; returns when they are due next."""
        fired = []
        for scheduled in self.punctuations:
            if scheduled.punctuation.type is PunctuationType.WALL_CLOCK_TIME and scheduled.due(now_ms):
                self._fire(scheduled, now_ms)
                assert scheduled.next_due is not None
                fired.append(scheduled.next_due)
        return fired

    def schedule_wall_clock(self, now_ms: int) -> list[int]:
        """As the worker: a wall-clock punctuation's first check only schedules it; returns
        the due times newly scheduled (for timers)."""
        scheduled_now: list[int] = []
        for scheduled in self.punctuations:
            if scheduled.punctuation.type is PunctuationType.WALL_CLOCK_TIME and scheduled.next_due is None:
                scheduled.wall_clock_due(now_ms)
                assert scheduled.next_due is not None
                scheduled_now.append(scheduled.next_due)
        return scheduled_now

    def forget_wall_clock(self) -> None:
        """Backfills: unschedule wall-clock punctuations, so a later streaming run schedules
        them again."""
        for scheduled in self.punctuations:
            if scheduled.punctuation.type is PunctuationType.WALL_CLOCK_TIME:
                scheduled.next_due = None

    def finish(self) -> tuple[TaskClocks, list[OutputRow]]:
        """Flush the stores (a table's changes become output rows) and the state to keep."""
        step, out = self.step, self.out
        table = step.table
        for name, store in self.stores.items():
            changes = flushed_changes(store)
            if table is not None and name == table.store:
                out.extend(self._table_rows(table, changes))
        return self._kept_state(), out

    def _kept_state(self) -> TaskClocks:
        """The task's clocks after this batch (stores flushed), expired entries swept."""
        state = TaskClocks(
            store_format=STORE_FORMAT,
            stream_time=self.position.stream_time,
            node_clocks={name: clock.observed for name, clock in self.clocks.items()},
            store_times={
                name: store.observed_stream_time for name, store in self.stores.items() if not isinstance(store, SparkKeyValueStore | SparkVersionedStore)
            },
            swept_to=dict(self.state.swept_to),
            due={scheduled.punctuation.method: scheduled.next_due for scheduled in self.punctuations},
        )
        for name, store in self.stores.items():
            if isinstance(store, SparkKeyValueStore | SparkVersionedStore) or store.observed_stream_time is None:
                continue
            if needs_sweep(store, state.swept_to.get(name)):
                store.expire_untouched()
                state.swept_to[name] = store.min_live_time
        return state

    def _table_rows(self, table: AggregationNode | CogroupNode, changes: list[Any]) -> Iterator[OutputRow]:
        """A windowed table's flushed changes as its records (``table_records``). A deleted
        window's record has the stream time of the nodes writing the store."""
        key_of = self.step.inputs[0][1].deserialize
        out_key = self.step.out_key.serialize
        # The stream time of the nodes writing the store (a cogroup's inputs each have one).
        observed = [clock.observed for node, _, _ in self.step.inputs.values() if (clock := self.clocks.get(node.name)) and clock.observed is not None]
        for key, value, timestamp in table_records(table, key_of, changes, max(observed, default=-1)):
            yield out_key(key), value, timestamp


class TaskRunner:
    """Runs a ``TaskStep`` for one task over plain state: ``backends`` hold its stores,
    ``state`` the rest. Spark's operator (``task_operator``) and the tests call it alike."""

    def __init__(self, step: TaskStep | Any) -> None:
        """``step``: a ``TaskStep``, or any step that opens its tasks alike (``subtopology``)."""
        self.step = step
        #: What ``process`` reads of its rows (``in_worker_order``).
        self.columns = step.columns

    def process(
        self,
        partition: int,
        frame: Any,
        backends: Mapping[str, MapBackend],
        state: TaskClocks | None,
        now_ms: int,
    ) -> tuple[TaskClocks, list[OutputRow], list[int]]:
        """One micro-batch of the task's rows, in worker order. Returns the state to keep, the
        rows to emit and the wall-clock due times newly scheduled."""
        task = self.step.open(partition, backends, self._checked(state))
        task.process(frame)
        scheduled = self._wall_clock(task, now_ms)
        new_state, out = task.finish()
        return new_state, out, scheduled

    def on_timer(
        self, partition: int, backends: Mapping[str, MapBackend], state: TaskClocks | None, now_ms: int
    ) -> tuple[TaskClocks, list[OutputRow], list[int]]:
        """A processing-time timer: run the wall-clock punctuations due now."""
        task = self.step.open(partition, backends, self._checked(state))
        fired = task.fire_wall_clock(now_ms) if self.step.wall_clock_timers else []
        new_state, out = task.finish()
        return new_state, out, fired

    def _checked(self, state: TaskClocks | None) -> TaskClocks:
        """The task's state, or a new one; an older pystreams' state of table stores (rows
        without their timestamps) is refused: read as today's, its values would be garbage."""
        if state is None:
            return TaskClocks(store_format=STORE_FORMAT)
        if state.store_format < STORE_FORMAT and any(spec.timestamped for spec in self.step.stores):
            stores = ", ".join(spec.name for spec in self.step.stores if spec.timestamped)
            raise ValueError(
                f"the checkpoint's state of stores {stores} was written by an older pystreams, whose table rows kept no "
                "timestamps; run the job on a new checkpoint (--checkpoint), which recomputes the tables from the topics"
            )
        return state

    def _wall_clock(self, task: _OpenTask, now_ms: int) -> list[int]:
        if not self.step.wall_clock_punctuations:
            return []
        if not self.step.wall_clock_timers:
            task.forget_wall_clock()
            return []
        return task.schedule_wall_clock(now_ms)


class _MapStateBackend:
    """A store's ``MapState`` (key binary -> value binary) as a ``MapBackend``."""

    def __init__(self, map_state: Any) -> None:
        self.map_state = map_state

    def get(self, key: bytes) -> bytes | None:
        found = self.map_state.getValue((key,))
        return None if found is None else found[0]

    def put(self, key: bytes, value: bytes) -> None:
        self.map_state.updateValue((key,), (value,))

    def delete(self, key: bytes) -> None:
        self.map_state.removeKey((key,))

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        if not self.map_state.exists():
            return iter(())
        return ((key[0], value[0]) for key, value in self.map_state.iterator())


def task_operator(step: TaskStep | Any) -> Any:
    """A ``StatefulProcessor`` for ``transformWithStateInPandas`` grouped by ``task``: each
    store is a ``MapState`` of key bytes -> bytes, the ``TaskClocks`` one ``ValueState``;
    wall-clock punctuations are processing-time timers.

    The step travels pickled and is unpickled on first use: Spark also runs ``init`` in a
    driver-side Python process (to learn the state schemas) that cannot import the app's module."""
    import pickle

    from pyspark import cloudpickle
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    from .state import decode_task_clocks, encode_task_clocks

    pickled_step = cloudpickle.dumps(step)
    store_names = tuple(spec.name for spec in step.stores)
    backfill = not step.wall_clock_timers
    has_wall_clock = bool(step.wall_clock_punctuations)

    class TaskOperator(StatefulProcessor):
        def init(self, handle: Any) -> None:
            self.handle = handle
            self.backends = {
                name: _MapStateBackend(handle.getMapState(f"store{index}", "key binary", "value binary")) for index, name in enumerate(store_names)
            }
            self.task_state = handle.getValueState("task", "state binary")
            self._runner: TaskRunner | None = None

        @property
        def runner(self) -> TaskRunner:
            if self._runner is None:
                self._runner = TaskRunner(pickle.loads(pickled_step))
            return self._runner

        def _state(self) -> TaskClocks | None:
            return decode_task_clocks(self.task_state.get()[0]) if self.task_state.exists() else None

        def _finish(self, state: TaskClocks, out: list[Any], timers: list[int]) -> Iterator[Any]:
            if has_wall_clock and backfill:
                for timer in list(self.handle.listTimers()):  # left by a streaming run
                    self.handle.deleteTimer(timer)
            for due in timers:
                self.handle.registerTimer(due)
            self.task_state.update((encode_task_clocks(state),))
            if out:
                yield self.runner.step.rows_frame(out)

        def handleInputRows(self, key: tuple[Any, ...], rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
            now_ms = timerValues.getCurrentProcessingTimeInMs()
            state, out, timers = self.runner.process(int(key[0]), in_worker_order(rows, self.runner.columns), self.backends, self._state(), now_ms)
            self.runner.step.errors.flush()
            yield from self._finish(state, out, timers)

        def handleExpiredTimer(self, key: tuple[Any, ...], timerValues: Any, expiredTimerInfo: Any) -> Iterator[Any]:
            now_ms = timerValues.getCurrentProcessingTimeInMs()
            state, out, timers = self.runner.on_timer(int(key[0]), self.backends, self._state(), now_ms)
            self.runner.step.errors.flush()
            yield from self._finish(state, out, timers)

        def close(self) -> None:
            pass

    return TaskOperator()
