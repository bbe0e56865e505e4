"""GroupCoordinatorShard: the sans-IO state machine of one partition of the group log.

``handle(request, now_ms)`` and ``expire(now_ms)`` return a response (or None) and the records
the change produced; the shard's state changes only by replaying those records, which
``handle`` does as it generates them. The runtime must make the records durable before it
sends the response. ``next_deadline()`` says when ``expire`` wants to run; ``update_topics``
feeds topic metadata from the cluster; ``on_loaded`` performs the KIP's fail-over duties after
a replay. No sockets, threads, sleeps or clocks in here.

The shard composes one manager per concern, each built with the explicit
:class:`~pystreams.coordinator.context.ShardContext` (emit records, timers, config, topics):
consumer groups (KIP-848), classic groups, classic members of consumer groups, the migration
between the two types, offsets, group configs, and DescribeGroups for admin tools. The classic
APIs (JoinGroup, SyncGroup, Heartbeat, LeaveGroup) are routed here by the type of the group
they name, as Kafka does.

**A handler bug is a bug, not an outage.** Every event runs in a journal: if a handler raises,
what it emitted is rolled back (pre-images replayed, timers restored), nothing reaches the log,
and the request alone is answered UNKNOWN_SERVER_ERROR (:class:`HandlerFailed`).

**A record that cannot be read never bricks a shard.** Loading replays what it can; an
:class:`~pystreams.coordinator.records.UnreadableRecord` that no later record of the same key
supersedes quarantines its group (``finish_load``): that group answers COORDINATOR_NOT_AVAILABLE
with the offset and the reason, every other group is served, and
``pystreams coordinator repair`` writes the tombstone that releases it.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import kafka.errors as Errors

from pystreams.assignors.api import ServerAssignor, TopicMetadata
from pystreams.coordinator import records as r
from pystreams.coordinator.classic import ClassicGroupManager, join_response, leave_response, sync_response
from pystreams.coordinator.classic_group import ClassicGroup
from pystreams.coordinator.classic_members import ClassicMemberManager
from pystreams.coordinator.config import CoordinatorConfig
from pystreams.coordinator.consumer import ConsumerGroupManager
from pystreams.coordinator.consumer_group import ConsumerGroup
from pystreams.coordinator.context import Quarantine, ShardContext
from pystreams.coordinator.describe_groups import DescribeGroupsHandler
from pystreams.coordinator.errors import RequestError
from pystreams.coordinator.group_configs import GroupConfigManager
from pystreams.coordinator.migration import Migration
from pystreams.coordinator.offsets import OffsetManager
from pystreams.coordinator.timers import (
    ClassicHeartbeatTimer,
    ClassicJoinTimer,
    ClassicMemberJoinTimer,
    ClassicMemberSyncTimer,
    ClassicSyncTimer,
    ComputationTimer,
    EmptyGroupTimer,
    RevocationTimer,
    SessionTimer,
)
from pystreams.protocol import messages as m

log = logging.getLogger(__name__)


@dataclass
class CoordinatorResult:
    #: The answer, None (timers, topics), or DEFERRED: it comes later, in some event's completions.
    response: object | None
    records: list[r.Record] = field(default_factory=list)
    #: (request id, response) of requests deferred earlier that this event answers.
    completions: list[tuple[int, object]] = field(default_factory=list)


@dataclass(frozen=True)
class RequestContext:
    """What the connection knows about the caller (Kafka's RequestContext). ``request_id`` names
    the request if its answer is deferred (unique among the shard's requests)."""

    client_id: str = ""
    client_host: str = ""
    request_id: int = 0


class HandlerFailed(Errors.UnknownError):
    """A handler raised; its changes were rolled back. Answered as UNKNOWN_SERVER_ERROR."""


class GroupCoordinatorShard:
    def __init__(
        self,
        config: CoordinatorConfig | None = None,
        assignors: Mapping[str, ServerAssignor] | None = None,
        new_member_id: Callable[[], str] | None = None,
    ) -> None:
        self.config = config or CoordinatorConfig()
        if assignors is None:
            from pystreams.assignors.server import server_assignor

            assignors = {name: server_assignor(name) for name in self.config.assignors}
        missing = [name for name in self.config.assignors if name not in assignors]
        if missing:
            raise ValueError(f"configured server assignors without an implementation: {missing}")
        self.assignors = dict(assignors)
        self.ctx = ShardContext(self.config, self, new_member_id or (lambda: str(uuid.uuid4())))
        self.consumer = ConsumerGroupManager(self.ctx, self.assignors)
        self.classic = ClassicGroupManager(self.ctx)
        self.classic_members = ClassicMemberManager(self.ctx, self.consumer)
        self.migration = Migration(self.ctx, self.consumer, self.classic)
        self.consumer.migration = self.migration
        self.classic_members.downgrade_on_replacement = self.migration.downgrade_on_replacement
        self.offsets = OffsetManager(self.ctx, self.consumer.create_group)
        self.group_configs = GroupConfigManager(self.ctx)
        self.describe = DescribeGroupsHandler(self.ctx, self.consumer)
        #: Unreadable records met while loading, by their key bytes (a later record of the same
        #: key supersedes one, as compaction would).
        self._unreadable: dict[bytes, r.UnreadableRecord] = {}
        #: Handler failures rolled back since start (for the metrics).
        self.handler_failures = 0
        self._handlers: dict[int, Callable] = {
            m.ConsumerGroupHeartbeatRequest.API_KEY: self.consumer.consumer_group_heartbeat,
            m.ConsumerGroupPrepareAssignmentRequest.API_KEY: self.consumer.consumer_group_prepare_assignment,
            m.ConsumerGroupInstallAssignmentRequest.API_KEY: self.consumer.consumer_group_install_assignment,
            m.ConsumerGroupDescribeRequest.API_KEY: self.consumer.consumer_group_describe,
            m.JoinGroupRequest.API_KEY: self.join_group,
            m.SyncGroupRequest.API_KEY: self.sync_group,
            m.HeartbeatRequest.API_KEY: self.heartbeat,
            m.LeaveGroupRequest.API_KEY: self.leave_group,
            m.OffsetCommitRequest.API_KEY: self.offsets.offset_commit,
            m.OffsetFetchRequest.API_KEY: self.offsets.offset_fetch,
            m.ListGroupsRequest.API_KEY: self.list_groups,
            m.DescribeGroupsRequest.API_KEY: self.describe.describe_groups,
            m.DescribeConfigsRequest.API_KEY: self.group_configs.describe_configs,
            m.IncrementalAlterConfigsRequest.API_KEY: self.group_configs.incremental_alter_configs,
        }

    # --- what tests, tools and the simulator read ----------------------------------------------

    @property
    def groups(self):
        return self.ctx.groups

    @property
    def timers(self):
        return self.ctx.timers

    @property
    def topics(self) -> Mapping[str, TopicMetadata]:
        return self.ctx.topics

    @property
    def group_configs_by_group(self) -> dict[str, dict[str, str]]:
        return self.ctx.group_configs

    @property
    def computations(self):
        return self.consumer.computations

    @property
    def quarantined(self) -> dict[str, Quarantine]:
        return self.ctx.groups.quarantined

    # --- the sans-IO surface ------------------------------------------------------------------

    def handle(self, request, now_ms: int, context: RequestContext | None = None) -> CoordinatorResult:
        handler = self._handlers.get(request.API_KEY)
        if handler is None:
            raise TypeError(f"the group coordinator does not handle {type(request).__name__}")
        self.ctx.request = context or RequestContext()
        return self._run(handler, request, now_ms)

    def handles(self, api_key: int) -> bool:
        return api_key in self._handlers

    def expire(self, now_ms: int) -> CoordinatorResult:
        """Fire every due timer; one that fails is rolled back and dropped, the others stand."""
        self.ctx.begin()
        try:
            for timer in self.ctx.timers.pop_due(now_ms):
                savepoint = self.ctx.savepoint()
                try:
                    self._expire(timer, now_ms)
                except Exception:
                    self.ctx.rollback(savepoint)
                    self.handler_failures += 1
                    log.exception("timer %s failed; its changes were rolled back", timer)
            return CoordinatorResult(None, *self.ctx.commit())
        except BaseException:
            self.ctx.abort()
            raise

    def update_topics(self, topics: Mapping[str, TopicMetadata], now_ms: int) -> CoordinatorResult:
        """New topic metadata from the cluster: groups whose subscriptions it touches rebalance."""
        return self._run(self._update_topics, dict(topics), now_ms)

    def on_loaded(self, now_ms: int) -> CoordinatorResult:
        """Fail-over duties after a replay (KIP-848 "Fail Over")."""
        return self._run(self._on_loaded, now_ms)

    def next_deadline(self) -> int | None:
        return self.ctx.timers.next_deadline()

    def _run(self, fn: Callable, *args) -> CoordinatorResult:
        self.ctx.begin()
        try:
            response = fn(*args)
        except Exception as error:
            self.ctx.abort()
            self.handler_failures += 1
            log.exception("%s failed; its changes were rolled back", getattr(fn, "__name__", fn))
            raise HandlerFailed(f"the coordinator failed to handle the request: {type(error).__name__}") from error
        except BaseException:
            self.ctx.abort()
            raise
        return CoordinatorResult(response, *self.ctx.commit())

    # --- records ------------------------------------------------------------------------------

    def replay(self, record: r.Record | r.UnreadableRecord) -> None:
        """Apply one record (live and at load); an unreadable one is remembered, not applied."""
        if self._unreadable and not isinstance(record, r.UnreadableRecord):
            self._unreadable.pop(r.encode(record)[0], None)  # a later record of the key supersedes it
        match record:
            case r.UnreadableRecord(tombstone=True):
                self._unreadable.pop(record.raw_key, None)
                return
            case r.UnreadableRecord():
                self._unreadable[record.raw_key] = record
                return
            case r.GroupConfig():
                self.group_configs.replay(record)
            case r.OffsetCommit():
                self.offsets.replay(record)
            case r.ClassicGroupMetadata(group_id=group_id, value=None):
                if isinstance(self.ctx.groups.peek(group_id), ClassicGroup):
                    self.ctx.groups.pop(group_id)
            case r.ClassicGroupMetadata(group_id=group_id, value=r.ClassicGroupValue() as value):
                group = self.ctx.groups.peek(group_id)
                if self.ctx.in_event and isinstance(group, ClassicGroup):
                    group.persisted = value  # live: the manager changed the group, this records it
                else:
                    self._replace_other_type(group_id, ClassicGroup)
                    self.ctx.groups[group_id] = ClassicGroup.from_record(group_id, value)
            case r.GroupMetadata(group_id=group_id, value=None):
                if isinstance(self.ctx.groups.peek(group_id), ConsumerGroup):
                    self.ctx.groups.pop(group_id)
            case _:
                group = self.ctx.groups.peek(record.group_id)
                if not isinstance(group, ConsumerGroup):
                    if record.value is None:
                        return
                    self._replace_other_type(record.group_id, ConsumerGroup)
                    group = self.ctx.groups[record.group_id] = ConsumerGroup(record.group_id)
                group.replay(record)

    def _replace_other_type(self, group_id: str, kind: type) -> None:
        """Every conversion tombstones the old type first; a log without that tombstone (written
        by something else, or damaged) lets the later record win, as compaction would."""
        other = self.ctx.groups.peek(group_id)
        if other is not None and not isinstance(other, kind):
            log.warning(
                "group %s: a %s record follows the %s group without its tombstone; the later record wins", group_id, kind.__name__, type(other).__name__
            )
            self.ctx.groups.pop(group_id)

    def pre_image(self, record: r.Record) -> r.Record:
        match record:
            case r.GroupConfig():
                return self.group_configs.pre_image(record)
            case r.OffsetCommit():
                return self.offsets.pre_image(record)
            case r.ClassicGroupMetadata(group_id=group_id):
                group = self.ctx.groups.peek(group_id)
                return r.ClassicGroupMetadata(group_id, group.persisted if isinstance(group, ClassicGroup) else None)
        group = self.ctx.groups.peek(record.group_id)
        if not isinstance(group, ConsumerGroup):
            return r.tombstone_of(record)
        return group.pre_image(record)

    def finish_load(self) -> list[Quarantine]:
        """After a replay: quarantine the groups that unreadable records belong to."""
        by_group: dict[str, list[r.UnreadableRecord]] = {}
        for unreadable in self._unreadable.values():
            if unreadable.group_id is None:
                log.error("log record at offset %d cannot be read and names no group; it is skipped: %s", unreadable.offset, unreadable.reason)
                continue
            by_group.setdefault(unreadable.group_id, []).append(unreadable)
        self._unreadable.clear()
        quarantines = []
        for group_id, records in sorted(by_group.items()):
            quarantine = Quarantine(group_id, tuple(sorted(records, key=lambda u: u.offset)))
            self.ctx.groups.quarantined[group_id] = quarantine
            quarantines.append(quarantine)
        return quarantines

    def snapshot(self) -> dict:
        """The record-derived state, for comparing a live shard with a replayed one."""
        return {
            "groups": {gid: g.snapshot() for gid, g in sorted(self.ctx.groups.items())},
            "offsets": {gid: dict(sorted(o.items())) for gid, o in sorted(self.offsets.offsets.items())},
            "group_configs": {gid: dict(c) for gid, c in sorted(self.ctx.group_configs.items())},
        }

    # --- timers, topics, fail-over ------------------------------------------------------------

    def _expire(self, timer, now_ms: int) -> None:
        match timer:
            case SessionTimer() | RevocationTimer() | ComputationTimer() | ClassicMemberJoinTimer() | ClassicMemberSyncTimer():
                self.consumer.expire(timer, now_ms)
            case ClassicHeartbeatTimer() | ClassicJoinTimer() | ClassicSyncTimer():
                self.classic.expire(timer, now_ms)
            case EmptyGroupTimer(group_id=group_id):
                group = self.ctx.groups.peek(group_id)
                if group is None or not group.is_empty or group_id in self.ctx.groups.quarantined:
                    return
                self.offsets.delete_all(group_id)
                if isinstance(group, ClassicGroup):
                    self.classic.delete(group)
                else:
                    self.consumer.delete_group(group)

    def _update_topics(self, topics: dict[str, TopicMetadata], now_ms: int) -> None:
        self.ctx.topics = topics
        for _, group in list(self.ctx.groups.served()):
            if isinstance(group, ConsumerGroup) and group.members:
                self.consumer.on_topics_changed(group, now_ms)
            elif isinstance(group, ClassicGroup) and group.members:
                self.classic.on_topics_changed(group, now_ms)

    def _on_loaded(self, now_ms: int) -> None:
        for _, group in list(self.ctx.groups.served()):
            if isinstance(group, ClassicGroup):
                self.classic.on_loaded(group, now_ms)
            else:
                self.consumer.on_loaded(group, now_ms)

    # --- the classic protocol: routed by the type of the group it names ------------------------

    def join_group(self, request, now_ms: int):
        """Kafka's classicGroupJoin: a non-empty consumer group takes the member as a classic
        member; an empty one is replaced by a classic group (any migration policy)."""
        version = request.API_VERSION or 0
        config = self.config
        if not request.group_id:
            return join_response(version, error=Errors.InvalidGroupIdError.errno, member_id=request.member_id)
        if not config.classic_min_session_timeout_ms <= request.session_timeout_ms <= config.classic_max_session_timeout_ms:
            return join_response(version, error=Errors.InvalidSessionTimeoutError.errno, member_id=request.member_id)
        savepoint = self.ctx.savepoint()
        try:
            group = self.ctx.groups.get(request.group_id)
            if isinstance(group, ConsumerGroup):
                if not group.is_empty:
                    return self.classic_members.join_group(request, now_ms, group)
                self.consumer.delete_group(group)
                group = None
            return self.classic.join_group(request, now_ms, group)
        except RequestError as refused:
            self.ctx.rollback(savepoint)
            log.info("JoinGroup of group %s refused: %s", request.group_id, refused.message)
            return join_response(version, error=refused.code, member_id=request.member_id)

    def sync_group(self, request, now_ms: int):
        if not request.group_id:
            return sync_response(Errors.InvalidGroupIdError.errno)
        if (request.API_VERSION or 0) >= 5 and (request.protocol_type is None or request.protocol_name is None):
            return sync_response(Errors.InconsistentGroupProtocolError.errno)
        group = self._classic_api_group(request.group_id)
        if isinstance(group, RequestError):
            return sync_response(group.code)
        if isinstance(group, ConsumerGroup):
            return self.classic_members.sync_group(request, now_ms, group)
        return self.classic.sync_group(request, now_ms, group)

    def heartbeat(self, request, now_ms: int):
        if not request.group_id:
            return m.HeartbeatResponse(throttle_time_ms=0, error_code=Errors.InvalidGroupIdError.errno)
        group = self._classic_api_group(request.group_id)
        if isinstance(group, RequestError):
            return m.HeartbeatResponse(throttle_time_ms=0, error_code=group.code)
        if isinstance(group, ConsumerGroup):
            return self.classic_members.heartbeat(request, now_ms, group)
        return self.classic.heartbeat(request, now_ms, group)

    def leave_group(self, request, now_ms: int):
        version = request.API_VERSION or 0
        if not request.group_id:
            return leave_response(version, Errors.InvalidGroupIdError.errno, [])
        group = self._classic_api_group(request.group_id)
        if isinstance(group, RequestError):
            if version < 3:
                return leave_response(version, group.code, [])
            return leave_response(version, 0, [(mb.member_id, mb.group_instance_id, group.code) for mb in request.members or ()])
        if isinstance(group, ConsumerGroup):
            return self.classic_members.leave_group(request, now_ms, group)
        return self.classic.leave_group(request, now_ms, group)

    def _classic_api_group(self, group_id: str) -> ConsumerGroup | ClassicGroup | RequestError:
        """The group a SyncGroup, Heartbeat or LeaveGroup names, or why there is none to act on:
        no group, or an empty consumer group, is UNKNOWN_MEMBER_ID (a quarantined one says so)."""
        try:
            group = self.ctx.groups.get(group_id)
        except RequestError as refused:
            return refused
        if group is None or (isinstance(group, ConsumerGroup) and group.is_empty):
            return RequestError(Errors.UnknownMemberIdError, f"Group {group_id} has no members.")
        return group

    # --- ListGroups ---------------------------------------------------------------------------

    def list_groups(self, request, now_ms: int):
        Response = m.ListGroupsResponse
        states = {s.lower() for s in (request.states_filter or [])}
        types = {t.lower() for t in (request.types_filter or [])}
        listed = []
        for group_id, group in sorted(self.ctx.groups.served()):
            state = group.state.value
            if states and state.lower() not in states:
                continue
            if types and group.group_type not in types:
                continue
            protocol_type = (group.protocol_type or "") if isinstance(group, ClassicGroup) else "consumer"
            listed.append(Response.ListedGroup(group_id=group_id, protocol_type=protocol_type, group_state=state, group_type=group.group_type))
        return Response(error_code=0, groups=listed)
