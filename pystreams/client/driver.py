"""An asyncio driver that runs a group member over the Kafka wire protocol against a group
coordinator: a KIP-848 :class:`~pystreams.client.member.ConsumerGroupMember` (``MemberConfig``)
or a classic :class:`~pystreams.client.classic.ClassicGroupMember` (``ClassicMemberConfig``, with
a ``topics`` resolver); both are a :class:`~pystreams.client.common.GroupMember`.

The member is sans-IO; this module owns the IO around it:

* **Discovery.** ``FindCoordinator`` (v4, key = group id) against the bootstrap addresses, then
  one connection to the coordinator. A connection that *is* the coordinator is kept.
* **Connection.** :class:`KafkaConnection` — asyncio streams, correlation ids, request header
  v1/v2 and response header v0/v1 by the API version's flexibility, several requests in flight
  (the server answers them in order; we match by correlation id anyway), a per-request timeout.
  A timed-out request closes the connection, as Kafka's NetworkClient does: what the server did
  with it is unknown, and the next request should not queue behind it.
* **Reconnect.** Lost connection, NOT_COORDINATOR or COORDINATOR_NOT_AVAILABLE (the member's
  :class:`CoordinatorUnavailable` event) → forget the coordinator and discover it again, with an
  exponential, capped, jittered back-off (:class:`Backoff`, injectable random).
  COORDINATOR_LOAD_IN_PROGRESS needs nothing here: the member retries on the same coordinator
  after its ``retry_backoff_ms``.
* **Timing.** The loop sleeps until ``member.next_deadline()`` or until something wakes it: a
  response, a failure, an application call (``revocation_done``, ``leave``, ``subscribe``). The
  heartbeat interval is the coordinator's (the member reads it from the responses).
* **Events.** Delivered in order, one at a time, to ``on_event`` (an async callable) or, without
  one, to the :attr:`MemberDriver.events` queue. A :class:`RevokePartitions` is acknowledged once
  ``on_event`` returned for it (commit offsets in it); queue users call
  :meth:`MemberDriver.revocation_done` themselves. Events go through a separate task, so the
  member keeps heartbeating while the application commits.
* **Offsets.** :meth:`MemberDriver.commit_offsets` (OffsetCommit v9 by topic name, v10 by topic
  id) and :meth:`MemberDriver.fetch_offsets` (OffsetFetch v9/v10) with the member id and epoch
  (a classic member's generation, and its instance id). Errors come back per partition, never
  raised. STALE_MEMBER_EPOCH means "your epoch is behind the coordinator's", and a classic
  group's REBALANCE_IN_PROGRESS "wait for the rebalance to end": ``await driver.next_heartbeat()``
  and commit again (:attr:`CommitResult.retry_after_heartbeat`).
* **Classic members.** The JoinGroup is a long poll: its timeout is the rebalance timeout plus
  5 s (the member says so). Before the member reads a response naming topics its resolver does
  not know, the resolver is refreshed (``topics.refresh()``, off the loop); with
  ``metadata_max_age_ms`` it is also refreshed periodically and the member told
  (``metadata_changed``), so a leader notices new partitions and a regex subscription new topics.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random as random_module
import socket
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from uuid import UUID

import kafka.errors as Errors
from kafka.protocol.api_message import ApiMessage
from kafka.protocol.metadata.find_coordinator import CoordinatorType

from pystreams.client.classic import ClassicGroupMember, ClassicMemberConfig, topic_names_in
from pystreams.client.common import GroupMember
from pystreams.client.events import (
    CoordinatorUnavailable,
    LeftGroup,
    MemberEvent,
    MemberFailed,
    MemberState,
    RevokePartitions,
)
from pystreams.client.member import ConsumerGroupMember, MemberConfig
from pystreams.client.topics import RefreshableTopics, TopicResolver
from pystreams.protocol import messages as m
from pystreams.protocol.connection import Address, ConnectionLost, KafkaConnection, parse_bootstrap
from pystreams.protocol.handshake import HandshakeError
from pystreams.protocol.security import ClientSecurity
from pystreams.protocol.sentinels import COORDINATOR_MOVED

log = logging.getLogger(__name__)

#: A partition named by topic id (OffsetCommit/OffsetFetch v10) or topic name (v9).
OffsetKey = tuple[UUID | str, int]
EventHandler = Callable[[MemberEvent], Awaitable[None]]


#: The versions this driver speaks. FindCoordinator v4 is the batched form every Kafka 3+/4
#: broker and our coordinator serve; OffsetCommit/OffsetFetch v9 carry names, v10 topic ids.
_VERSIONS: dict[type[ApiMessage], int] = {
    m.FindCoordinatorRequest: 4,
    m.ConsumerGroupHeartbeatRequest: 0,
    m.ConsumerGroupPrepareAssignmentRequest: 0,
    m.ConsumerGroupInstallAssignmentRequest: 0,
    # The classic protocol: KIP-394 (MEMBER_ID_REQUIRED) from JoinGroup v4, KIP-814
    # (SkipAssignment) at v9; SyncGroup v5 names protocol type and name; LeaveGroup v5 batches.
    m.JoinGroupRequest: 9,
    m.SyncGroupRequest: 5,
    m.HeartbeatRequest: 4,
    m.LeaveGroupRequest: 5,
}
_OFFSET_VERSION_BY_NAME = 9
_OFFSET_VERSION_BY_ID = 10

_NONE = Errors.NoError.errno
_STALE_MEMBER_EPOCH = Errors.StaleMemberEpochError.errno
_REBALANCE_IN_PROGRESS = Errors.RebalanceInProgressError.errno
_COORDINATOR_MOVED = COORDINATOR_MOVED


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


# ----------------------------------------------------------------------------- back-off


class Backoff:
    """Exponential back-off: ``initial * 2**attempt``, capped at ``maximum``, then jittered by
    ±``jitter`` (a fraction) so that members cut off together do not reconnect in lockstep."""

    def __init__(
        self,
        initial_ms: int,
        maximum_ms: int,
        *,
        jitter: float = 0.2,
        random: Callable[[], float] = random_module.random,
    ) -> None:
        if initial_ms <= 0 or maximum_ms < initial_ms:
            raise ValueError("need 0 < initial_ms <= maximum_ms")
        if not 0 <= jitter < 1:
            raise ValueError("jitter must lie in [0, 1)")
        self.initial_ms = initial_ms
        self.maximum_ms = maximum_ms
        self.jitter = jitter
        self._random = random
        self.attempts = 0

    def next_ms(self) -> int:
        """The delay before the next attempt; each call counts one more failed attempt."""
        base = min(self.maximum_ms, self.initial_ms * 2 ** min(self.attempts, 62))
        self.attempts += 1
        factor = 1 + self.jitter * (2 * self._random() - 1)
        return max(0, min(self.maximum_ms, round(base * factor)))

    def reset(self) -> None:
        self.attempts = 0


# ----------------------------------------------------------------------------- results


@dataclass(frozen=True)
class CommitResult:
    """What OffsetCommit said, per partition (error code 0 = committed)."""

    errors: dict[OffsetKey, int]
    member_epoch: int  # the epoch the commit was sent with

    @property
    def ok(self) -> bool:
        return all(code == _NONE for code in self.errors.values())

    @property
    def stale_member_epoch(self) -> bool:
        """The coordinator's epoch for this member is newer: ``await driver.next_heartbeat()``
        (which brings the new epoch) and commit again."""
        return any(code == _STALE_MEMBER_EPOCH for code in self.errors.values())

    @property
    def retry_after_heartbeat(self) -> bool:
        """Worth committing again once the member is current: STALE_MEMBER_EPOCH (KIP-848), or
        REBALANCE_IN_PROGRESS (a classic group completing a rebalance); ``await
        driver.next_heartbeat()`` first."""
        return any(code in (_STALE_MEMBER_EPOCH, _REBALANCE_IN_PROGRESS) for code in self.errors.values())

    @property
    def failed(self) -> dict[OffsetKey, int]:
        return {key: code for key, code in self.errors.items() if code != _NONE}


@dataclass(frozen=True)
class FetchResult:
    """Committed offsets (-1: none committed) and per-partition error codes."""

    offsets: dict[OffsetKey, int]
    errors: dict[OffsetKey, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(code == _NONE for code in self.errors.values())


class DriverClosed(RuntimeError):
    pass


# ----------------------------------------------------------------------------- the driver


class MemberDriver:
    """Runs one group member against the coordinator; see the module docstring.

    Typical use::

        driver = MemberDriver(MemberConfig(group_id="g", server_assignor="uniform"),
                              "127.0.0.1:9092", on_event=handle)
        driver.subscribe(topics=["orders"])
        await driver.start()
        ...
        await driver.close()    # revokes (handle gets RevokePartitions), leaves, stops
    """

    def __init__(
        self,
        config: MemberConfig | ClassicMemberConfig,
        bootstrap: str | Iterable[str | Address],
        *,
        topics: TopicResolver | None = None,
        metadata_max_age_ms: int | None = None,
        on_event: EventHandler | None = None,
        request_timeout_ms: int = 30_000,
        reconnect_backoff_ms: int = 50,
        reconnect_backoff_max_ms: int = 1_000,
        clock_ms: Callable[[], int] = monotonic_ms,
        random: Callable[[], float] = random_module.random,
        security: ClientSecurity | None = None,
        connect_timeout_ms: int | None = None,
        warn_after_ms: int = 10_000,
    ) -> None:
        self.config = config
        #: Give up (MemberFailed) when no coordinator was ever reached within this long (None:
        #: never). A member that once connected keeps retrying: its coordinator restarts.
        self.connect_timeout_ms = connect_timeout_ms
        #: Failing to connect is logged at INFO, then at WARNING once it lasted this long (or
        #: half the connect timeout); an address that is a Kafka broker is a WARNING at once.
        self.warn_after_ms = warn_after_ms if connect_timeout_ms is None else min(warn_after_ms, connect_timeout_ms // 2)
        self._connected_once = False
        self._failing_since_ms: int | None = None
        self._last_warning_ms: int | None = None
        self._last_reason: str | None = None
        #: Why the driver gave up finding a coordinator (None: it did not).
        self.gave_up: str | None = None
        self.security = security or ClientSecurity()
        self.member: GroupMember
        if isinstance(config, ClassicMemberConfig):
            if topics is None:
                raise ValueError("a classic member needs a topic resolver (topics=...): the classic protocol names topics")
            self.member = ClassicGroupMember(config, topics)
        else:
            self.member = ConsumerGroupMember(config)
        self.topics = topics
        #: The resolver when it can be refreshed (the worker's cluster metadata; a test's table cannot).
        self._refreshable = topics if isinstance(topics, RefreshableTopics) else None
        self.metadata_max_age_ms = metadata_max_age_ms
        self.bootstrap = parse_bootstrap(bootstrap)
        self.request_timeout_ms = request_timeout_ms
        self._on_event = on_event
        #: Events for callers without ``on_event``; RevokePartitions needs revocation_done().
        self.events: asyncio.Queue[MemberEvent] = asyncio.Queue()
        self._clock_ms = clock_ms
        self._backoff = Backoff(reconnect_backoff_ms, reconnect_backoff_max_ms, random=random)
        self._client_id = config.client_id or f"pystreams-{config.group_id}"

        self._connection: KafkaConnection | None = None
        self._connected = asyncio.Event()
        self._wakeup = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self._dispatch_task: asyncio.Task[None] | None = None
        self._metadata_task: asyncio.Task[None] | None = None
        self._pending_events: asyncio.Queue[MemberEvent] = asyncio.Queue()
        self._in_flight: set[asyncio.Task[None]] = set()
        self._heartbeat_waiters: list[asyncio.Future[None]] = []
        self._left = asyncio.Event()
        self._stopping = False

        #: Observability (and tests): how often the coordinator was looked up, and where it is.
        self.find_coordinator_count = 0
        self.coordinator: Address | None = None

    # ------------------------------------------------------------------ lifecycle

    def subscribe(self, topics: Iterable[str] | None = None, regex: str | None = None) -> None:
        self.member.subscribe(topics=topics, regex=regex)
        self._left.clear()
        self._wake()

    async def start(self) -> None:
        if self._loop_task is not None:
            raise RuntimeError("already started")
        self._loop_task = asyncio.create_task(self._run(), name=f"member-driver-{self.config.group_id}")
        self._dispatch_task = asyncio.create_task(self._dispatch_events(), name="member-driver-events")
        if isinstance(self.member, ClassicGroupMember) and self.metadata_max_age_ms and self._refreshable is not None:
            self._metadata_task = asyncio.create_task(self._refresh_metadata(), name="member-driver-metadata")

    async def __aenter__(self) -> MemberDriver:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def leave(self, *, permanent: bool = False, lose: bool = False, timeout_s: float | None = None) -> None:
        """Leave the group: the application gets RevokePartitions for everything it owns, then
        the member heartbeats -1 (or -2 for a static member unless ``permanent``). Returns once
        left (or the leave heartbeat failed: leaving is best effort, as in Kafka). With ``lose``
        the application gets PartitionsLost instead and the leave goes out at once (it failed
        and cannot commit)."""
        self.member.leave(self._clock_ms(), permanent=permanent, lose=lose)
        self._take_events()
        self._wake()
        if self.member.state is MemberState.UNSUBSCRIBED or self.gave_up is not None:
            return  # not in a group, or no coordinator to tell
        timeout = self.request_timeout_ms / 1000 * 2 if timeout_s is None else timeout_s
        async with asyncio.timeout(timeout):
            await self._left.wait()

    async def close(self, *, timeout_s: float | None = None) -> None:
        """Leave if in the group (bounded by ``timeout_s``), then stop every task and the connection."""
        if self._loop_task is not None and not self._stopping and self.gave_up is None:
            if self.member.state not in (MemberState.UNSUBSCRIBED, MemberState.FATAL):
                self.member.close(self._clock_ms())
                self._take_events()
                self._wake()
                with contextlib.suppress(TimeoutError):
                    timeout = self.request_timeout_ms / 1000 * 2 if timeout_s is None else timeout_s
                    async with asyncio.timeout(timeout):
                        await self._left.wait()
        await self.stop()

    async def stop(self) -> None:
        """Stop at once, without leaving (a crash, as far as the coordinator can tell)."""
        self._stopping = True
        tasks = [t for t in (self._loop_task, self._dispatch_task, self._metadata_task, *self._in_flight) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._drop_connection(None)
        for waiter in self._heartbeat_waiters:
            if not waiter.done():
                waiter.set_exception(DriverClosed("driver stopped"))
        self._heartbeat_waiters.clear()

    # ------------------------------------------------------------------ application calls

    def revocation_done(self, event: RevokePartitions) -> None:
        """For ``events`` queue users: the partitions of ``event`` are committed and released."""
        self.member.revocation_done(self._clock_ms(), event.revocation_id)
        self._take_events()
        self._wake()  # the acknowledgement goes out in a heartbeat right away

    def request_heartbeat(self) -> None:
        """Heartbeat now rather than at the interval (e.g. the assignor has a reason to send).
        Call on the driver's loop."""
        self.member.request_heartbeat()
        self._wake()

    async def next_heartbeat(self, timeout_s: float | None = None) -> None:
        """Wait for the next successful heartbeat response (e.g. after STALE_MEMBER_EPOCH)."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._heartbeat_waiters.append(waiter)
        self.member.request_heartbeat()
        self._wake()
        timeout = self.request_timeout_ms / 1000 * 2 if timeout_s is None else timeout_s
        async with asyncio.timeout(timeout):
            await waiter

    async def commit_offsets(
        self,
        offsets: Mapping[OffsetKey, int],
        *,
        member_epoch: int | None = None,
        metadata: str = "",
    ) -> CommitResult:
        """Commit ``{(topic id or name, partition): offset}`` with this member's id and epoch.

        Partitions keyed by topic id go in OffsetCommit v10, by name in v9 (two requests if
        mixed). ``member_epoch`` overrides the member's current epoch, for work done under an
        older one. Request-level failures come back as every partition's error code
        (REQUEST_TIMED_OUT, NETWORK_EXCEPTION, NOT_COORDINATOR, ...); nothing is raised.
        """
        epoch = self.member.member_epoch if member_epoch is None else member_epoch
        errors: dict[OffsetKey, int] = {}
        for version, group in _split_by_key_kind(offsets).items():
            by_topic: dict[UUID | str, list[tuple[int, int]]] = {}
            for (topic, partition), offset in group.items():
                by_topic.setdefault(topic, []).append((partition, offset))
            topic_class = m.OffsetCommitRequest.OffsetCommitRequestTopic
            partition_class = topic_class.OffsetCommitRequestPartition
            request = m.OffsetCommitRequest(
                group_id=self.config.group_id,
                generation_id_or_member_epoch=epoch,
                member_id=self.member.member_id,
                group_instance_id=self.config.instance_id,
                topics=[
                    topic_class(
                        **_topic_field(topic, version),
                        partitions=[
                            partition_class(
                                partition_index=partition,
                                committed_offset=offset,
                                committed_leader_epoch=-1,
                                committed_metadata=metadata,
                            )
                            for partition, offset in sorted(partitions)
                        ],
                    )
                    for topic, partitions in by_topic.items()
                ],
            )
            response, failure = await self._offsets_call(request, version)
            if response is None:
                errors.update({key: failure for key in group})
                continue
            for topic in response.topics:
                key_topic = topic.topic_id if version == _OFFSET_VERSION_BY_ID else topic.name
                for partition in topic.partitions:
                    errors[(key_topic, partition.partition_index)] = partition.error_code
            self._note_offset_errors(errors.values())
            self._note_group_epoch(getattr(response, "group_epoch", -1))
        return CommitResult(errors=errors, member_epoch=epoch)

    def _note_group_epoch(self, group_epoch: int) -> None:
        """The group's epoch, as a commit answer tells it: a member behind it has a rebalance
        step to take (a worker joined, a target moved) and heartbeats now rather than at its
        next interval, which for a stable member is the group's full interval."""
        if group_epoch > self.member.member_epoch > 0:
            self.member.request_heartbeat()
            self._wake()

    async def fetch_offsets(self, partitions: Iterable[OffsetKey], *, require_stable: bool = True) -> FetchResult:
        """Committed offsets of ``partitions`` (topic id → OffsetFetch v10, name → v9), read as
        this member (member id and epoch, when in the group)."""
        offsets: dict[OffsetKey, int] = {}
        errors: dict[OffsetKey, int] = {}
        keys = {key: 0 for key in partitions}
        in_group = self.member.member_epoch > 0
        for version, group in _split_by_key_kind(keys).items():
            by_topic: dict[UUID | str, list[int]] = {}
            for topic, partition in group:
                by_topic.setdefault(topic, []).append(partition)
            group_class = m.OffsetFetchRequest.OffsetFetchRequestGroup
            topic_class = group_class.OffsetFetchRequestTopics
            request = m.OffsetFetchRequest(
                require_stable=require_stable,
                groups=[
                    group_class(
                        group_id=self.config.group_id,
                        member_id=self.member.member_id if in_group else None,
                        member_epoch=self.member.member_epoch if in_group else -1,
                        topics=[topic_class(**_topic_field(topic, version), partition_indexes=sorted(indexes)) for topic, indexes in by_topic.items()],
                    )
                ],
            )
            response, failure = await self._offsets_call(request, version)
            if response is None:
                errors.update({key: failure for key in group})
                continue
            for group_response in response.groups:
                if group_response.error_code != _NONE:
                    errors.update({key: group_response.error_code for key in group})
                    continue
                for topic in group_response.topics:
                    key_topic = topic.topic_id if version == _OFFSET_VERSION_BY_ID else topic.name
                    for partition in topic.partitions:
                        key = (key_topic, partition.partition_index)
                        offsets[key] = partition.committed_offset
                        errors[key] = partition.error_code
            self._note_offset_errors(errors.values())
        return FetchResult(offsets=offsets, errors=errors)

    async def _offsets_call(self, request: ApiMessage, version: int) -> tuple[ApiMessage | None, int]:
        """(response, 0) or (None, the error code every partition gets)."""
        timeout_s = self.request_timeout_ms / 1000
        try:
            async with asyncio.timeout(timeout_s):
                await self._connected.wait()
        except TimeoutError:
            return None, Errors.CoordinatorNotAvailableError.errno
        connection = self._connection
        if connection is None:
            return None, Errors.CoordinatorNotAvailableError.errno
        try:
            return await connection.send(request, version, timeout_s), _NONE
        except TimeoutError:
            self._drop_connection(connection)
            return None, Errors.RequestTimedOutError.errno
        except ConnectionLost:
            self._drop_connection(connection)
            return None, Errors.NetworkExceptionError.errno

    def _note_offset_errors(self, codes: Iterable[int]) -> None:
        if any(code in _COORDINATOR_MOVED for code in codes):
            self._drop_connection(self._connection)

    # ------------------------------------------------------------------ the loop

    def _wake(self) -> None:
        self._wakeup.set()

    async def _run(self) -> None:
        try:
            while not self._stopping:
                if self.member.state is MemberState.FATAL or self.gave_up is not None:
                    return
                if self._wants_coordinator() and self._connection is None:
                    await self._connect()
                    continue
                now = self._clock_ms()
                self._wakeup.clear()
                connection = self._connection
                for request in self.member.poll(now):
                    if connection is None:  # nothing to send on: the attempt failed
                        self.member.on_request_failed(request, now)
                    else:
                        self._spawn_send(connection, request)
                self._take_events()
                deadline = self.member.next_deadline()
                timeout = None if deadline is None else max(0, deadline - self._clock_ms()) / 1000
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(timeout):
                        await self._wakeup.wait()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("member driver loop for group %s failed", self.config.group_id)
            raise

    def _wants_coordinator(self) -> bool:
        return self.member.state not in (MemberState.UNSUBSCRIBED, MemberState.FATAL)

    def _spawn_send(self, connection: KafkaConnection, request: ApiMessage) -> None:
        task = asyncio.create_task(self._send(connection, request))
        self._in_flight.add(task)
        task.add_done_callback(self._in_flight.discard)

    async def _send(self, connection: KafkaConnection, request: ApiMessage) -> None:
        version = _VERSIONS[type(request)]
        timeout_ms = self.member.request_timeout_ms(request, self.request_timeout_ms)
        try:
            response = await connection.send(request, version, timeout_ms / 1000)
        except (TimeoutError, ConnectionLost) as exc:
            log.info("%s to %s failed: %r", type(request).__name__, connection.address, exc)
            self._drop_connection(connection)
            self.member.on_request_failed(request, self._clock_ms())
        else:
            await self._resolve_topics(response)
            self.member.on_response(request, response, self._clock_ms())
            if self._confirms_membership(response):
                self._backoff.reset()  # the coordinator is healthy again
                waiters, self._heartbeat_waiters = self._heartbeat_waiters, []
                for waiter in waiters:
                    if not waiter.done():
                        waiter.set_result(None)
        self._take_events()
        self._wake()

    def _confirms_membership(self, response: ApiMessage) -> bool:
        """A successful heartbeat; for a classic member, one (or a SyncGroup) that finds it
        stable, since a commit refused during a rebalance must wait for the rebalance to end."""
        if getattr(response, "error_code", None) != _NONE:
            return False
        if isinstance(response, m.ConsumerGroupHeartbeatResponse):
            return True
        return isinstance(response, (m.HeartbeatResponse, m.SyncGroupResponse)) and self.member.state is MemberState.STABLE

    async def _resolve_topics(self, response: ApiMessage) -> None:
        """A classic response may name topics the resolver has not seen (just created): refresh
        it, off the loop, before the member reads them."""
        topics = self._refreshable
        if not isinstance(self.member, ClassicGroupMember) or topics is None:
            return
        names = topic_names_in(response)
        if names and any(topics.topic(name) is None for name in names):
            try:
                await asyncio.get_running_loop().run_in_executor(None, topics.refresh)
            except Exception as error:
                log.warning("group %s: refreshing topic metadata failed: %r", self.config.group_id, error)

    async def _refresh_metadata(self) -> None:
        topics, member = self._refreshable, self.member
        assert self.metadata_max_age_ms and topics is not None and isinstance(member, ClassicGroupMember)  # start() checked
        while True:
            await asyncio.sleep(self.metadata_max_age_ms / 1000)
            try:
                await asyncio.get_running_loop().run_in_executor(None, topics.refresh)
            except Exception as error:
                log.info("group %s: refreshing topic metadata failed: %r", self.config.group_id, error)
                continue
            member.metadata_changed()
            self._take_events()
            self._wake()

    def _take_events(self) -> None:
        """Move the member's events to the dispatcher; react to the ones the driver owns."""
        for event in self.member.take_events():
            if isinstance(event, CoordinatorUnavailable):
                self._drop_connection(self._connection)
            self._pending_events.put_nowait(event)

    async def _dispatch_events(self) -> None:
        while True:
            event = await self._pending_events.get()
            if self._on_event is None:
                await self.events.put(event)
            else:
                try:
                    await self._on_event(event)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    # Kafka logs a failing rebalance callback and carries on; so do we, and the
                    # revocation is still acknowledged so that the group can move on.
                    log.exception("on_event failed for %r", event)
                if isinstance(event, RevokePartitions):
                    self.revocation_done(event)
            if isinstance(event, LeftGroup):
                self._left.set()  # leave() returns once the application has seen it

    # ------------------------------------------------------------------ discovery

    def _drop_connection(self, connection: KafkaConnection | None) -> None:
        if connection is None or connection is not self._connection:
            return  # already replaced
        self._connection = None
        self.coordinator = None
        self._connected.clear()
        connection.close()
        self._wake()

    async def _connect(self) -> None:
        """Find the coordinator and connect to it; on failure sleep the back-off (wakeable)."""
        try:
            connection = await self._find_and_connect()
        except (OSError, TimeoutError, ConnectionLost, _CoordinatorLookupError, HandshakeError) as exc:
            now = self._clock_ms()
            if self._failing_since_ms is None:
                self._failing_since_ms = now
            failing_ms = now - self._failing_since_ms
            reason = str(exc) if isinstance(exc, _CoordinatorLookupError) else repr(exc)
            if not self._connected_once and self.connect_timeout_ms is not None and failing_ms >= self.connect_timeout_ms:
                self._give_up(f"no coordinator reached within {self.connect_timeout_ms / 1000:g} s, giving up: {reason}")
                return
            delay_ms = self._backoff.next_ms()
            log.log(
                self._connect_failure_level(exc, reason, now, failing_ms),
                "group %s: no coordinator: %s; retrying in %d ms",
                self.config.group_id,
                reason,
                delay_ms,
            )
            await asyncio.sleep(delay_ms / 1000)
            return
        if self._failing_since_ms is not None:
            log.info("group %s: coordinator reached at %s:%d", self.config.group_id, *connection.address)
        self._connected_once = True
        self._failing_since_ms = self._last_warning_ms = self._last_reason = None
        self._connection = connection
        self.coordinator = connection.address
        self._connected.set()

    def _connect_failure_level(self, exc: BaseException, reason: str, now: int, failing_ms: int) -> int:
        """INFO (once per reason) while a coordinator may just be starting; WARNING (at most
        every ``warn_after_ms``) once it lasts, or at once for an address that cannot be one;
        DEBUG for the retries in between."""
        wrong_server = isinstance(exc, _CoordinatorLookupError) and exc.wrong_server
        if not wrong_server and failing_ms < self.warn_after_ms:
            new_reason, self._last_reason = reason != self._last_reason, reason
            return logging.INFO if new_reason else logging.DEBUG
        if self._last_warning_ms is not None and now - self._last_warning_ms < self.warn_after_ms:
            return logging.DEBUG
        self._last_warning_ms = now
        return logging.WARNING

    def _give_up(self, message: str) -> None:
        """Stop looking for a coordinator: the application gets MemberFailed with ``message``
        (and says it: the driver does not, so that it is said once)."""
        self.gave_up = message
        self._pending_events.put_nowait(MemberFailed(Errors.CoordinatorNotAvailableError.errno, message))

    async def _find_and_connect(self) -> KafkaConnection:
        timeout_s = self.request_timeout_ms / 1000
        failures: list[_CoordinatorLookupError] = []
        # Start from a different bootstrap address each round, so a dead first one costs less.
        start = self._backoff.attempts % len(self.bootstrap)
        for address in self.bootstrap[start:] + self.bootstrap[:start]:
            try:
                bootstrap_connection = await KafkaConnection.open(address, self._client_id, timeout_s, self.security)
            except (OSError, TimeoutError, ConnectionLost, HandshakeError) as exc:
                failures.append(_CoordinatorLookupError.at(address, exc, timeout_s))
                continue
            keep = False
            try:
                if bootstrap_connection.server is not None and not bootstrap_connection.server.is_pystreams_coordinator:
                    raise _CoordinatorLookupError(
                        f"{address[0]}:{address[1]} is a Kafka broker, not a pystreams coordinator: point --coordinator "
                        "at the address `pystreams coordinator` listens on (its --listen)",
                        wrong_server=True,
                    )
                self.find_coordinator_count += 1
                response = await bootstrap_connection.send(
                    m.FindCoordinatorRequest(key_type=CoordinatorType.GROUP, coordinator_keys=[self.config.group_id]),
                    _VERSIONS[m.FindCoordinatorRequest],
                    timeout_s,
                )
                [entry] = response.coordinators
                if entry.error_code != _NONE:
                    raise _CoordinatorLookupError(f"FindCoordinator: {Errors.for_code(entry.error_code).__name__} {entry.error_message or ''}")
                coordinator = (entry.host, entry.port)
                if coordinator == address:
                    connection = bootstrap_connection
                else:
                    try:
                        connection = await KafkaConnection.open(coordinator, self._client_id, timeout_s, self.security)
                    except (OSError, TimeoutError, ConnectionLost, HandshakeError) as exc:
                        # Name the node FindCoordinator sent us to, not the one we asked (a node of a
                        # cluster may name one that just stopped, until the shards have moved).
                        named = _CoordinatorLookupError.at(coordinator, exc, timeout_s)
                        raise _CoordinatorLookupError(f"{named} (named by FindCoordinator at {address[0]}:{address[1]})") from exc
                if connection.server is not None and not connection.server.is_pystreams_coordinator:
                    connection.close()
                    raise _CoordinatorLookupError(
                        f"{coordinator[0]}:{coordinator[1]} (named by FindCoordinator at {address[0]}:{address[1]}) is "
                        "a Kafka broker, not a pystreams coordinator",
                        wrong_server=True,
                    )
                keep = connection is bootstrap_connection
                return connection
            except _CoordinatorLookupError as exc:
                failures.append(exc)
            except (OSError, TimeoutError, ConnectionLost, HandshakeError) as exc:
                failures.append(_CoordinatorLookupError.at(address, exc, timeout_s))
            finally:
                if not keep:
                    bootstrap_connection.close()
        if len(failures) == 1:
            raise failures[0]
        raise _CoordinatorLookupError("; ".join(map(str, failures)), wrong_server=all(f.wrong_server for f in failures))


class _CoordinatorLookupError(Exception):
    """Why no coordinator was found, said for a user; ``wrong_server``: the address answers
    but is no coordinator (a Kafka broker), which retrying will not change."""

    def __init__(self, message: str, *, wrong_server: bool = False) -> None:
        super().__init__(message)
        self.wrong_server = wrong_server

    @classmethod
    def at(cls, address: Address, error: BaseException, timeout_s: float) -> _CoordinatorLookupError:
        where = f"{address[0]}:{address[1]}"
        if isinstance(error, ConnectionRefusedError):
            return cls(
                f"nothing listens at {where} — is the coordinator running? (`pystreams coordinator`, or `pystreams dev`; --coordinator names its address)"
            )
        if isinstance(error, socket.gaierror):
            return cls(f"cannot resolve the host of {where} ({error.strerror}); check --coordinator")
        if isinstance(error, TimeoutError):
            return cls(f"{where} did not answer within {timeout_s:g} s (a firewall, or a host that is down?)")
        if isinstance(error, (ConnectionLost, HandshakeError)):
            return cls(
                f"{where} does not talk like a pystreams coordinator ({error}); is it the coordinator's "
                "Kafka-protocol port, and do TLS/SASL settings match its listener?"
            )
        return cls(f"cannot connect to {where}: {error}")


def _split_by_key_kind(offsets: Mapping[OffsetKey, int]) -> dict[int, dict[OffsetKey, int]]:
    """Topic-id keys → v10, name keys → v9."""
    split: dict[int, dict[OffsetKey, int]] = {}
    for key, value in offsets.items():
        topic = key[0]
        if isinstance(topic, UUID):
            version = _OFFSET_VERSION_BY_ID
        elif isinstance(topic, str) and topic:
            version = _OFFSET_VERSION_BY_NAME
        else:
            raise TypeError(f"partition key {key!r}: the topic must be a UUID or a non-empty name")
        split.setdefault(version, {})[(topic, key[1])] = value
    return split


def _topic_field(topic: UUID | str, version: int) -> dict[str, object]:
    return {"topic_id": topic} if version == _OFFSET_VERSION_BY_ID else {"name": topic}


__all__ = [
    "Backoff",
    "CommitResult",
    "ConnectionLost",
    "DriverClosed",
    "FetchResult",
    "KafkaConnection",
    "MemberDriver",
    "OffsetKey",
    "parse_bootstrap",
]
