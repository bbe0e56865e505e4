"""The task-execution engine of a worker: runs the tasks it is given, independent of how they
were assigned (the group member driver decides; this engine executes).

    engine = TaskEngine(resolved, EngineConfig(bootstrap, state_dir),
                        committed_offsets=fetch_from_coordinator)
    engine.start()                      # clients; internal topics created
    engine.add_tasks(tasks)             # open state, take over positions, restore, seek inputs
    while running:
        engine.poll()                   # fetch → process → punctuate
        engine.maybe_commit()           # every commit_interval_ms
    engine.revoke_tasks(tasks)          # commit, then close; returns the offsets committed
    engine.lose_tasks(tasks)            # drop, no commit
    engine.close()

How a commit works is the commit strategy's business (:mod:`pystreams.worker.commits`), chosen
by ``EngineConfig.processing_guarantee``: at-least-once flushes outputs, then commits offsets
(``commit_offsets``, or ``commit_offsets_in_background`` for periodic commits), then
checkpoints; exactly-once commits one Kafka transaction per commit with the input positions in
it, and raises :class:`~pystreams.worker.commits.TaskMigratedError` from ``poll``,
``maybe_commit``, ``add_tasks``, ``revoke_tasks`` or ``lose_tasks`` when another owner took the
tasks over (every task was dropped without committing).

The engine is synchronous and single-threaded: an asyncio caller runs it in one worker thread.
"""

from __future__ import annotations

import heapq
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path
from typing import Any

from kafka import TopicPartition as KafkaTopicPartition

from pystreams.cluster import ClusterMetadata, TopicSpec
from pystreams.guarantee import ProcessingGuarantee
from pystreams.state import CacheLimits, RestoreProgress, TopicPartition
from pystreams.state.errors import TaskDirectoryLockedError
from pystreams.state.task_state import read_local_task_offsets
from pystreams.topology.ir import TaskId, Topology
from pystreams.topology.resolve import ResolvedTopology, resolve
from pystreams.topology.stores import TypedStore

from .batch_size import AdaptiveBatchSize
from .commits import (
    AtLeastOnceCommits,
    CommittedOffsetsReader,
    ExactlyOnceCommits,
    OffsetCommitter,
    TaskMigratedError,
)
from .errors import ErrorPolicies, ErrorPolicy, RecordFailure
from .global_tables import GlobalTables
from .kafka_io import DEFAULT_CONSUMER_CONFIG, ChangelogRestorer, RecordSender, make_consumer, make_producer
from .packing import expand_packed
from .positions import positions_partition_count, positions_topic
from .standby import StandbyTask, StandbyUpdater, stateful_tasks
from .tasks import StreamTask
from .transaction import CommitOutcome, TransactionError, TransactionErrorKind, classify

log = logging.getLogger(__name__)

__all__ = [
    "CommittedOffsetsReader",
    "EngineConfig",
    "ErrorHandling",
    "OffsetCommitter",
    "TaskEngine",
    "TaskMigratedError",
    "internal_topic_specs",
    "resolve_against_cluster",
]

#: Kafka Streams' transaction.timeout.ms under exactly-once: on Apache Kafka, the open
#: transaction of a producer that died unfenced is aborted after this long.
EXACTLY_ONCE_TRANSACTION_TIMEOUT_MS = 10_000
#: How long a task that could not be rebuilt after an aborted transaction waits to retry.
_REVIVE_RETRY_S = 1.0
#: An active poll with nothing to fetch looks for commands this often: a revocation in a
#: rebalance, a query or stop waits at most this long, not the poll's whole timeout
#: (kafka-python's poll cannot be woken). 50 empty polls a second cost well under 1% of a core.
_COMMAND_CHECK_MS = 20

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
    processing_guarantee: ProcessingGuarantee = ProcessingGuarantee.AT_LEAST_ONCE
    #: Exactly-once: the transactional.id of this engine's producer (a stream thread's stable
    #: identity, see ``process.transactional_id_for``); default: the application id and client id.
    transactional_id: str | None = None


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
    #: Exactly-once: times another owner took this engine's tasks over (all dropped uncommitted).
    task_migrations: int = 0
    #: Exactly-once: tasks rebuilt from their changelogs after an aborted transaction.
    tasks_revived: int = 0
    #: ``TaskEngine.dropped_records`` as of the last commit.
    dropped_records: dict[str, int] = field(default_factory=dict)


def internal_topic_specs(resolved: ResolvedTopology, guarantee: ProcessingGuarantee) -> list[TopicSpec]:
    """The topics an app's workers create: repartition topics, changelogs and, under
    exactly-once, the input positions topic (compacted: the latest record per task is what
    counts)."""
    specs = [TopicSpec(t.name, t.partitions, configs=dict(t.config)) for t in resolved.topics_to_create()]
    if guarantee.exactly_once:
        specs.append(
            TopicSpec(
                positions_topic(resolved.topology.app_id),
                positions_partition_count(resolved),
                configs={"cleanup.policy": "compact"},
            )
        )
    return specs


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
        global_tables: GlobalTables | None = None,
    ) -> None:
        """``global_tables``: the process's, restored and followed by its owner; without, an
        engine of a topology with global tables opens, restores and follows its own."""
        self.resolved = resolved
        self.topology = resolved.topology
        self.config = config
        self.errors = ErrorHandling(
            resolved.topology.errors.overridden(
                deserialization=config.deserialization_errors,
                processing=config.processing_errors,
                dead_letter_topic=config.dead_letter_topic,
            )
        )
        self.errors.policies.check()
        self.guarantee = config.processing_guarantee
        self._commits: AtLeastOnceCommits | ExactlyOnceCommits
        if self.guarantee.exactly_once:
            self.transactional_id: str | None = config.transactional_id or f"{self.topology.app_id}-{config.client_id}"
            self._commits = ExactlyOnceCommits(
                transactional_id=self.transactional_id,
                positions_topic=positions_topic(self.topology.app_id),
                make_positions_consumer=lambda: self._new_consumer("positions", filtered=False, committed_only=False),
                make_fencing_producer=self._new_fencing_producer,
                committed_offsets=committed_offsets,
                commit_offsets=commit_offsets,
                transaction_timeout_ms=EXACTLY_ONCE_TRANSACTION_TIMEOUT_MS,
            )
        else:
            self.transactional_id = None
            self._commits = AtLeastOnceCommits(
                committed_offsets=committed_offsets,
                commit_offsets=commit_offsets,
                commit_offsets_in_background=commit_offsets_in_background,
            )
        self._on_restore_progress = on_restore_progress
        #: Told how long each commit took (seconds): flush, offsets committed, checkpoint.
        self._on_commit = on_commit
        self.counters = EngineCounters()
        #: Set by :meth:`wake`: an idle poll stops waiting, so a command queued for this engine
        #: (its first tasks, a query) runs now rather than after the rest of the poll timeout.
        self._woken = threading.Event()
        self._tasks: dict[TaskId, StreamTask] = {}
        self._task_of_partition: dict[TopicPartition, StreamTask] = {}
        self._producer: Any = None
        self._consumer: Any = None
        self._restorer: ChangelogRestorer | None = None
        self._standby_updater: StandbyUpdater | None = None
        self.global_tables = global_tables
        #: This engine opened the global tables itself: it restores, follows and closes them.
        self._follows_global_tables = False
        #: Standby and warm-up replicas the assignment wants here; opened unless active here,
        #: retried while another thread of this process still holds the task's directory.
        self._wanted_standbys: frozenset[TaskId] = frozenset()
        self._stateful = stateful_tasks(resolved)
        self._sender: RecordSender | None = None
        self._repartition_topics: frozenset[str] = frozenset()
        #: Exactly-once: tasks whose transaction was aborted, to rebuild before the next poll.
        self._to_revive: set[TaskId] = set()
        self._revive_after = 0.0
        self._last_commit = time.monotonic()
        #: Tasks started since the last commit: their first processed records are committed at
        #: once, so a task that moved (or a restarted worker) shows output without waiting a
        #: commit interval behind the cache.
        self._started_since_commit: set[TaskId] = set()
        #: Records dropped (``dropped_records``) by tasks closed since: the metric never goes back.
        self._dropped_by_closed_tasks: dict[str, int] = {}
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
        if self.guarantee.exactly_once:
            written.append(positions_topic(self.topology.app_id))
        producer_config = {**self.config.client_config, **self.config.producer_config}

        def new_producer(overrides: dict[str, Any]) -> Any:
            return make_producer(self.config.bootstrap_servers, client_id, {**producer_config, **overrides}, written)

        self._producer = self._commits.open_producer(new_producer, self._producer_replaced)
        self._repartition_topics = frozenset(self.topology.repartition_topics)
        self._sender = RecordSender(self._producer, {topic: self.resolved.partitions[topic] for topic in self._repartition_topics})
        self._consumer = self._new_consumer("")
        end_consumer = self._new_consumer("restore-ends", committed_only=False) if self.guarantee.exactly_once else None
        self._restorer = ChangelogRestorer(self._new_consumer("restore"), end_consumer=end_consumer)
        self._standby_updater = StandbyUpdater(self._new_consumer("standby"))
        if self.topology.global_tables and self.global_tables is None:
            # Before any task starts: no lookup may see a table still being restored.
            try:
                self.global_tables = GlobalTables.open(self.resolved, self.config, f"{client_id}-global")
                self._follows_global_tables = True
                self.global_tables.restore()
            except BaseException:
                self.close()  # the clients opened above, and the global tables' lock
                raise

    def _new_consumer(self, role: str, *, filtered: bool = True, committed_only: bool = True) -> Any:
        """A consumer with the guarantee's settings: under exactly-once ``read_committed`` (unless
        ``committed_only`` is False) and behind the transaction filter (unless ``filtered`` is
        False; the positions reader wraps its own)."""
        client_id = f"{self.config.client_id}-{role}" if role else self.config.client_id
        overrides = {**self.config.client_config, **self.config.consumer_config}
        if committed_only:
            overrides.update(self._commits.consumer_overrides)
        consumer = make_consumer(self.config.bootstrap_servers, client_id, overrides)
        return self._commits.wrap_consumer(consumer) if filtered else consumer

    def _new_fencing_producer(self, transactional_id: str) -> Any:
        from kafka import KafkaProducer

        return KafkaProducer(
            bootstrap_servers=self.config.bootstrap_servers,
            client_id=f"{self.config.client_id}-fencer",
            transactional_id=transactional_id,
            enable_idempotence=True,
            **self.config.client_config,
        )

    def _producer_replaced(self, producer: Any) -> None:
        self._producer = producer
        if self._sender is not None:
            self._sender.replace_producer(producer)

    def ensure_internal_topics(self) -> None:
        """Repartition topics (cleanup.policy=delete), changelogs (compacted) and, under
        exactly-once, the input positions, sized by the resolved topology."""
        with ClusterMetadata(self.config.bootstrap_servers, **self.config.client_config) as cluster:
            cluster.ensure_topics(internal_topic_specs(self.resolved, self.guarantee))

    def close(self) -> None:
        """Revoke every task (committing), then close the clients."""
        try:
            if self._tasks and self._sender is not None:
                self.revoke_tasks(list(self._tasks))
        finally:
            self._commits.close()
            if self._consumer is not None:
                self._consumer.close()
            if self._standby_updater is not None:
                for task_id in list(self._standby_updater.tasks):
                    self._close_standby(task_id)
                self._standby_updater.close()
            if self._restorer is not None:
                self._restorer.close()
            if self._follows_global_tables and self.global_tables is not None:
                self.global_tables.close()
                self.global_tables = None
                self._follows_global_tables = False
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

    def add_tasks(self, task_ids: Iterable[TaskId], *, _reviving: bool = False) -> dict[TaskId, dict[str, int]]:
        """Open the tasks, find where their inputs resume (under exactly-once: take them over
        from their previous owners), restore their stores (to the changelog end, reporting
        progress) and start them; returns the records restored per task and store. A task
        whose state directory is locked by another engine on the same directory (a sibling
        stream thread's replica of it, not closed yet) is left out: the caller starts it later.
        If any task fails to start, none of them does (what was restored is kept)."""
        assert self._restorer is not None and self._sender is not None, "start() the engine first"
        self._commits.ensure_open()
        wanted = sorted(set(task_ids) - self._tasks.keys())
        if wanted and self.guarantee.exactly_once and self._tasks:
            # This thread's transaction must not stay open through a restore, which may take long:
            # it would hold back every read_committed reader of what the running tasks wrote.
            self._commit_all()
        new_tasks: list[StreamTask] = []
        for task_id in wanted:
            # Promotion: the replica's checkpoint is where the active's restore starts.
            self._close_standby(task_id)
            try:
                new_tasks.append(
                    StreamTask(
                        self.resolved,
                        task_id,
                        state_dir=self.config.state_dir,
                        sender=self._sender,
                        errors=self.errors,
                        cache_limits=self.config.cache_limits,
                        checkpoint_min_records=self.config.checkpoint_min_records,
                        on_restore_progress=self._on_restore_progress,
                        global_stores=self.global_tables.stores if self.global_tables is not None else None,
                    )
                )
            except TaskDirectoryLockedError as error:
                log.info("task %s not started yet: %s", task_id, error)
        if not new_tasks:
            return {}
        restored: dict[TaskId, dict[str, int]] = {}
        try:
            # Positions first: under exactly-once the takeover fences a previous owner, whose
            # open transaction would otherwise hold the changelogs back from the restore.
            positions = self._commits.resume(new_tasks, reviving=_reviving)
            for task in new_tasks:
                restored[task.id] = task.restore(self._restorer)
                task.initialize()
        except BaseException:
            # Nothing was processed: keep what was restored (checkpointed on close) so a
            # retry resumes the restore instead of starting over.
            for task in new_tasks:
                task.close_clean()
            raise
        for task in new_tasks:
            self._tasks[task.id] = task
            for partition in task.input_partitions:
                self._task_of_partition[partition] = task
        self._started_since_commit.update(t.id for t in new_tasks)
        self._assign_inputs()
        log.info(
            "input resumes at %s",
            ", ".join(f"{p.topic}-{p.partition}@{positions[t.id].get(p, 'beginning')}" for t in new_tasks for p in sorted(t.input_partitions)),
        )
        for task in new_tasks:
            for partition in task.input_partitions:
                offset = positions[task.id].get(partition)
                kafka_partition = KafkaTopicPartition(*partition)
                if offset is None:
                    self._consumer.seek_to_beginning(kafka_partition)
                else:
                    self._consumer.seek(kafka_partition, offset)
                    task.mark_consumed(partition, offset)
        if self._commits.tasks_started(new_tasks):
            # Exactly-once: the claims commit before the tasks process anything, so a crash
            # from now on names this thread as the owner to fence.
            outcome = self._commit_all()
            if outcome is not CommitOutcome.COMMITTED:
                claimed = [t.id for t in new_tasks if t.id in self._tasks]
                self._drop(claimed)
                raise RuntimeError(f"tasks {', '.join(map(str, claimed))} not started: their claim did not commit ({outcome.value})")
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
        for task_id in sorted(self._wanted_standbys - self._tasks.keys() - updater.tasks.keys() - self._to_revive):
            try:
                standby = StandbyTask(
                    self.resolved,
                    task_id,
                    state_dir=self.config.state_dir,
                    cache_limits=self.config.cache_limits,
                    checkpoint_min_records=self.config.checkpoint_min_records,
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
        """Commit the tasks (under exactly-once: every task, releasing these), then close them;
        returns the input offsets committed."""
        task_ids = [t for t in task_ids if t in self._tasks or t in self._to_revive]
        self._to_revive -= set(task_ids)  # rebuilt for nothing: they are leaving
        tasks = [self._tasks[t] for t in task_ids if t in self._tasks]
        if not tasks:
            return {}
        offsets = {p: o for task in tasks for p, o in task.next_offsets.items()}
        outcome = self._commit(tasks, releasing={t.id for t in tasks})
        if outcome is CommitOutcome.ABORTED:
            assert self._sender is not None
            try:
                self._commits.release(self._sender, [t.id for t in tasks])
            except Exception:
                log.warning(
                    "releasing tasks %s after their aborted commit failed; their next owner fences this thread",
                    ", ".join(str(t.id) for t in tasks),
                    exc_info=True,
                )
        for task in tasks:
            if task.id not in self._tasks:
                continue  # dropped by the commit's failure
            if outcome is CommitOutcome.COMMITTED:
                task.close_clean()
            else:
                task.close_dirty()  # its last outputs were aborted: the next owner redoes them
            self._forget(task)
        self._assign_inputs()
        self._reconcile_standbys()  # a demoted active may stay here as a replica
        return offsets if outcome is CommitOutcome.COMMITTED else {}

    def lose_tasks(self, task_ids: Iterable[TaskId]) -> None:
        """Drop the tasks without committing (another member may own them already). Under
        exactly-once the thread's open transaction goes with them, and the other tasks that
        wrote into it are rebuilt."""
        lost = set(task_ids)
        self._to_revive -= lost
        tasks = [self._tasks[t] for t in sorted(lost) if t in self._tasks]
        if not tasks:
            return
        if self.guarantee.exactly_once:
            assert self._sender is not None
            dirty = [t for t in self._tasks.values() if t.dirty]
            outcome = self._commits.abort(self._sender) if dirty else CommitOutcome.ABORTED
            if outcome is CommitOutcome.MIGRATED:
                self._migrated("the abort of its transaction found the producer fenced")
            self._drop([t.id for t in tasks])
            self._schedule_revive([t for t in dirty if t.id not in lost])
        else:
            self._drop([t.id for t in tasks])
        self._reconcile_standbys()

    def _drop(self, task_ids: Iterable[TaskId]) -> None:
        """Close tasks without committing: cached writes are dropped and the local state is
        wiped (RocksDB may hold writes that no commit covers)."""
        dropped = []
        for task_id in task_ids:
            task = self._tasks.get(task_id)
            if task is None:
                continue
            task.close_dirty()
            self._forget(task)
            dropped.append(task_id)
        self._commits.forget(dropped)
        self._assign_inputs()

    def _forget(self, task: StreamTask) -> None:
        for reason, count in _dropped_records(task).items():
            self._dropped_by_closed_tasks[reason] = self._dropped_by_closed_tasks.get(reason, 0) + count
        del self._tasks[task.id]
        for partition in task.input_partitions:
            self._task_of_partition.pop(partition, None)

    def _assign_inputs(self) -> None:
        # assign() keeps the fetch position of partitions that stay assigned.
        if self._consumer is not None:
            self._consumer.assign([KafkaTopicPartition(*p) for p in self._task_of_partition])

    # -- exactly-once failures ------------------------------------------------------------------

    def _migrated(self, reason: str) -> None:
        """Another owner has the tasks: drop them all, uncommitted, and say so."""
        dropped = sorted(self._tasks) + sorted(self._to_revive)
        self._to_revive.clear()
        self._drop(list(self._tasks))
        self.counters.task_migrations += 1
        raise TaskMigratedError(f"tasks {', '.join(map(str, dropped)) or '(none)'} dropped without committing: {reason}")

    def _schedule_revive(self, tasks: Iterable[StreamTask]) -> None:
        """Tasks whose state holds writes of an aborted transaction: closed (wiped) now,
        rebuilt from their changelogs and positions before the next poll."""
        ids = [t.id for t in tasks if t.id in self._tasks]
        if not ids:
            return
        log.warning("rebuilding tasks %s: their last writes were aborted", ", ".join(map(str, ids)))
        self._drop(ids)
        self._to_revive.update(ids)

    def _revive(self) -> None:
        if time.monotonic() < self._revive_after:
            return
        ids = sorted(self._to_revive)
        try:
            self.add_tasks(ids, _reviving=True)
        except TaskMigratedError:
            self._to_revive.clear()
            self._migrated("a task's positions were written by another owner after this thread's")
        except Exception:
            log.exception("rebuilding tasks %s failed; retrying", ", ".join(map(str, ids)))
            self._revive_after = time.monotonic() + _REVIVE_RETRY_S
            return
        started = set(ids) & self._tasks.keys()
        self.counters.tasks_revived += len(started)
        self._to_revive -= started

    # -- processing -----------------------------------------------------------------------

    def wake(self) -> None:
        """Cut short :meth:`poll`'s wait (thread-safe): an idle wait at once, a fetch for active
        tasks within ``_COMMAND_CHECK_MS``."""
        self._woken.set()

    def poll(self, timeout_ms: int | None = None) -> int:
        """Fetch once, process what came, run due wall-clock punctuations; returns the number
        of records processed."""
        timeout = timeout_ms if timeout_ms is not None else self.config.poll_timeout_ms
        if self._to_revive:
            self._revive()
        updater = self._standby_updater
        if updater is not None and self._wanted_standbys - updater.tasks.keys() - self._tasks.keys():
            self._reconcile_standbys()
        following = updater if updater is not None and updater.tasks else None
        counters = self.counters
        counters.polls += 1
        if self._follows_global_tables and self.global_tables is not None:
            self.global_tables.poll(0)
        if not self._task_of_partition:
            # Replicas catch up between input batches; with no active work they get the wait.
            if following is not None:
                counters.standby_records += following.poll(timeout)
            elif self._woken.wait(timeout / 1000):
                self._woken.clear()
            self._punctuate_wall_clock()
            self._send_repartition_buffers()
            return 0
        try:
            self._commits.ensure_open()
        except TransactionError:
            raise  # fatal: authorization, configuration
        except Exception as error:
            self._migrated(f"its transaction could not be opened ({error!r})")
        if following is not None:
            counters.standby_records += following.poll(0)
        fetched = self._fetch(timeout)
        try:
            return self._process(fetched)
        except TaskMigratedError:
            raise
        except Exception as error:
            if self.guarantee.exactly_once and classify(error) is TransactionErrorKind.FENCED:
                # kafka-python refuses sends once the producer is fenced: the tasks are someone else's.
                assert self._sender is not None
                self._commits.abort(self._sender)
                self._migrated(f"its producer was fenced ({error!r})")
            raise

    def _fetch(self, timeout_ms: int) -> Mapping[Any, list[Any]]:
        """The active tasks' next records, waiting up to ``timeout_ms`` for them, or less when
        :meth:`wake` asks for the thread (the fetches in flight stay in flight)."""
        consumer, limit = self._consumer, self._batch_size.limit
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            fetched = consumer.poll(timeout_ms=min(timeout_ms, _COMMAND_CHECK_MS), max_records=limit)
            if fetched:
                return fetched
            if self._woken.is_set():
                self._woken.clear()
                return fetched
            timeout_ms = int((deadline - time.monotonic()) * 1000)
            if timeout_ms <= 0:
                return fetched

    def _process(self, fetched: Mapping[Any, list[Any]]) -> int:
        counters = self.counters
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
                ordered = list(heapq.merge(*(expand_packed(records, packed_topics) for _, records in batches), key=_by_timestamp))
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

    def commit(self) -> dict[TopicPartition, int]:
        """Commit every task now; returns the input offsets committed."""
        offsets = {p: o for task in self._tasks.values() for p, o in task.next_offsets.items()}
        outcome = self._commit_all()
        return offsets if outcome is CommitOutcome.COMMITTED else {}

    def _commit_all(self, *, background: bool = False) -> CommitOutcome:
        return self._commit(list(self._tasks.values()), background=background)

    def _commit(self, tasks: list[StreamTask], *, releasing: Collection[TaskId] = (), background: bool = False) -> CommitOutcome:
        """Commit ``tasks`` (under exactly-once the thread's transaction covers every task, so
        all of them are committed) and checkpoint replicas; then deal with the outcome: tasks
        whose writes were aborted are rebuilt, migrated ones raise TaskMigratedError."""
        assert self._sender is not None
        if not self._tasks:
            self._last_commit = time.monotonic()
            return CommitOutcome.COMMITTED
        started = time.perf_counter()
        if self.guarantee.exactly_once:
            tasks = list(self._tasks.values())
        # A started task leaves the commit-at-once set only with a commit of its own records:
        # the first records of a downstream sub-topology's task come after the upstream ones
        # were committed, and would otherwise wait out a whole interval.
        flushed = [t.id for t in tasks if t.dirty]
        try:
            outcome = self._commits.commit(self._sender, tasks, releasing=releasing, background=background)
        except Exception:
            if self.guarantee.exactly_once:  # the transaction was aborted: rebuild what wrote into it
                self._schedule_revive([t for t in self._tasks.values() if t.dirty and t.id not in releasing])
            raise
        self._last_commit = time.monotonic()
        self.counters.dropped_records = self.dropped_records  # one snapshot per commit, for the metrics thread
        if outcome is CommitOutcome.COMMITTED:
            self._started_since_commit.difference_update(flushed)
            if len(tasks) == len(self._tasks):
                for standby in self.standby_tasks.values():
                    standby.checkpoint()
                if self._follows_global_tables and self.global_tables is not None:
                    self.global_tables.checkpoint()
            if self._on_commit is not None:
                self._on_commit(time.perf_counter() - started)
        elif outcome is CommitOutcome.MIGRATED:
            self._migrated("the coordinator or a newer producer fenced this thread")
        else:
            self._schedule_revive([t for t in self._tasks.values() if t.dirty and t.id not in releasing])
        return outcome

    def maybe_commit(self) -> CommitOutcome | None:
        """Commit when the commit interval has passed, or when a task that started and has not
        committed records of its own yet has processed some (its first output is not held back
        a whole interval)."""
        if (time.monotonic() - self._last_commit) * 1000 >= self.config.commit_interval_ms or self._a_started_task_processed():
            return self._commit_all(background=True)
        return None

    def _a_started_task_processed(self) -> bool:
        if not self._started_since_commit:
            return False
        self._started_since_commit.intersection_update(self._tasks)
        return any(self._tasks[t].dirty for t in self._started_since_commit)

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
    def dropped_records(self) -> dict[str, int]:
        """Records the topology skipped, by reason (Kafka Streams' dropped-records): a null key
        (tables, aggregations, joins), late (windows closed), an invalid (negative) timestamp."""
        totals = dict(self._dropped_by_closed_tasks)
        for task in self._tasks.values():
            for reason, count in _dropped_records(task).items():
                totals[reason] = totals.get(reason, 0) + count
        return totals

    @property
    def records_produced(self) -> int:
        """Records the producer confirmed written (outputs, changelogs, packed repartition
        records), counted when a flush checks them."""
        return self._sender.records_sent if self._sender is not None else 0

    @property
    def transactions_committed(self) -> int:
        """Exactly-once: transactions this engine's producers committed."""
        return self._commits.transactions_committed

    @property
    def transactions_aborted(self) -> int:
        return self._commits.transactions_aborted

    @property
    def aborted_records_dropped(self) -> int:
        """Exactly-once: records of aborted transactions the fetch-side filter dropped (since
        each partition was last sought): what the embedded broker hands read_committed readers."""
        consumers = [self._consumer, getattr(self._standby_updater, "_consumer", None), getattr(self._restorer, "_consumer", None)]
        return sum(getattr(c, "aborted_records", 0) for c in consumers if c is not None)

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


def _dropped_records(task: StreamTask) -> dict[str, int]:
    ctx = task.ctx
    return {"null-key": ctx.null_keys_dropped, "late": ctx.late_records_dropped, "invalid-timestamp": ctx.invalid_timestamps_dropped}


def _parse_task_id(text: str) -> TaskId | None:
    try:
        return TaskId.parse(text)
    except ValueError:
        return None
