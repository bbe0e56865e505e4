"""Classic groups: JoinGroup, SyncGroup, Heartbeat and LeaveGroup, as Apache Kafka's group
coordinator serves them (KIP-345 static members, KIP-394 MEMBER_ID_REQUIRED, eager and KIP-429
cooperative clients alike — the protocol does not tell them apart).

A JoinGroup is a long poll: the member is parked (its request deferred) until the join phase
ends — every member rejoined, the rebalance timeout, or the initial rebalance delay of a group
starting from Empty — and then the leader is sent every member's metadata and runs the
assignment. SyncGroup parks followers until the leader's assignment is stored (the group's
record), then answers them all. The rules and error orders follow Kafka's
GroupMetadataManager; ``/work/brief``-style references aside, each function names the Kafka
method it mirrors.

Group state that is not in the record (who is parked, the rebalance in progress) is runtime
state: every handler guards the group first, so a failure rolls it back with the records.
"""

from __future__ import annotations

import copy
import logging

import kafka.errors as Errors

from pystreams.coordinator import records as r
from pystreams.coordinator.classic_group import ClassicGroup, ClassicGroupState, ClassicMember
from pystreams.coordinator.context import DEFERRED, ShardContext
from pystreams.coordinator.errors import RequestError
from pystreams.coordinator.timers import ClassicHeartbeatTimer, ClassicJoinTimer, ClassicSyncTimer, EmptyGroupTimer
from pystreams.protocol import messages as m

log = logging.getLogger(__name__)

Preparing = ClassicGroupState.PREPARING_REBALANCE
Completing = ClassicGroupState.COMPLETING_REBALANCE
Stable = ClassicGroupState.STABLE
Empty = ClassicGroupState.EMPTY
Dead = ClassicGroupState.DEAD

#: JoinGroup v4 is the first whose new dynamic members must take a member id first (KIP-394).
REQUIRES_KNOWN_MEMBER_ID_VERSION = 4
#: JoinGroup v9 can tell a static leader to skip the assignment (KIP-814).
SKIP_ASSIGNMENT_VERSION = 9


def protocols_of(request) -> tuple[tuple[str, bytes], ...]:
    return tuple((p.name, bytes(p.metadata)) for p in request.protocols or ())


def join_response(
    version: int,
    *,
    error: int = 0,
    member_id: str = "",
    generation: int = -1,
    protocol_type: str | None = None,
    protocol_name: str | None = None,
    leader: str = "",
    members: list | None = None,
    skip_assignment: bool = False,
    message: str | None = None,
):
    """A JoinGroup answer that encodes at ``version`` (names are non-nullable before v7)."""
    nullable = version >= 7
    response = m.JoinGroupResponse(
        throttle_time_ms=0,
        error_code=error,
        generation_id=generation,
        protocol_type=protocol_type if nullable else (protocol_type or ""),
        protocol_name=protocol_name if nullable else (protocol_name or ""),
        leader=leader or "",
        skip_assignment=skip_assignment,
        member_id=member_id,
        members=members or [],
    )
    response.API_VERSION = version
    return response


def member_list(group: ClassicGroup, version: int) -> list:
    """The members a leader's JoinGroup answer lists, with their metadata for the group's protocol."""
    Member = m.JoinGroupResponse.JoinGroupResponseMember
    return [
        Member(member_id=mb.member_id, group_instance_id=mb.instance_id if version >= 5 else None, metadata=mb.metadata(group.protocol_name))
        for mb in group.members.values()
    ]


def sync_response(error: int = 0, protocol_type: str | None = None, protocol_name: str | None = None, assignment: bytes = b""):
    return m.SyncGroupResponse(throttle_time_ms=0, error_code=error, protocol_type=protocol_type, protocol_name=protocol_name, assignment=assignment)


class ClassicGroupManager:
    def __init__(self, ctx: ShardContext) -> None:
        self.ctx = ctx

    @property
    def config(self):
        return self.ctx.config

    # --- runtime state under the journal -------------------------------------------------------

    def _guard(self, group_id: str) -> None:
        """Undo for the group's runtime state: put back the object as it is now (or nothing)."""
        saved = copy.deepcopy(self.ctx.groups.peek(group_id))
        groups = self.ctx.groups

        def restore() -> None:
            if saved is None:
                groups.pop(group_id, None)
            else:
                groups[group_id] = saved

        self.ctx.on_undo(restore)

    def _write(self, group: ClassicGroup, assignments: dict[str, bytes] | None = None) -> None:
        self.ctx.emit(r.ClassicGroupMetadata(group.group_id, group.record_value(assignments)))

    def _answer_join(self, member: ClassicMember, response) -> None:
        if member.awaiting_join is not None:
            self.ctx.complete(member.awaiting_join, response)
            member.awaiting_join = None

    def _answer_sync(self, member: ClassicMember, response) -> None:
        if member.awaiting_sync is not None:
            self.ctx.complete(member.awaiting_sync, response)
            member.awaiting_sync = None

    def _reschedule_heartbeat(self, group: ClassicGroup, member: ClassicMember, now_ms: int, delay_ms: int | None = None) -> None:
        self.ctx.schedule(ClassicHeartbeatTimer(group.group_id, member.member_id), now_ms + (member.session_timeout_ms if delay_ms is None else delay_ms))

    # --- JoinGroup ------------------------------------------------------------------------------

    def join_group(self, request, now_ms: int, group: ClassicGroup | None):
        """A JoinGroup for a classic group (``group``), or for no group yet."""
        version = request.API_VERSION or 0
        member_id = request.member_id or ""
        self._guard(request.group_id)
        savepoint = self.ctx.savepoint()
        is_new_group = group is None
        if group is None:
            if member_id:
                return join_response(version, error=Errors.UnknownMemberIdError.errno, member_id=member_id)
            if len(self.ctx.groups) >= self.config.max_groups:
                raise RequestError(Errors.PolicyViolationError, f"This coordinator shard already holds its maximum of {self.config.max_groups} groups.")
            group = self.ctx.groups[request.group_id] = ClassicGroup(request.group_id, current_state_timestamp=now_ms)
        if not self._accept_joining_member(group, member_id):
            if member_id in group.members:
                self._remove_member(group, group.members[member_id], now_ms, error=None)
            return join_response(
                version,
                error=Errors.GroupMaxSizeReachedError.errno,
                message=f"Group {group.group_id} already has {self.config.classic_max_group_size} members.",
            )
        if member_id:
            response = self._join_existing_member(group, request, version, now_ms)
        else:
            response = self._join_new_member(group, request, version, now_ms)
        if is_new_group and self.ctx.savepoint()[0] == savepoint[0]:
            # The group exists because a record says so: an empty one (Kafka's
            # newEmptyGroupMetadataRecord). Its members are written once a generation forms;
            # one written now would replay as a Stable member without a protocol.
            self.ctx.emit(r.ClassicGroupMetadata(group.group_id, ClassicGroup(group.group_id, current_state_timestamp=now_ms).record_value()))
        return response

    def _accept_joining_member(self, group: ClassicGroup, member_id: str) -> bool:
        maximum = self.config.classic_max_group_size
        member = group.members.get(member_id)
        if group.state in (Empty, Dead):
            return True
        if group.state is Preparing:
            return (member is not None and member.awaiting_join is not None) or group.num_awaiting_join < maximum
        return member is not None or len(group.members) < maximum

    def _join_new_member(self, group: ClassicGroup, request, version: int, now_ms: int):
        protocols = protocols_of(request)
        if group.state is Dead:
            return join_response(version, error=Errors.CoordinatorNotAvailableError.errno)
        if not group.supports_protocols(request.protocol_type, protocols):
            return join_response(version, error=Errors.InconsistentGroupProtocolError.errno)
        instance_id = request.group_instance_id if version >= 5 else None
        prefix = instance_id if instance_id is not None else (self.ctx.request.client_id or "member")
        new_id = f"{prefix}-{self.ctx.new_member_id()}"
        if instance_id is not None:
            if instance_id in group.static_members:
                return self._replace_static_member(group, request, version, new_id, now_ms)
            return self._add_member(group, request, version, new_id, now_ms)
        if version >= REQUIRES_KNOWN_MEMBER_ID_VERSION:
            group.pending_join.add(new_id)
            self._reschedule_heartbeat_pending(group, new_id, request.session_timeout_ms, now_ms)
            return join_response(version, error=Errors.MemberIdRequiredError.errno, member_id=new_id)
        return self._add_member(group, request, version, new_id, now_ms)

    def _reschedule_heartbeat_pending(self, group: ClassicGroup, member_id: str, session_timeout_ms: int, now_ms: int) -> None:
        self.ctx.schedule(ClassicHeartbeatTimer(group.group_id, member_id), now_ms + session_timeout_ms)

    def _join_existing_member(self, group: ClassicGroup, request, version: int, now_ms: int):
        member_id = request.member_id
        protocols = protocols_of(request)
        instance_id = request.group_instance_id if version >= 5 else None
        if group.state is Dead:
            return join_response(version, error=Errors.CoordinatorNotAvailableError.errno, member_id=member_id)
        if not group.supports_protocols(request.protocol_type, protocols):
            return join_response(version, error=Errors.InconsistentGroupProtocolError.errno, member_id=member_id)
        if member_id in group.pending_join:
            if instance_id is not None:
                raise RequestError(Errors.InvalidRequestError, f"Pending member {member_id} cannot join with an instance id.")
            return self._add_member(group, request, version, member_id, now_ms)
        try:
            member = group.validate_member(member_id, instance_id, "join-group")
        except RequestError as error:
            return join_response(version, error=error.code, member_id=member_id)
        if group.state is Preparing:
            return self._update_member_then_rebalance(group, member, request, version, now_ms)
        if group.state is Completing:
            if member.matches(protocols):
                return self._current_generation_answer(group, member, version)
            return self._update_member_then_rebalance(group, member, request, version, now_ms)
        if group.state is Stable:
            if group.is_leader(member_id) or not member.matches(protocols):
                return self._update_member_then_rebalance(group, member, request, version, now_ms)
            return self._current_generation_answer(group, member, version)
        return join_response(version, error=Errors.UnknownMemberIdError.errno, member_id=member_id)  # Empty

    def _current_generation_answer(self, group: ClassicGroup, member: ClassicMember, version: int):
        """A member that lost its JoinGroup answer gets it again, without a rebalance."""
        return join_response(
            version,
            member_id=member.member_id,
            generation=group.generation,
            protocol_type=group.protocol_type,
            protocol_name=group.protocol_name,
            leader=group.leader_id or "",
            members=self._member_list(group, version) if group.is_leader(member.member_id) else [],
        )

    def _member_list(self, group: ClassicGroup, version: int) -> list:
        return member_list(group, version)

    def _add_member(self, group: ClassicGroup, request, version: int, member_id: str, now_ms: int):
        """Kafka's addMemberThenRebalanceOrCompleteJoin."""
        member = ClassicMember(
            member_id=member_id,
            instance_id=request.group_instance_id if version >= 5 else None,
            client_id=self.ctx.request.client_id,
            client_host=self.ctx.request.client_host,
            rebalance_timeout_ms=request.rebalance_timeout_ms if version >= 1 else request.session_timeout_ms,
            session_timeout_ms=request.session_timeout_ms,
            protocol_type=request.protocol_type,
            protocols=protocols_of(request),
            awaiting_join=self.ctx.request.request_id,
            join_version=version,
            is_new=True,
        )
        if group.state is Preparing and group.previous_state is Empty:
            group.new_member_added = True
        group.add(member)
        self._reschedule_heartbeat(group, member, now_ms, self.config.classic_new_member_join_timeout_ms)
        self._maybe_prepare_rebalance_or_complete_join(group, now_ms)
        return DEFERRED

    def _update_member_then_rebalance(self, group: ClassicGroup, member: ClassicMember, request, version: int, now_ms: int):
        self._update_member(member, request, version)
        self._maybe_prepare_rebalance_or_complete_join(group, now_ms)
        return DEFERRED

    def _update_member(self, member: ClassicMember, request, version: int) -> None:
        member.protocols = protocols_of(request)
        member.rebalance_timeout_ms = request.rebalance_timeout_ms if version >= 1 else request.session_timeout_ms
        member.session_timeout_ms = request.session_timeout_ms
        member.awaiting_join = self.ctx.request.request_id
        member.join_version = version

    def _replace_static_member(self, group: ClassicGroup, request, version: int, new_id: str, now_ms: int):
        """Kafka's updateStaticMemberThenRebalanceOrCompleteJoin: a static member is back with a
        new member id; the old one is fenced."""
        instance_id = request.group_instance_id
        current_leader = group.leader_id
        old = group.members[group.static_members[instance_id]]
        self._answer_join(old, join_response(old.join_version, error=Errors.FencedInstanceIdError.errno, member_id=old.member_id))
        self._answer_sync(old, sync_response(Errors.FencedInstanceIdError.errno))
        was_leader = group.is_leader(old.member_id)
        new = copy.copy(old)
        new.member_id, new.awaiting_join, new.awaiting_sync, new.is_new = new_id, None, None, False
        group.remove(old.member_id)
        self.ctx.cancel(ClassicHeartbeatTimer(group.group_id, old.member_id))
        group.add(new)
        if was_leader:
            group.leader_id = new_id
        if old.member_id in group.pending_sync:
            group.pending_sync.discard(old.member_id)
            group.pending_sync.add(new_id)
        self._reschedule_heartbeat(group, new, now_ms)
        self._update_member(new, request, version)
        if group.state is Stable:
            # Kafka hands the returning member its old assignment unless the protocol vote
            # changes; an assignment that no longer fits the subscriptions and topics (a topic
            # the member now matches, partitions added while the leader was away) would then
            # never be repaired, as the returning leader watches metadata only from now on.
            stale = group.stale_assignment(self.ctx.topics)
            if stale is not None:
                log.info("group %s: static member %s is back, but the group's assignment is stale (%s): rebalancing", group.group_id, instance_id, stale)
            elif group.select_protocol() == group.protocol_name:
                self._write(group)
                new.awaiting_join = None
                is_leader = group.is_leader(new_id)
                if version >= SKIP_ASSIGNMENT_VERSION:
                    return join_response(
                        version,
                        member_id=new_id,
                        generation=group.generation,
                        protocol_type=group.protocol_type,
                        protocol_name=group.protocol_name,
                        leader=group.leader_id or "",
                        members=self._member_list(group, version) if is_leader else [],
                        skip_assignment=is_leader,
                    )
                # Before v9 a static leader must not run the assignment: it is told the old leader's id.
                return join_response(
                    version,
                    member_id=new_id,
                    generation=group.generation,
                    protocol_type=group.protocol_type,
                    protocol_name=group.protocol_name,
                    leader=current_leader or "",
                )
            self._maybe_prepare_rebalance_or_complete_join(group, now_ms)
        elif group.state is Completing:
            self._prepare_rebalance(group, now_ms)  # the leader may have assigned to the old id
        elif group.state is Preparing:
            self._maybe_complete_join_phase(group, now_ms)
        return DEFERRED

    # --- rebalances -----------------------------------------------------------------------------

    def _maybe_prepare_rebalance_or_complete_join(self, group: ClassicGroup, now_ms: int) -> None:
        if group.can_rebalance():
            self._prepare_rebalance(group, now_ms)
        else:
            self._maybe_complete_join_phase(group, now_ms)

    def _prepare_rebalance(self, group: ClassicGroup, now_ms: int) -> None:
        if group.state is Completing:
            self._reset_assignment_with_error(group, Errors.RebalanceInProgressError.errno, now_ms)
        group.pending_sync.clear()
        self.ctx.cancel(ClassicSyncTimer(group.group_id))
        initial = group.state is Empty
        if initial:
            self.ctx.cancel(EmptyGroupTimer(group.group_id))
            delay = self.config.initial_rebalance_delay_ms
            group.initial_delay_ms = delay
            group.initial_delay_remaining_ms = max(group.rebalance_timeout_ms() - delay, 0)
            self.ctx.schedule(ClassicJoinTimer(group.group_id), now_ms + delay)
        group.transition_to(Preparing, now_ms)
        if not initial:
            if group.has_all_members_joined():
                self._complete_join(group, now_ms)
            else:
                self.ctx.schedule(ClassicJoinTimer(group.group_id), now_ms + group.rebalance_timeout_ms())

    def _maybe_complete_join_phase(self, group: ClassicGroup, now_ms: int) -> None:
        if group.state is Preparing and group.previous_state is not Empty and group.has_all_members_joined():
            self._complete_join(group, now_ms)

    def _complete_join(self, group: ClassicGroup, now_ms: int) -> None:
        """Kafka's completeClassicGroupJoin."""
        self.ctx.cancel(ClassicJoinTimer(group.group_id))
        for member in list(group.members.values()):
            if member.awaiting_join is None and member.instance_id is None:
                group.remove(member.member_id)  # a dynamic member that did not rejoin
                self.ctx.cancel(ClassicHeartbeatTimer(group.group_id, member.member_id))
        if group.state is Dead:
            return
        if group.members and not group.elect_joined_leader():
            self.ctx.schedule(ClassicJoinTimer(group.group_id), now_ms + group.rebalance_timeout_ms())
            return
        group.generation += 1
        group.pending_sync.clear()
        if group.members:
            group.protocol_name = group.select_protocol()
            group.transition_to(Completing, now_ms)
        else:
            group.protocol_name = None
            group.transition_to(Empty, now_ms)
            self._write(group, {})
            self.ctx.schedule(EmptyGroupTimer(group.group_id), now_ms + self.config.empty_group_retention_ms)
            return
        for member in group.members.values():
            self._answer_join(
                member,
                join_response(
                    member.join_version,
                    member_id=member.member_id,
                    generation=group.generation,
                    protocol_type=group.protocol_type,
                    protocol_name=group.protocol_name,
                    leader=group.leader_id or "",
                    members=self._member_list(group, member.join_version) if group.is_leader(member.member_id) else [],
                ),
            )
            self._reschedule_heartbeat(group, member, now_ms)
            member.is_new = False
            group.pending_sync.add(member.member_id)
        self.ctx.schedule(ClassicSyncTimer(group.group_id), now_ms + group.rebalance_timeout_ms())

    def _reset_assignment_with_error(self, group: ClassicGroup, error: int, now_ms: int) -> None:
        """Kafka's resetAndPropagateAssignmentWithError."""
        for member in group.members.values():
            member.assignment = b""
            if member.awaiting_sync is not None:
                self._answer_sync(member, sync_response(error))
                self._reschedule_heartbeat(group, member, now_ms)

    def _remove_member(self, group: ClassicGroup, member: ClassicMember, now_ms: int, *, error: int | None = Errors.UnknownMemberIdError.errno) -> None:
        """Kafka's removeMemberAndUpdateClassicGroup."""
        if error is not None:
            self._answer_join(member, join_response(member.join_version, error=error))
        group.remove(member.member_id)
        self.ctx.cancel(ClassicHeartbeatTimer(group.group_id, member.member_id))
        if group.state in (Stable, Completing):
            self._maybe_prepare_rebalance_or_complete_join(group, now_ms)
        elif group.state is Preparing and group.has_all_members_joined():
            self._complete_join(group, now_ms)

    # --- SyncGroup ------------------------------------------------------------------------------

    def sync_group(self, request, now_ms: int, group: ClassicGroup):
        self._guard(group.group_id)
        instance_id = request.group_instance_id if (request.API_VERSION or 0) >= 3 else None
        if group.state is Dead:
            return sync_response(Errors.CoordinatorNotAvailableError.errno)
        try:
            member = group.validate_member(request.member_id, instance_id, "sync-group")
        except RequestError as error:
            return sync_response(error.code)
        if request.generation_id != group.generation:
            return sync_response(Errors.IllegalGenerationError.errno)
        if (request.protocol_type is not None and group.protocol_type is not None and request.protocol_type != group.protocol_type) or (
            request.protocol_name is not None and group.protocol_name is not None and request.protocol_name != group.protocol_name
        ):
            return sync_response(Errors.InconsistentGroupProtocolError.errno)
        if group.state is Preparing:
            return sync_response(Errors.RebalanceInProgressError.errno)
        if group.state is Stable:
            group.pending_sync.discard(member.member_id)
            return sync_response(protocol_type=group.protocol_type, protocol_name=group.protocol_name, assignment=member.assignment)
        # CompletingRebalance: park until the leader's assignment is stored.
        member.awaiting_sync = self.ctx.request.request_id
        group.pending_sync.discard(member.member_id)
        if not group.pending_sync:
            self.ctx.cancel(ClassicSyncTimer(group.group_id))
        if group.is_leader(member.member_id):
            assignments = {a.member_id: bytes(a.assignment) for a in request.assignments or ()}
            missing = [mid for mid in group.members if mid not in assignments]
            if missing:
                log.warning("group %s: the leader assigned nothing to %s", group.group_id, ", ".join(missing))
            self._write(group, assignments)
            for other in group.members.values():
                other.assignment = assignments.get(other.member_id, b"")
                if other.awaiting_sync is not None:
                    self._answer_sync(other, sync_response(protocol_type=group.protocol_type, protocol_name=group.protocol_name, assignment=other.assignment))
                    self._reschedule_heartbeat(group, other, now_ms)
            group.transition_to(Stable, now_ms)
        return DEFERRED

    def expire_pending_sync(self, group: ClassicGroup, now_ms: int) -> None:
        """Members that joined but did not sync within the rebalance timeout are removed."""
        if group.state not in (Completing, Stable) or not group.pending_sync:
            return
        for member_id in sorted(group.pending_sync):
            member = group.members.get(member_id)
            if member is not None:
                group.remove(member_id)
                self.ctx.cancel(ClassicHeartbeatTimer(group.group_id, member_id))
        group.pending_sync.clear()
        self._prepare_rebalance(group, now_ms)

    # --- Heartbeat ------------------------------------------------------------------------------

    def heartbeat(self, request, now_ms: int, group: ClassicGroup):
        self._guard(group.group_id)
        instance_id = request.group_instance_id if (request.API_VERSION or 0) >= 3 else None
        if group.state is Dead:
            return m.HeartbeatResponse(throttle_time_ms=0, error_code=Errors.CoordinatorNotAvailableError.errno)
        try:
            member = group.validate_member(request.member_id, instance_id, "heartbeat")
        except RequestError as error:
            return m.HeartbeatResponse(throttle_time_ms=0, error_code=error.code)
        if request.generation_id != group.generation:
            return m.HeartbeatResponse(throttle_time_ms=0, error_code=Errors.IllegalGenerationError.errno)
        if group.state is Empty:
            return m.HeartbeatResponse(throttle_time_ms=0, error_code=Errors.UnknownMemberIdError.errno)
        self._reschedule_heartbeat(group, member, now_ms)
        if group.state is Preparing:
            return m.HeartbeatResponse(throttle_time_ms=0, error_code=Errors.RebalanceInProgressError.errno)
        return m.HeartbeatResponse(throttle_time_ms=0, error_code=0)

    # --- LeaveGroup -----------------------------------------------------------------------------

    def leave_group(self, request, now_ms: int, group: ClassicGroup):
        self._guard(group.group_id)
        version = request.API_VERSION or 0
        leaving = [(request.member_id, None)] if version < 3 else [(mb.member_id, mb.group_instance_id) for mb in request.members or ()]
        if group.state is Dead:
            return leave_response(version, Errors.CoordinatorNotAvailableError.errno, [])
        outcomes, removed = [], False
        for member_id, instance_id in leaving:
            error = 0
            if not member_id and instance_id is not None:  # an admin removing a static member
                holder = group.static_members.get(instance_id)
                if holder is None:
                    error = Errors.UnknownMemberIdError.errno
                else:
                    self._drop(group, group.members[holder])
                    removed = True
            elif member_id in group.pending_join:
                group.pending_join.discard(member_id)
                self.ctx.cancel(ClassicHeartbeatTimer(group.group_id, member_id))
                removed = True
            else:
                try:
                    member = group.validate_member(member_id, instance_id, "leave-group")
                    self._drop(group, member)
                    removed = True
                except RequestError as refused:
                    error = refused.code
            outcomes.append((member_id, instance_id, error))
        if removed:
            if group.state in (Stable, Completing):
                self._maybe_prepare_rebalance_or_complete_join(group, now_ms)
            elif group.state is Preparing:
                self._maybe_complete_join_phase(group, now_ms)
        return leave_response(version, 0, outcomes)

    def _drop(self, group: ClassicGroup, member: ClassicMember) -> None:
        self.ctx.cancel(ClassicHeartbeatTimer(group.group_id, member.member_id))
        self._answer_join(member, join_response(member.join_version, error=Errors.UnknownMemberIdError.errno))
        group.remove(member.member_id)

    # --- timers and loading ---------------------------------------------------------------------

    def expire(self, timer, now_ms: int) -> None:
        group = self.ctx.groups.peek(timer.group_id)
        if not isinstance(group, ClassicGroup) or group.state is Dead:
            return  # converted or deleted meanwhile: the timer means nothing now
        self._guard(group.group_id)
        match timer:
            case ClassicHeartbeatTimer(member_id=member_id):
                if member_id in group.pending_join:
                    group.pending_join.discard(member_id)
                    self._maybe_complete_join_phase(group, now_ms)
                    return
                member = group.members.get(member_id)
                if member is not None and not member.has_satisfied_heartbeat:
                    log.info("group %s: member %s expired", group.group_id, member_id)
                    self._remove_member(group, member, now_ms)
            case ClassicJoinTimer():
                if group.state is not Preparing:
                    return
                if group.previous_state is Empty:
                    self._initial_rebalance_timer(group, now_ms)
                else:
                    self._complete_join(group, now_ms)
            case ClassicSyncTimer():
                self.expire_pending_sync(group, now_ms)

    def _initial_rebalance_timer(self, group: ClassicGroup, now_ms: int) -> None:
        """Kafka's tryCompleteInitialRebalanceElseSchedule: a member added during the delay
        extends it, within the group's rebalance timeout."""
        remaining = group.initial_delay_remaining_ms
        if group.new_member_added and remaining != 0:
            group.new_member_added = False
            delay = group.initial_delay_ms
            new_delay = min(self.config.initial_rebalance_delay_ms, remaining)
            group.initial_delay_remaining_ms = max(remaining - delay, 0)
            group.initial_delay_ms = new_delay
            self.ctx.schedule(ClassicJoinTimer(group.group_id), now_ms + new_delay)
            return
        self._complete_join(group, now_ms)

    # --- conversions (migration.py) and deletion ------------------------------------------------

    def _cancel_timers(self, group: ClassicGroup) -> None:
        for member_id in [*group.members, *group.pending_join]:
            self.ctx.cancel(ClassicHeartbeatTimer(group.group_id, member_id))
        self.ctx.cancel(ClassicJoinTimer(group.group_id))
        self.ctx.cancel(ClassicSyncTimer(group.group_id))
        self.ctx.cancel(EmptyGroupTimer(group.group_id))

    def delete(self, group: ClassicGroup) -> None:
        """The group's tombstone (an empty group expired or replaced); its offsets are not touched."""
        self._guard(group.group_id)
        self._cancel_timers(group)
        self.ctx.emit(r.ClassicGroupMetadata(group.group_id, None))

    def dissolve(self, group: ClassicGroup) -> None:
        """The group becomes a consumer group: parked requests are told to rejoin."""
        self._guard(group.group_id)
        for member in group.members.values():
            self._answer_join(member, join_response(member.join_version, error=Errors.RebalanceInProgressError.errno, member_id=member.member_id))
            self._answer_sync(member, sync_response(Errors.RebalanceInProgressError.errno))
        self._cancel_timers(group)
        self.ctx.emit(r.ClassicGroupMetadata(group.group_id, None))

    def install(self, group: ClassicGroup, now_ms: int) -> None:
        """A group converted from a consumer group takes its place: its record, its members' sessions."""
        self._guard(group.group_id)
        self.ctx.groups[group.group_id] = group
        self._write(group)
        for member in group.members.values():
            self._reschedule_heartbeat(group, member, now_ms)

    def start_rebalance(self, group: ClassicGroup, now_ms: int) -> None:
        self._prepare_rebalance(group, now_ms)

    def on_topics_changed(self, group: ClassicGroup, now_ms: int) -> None:
        """New topic metadata: a Stable group whose assignment it makes stale rebalances.

        Kafka leaves this to the leader's metadata watch, which starts from the metadata the
        leader holds when it learns it leads: partitions added between a conversion without a
        rebalance (or a static leader's return, KIP-814) and that moment were never watched
        for, and no one rejoined (simulator, migration seed 101613). The coordinator sees every
        change: one rebalance either way (a leader's rejoin then joins this one)."""
        if group.state is Stable and (stale := group.stale_assignment(self.ctx.topics)) is not None:
            log.info("group %s: topic metadata changed and the assignment is stale (%s): rebalancing", group.group_id, stale)
            self._guard(group.group_id)
            self._prepare_rebalance(group, now_ms)

    def on_loaded(self, group: ClassicGroup, now_ms: int) -> None:
        if group.is_empty:
            self.ctx.schedule(EmptyGroupTimer(group.group_id), now_ms + self.config.empty_group_retention_ms)
        for member in group.members.values():
            self._reschedule_heartbeat(group, member, now_ms)
        if len(group.members) > self.config.classic_max_group_size:
            self._guard(group.group_id)
            self._prepare_rebalance(group, now_ms)
        elif group.state is Stable and (stale := group.stale_assignment(self.ctx.topics)) is not None:
            # The rebalance that would repair it lived in memory only (one a downgrade started,
            # or the leader's for new partitions) and died with the old coordinator: nothing in
            # the log brings it back, and members that heartbeat the stored generation never
            # hear of it. (Kafka's onLoaded rebalances a loaded group only when it is over capacity.)
            log.info("group %s: loaded with a stale assignment (%s): rebalancing", group.group_id, stale)
            self._guard(group.group_id)
            self._prepare_rebalance(group, now_ms)


def leave_response(version: int, error: int, outcomes: list[tuple[str, str | None, int]]):
    if version < 3:
        single = outcomes[0][2] if outcomes else 0
        return m.LeaveGroupResponse(throttle_time_ms=0, error_code=error or single, members=[])
    Member = m.LeaveGroupResponse.MemberResponse
    return m.LeaveGroupResponse(
        throttle_time_ms=0,
        error_code=error,
        members=[Member(member_id=member_id, group_instance_id=instance_id, error_code=code) for member_id, instance_id, code in outcomes],
    )
