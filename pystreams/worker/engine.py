"""The task-execution engine of a worker: runs the tasks it is given, independent of how they
were assigned (the group member driver decides; this engine executes).

    engine = TaskEngine(resolved, EngineConfig(bootstrap, state_dir),
                        committed_offsets=fetch_from_coordinator)
    engine.start()                      # clients; internal topics created
    engine.add_tasks(tasks)             # open state, restore from changelogs, seek inputs
    while running:
        engine.poll()                   # fetch → process → punctuate
        if time_to_commit:
            offsets = engine.prepare_commit()   # flush stores → repartition buffers → producer
            await member.commit_offsets(offsets)  # the caller, with its member epoch
            engine.complete_commit()            # checkpoint changelog offsets
    engine.revoke_tasks(tasks)          # commit, then close; returns the offsets committed
    engine.lose_tasks(tasks)            # drop, no commit
    engine.close()

The engine is synchronous and single-threaded: an asyncio caller runs it in one worker thread.
"""
from __future__ import annotations

import heapq
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path
from typing import Any

from kafka import TopicPartition as KafkaTopicPartition

from pystreams.cluster import ClusterMetadata, TopicSpec
from pystreams.state import CacheLimits, RestoreProgress, TopicPartition
from pystreams.state.errors import TaskDirectoryLockedError
from pystreams.state.task_state import read_local_task_offsets
from pystreams.topology.ir import TaskId, Topology
from pystreams.topology.resolve import ResolvedTopology, resolve
from pystreams.topology.stores import TypedStore

from .errors import ErrorPolicies, ErrorPolicy, RecordFailure
from .batch_size import AdaptiveBatchSize
from .kafka_io import DEFAULT_CONSUMER_CONFIG, ChangelogRestorer, RecordSender, make_consumer, make_producer
from .packing import expand_packed
from .standby import StandbyTask, StandbyUpdater, stateful_tasks
from .tasks import StreamTask

log = logging.getLogger(__name__)

#: Reads committed input offsets (our coordinator's OffsetFetch); partitions without a
#: committed offset are left out and start from the earliest offset.
CommittedOffsetsReader = Callable[[Sequence[TopicPartition]], Mapping[TopicPartition, int]]
#: Commits input offsets (to our coordinator, with the member epoch).
OffsetCommitter = Callable[[Mapping[TopicPartition, int]], None]

_by_timestamp = attrgetter("timestamp")


@dataclass(slots=True)
class ErrorHandling:
    """The error policies in force, and the failures skipped so far (newest last)."""

    policies: ErrorPolicies = field(default_factory=ErrorPolicies)
    recent_failures: deque[RecordFailure] = field(default_factory=lambda: deque(maxlen=1000))
    #: Records skipped so far (logged or dead-lettered).
    skipped: int = 0

    @property
    def dead_letter_topic(self) -> str | None:
        return self.policies.dead_letter_topic

    def record(self, failure: RecordFailure) -> None:
        self.recent_failures.append(failure)
        self.skipped += 1


@dataclass(slots=True)
class EngineConfig:
    bootstrap_servers: str
    state_dir: str | os.PathLike[str]
    client_id: str = "pystreams-worker"
    #: Used by ``run``; callers driving ``poll`` themselves decide when to commit.
    commit_interval_ms: int = 1000
    poll_timeout_ms: int = 100
    #: The app's error policies (``topology.errors``) with these replaced (None: the app's).
    deserialization_errors: ErrorPolicy | None = None
    processing_errors: ErrorPolicy | None = None
    dead_letter_topic: str | None = None
    cache_limits: CacheLimits = CacheLimits()
    #: Skip checkpoint files until changelogs advanced this much (Kafka Streams: 10,000).
    checkpoint_min_records: int = 0
    create_internal_topics: bool = True
    producer_config: Mapping[str, Any] = field(default_factory=dict)
    consumer_config: Mapping[str, Any] = field(default_factory=dict)
    #: Settings every kafka-python client takes (security_protocol, ssl_*, sasl_*).
    client_config: Mapping[str, Any] = field(default_factory=dict)
    #: A poll's records are sized to take about this long to process (see batch_size.py).
    poll_batch_target_ms: float = 100.0


@dataclass(slots=True)
class EngineCounters:
    """What the engine counts as it goes, for metrics: updated once per poll or commit (never
    per record) on the engine thread; other threads only read them (one attribute each)."""

    polls: int = 0
    #: Kafka records of input partitions handed to tasks (a packed repartition record is one).
    records_consumed: int = 0
    #: Records run through the topology (packed entries count each), up to a failing record.
    records_processed: int = 0
    #: Time spent processing polled records (fetching and waiting excluded).
    process_seconds: float = 0.0
    #: Changelog records applied to standby and warm-up replicas.
    standby_records: int = 0


def resolve_against_cluster(topology: Topology, bootstrap_servers: str, client_config: Mapping[str, Any] | None = None) -> ResolvedTopology:
    """Resolve ``topology`` with the partition counts of the cluster's current topics."""
    with ClusterMetadata(bootstrap_servers, **(client_config or {})) as cluster:
        counts = {name: meta.num_partitions for name, meta in cluster.fetch_topics().items()}
    return resolve(topology, counts)


class TaskEngine:
    def __init__(
        self,
        resolved: ResolvedTopology,
        config: EngineConfig,
        *,
        committed_offsets: CommittedOffsetsReader | None = None,
        commit_offsets: OffsetCommitter | None = None,
        commit_offsets_in_background: OffsetCommitter | None = None,
        on_restore_progress: Callable[[RestoreProgress], None] | None = None,
        on_commit: Callable[[float], None] | None = None,
    ) -> None:
        self.resolved = resolved
        self.topology = resolved.topology
        self.config = config
        self.errors = ErrorHandling(resolved.topology.errors.overridden(
            deserialization=config.deserialization_errors, processing=config.processing_errors,
            dead_letter_topic=config.dead_letter_topic,
        ))
        self.errors.policies.check()
        self._committed_offsets = committed_offsets
        self._commit_offsets = commit_offsets
        #: Periodic commits hand their offsets here and go on processing (the coordinator may be
        #: away for a while); commits that end a task's ownership always wait (``commit_offsets``).
        self._commit_offsets_in_background = commit_offsets_in_background
        self._on_restore_progress = on_restore_progress
        #: Told how long each commit took (seconds): flush, offsets committed, checkpoint.
        self._on_commit = on_commit
        self.counters = EngineCounters()
        self._tasks: dict[TaskId, StreamTask] = {}
        self._task_of_partition: dict[TopicPartition, StreamTask] = {}
        self._producer: Any = None
        self._consumer: Any = None
        self._restorer: ChangelogRestorer | None = None
        self._standby_updater: StandbyUpdater | None = None
        #: Standby and warm-up replicas the assignment wants here; opened unless active here,
        #: retried while another thread of this process still holds the task's directory.
        self._wanted_standbys: frozenset[TaskId] = frozenset()
        self._stateful = stateful_tasks(resolved)
        self._sender: RecordSender | None = None
        self._repartition_topics: frozenset[str] = frozenset()
        self._last_commit = time.monotonic()
        self._batch_size = AdaptiveBatchSize(
            maximum=int({**DEFAULT_CONSUMER_CONFIG, **config.consumer_config}["max_poll_records"]),
            target_ms=config.poll_batch_target_ms,
        )
        Path(config.state_dir).mkdir(parents=True, exist_ok=True)

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        """Create the Kafka clients and, unless disabled, the internal topics."""
        if self.config.create_internal_topics:
            self.ensure_internal_topics()
        client_id = self.config.client_id
        written = [*self.topology.sink_topics, *self.topology.repartition_topics, *self.topology.changelog_topics]
        if self.errors.dead_letter_topic:
            written.append(self.errors.dead_letter_topic)
        self._producer = make_producer(self.config.bootstrap_servers, client_id, {**self.config.client_config, **self.config.producer_config}, written)
        self._repartition_topics = frozenset(self.topology.repartition_topics)
        self._sender = RecordSender(
            self._producer, {topic: self.resolved.partitions[topic] for topic in self._repartition_topics}
        )
        self._consumer = make_consumer(self.config.bootstrap_servers, client_id, {**self.config.client_config, **self.config.consumer_config})
        restore_consumer = make_consumer(
            self.config.bootstrap_servers, f"{client_id}-restore", {**self.config.client_config, **self.config.consumer_config}
        )
        self._restorer = ChangelogRestorer(restore_consumer)
        self._standby_updater = StandbyUpdater(
            make_consumer(self.config.bootstrap_servers, f"{client_id}-standby", {**self.config.client_config, **self.config.consumer_config})
        )

    def ensure_internal_topics(self) -> None:
        """Repartition topics (cleanup.policy=delete) and changelogs (compacted), sized by
        the resolved topology."""
        specs = [
            TopicSpec(topic.name, topic.partitions, configs=dict(topic.config))
            for topic in self.resolved.topics_to_create()
        ]
        with ClusterMetadata(self.config.bootstrap_servers, **self.config.client_config) as cluster:
            cluster.ensure_topics(specs)

    def close(self) -> None:
        """Revoke every task (committing), then close the clients."""
        try:
            if self._tasks and self._sender is not None:
                self.revoke_tasks(list(self._tasks))
        finally:
            for client in (self._consumer, self._producer):
                if client is not None:
                    client.close()
            if self._standby_updater is not None:
                for task_id in list(self._standby_updater.tasks):
                    self._close_standby(task_id)
                self._standby_updater.close()
            if self._restorer is not None:
                self._restorer.close()
            self._consumer = self._producer = self._restorer = self._standby_updater = None

    def __enter__(self) -> TaskEngine:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- tasks ----------------------------------------------------------------------------

    @property
    def tasks(self) -> Mapping[TaskId, StreamTask]:
        return self._tasks

    def add_tasks(self, task_ids: Iterable[TaskId]) -> dict[TaskId, dict[str, int]]:
        """Open, restore (to the changelog end, reporting progress) and start the tasks;
        returns the records restored per task and store, for the tasks started. A task whose
        state directory is locked by another engine on the same directory (a sibling stream
        thread's replica of it, not closed yet) is left out: the caller starts it later."""
        assert self._restorer is not None and self._sender is not None, "start() the engine first"
        restored: dict[TaskId, dict[str, int]] = {}
        new_tasks = []
        for task_id in sorted(set(task_ids) - self._tasks.keys()):
            # Promotion: the replica's checkpoint is where the active's restore starts.
            self._close_standby(task_id)
            try:
                task = StreamTask(
                    self.resolved,
                    task_id,
                    state_dir=self.config.state_dir,
                    sender=self._sender,
                    errors=self.errors,
                    cache_limits=self.config.cache_limits,
                    checkpoint_min_records=self.config.checkpoint_min_records,
                    on_restore_progress=self._on_restore_progress,
                )
            except TaskDirectoryLockedError as error:
                log.info("task %s not started yet: %s", task_id, error)
                continue
            try:
                restored[task_id] = task.restore(self._restorer)
                task.initialize()
            except BaseException:
                # Nothing was processed: keep what was restored (checkpointed on close) so a
                # retry resumes the restore instead of starting over.
                task.close_clean()
                raise
            self._tasks[task_id] = task
            new_tasks.append(task)
            for partition in task.input_partitions:
                self._task_of_partition[partition] = task
        new_partitions = [p for task in new_tasks for p in task.input_partitions]
        if new_partitions:
            self._assign_inputs()
            committed = dict(self._committed_offsets(new_partitions)) if self._committed_offsets else {}
            log.info("input resumes at %s", ", ".join(
                f"{p.topic}-{p.partition}@{committed.get(p, 'beginning')}" for p in sorted(new_partitions)))
            for partition in new_partitions:
                offset = committed.get(partition)
                kafka_partition = KafkaTopicPartition(*partition)
                if offset is None:
                    self._consumer.seek_to_beginning(kafka_partition)
                else:
                    self._consumer.seek(kafka_partition, offset)
                    self._task_of_partition[partition].mark_consumed(partition, offset)
        return restored

    # -- standby and warm-up replicas ---------------------------------------------------------

    @property
    def standby_tasks(self) -> Mapping[TaskId, StandbyTask]:
        return self._standby_updater.tasks if self._standby_updater is not None else {}

    def set_standby_tasks(self, task_ids: Iterable[TaskId]) -> None:
        """The standby and warm-up replicas wanted here (stateless tasks need none)."""
        self._wanted_standbys = frozenset(task_ids) & self._stateful
        self._reconcile_standbys()

    def _reconcile_standbys(self) -> None:
        updater = self._standby_updater
        if updater is None:
            return
        for task_id in [t for t in updater.tasks if t not in self._wanted_standbys or t in self._tasks]:
            self._close_standby(task_id)
        for task_id in sorted(self._wanted_standbys - self._tasks.keys() - updater.tasks.keys()):
            try:
                standby = StandbyTask(
                    self.resolved, task_id, state_dir=self.config.state_dir,
                    cache_limits=self.config.cache_limits, checkpoint_min_records=self.config.checkpoint_min_records,
                )
            except TaskDirectoryLockedError:
                continue  # its previous owner on another thread has not closed it yet
            except Exception:
                # A replica is an optimisation: without it the task restores in full if it
                # moves here. Not retried at every poll; the next assignment asks again.
                log.exception("replica of task %s cannot be opened; not kept here", task_id)
                self._wanted_standbys -= {task_id}
                continue
            updater.add(standby)

    def _close_standby(self, task_id: TaskId) -> None:
        if self._standby_updater is not None and (standby := self._standby_updater.remove(task_id)) is not None:
            standby.close()

    def replica_lags(self) -> dict[TaskId, int]:
        """How far each open standby or warm-up replica is behind its changelogs."""
        return self._standby_updater.lags() if self._standby_updater is not None else {}

    def task_lags(self) -> dict[TaskId, int]:
        """What a Streams member reports (KIP-848's TaskLag): 0 for running actives, the
        replica's lag for standbys and warm-ups, and changelog end − checkpoint for any other
        task with state in the state directory (so that its state is not thrown away)."""
        assert self._standby_updater is not None, "start() the engine first"
        lags: dict[TaskId, int] = self._standby_updater.lags()
        open_tasks = self._tasks.keys() | lags.keys()
        on_disk = {
            task_id: offsets
            for name, offsets in read_local_task_offsets(self.config.state_dir, self.topology.app_id).items()
            if (task_id := _parse_task_id(name)) is not None and task_id not in open_tasks and task_id in self._stateful
        }
        assert self._restorer is not None
        for task_id, offsets in on_disk.items():
            lags[task_id] = sum(max(0, self._restorer.true_end_offset(c) - offset) for c, offset in offsets.items())
        for task_id in self._tasks:
            lags[task_id] = 0
        return lags

    def revoke_tasks(self, task_ids: Iterable[TaskId]) -> dict[TopicPartition, int]:
        """Commit the tasks, then close them; returns the input offsets committed."""
        tasks = [self._tasks[t] for t in task_ids if t in self._tasks]
        if not tasks:
            return {}
        offsets = self._commit(tasks)
        for task in tasks:
            task.close_clean()
            self._forget(task)
        self._assign_inputs()
        self._reconcile_standbys()  # a demoted active may stay here as a replica
        return offsets

    def lose_tasks(self, task_ids: Iterable[TaskId]) -> None:
        """Drop the tasks without committing (another member may own them already)."""
        for task_id in task_ids:
            task = self._tasks.get(task_id)
            if task is None:
                continue
            task.close_dirty()
            self._forget(task)
        self._assign_inputs()
        self._reconcile_standbys()

    def _forget(self, task: StreamTask) -> None:
        del self._tasks[task.id]
        for partition in task.input_partitions:
            self._task_of_partition.pop(partition, None)

    def _assign_inputs(self) -> None:
        # assign() keeps the fetch position of partitions that stay assigned.
        if self._consumer is not None:
            self._consumer.assign([KafkaTopicPartition(*p) for p in self._task_of_partition])

    # -- processing -----------------------------------------------------------------------

    def poll(self, timeout_ms: int | None = None) -> int:
        """Fetch once, process what came, run due wall-clock punctuations; returns the number
        of records processed."""
        timeout = timeout_ms if timeout_ms is not None else self.config.poll_timeout_ms
        updater = self._standby_updater
        if updater is not None and self._wanted_standbys - updater.tasks.keys() - self._tasks.keys():
            self._reconcile_standbys()
        following = updater is not None and bool(updater.tasks)
        counters = self.counters
        counters.polls += 1
        if not self._task_of_partition:
            # Replicas catch up between input batches; with no active work they get the wait.
            if following:
                counters.standby_records += updater.poll(timeout)
            else:
                time.sleep(timeout / 1000)
            self._punctuate_wall_clock()
            self._send_repartition_buffers()
            return 0
        if following:
            counters.standby_records += updater.poll(0)
        fetched = self._consumer.poll(timeout_ms=timeout, max_records=self._batch_size.limit)
        started = time.perf_counter()
        count = 0
        kafka_records = 0  # what max_records counts: a packed repartition record is one
        by_task: dict[TaskId, list[tuple[TopicPartition, list[Any]]]] = {}
        for kafka_partition, records in fetched.items():
            partition = TopicPartition(kafka_partition.topic, kafka_partition.partition)
            task = self._task_of_partition.get(partition)
            if task is None or not records:
                continue  # revoked between fetch and now
            by_task.setdefault(task.id, []).append((partition, records))
            kafka_records += len(records)
        for task_id, batches in by_task.items():
            task = self._tasks[task_id]
            if len(batches) == 1:
                ordered = batches[0][1]
            else:
                # Several inputs (joins): process in timestamp order across partitions, as
                # Kafka Streams' partition group does, so a table update precedes later lookups.
                # Packed repartition records are merged entry by entry.
                packed_topics = self._repartition_topics
                ordered = list(
                    heapq.merge(*(expand_packed(records, packed_topics) for _, records in batches), key=_by_timestamp)
                )
            processed_before = task.records_processed
            try:
                task.process(ordered)
            finally:  # a failing record still leaves the ones before it processed
                processed = task.records_processed - processed_before  # packed records count per entry
                count += processed
                counters.records_processed += processed
            for partition, records in batches:
                task.mark_consumed(partition, records[-1].offset + 1)
        self._punctuate_wall_clock()
        self._send_repartition_buffers()
        elapsed_s = time.perf_counter() - started
        self._batch_size.observe(kafka_records, elapsed_s * 1000)
        counters.records_consumed += kafka_records
        counters.process_seconds += elapsed_s
        return count

    def _send_repartition_buffers(self) -> None:
        # Once per poll batch: what this batch wrote to repartition topics leaves packed.
        if self._sender is not None:
            self._sender.send_repartition_buffers()

    def _punctuate_wall_clock(self) -> None:
        now_ms = int(time.time() * 1000)
        for task in self._tasks.values():
            task.punctuate_wall_clock(now_ms)

    # -- commit ---------------------------------------------------------------------------

    def prepare_commit(self, tasks: Iterable[StreamTask] | None = None) -> dict[TopicPartition, int]:
        """Flush store caches (folded changelog writes and forwards), then the repartition
        buffers and the producer (``RecordSender.flush``); returns the input offsets to commit.
        Call ``complete_commit`` once they are committed."""
        assert self._sender is not None
        selected = list(self._tasks.values() if tasks is None else tasks)
        for task in selected:
            task.flush()
        self._sender.flush()
        offsets: dict[TopicPartition, int] = {}
        for task in selected:
            offsets.update(task.next_offsets)
        return offsets

    def complete_commit(self, tasks: Iterable[StreamTask] | None = None) -> None:
        """Checkpoint the changelog offsets the stores now reflect."""
        for task in list(self._tasks.values() if tasks is None else tasks):
            task.checkpoint()
        if tasks is None:
            for standby in self.standby_tasks.values():
                standby.checkpoint()
        self._last_commit = time.monotonic()

    def commit(self) -> dict[TopicPartition, int]:
        """``prepare_commit``, the committer given to the engine (if any), ``complete_commit``."""
        return self._commit(list(self._tasks.values()))

    def _commit(self, tasks: list[StreamTask], *, in_background: bool = False) -> dict[TopicPartition, int]:
        started = time.perf_counter()
        offsets = self.prepare_commit(tasks)
        committer = self._commit_offsets_in_background if in_background and self._commit_offsets_in_background else self._commit_offsets
        if committer is not None and offsets:
            committer(offsets)
        self.complete_commit(tasks)
        if self._on_commit is not None:
            self._on_commit(time.perf_counter() - started)
        return offsets

    def maybe_commit(self) -> dict[TopicPartition, int] | None:
        if (time.monotonic() - self._last_commit) * 1000 >= self.config.commit_interval_ms:
            return self._commit(list(self._tasks.values()), in_background=True)
        return None

    def run(self, *, until: Callable[[], bool] | None = None, timeout_s: float | None = None) -> int:
        """Poll, process and commit every ``commit_interval_ms`` until ``until()`` is true or
        ``timeout_s`` passed; commits once more at the end. Returns records processed."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        processed = 0
        while True:
            processed += self.poll()
            self.maybe_commit()
            if until is not None and until():
                break
            if deadline is not None and time.monotonic() >= deadline:
                break
        self.commit()
        return processed

    # -- inspection -----------------------------------------------------------------------

    def stores(self, name: str) -> list[TypedStore]:
        """The typed instances of store ``name`` in this engine's active tasks (read them for
        interactive queries and tests; writing bypasses the topology)."""
        return [task.graph.typed_stores[name] for task in self._tasks.values() if name in task.graph.typed_stores]

    def store_contents(self, name: str) -> dict[Any, Any]:
        """Every entry of store ``name`` over this engine's tasks, deserialized."""
        contents: dict[Any, Any] = {}
        for store in self.stores(name):
            contents.update(store.items())
        return contents

    @property
    def records_processed(self) -> int:
        return sum(task.records_processed for task in self._tasks.values())

    @property
    def records_produced(self) -> int:
        """Records the producer confirmed written (outputs, changelogs, packed repartition
        records), counted when a flush checks them."""
        return self._sender.records_sent if self._sender is not None else 0

    def input_lags(self) -> dict[TaskId, int]:
        """Records each active task is behind the end of its input partitions: the high
        watermark of the input consumer's last fetch minus the next offset to process.
        Partitions not fetched yet are left out (their end is unknown without asking)."""
        if self._consumer is None:
            return {}
        lags: dict[TaskId, int] = {}
        highwater = self._consumer.highwater
        for task_id, task in self._tasks.items():
            lag = 0
            for partition in task.input_partitions:
                end = highwater(KafkaTopicPartition(*partition))
                position = task.next_offsets.get(partition)
                if end is not None and position is not None:
                    lag += max(0, end - position)
            lags[task_id] = lag
        return lags


def _parse_task_id(text: str) -> TaskId | None:
    try:
        return TaskId.parse(text)
    except ValueError:
        return None
