"""The stream-worker process: group membership (KIP-848, client-side task assignment) around
the synchronous :class:`~pystreams.worker.engine.TaskEngine`.

**Group protocol** (Kafka's ``group.protocol``): ``consumer`` (the default) makes each stream
thread a KIP-848 member; ``classic`` makes it a classic member (JoinGroup/SyncGroup) whose
subscription userData carries the same Streams metadata, whose elected leader runs the same
task assignor, and which rebalances cooperatively (only moving tasks are revoked). Both members
hand the stream thread the same events, so nothing below depends on the protocol; a fleet can
run classic, roll to consumer one worker at a time (the coordinator converts the group) and
roll back.

Design — **one asyncio loop, one engine thread per stream thread.**

* The process's main thread runs one asyncio loop. It drives one :class:`MemberDriver` per
  stream thread (heartbeats, Prepare/Install with the :class:`StickyTaskAssignor`, events) in
  the group ``application.id`` = the app's id.
* Each stream thread owns one :class:`TaskEngine` and one :class:`EngineThread`
  (worker/engine_thread.py), the only OS thread ever touching that engine: it loops *run queued
  commands → ``engine.poll()`` → commit when ``commit_interval_ms`` has passed*. So the engine
  stays single-threaded, as it requires.
* Membership events are turned into engine commands: the asyncio ``on_event`` handler puts a
  command (add / revoke / lose tasks) on the thread's queue and awaits its completion, so the
  driver acknowledges a revocation only once the revoked tasks are committed and closed; the
  driver keeps heartbeating meanwhile (events run in their own task).
* The engine's offset callbacks go through the thread's :class:`OffsetGate`
  (worker/offset_gate.py), which hops onto the loop where the driver commits with its member id
  and epoch. Which callbacks the engine gets depends on ``processing.guarantee``: at-least-once
  gets a background committer for periodic commits and a blocking one for revocations;
  exactly-once gets the *membership gate* (the offsets reach the coordinator inside each commit,
  before the Kafka transaction commits, and a refusal aborts it).
* Exactly-once gives each stream thread a transactional producer whose ``transactional.id`` is
  stable across restarts (:func:`transactional_id_for`): the static instance id, else a process
  id persisted in the state directory. When the engine reports the thread's tasks migrated
  (fenced), the thread drops them, waits for a heartbeat to hear what it owns now, and starts
  those tasks again.

Tasks start only when *all* their input partitions are owned (co-partitioning: the assignor
hands them out together; during an incremental hand-off they may arrive in several events),
and stop as soon as any of their partitions is revoked or lost.

Shutdown (SIGTERM/SIGINT): every member leaves — the member revokes everything first, so the
tasks commit and close through the same revocation path — with epoch -1, or -2 for a static
member (``--instance-id``) so that its restart gets its tasks back; then the engine threads
close and the drivers stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import re
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pystreams.assignors.api import TopicMetadata
from pystreams.assignors.streams import AssignmentError, MemberReason, StickyTaskAssignor, StreamsAssignmentMetadata
from pystreams.assignors.streams.placement import HaConfig
from pystreams.client.classic import ClassicMemberConfig
from pystreams.client.driver import MemberDriver
from pystreams.client.member import (
    InstanceIdUnreleased,
    LeftGroup,
    MemberConfig,
    MemberEvent,
    MemberFailed,
    MemberState,
    PartitionsAssigned,
    PartitionsLost,
    RevokePartitions,
)
from pystreams.cluster import ClusterMetadata
from pystreams.guarantee import ProcessingGuarantee
from pystreams.partitions import TopicIdPartition
from pystreams.protocol.security import ClientSecurity
from pystreams.state import TopicPartition
from pystreams.topology.ir import TaskId
from pystreams.topology.kernels import SuppressionBufferFullError
from pystreams.topology.resolve import ResolvedTopology

from .commits import TaskMigratedError
from .engine import EngineConfig, TaskEngine, internal_topic_specs, resolve_against_cluster
from .engine_thread import EngineStopped, EngineThread
from .errors import MissingDeadLetterTopic, RecordProcessingError, skip_hint
from .global_tables import GlobalTables, GlobalThread
from .identity import ProcessIdentity, transactional_id_for
from .offset_gate import OffsetGate
from .progress import LagSnapshot, ReplicaProgressLog, RestoreTracker
from .warmup import WarmUpTracker

if TYPE_CHECKING:  # aiohttp and prometheus_client load only for a worker that serves HTTP
    from .http import HttpSite
    from .metrics import WorkerMetrics

log = logging.getLogger(__name__)

#: Kafka Streams commits every 30 s; this project's demos and tests want results sooner, and
#: a short interval also bounds what a crash makes the next owner reprocess. Under exactly-once
#: the default is 100 ms (``ProcessingGuarantee.default_commit_interval_ms``).
DEFAULT_COMMIT_INTERVAL_MS = ProcessingGuarantee.AT_LEAST_ONCE.default_commit_interval_ms
#: A static member refused this long is more likely a duplicate instance id than a crash-restart.
_UNRELEASED_ALARM_S = 120.0
#: How long a task that failed to start waits before the next try.
_START_RETRY_S = 1.0
#: How soon a task whose state a sibling thread's replica still locks is started again.
_LOCKED_TASK_RETRY_S = 0.2
#: How long a worker that asked the application to shut down waits to hear the answer.
_SHUTDOWN_GRACE_S = 5.0
#: How long a stopping stream thread waits for its leave (which commits every task first);
#: the Kubernetes grace period must be longer than this (deploy/ checks it).
LEAVE_TIMEOUT_S = 30.0
#: How often a stream thread looks at its member to tell when a rebalance has settled.
_REBALANCE_WATCH_S = 0.1
#: Member states in which the member is in the group with an assignment it acts on.
_IN_GROUP = frozenset({MemberState.STABLE, MemberState.RECONCILING, MemberState.ACKNOWLEDGING})
#: Kafka's ``group.protocol`` values.
GROUP_PROTOCOLS = ("consumer", "classic")
#: How often a classic member's topic metadata is refreshed (a regex subscription and the
#: leader's partition watch read it); KIP-848 members leave this to the coordinator.
_CLASSIC_METADATA_MAX_AGE_MS = 30_000

T = TypeVar("T")


@dataclass(frozen=True)
class WorkerSettings:
    app: str  # path/to/app.py or module[:attribute]
    bootstrap_servers: str  # the Kafka cluster (data)
    coordinator: str  # where the group coordinator is bootstrapped
    #: Give up (exit 1) when no coordinator was ever reached within this long; None: retry
    #: forever. A worker that once reached it keeps retrying (the coordinator restarts).
    coordinator_connect_timeout_ms: int | None = 60_000
    instance_id: str | None = None
    state_dir: str | None = None
    threads: int = 1
    #: None: the guarantee's default (1 s at-least-once, 100 ms exactly-once).
    commit_interval_ms: int | None = None
    #: None: the app's ``processing_guarantee`` (at-least-once unless it says otherwise).
    processing_guarantee: ProcessingGuarantee | None = None
    user_endpoint: str = ""
    rebalance_timeout_ms: int = 60_000
    #: ``group.protocol``: "consumer" (KIP-848) or "classic" (JoinGroup/SyncGroup).
    group_protocol: str = "consumer"
    #: Classic members only (a KIP-848 group's are the coordinator's): ``session.timeout.ms``
    #: and ``heartbeat.interval.ms``, Kafka's consumer defaults.
    session_timeout_ms: int = 45_000
    heartbeat_interval_ms: int = 3_000
    #: Standby replicas, warm-ups and placement (Kafka Streams' config names, dots as _).
    ha: HaConfig = HaConfig()
    #: e.g. {"zone": "eu-1a"}: matched against ``ha.rack_aware_assignment_tags``.
    client_tags: Mapping[str, str] = dataclasses.field(default_factory=dict)
    #: How often warm-up lags are checked (and WarmUpReady / WarmUpFailed decided).
    lag_check_interval_ms: int = 1_000
    #: A fatal error in this worker asks every member to shut down (reason SHUTDOWN), as
    #: Kafka Streams' SHUTDOWN_APPLICATION; otherwise only this worker stops.
    shutdown_application_on_error: bool = False
    #: Security toward the coordinator, and toward the Kafka brokers (kafka-python's names).
    coordinator_security: ClientSecurity = dataclasses.field(default_factory=ClientSecurity)
    broker_security: ClientSecurity = dataclasses.field(default_factory=ClientSecurity)
    #: Serve /healthz, /readyz and /metrics on this port (None: not at all).
    http_port: int | None = None
    #: The address the HTTP endpoints bind (operations and queries); None: every interface for
    #: operations, and for queries loopback or every interface as the user endpoint's host is.
    http_host: str | None = None
    #: A downward-API annotations file read at shutdown: ``pystreams.io/leave-group="true"``
    #: makes a static member leave for good (see :func:`leaves_for_good`).
    pod_annotations: str | None = None
    #: Error policies replacing the app's (None: the app's own; see ``App``).
    deserialization_errors: str | None = None
    processing_errors: str | None = None
    dead_letter_topic: str | None = None

    def __post_init__(self) -> None:
        if self.threads < 1:
            raise ValueError("threads must be at least 1")
        if self.commit_interval_ms is not None and self.commit_interval_ms < 1:
            raise ValueError("commit interval must be positive")
        if self.instance_id == "":
            raise ValueError("instance id, when given, must be non-empty")
        if self.group_protocol not in GROUP_PROTOCOLS:
            raise ValueError(f"group protocol must be one of {', '.join(GROUP_PROTOCOLS)}, not {self.group_protocol!r}")
        if not 0 < self.heartbeat_interval_ms < self.session_timeout_ms:
            raise ValueError("the heartbeat interval must be positive and below the session timeout")
        if self.http_port is not None and not 0 <= self.http_port <= 65535:
            raise ValueError(f"http port out of range 0-65535: {self.http_port}")
        endpoint_port = self.user_endpoint.rpartition(":")[2]
        if self.http_port and endpoint_port.isdigit() and int(endpoint_port) == self.http_port:
            raise ValueError(
                f"the user endpoint {self.user_endpoint} and the HTTP port {self.http_port} must differ (queries and health/metrics are served separately)"
            )


def subscription_for(resolved: ResolvedTopology) -> tuple[list[str] | None, str | None]:
    """(topic names, None), or (None, one RE2 regex) when the topology has patterns: the
    protocol takes names *or* one regex, so names are folded into the regex as literals."""
    topology = resolved.topology
    names = sorted({*topology.external_source_topics, *topology.repartition_topics})
    if not topology.source_patterns:
        return names, None
    alternatives = [re.escape(name) for name in names] + [f"(?:{p})" for p in topology.source_patterns]
    return None, "|".join(alternatives)


class TopicNames:
    """Topic ids, names and partition counts, from the cluster (the coordinator derives ids the
    same way). A classic member's topic resolver too (``pystreams.client.topics``)."""

    def __init__(self, bootstrap_servers: str, client_config: Mapping[str, Any] | None = None) -> None:
        self._bootstrap_servers = bootstrap_servers
        self._client_config = dict(client_config or {})
        self._names: dict[uuid.UUID, str] = {}
        self._topics: dict[str, TopicMetadata] = {}
        self._lock = threading.Lock()

    def refresh(self) -> None:
        with ClusterMetadata(self._bootstrap_servers, **self._client_config) as cluster:
            topics = cluster.fetch_topics()
        with self._lock:
            self._names.update({meta.topic_id: name for name, meta in topics.items()})
            self._topics = {name: TopicMetadata(topic_id=meta.topic_id, name=name, num_partitions=meta.num_partitions) for name, meta in topics.items()}

    def name_of(self, topic_id: uuid.UUID) -> str | None:
        with self._lock:
            return self._names.get(topic_id)

    def topic(self, name: str) -> TopicMetadata | None:
        with self._lock:
            return self._topics.get(name)

    def topic_names(self) -> list[str]:
        with self._lock:
            return list(self._topics)


class StreamThread:
    """One group member (asyncio) and the engine thread that runs its tasks."""

    def __init__(
        self,
        index: int,
        resolved: ResolvedTopology,
        settings: WorkerSettings,
        *,
        process_id: uuid.UUID,
        state_dir: Path,
        topic_names: TopicNames,
        loop: asyncio.AbstractEventLoop,
        on_fatal: Callable[[str], None],
        on_shutdown_requested: Callable[[], None] = lambda: None,
        metrics: WorkerMetrics | None = None,
        transactional_identity: uuid.UUID | None = None,
        global_tables: GlobalTables | None = None,
    ) -> None:
        self.index = index
        self.resolved = resolved
        self.name = f"stream-thread-{index}"
        self._loop = loop
        self._topic_names = topic_names
        self._on_fatal = on_fatal
        self._on_shutdown_requested = on_shutdown_requested
        self._settings = settings
        app_id = resolved.topology.app_id
        #: Restore progress (metrics, logs) and the lags of the last lag check (metrics).
        self.restores = RestoreTracker()
        self.lags = LagSnapshot()
        self._replica_log = ReplicaProgressLog(self.name)
        commit_latency = metrics.commit_latency.labels(self.name) if metrics is not None else None
        self._rebalance_duration = metrics.rebalance_duration.labels(self.name) if metrics is not None else None
        self._rebalance_started: float | None = None
        self._stopping = False
        guarantee = settings.processing_guarantee or ProcessingGuarantee.AT_LEAST_ONCE
        self.exactly_once = guarantee.exactly_once
        instance_id = settings.instance_id
        if instance_id is not None and settings.threads > 1:
            instance_id = f"{instance_id}-{index}"
        self.transactional_id = (
            transactional_id_for(
                app_id,
                instance_id=settings.instance_id,
                process_id=transactional_identity or process_id,
                thread_index=index,
            )
            if self.exactly_once
            else None
        )
        self.assignor = StickyTaskAssignor(
            resolved,
            process_id=process_id,
            user_endpoint=settings.user_endpoint,
            client_tags=settings.client_tags,
            ha=settings.ha,
            on_assignment=self._on_assignment_metadata,
        )
        self.warmups = WarmUpTracker(settings.ha.acceptable_recovery_lag)
        #: The latest assignment metadata (interactive queries route with it).
        self.assignment: StreamsAssignmentMetadata | None = None
        #: Tasks being restored right now (queries answer "not available yet" for them).
        self.restoring: frozenset[TaskId] = frozenset()
        self.driver = MemberDriver(
            self._member_config(app_id, instance_id),
            settings.coordinator,
            topics=topic_names,
            metadata_max_age_ms=_CLASSIC_METADATA_MAX_AGE_MS,
            on_event=self._on_event,
            security=settings.coordinator_security,
            connect_timeout_ms=settings.coordinator_connect_timeout_ms,
        )
        self._offsets = OffsetGate(self.name, self.driver, loop)
        self.engine = TaskEngine(
            resolved,
            EngineConfig(
                bootstrap_servers=settings.bootstrap_servers,
                # One directory per process: a task promoted from a replica on another stream
                # thread of this process finds its state (the task lock keeps it exclusive).
                state_dir=state_dir,
                client_id=f"{app_id}-{process_id.hex[:8]}-{self.name}",
                commit_interval_ms=settings.commit_interval_ms or guarantee.default_commit_interval_ms,
                create_internal_topics=False,  # the process created them before joining
                client_config=settings.broker_security.kafka_python_config(),
                processing_guarantee=guarantee,
                transactional_id=self.transactional_id,
            ),
            committed_offsets=self._offsets.read_committed_blocking,
            commit_offsets=self._offsets.confirm_membership if self.exactly_once else self._offsets.commit_blocking,
            commit_offsets_in_background=None if self.exactly_once else self._offsets.commit_in_background,
            on_restore_progress=self.restores,
            on_commit=commit_latency.observe if commit_latency is not None else None,
            global_tables=global_tables,
        )
        self._engine_thread = EngineThread(
            self.name,
            self.engine,
            loop=loop,
            lag_check_interval_ms=settings.lag_check_interval_ms,
            check_lags=self._check_lags,
            on_tasks_migrated=self._tasks_migrated,
            on_failure=self._engine_failed,
        )
        self._task_of_partition: dict[TopicPartition, TaskId] = {
            TopicPartition(*pair): task for task in resolved.tasks for pair in resolved.input_partitions(task)
        }
        # Replaced, never mutated: the metrics collector reads them from another thread.
        self._owned: frozenset[TopicPartition] = frozenset()
        self._running: frozenset[TaskId] = frozenset()
        #: Membership events and retries of locked tasks run one at a time, in order.
        self._membership_lock = asyncio.Lock()
        self._unreleased_since: float | None = None
        self._migration_recovery: asyncio.Task[None] | None = None
        self._start_retry: asyncio.Task[None] | None = None
        self._rebalance_watch: asyncio.Task[None] | None = None

    def _member_config(self, app_id: str, instance_id: str | None) -> MemberConfig | ClassicMemberConfig:
        settings = self._settings
        client_id = f"{app_id}-{self.name}"
        if settings.group_protocol == "classic":
            return ClassicMemberConfig(
                group_id=app_id,
                client_id=client_id,
                instance_id=instance_id,
                session_timeout_ms=settings.session_timeout_ms,
                heartbeat_interval_ms=settings.heartbeat_interval_ms,
                rebalance_timeout_ms=settings.rebalance_timeout_ms,
                assignors=[self.assignor],
            )
        return MemberConfig(
            group_id=app_id,
            client_id=client_id,
            instance_id=instance_id,
            rebalance_timeout_ms=settings.rebalance_timeout_ms,
            client_assignors=[self.assignor],
        )

    # -- lifecycle (asyncio side) -------------------------------------------------------------

    async def start(self, topics: Sequence[str] | None, regex: str | None, reason: MemberReason = MemberReason.NONE) -> None:
        await self._engine_thread.start()
        # The join advertises where state already is, so the assignor can keep tasks there.
        self.assignor.report(await self._engine_thread.call(self.engine.task_lags), reason)
        self.driver.subscribe(topics=topics, regex=regex)
        await self.driver.start()
        self._rebalance_watch = asyncio.get_running_loop().create_task(self._watch_rebalances())

    async def shutdown(self, timeout_s: float = LEAVE_TIMEOUT_S, *, permanent: bool = False) -> None:
        """Leave (revoking = committing everything), close the engine, stop the driver. A
        static member leaves with -2 (back soon, keep my tasks) unless ``permanent``."""
        self._stopping = True
        if self._rebalance_watch is not None:
            self._rebalance_watch.cancel()
        # A failed engine cannot commit: waiting for a revocation it will never complete would
        # keep its tasks here until the session times out. It loses them and leaves for good
        # (a static member too), so another member takes them over within a heartbeat or two.
        failed = self.engine_failure is not None
        try:
            await self.driver.leave(timeout_s=timeout_s, permanent=permanent or failed, lose=failed)
        except TimeoutError:
            log.warning("%s: leaving the group timed out", self.name)
        except Exception:
            log.exception("%s: leaving the group failed", self.name)
        if self._start_retry is not None:
            self._start_retry.cancel()
        await self._engine_thread.stop(timeout_s)
        await self.driver.stop()

    @property
    def alive(self) -> bool:
        return self._engine_thread.alive

    @property
    def engine_failure(self) -> BaseException | None:
        """Why the engine thread failed (None: it did not). Such a thread cannot commit: its
        member leaves at once and its tasks are lost, not revoked."""
        return self._engine_thread.failure

    @property
    def records_processed(self) -> int:
        """Records run through the topology so far, those of a poll that failed midway included."""
        return self.engine.counters.records_processed

    @property
    def running_tasks(self) -> frozenset[TaskId]:
        return frozenset(self._running)

    @property
    def ready(self) -> bool:
        """Kafka Streams' RUNNING, as a readiness probe wants it: in the group with a target
        assignment heard, and every active task whose partitions are all owned restored and
        running (nothing restoring, nothing waiting to start). A thread the assignment gives no
        active task is ready once it has heard that assignment (as a Kafka Streams thread is
        RUNNING after its rebalance)."""
        if self._stopping or not self._engine_thread.alive or self.assignment is None:
            return False
        member = self.driver.member
        if member.state not in _IN_GROUP or self.restoring or not self._caught_up_with(member):
            return False
        return not self._startable_tasks()

    def _caught_up_with(self, member: Any) -> bool:
        """Whether every partition the member owns has reached this thread: the assignment is
        heard before its PartitionsAssigned event is handled, so the two can differ briefly."""
        return len(member.owned_partitions) == len(self._owned)

    @property
    def state(self) -> str:
        """One of metrics.THREAD_STATES."""
        if not self._engine_thread.alive:
            return "dead" if self._engine_thread.started else "starting"
        if self._stopping:
            return "pending_shutdown"
        if self.restoring:
            return "restoring"
        if self.assignment is None:
            return "starting"
        if self._rebalance_started is not None or self.driver.member.state not in _IN_GROUP:
            return "rebalancing"
        return "running"

    # -- rebalances (asyncio side) ------------------------------------------------------------

    def _rebalance_began(self) -> None:
        if self._rebalance_started is None:
            self._rebalance_started = time.monotonic()

    def _check_rebalance_settled(self) -> None:
        """A rebalance ends when the member is stable with nothing pending and the tasks it
        owns are running (restores included: the task is not processing before that)."""
        if self._rebalance_started is None:
            return
        member = self.driver.member
        if member.state is not MemberState.STABLE or member.pending_partitions or member.revoking_partitions:
            return
        if not self._caught_up_with(member):
            return
        if self.restoring or self._startable_tasks():
            return
        duration = time.monotonic() - self._rebalance_started
        self._rebalance_started = None
        if self._rebalance_duration is not None:
            self._rebalance_duration.observe(duration)
        log.info("%s: rebalance settled after %.2f s (%d active tasks)", self.name, duration, len(self._running))

    async def _watch_rebalances(self) -> None:
        # The member becomes stable when its acknowledgement is answered: no event says so.
        while True:
            await asyncio.sleep(_REBALANCE_WATCH_S)
            self._check_rebalance_settled()

    # -- membership events (asyncio side) -----------------------------------------------------

    async def _on_event(self, event: MemberEvent) -> None:
        if isinstance(event, (PartitionsAssigned, RevokePartitions, PartitionsLost)):
            self._rebalance_began()
        async with self._membership_lock:
            await self._handle_event(event)
        self._check_rebalance_settled()

    async def _handle_event(self, event: MemberEvent) -> None:
        if isinstance(event, PartitionsAssigned):
            self._owned = self._owned | await self._named(event.partitions)
            await self._start_owned_tasks()
        elif isinstance(event, RevokePartitions):
            revoked = await self._named(event.partitions)
            self._owned = self._owned - revoked
            stopping = self._tasks_touching(revoked)
            if stopping:
                try:
                    await self._engine_thread.call(lambda: self.engine.revoke_tasks(stopping))
                    log.info("%s: revoked tasks %s (committed)", self.name, ", ".join(map(str, stopping)))
                except EngineStopped:
                    pass  # the stopped engine thread dropped every task itself
                except TaskMigratedError as error:
                    self._tasks_migrated(error)
                except Exception:
                    log.exception("%s: committing revoked tasks failed; dropping them", self.name)
                    await self._lose(stopping)
                self._running = self._running - set(stopping)
        elif isinstance(event, PartitionsLost):
            lost = await self._named(event.partitions)
            self._owned = self._owned - lost
            dropping = self._tasks_touching(lost)
            if dropping:
                await self._lose(dropping)
                self._running = self._running - set(dropping)
                log.warning("%s: lost tasks %s (error %d)", self.name, ", ".join(map(str, dropping)), event.error_code)
        elif isinstance(event, InstanceIdUnreleased):
            self._log_unreleased_instance_id(event)
        elif isinstance(event, MemberFailed):
            if self.driver.gave_up is not None:  # the message says it all (cause and fix)
                self._on_fatal(f"{self.name}: {event.message}")
            else:
                self._on_fatal(f"{self.name}: member failed: {event.message} (error {event.error_code})")
        elif isinstance(event, LeftGroup):
            log.info("%s: left the group (epoch %s)", self.name, event.member_epoch_sent)

    async def _lose(self, tasks: list[TaskId]) -> None:
        try:
            await self._engine_thread.call(lambda: self.engine.lose_tasks(tasks))
        except EngineStopped:
            pass  # the stopped engine thread dropped every task itself
        except TaskMigratedError as error:
            self._tasks_migrated(error)

    def _tasks_migrated(self, error: TaskMigratedError) -> None:
        """Exactly-once, on the loop: the engine dropped every task uncommitted because another
        owner took over. Ask the coordinator what this member owns now, then start that."""
        log.warning("%s: %s; asking the group what this member owns now", self.name, error)
        self._running = frozenset()
        if self._migration_recovery is None or self._migration_recovery.done():
            self._migration_recovery = asyncio.get_running_loop().create_task(self._recover_from_migration())

    async def _recover_from_migration(self) -> None:
        with contextlib.suppress(Exception):
            # A fenced member hears so here (and its events drop what it owned) before anything starts.
            await self.driver.next_heartbeat()
        async with self._membership_lock:
            # Starting the tasks may be fenced again (a new owner of another task fences this
            # thread's transactional id, which a dead incarnation of this worker used too): that
            # asks for a recovery of its own, which must not find this one still running.
            self._migration_recovery = None
            await self._start_owned_tasks()

    def _log_unreleased_instance_id(self, event: InstanceIdUnreleased) -> None:
        now = time.monotonic()
        if event.attempt == 1:
            self._unreleased_since = now
            log.warning(
                "%s: instance id %r is still held by this worker's previous incarnation (it stopped without leaving); "
                "retrying the join until that session expires",
                self.name,
                event.instance_id,
            )
        elif self._unreleased_since is not None and now - self._unreleased_since > _UNRELEASED_ALARM_S:
            self._unreleased_since = None  # said once per streak
            log.error(
                "%s: instance id %r has been held by another member for over %.0f s: is another live worker "
                "running with the same --instance-id? Still retrying.",
                self.name,
                event.instance_id,
                _UNRELEASED_ALARM_S,
            )
        else:
            log.debug("%s: instance id %r not released yet (attempt %d); next try in %d ms", self.name, event.instance_id, event.attempt, event.retry_in_ms)

    async def _start_owned_tasks(self) -> None:
        """Start every task whose input partitions are all owned and that does not run yet.
        A task whose state directory a sibling stream thread still holds (its replica there
        closes once that thread hears the new assignment) is retried shortly."""
        ready = self._startable_tasks()
        if not ready:
            return
        self.restoring = self.restoring | set(ready)
        try:
            restored = await self._engine_thread.call(lambda: self.engine.add_tasks(ready))
        except TaskMigratedError as error:
            self._tasks_migrated(error)
            return
        except Exception:
            if self._stopping:
                raise
            log.exception("%s: starting tasks %s failed; trying again in %.0f s", self.name, ", ".join(map(str, ready)), _START_RETRY_S)
            if self._start_retry is None or self._start_retry.done():
                self._start_retry = asyncio.get_running_loop().create_task(self._retry_start_owned_tasks(_START_RETRY_S))
            return
        finally:
            self.restoring = self.restoring - set(ready)
        started = sorted(restored)
        self._running = self._running | set(started)
        if started:
            records = sum(n for stores in restored.values() for n in stores.values())
            log.info("%s: started tasks %s (restored %d records)", self.name, ", ".join(map(str, started)), records)
        if len(started) < len(ready) and (self._start_retry is None or self._start_retry.done()):
            self._start_retry = asyncio.get_running_loop().create_task(self._retry_start_owned_tasks())

    def _startable_tasks(self) -> list[TaskId]:
        """Tasks whose input partitions are all owned here and that do not run yet."""
        owned = self._owned
        candidates = {task for p in owned if (task := self._task_of_partition.get(p)) is not None} - self._running
        return sorted(t for t in candidates if all(TopicPartition(*p) in owned for p in self.resolved.input_partitions(t)))

    async def _retry_start_owned_tasks(self, delay_s: float = _LOCKED_TASK_RETRY_S) -> None:
        await asyncio.sleep(delay_s)
        async with self._membership_lock:
            self._start_retry = None
            try:
                await self._start_owned_tasks()
            except Exception:
                log.exception("%s: starting tasks failed", self.name)

    def _on_assignment_metadata(self, error: int, assignment: StreamsAssignmentMetadata | None, group_epoch: int) -> None:
        """The assignor heard its member's new target (on the loop, synchronously): replicas
        start or stop between two polls; the engine is not waited for."""
        if error == AssignmentError.SHUTDOWN:
            log.warning("%s: a member asked the application to shut down (epoch %d)", self.name, group_epoch)
            self._on_shutdown_requested()
            return
        if assignment is None or error != AssignmentError.NONE:
            return
        self.assignment = assignment
        replicas = [*assignment.standby_task_ids(), *assignment.warmup_task_ids()]
        warmups = assignment.warmup_task_ids()
        standbys = assignment.standby_task_ids()
        self._engine_thread.post(lambda: self._set_replicas(replicas, warmups, standbys))

    def _set_replicas(self, replicas: list[TaskId], warmups: list[TaskId], standbys: list[TaskId]) -> None:
        # Nobody waits for this command: what goes wrong must be logged here.
        try:
            self.engine.set_standby_tasks(replicas)
        except Exception:
            log.exception("%s: opening replicas %s failed", self.name, ", ".join(map(str, sorted(replicas))))
        self.warmups.assigned(warmups, standbys)
        if replicas:
            log.info("%s: replicas %s (warm-ups %s)", self.name, ", ".join(map(str, sorted(replicas))), ", ".join(map(str, sorted(warmups))) or "none")

    def _check_lags(self, now_ms: int) -> None:
        """Engine thread, every lag check: publish lags for metrics, log replicas catching up,
        and tell the assignor when warm-ups are ready or failing."""
        replica_lags = self.engine.replica_lags()
        warmups = self.warmups.warmups
        self.lags = LagSnapshot(active=self.engine.input_lags(), replicas=replica_lags, warmups=warmups)
        self._replica_log.observe(replica_lags, warmups, self.engine.counters.standby_records)
        self._check_warmups(now_ms, replica_lags)

    def _check_warmups(self, now_ms: int, replica_lags: Mapping[TaskId, int]) -> None:
        """WarmUpReady / WarmUpFailed, with fresh lags, when warm-ups say so."""
        if not self.warmups.watching:
            return
        reason = self.warmups.observe(replica_lags, now_ms)
        if reason is not MemberReason.NONE:
            lags = self.engine.task_lags()
            log.info("%s: %s (warm-up lags %s)", self.name, reason.name, ", ".join(f"{t}={lags.get(t)}" for t in sorted(self.warmups.warmups)))
            self.assignor.report(lags, reason)
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self.driver.request_heartbeat)

    async def read_store(self, task: TaskId, store: str, key: bytes, *, include_standby: bool) -> tuple[bool, bytes | None]:
        """Interactive queries: (whether this thread has the task, the value bytes of ``key``)."""
        return await self.read_store_with(task, store, lambda kv: kv.get(key), include_standby=include_standby)

    async def read_store_with(self, task: TaskId, store: str, read: Callable[[Any], T], *, include_standby: bool) -> tuple[bool, T | None]:
        """Interactive queries: (whether this thread has the task, ``read(the task's store)``),
        run on the engine thread (``read`` must not keep iterators: the store moves on). Standby
        replicas answer only when ``include_standby``."""

        def run() -> tuple[bool, T | None]:
            active = self.engine.tasks.get(task)
            if active is not None and task not in self.restoring:
                return True, read(active.graph.typed_stores[store].raw)
            standby = self.engine.standby_tasks.get(task) if include_standby else None
            if standby is not None:
                return True, read(standby.state.store(store))
            return False, None

        if task not in self._running and not (include_standby and task in self.engine.standby_tasks):
            return False, None
        return await self._engine_thread.call(run)

    def _tasks_touching(self, partitions: Iterable[TopicPartition]) -> list[TaskId]:
        touched = {self._task_of_partition[p] for p in partitions if p in self._task_of_partition}
        return sorted(touched & self._running)

    async def _named(self, partitions: Iterable[TopicIdPartition]) -> set[TopicPartition]:
        partitions = list(partitions)
        if any(self._topic_names.name_of(p.topic_id) is None for p in partitions):
            await asyncio.get_running_loop().run_in_executor(None, self._topic_names.refresh)
        named = set()
        for topic_id, partition in partitions:
            name = self._topic_names.name_of(topic_id)
            if name is None:
                log.warning("%s: assigned partition of unknown topic id %s; ignored", self.name, topic_id)
                continue
            named.add(TopicPartition(name, partition))
        return named

    def _engine_failed(self, error: BaseException) -> None:
        self._on_fatal(f"{self.name} failed: {describe_engine_failure(error)}")


def _start_global_tables(
    resolved: ResolvedTopology, settings: WorkerSettings, state_dir: Path, process_id: uuid.UUID, loop: asyncio.AbstractEventLoop, stop: asyncio.Event
) -> GlobalThread:
    """Open the process's global tables, restore them to their topics' ends and start the
    thread following them (its failure stops the worker)."""
    guarantee = settings.processing_guarantee or ProcessingGuarantee.AT_LEAST_ONCE
    config = EngineConfig(
        bootstrap_servers=settings.bootstrap_servers,
        state_dir=state_dir,
        client_config=settings.broker_security.kafka_python_config(),
        processing_guarantee=guarantee,
    )
    tables = GlobalTables.open(resolved, config, f"{resolved.topology.app_id}-{process_id.hex[:8]}-global")
    try:
        tables.restore()
    except BaseException:
        tables.close()
        raise

    def on_failure(error: BaseException) -> None:
        loop.call_soon_threadsafe(stop.set)

    thread = GlobalThread(tables, checkpoint_interval_s=(settings.commit_interval_ms or guarantee.default_commit_interval_ms) / 1000, on_failure=on_failure)
    thread.start()
    return thread


def with_error_policies(topology: Any, settings: WorkerSettings) -> Any:
    """The topology with the settings' error policies replacing the app's (checked)."""
    errors = topology.errors.overridden(
        deserialization=settings.deserialization_errors, processing=settings.processing_errors, dead_letter_topic=settings.dead_letter_topic
    )
    errors.check()
    return dataclasses.replace(topology, errors=errors)


def describe_engine_failure(error: BaseException) -> str:
    """What failed, and for a bad record how to have such records skipped instead."""
    if isinstance(error, SuppressionBufferFullError):
        return str(error)  # no record is to blame: the message names the setting to change
    if isinstance(error, RecordProcessingError):
        return f"{error} ({skip_hint(error.failure.kind)})"
    return repr(error)


def exit_line(threads: Sequence[StreamThread]) -> str:
    """What the worker really processed: every record run through the topology (a poll that
    failed midway counts up to the failing record) and those the error policies skipped."""
    processed = sum(thread.records_processed for thread in threads)
    skipped = sum(thread.engine.errors.skipped for thread in threads)
    line = f"worker: stopped after processing {processed} records"
    if skipped:
        line += f" ({skipped} skipped by the error policies)"
    if any(thread.engine_failure is not None for thread in threads):
        line += "; what was not committed before the failure is processed again by the tasks' next owners"
    return line


def topology_change_reason(state_dir: Path, topology: Any) -> MemberReason:
    """TopologyChanged when this state directory last ran another topology: a static member
    rejoining with new code does not bump the group epoch by itself, so it says why."""
    marker = state_dir / topology.app_id / ".topology-hash"
    current = str(topology.hash)
    try:
        previous = marker.read_text().strip()
    except OSError:
        previous = None
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(current + "\n")
    if previous is not None and previous != current:
        log.info("topology changed since this state directory last ran (%s -> %s)", previous, current)
        return MemberReason.TOPOLOGY_CHANGED
    return MemberReason.NONE


#: The pod annotation that makes a static member leave the group for good when it stops.
LEAVE_GROUP_ANNOTATION = "pystreams.io/leave-group"


def leaves_for_good(annotations_file: str | None) -> bool:
    """Whether the downward-API annotations file says ``pystreams.io/leave-group="true"``.

    A static member normally leaves with -2 so that its restart gets its tasks back without a
    rebalance; a pod removed for good (scale-in) would then hold its tasks until the session
    timeout. Annotating it first (``kubectl annotate pod P pystreams.io/leave-group=true``; the
    kubelet updates the mounted file) makes it leave with -1 and its tasks move at once."""
    if not annotations_file:
        return False
    try:
        lines = Path(annotations_file).read_text().splitlines()
    except OSError as error:
        log.warning("cannot read pod annotations %s (%s); leaving as a static member would", annotations_file, error)
        return False
    for line in lines:
        key, sep, value = line.partition("=")
        if sep and key.strip() == LEAVE_GROUP_ANNOTATION:
            return value.strip().strip('"').lower() == "true"
    return False


def default_state_dir(app_id: str, instance_id: str | None) -> Path:
    """Kafka Streams' ``state.dir`` default is a temp directory too; an instance id keeps the
    same directory across restarts, so a static member finds its state again."""
    leaf = instance_id or f"process-{os.getpid()}"
    return Path(tempfile.gettempdir()) / "pystreams" / app_id / leaf


async def run_worker(settings: WorkerSettings, stop: asyncio.Event, *, announce: Callable[[str], None] = print) -> int:
    """Run until ``stop`` is set (or a stream thread fails); the exit status."""
    from pystreams.app import load_app

    app = load_app(settings.app)
    topology = with_error_policies(app.topology(), settings)
    guarantee = settings.processing_guarantee or app.processing_guarantee
    settings = dataclasses.replace(
        settings,
        processing_guarantee=guarantee,
        commit_interval_ms=settings.commit_interval_ms or guarantee.default_commit_interval_ms,
    )
    state_dir = Path(settings.state_dir) if settings.state_dir else default_state_dir(topology.app_id, settings.instance_id)
    threads: list[StreamThread] = []
    started: list[StreamThread] = []
    metrics = None
    sites: list[HttpSite] = []
    try:
        if settings.http_port is not None:
            from .http import HttpSite, OperationsRoutes
            from .metrics import WorkerMetrics

            metrics = WorkerMetrics()
            operations = OperationsRoutes(threads, metrics, started=lambda: bool(threads) and len(started) == len(threads))
            # Up before anything talks to Kafka: probes answer (not ready) while the worker starts.
            metrics.watch(threads, state_dir, topology.app_id, operations.ready)
            site = HttpSite(settings.http_host or "0.0.0.0", settings.http_port, operations.routes())
            await site.start()
            sites.append(site)
            announce(f"worker: health and metrics on http://{site.host}:{site.port} (/healthz, /readyz, /metrics)")
        return await _run_threads(settings, stop, announce, topology, state_dir, threads, started, metrics, sites)
    finally:
        for site in sites:
            await site.stop()


async def _run_threads(
    settings: WorkerSettings,
    stop: asyncio.Event,
    announce: Callable[[str], None],
    topology: Any,
    state_dir: Path,
    threads: list[StreamThread],
    started: list[StreamThread],
    metrics: WorkerMetrics | None,
    sites: list[HttpSite],
) -> int:
    loop = asyncio.get_running_loop()
    broker_config = settings.broker_security.kafka_python_config()
    resolved = await loop.run_in_executor(None, resolve_against_cluster, topology, settings.bootstrap_servers, broker_config)
    # Internal topics exist before anyone subscribes, so the first assignment includes them.
    guarantee = settings.processing_guarantee or ProcessingGuarantee.AT_LEAST_ONCE
    specs = internal_topic_specs(resolved, guarantee)

    dead_letter_topic = topology.errors.dead_letter_topic

    def prepare_cluster() -> None:
        with ClusterMetadata(settings.bootstrap_servers, **broker_config) as cluster:
            if dead_letter_topic and not cluster.fetch_topics([dead_letter_topic]):
                raise MissingDeadLetterTopic(dead_letter_topic)
            cluster.ensure_topics(specs)

    await loop.run_in_executor(None, prepare_cluster)
    topic_names = TopicNames(settings.bootstrap_servers, broker_config)
    await loop.run_in_executor(None, topic_names.refresh)

    process_id = uuid.uuid4()
    global_thread = None
    if topology.global_tables:
        # Restored before any stream thread joins: no task may look a row up before.
        global_thread = await loop.run_in_executor(None, _start_global_tables, resolved, settings, state_dir, process_id, loop, stop)
        announce(f"worker: global tables {', '.join(sorted(topology.global_tables))} restored ({global_thread.tables.records_restored} records) and followed")
    set_up = False
    try:
        # Exactly-once: the transactional ids outlive the process (see identity.py).
        identity = ProcessIdentity(state_dir, topology.app_id) if guarantee.exactly_once else None
        fatal: list[str] = []

        def on_fatal(message: str) -> None:
            fatal.append(message)
            log.error(message)
            if settings.shutdown_application_on_error and not stop.is_set():
                # Every member's next assignment carries the SHUTDOWN error; this worker stops
                # once it has heard it too (or after a grace period).
                for thread in threads:
                    thread.assignor.set_reason(MemberReason.SHUTDOWN)
                    thread.driver.request_heartbeat()
                loop.call_later(_SHUTDOWN_GRACE_S, stop.set)
                return
            stop.set()

        def on_shutdown_requested() -> None:
            if not stop.is_set():
                announce("worker: the application was asked to shut down by a member; stopping")
                stop.set()

        threads.extend(
            StreamThread(
                index,
                resolved,
                settings,
                process_id=process_id,
                state_dir=state_dir,
                topic_names=topic_names,
                loop=loop,
                on_fatal=on_fatal,
                on_shutdown_requested=on_shutdown_requested,
                metrics=metrics,
                transactional_identity=identity.process_id if identity is not None else None,
                global_tables=global_thread.tables if global_thread is not None else None,
            )
            for index in range(settings.threads)
        )
        topics, regex = subscription_for(resolved)
        reason = topology_change_reason(state_dir, topology)
        set_up = True
    finally:
        if not set_up and global_thread is not None:
            await loop.run_in_executor(None, global_thread.stop)  # not left following the topic for nothing
    try:
        if settings.user_endpoint:
            from .queries import QueryServer

            query_server = QueryServer(
                resolved,
                threads,
                settings.user_endpoint,
                bind_host=settings.http_host,
                global_stores=global_thread.tables.stores if global_thread is not None else None,
            )
            await query_server.start()
            assert query_server.site is not None  # start() serves it
            sites.append(query_server.site)
        for thread in threads:
            await thread.start(topics, regex, reason)
            started.append(thread)
        announce(
            f"worker: app {topology.app_id!r}, {len(resolved.tasks)} tasks, {settings.threads} stream thread(s), "
            f"process {process_id}, group {topology.app_id!r} at {settings.coordinator} "
            f"(group protocol {settings.group_protocol}), {guarantee.value} (commit every {settings.commit_interval_ms} ms)"
        )
        await stop.wait()
    finally:
        permanent = leaves_for_good(settings.pod_annotations)
        failed = [thread.name for thread in started if thread.engine_failure is not None]
        if failed:
            announce(
                f"worker: stopping ({', '.join(failed)} failed: {'its' if len(failed) == 1 else 'their'} tasks are "
                "lost, not committed, and move to other workers at once; the others commit and leave)"
            )
        else:
            announce("worker: stopping (committing and leaving the group" + (" for good)" if permanent else ")"))
        await asyncio.gather(*(thread.shutdown(permanent=permanent) for thread in started), return_exceptions=True)
        if global_thread is not None:
            await loop.run_in_executor(None, global_thread.stop)
            if global_thread.failure is not None:
                fatal.append(f"the global tables' thread failed: {global_thread.failure!r}")
        if identity is not None:
            identity.close()
    announce(exit_line(threads))
    if fatal:
        for message in fatal:
            announce(f"worker: {message}")
        return 1
    return 0
