"""KIP-848 consumer groups: ConsumerGroupHeartbeat, Prepare/InstallAssignment and Describe.

The manager validates, then *generates* records through its :class:`ShardContext`; ``emit``
replays each record on the spot, so the state a handler reads after emitting is exactly what a
shard replaying the log would have. Timers (session, revocation, client-side computation) and
the computation in flight are runtime state, re-armed on load.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace
from typing import Protocol
from uuid import UUID

import kafka.errors as Errors
import msgspec

from pystreams.assignors.api import (
    AssignmentSpec,
    AssignorMetadata,
    MemberSpec,
    PartitionAssignorError,
    ServerAssignor,
    TopicMetadata,
)
from pystreams.coordinator import records as r
from pystreams.coordinator.classic_group import ClassicGroup, ClassicGroupState
from pystreams.coordinator.config import HEARTBEAT_INTERVAL, SESSION_TIMEOUT
from pystreams.coordinator.consumer_group import CLASSIC_METADATA_VERSION, CONSUMER, ConsumerGroup, ConsumerMember, GroupState
from pystreams.coordinator.context import ShardContext
from pystreams.coordinator.errors import RequestError
from pystreams.coordinator.reconciliation import MemberAssignmentState, reconcile
from pystreams.coordinator.subscriptions import InvalidRegex, subscribed_names, subscribed_topic_ids, validate_regex
from pystreams.coordinator.timers import (
    ClassicMemberJoinTimer,
    ClassicMemberSyncTimer,
    ComputationTimer,
    EmptyGroupTimer,
    RevocationTimer,
    SessionTimer,
)
from pystreams.partitions import NO_PARTITIONS, PartitionSet
from pystreams.protocol import messages as m
from pystreams.protocol.errors import InvalidAssignmentError
from pystreams.protocol.sentinels import LEAVE_EPOCH, LEAVE_STATIC_EPOCH

#: ConsumerGroupDescribe v1's MemberType.
CLASSIC_MEMBER_TYPE, CONSUMER_MEMBER_TYPE = 0, 1

HeartbeatRequest = m.ConsumerGroupHeartbeatRequest
HeartbeatResponse = m.ConsumerGroupHeartbeatResponse

log = logging.getLogger(__name__)


class Migration(Protocol):
    """The conversions between group types (``migration.py``), as this manager calls them."""

    def upgrade(self, group, request, now_ms: int) -> ConsumerGroup | None:
        """A KIP-848 member joins the non-consumer group ``group``: the consumer group it became
        (None if it was empty and is gone), or RequestError if it may not convert."""
        ...

    def maybe_downgrade(self, group: ConsumerGroup, leaving: ConsumerMember, now_ms: int) -> bool:
        """``leaving`` (the last KIP-848 member) is fenced or leaves: True if the group became a
        classic group (and ``leaving`` went with the conversion)."""
        ...


@dataclass(frozen=True)
class ClientComputation:
    """The one client-side assignment computation a group may have in flight (not persisted)."""

    member_id: str
    assignor: str
    notified: bool = False
    prepared_epoch: int | None = None
    prepared_members: dict[str, frozenset[UUID]] = field(default_factory=dict)
    prepared_topics: dict[UUID, TopicMetadata] = field(default_factory=dict)
    tried: frozenset[str] = frozenset()


def validate_first_heartbeat(request: HeartbeatRequest) -> None:
    """The rules for a member's first heartbeat (epoch 0, a member the group does not know).

    A known member may legitimately heartbeat with epoch 0 while it waits for its first
    assignment (a client-side computation in flight); that is not a first heartbeat.
    """
    invalid = Errors.InvalidRequestError
    if request.rebalance_timeout_ms <= 0:
        raise RequestError(invalid, "RebalanceTimeoutMs must be larger than zero in the first heartbeat request.")
    if request.subscribed_topic_names is None and request.subscribed_topic_regex is None:
        raise RequestError(invalid, "SubscribedTopicNames or SubscribedTopicRegex must be set in the first heartbeat request.")


def validate_heartbeat(request: HeartbeatRequest, server_assignors: tuple[str, ...], max_metadata_bytes: int) -> None:
    """KIP-848 "Request Validation" of ConsumerGroupHeartbeat (first-heartbeat rules aside)."""
    invalid = Errors.InvalidRequestError
    epoch = request.member_epoch
    if not request.group_id:
        raise RequestError(invalid, "GroupId must be non-empty.")
    if epoch < LEAVE_STATIC_EPOCH:
        raise RequestError(invalid, f"MemberEpoch must be >= -1 (or -2 for a static member's temporary leave), got {epoch}.")
    if epoch != 0 and not request.member_id:
        raise RequestError(invalid, "MemberId must be non-empty.")
    if request.instance_id is not None and not request.instance_id:
        raise RequestError(invalid, "InstanceId, if provided, must be non-empty.")
    if epoch == LEAVE_STATIC_EPOCH and request.instance_id is None:
        raise RequestError(invalid, "MemberEpoch -2 (temporary leave) requires the member's InstanceId.")
    if request.subscribed_topic_regex is not None:
        try:
            validate_regex(request.subscribed_topic_regex)
        except InvalidRegex as exc:
            raise RequestError(invalid, str(exc)) from None
    if request.server_assignor is not None and request.client_assignors is not None:
        raise RequestError(invalid, "ServerAssignor and ClientAssignors cannot be used together.")
    for assignor in request.client_assignors or ():
        if not assignor.name:
            raise RequestError(invalid, "Assignor.Name must be non-empty.")
        if assignor.minimum_version < -1:
            raise RequestError(invalid, f"Assignor {assignor.name}: MinimumVersion must be >= -1.")
        if assignor.maximum_version < 0 or assignor.maximum_version < assignor.minimum_version:
            raise RequestError(invalid, f"Assignor {assignor.name}: MaximumVersion must be >= 0 and >= MinimumVersion.")
        if not assignor.minimum_version <= assignor.metadata_version <= assignor.maximum_version:
            raise RequestError(invalid, f"Assignor {assignor.name}: MetadataVersion must lie within [MinimumVersion, MaximumVersion].")
        if len(assignor.metadata_bytes) > max_metadata_bytes:
            raise RequestError(
                invalid,
                f"Assignor {assignor.name}: MetadataBytes is {len(assignor.metadata_bytes)} bytes; this coordinator accepts at most {max_metadata_bytes}.",
            )
    if request.server_assignor is not None and request.server_assignor not in server_assignors:
        raise RequestError(
            Errors.UnsupportedAssignorError,
            f"ServerAssignor {request.server_assignor!r} is not supported; this coordinator offers {', '.join(server_assignors)}.",
        )


class ConsumerGroupManager:
    """The consumer group type: its requests, timers and fail-over duties."""

    def __init__(self, ctx: ShardContext, assignors: dict[str, ServerAssignor]) -> None:
        self.ctx = ctx
        self.assignors = assignors
        #: group id -> the client-side computation in flight (runtime state, not records).
        self.computations: dict[str, ClientComputation] = {}
        #: Online migration to and from classic groups; set by the shard that composes both types.
        self.migration: Migration | None = None

    @property
    def config(self):
        return self.ctx.config

    def session_timeout_ms(self, group_id: str) -> int:
        return self.ctx.group_config(group_id, SESSION_TIMEOUT)

    def heartbeat_interval_ms(self, group_id: str) -> int:
        return self.ctx.group_config(group_id, HEARTBEAT_INTERVAL)

    def interval_for(self, group: ConsumerGroup, member: ConsumerMember, should_compute: bool) -> int:
        """The heartbeat interval to answer ``member`` with: short while it has work in a
        rebalance — the group's target is being computed (it will have a new target), it must
        compute one, or it has not reached its own (partitions to revoke, to receive, an epoch
        to move to) — so each step of a rebalance costs a round trip instead of an interval;
        the group's interval once it is stable, which keeps the steady-state load unchanged."""
        interval = self.heartbeat_interval_ms(group.group_id)
        if should_compute or group.group_epoch > group.assignment_epoch or not group.is_reconciled(member):
            return min(interval, self.config.rebalance_heartbeat_interval_ms)
        return interval

    def _set_computation(self, group_id: str, computation: ClientComputation | None) -> None:
        previous = self.computations.get(group_id)
        if computation is None:
            self.computations.pop(group_id, None)
        else:
            self.computations[group_id] = computation

        def restore() -> None:
            if previous is None:
                self.computations.pop(group_id, None)
            else:
                self.computations[group_id] = previous

        self.ctx.on_undo(restore)

    def session_timeout_of(self, group_id: str, member: ConsumerMember) -> int:
        """A classic member keeps the session timeout of its JoinGroup."""
        return member.classic.session_timeout_ms if member.classic is not None else self.session_timeout_ms(group_id)

    def _consumer_group(self, request, now_ms: int) -> ConsumerGroup | None:
        """The request's group if it is a consumer group. A classic group is upgraded by a
        joining member (KIP-848 "Supporting Online Consumer Group Upgrade"); to anything else
        it is GROUP_ID_NOT_FOUND, as in Kafka."""
        group = self.ctx.groups.get(request.group_id)
        if group is None or group.group_type == CONSUMER:
            return group
        if request.member_epoch != 0 or self.migration is None:
            raise RequestError(Errors.GroupIdNotFoundError, f"Group {request.group_id} is not a consumer group.")
        return self.migration.upgrade(group, request, now_ms)

    def create_group(self, group_id: str, now_ms: int) -> ConsumerGroup:
        """A new, EMPTY consumer group; it exists because a record says so."""
        if len(self.ctx.groups) >= self.config.max_groups:
            raise RequestError(Errors.PolicyViolationError, f"This coordinator shard already holds its maximum of {self.config.max_groups} groups.")
        self.ctx.emit(r.GroupMetadata(group_id, r.GroupMetadataValue(0)))
        self.ctx.schedule(EmptyGroupTimer(group_id), now_ms + self.config.empty_group_retention_ms)
        return self.ctx.groups[group_id]

    # --- ConsumerGroupHeartbeat -------------------------------------------------------------

    def consumer_group_heartbeat(self, request: HeartbeatRequest, now_ms: int) -> HeartbeatResponse:
        before_upgrade = self.ctx.savepoint()
        try:
            validate_heartbeat(request, self.config.assignors, self.config.max_assignor_metadata_bytes)
            before = self.ctx.groups.get(request.group_id)
            group = self._consumer_group(request, now_ms)
            # Converted from a classic group at rest (Stable) or in a rebalance.
            converted = before.state is ClassicGroupState.STABLE if isinstance(before, ClassicGroup) and group is not None else None
            if request.member_epoch in (LEAVE_EPOCH, LEAVE_STATIC_EPOCH):
                return self._leave(group, request, now_ms)
            if request.member_epoch == 0:
                group, member, is_new = self._join(group, request, now_ms)
            else:
                group, member = self._existing_member(group, request, now_ms)
                is_new = False
            return self._update_and_reconcile(group, member, request, is_new, now_ms, converted=converted)
        except RequestError as exc:
            if request.member_epoch == 0:
                # A refused join leaves no trace, an upgrade it started included (a fenced
                # member's removal, the other path here, must stand).
                self.ctx.rollback(before_upgrade)
            return HeartbeatResponse(error_code=exc.code, error_message=exc.message, member_epoch=-1, heartbeat_interval_ms=0)

    def _join(self, group: ConsumerGroup | None, request, now_ms: int) -> tuple[ConsumerGroup, ConsumerMember, bool]:
        if group is None or request.member_id not in group.members:
            validate_first_heartbeat(request)
        if group is None:
            if self.config.max_group_size < 1:
                raise RequestError(Errors.GroupMaxSizeReachedError, "The coordinator's group.consumer.max.size is 0.")
            group = self.create_group(request.group_id, now_ms)
        if request.instance_id is not None:
            holder_id = group.static_members.get(request.instance_id)
            if holder_id is not None:
                holder = group.members[holder_id]
                # A classic holder is the same instance switching protocols: it cannot leave
                # through the new protocol first (KAFKA-17228).
                if holder.member_epoch == LEAVE_STATIC_EPOCH or holder.classic is not None:
                    return group, self.replace_static_member(group, holder, request.member_id or self.ctx.new_member_id()), False
                if holder_id != request.member_id:
                    raise RequestError(
                        Errors.UnreleasedInstanceIdError,
                        f"Instance id {request.instance_id} is still used by member {holder_id}; it must leave first.",
                    )
        member_id = request.member_id or self.ctx.new_member_id()
        member = group.members.get(member_id)
        if member is not None:
            # A rejoin with epoch 0: the member gave up everything, so it holds nothing and has
            # nothing left to revoke (else it would be timed out on a revocation it cannot see).
            if member.assigned or member.revoking:
                self.ctx.cancel(RevocationTimer(group.group_id, member_id))
                released = msgspec.structs.replace(member.assignment_value(), assigned=[], revoking=[])
                self.ctx.emit(r.CurrentAssignment(group.group_id, member_id, released))
                member = group.members[member_id]
            return group, member, False
        if len(group.members) >= self.config.max_group_size:
            raise RequestError(
                Errors.GroupMaxSizeReachedError,
                f"Group {group.group_id} already has the maximum of {self.config.max_group_size} members.",
            )
        return group, ConsumerMember(member_id=member_id), True

    def replace_static_member(self, group: ConsumerGroup, old: ConsumerMember, new_id: str) -> ConsumerMember:
        """A static member is back: its new incarnation takes the old one's assignment, no bump."""
        new = replace(old, member_id=new_id)
        target = group.targets.get(old.member_id)
        assignment = old.assignment_value()
        self.cancel_member_timers(group.group_id, old.member_id)
        self._emit_member_tombstones(group, old.member_id)
        self.ctx.emit(r.MemberMetadata(group.group_id, new_id, new.metadata_value(group.group_epoch)))
        if target is not None:
            self.ctx.emit(r.TargetAssignmentMember(group.group_id, new_id, target.value()))
        # The epoch it held (before leaving, if it left); it reconciles from there like any other.
        epoch = assignment.previous_member_epoch if assignment.member_epoch == LEAVE_STATIC_EPOCH else assignment.member_epoch
        restored = r.CurrentAssignmentValue(
            member_epoch=epoch,
            previous_member_epoch=assignment.previous_member_epoch,
            assigned=assignment.assigned,
            error=assignment.error,
            metadata_version=assignment.metadata_version,
            metadata=assignment.metadata,
        )
        self.ctx.emit(r.CurrentAssignment(group.group_id, new_id, restored))
        return group.members[new_id]

    def _existing_member(self, group: ConsumerGroup | None, request, now_ms: int) -> tuple[ConsumerGroup, ConsumerMember]:
        member = group.members.get(request.member_id) if group is not None else None
        if member is None:
            raise RequestError(Errors.UnknownMemberIdError, f"Member {request.member_id} is not a member of group {request.group_id}.")
        assert group is not None, "the member was found in it"
        if request.member_epoch == member.member_epoch:
            return group, member
        owned = PartitionSet.from_wire(request.topic_partitions) if request.topic_partitions is not None else None
        if request.member_epoch < member.member_epoch and owned is not None and owned <= member.assigned:
            # Responses that moved the member on were lost. It holds nothing the coordinator did
            # not give it, so resending its state is safe (the KIP's edge case; Kafka accepts only
            # the previous epoch, which fences a live member after two lost responses).
            return group, member
        expected = member.member_epoch
        self.remove_member(group, member, now_ms)
        raise RequestError(
            Errors.FencedMemberEpochError,
            f"Member {request.member_id} sent epoch {request.member_epoch} but its epoch is {expected}; "
            "it was removed from the group and must rejoin with epoch 0.",
        )

    def _leave(self, group: ConsumerGroup | None, request, now_ms: int) -> HeartbeatResponse:
        member = group.members.get(request.member_id) if group is not None else None
        if member is None:
            raise RequestError(Errors.UnknownMemberIdError, f"Member {request.member_id} is not a member of group {request.group_id}.")
        assert group is not None, "the member was found in it"
        if request.member_epoch == LEAVE_STATIC_EPOCH and request.instance_id != member.instance_id:
            raise RequestError(
                Errors.UnknownMemberIdError,
                f"Member {member.member_id} is not the static member with instance id {request.instance_id}.",
            )
        if request.member_epoch == LEAVE_STATIC_EPOCH and member.member_epoch == LEAVE_STATIC_EPOCH:
            # Already away (a duplicated leave): rewriting would lose the epoch it left at.
            return HeartbeatResponse(member_id=member.member_id, member_epoch=LEAVE_STATIC_EPOCH, heartbeat_interval_ms=0)
        if request.member_epoch == LEAVE_EPOCH or member.instance_id is None:
            self.remove_member(group, member, now_ms)
            return HeartbeatResponse(member_id=member.member_id, member_epoch=LEAVE_EPOCH, heartbeat_interval_ms=0)
        # Temporary leave of a static member: keep its assignment for the session timeout; what it
        # was still revoking is released, since it stopped processing everything.
        away = r.CurrentAssignmentValue(
            member_epoch=LEAVE_STATIC_EPOCH,
            previous_member_epoch=member.member_epoch,
            assigned=member.assigned.to_wire(r.TopicPartitions),
            error=member.error,
            metadata_version=member.metadata_version,
            metadata=member.metadata,
        )
        self.ctx.emit(r.CurrentAssignment(group.group_id, member.member_id, away))
        self.ctx.cancel(RevocationTimer(group.group_id, member.member_id))
        self.ctx.schedule(SessionTimer(group.group_id, member.member_id), now_ms + self.session_timeout_ms(group.group_id))
        self._maybe_restart_computation(group, member.member_id, now_ms)
        return HeartbeatResponse(member_id=member.member_id, member_epoch=LEAVE_STATIC_EPOCH, heartbeat_interval_ms=0)

    def _update_and_reconcile(
        self, group: ConsumerGroup, member: ConsumerMember, request, is_new: bool, now_ms: int, *, converted: bool | None = None
    ) -> HeartbeatResponse:
        """``converted``: this heartbeat converted a classic group (True: one that was Stable)."""
        updated, bump = _apply_request_fields(member, request, self.ctx.request)
        self._check_classic_members_readable(group, updated)
        self._check_assignor_versions(group, updated)
        bump = bump or is_new
        if is_new or updated != member:
            self.ctx.emit(r.MemberMetadata(group.group_id, updated.member_id, updated.metadata_value(group.group_epoch)))
            member = group.members[updated.member_id]
        if bump:
            self.refresh_subscription_metadata(group)
            self.bump_group_epoch(group)
        elif converted is not None:
            # A conversion writes no subscription metadata: the joiner's heartbeat does, as
            # Kafka's. Kafka then always bumps (the metadata changed from none); the KIP's case
            # study keeps a Stable group's assignment at the generation, and so do we when it is
            # complete. One carried over from a rebalance under way, or leaving partitions to
            # nobody, is stale: bump, so that a new target covers every member and partition
            # (else a group converted by a static member's replacement kept it for good).
            self.refresh_subscription_metadata(group)
            if not converted or not self._target_covers_subscriptions(group):
                self.bump_group_epoch(group)
        self.ctx.cancel(EmptyGroupTimer(group.group_id))
        self.maybe_compute_target(group, now_ms, requester=member.member_id)

        owned = PartitionSet.from_wire(request.topic_partitions) if request.topic_partitions is not None else None
        if request.member_epoch == 0:
            owned = owned or NO_PARTITIONS
        changed = self.reconcile_member(group, member, owned, now_ms)
        self.ctx.schedule(SessionTimer(group.group_id, member.member_id), now_ms + self.session_timeout_ms(group.group_id))

        computation = self.computations.get(group.group_id)
        should_compute = computation is not None and computation.member_id == member.member_id and computation.prepared_epoch is None
        if should_compute and computation is not None and not computation.notified:
            self._set_computation(group.group_id, replace(computation, notified=True))
            # The member has its rebalance timeout to deliver, counted from this notification.
            self.ctx.schedule(ComputationTimer(group.group_id), now_ms + member.rebalance_timeout_ms)

        include_assignment = request.member_epoch == 0 or changed or (owned is not None and owned != member.assigned) or not group.is_reconciled(member)
        return HeartbeatResponse(
            member_id=member.member_id,
            member_epoch=member.member_epoch,
            heartbeat_interval_ms=self.interval_for(group, member, should_compute),
            should_compute_assignment=should_compute,
            assignment=self._assignment_for(group, member) if include_assignment else None,
        )

    def _assignment_for(self, group: ConsumerGroup, member: ConsumerMember):
        pending = group.target_of(member.member_id) - member.assigned if not member.revoking else NO_PARTITIONS
        return HeartbeatResponse.Assignment(
            error=member.error,
            assigned_topic_partitions=member.assigned.to_wire(HeartbeatResponse.Assignment.TopicPartitions),
            pending_topic_partitions=pending.to_wire(HeartbeatResponse.Assignment.TopicPartitions),
            metadata_version=member.metadata_version,
            metadata_bytes=member.metadata,
        )

    def _check_classic_members_readable(self, group: ConsumerGroup, member: ConsumerMember) -> None:
        """KIP-848 "Kafka Streams Migration": while classic members remain, a KIP-848 member with
        client-side assignors must run one the classic members run too, at a version range that
        includes -1 (their subscription userData), or it could compute nothing for them."""
        classic = [other for other in group.classic_members() if other.member_id != member.member_id]
        if member.classic is not None or not member.assignors or not classic:
            return
        shared = set.intersection(*(set(other.classic_protocol_names()) for other in classic))
        usable = [a for a in member.assignors if a.name in shared and a.minimum_version <= CLASSIC_METADATA_VERSION <= a.maximum_version]
        if not usable:
            offered = ", ".join(f"{a.name}[{a.minimum_version}, {a.maximum_version}]" for a in member.assignors)
            raise RequestError(
                Errors.InvalidRequestError,
                f"Group {group.group_id} still has {len(classic)} classic member(s) running {', '.join(sorted(shared)) or 'no common assignor'}; "
                f"a joining member must run one of those assignors with a version range that includes {CLASSIC_METADATA_VERSION} "
                f"(classic members' metadata), but it runs {offered}.",
            )

    def _check_assignor_versions(self, group: ConsumerGroup, member: ConsumerMember) -> None:
        """UNSUPPORTED_ASSIGNOR when a client assignor's version range overlaps no one else's
        (classic members are checked by ``_check_classic_members_readable``)."""
        for assignor in member.assignors:
            for other in group.members.values():
                if other.member_id == member.member_id or other.classic is not None or member.classic is not None:
                    continue
                theirs = other.assignor(assignor.name)
                if theirs is not None and (assignor.maximum_version < theirs.minimum_version or theirs.maximum_version < assignor.minimum_version):
                    raise RequestError(
                        Errors.UnsupportedAssignorError,
                        f"Assignor {assignor.name} versions [{assignor.minimum_version}, {assignor.maximum_version}] do not overlap "
                        f"member {other.member_id}'s [{theirs.minimum_version}, {theirs.maximum_version}].",
                    )

    def reconcile_member(self, group: ConsumerGroup, member: ConsumerMember, owned, now_ms: int) -> bool:
        """Moves the member toward its target; emits its new current assignment. True if it changed."""
        if member.member_epoch == LEAVE_STATIC_EPOCH:
            return False
        current = MemberAssignmentState(member.member_epoch, member.previous_member_epoch, member.assigned, member.revoking)
        target = group.target_of(member.member_id)
        nxt = reconcile(current, group.assignment_epoch, target, owned, lambda t, p: group.is_free_for(member.member_id, t, p))
        if nxt is current:
            return False
        meta = group.targets.get(member.member_id)
        at_target = nxt.member_epoch == group.assignment_epoch
        value = r.CurrentAssignmentValue(
            member_epoch=nxt.member_epoch,
            previous_member_epoch=nxt.previous_member_epoch,
            assigned=nxt.assigned.to_wire(r.TopicPartitions),
            revoking=nxt.revoking.to_wire(r.TopicPartitions),
            error=group.assignment_error if at_target else member.error,
            metadata_version=(meta.metadata_version if meta else 0) if at_target else member.metadata_version,
            metadata=(meta.metadata if meta else b"") if at_target else member.metadata,
        )
        if value == member.assignment_value():
            return False
        self.ctx.emit(r.CurrentAssignment(group.group_id, member.member_id, value))
        key = RevocationTimer(group.group_id, member.member_id)
        if member.classic is not None:
            pass  # a classic member revokes by rejoining; its join timer bounds that (Kafka's)
        elif nxt.revoking and not current.revoking:
            self.ctx.schedule(key, now_ms + member.rebalance_timeout_ms)
        elif not nxt.revoking:
            self.ctx.cancel(key)
        return True

    # --- membership changes ------------------------------------------------------------------

    def bump_group_epoch(self, group: ConsumerGroup) -> None:
        self.ctx.emit(r.GroupMetadata(group.group_id, r.GroupMetadataValue(group.group_epoch + 1)))

    def _emit_member_tombstones(self, group: ConsumerGroup, member_id: str) -> None:
        self.ctx.emit(r.CurrentAssignment(group.group_id, member_id, None))
        if member_id in group.targets:
            self.ctx.emit(r.TargetAssignmentMember(group.group_id, member_id, None))
        self.ctx.emit(r.MemberMetadata(group.group_id, member_id, None))

    def cancel_member_timers(self, group_id: str, member_id: str) -> None:
        for timer in (SessionTimer, RevocationTimer, ClassicMemberJoinTimer, ClassicMemberSyncTimer):
            self.ctx.cancel(timer(group_id, member_id))

    def remove_member(self, group: ConsumerGroup, member: ConsumerMember, now_ms: int) -> None:
        """Fenced, expired or left: tombstones, a new group epoch, a new target — or, if it was
        the last KIP-848 member among classic ones, the group converts back to classic."""
        if self.migration is not None and self.migration.maybe_downgrade(group, member, now_ms):
            return
        self.remove_members(group, [member], now_ms)

    def remove_members(self, group: ConsumerGroup, members: list[ConsumerMember], now_ms: int) -> None:
        """Members removed together (a batch LeaveGroup): their tombstones, then one new epoch."""
        for member in members:
            self.cancel_member_timers(group.group_id, member.member_id)
            self._emit_member_tombstones(group, member.member_id)
        self.refresh_subscription_metadata(group)
        self.bump_group_epoch(group)
        for member in members:
            self._maybe_restart_computation(group, member.member_id, now_ms)
        self.maybe_compute_target(group, now_ms)
        if not group.members:
            self.ctx.schedule(EmptyGroupTimer(group.group_id), now_ms + self.config.empty_group_retention_ms)

    @staticmethod
    def _target_covers_subscriptions(group: ConsumerGroup) -> bool:
        targeted = {pair for target in group.targets.values() for pair in target.partitions}
        return all((topic.topic_id, partition) in targeted for topic in group.subscribed_topics.values() for partition in range(topic.num_partitions))

    def refresh_subscription_metadata(self, group: ConsumerGroup) -> bool:
        """Re-resolve the group's subscribed topics against the topic image; True if changed."""
        names: set[str] = set()
        for member in group.members.values():
            names |= subscribed_names(member.subscribed_topic_names, member.subscribed_topic_regex, self.ctx.topics)
        current = {name: r.TopicMetadataValue(self.ctx.topics[name].topic_id, name, self.ctx.topics[name].num_partitions) for name in names}
        if current == group.subscribed_topics:
            return False
        self.ctx.emit(r.PartitionMetadata(group.group_id, r.PartitionMetadataValue([current[n] for n in sorted(current)])))
        return True

    def on_topics_changed(self, group: ConsumerGroup, now_ms: int) -> None:
        if self.refresh_subscription_metadata(group):
            self.bump_group_epoch(group)
            self.maybe_compute_target(group, now_ms)

    # --- target assignment -------------------------------------------------------------------

    def member_topic_ids(self, group: ConsumerGroup, member: ConsumerMember) -> frozenset[UUID]:
        return subscribed_topic_ids(member.subscribed_topic_names, member.subscribed_topic_regex, group.subscribed_topics)

    def select_assignor(self, group: ConsumerGroup) -> tuple[bool, str]:
        """(is_client_side, name): a client assignor all members support, by their precedence,
        that a KIP-848 member can run (a classic member's protocols count as its assignors);
        else the most common server assignor; else the coordinator's default."""
        members = list(group.members.values())
        if members and all(m.assignors for m in members):
            common = set.intersection(*({a.name for a in m.assignors} for m in members))
            common = {name for name in common if any(m.classic is None and m.assignor(name) for m in members)}
            if common:
                rank: Counter[str] = Counter()
                for m in members:
                    for position, assignor in enumerate(m.assignors):
                        if assignor.name in common:
                            rank[assignor.name] += position
                return True, min(common, key=lambda name: (rank[name], name))
        chosen = Counter(m.server_assignor for m in members if m.server_assignor)
        if chosen:
            order = {name: i for i, name in enumerate(self.config.assignors)}
            return False, max(chosen, key=lambda name: (chosen[name], -order.get(name, len(order))))
        return False, self.config.assignors[0]

    def assignment_spec(self, group: ConsumerGroup, assignor: str | None = None) -> AssignmentSpec:
        members = {}
        resolved: dict[tuple, frozenset[UUID]] = {}  # members mostly share one subscription
        for member in group.members.values():
            subscription = (member.subscribed_topic_names, member.subscribed_topic_regex)
            topic_ids = resolved.get(subscription)
            if topic_ids is None:
                topic_ids = resolved[subscription] = self.member_topic_ids(group, member)
            metadata = None
            if assignor is not None:
                a = member.assignor(assignor)
                if a is not None:
                    metadata = AssignorMetadata(a.reason, a.version, a.metadata, a.minimum_version, a.maximum_version)
            members[member.member_id] = MemberSpec(
                subscribed_topic_ids=topic_ids,
                target_partitions=group.target_of(member.member_id).by_topic,
                instance_id=member.instance_id,
                rack_id=member.rack_id,
                metadata=metadata,
            )
        topics = {t.topic_id: TopicMetadata(t.topic_id, t.name, t.num_partitions) for t in group.subscribed_topics.values()}
        return AssignmentSpec(members=members, topics=topics)

    def maybe_compute_target(self, group: ConsumerGroup, now_ms: int, *, requester: str | None = None) -> None:
        """``requester``: the member whose heartbeat is being answered, if one is. A client-side
        computation goes to it when it may run it (see :meth:`choose_computing_member`)."""
        if group.group_epoch <= group.assignment_epoch:
            return
        if not group.members:
            self.ctx.emit(r.TargetAssignmentMetadata(group.group_id, r.TargetAssignmentMetadataValue(group.group_epoch)))
            self.end_computation(group.group_id)
            return
        client_side, name = self.select_assignor(group)
        if client_side:
            self._start_computation(group, name, now_ms, requester)
            return
        self.end_computation(group.group_id)
        try:
            result = self.assignors[name].assign(self.assignment_spec(group))
        except PartitionAssignorError:
            # Keep the current target; a later change of the group retries.
            self.ctx.emit(r.TargetAssignmentMetadata(group.group_id, r.TargetAssignmentMetadataValue(group.group_epoch, group.assignment_error)))
            return
        self.install_target(group, {mid: (a.partitions, a.metadata_version, a.metadata) for mid, a in result.members.items()}, group.group_epoch, 0)

    def install_target(self, group: ConsumerGroup, assignment: dict, epoch: int, error: int) -> None:
        """Writes the new target as one batch of deltas followed by its metadata record."""
        for member_id in group.members:
            partitions, version, metadata = assignment.get(member_id, (NO_PARTITIONS, 0, b""))
            old = group.targets.get(member_id)
            if old is not None and partitions is old.partitions.by_topic and old.metadata_version == version and old.metadata == metadata:
                continue  # the assignor handed the target back untouched
            partitions = PartitionSet.of(partitions)
            if not partitions and not version and not metadata:
                if old is not None:  # an empty target is no target
                    self.ctx.emit(r.TargetAssignmentMember(group.group_id, member_id, None))
                continue
            if old is not None and old.partitions == partitions and old.metadata_version == version and old.metadata == metadata:
                continue
            self.ctx.emit(
                r.TargetAssignmentMember(group.group_id, member_id, r.TargetAssignmentMemberValue(partitions.to_wire(r.TopicPartitions), version, metadata))
            )
        self.ctx.emit(r.TargetAssignmentMetadata(group.group_id, r.TargetAssignmentMetadataValue(epoch, error)))

    # --- client-side assignment ----------------------------------------------------------------

    def choose_computing_member(self, group: ConsumerGroup, assignor: str, exclude: AbstractSet[str], *, requester: str | None = None) -> str | None:
        """The member whose version range covers every version the group's metadata uses
        (KIP-848 "Member Selection": A[1-5], B[3-4], C[2-4] -> A). Among those that qualify, the
        ``requester`` comes first: it is heartbeating now, so it is told in this very response,
        where any other member would hear of the computation only at its next heartbeat (up to
        an interval later, then its revocations wait for that)."""
        present = [m for m in group.members.values() if m.member_epoch != LEAVE_STATIC_EPOCH and m.classic is None and m.assignor(assignor)]
        if not present:
            return None
        ranges = [a for m in present if (a := m.assignor(assignor)) is not None]
        lowest, highest = min(a.minimum_version for a in ranges), max(a.maximum_version for a in ranges)
        used = {a.version for a in ranges}

        def preference(m: ConsumerMember):
            a = m.assignor(assignor)
            assert a is not None, "present members all run the assignor"
            covers_ranges = a.minimum_version <= lowest and a.maximum_version >= highest
            covers_used = all(a.minimum_version <= v <= a.maximum_version for v in used)
            return (m.member_id in exclude, not covers_ranges, not covers_used, m.member_id != requester, -(a.maximum_version - a.minimum_version), m.member_id)

        return min(present, key=preference).member_id

    def _start_computation(self, group: ConsumerGroup, assignor: str, now_ms: int, requester: str | None) -> None:
        computation = self.computations.get(group.group_id)
        if computation is not None and computation.assignor == assignor and computation.member_id in group.members:
            return  # one computation in flight; it is recomputed after its install
        chosen = self.choose_computing_member(group, assignor, set(), requester=requester)
        self.end_computation(group.group_id)
        if chosen is not None:
            self._set_computation(group.group_id, ClientComputation(member_id=chosen, assignor=assignor, tried=frozenset({chosen})))

    def end_computation(self, group_id: str) -> None:
        if group_id in self.computations:
            self._set_computation(group_id, None)
        self.ctx.cancel(ComputationTimer(group_id))

    def _maybe_restart_computation(self, group: ConsumerGroup, departed_member_id: str, now_ms: int) -> None:
        computation = self.computations.get(group.group_id)
        if computation is not None and computation.member_id == departed_member_id:
            self.reassign_computation(group, now_ms)

    def reassign_computation(self, group: ConsumerGroup, now_ms: int) -> None:
        """The chosen member did not deliver in time (or left): pick another one."""
        computation = self.computations.get(group.group_id)
        if computation is None:
            return
        self.ctx.cancel(ComputationTimer(group.group_id))
        chosen = self.choose_computing_member(group, computation.assignor, computation.tried)
        if chosen is None:
            self._set_computation(group.group_id, None)
            return
        tried = computation.tried | {chosen}
        if tried >= set(group.members):
            tried = frozenset({chosen})  # everyone had a turn: start the round again
        self._set_computation(group.group_id, ClientComputation(member_id=chosen, assignor=computation.assignor, tried=tried))

    def _computing_member(self, group_id: str, member_id: str, member_epoch: int) -> tuple[ConsumerGroup, ConsumerMember, ClientComputation]:
        """The checks Prepare and Install share (KIP-848 "Request Handling" steps 1-4)."""
        invalid = Errors.InvalidRequestError
        if not group_id:
            raise RequestError(invalid, "GroupId must be non-empty.")
        if not member_id:
            raise RequestError(invalid, "MemberId must be non-empty.")
        if member_epoch < 0:
            raise RequestError(invalid, f"MemberEpoch must be >= 0, got {member_epoch}.")
        group = self.ctx.groups.get(group_id)
        if group is None or group.group_type != "consumer":
            raise RequestError(Errors.GroupIdNotFoundError, f"Consumer group {group_id} does not exist.")
        member = group.members.get(member_id)
        if member is None:
            raise RequestError(Errors.UnknownMemberIdError, f"Member {member_id} is not a member of group {group_id}.")
        if member_epoch != member.member_epoch:
            raise RequestError(Errors.StaleMemberEpochError, f"Member epoch {member_epoch} is stale; the member's epoch is {member.member_epoch}.")
        computation = self.computations.get(group_id)
        if computation is None or computation.member_id != member_id:
            raise RequestError(Errors.UnknownMemberIdError, f"Member {member_id} was not chosen to compute the assignment of group {group_id}.")
        return group, member, computation

    def consumer_group_prepare_assignment(self, request, now_ms: int):
        Response = m.ConsumerGroupPrepareAssignmentResponse
        try:
            group, _, computation = self._computing_member(request.group_id, request.member_id, request.member_epoch)
        except RequestError as exc:
            return Response(error_code=exc.code, error_message=exc.message, group_epoch=-1, assignor_name="", members=[], topics=[])
        if not computation.notified:
            # It prepared before any heartbeat told it to: its rebalance timeout starts now,
            # or a member that never installs would leave the group ASSIGNING for ever.
            self.ctx.schedule(ComputationTimer(group.group_id), now_ms + group.members[request.member_id].rebalance_timeout_ms)
        spec = self.assignment_spec(group, computation.assignor)
        computation = replace(
            computation,
            notified=True,
            prepared_epoch=group.group_epoch,
            prepared_members={mid: s.subscribed_topic_ids for mid, s in spec.members.items()},
            prepared_topics=dict(spec.topics),
        )
        self._set_computation(group.group_id, computation)
        members = []
        for member_id, s in sorted(spec.members.items()):
            member = group.members[member_id]
            meta = s.metadata or AssignorMetadata()
            members.append(
                Response.Member(
                    member_id=member_id,
                    member_epoch=member.member_epoch,
                    instance_id=member.instance_id,
                    rack_id=member.rack_id,
                    subscribed_topic_ids=sorted(s.subscribed_topic_ids),
                    assignor=Response.Member.Assignor(
                        reason=meta.reason,
                        minimum_version=meta.minimum_version,
                        maximum_version=meta.maximum_version,
                        metadata_version=meta.version,
                        metadata_bytes=meta.data,
                    ),
                    topic_partitions=PartitionSet.of(s.target_partitions).to_wire(Response.Member.TopicPartitions),
                )
            )
        topics = [
            Response.TopicMetadata(topic_id=t.topic_id, topic_name=t.name, num_partitions=t.num_partitions)
            for t in sorted(spec.topics.values(), key=lambda t: t.name)
        ]
        return Response(group_epoch=group.group_epoch, assignor_name=computation.assignor, members=members, topics=topics)

    def consumer_group_install_assignment(self, request, now_ms: int):
        Response = m.ConsumerGroupInstallAssignmentResponse
        try:
            group, _, computation = self._computing_member(request.group_id, request.member_id, request.member_epoch)
            if computation.prepared_epoch is None or computation.prepared_epoch != request.group_epoch:
                raise RequestError(
                    InvalidAssignmentError,
                    f"The assignment was computed for group epoch {request.group_epoch}, but the prepared epoch is {computation.prepared_epoch}.",
                )
            if request.group_epoch <= group.assignment_epoch:
                raise RequestError(
                    InvalidAssignmentError,
                    f"Group epoch {request.group_epoch} is not newer than the installed assignment epoch {group.assignment_epoch}.",
                )
            if request.error:
                # The assignor could not compute: keep the current target, record the error.
                self.install_target(
                    group, {mid: (t.partitions, t.metadata_version, t.metadata) for mid, t in group.targets.items()}, request.group_epoch, request.error
                )
            else:
                assignment = _validated_assignment(request, computation, self.config.max_assignor_metadata_bytes)
                self.install_target(group, assignment, request.group_epoch, 0)
        except RequestError as exc:
            return Response(error_code=exc.code, error_message=exc.message)
        self.end_computation(group.group_id)
        if set(computation.prepared_members) != set(group.members) and group.group_epoch <= group.assignment_epoch:
            # A static member was replaced meanwhile (no epoch bump): the assignment names its
            # old id, so its partitions would stay unassigned. Compute again for who is here.
            self.bump_group_epoch(group)
        self.maybe_compute_target(group, now_ms)
        return Response()

    # --- timers, topics and fail-over ---------------------------------------------------------

    def expire(self, timer, now_ms: int) -> None:
        group = self.ctx.groups.peek(timer.group_id)
        if group is None or group.group_type != CONSUMER:
            return
        match timer:
            case (
                SessionTimer(member_id=member_id)
                | RevocationTimer(member_id=member_id)
                | ClassicMemberJoinTimer(member_id=member_id)
                | ClassicMemberSyncTimer(member_id=member_id)
            ):
                member = group.members.get(member_id)
                if member is not None:
                    self.remove_member(group, member, now_ms)
            case ComputationTimer():
                self.reassign_computation(group, now_ms)

    def delete_group(self, group: ConsumerGroup) -> None:
        """An EMPTY group past its retention becomes DEAD: its records are tombstoned (the
        shard tombstones its offsets first)."""
        self.ctx.emit(r.PartitionMetadata(group.group_id, None))
        self.ctx.emit(r.TargetAssignmentMetadata(group.group_id, None))
        self.ctx.emit(r.GroupMetadata(group.group_id, None))
        if group.group_id in self.computations:
            self._set_computation(group.group_id, None)

    def on_loaded(self, group: ConsumerGroup, now_ms: int) -> None:
        """KIP-848 "Fail Over": re-arm timers, re-check metadata and regexes, compute a missing target."""
        for member in group.members.values():
            self.ctx.schedule(SessionTimer(group.group_id, member.member_id), now_ms + self.session_timeout_of(group.group_id, member))
            if member.revoking and member.classic is None:
                self.ctx.schedule(RevocationTimer(group.group_id, member.member_id), now_ms + member.rebalance_timeout_ms)
        if not group.members:
            self.ctx.schedule(EmptyGroupTimer(group.group_id), now_ms + self.config.empty_group_retention_ms)
            return
        if self.ctx.topics:
            self.on_topics_changed(group, now_ms)
        self.maybe_compute_target(group, now_ms)

    # --- ConsumerGroupDescribe ---------------------------------------------------------------

    def consumer_group_describe(self, request, now_ms: int):
        Response = m.ConsumerGroupDescribeResponse
        Group, Member, Assignment = Response.DescribedGroup, Response.DescribedGroup.Member, Response.DescribedGroup.Member.Assignment
        if not request.group_ids:
            return Response(groups=[Group(error_code=Errors.InvalidRequestError.errno, error_message="GroupIds must be non-empty.", group_id="")])

        def assignment(held: PartitionSet, names, error=0, version=0, metadata=b""):
            partitions = held.by_topic
            return Assignment(
                topic_partitions=[
                    Assignment.TopicPartitions(topic_id=t, topic_name=names.get(t, ""), partitions=sorted(partitions[t]))
                    for t in sorted(partitions, key=lambda t: names.get(t, str(t)))
                ],
                error=error,
                metadata_version=version,
                metadata_bytes=metadata,
            )

        described = []
        for group_id in request.group_ids:
            try:
                group = self.ctx.groups.get(group_id)
            except RequestError as exc:
                described.append(Group(error_code=exc.code, error_message=exc.message, group_id=group_id, group_state=GroupState.DEAD.value))
                continue
            if group is None or group.group_type != "consumer":
                described.append(
                    Group(
                        error_code=Errors.GroupIdNotFoundError.errno,
                        error_message=f"Group {group_id} not found.",
                        group_id=group_id,
                        group_state=GroupState.DEAD.value,
                    )
                )
                continue
            names = group.topic_names_by_id()
            client_side, assignor = self.select_assignor(group)
            members = []
            for member in sorted(group.members.values(), key=lambda mb: mb.member_id):
                target = group.targets.get(member.member_id)
                members.append(
                    Member(
                        member_id=member.member_id,
                        instance_id=member.instance_id,
                        rack_id=member.rack_id,
                        member_epoch=member.member_epoch,
                        client_id=member.client_id,
                        client_host=member.client_host,
                        subscribed_topic_names=list(member.subscribed_topic_names),
                        subscribed_topic_regex=member.subscribed_topic_regex,
                        assignment=assignment(member.assigned | member.revoking, names, member.error, member.metadata_version, member.metadata),
                        target_assignment=assignment(
                            target.partitions if target else NO_PARTITIONS,
                            names,
                            group.assignment_error,
                            target.metadata_version if target else 0,
                            target.metadata if target else b"",
                        ),
                        member_type=CLASSIC_MEMBER_TYPE if member.classic is not None else CONSUMER_MEMBER_TYPE,
                    )
                )
            described.append(
                Group(
                    group_id=group_id,
                    group_state=group.state.value,
                    group_epoch=group.group_epoch,
                    assignment_epoch=group.assignment_epoch,
                    assignor_name=assignor,
                    members=members,
                )
            )
        return Response(groups=described)


def _apply_request_fields(member: ConsumerMember, request, context) -> tuple[ConsumerMember, bool]:
    """The member as updated by the request's non-null fields, and whether the change is a
    rebalance trigger (subscriptions, assignors, assignor reason or metadata)."""
    changes = {}
    if request.instance_id is not None and request.member_epoch == 0:
        changes["instance_id"] = request.instance_id
    if request.rack_id is not None:
        changes["rack_id"] = request.rack_id
    if request.rebalance_timeout_ms > 0:
        changes["rebalance_timeout_ms"] = request.rebalance_timeout_ms
    if request.subscribed_topic_names is not None:
        changes["subscribed_topic_names"] = tuple(sorted(set(request.subscribed_topic_names)))
    if request.subscribed_topic_regex is not None:
        changes["subscribed_topic_regex"] = request.subscribed_topic_regex or None
    if request.server_assignor is not None:
        changes["server_assignor"] = request.server_assignor
        changes["assignors"] = ()
    if request.client_assignors is not None:
        changes["assignors"] = tuple(
            r.AssignorValue(a.name, a.minimum_version, a.maximum_version, a.reason, a.metadata_version, bytes(a.metadata_bytes))
            for a in request.client_assignors
        )
        changes["server_assignor"] = None
    if request.member_epoch == 0:
        changes["client_id"] = context.client_id
        changes["client_host"] = context.client_host
    if member.classic is not None:
        # It speaks KIP-848 now: its classic protocols (and the assignors they stood for) go.
        changes["classic"] = None
        changes.setdefault("assignors", ())
    updated = replace(member, **changes) if changes else member
    subscription_changed = updated.subscribed_topic_names != member.subscribed_topic_names or updated.subscribed_topic_regex != member.subscribed_topic_regex
    if member.classic is not None:
        # Switching protocols is not a reason to reassign (the KIP's Online Migration keeps
        # the upgraded member's partitions at the same epoch); a new subscription is.
        return updated, subscription_changed
    trigger = subscription_changed or updated.server_assignor != member.server_assignor or _assignors_trigger(member.assignors, updated.assignors)
    return updated, trigger


def _assignors_trigger(before: tuple, after: tuple) -> bool:
    """New assignors, new metadata or a new non-zero reason ask for a new assignment. A reason
    falling back to 0 with unchanged metadata does not: it is the member saying its request
    was answered, and bumping again would rebalance twice per request."""
    if len(before) != len(after):
        return True
    for old, new in zip(before, after, strict=False):
        if msgspec.structs.replace(old, reason=0) != msgspec.structs.replace(new, reason=0):
            return True
        if new.reason != 0 and new.reason != old.reason:
            return True
    return False


def _validated_assignment(request, computation: ClientComputation, max_metadata_bytes: int) -> dict:
    """KIP-848 "Assignment Validation", against the metadata the assignment was computed from."""
    invalid = InvalidAssignmentError
    assignment: dict[str, tuple] = {}
    holders: dict[tuple[UUID, int], str] = {}
    for entry in request.members:
        if entry.member_id not in computation.prepared_members:
            raise RequestError(invalid, f"Member {entry.member_id} was not in the group the assignment was computed for.")
        if entry.member_id in assignment:
            raise RequestError(invalid, f"Member {entry.member_id} appears twice in the assignment.")
        if len(entry.metadata_bytes) > max_metadata_bytes:
            raise RequestError(
                invalid,
                f"The metadata for member {entry.member_id} is {len(entry.metadata_bytes)} bytes; this coordinator accepts at most {max_metadata_bytes}.",
            )
        partitions: dict[UUID, set[int]] = {}
        for item in entry.partitions:
            topic = computation.prepared_topics.get(item.topic_id)
            if topic is None:
                raise RequestError(invalid, f"Topic {item.topic_id} assigned to {entry.member_id} is not a subscribed topic.")
            for p in item.partitions:
                if not 0 <= p < topic.num_partitions:
                    raise RequestError(invalid, f"Partition {topic.name}-{p} does not exist ({topic.num_partitions} partitions).")
                holder = holders.setdefault((item.topic_id, p), entry.member_id)
                if holder != entry.member_id or p in partitions.get(item.topic_id, ()):
                    raise RequestError(invalid, f"Partition {topic.name}-{p} is assigned more than once.")
                partitions.setdefault(item.topic_id, set()).add(p)
        assignment[entry.member_id] = (PartitionSet(partitions), entry.metadata_version, bytes(entry.metadata_bytes))
    subscribed = set().union(*computation.prepared_members.values()) if computation.prepared_members else set()
    for topic_id in subscribed:
        topic = computation.prepared_topics[topic_id]
        missing = [p for p in range(topic.num_partitions) if (topic_id, p) not in holders]
        if missing:
            raise RequestError(invalid, f"Partitions {', '.join(f'{topic.name}-{p}' for p in missing[:10])} are not assigned.")
    return assignment
