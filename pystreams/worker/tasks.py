"""One active task: its state (restored from changelogs), its compiled node graph, the input
offsets it has processed, stream time and punctuations."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pystreams.state import CacheLimits, RestoreProgress, TaskState, TopicPartition
from pystreams.topology.ir import PunctuationType, TaskId
from pystreams.topology.kernels import ScheduledPunctuation
from pystreams.topology.resolve import ResolvedTopology
from pystreams.topology.source_step import SourceFailed, SourceStep, source_step

from .errors import ErrorKind, ErrorPolicy, RecordFailure, RecordProcessingError, dead_letter_headers, failure_policy
from .kafka_io import ChangelogRestorer, ProducerChangelogSink, Sender
from .packing import UnpackedRecord, packed_version, unpack
from .processing import NodeFailure, SourceEntry, TaskContext, TaskGraph, build_task_graph

if TYPE_CHECKING:
    from .engine import ErrorHandling

log = logging.getLogger(__name__)


class StreamTask:
    """An active task. Create it, ``restore`` it, then feed it records with ``process``."""

    def __init__(
        self,
        resolved: ResolvedTopology,
        task_id: TaskId,
        *,
        state_dir: str | os.PathLike[str] | None,
        sender: Sender,
        errors: ErrorHandling,
        cache_limits: CacheLimits,
        checkpoint_min_records: int = 0,
        on_restore_progress: Callable[[RestoreProgress], None] | None = None,
        global_stores: Mapping[str, Any] | None = None,
    ) -> None:
        """``global_stores``: the process's global tables, which the task's joins read."""
        topology = resolved.topology
        self.id = task_id
        self.resolved = resolved
        self.input_partitions = tuple(TopicPartition(t, p) for t, p in resolved.input_partitions(task_id))
        self._errors = errors
        self._sender = sender
        self.ctx = TaskContext(topology.app_id, task_id, sender)
        self.ctx.on_forward_error = self._forward_failed
        self.logged_changelogs = tuple(TopicPartition(*pair) for pair in resolved.changelog_partitions(task_id))
        self.changelog_sink = ProducerChangelogSink(sender, frozenset(tp.topic for tp in self.logged_changelogs))
        self.state = TaskState(
            state_dir,
            topology.app_id,
            str(task_id),
            task_id.partition,
            self.changelog_sink,
            on_restore_progress=on_restore_progress,
            checkpoint_min_records=checkpoint_min_records,
        )
        try:
            self.graph: TaskGraph = build_task_graph(resolved, task_id, self.state, self.ctx, cache_limits=cache_limits, global_stores=global_stores)
        except BaseException:
            self.state.close(wipe=False)
            raise
        #: Next offset to process per input partition (what a commit stores).
        self.next_offsets: dict[TopicPartition, int] = {}
        self.records_processed = 0
        self.records_failed = 0
        #: Processed or punctuated since its last commit: under exactly-once, an aborted
        #: transaction leaves such a task with state no commit covers (it is rebuilt).
        self.dirty = False
        punctuations = self.graph.punctuations
        self._stream_punctuations = [p for p in punctuations if p.punctuation.type is PunctuationType.STREAM_TIME]
        self._wall_punctuations = [p for p in punctuations if p.punctuation.type is PunctuationType.WALL_CLOCK_TIME]
        sources = self.graph.sources
        self._steps = {topic: self._source_step(entry, self._source_record_failed) for topic, entry in sources.items()}
        self._packed_steps = {topic: self._source_step(entry, self._packed_entry_failed) for topic, entry in sources.items() if entry.packed}
        self._initialized = False

    # -- start-up -------------------------------------------------------------------------

    def restore(self, restorer: ChangelogRestorer) -> dict[str, int]:
        """Bring every logged store to the end of its changelog, then checkpoint."""
        restored: dict[str, int] = {}
        positions = self.state.restore_positions()
        for changelog in self.logged_changelogs:
            end = restorer.true_end_offset(changelog)
            start = positions.get(changelog)
            store_name = next(s.name for s in self.state.stores.values() if s.changelog == changelog)
            if start is not None and start >= end:
                restored[store_name] = 0
                continue
            restored[store_name] = self.state.restore_changelog(changelog, restorer.read(changelog, start, end), end)
        self.state.checkpoint()
        return restored

    def initialize(self) -> None:
        """Call processors' ``init`` (after restore: they may read their stores)."""
        for processor in self.graph.processors:
            processor.init()
        self._initialized = True

    # -- processing -----------------------------------------------------------------------

    def process(self, records: Sequence[Any]) -> None:
        """Run consumer records (of this task's input partitions, in the order to process
        them) through the graph."""
        self.dirty = True
        ctx = self.ctx
        sources = self.graph.sources
        steps = self._steps
        current_topic = None
        # Set from the first record's source entry (current_topic starts as None).
        entry: SourceEntry
        step: SourceStep
        packed = False
        record: Any = None
        try:
            for record in records:
                topic = record.topic
                if topic != current_topic:
                    current_topic = topic
                    entry = sources[topic]
                    step = steps[topic]
                    packed = entry.packed
                    ctx.topic = topic
                ctx.partition = record.partition
                ctx.offset = record.offset
                headers = record.headers
                if packed and packed_version(headers) is not None:
                    self._process_packed(record, entry)
                    continue
                ctx.headers = headers or ()
                step(record.key, record.value, record.timestamp, record)
        except RecordProcessingError:
            # The records before the failing one were processed: the exit line counts them.
            self.records_processed += next(index for index, r in enumerate(records) if r is record)
            raise
        self.records_processed += len(records)

    def _process_packed(self, record: Any, entry: SourceEntry) -> None:
        """Every entry of a packed repartition record, in order, under the record's offset
        (``process`` set the context's topic, partition and offset)."""
        try:
            entries = unpack(record)
        except Exception as error:
            self._record_failed(ErrorKind.DESERIALIZATION, entry.node, error, record)
            return
        step = self._packed_steps[record.topic]
        ctx = self.ctx
        ctx.headers = ()
        for entry in entries:
            if len(entry) == 4:  # the format with headers
                ctx.headers = entry[3]
                step(entry[0], entry[1], entry[2], record)
                ctx.headers = ()
            else:
                step(entry[0], entry[1], entry[2], record)
        # ``process`` counts the packed record itself as one.
        self.records_processed += len(entries) - 1

    def mark_consumed(self, partition: TopicPartition, next_offset: int) -> None:
        self.next_offsets[partition] = next_offset

    def punctuate_wall_clock(self, now_ms: int) -> None:
        for scheduled in self._wall_punctuations:
            if scheduled.wall_clock_due(now_ms):
                self._fire(scheduled, now_ms)

    def _fire(self, scheduled: ScheduledPunctuation, now: int) -> None:
        self.dirty = True  # a punctuation may write: the next commit must include this task
        try:
            scheduled.fire(now)
        except Exception as error:
            self._record_failed(ErrorKind.PROCESSING, scheduled.node, error, None)

    # -- errors ---------------------------------------------------------------------------

    def _source_step(self, entry: SourceEntry, failed: SourceFailed) -> SourceStep:
        return source_step(
            entry.node,
            entry.deserialize_key,
            entry.deserialize_value,
            entry.timestamp_extractor,
            entry.emit,
            self.ctx,
            failed=failed,
            stream_punctuations=self._stream_punctuations,
            fire=self._fire,
        )

    def _source_record_failed(self, kind: ErrorKind, node: str | None, error: BaseException, record: Any, *_raw: Any) -> None:
        self._record_failed(kind, node, error, record)

    def _packed_entry_failed(self, kind: ErrorKind, node: str | None, error: BaseException, packed: Any, key: Any, value: Any, timestamp: int) -> None:
        """A failed entry of a packed record is reported (and dead-lettered) as a record of its own."""
        self._record_failed(kind, node, error, UnpackedRecord(packed.topic, packed.partition, packed.offset, timestamp, key, value))

    def _forward_failed(self, failure: NodeFailure) -> None:
        self._record_failed(ErrorKind.PROCESSING, failure.node, failure.error, None)

    def _record_failed(self, kind: ErrorKind, node: str | None, error: BaseException, record: Any) -> None:
        failure = RecordFailure(
            kind=kind,
            task_id=str(self.id),
            topic=None if record is None else record.topic,
            partition=None if record is None else record.partition,
            offset=None if record is None else record.offset,
            node=node,
            reason=f"{type(error).__name__}: {error}",
        )
        self.records_failed += 1
        policy = failure_policy(self._errors.policies, failure, error)  # raises under ``fail``
        self._errors.record(failure)
        if policy is ErrorPolicy.DEAD_LETTER and record is not None:
            dead_letter_topic = self._errors.policies.dead_letter_topic
            assert dead_letter_topic is not None
            self._sender.send_with_headers(dead_letter_topic, record.key, record.value, dead_letter_headers(failure))

    # -- commit and close -----------------------------------------------------------------

    def flush(self) -> None:
        """Flush store caches: changelog writes and forwards of folded updates."""
        self.state.flush()

    def checkpoint(self) -> None:
        """After the producer flushed: record the changelog offsets the stores reflect."""
        self.state.checkpoint(self.changelog_sink.take_written_offsets())
        self.dirty = False

    def committed(self) -> None:
        """After a transaction with this task's writes committed (exactly-once): advance the
        stores' changelog positions; no checkpoint file (see ``TaskState.invalidate_checkpoint``)."""
        self.state.record_written(self.changelog_sink.take_written_offsets())
        self.dirty = False

    def close_processors(self) -> None:
        if not self._initialized:
            return
        for processor in self.graph.processors:
            try:
                processor.instance.close()
            except Exception:
                log.exception("task %s: processor %s failed to close", self.id, processor.node)
        self._initialized = False

    def close_clean(self) -> None:
        """Close after a commit (flush, producer flush, checkpoint already done)."""
        self.close_processors()
        self.state.close(self.changelog_sink.take_written_offsets())

    def close_dirty(self) -> None:
        """Close without committing (the task was lost): cached writes are dropped, and the
        local state is wiped since RocksDB may hold writes its changelog never received."""
        self.close_processors()
        self.changelog_sink.discard()
        self.state.close(wipe=True)
