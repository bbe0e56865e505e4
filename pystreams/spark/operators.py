"""The functions Spark's stateful operators run for session windows, joins and processors.

Each wraps a rule of ``worker_semantics`` in the calling convention of a Spark operator
(``applyInPandasWithState``'s ``update(key, frames, state)`` or a ``StatefulProcessor`` for
``transformWithStateInPandas``), keeps the state in the operator's state store, and returns
``key, value, ts`` rows serialized with the node's serdes (``value`` None: a tombstone).
"""
from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import msgspec

from pystreams.topology.ir import TaskId
from pystreams.topology.kernels import initial_factory
from pystreams.topology.windows import JoinWindow, SessionWindow, Windowed

from .serdes import ShippedSerde
from .worker_semantics import (
    JoinBuffers,
    JoinRule,
    KeyValueBackend,
    ProcessorTask,
    PunctuationClock,
    ReplayedProcessorContext,
    SessionChanges,
    add_to_sessions,
    cached_key_value_store,
    decode_sessions,
    encode_sessions,
    expire_sessions,
)

#: Join inputs carry which side a row is from; the table sorts before the stream on equal
#: timestamps so an update applies before a lookup of the same instant.
TABLE_SIDE, STREAM_SIDE = 0, 1


def _rows_frame(keys: list[Any], values: list[Any], stamps: list[int]) -> Any:
    import pandas as pd

    return pd.DataFrame({"key": keys, "value": values, "ts": stamps})


def _in_order(frames: Iterator[Any], by: list[str]) -> Any:
    """All rows of a group in this batch, stably sorted (rows of one group may arrive in
    several frames, and a shuffle does not keep their order)."""
    import pandas as pd

    frames = list(frames)
    frame = frames[0] if len(frames) == 1 else pd.concat(frames, ignore_index=True)
    return frame.sort_values(by, kind="stable")


# -- session windows ------------------------------------------------------------------------------


def session_aggregator(
    *,
    in_key: ShippedSerde,
    in_value: ShippedSerde,
    out_key: ShippedSerde,
    accumulator: ShippedSerde,
    fn: Callable[[Any, Any, Any], Any],
    initial: Any,
    is_reduce: bool,
    merger: Callable[[Any, Any, Any], Any],
    window: SessionWindow,
) -> Callable[..., Iterator[Any]]:
    """``applyInPandasWithState`` update over one grouping key's sessions; the watermark
    (newest event time - grace) is the worker's close time, and sessions are forgotten after
    ``gap`` more, as the worker's session store retention (gap + grace) does."""
    gap = window.gap_ms
    new_initial = None if is_reduce else initial_factory(initial)

    def update(group_key: tuple[Any, ...], frames: Iterator[Any], state: Any) -> Iterator[Any]:
        if state.hasTimedOut:
            state.remove()  # every session is past retention; their final values were emitted
            return
        key_bytes = group_key[0]
        key = in_key.deserialize(key_bytes)
        stored = decode_sessions(state.get[0]) if state.exists else {}
        sessions = {bounds: accumulator.deserialize(value) for bounds, value in stored.items()}
        watermark = state.getCurrentWatermarkMs()
        expire_sessions(sessions, watermark - gap + 1)
        changes = SessionChanges()
        last_ts = -1
        frame = _in_order(frames, ["ts"])
        for value_bytes, ts in zip(frame["value"], frame["ts"], strict=True):
            ts = int(ts)
            added = add_to_sessions(
                sessions, changes, key, in_value.deserialize(value_bytes), ts,
                gap_ms=gap, close_time=watermark, aggregate=fn, merge=merger, new_initial=new_initial,
            )
            if added:
                last_ts = max(last_ts, ts)
        encoded = {bounds: accumulator.serialize(total) for bounds, total in sessions.items()}
        if encoded:
            state.update((encode_sessions(encoded),))
            newest_end = max(end for _, end in encoded)
            state.setTimeoutTimestamp(max(newest_end + gap, watermark + 1))
        elif state.exists:
            state.remove()
        keys, values, stamps = [], [], []
        for start, end in sorted(changes.removed):
            keys.append(out_key.serialize(Windowed(key, start, end)))
            values.append(None)
            stamps.append(last_ts)
        for (start, end), total in sorted(changes.written.items()):
            keys.append(out_key.serialize(Windowed(key, start, end)))
            values.append(encoded[(start, end)])
            stamps.append(last_ts)
        if keys:
            yield _rows_frame(keys, values, stamps)

    return update


# -- stream–table joins ---------------------------------------------------------------------------


def stream_table_joiner(
    *,
    join_key: ShippedSerde,
    stream_value: ShippedSerde,
    table_value: ShippedSerde,
    out_key: ShippedSerde,
    out_value: ShippedSerde,
    fn: Callable[[Any, Any, Any], Any],
    left_join: bool,
) -> Callable[..., Iterator[Any]]:
    """``applyInPandasWithState`` update over one join key: state = the table's latest value
    bytes; rows of both sides apply in event-time order (table first on ties)."""
    same_key_bytes = join_key.name == out_key.name

    def update(group_key: tuple[Any, ...], frames: Iterator[Any], state: Any) -> Iterator[Any]:
        key_bytes = group_key[0]
        key = join_key.deserialize(key_bytes)
        out_key_bytes = key_bytes if same_key_bytes else out_key.serialize(key)
        table_bytes = state.get[0] if state.exists else None
        table_object: Any = None if table_bytes is None else table_value.deserialize(table_bytes)
        changed = False
        values, stamps = [], []
        frame = _in_order(frames, ["ts", "side"])
        for value_bytes, ts, side in zip(frame["value"], frame["ts"], frame["side"], strict=True):
            if side == TABLE_SIDE:
                table_bytes, changed = value_bytes, True
                table_object = None if table_bytes is None else table_value.deserialize(table_bytes)
            elif value_bytes is not None and (table_bytes is not None or left_join):
                values.append(out_value.serialize(fn(key, stream_value.deserialize(value_bytes), table_object)))
                stamps.append(int(ts))
        if changed:
            if table_bytes is None:
                if state.exists:
                    state.remove()
            else:
                state.update((table_bytes,))
        if values:
            yield _rows_frame([out_key_bytes] * len(values), values, stamps)

    return update


# -- windowed stream–stream joins -----------------------------------------------------------------


def stream_stream_joiner(
    *,
    join_key: ShippedSerde,
    left_value: ShippedSerde,
    right_value: ShippedSerde,
    out_key: ShippedSerde,
    out_value: ShippedSerde,
    fn: Callable[[Any, Any, Any], Any],
    window: JoinWindow,
    how: str,
) -> Callable[..., Iterator[Any]]:
    """``applyInPandasWithState`` update over one join key: state = both sides' records
    within the join stores' retention (before + after + grace, the watermark's delay)."""
    rule = JoinRule(window.before_ms, window.after_ms, how)
    same_key_bytes = join_key.name == out_key.name

    def update(group_key: tuple[Any, ...], frames: Iterator[Any], state: Any) -> Iterator[Any]:
        if state.hasTimedOut:
            state.remove()  # every buffered record is past retention
            return
        key_bytes = group_key[0]
        key = join_key.deserialize(key_bytes)
        out_key_bytes = key_bytes if same_key_bytes else out_key.serialize(key)
        buffers = JoinBuffers.decode(state.get[0]) if state.exists else JoinBuffers()
        watermark = state.getCurrentWatermarkMs()
        min_live_time = watermark + 1
        buffers.expire(min_live_time)
        values, stamps = [], []
        frame = _in_order(frames, ["ts", "side"])
        for value_bytes, ts, side in zip(frame["value"], frame["ts"], frame["side"], strict=True):
            for left_bytes, right_bytes, result_ts in rule.join(buffers, int(side), int(ts), value_bytes, min_live_time) or ():
                left = None if left_bytes is None else left_value.deserialize(left_bytes)
                right = None if right_bytes is None else right_value.deserialize(right_bytes)
                values.append(out_value.serialize(fn(key, left, right)))
                stamps.append(result_ts)
        newest = buffers.newest
        if newest is None:
            if state.exists:
                state.remove()
        else:
            state.update((buffers.encode(),))
            state.setTimeoutTimestamp(max(newest, watermark + 1))
        if values:
            yield _rows_frame([out_key_bytes] * len(values), values, stamps)

    return update


# -- low-level processors -------------------------------------------------------------------------


@dataclass(frozen=True)
class ProcessorSpec:
    """What a Spark task needs to run one PROCESSOR node (plain, picklable data)."""

    node: str
    app_id: str
    subtopology: int
    processor_class: type
    #: (name, key serde, value serde) of each key-value store the processor owns.
    stores: tuple[tuple[str, ShippedSerde, ShippedSerde], ...]
    stream_punctuations: tuple[tuple[str, int], ...]
    wall_clock_punctuations: tuple[tuple[str, int], ...]
    #: How source rows become the processor's input records: deserialize, extract the
    #: timestamp (it moves stream time even for records the steps drop), stateless steps.
    base_key: ShippedSerde
    base_value: ShippedSerde
    timestamp_extractor: Callable[[Any, Any, int], int] | None
    steps: tuple[Callable, ...]
    out_key: ShippedSerde
    out_value: ShippedSerde
    #: False in backfills: an available-now query runs while timers are pending, so with
    #: wall-clock timers it would never end (their punctuations do not run in a backfill).
    wall_clock_timers: bool = True


class _MapStateBackend(KeyValueBackend):
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


def _encode_clock(due: dict[str, int | None]) -> bytes:
    return msgspec.msgpack.encode(due)


def _decode_clock(data: bytes) -> dict[str, int | None]:
    return msgspec.msgpack.decode(data, type=dict[str, int | None])


def processor_operator(spec: ProcessorSpec) -> Any:
    """A ``StatefulProcessor`` for ``transformWithStateInPandas`` grouped by source partition
    (the worker's task): each store is a ``MapState`` of key bytes -> value bytes; stream
    time and punctuation due times live in a ``ValueState``; wall-clock punctuations are
    processing-time timers.

    The spec travels pickled and is unpickled on first use: Spark also runs ``init`` in a
    driver-side Python process (to learn the state schemas) that cannot import the app's module."""
    import pickle

    from pyspark import cloudpickle
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    pickled_spec = cloudpickle.dumps(spec)
    store_names = tuple(name for name, _, _ in spec.stores)

    class ProcessorOperator(StatefulProcessor):
        def init(self, handle: Any) -> None:
            self.handle = handle
            self.store_states = {
                name: handle.getMapState(f"store{index}", "key binary", "value binary")
                for index, name in enumerate(store_names)
            }
            self.task_state = handle.getValueState("task", "stream_time long, due binary")
            self._spec: ProcessorSpec | None = None

        @property
        def spec(self) -> ProcessorSpec:
            if self._spec is None:
                self._spec = pickle.loads(pickled_spec)
            return self._spec

        def _task(self, partition: int) -> tuple[ProcessorTask, dict[str, Any]]:
            spec = self.spec
            stores = {
                name: cached_key_value_store(name, _MapStateBackend(self.store_states[name]), key_serde, value_serde)
                for name, key_serde, value_serde in spec.stores
            }
            stream_time, due = None, {}
            if self.task_state.exists():
                stream_time, due_bytes = self.task_state.get()
                due = _decode_clock(due_bytes)
            context = ReplayedProcessorContext(spec.app_id, TaskId(spec.subtopology, partition), stores)
            task = ProcessorTask(spec.processor_class, context, spec.stream_punctuations, PunctuationClock(due), stream_time)
            return task, stores

        def _finish(self, task: ProcessorTask, stores: dict[str, Any], now_ms: int) -> Iterator[Any]:
            spec = self.spec
            for store in stores.values():
                store.raw.flush()
            if spec.wall_clock_punctuations and not spec.wall_clock_timers:
                for timer in list(self.handle.listTimers()):  # left by a streaming run
                    self.handle.deleteTimer(timer)
                for method, _ in spec.wall_clock_punctuations:
                    # Unscheduled, so that a later streaming run schedules them again.
                    task.clock.next_due.pop(method, None)
            elif spec.wall_clock_punctuations:
                for method, interval_ms in spec.wall_clock_punctuations:
                    # As the worker: the first wall-clock check only schedules the punctuation.
                    if task.clock.next_due.get(method) is None:
                        task.clock.next_due[method] = now_ms + interval_ms
                        self.handle.registerTimer(now_ms + interval_ms)
            self.task_state.update((task.stream_time, _encode_clock(task.clock.next_due)))
            forwarded = task.context.forwarded
            if forwarded:
                yield _rows_frame(
                    [spec.out_key.serialize(k) for k, _, _ in forwarded],
                    [spec.out_value.serialize(v) for _, v, _ in forwarded],
                    [ts for _, _, ts in forwarded],
                )

        def handleInputRows(self, key: tuple[Any, ...], rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
            spec = self.spec
            partition = int(key[0])
            task, stores = self._task(partition)
            frame = _in_order(rows, ["topic", "offset"])
            # Several topics in one task: merged by timestamp, each in offset order, as the
            # worker merges the partitions of one task.
            per_topic = [group for _, group in frame.groupby("topic", sort=True)] if frame["topic"].nunique() > 1 else [frame]
            records = heapq.merge(
                *(
                    zip(group["ts"], group["topic"], group["offset"], group["key"], group["value"], strict=True)
                    for group in per_topic
                ),
                key=lambda row: row[0],
            )
            extractor = spec.timestamp_extractor
            for raw_ts, topic, offset, key_bytes, value_bytes in records:
                record_key, record_value = spec.base_key.deserialize(key_bytes), spec.base_value.deserialize(value_bytes)
                ts = int(raw_ts) if extractor is None else extractor(record_key, record_value, int(raw_ts))
                stepped: Any = [(record_key, record_value, ts)]
                for step in spec.steps:
                    stepped = step(stepped)
                task.process_source_record(stepped, ts, topic, partition, int(offset))
            yield from self._finish(task, stores, timerValues.getCurrentProcessingTimeInMs())

        def handleExpiredTimer(self, key: tuple[Any, ...], timerValues: Any, expiredTimerInfo: Any) -> Iterator[Any]:
            spec = self.spec
            task, stores = self._task(int(key[0]))
            now_ms = timerValues.getCurrentProcessingTimeInMs()
            for method, interval_ms in spec.wall_clock_punctuations:
                if spec.wall_clock_timers and task.clock.due(method, now_ms):
                    task.fire(method, now_ms, interval_ms)
                    self.handle.registerTimer(task.clock.next_due[method])
            yield from self._finish(task, stores, now_ms)

        def close(self) -> None:
            pass

    return ProcessorOperator()
