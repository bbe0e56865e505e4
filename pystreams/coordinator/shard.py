"""GroupCoordinatorShard: the sans-IO state machine of one partition of the group log.

``handle(request, now_ms)`` and ``expire(now_ms)`` return a response (or None) and the records
the change produced; the shard's state changes only by replaying those records, which
``handle`` does as it generates them. The runtime must make the records durable before it
sends the response. ``next_deadline()`` says when ``expire`` wants to run; ``update_topics``
feeds topic metadata from the cluster; ``on_loaded`` performs the KIP's fail-over duties after
a replay. No sockets, threads, sleeps or clocks in here.
"""
from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import kafka.errors as Errors

from pystreams.assignors.api import ServerAssignor, TopicMetadata
from pystreams.coordinator import records as r
from pystreams.coordinator.config import GROUP_CONFIG_NAMES, HEARTBEAT_INTERVAL, SESSION_TIMEOUT, CoordinatorConfig, validate_group_config
from pystreams.coordinator.consumer import (
    ClientComputation,
    ConsumerGroupHandlers,
    computation_key,
    empty_group_key,
    revocation_key,
    session_key,
)
from pystreams.coordinator.consumer_group import LEAVE_STATIC_EPOCH, ConsumerGroup, GroupState
from pystreams.coordinator.describe_groups import DescribeGroupsHandler
from pystreams.coordinator.offsets import OffsetHandlers
from pystreams.coordinator.timers import Timers
from pystreams.protocol import messages as m

GROUP_RESOURCE = 16  # ConfigResource.Type.GROUP
CONFIG_SOURCE_DEFAULT = 5
CONFIG_SOURCE_GROUP = 8
OP_SET, OP_DELETE = 0, 1


@dataclass
class CoordinatorResult:
    response: object | None
    records: list[r.Record] = field(default_factory=list)


@dataclass(frozen=True)
class RequestContext:
    """What the connection knows about the caller (Kafka's RequestContext)."""

    client_id: str = ""
    client_host: str = ""


class GroupCoordinatorShard(ConsumerGroupHandlers, OffsetHandlers, DescribeGroupsHandler):
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
        self.new_member_id = new_member_id or (lambda: str(uuid.uuid4()))
        self.groups: dict[str, ConsumerGroup] = {}
        self.group_configs: dict[str, dict[str, str]] = {}
        self.topics: dict[str, TopicMetadata] = {}
        self.timers = Timers()
        self.computations: dict[str, ClientComputation] = {}
        self._pending: list[r.Record] | None = None
        self.context = RequestContext()
        self._handlers = {
            m.ConsumerGroupHeartbeatRequest.API_KEY: self.consumer_group_heartbeat,
            m.ConsumerGroupPrepareAssignmentRequest.API_KEY: self.consumer_group_prepare_assignment,
            m.ConsumerGroupInstallAssignmentRequest.API_KEY: self.consumer_group_install_assignment,
            m.ConsumerGroupDescribeRequest.API_KEY: self.consumer_group_describe,
            m.OffsetCommitRequest.API_KEY: self.offset_commit,
            m.OffsetFetchRequest.API_KEY: self.offset_fetch,
            m.ListGroupsRequest.API_KEY: self.list_groups,
            m.DescribeGroupsRequest.API_KEY: self.describe_groups,
            m.DescribeConfigsRequest.API_KEY: self.describe_configs,
            m.IncrementalAlterConfigsRequest.API_KEY: self.incremental_alter_configs,
        }

    # --- the sans-IO surface ------------------------------------------------------------------

    def handle(self, request, now_ms: int, context: RequestContext | None = None) -> CoordinatorResult:
        handler = self._handlers.get(request.API_KEY)
        if handler is None:
            raise TypeError(f"the group coordinator does not handle {type(request).__name__}")
        self.context = context or RequestContext()
        return self._run(handler, request, now_ms)

    def handles(self, api_key: int) -> bool:
        return api_key in self._handlers

    def expire(self, now_ms: int) -> CoordinatorResult:
        return self._run(self._expire, now_ms)

    def update_topics(self, topics: Mapping[str, TopicMetadata], now_ms: int) -> CoordinatorResult:
        """New topic metadata from the cluster: groups whose subscriptions it touches rebalance."""
        return self._run(self._update_topics, dict(topics), now_ms)

    def on_loaded(self, now_ms: int) -> CoordinatorResult:
        """Fail-over duties after a replay (KIP-848 "Fail Over")."""
        return self._run(self._on_loaded, now_ms)

    def next_deadline(self) -> int | None:
        return self.timers.next_deadline()

    def replay(self, record: r.Record) -> None:
        key, value = record.key, record.value
        if isinstance(key, r.GroupConfigKey):
            if value is None:
                self.group_configs.pop(key.group_id, None)
            else:
                self.group_configs[key.group_id] = dict(value.configs)
            return
        group = self.groups.get(key.group_id)
        if group is None:
            if value is None:
                return
            group = self.groups[key.group_id] = ConsumerGroup(key.group_id)
        if isinstance(key, r.GroupMetadataKey) and value is None:
            del self.groups[key.group_id]
            return
        group.replay(key, value)

    def snapshot(self) -> dict:
        """The record-derived state, for comparing a live shard with a replayed one."""
        return {
            "groups": {gid: g.snapshot() for gid, g in sorted(self.groups.items())},
            "group_configs": {gid: dict(c) for gid, c in sorted(self.group_configs.items())},
        }

    # --- plumbing -----------------------------------------------------------------------------

    def emit(self, record: r.Record) -> None:
        """Generate a record: replay it now, and hand it to the runtime to persist."""
        if self._pending is None:
            raise RuntimeError("records can only be emitted while handling an event")
        self.replay(record)
        self._pending.append(record)

    def create_group(self, group_id: str, now_ms: int) -> ConsumerGroup:
        """A new, EMPTY consumer group; it exists because a record says so."""
        self.emit(r.Record(r.GroupMetadataKey(group_id), r.GroupMetadataValue(0)))
        self.timers.schedule(empty_group_key(group_id), now_ms + self.config.empty_group_retention_ms)
        return self.groups[group_id]

    def _run(self, fn, *args) -> CoordinatorResult:
        self._pending = []
        try:
            return CoordinatorResult(fn(*args), self._pending)
        finally:
            self._pending = None

    def session_timeout_ms(self, group_id: str) -> int:
        return self._group_config(group_id, SESSION_TIMEOUT)

    def heartbeat_interval_ms(self, group_id: str) -> int:
        return self._group_config(group_id, HEARTBEAT_INTERVAL)

    def _group_config(self, group_id: str, name: str) -> int:
        value = self.group_configs.get(group_id, {}).get(name)
        return int(value) if value is not None else self.config.default(name)

    # --- timers -------------------------------------------------------------------------------

    def _expire(self, now_ms: int) -> None:
        for key in self.timers.pop_due(now_ms):
            kind, group_id = key[0], key[1]
            group = self.groups.get(group_id)
            if group is None:
                continue
            if kind in ("session", "revocation"):
                member = group.members.get(key[2])
                if member is not None:
                    self.remove_member(group, member, now_ms)
            elif kind == "computation":
                self.reassign_computation(group, now_ms)
            elif kind == "empty" and not group.members:
                self._delete_group(group)

    def _delete_group(self, group: ConsumerGroup) -> None:
        """An EMPTY group past its retention becomes DEAD: everything it wrote is tombstoned."""
        for topic, partition in sorted(group.offsets):
            self.emit(r.Record(r.OffsetCommitKey(group.group_id, topic, partition), None))
        self.emit(r.Record(r.PartitionMetadataKey(group.group_id), None))
        self.emit(r.Record(r.TargetAssignmentMetadataKey(group.group_id), None))
        self.emit(r.Record(r.GroupMetadataKey(group.group_id), None))
        self.computations.pop(group.group_id, None)

    # --- topic metadata and fail-over ---------------------------------------------------------

    def _update_topics(self, topics: dict[str, TopicMetadata], now_ms: int) -> None:
        self.topics = topics
        for group in list(self.groups.values()):
            if group.members:
                self.on_topics_changed(group, now_ms)

    def _on_loaded(self, now_ms: int) -> None:
        for group in list(self.groups.values()):
            session = self.session_timeout_ms(group.group_id)
            for member in group.members.values():
                self.timers.schedule(session_key(group.group_id, member.member_id), now_ms + session)
                if member.revoking:
                    self.timers.schedule(revocation_key(group.group_id, member.member_id), now_ms + member.rebalance_timeout_ms)
            if not group.members:
                self.timers.schedule(empty_group_key(group.group_id), now_ms + self.config.empty_group_retention_ms)
                continue
            if self.topics:
                self.on_topics_changed(group, now_ms)
            self.maybe_compute_target(group, now_ms)

    # --- ListGroups ---------------------------------------------------------------------------

    def list_groups(self, request, now_ms: int):
        Response = m.ListGroupsResponse
        states = {s.lower() for s in (request.states_filter or [])}
        types = {t.lower() for t in (request.types_filter or [])}
        listed = []
        for group_id, group in sorted(self.groups.items()):
            state = group.state.value
            if states and state.lower() not in states:
                continue
            if types and group.group_type not in types:
                continue
            listed.append(Response.ListedGroup(group_id=group_id, protocol_type="consumer", group_state=state, group_type=group.group_type))
        return Response(error_code=0, groups=listed)

    # --- dynamic group configs (DescribeConfigs / IncrementalAlterConfigs, resource GROUP) -----

    def describe_configs(self, request, now_ms: int):
        Response = m.DescribeConfigsResponse
        Result, Entry = Response.DescribeConfigsResult, Response.DescribeConfigsResult.DescribeConfigsResourceResult
        results = []
        for resource in request.resources:
            if resource.resource_type != GROUP_RESOURCE:
                results.append(Result(error_code=Errors.InvalidRequestError.errno, error_message="The pystreams coordinator serves GROUP (16) config resources only.", resource_type=resource.resource_type, resource_name=resource.resource_name, configs=[]))
                continue
            overrides = self.group_configs.get(resource.resource_name, {})
            names = resource.configuration_keys or list(GROUP_CONFIG_NAMES)
            entries = []
            for name in names:
                if name not in GROUP_CONFIG_NAMES:
                    continue
                override = overrides.get(name)
                entries.append(
                    Entry(
                        name=name,
                        value=override if override is not None else str(self.config.default(name)),
                        read_only=False,
                        is_default=override is None,
                        config_source=CONFIG_SOURCE_GROUP if override is not None else CONFIG_SOURCE_DEFAULT,
                        is_sensitive=False,
                        synonyms=[],
                        config_type=3,  # INT
                        documentation=None,
                    )
                )
            results.append(Result(error_code=0, error_message=None, resource_type=GROUP_RESOURCE, resource_name=resource.resource_name, configs=entries))
        return Response(results=results)

    def incremental_alter_configs(self, request, now_ms: int):
        Response = m.IncrementalAlterConfigsResponse
        Result = Response.AlterConfigsResourceResponse
        results = []
        for resource in request.resources:
            def result(code=0, message=None):
                return Result(error_code=code, error_message=message, resource_type=resource.resource_type, resource_name=resource.resource_name)

            if resource.resource_type != GROUP_RESOURCE:
                results.append(result(Errors.InvalidRequestError.errno, "The pystreams coordinator serves GROUP (16) config resources only."))
                continue
            if not resource.resource_name:
                results.append(result(Errors.InvalidRequestError.errno, "The group id (resource name) must be non-empty."))
                continue
            configs = dict(self.group_configs.get(resource.resource_name, {}))
            try:
                for entry in resource.configs:
                    if entry.config_operation == OP_SET:
                        validate_group_config(self.config, entry.name, entry.value)
                        configs[entry.name] = str(int(entry.value))
                    elif entry.config_operation == OP_DELETE:
                        if entry.name not in GROUP_CONFIG_NAMES:
                            raise ValueError(f"unknown group config {entry.name!r}")
                        configs.pop(entry.name, None)
                    else:
                        raise ValueError(f"operation {entry.config_operation} is not supported for {entry.name}: group configs are not lists")
                session = int(configs.get(SESSION_TIMEOUT, self.config.session_timeout_ms))
                interval = int(configs.get(HEARTBEAT_INTERVAL, self.config.heartbeat_interval_ms))
                if interval >= session:
                    raise ValueError(f"{HEARTBEAT_INTERVAL}={interval} must be smaller than {SESSION_TIMEOUT}={session}")
            except ValueError as exc:
                results.append(result(Errors.InvalidConfigurationError.errno, str(exc)))
                continue
            if not request.validate_only and configs != self.group_configs.get(resource.resource_name, {}):
                self.emit(r.Record(r.GroupConfigKey(resource.resource_name), r.GroupConfigValue(configs) if configs else None))
            results.append(result())
        return Response(responses=results)

