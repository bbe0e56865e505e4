"""Test-only: run a compiled Spark plan's operators the way Spark would, without Spark.

Each micro-batch: every source partition's slice goes through ``run_flow`` (as ``mapInArrow``
runs it per Spark partition), rows are grouped by key (``keyed_update``, with a stand-in for
Spark's ``GroupState``) or by task (``TaskRunner``, with dicts for its ``MapState``s), and
state persists across batches. What it leaves out is Spark's machinery (shuffles, checkpoints,
the sink), so the property tests can check the operators' semantics against the test driver
in milliseconds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd
import pyarrow as pa
from pystreams.topology.kernels import partition_for_key

from pystreams.spark.compiler import Flow, KeyedPlan, SourcePlan, SparkPlan, SubtopologyPlan, TaskPlan, UnionPlan, _same_serdes
from pystreams.spark.operators import (
    GLOBAL_ARRIVAL,
    KEYED_COLUMNS,
    ORDERED_SCHEMA,
    SOURCE_MASK,
    SOURCE_SHIFT,
    FlowRun,
    TaskRunner,
    in_worker_order,
    keyed_update,
    run_flow,
    side_offset,
)
from pystreams.spark.record_errors import RecordErrors
from pystreams.spark.state import TaskClocks

Row = tuple[bytes | None, bytes | None, int]


@dataclass(frozen=True)
class InputRecord:
    topic: str
    partition: int
    key: bytes | None
    value: bytes | None
    timestamp: int


class DictBackend:
    """A store's ``MapState`` as a dict."""

    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}

    def get(self, key: bytes) -> bytes | None:
        return self.data.get(key)

    def put(self, key: bytes, value: bytes) -> None:
        self.data[key] = value

    def delete(self, key: bytes) -> None:
        self.data.pop(key, None)

    def items(self) -> Iterable[tuple[bytes, bytes]]:
        return list(self.data.items())


class GroupState:
    """Spark's ``GroupState`` for one key of ``applyInPandasWithState`` (no timeouts)."""

    hasTimedOut = False

    def __init__(self, value: tuple[Any, ...] | None) -> None:
        self.value = value

    @property
    def exists(self) -> bool:
        return self.value is not None

    @property
    def get(self) -> tuple[Any, ...]:
        assert self.value is not None
        return self.value

    def update(self, value: tuple[Any, ...]) -> None:
        self.value = value

    def remove(self) -> None:
        self.value = None


class SparkEmulator:
    """Runs ``plan`` batch by batch. ``partition_counts``: every repartition topic a task step
    groups by (``resolve``'s counts)."""

    def __init__(self, plan: SparkPlan, partition_counts: Mapping[str, int], *, now_ms: int = 0, bootstrap_servers: str = "") -> None:
        self.plan = plan
        #: As the Spark job's builder makes them: the topology's error policies, dead letters
        #: written to ``bootstrap_servers``.
        self.errors = RecordErrors(plan.topology.errors, bootstrap_servers, plan.source_topics, plan.source_nodes)
        self.partition_counts = partition_counts
        self.now_ms = now_ms
        self.sources = {topic: index for index, topic in enumerate(plan.source_topics)}
        self._offsets: dict[tuple[str, int], int] = {}
        self._group_states: dict[tuple[str, bytes], tuple[Any, ...] | None] = {}
        self._task_states: dict[tuple[str, int], TaskClocks] = {}
        self._backends: dict[tuple[str, int, str], DictBackend] = {}

    def _slices(self, records: Iterable[InputRecord]) -> dict[tuple[str, int], list[tuple[InputRecord, int]]]:
        """Records by partition, each with its offset."""
        slices: dict[tuple[str, int], list[tuple[InputRecord, int]]] = {}
        for record in records:
            offset = self._offsets.get((record.topic, record.partition), 0)
            self._offsets[(record.topic, record.partition)] = offset + 1
            slices.setdefault((record.topic, record.partition), []).append((record, offset))
        return slices

    def run_batch(self, records: Iterable[InputRecord]) -> dict[str, list[Row]]:
        """One micro-batch: what each sink topic receives."""
        if self.plan.chained:
            return self._run_chained(list(records))
        batch = _Batch(self, self._slices(records))
        out: dict[str, list[Row]] = {}
        for sink in self.plan.sinks:
            frame = batch.rows(sink.input)
            out.setdefault(sink.topic, []).extend(zip(frame["key"], frame["value"], map(int, frame["ts"]), strict=True))
        return out

    def _run_chained(self, records: list[InputRecord]) -> dict[str, list[Row]]:
        """A micro-batch of every query of a chained plan, in round order, until the internal
        topics stop growing: what each external topic receives."""
        internal = set(self.plan.topology.internal_topics)
        out: dict[str, list[Row]] = {}
        pending = records
        while pending:
            for sub in self.plan.chained:
                mine = [r for r in pending if r.topic in sub.topics]
                pending = [r for r in pending if r.topic not in sub.topics]
                for topic, key, value, ts in self._run_subtopology(sub, mine):
                    if topic in internal:
                        partition = 0 if key is None else partition_for_key(key, self.partition_counts[topic])
                        pending.append(InputRecord(topic, partition, key, value, ts))
                    else:
                        out.setdefault(topic, []).append((key, value, ts))
        return out

    def _run_subtopology(self, sub: SubtopologyPlan, records: list[InputRecord]) -> list[tuple[str, bytes | None, bytes | None, int]]:
        if not records:
            return []
        errors = sub.record_errors(self.plan.topology.errors, "")
        run = sub.positions(errors)
        batches = [
            batch
            for (topic, partition), slice_ in sorted(self._slices(records).items())
            for batch in run_flow(iter([_source_batch(topic, partition, slice_)]), run)
        ]
        rows = _frame(batches)
        if sub.step.global_sources:
            # A global table's rows reach every task, before the batch's records (_to_every_task).
            first_global = len(sub.step.sources)
            is_global = ((rows["origin"].to_numpy(dtype="int64") >> SOURCE_SHIFT) & SOURCE_MASK) >= first_global
            tasks = max(self.partition_counts[topic] for topic, _ in sub.step.sources)
            copies = [rows[is_global].assign(task=task, arrival=GLOBAL_ARRIVAL) for task in range(tasks)]
            rows = pd.concat([rows[~is_global], *copies], ignore_index=True)
        runner = TaskRunner(dataclasses.replace(sub.step, errors=errors))
        out: list[tuple[str, bytes | None, bytes | None, int]] = []
        for task, group in rows.groupby("task", sort=True):
            backends = {spec.name: self._backends.setdefault((sub.name, int(task), spec.name), DictBackend()) for spec in sub.step.stores}
            state = self._task_states.get((sub.name, int(task)))
            new_state, rows_out, _ = runner.process(int(task), in_worker_order([group], runner.columns), backends, state, self.now_ms)
            self._task_states[(sub.name, int(task))] = new_state
            out.extend(rows_out)
        return out


def _source_batch(topic: str, partition: int, records: list[tuple[InputRecord, int]]) -> pa.RecordBatch:
    """Records of one partition as the Kafka source gives them to ``mapInArrow``."""
    return pa.RecordBatch.from_pydict(
        {
            "key": pa.array([r.key for r, _ in records], pa.binary()),
            "value": pa.array([r.value for r, _ in records], pa.binary()),
            "ts": pa.array([r.timestamp for r, _ in records], pa.int64()),
            "topic": pa.array([topic] * len(records), pa.string()),
            "partition": pa.array([partition] * len(records), pa.int32()),
            "offset": pa.array([offset for _, offset in records], pa.int64()),
        }
    )


class _Batch:
    def __init__(self, emulator: SparkEmulator, slices: Mapping[tuple[str, int], list[tuple[InputRecord, int]]]) -> None:
        self.emulator = emulator
        self.slices = slices
        self._stateful: dict[int, pd.DataFrame] = {}

    def rows(self, flow: Flow, *, task_partitions: int | None = None, lane: int = 0) -> pd.DataFrame:
        base = flow.base
        if isinstance(base, UnionPlan):
            frames = [self.rows(f, task_partitions=task_partitions, lane=lane + i) for i, f in enumerate(base.inputs)]
            if not flow.ordered:
                frames = [frame[["key", "value", "ts"]] for frame in frames]
            return pd.concat(frames, ignore_index=True)
        source_node = base.node if isinstance(base, SourcePlan) else None
        run = FlowRun(
            flow.base_key,
            flow.base_value,
            flow.timestamp_extractor,
            flow.steps,
            flow.key_serde,
            flow.value_serde,
            from_source=isinstance(base, SourcePlan),
            sources=self.emulator.sources,
            task_partitions=task_partitions,
            lane=lane,
            errors=self.emulator.errors,
            source_node=source_node,
            subtopology=self.emulator.plan.topology.nodes[source_node or base.node].subtopology,
        )
        if isinstance(base, SourcePlan):
            batches = []
            for (topic, partition), records in sorted(self.slices.items()):
                if topic not in base.topics:
                    continue
                batches.extend(run_flow(iter([_source_batch(topic, partition, records)]), run))
            return _frame(batches) if batches else ORDERED_SCHEMA.empty_table().to_pandas()
        stateful = self.stateful(base)
        if not flow.steps and _same_serdes(flow):
            return stateful
        plain = pa.RecordBatch.from_pandas(stateful[["key", "value", "ts"]], preserve_index=False)
        return _frame(list(run_flow(iter([plain]), run)))

    def stateful(self, plan: KeyedPlan | TaskPlan) -> pd.DataFrame:
        if id(plan) not in self._stateful:
            self._stateful[id(plan)] = self.keyed(plan) if isinstance(plan, KeyedPlan) else self.task(plan)
        return self._stateful[id(plan)]

    def _inputs(self, plan: KeyedPlan | TaskPlan, columns: tuple[str, ...], *, by_task: bool) -> pd.DataFrame:
        frames = []
        for side, flow in plan.inputs:
            partitions = None
            if by_task and flow.repartition_topic is not None:
                partitions = self.emulator.partition_counts[flow.repartition_topic]
            frame = self.rows(flow, task_partitions=partitions)
            frames.append(frame.assign(origin=frame["origin"] + side_offset(side))[list(columns)])
        return pd.concat(frames, ignore_index=True)

    def keyed(self, plan: KeyedPlan) -> pd.DataFrame:
        rows = self._inputs(plan, KEYED_COLUMNS, by_task=False)
        rows = rows[rows["key"].notna()]
        update = keyed_update(dataclasses.replace(plan.step, errors=self.emulator.errors))
        out = []
        for key, group in rows.groupby("key", sort=True):
            state = GroupState(self.emulator._group_states.get((plan.node, key)))
            out.extend(update((key,), iter([group.reset_index(drop=True)]), state))
            self.emulator._group_states[(plan.node, key)] = state.value
        return _frame_of_frames(out)

    def task(self, plan: TaskPlan) -> pd.DataFrame:
        runner = TaskRunner(dataclasses.replace(plan.step, errors=self.emulator.errors))
        rows = self._inputs(plan, runner.columns, by_task=True)
        if plan.step.processor is None:
            rows = rows[rows["key"].notna()]
        out = []
        for task, group in rows.groupby("task", sort=True):
            backends = {spec.name: self.emulator._backends.setdefault((plan.node, int(task), spec.name), DictBackend()) for spec in plan.step.stores}
            state = self.emulator._task_states.get((plan.node, int(task)))
            rows_in = in_worker_order([group], runner.columns)
            new_state, rows_out, _ = runner.process(int(task), rows_in, backends, state, self.emulator.now_ms)
            self.emulator._task_states[(plan.node, int(task))] = new_state
            out.extend(rows_out)
        return pd.DataFrame({"key": [r[0] for r in out], "value": [r[1] for r in out], "ts": [r[2] for r in out]})


def _frame(batches: list[pa.RecordBatch]) -> pd.DataFrame:
    if not batches:
        return pd.DataFrame({"key": [], "value": [], "ts": []})
    return pa.Table.from_batches(batches).to_pandas()


def _frame_of_frames(frames: Iterator[pd.DataFrame] | list[pd.DataFrame]) -> pd.DataFrame:
    frames = list(frames)
    if not frames:
        return pd.DataFrame({"key": [], "value": [], "ts": []})
    return pd.concat(frames, ignore_index=True)
