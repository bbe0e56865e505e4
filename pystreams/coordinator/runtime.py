"""The coordinator runtime: sans-IO shards driven by asyncio, made durable by a record log.

**Shards.** A :class:`ShardRunner` is one asyncio task that owns one
:class:`~pystreams.coordinator.shard.GroupCoordinatorShard` and one claimed partition of the
record log. Everything that touches the shard — requests, timer expiry, new topic metadata —
goes through the runner's bounded event queue and runs serially, so the shard needs no locks.
When the queue is full, callers wait (backpressure). The runner takes the events that are
queued (up to ``max_batch``), runs them, appends all the records they generated to the log in
*one* append (group commit: one transaction amortised over many requests), and only once that
append is durable resolves the responses. A response that generated no records still waits for
its batch, since it may have read state the batch changed.

**Routing.** Group ``g`` lives on shard ``abs(javaHashCode(g)) % shards`` — Kafka's
``partitionFor`` for ``__consumer_offsets`` (``Utils.abs(groupId.hashCode) % partitions``), so
the mapping is stable across processes and versions and matches Kafka for the same count. That
is also why the log's partition count can never change. Requests that name several groups
(ListGroups, ConsumerGroupDescribe, OffsetFetch v8+, Describe/IncrementalAlterConfigs) are
split by shard, run concurrently, and merged back in request order.

**Loading and fail-over.** On start each shard claims its partition (fencing any previous
owner), replays every record, receives the current topic metadata, then runs the KIP's
fail-over duties (``on_loaded``: re-arm session timers, re-check metadata and regexes, compute
a missing assignment) and appends what they generated. Until then its requests are answered
COORDINATOR_LOAD_IN_PROGRESS. The ``partition-load-time`` metric covers claim to active.

**Hot standbys.** A node of a cluster may *follow* shards it does not serve
(:class:`ShardStandby`): a shard of its own replays the partition as the owner writes it. When
the node is given the shard, its runner takes the standby over — claims the partition (fencing
the old owner), replays only what the standby had not read yet, and runs the same fail-over
duties. A standby that failed is dropped and the shard loads from the beginning, so a standby
can make a takeover faster, never different.

**When an append fails** the shard holds state the log does not have. The runner answers the
whole batch with COORDINATOR_NOT_AVAILABLE (clients look the coordinator up again and retry),
throws the shard away and *reloads it from the log* — the log is the truth, and the outcome of
a failed append is unknown, so replaying is the only way to agree with it. While reloading the
shard answers COORDINATOR_LOAD_IN_PROGRESS. Reloads are rate-limited (``reload_backoff_s``:
back-to-back failures wait longer and longer), and each releases its log handle before the next
claim. If the append failed because another coordinator claimed the partition (fenced), the
shard is no longer ours: it answers NOT_COORDINATOR from then on and does not reload.

**A handler that raises** is a bug, not an outage: the shard rolled its changes back (see
``shard``), so only that request is answered UNKNOWN_SERVER_ERROR; the batch goes on and the
shard is not reloaded. A timer or a topic update that fails is rolled back the same way.

**A record that cannot be read** does not stop a load: its group is quarantined (logged with
the offset and the reason) and every other group is served.

**Topic metadata** comes from a :class:`TopicSource` (``ClusterMetadata``): fetched every
``metadata_refresh_ms`` and on demand — a heartbeat subscribing to a topic name the coordinator
does not know triggers a refresh, at most one per ``metadata_min_interval_ms``, and is handled
with its result (waiting for it up to ``_FRESH_METADATA_WAIT_S``). A changed
image is delivered to every shard as an ``update_topics`` event (coalesced: a shard only ever
applies the newest image). Topics of the log itself are hidden.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import enum
import functools
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import kafka.errors as Errors
from kafka.protocol.api_header import RequestHeader
from kafka.protocol.api_message import ApiMessage

from pystreams.assignors.api import TopicMetadata
from pystreams.coordinator import records as r
from pystreams.coordinator.authorizer import PERMISSIONS, Authorizer
from pystreams.coordinator.config import CoordinatorConfig
from pystreams.coordinator.context import DEFERRED
from pystreams.coordinator.errors import while_loading
from pystreams.coordinator.log import LogConfigurationError, LogFencedError, LogFollower, LogPosition, PartitionLog, RecordLog
from pystreams.coordinator.metrics import CoordinatorMetrics, IdleTracker
from pystreams.coordinator.shard import CoordinatorResult, GroupCoordinatorShard, HandlerFailed, RequestContext
from pystreams.protocol import codec
from pystreams.protocol import messages as m
from pystreams.protocol.server import ANONYMOUS, current_session

__all__ = ["Coordinator", "ShardRunner", "ShardState", "StaticTopics", "TopicSource", "group_shard", "java_string_hash"]

log = logging.getLogger(__name__)

Topics = Mapping[str, TopicMetadata]


def wall_clock_ms() -> int:
    # Wall clock, as Kafka's coordinator: it stamps offset commits, and timers only need ms.
    return time.time_ns() // 1_000_000


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode``: over UTF-16 code units, as a signed 32-bit int."""
    encoded = text.encode("utf-16-be", "surrogatepass")
    h = 0
    for i in range(0, len(encoded), 2):
        h = (31 * h + ((encoded[i] << 8) | encoded[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= (1 << 31) else h


def group_shard(group_id: str, shard_count: int) -> int:
    """Kafka's ``Utils.abs(groupId.hashCode) % partitions`` (``abs(MIN_VALUE)`` is 0). Every
    request names its group and the hash loops over its characters (18 µs here for a 28-char
    id, 0.4 µs cached), so ids of a usual length are cached: at most 16,384 ids of at most 249
    characters (a few MB), whatever ids clients send."""
    if len(group_id) <= _CACHED_GROUP_ID_CHARS:
        return _cached_group_shard(group_id, shard_count)
    return _group_shard(group_id, shard_count)


def _group_shard(group_id: str, shard_count: int) -> int:
    h = java_string_hash(group_id)
    return (0 if h == -(1 << 31) else abs(h)) % shard_count


_CACHED_GROUP_ID_CHARS = 249  # Kafka's limit on topic names: longer group ids are rare
_cached_group_shard = functools.lru_cache(maxsize=16_384)(_group_shard)


class TopicSource(Protocol):
    """Where topic metadata comes from; blocking (run in a thread). ``ClusterMetadata`` is one."""

    def fetch_topics(self) -> dict[str, TopicMetadata]: ...


class StaticTopics:
    """A fixed topic image (tests, benchmarks, a coordinator without a cluster)."""

    def __init__(self, topics: Topics | None = None) -> None:
        self.topics = dict(topics or {})

    def fetch_topics(self) -> dict[str, TopicMetadata]:
        return dict(self.topics)


# --- one shard ---------------------------------------------------------------------------------


class ShardState(enum.Enum):
    LOADING = "loading"
    ACTIVE = "active"
    FAILED = "failed"  # fenced, or a log that cannot be used: requests get NOT_COORDINATOR
    CLOSED = "closed"


@dataclass(slots=True)
class _Request:
    request: ApiMessage
    context: RequestContext
    future: asyncio.Future


class _Wake:
    """Queued only to wake an idle runner (new topics, stop); carries nothing."""


_WAKE = _Wake()


class _Outcome(enum.Enum):
    STOP = "stop"
    RELOAD = "reload"
    FENCED = "fenced"


#: A shard that served this long since its last reload is stable: the next reload waits nothing.
_STABLE_AFTER_S = 60.0


def _not_coordinator(shard_id: int, why: str) -> Errors.BrokerResponseError:
    return Errors.NotCoordinatorError(f"shard {shard_id} {why}")


class ShardStandby:
    """A shard this node does not serve, kept current by replaying its partition as another
    coordinator writes it (a hot standby); :meth:`take` hands it to the runner that takes the
    shard over."""

    #: How long an idle follower waits before it looks again (the Kafka log's poll waits too).
    IDLE_S = 0.05

    def __init__(self, shard_id: int, log: RecordLog, shard_factory: Callable[[], GroupCoordinatorShard]) -> None:
        self.shard_id = shard_id
        self._log = log
        self._shard_factory = shard_factory
        self.shard: GroupCoordinatorShard | None = None
        #: Records replayed so far.
        self.replayed = 0
        self.failure: BaseException | None = None
        self._follower: LogFollower | None = None
        self._stopping = False
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self.task is None:
            self.task = asyncio.create_task(self._run(), name=f"pystreams-coordinator-standby-{self.shard_id}")

    async def _run(self) -> None:
        try:
            self._follower = self._log.follow(self.shard_id)
            shard = self._shard_factory()
            self.shard = shard
            while not self._stopping:
                records = await self._follower.poll()
                for record in records:
                    shard.replay(record)
                self.replayed += len(records)
                if not records and not self._stopping:
                    await asyncio.sleep(self.IDLE_S)
        except Exception as error:  # the takeover loads from the beginning instead
            log.warning("shard %d: its standby stopped (%r); taking it over will replay it whole", self.shard_id, error)
            self.failure = error

    async def take(self) -> tuple[GroupCoordinatorShard, LogPosition] | None:
        """Stop following once the poll in progress is replayed; the shard and where its replay
        stopped, or None if the standby failed (then nothing of it is usable)."""
        self._stopping = True
        try:
            if self.task is not None:
                await self.task
            if self.failure is not None or self.shard is None or self._follower is None:
                return None
            return self.shard, self._follower.position()
        finally:
            await self.close()

    async def close(self) -> None:
        self._stopping = True
        if self.task is not None and not self.task.done():
            await asyncio.gather(self.task, return_exceptions=True)
        follower, self._follower = self._follower, None
        if follower is not None:
            try:
                await follower.close()
            except Exception:
                log.warning("shard %d: closing its standby's reader failed", self.shard_id, exc_info=True)


class ShardRunner:
    """One shard: an asyncio task, a bounded event queue, a claimed log partition."""

    def __init__(
        self,
        shard_id: int,
        log: RecordLog,
        *,
        shard_factory: Callable[[], GroupCoordinatorShard],
        topics: Callable[[], Awaitable[Topics]],
        clock_ms: Callable[[], int] = wall_clock_ms,
        queue_size: int = 1024,
        max_batch: int = 256,
        metrics: CoordinatorMetrics | None = None,
        reload_backoff_s: tuple[float, float] = (0.1, 5.0),
        standby: ShardStandby | None = None,
    ) -> None:
        """``standby``: a hot standby of this shard to take over (the first load replays only
        what it had not read)."""
        if queue_size < 1 or max_batch < 1:
            raise ValueError("queue_size and max_batch must be >= 1")
        self.shard_id = shard_id
        self._log = log
        self._shard_factory = shard_factory
        self._topics = topics
        self._clock_ms = clock_ms
        self._queue: asyncio.Queue[_Request | _Wake] = asyncio.Queue(maxsize=queue_size)
        self._max_batch = max_batch
        self.metrics = metrics or CoordinatorMetrics()
        self._backoff_s = reload_backoff_s
        self.state = ShardState.LOADING
        self.shard: GroupCoordinatorShard | None = None
        self.failure: BaseException | None = None
        self.loaded = asyncio.Event()
        self.load_count = 0
        self.reload_count = 0
        #: Records the last load replayed, and how many of them a standby had replayed before.
        self.replayed_at_load = 0
        self.replayed_by_standby = 0
        self._standby = standby
        self.idle = IdleTracker()
        self._handle: PartitionLog | None = None
        self._pending_topics: Topics | None = None
        #: request id -> the caller waiting for an answer the shard deferred.
        self._deferred: dict[int, asyncio.Future] = {}
        self._request_ids = itertools.count(1)
        self._stopping = False
        self.task: asyncio.Task[None] | None = None

    # -- the outside ---------------------------------------------------------------------------

    def start(self) -> None:
        if self.task is None:
            self.task = asyncio.create_task(self._run(), name=f"pystreams-coordinator-shard-{self.shard_id}")

    @property
    def queue_size(self) -> int:
        return self._queue.qsize()

    async def submit(self, request: ApiMessage, context: RequestContext) -> ApiMessage:
        """The shard's response, once the records it generated are durable.

        Raises COORDINATOR_LOAD_IN_PROGRESS while loading and NOT_COORDINATOR once failed or
        stopped (as ``kafka.errors`` exceptions); may wait while the queue is full.
        """
        self._check_accepting()
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        context = RequestContext(context.client_id, context.client_host, next(self._request_ids))
        await self._queue.put(_Request(request, context, future))
        if self.finished and not future.done():
            future.set_exception(self._terminal_error())  # queued after the runner's last drain
        return await future

    def offer_topics(self, topics: Topics) -> None:
        """Newer topic metadata; applied before the next batch (older offers are superseded)."""
        self._pending_topics = topics
        self._wake()

    async def stop(self) -> None:
        """Refuse new requests, finish the queued ones and the append in flight, release the log.

        A shard still loading has nothing in flight worth waiting for: its loading is cancelled
        (it may be waiting for a log or a cluster that does not answer).
        """
        self._stopping = True
        self._wake()
        if self.task is None:
            return
        if self.state is ShardState.LOADING:
            self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)

    @property
    def finished(self) -> bool:
        """Whether the runner ended for good (failed: fenced, or a log it cannot use; or
        closed): it answers nothing more and its shard, served again here, needs a new one."""
        return self.state in (ShardState.FAILED, ShardState.CLOSED)

    def _check_accepting(self) -> None:
        if self._stopping or self.finished:
            raise self._terminal_error()
        if self.state is ShardState.LOADING:
            raise Errors.CoordinatorLoadInProgressError(f"shard {self.shard_id} is loading its groups")

    def _terminal_error(self) -> Errors.BrokerResponseError:
        if self.state is ShardState.FAILED:
            return _not_coordinator(self.shard_id, f"is not served here: {self.failure}")
        return _not_coordinator(self.shard_id, "is shutting down")

    def _wake(self) -> None:
        if self._queue.empty():
            self._queue.put_nowait(_WAKE)

    # -- the task ------------------------------------------------------------------------------

    async def _run(self) -> None:
        reload_delay = 0.0
        try:
            while not self._stopping:
                if not await self._load():
                    break
                served_at = time.monotonic()
                outcome = await self._serve()
                if outcome is not _Outcome.RELOAD:
                    break
                # Rate-limited: a shard whose appends keep failing does not reload in a loop.
                stable = time.monotonic() - served_at > _STABLE_AFTER_S
                reload_delay = 0.0 if stable else min(max(reload_delay * 2, self._backoff_s[0]), self._backoff_s[1])
                self.reload_count += 1
                if reload_delay:
                    log.warning("shard %d reloads again within %.0f s; waiting %.1f s first", self.shard_id, _STABLE_AFTER_S, reload_delay)
                    await asyncio.sleep(reload_delay)
        except Exception as error:  # a bug: never leave callers waiting forever
            log.exception("coordinator shard %d crashed", self.shard_id)
            self._fail(error)
        finally:
            if self.state is not ShardState.FAILED:
                self.state = ShardState.CLOSED
            self.loaded.clear()
            self._drain_queue(self._terminal_error)
            self._answer_deferred(self._terminal_error)
            standby, self._standby = self._standby, None  # stopped before its first load
            if standby is not None:
                await standby.close()
            await self._release_handle()

    def _fail(self, error: BaseException) -> None:
        self.state = ShardState.FAILED
        self.failure = error
        self.loaded.clear()

    async def _release_handle(self) -> None:
        handle, self._handle = self._handle, None
        if handle is not None:
            try:
                await handle.close()
            except Exception:
                log.warning("shard %d: releasing its log partition failed", self.shard_id, exc_info=True)

    def _drain_queue(self, error: Callable[[], BaseException]) -> None:
        while not self._queue.empty():
            event = self._queue.get_nowait()
            if isinstance(event, _Request) and not event.future.done():
                event.future.set_exception(error())

    async def _load(self) -> bool:
        """Claim, replay, fail-over duties. False if stopping or failed for good."""
        self.state = ShardState.LOADING
        self.loaded.clear()
        self.shard = None
        backoff = self._backoff_s[0]
        while not self._stopping:
            started = time.monotonic()
            try:
                await self._release_handle()
                standby, self._standby = self._standby, None  # a retry loads from the beginning
                taken = await standby.take() if standby is not None else None
                self._handle = await self._log.claim(self.shard_id)
                shard, resume = taken if taken is not None else (self._shard_factory(), None)
                from_standby = standby.replayed if taken is not None and standby is not None else 0
                replayed = 0
                async with contextlib.aclosing(self._handle.read(resume)) as chunks:
                    async for chunk in chunks:
                        for record in chunk:
                            shard.replay(record)
                        replayed += len(chunk)
                for quarantine in shard.finish_load():
                    log.error(
                        "shard %d: group %r is quarantined: %s. Its other records were loaded and the other groups are "
                        "served; `pystreams coordinator repair` releases it.",
                        self.shard_id,
                        quarantine.group_id,
                        quarantine.describe(),
                    )
                waited = time.monotonic()
                topics = await self._topics()  # the newest image: older offers are moot
                waited = time.monotonic() - waited
                self._pending_topics = None
                now = self._clock_ms()
                records = shard.update_topics(topics, now).records + shard.on_loaded(now).records
                if records:
                    await self._handle.append(records)
                    self._count_rebalances(records)
            except (LogFencedError, LogConfigurationError) as error:
                log.error("shard %d cannot be served by this coordinator: %s", self.shard_id, error)
                self._fail(error)
                return False
            except Exception as error:
                log.warning("shard %d: loading failed (%r); retrying in %.1f s", self.shard_id, error, backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self._backoff_s[1])
                continue
            self.metrics.load_times.record((time.monotonic() - started - waited) * 1000)
            self.load_count += 1
            self.replayed_at_load, self.replayed_by_standby = replayed, from_standby
            self.shard = shard
            self.state = ShardState.ACTIVE
            self.loaded.set()
            if from_standby:
                log.info("shard %d loaded: %d records after the %d its standby replayed, %d groups", self.shard_id, replayed, from_standby, len(shard.groups))
            else:
                log.info("shard %d loaded: %d records, %d groups", self.shard_id, replayed, len(shard.groups))
            return True
        return False

    async def _next_events(self, shard: GroupCoordinatorShard) -> list[_Request | _Wake] | None:
        """The next batch of events, [] when only a timer or new topics are due, None to stop."""
        while True:
            if self._stopping and self._queue.empty():
                return None
            if self._pending_topics is not None:
                timeout: float | None = 0.0
            else:
                deadline = shard.next_deadline()
                timeout = None if deadline is None else max(0.0, (deadline - self._clock_ms()) / 1000)
            if self._queue.empty():
                if timeout == 0.0:
                    return []
                self.idle.idle()
                try:
                    async with asyncio.timeout(timeout):
                        first = await self._queue.get()
                except TimeoutError:
                    return []
                finally:
                    self.idle.busy()
            else:  # work is waiting: no timer to arm
                first = self._queue.get_nowait()
            events = [first]
            while len(events) < self._max_batch and not self._queue.empty():
                events.append(self._queue.get_nowait())
            return events

    async def _serve(self) -> _Outcome:
        shard = self.shard
        assert shard is not None and self._handle is not None
        while True:
            events = await self._next_events(shard)
            if events is None:
                return _Outcome.STOP
            now = self._clock_ms()
            records: list[r.Record] = []
            answers: list[tuple[asyncio.Future, Any]] = []
            completions: list[tuple[int, Any]] = []
            topics, self._pending_topics = self._pending_topics, None
            if topics is not None:
                self._collect(self._rolled_back_on_failure(shard.update_topics, topics, now), records, completions)
            deadline = shard.next_deadline()
            if deadline is not None and deadline <= now:
                self._collect(self._rolled_back_on_failure(shard.expire, now), records, completions)
            for event in events:
                if not isinstance(event, _Request):
                    continue
                try:
                    result = shard.handle(event.request, now, event.context)
                except HandlerFailed as error:  # rolled back: only this request fails
                    answers.append((event.future, error))
                    continue
                self._collect(result, records, completions)
                if result.response is DEFERRED:
                    self._deferred[event.context.request_id] = event.future
                else:
                    answers.append((event.future, result.response))
            for request_id, response in completions:
                future = self._deferred.pop(request_id, None)
                if future is not None:
                    answers.append((future, response))
            if records:
                try:
                    await self._handle.append(records)
                except LogFencedError as error:
                    log.error("shard %d: fenced by another coordinator: %s", self.shard_id, error)
                    self._fail(error)
                    self._answer([(f, _not_coordinator(self.shard_id, "moved to another coordinator")) for f, _ in answers])
                    return _Outcome.FENCED
                except Exception as error:
                    log.warning("shard %d: append failed (%r); answering COORDINATOR_NOT_AVAILABLE and reloading", self.shard_id, error)
                    self.state = ShardState.LOADING  # refuse new requests right away
                    self.loaded.clear()
                    self._answer([(f, Errors.CoordinatorNotAvailableError(f"shard {self.shard_id}: the log append failed")) for f, _ in answers])
                    self._answer_deferred(lambda: Errors.CoordinatorNotAvailableError(f"shard {self.shard_id} is reloading"))
                    return _Outcome.RELOAD
                self._count_rebalances(records)
            self._answer(answers)

    @staticmethod
    def _collect(result: CoordinatorResult | None, records: list[r.Record], completions: list[tuple[int, Any]]) -> None:
        if result is not None:
            records += result.records
            completions += result.completions

    def _rolled_back_on_failure(self, step: Callable[..., Any], *args: Any) -> CoordinatorResult | None:
        """A topic update's or timer run's result; None if it failed (it was rolled back)."""
        try:
            return step(*args)
        except HandlerFailed:
            log.error("shard %d: %s failed and was rolled back", self.shard_id, getattr(step, "__name__", step))
            return None

    def _answer_deferred(self, error: Callable[[], BaseException]) -> None:
        """The shard that deferred these answers is gone (reloaded, stopped): they will not come."""
        deferred, self._deferred = self._deferred, {}
        self._answer([(future, error()) for future in deferred.values()])

    @staticmethod
    def _answer(answers: Sequence[tuple[asyncio.Future, Any]]) -> None:
        for future, outcome in answers:
            if future.done():  # the caller went away; the work is done regardless
                continue
            if isinstance(outcome, BaseException):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)

    def _count_rebalances(self, records: Sequence[r.Record]) -> None:
        count = sum(1 for record in records if isinstance(record, r.TargetAssignmentMetadata) and record.value is not None)
        if count:
            self.metrics.rebalances.record(count)
        # Conversions, as their records show them: a group of one type tombstoned and one of the
        # other type written for it in the same batch.
        ended = {
            (type(record), record.group_id) for record in records if record.value is None and isinstance(record, (r.GroupMetadata, r.ClassicGroupMetadata))
        }
        for record in records:
            if record.value is None:
                continue
            if isinstance(record, r.GroupMetadata) and (r.ClassicGroupMetadata, record.group_id) in ended:
                self.metrics.conversions["upgrade"] += 1
                ended.discard((r.ClassicGroupMetadata, record.group_id))
            elif isinstance(record, r.ClassicGroupMetadata) and (r.GroupMetadata, record.group_id) in ended:
                self.metrics.conversions["downgrade"] += 1
                ended.discard((r.GroupMetadata, record.group_id))


# --- the server --------------------------------------------------------------------------------

Route = Callable[[RequestHeader, ApiMessage, RequestContext], Awaitable[ApiMessage]]


class Coordinator:
    """N shards behind one request handler (``handle``, for ``KafkaProtocolServer``).

    ``start()`` opens the log, starts the metadata refresher and loads every shard in the
    background; ``wait_until_loaded()`` waits for them; ``close()`` drains and releases.
    """

    def __init__(
        self,
        log: RecordLog,
        *,
        config: CoordinatorConfig | None = None,
        topic_source: TopicSource | None = None,
        metadata_refresh_ms: int = 5_000,
        metadata_min_interval_ms: int = 250,
        queue_size: int = 1024,
        max_batch: int = 256,
        shard_factory: Callable[[], GroupCoordinatorShard] | None = None,
        clock_ms: Callable[[], int] = wall_clock_ms,
        authorizer: Authorizer | None = None,
        owned_shards: Iterable[int] | None = None,
    ) -> None:
        """``owned_shards``: the shards this coordinator serves from the start (default: all of
        them, a coordinator of its own); a node of a cluster starts with none and is given them
        with :meth:`acquire` / :meth:`release` (see ``cluster``)."""
        self.log = log
        self.config = config or CoordinatorConfig()
        #: None: every request is allowed (no authorizer configured, Kafka's default).
        self.authorizer = authorizer
        self.shard_count = log.partition_count
        self.metrics = CoordinatorMetrics()
        #: Requests received, by API (Kafka's RequestsPerSec by request): the steady-state load.
        self.requests_received: collections.Counter[str] = collections.Counter()
        self._topic_source = topic_source if topic_source is not None else StaticTopics()
        self._metadata_refresh_s = metadata_refresh_ms / 1000
        self._metadata_min_interval_s = metadata_min_interval_ms / 1000
        self._topics: dict[str, TopicMetadata] | None = None
        self._topics_ready = asyncio.Event()
        self._refresh_requested = asyncio.Event()
        #: Fetches of topic metadata started and finished (either way): a heartbeat that
        #: subscribes to an unknown topic waits for one that starts after it arrived.
        self._fetches_started = 0
        self._fetches_finished = 0
        self._fetch_finished = asyncio.Condition()
        self._metadata_task: asyncio.Task[None] | None = None
        self._closing = False
        factory = shard_factory or (lambda: GroupCoordinatorShard(self.config))

        def new_runner(shard_id: int, standby: ShardStandby | None = None) -> ShardRunner:
            return ShardRunner(
                shard_id,
                log,
                shard_factory=factory,
                topics=self._current_topics,
                clock_ms=clock_ms,
                queue_size=queue_size,
                max_batch=max_batch,
                metrics=self.metrics,
                standby=standby,
            )

        self._new_runner = new_runner
        self._shard_factory = factory
        #: Hot standbys of shards not served here, by shard.
        self._standbys: dict[int, ShardStandby] = {}
        shards = range(self.shard_count) if owned_shards is None else sorted(set(owned_shards))
        self._runners: dict[int, ShardRunner] = {shard_id: new_runner(shard_id) for shard_id in shards}
        self._started = False
        #: Why this node must not answer for any shard now (a cluster node whose membership
        #: lapsed); None: no such condition (a coordinator of its own).
        self._why_not_serving: Callable[[], str | None] | None = None
        #: One acquire or release of a shard at a time (each may wait on a runner stopping).
        self._shard_locks: dict[int, asyncio.Lock] = collections.defaultdict(asyncio.Lock)
        #: Counts of runners no longer served here, so that the totals never go down.
        self.retired_reloads = 0
        self.retired_handler_failures = 0
        self._routes: dict[int, Route] = {
            m.ConsumerGroupHeartbeatRequest.API_KEY: self._heartbeat,
            m.ConsumerGroupPrepareAssignmentRequest.API_KEY: self._single_group,
            m.ConsumerGroupInstallAssignmentRequest.API_KEY: self._single_group,
            m.JoinGroupRequest.API_KEY: self._single_group,
            m.SyncGroupRequest.API_KEY: self._single_group,
            m.HeartbeatRequest.API_KEY: self._single_group,
            m.LeaveGroupRequest.API_KEY: self._single_group,
            m.OffsetCommitRequest.API_KEY: self._single_group,
            m.OffsetFetchRequest.API_KEY: self._offset_fetch,
            m.ConsumerGroupDescribeRequest.API_KEY: self._consumer_group_describe,
            m.ListGroupsRequest.API_KEY: self._list_groups,
            m.DescribeGroupsRequest.API_KEY: self._describe_groups,
            m.DescribeConfigsRequest.API_KEY: self._describe_configs,
            m.IncrementalAlterConfigsRequest.API_KEY: self._incremental_alter_configs,
        }

    # -- lifecycle -----------------------------------------------------------------------------

    @property
    def runners(self) -> list[ShardRunner]:
        """The runners of the shards served here, in shard order."""
        return [self._runners[shard_id] for shard_id in sorted(self._runners)]

    @property
    def served_shards(self) -> list[int]:
        return sorted(self._runners)

    def serve_only_while(self, why_not: Callable[[], str | None]) -> None:
        """Answer requests for groups only while ``why_not()`` is None, checked as each request
        arrives and again as its answer leaves: the answers of a node whose membership of the
        cluster lapsed are NOT_COORDINATOR, even ones worked out just before."""
        self._why_not_serving = why_not

    async def start(self) -> None:
        await self.log.open()
        self._metadata_task = asyncio.create_task(self._refresh_metadata_forever(), name="pystreams-coordinator-metadata")
        self._started = True
        for runner in self.runners:
            runner.start()

    async def acquire(self, shard_id: int) -> None:
        """Serve ``shard_id`` from now on: claim its partition (fencing any other writer) and
        load it. A shard already served (or loading) here is left as it is; one that failed
        here (fenced) is loaded afresh."""
        if not 0 <= shard_id < self.shard_count:
            return
        async with self._shard_locks[shard_id]:
            current = self._runners.get(shard_id)
            if self._closing or (current is not None and not current.finished):
                return
            if current is not None:
                await current.stop()
                self._retire(current)
            if self._closing:  # closed while the failed runner stopped: nothing new starts
                return
            runner = self._runners[shard_id] = self._new_runner(shard_id, self._standbys.pop(shard_id, None))
            if self._started:
                runner.start()

    async def follow(self, shard_id: int) -> None:
        """Keep a hot standby of ``shard_id``, which another coordinator serves: taking it over
        later (``acquire``) then replays only what the standby has not read yet."""
        if not 0 <= shard_id < self.shard_count:
            return
        async with self._shard_locks[shard_id]:
            if self._closing or not self._started or shard_id in self._runners or shard_id in self._standbys:
                return
            standby = self._standbys[shard_id] = ShardStandby(shard_id, self.log, self._shard_factory)
            standby.start()

    async def unfollow(self, shard_id: int) -> None:
        """Drop the standby of ``shard_id``, if any."""
        async with self._shard_locks[shard_id]:
            standby = self._standbys.pop(shard_id, None)
            if standby is not None:
                await standby.close()

    @property
    def standbys(self) -> dict[int, ShardStandby]:
        """The hot standbys kept here, by shard."""
        return dict(self._standbys)

    async def release(self, shard_id: int) -> None:
        """Stop serving ``shard_id``: answer what it queued, finish its append in flight, close
        its writer. Requests for its groups are answered NOT_COORDINATOR from then on."""
        async with self._shard_locks[shard_id]:
            runner = self._runners.pop(shard_id, None)
            if runner is not None:
                await runner.stop()
                self._retire(runner)

    def _retire(self, runner: ShardRunner) -> None:
        self.retired_reloads += runner.reload_count
        if runner.shard is not None:
            self.retired_handler_failures += runner.shard.handler_failures

    def failed(self, shard_id: int) -> bool:
        """Whether ``shard_id``'s runner here failed for good (fenced, or a log it cannot use)."""
        runner = self._runners.get(shard_id)
        return runner is not None and runner.finished

    def serves(self, shard_id: int) -> bool:
        """Whether ``shard_id`` is loaded and served here now."""
        runner = self._runners.get(shard_id)
        return runner is not None and runner.state is ShardState.ACTIVE

    async def wait_until_loaded(self) -> None:
        """Return once every shard is active; raise if one failed for good."""
        for runner in self.runners:
            assert runner.task is not None, "start() first"
            waiter = asyncio.ensure_future(runner.loaded.wait())
            try:
                done, _ = await asyncio.wait({waiter, runner.task}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiter.cancel()
            if waiter not in done or runner.state is not ShardState.ACTIVE:
                raise RuntimeError(f"shard {runner.shard_id} failed to load: {runner.failure}")

    def is_ready(self) -> bool:
        return not self._closing and all(runner.state is ShardState.ACTIVE for runner in self.runners)

    async def close(self) -> None:
        """Stop taking requests, finish queued work and in-flight appends, release the log."""
        self._closing = True
        if self._metadata_task is not None:
            self._metadata_task.cancel()
            await asyncio.gather(self._metadata_task, return_exceptions=True)
        await asyncio.gather(*(runner.stop() for runner in self.runners), *(standby.close() for standby in self._standbys.values()))
        self._standbys.clear()
        await self.log.close()

    async def __aenter__(self) -> Coordinator:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # -- routing -------------------------------------------------------------------------------

    def shard_for(self, group_id: str) -> int:
        return group_shard(group_id, self.shard_count)

    def unavailable_reason(self, group_id: str) -> str | None:
        """Why this coordinator does not serve ``group_id`` (None: it does, or will once its
        shard loaded). FindCoordinator answers such a group COORDINATOR_NOT_AVAILABLE rather
        than this node: a shard fenced by another coordinator is never served here again, and
        a client told "here" would be answered NOT_COORDINATOR for ever instead of trying the
        next address it was given."""
        if self._closing:
            return "this coordinator is shutting down"
        if self._why_not_serving is not None and (why := self._why_not_serving()) is not None:
            return why
        shard_id = self.shard_for(group_id)
        runner = self._runners.get(shard_id)
        if runner is None:
            return f"shard {shard_id} is not served by this coordinator"
        if runner.state is ShardState.FAILED:
            if isinstance(runner.failure, LogFencedError):
                return f"shard {runner.shard_id} was taken over by another coordinator (fenced: {runner.failure})"
            return f"shard {runner.shard_id} is not served here: {runner.failure}"
        if runner.state is ShardState.CLOSED:
            return f"shard {runner.shard_id} is closed"
        return None

    async def handle(self, header: RequestHeader, request: ApiMessage) -> ApiMessage:
        """The ``KafkaProtocolServer`` handler: authorize, route, wait for durability, answer."""
        session = current_session()
        peer = session.peer if session is not None else None
        context = RequestContext(client_id=header.client_id or "", client_host=peer[0] if peer else "")
        self.requests_received[type(request).__name__.removesuffix("Request")] += 1
        route = self._routes.get(request.API_KEY)
        if route is None:
            return codec.error_response(
                header,
                Errors.UnsupportedVersionError.errno,
                f"{type(request).__name__.removesuffix('Request')} is not served by this coordinator yet",
                request,
            )
        if self.authorizer is not None and request.API_KEY in PERMISSIONS:
            principal = session.principal if session is not None else ANONYMOUS
            return await self._authorized(route, header, request, context, principal, context.client_host)
        return await route(header, request, context)

    # -- authorization ---------------------------------------------------------------------------

    #: Requests naming several groups: (the list field, how an item names its group, the result field).
    _ITEMS: dict[int, tuple[str, Callable[[Any], str | None], str]] = {
        m.DescribeGroupsRequest.API_KEY: ("groups", lambda group_id: group_id, "groups"),
        m.ConsumerGroupDescribeRequest.API_KEY: ("group_ids", lambda group_id: group_id, "groups"),
        m.OffsetFetchRequest.API_KEY: ("groups", lambda group: group.group_id, "groups"),
        m.DescribeConfigsRequest.API_KEY: ("resources", lambda r: r.resource_name if r.resource_type == 16 else None, "results"),
        m.IncrementalAlterConfigsRequest.API_KEY: ("resources", lambda r: r.resource_name if r.resource_type == 16 else None, "responses"),
    }

    async def _authorized(self, route: Route, header: RequestHeader, request: ApiMessage, context: RequestContext, principal: str, host: str) -> ApiMessage:
        """Kafka's answers to what a principal may not do: GROUP/CLUSTER_AUTHORIZATION_FAILED for
        the request or for each group it may not touch; ListGroups lists what it may describe."""
        assert self.authorizer is not None
        operation, resource_type = PERMISSIONS[request.API_KEY]
        allows = self.authorizer.allows
        if request.API_KEY == m.ListGroupsRequest.API_KEY:
            response = await route(header, request, context)
            if not allows(principal, host, "Describe", "Cluster"):
                response.groups = [g for g in response.groups or [] if allows(principal, host, "Describe", "Group", g.group_id)]
            return response
        items = self._ITEMS.get(request.API_KEY)
        if items is None or (request.API_KEY == m.OffsetFetchRequest.API_KEY and header.request_api_version < 8):
            if allows(principal, host, operation, resource_type, request.group_id):
                return await route(header, request, context)
            return codec.error_response(
                header, Errors.GroupAuthorizationFailedError.errno, f"{principal} may not {operation} group {request.group_id!r}", request
            )
        items_field, group_of, results_field = items
        entries = list(getattr(request, items_field) or [])
        denied = [
            index
            for index, entry in enumerate(entries)
            if (group := group_of(entry)) is not None and not allows(principal, host, operation, resource_type, group)
        ]
        if not denied:
            return await route(header, request, context)
        refusal = codec.error_response(
            header,
            Errors.GroupAuthorizationFailedError.errno,
            f"{principal} may not {operation} this group",
            _with_fields(request, header, **{items_field: [entries[i] for i in denied]}),
        )
        refused = iter(getattr(refusal, results_field))
        allowed = [entry for index, entry in enumerate(entries) if index not in set(denied)]
        answer = await route(header, _with_fields(request, header, **{items_field: allowed}), context) if allowed else refusal
        served = iter(getattr(answer, results_field) or []) if allowed else iter(())
        setattr(answer, results_field, [next(refused) if index in set(denied) else next(served) for index in range(len(entries))])
        return answer

    async def _call(self, shard_id: int, header: RequestHeader, request: ApiMessage, context: RequestContext) -> ApiMessage:
        runner = self._runners.get(shard_id)
        if runner is None:
            return codec.error_response(header, Errors.NotCoordinatorError.errno, f"shard {shard_id} is not served by this coordinator", request)
        if (refused := self._refused_here(header, request)) is not None:
            return refused
        try:
            answer = await runner.submit(request, context)
            refused = self._refused_here(header, request)
            return answer if refused is None else refused
        except Errors.CoordinatorLoadInProgressError as error:
            code = while_loading(request)
            return codec.error_response(header, code, str(error.args[0]) if code and error.args else None, request)
        except Errors.BrokerResponseError as error:
            message = str(error.args[0]) if error.args else None
            return codec.error_response(header, error.errno, message, request)

    def _refused_here(self, header: RequestHeader, request: ApiMessage) -> ApiMessage | None:
        """NOT_COORDINATOR with the reason while this node must not answer for any shard."""
        why = self._why_not_serving() if self._why_not_serving is not None else None
        return None if why is None else codec.error_response(header, Errors.NotCoordinatorError.errno, why, request)

    async def _single_group(self, header: RequestHeader, request: ApiMessage, context: RequestContext) -> ApiMessage:
        return await self._call(self.shard_for(request.group_id), header, request, context)

    async def _heartbeat(self, header: RequestHeader, request: ApiMessage, context: RequestContext) -> ApiMessage:
        names = request.subscribed_topic_names
        if names and self._topics is not None and any(name not in self._topics for name in names):
            # A topic we have not seen may just have been created (a worker creates its
            # internal topics before it joins): fetch metadata and handle the heartbeat with
            # it, so the first target covers the topic instead of a second rebalance later.
            await self._fresh_topic_metadata(_FRESH_METADATA_WAIT_S)
        return await self._single_group(header, request, context)

    async def _fresh_topic_metadata(self, timeout_s: float) -> None:
        """Wait (at most ``timeout_s``) for a metadata fetch that starts after this call;
        the shards have the new image before this returns (``offer_topics``)."""
        wanted = self._fetches_started + 1
        self._refresh_requested.set()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s), self._fetch_finished:
                await self._fetch_finished.wait_for(lambda: self._fetches_finished >= wanted)

    async def _split(
        self,
        header: RequestHeader,
        request: ApiMessage,
        context: RequestContext,
        items_field: str,
        group_of: Callable[[Any], str],
        results_field: str,
    ) -> ApiMessage:
        """Send each shard the items of ``items_field`` it owns; merge ``results_field`` back
        in request order (each shard answers its items one for one, in order)."""
        items = list(getattr(request, items_field) or [])
        by_shard: dict[int, list[int]] = {}
        for index, item in enumerate(items):
            by_shard.setdefault(self.shard_for(group_of(item)), []).append(index)
        if len(by_shard) <= 1:
            shard_id = next(iter(by_shard), 0)
            return await self._call(shard_id, header, request, context)
        shard_ids = list(by_shard)
        responses = await asyncio.gather(
            *(
                self._call(shard_id, header, _with_fields(request, header, **{items_field: [items[i] for i in by_shard[shard_id]]}), context)
                for shard_id in shard_ids
            )
        )
        merged: list[Any] = [None] * len(items)
        for shard_id, response in zip(shard_ids, responses, strict=False):
            results = list(getattr(response, results_field) or [])
            if len(results) != len(by_shard[shard_id]):
                raise RuntimeError(f"shard {shard_id} answered {len(results)} {results_field} for {len(by_shard[shard_id])} {items_field}")
            for index, result in zip(by_shard[shard_id], results, strict=False):
                merged[index] = result
        answer = responses[0]
        setattr(answer, results_field, merged)
        return answer

    async def _offset_fetch(self, header: RequestHeader, request: ApiMessage, context: RequestContext) -> ApiMessage:
        if header.request_api_version >= 8:
            return await self._split(header, request, context, "groups", lambda group: group.group_id, "groups")
        return await self._single_group(header, request, context)

    async def _consumer_group_describe(self, header: RequestHeader, request: ApiMessage, context: RequestContext) -> ApiMessage:
        return await self._split(header, request, context, "group_ids", lambda group_id: group_id, "groups")

    async def _describe_groups(self, header: RequestHeader, request: ApiMessage, context: RequestContext) -> ApiMessage:
        return await self._split(header, request, context, "groups", lambda group_id: group_id, "groups")

    async def _describe_configs(self, header: RequestHeader, request: ApiMessage, context: RequestContext) -> ApiMessage:
        return await self._split(header, request, context, "resources", lambda resource: resource.resource_name, "results")

    async def _incremental_alter_configs(self, header: RequestHeader, request: ApiMessage, context: RequestContext) -> ApiMessage:
        return await self._split(header, request, context, "resources", lambda resource: resource.resource_name, "responses")

    async def _list_groups(self, header: RequestHeader, request: ApiMessage, context: RequestContext) -> ApiMessage:
        # The groups of the shards served here: Kafka's ListGroups is per broker too, and admin
        # clients ask every node that Metadata lists.
        responses = await asyncio.gather(*(self._call(shard_id, header, request, context) for shard_id in self.served_shards))
        # As Kafka: the groups of every shard that answered, and the first error of those that did not.
        error = next((response.error_code for response in responses if response.error_code), 0)
        groups = [group for response in responses for group in (response.groups or [])]
        return m.ListGroupsResponse(throttle_time_ms=0, error_code=error, groups=groups)

    # -- topic metadata ------------------------------------------------------------------------

    async def _current_topics(self) -> Topics:
        await self._topics_ready.wait()
        assert self._topics is not None
        return self._topics

    @property
    def topics(self) -> dict[str, TopicMetadata] | None:
        """The latest topic image (None before the first fetch)."""
        return self._topics

    def request_metadata_refresh(self) -> None:
        self._refresh_requested.set()

    async def _refresh_metadata_forever(self) -> None:
        loop = asyncio.get_running_loop()
        failures = 0
        last_fetch = -float("inf")
        while True:
            since = loop.time() - last_fetch
            if since < self._metadata_min_interval_s:
                await asyncio.sleep(self._metadata_min_interval_s - since)
            self._refresh_requested.clear()
            last_fetch = loop.time()
            self._fetches_started += 1
            try:
                fetched = await loop.run_in_executor(None, self._topic_source.fetch_topics)
            except Exception as error:
                await self._note_fetch_finished()
                failures += 1
                (log.warning if failures in (1, 10) or failures % 100 == 0 else log.debug)(
                    "fetching topic metadata failed (%d in a row): %r",
                    failures,
                    error,
                )
                await asyncio.sleep(min(0.2 * 2 ** min(failures, 5), self._metadata_refresh_s))
                continue
            failures = 0
            hidden = self.log.internal_topics
            topics = {name: topic for name, topic in fetched.items() if name not in hidden}
            if topics != self._topics:
                self._topics = topics
                if self._topics_ready.is_set():  # loading shards take the image themselves
                    for runner in self.runners:
                        runner.offer_topics(topics)
            self._topics_ready.set()
            await self._note_fetch_finished()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._metadata_refresh_s):
                    await self._refresh_requested.wait()

    async def _note_fetch_finished(self) -> None:
        async with self._fetch_finished:
            self._fetches_finished += 1
            self._fetch_finished.notify_all()

    def render_metrics(self) -> str:
        """The metrics in Prometheus text format (see ``metrics``), without an HTTP server."""
        from pystreams.coordinator.metrics import coordinator_registry, render

        return render(coordinator_registry(self))


#: How long a heartbeat that subscribes to an unknown topic waits for fresh metadata at most.
_FRESH_METADATA_WAIT_S = 2.0


def _with_fields(request: ApiMessage, header: RequestHeader, **changes: Any) -> ApiMessage:
    """A copy of ``request`` with some fields replaced, at the request's version."""
    values = {name: getattr(request, name) for name in type(request).fields}
    values.update(changes)
    copy = type(request)(**values)
    copy.API_VERSION = header.request_api_version
    return copy
