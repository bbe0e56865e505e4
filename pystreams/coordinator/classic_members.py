"""Classic members of a KIP-848 consumer group: JoinGroup, SyncGroup, Heartbeat and LeaveGroup
from members that have not moved to the new protocol yet (KIP-848 "Supporting Online Consumer
Group Upgrade"; Apache Kafka's classicGroup*ToConsumerGroup).

A classic member is an ordinary member of the consumer group whose member record also holds its
JoinGroup protocols (``ClassicMemberMetadata``). The group assigns for it like for anyone else;
its own protocol only carries the result:

* JoinGroup updates its subscription (from its first protocol's embedded subscription),
  reconciles it with the partitions it reports owning, and answers at once with its member
  epoch as the generation. It is never the leader and never runs an assignor.
* SyncGroup hands out its current assignment, serialized at the version of its own
  subscription, with the assignor's classic output as userData.
* Heartbeat says REBALANCE_IN_PROGRESS whenever it should rejoin: a newer target than its
  epoch, partitions to revoke, or partitions it waits for that are now free.
* LeaveGroup removes members, with one epoch bump for the batch.

Timers: its session timeout is the one from its JoinGroup; a member told to rejoin that does not
within its rebalance timeout is fenced (``ClassicMemberJoinTimer``), as is one that joined but
never synced (``ClassicMemberSyncTimer``). It has no KIP-848 revocation timer.

Where Kafka differs, we follow the KIP: a classic member's subscription userData reaches
client-side assignors as metadata version -1, and the assignor's -1 output for it returns as its
assignment's userData (Kafka drops both). A member is told to rejoin for a newer *target* (the
assignment epoch) rather than a newer group epoch: with a client-side assignor the two differ
while the assignment is computed, and rejoining then would only spin.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

import kafka.errors as Errors

from pystreams.coordinator import records as r
from pystreams.coordinator.classic import SKIP_ASSIGNMENT_VERSION, join_response, leave_response, member_list, protocols_of, sync_response
from pystreams.coordinator.classic_group import ClassicGroup, ClassicGroupState
from pystreams.coordinator.consumer import ConsumerGroupManager
from pystreams.coordinator.consumer_group import (
    CLASSIC_METADATA_VERSION,
    CONSUMER,
    ConsumerGroup,
    ConsumerMember,
    classic_assignors,
)
from pystreams.coordinator.context import ShardContext
from pystreams.coordinator.errors import RequestError
from pystreams.coordinator.timers import ClassicMemberJoinTimer, ClassicMemberSyncTimer, SessionTimer
from pystreams.partitions import PartitionSet
from pystreams.protocol import consumer_protocol as cp
from pystreams.protocol import messages as m

log = logging.getLogger(__name__)

#: JoinGroup v4 is the first whose new dynamic members must take a member id first (KIP-394).
REQUIRES_KNOWN_MEMBER_ID_VERSION = 4


class ClassicMemberManager:
    def __init__(self, ctx: ShardContext, consumer: ConsumerGroupManager) -> None:
        self.ctx = ctx
        self.consumer = consumer
        #: Set by the shard: converts the group back when a classic static member replaces the
        #: last KIP-848 one (returns the classic group if it did; the replacement may lead it).
        self.downgrade_on_replacement: Callable[[ConsumerGroup, int, str | None], ClassicGroup | None] | None = None

    @property
    def config(self):
        return self.ctx.config

    # --- JoinGroup (Kafka's classicGroupJoinToConsumerGroup) -------------------------------------

    def join_group(self, request, now_ms: int, group: ConsumerGroup):
        version = request.API_VERSION or 0
        member_id = request.member_id or ""
        instance_id = request.group_instance_id if version >= 5 else None
        protocols = protocols_of(request)
        if member_id not in group.members and len(group.members) >= self.config.max_group_size:
            return join_response(version, error=Errors.GroupMaxSizeReachedError.errno)
        if not group.supports_classic_protocols(request.protocol_type, [name for name, _ in protocols]):
            return join_response(version, error=Errors.InconsistentGroupProtocolError.errno, member_id=member_id)
        try:
            subscription = self._subscription(protocols)
        except RequestError as refused:
            log.info("group %s: JoinGroup from %r refused: %s", group.group_id, member_id or instance_id, refused.message)
            return join_response(version, error=refused.code, member_id=member_id)
        if not member_id and instance_id is None and version >= REQUIRES_KNOWN_MEMBER_ID_VERSION:
            return join_response(version, error=Errors.MemberIdRequiredError.errno, member_id=self.ctx.new_member_id())

        replaced: ConsumerMember | None = None
        if instance_id is None:
            member_id = member_id or self.ctx.new_member_id()
            member = group.members.get(member_id)
        else:
            holder = group.static_members.get(instance_id)
            if member_id:
                if holder is None:
                    return join_response(version, error=Errors.UnknownMemberIdError.errno, member_id=member_id)
                if holder != member_id:
                    return join_response(version, error=Errors.FencedInstanceIdError.errno, member_id=member_id)
                member = group.members[member_id]
            elif holder is not None:
                replaced = group.members[holder]
                member = self.consumer.replace_static_member(group, replaced, self.ctx.new_member_id())
            else:
                member = None
            member_id = member.member_id if member is not None else self.ctx.new_member_id()
        is_new = member is None
        if member is None:
            member = ConsumerMember(member_id)

        classic = r.ClassicMemberMetadataValue(
            session_timeout_ms=request.session_timeout_ms,
            supported_protocols=[r.ClassicProtocolValue(name, metadata) for name, metadata in protocols],
        )
        updated = replace(
            member,
            instance_id=instance_id,
            rack_id=subscription.rack_id,
            rebalance_timeout_ms=request.rebalance_timeout_ms if version >= 1 else request.session_timeout_ms,
            subscribed_topic_names=tuple(sorted(set(subscription.topics))),
            subscribed_topic_regex=None,
            client_id=self.ctx.request.client_id,
            client_host=self.ctx.request.client_host,
            classic=classic,
            assignors=classic_assignors(classic),
        )
        bump = is_new or updated.subscribed_topic_names != member.subscribed_topic_names or updated.subscribed_topic_regex != member.subscribed_topic_regex
        if not bump and member.classic is not None and updated.assignors != member.assignors and self._is_settled(group, member):
            # A settled member rejoining with new metadata asks for a new assignment (a classic
            # member has no other way to); one that was told to rejoin is only following, and
            # one switching protocols keeps what it has.
            bump = True
        if is_new or updated != member:
            self.ctx.emit(r.MemberMetadata(group.group_id, member_id, updated.metadata_value(group.group_epoch)))
        if bump:
            self.consumer.refresh_subscription_metadata(group)
            self.consumer.bump_group_epoch(group)
        self.consumer.maybe_compute_target(group, now_ms)
        self.consumer.reconcile_member(group, group.members[member_id], self._owned(subscription), now_ms)
        member = group.members[member_id]
        # Its member epoch as the generation, its own first protocol, and no leader duties.
        answer = join_response(version, member_id=member_id, generation=member.member_epoch, protocol_type=CONSUMER, protocol_name=protocols[0][0])
        if replaced is not None and replaced.classic is None and self.downgrade_on_replacement is not None:
            skip_assignment = version >= SKIP_ASSIGNMENT_VERSION
            converted = self.downgrade_on_replacement(group, now_ms, member_id if skip_assignment else None)
            if converted is not None:
                if skip_assignment and converted.state is ClassicGroupState.STABLE:
                    # Now a static leader back without a rebalance (Kafka's answer to one).
                    return join_response(
                        version,
                        member_id=member_id,
                        generation=converted.generation,
                        protocol_type=converted.protocol_type,
                        protocol_name=converted.protocol_name,
                        leader=member_id,
                        members=member_list(converted, version),
                        skip_assignment=True,
                    )
                return answer
        self.ctx.cancel(ClassicMemberJoinTimer(group.group_id, member_id))
        self.ctx.schedule(SessionTimer(group.group_id, member_id), now_ms + request.session_timeout_ms)
        self.ctx.schedule(ClassicMemberSyncTimer(group.group_id, member_id), now_ms + member.rebalance_timeout_ms)
        return answer

    def _subscription(self, protocols) -> cp.Subscription:
        """The embedded subscription (every protocol carries the same one; the first is read).
        Every protocol must decode, since their userData reaches the assignors."""
        total = sum(len(metadata) for _, metadata in protocols)
        if total > self.config.max_assignor_metadata_bytes:
            raise RequestError(
                Errors.InvalidRequestError, f"protocol metadata is {total} bytes; at most {self.config.max_assignor_metadata_bytes} are accepted"
            )
        try:
            decoded = [cp.decode_subscription(metadata) for _, metadata in protocols]
        except cp.ConsumerProtocolError as error:
            raise RequestError(Errors.InconsistentGroupProtocolError, f"not the consumer embedded protocol: {error}") from None
        return decoded[0]

    def _owned(self, subscription: cp.Subscription) -> PartitionSet:
        """The partitions it reports owning, by topic id (topics we do not know are dropped)."""
        topics = self.ctx.topics
        return PartitionSet.from_pairs(
            (topics[name].topic_id, partition) for name, partitions in subscription.owned_partitions.items() if name in topics for partition in partitions
        )

    @staticmethod
    def _is_settled(group: ConsumerGroup, member: ConsumerMember) -> bool:
        return member.member_epoch == group.group_epoch and group.is_reconciled(member)

    # --- the member a request names (Kafka's validateConsumerGroupMember) ---------------------------

    def _classic_member(self, group: ConsumerGroup, member_id: str, instance_id: str | None) -> ConsumerMember:
        if instance_id is None:
            member = group.members.get(member_id)
            if member is None:
                raise RequestError(Errors.UnknownMemberIdError, f"Member {member_id} is not a member of group {group.group_id}.")
        else:
            holder = group.static_members.get(instance_id)
            if holder is None:
                raise RequestError(Errors.UnknownMemberIdError, f"Member with instance id {instance_id} is not a member of group {group.group_id}.")
            if member_id and holder != member_id:
                raise RequestError(Errors.FencedInstanceIdError, f"Instance id {instance_id} is now member {holder}; member {member_id} is fenced.")
            member = group.members[holder]
        if member.classic is None:
            raise RequestError(Errors.UnknownMemberIdError, f"Member {member.member_id} does not use the classic protocol.")
        return member

    @staticmethod
    def _must_rejoin(group: ConsumerGroup, member: ConsumerMember) -> bool:
        """A newer target than its epoch, partitions to revoke, or partitions it waits for that
        were released: it must rejoin to act on them."""
        if member.member_epoch < group.assignment_epoch or member.revoking:
            return True
        waiting = member.member_epoch == group.assignment_epoch and member.assigned != group.target_of(member.member_id)
        return waiting and not group.waiting_on_unreleased_partition(member)

    def _rebalance_in_progress(self, group: ConsumerGroup, member: ConsumerMember, now_ms: int) -> int:
        """REBALANCE_IN_PROGRESS, and its rebalance timeout to rejoin (if not counting already)."""
        key = ClassicMemberJoinTimer(group.group_id, member.member_id)
        if self.ctx.timers.deadline(key) is None:
            self.ctx.schedule(key, now_ms + member.rebalance_timeout_ms)
        return Errors.RebalanceInProgressError.errno

    # --- SyncGroup (Kafka's classicGroupSyncToConsumerGroup) --------------------------------------

    def sync_group(self, request, now_ms: int, group: ConsumerGroup):
        version = request.API_VERSION or 0
        try:
            member = self._classic_member(group, request.member_id, request.group_instance_id if version >= 3 else None)
        except RequestError as refused:
            return sync_response(refused.code)
        assert member.classic is not None, "_classic_member refuses the others"
        if request.generation_id != member.member_epoch:
            return sync_response(Errors.IllegalGenerationError.errno)
        first = member.classic.supported_protocols[0].name
        if (request.protocol_type is not None and request.protocol_type != CONSUMER) or (request.protocol_name is not None and request.protocol_name != first):
            return sync_response(Errors.InconsistentGroupProtocolError.errno)
        if member.member_epoch < group.assignment_epoch and not member.revoking:
            return sync_response(self._rebalance_in_progress(group, member, now_ms))
        self.ctx.cancel(ClassicMemberSyncTimer(group.group_id, member.member_id))
        self.ctx.schedule(SessionTimer(group.group_id, member.member_id), now_ms + member.classic.session_timeout_ms)
        return sync_response(protocol_type=request.protocol_type, protocol_name=request.protocol_name, assignment=self.assignment_bytes(group, member))

    def assignment_bytes(self, group: ConsumerGroup, member: ConsumerMember) -> bytes:
        """Its current assignment as a ConsumerProtocolAssignment at its subscription's version,
        with the assignor's classic (-1) output as userData."""
        names = {topic.topic_id: name for name, topic in self.ctx.topics.items()}
        names.update(group.topic_names_by_id())
        partitions = cp.named_partitions((names[topic_id], numbers) for topic_id, numbers in member.assigned.by_topic.items() if topic_id in names)
        user_data = member.metadata if member.metadata_version == CLASSIC_METADATA_VERSION else None
        assert member.classic is not None, "only classic members are answered with assignment bytes"
        version = cp.version_of(member.classic.supported_protocols[0].metadata)
        return cp.encode_assignment(cp.Assignment(partitions, user_data), version)

    # --- Heartbeat (Kafka's classicGroupHeartbeatToConsumerGroup) -----------------------------------

    def heartbeat(self, request, now_ms: int, group: ConsumerGroup):
        version = request.API_VERSION or 0
        try:
            member = self._classic_member(group, request.member_id, request.group_instance_id if version >= 3 else None)
        except RequestError as refused:
            return m.HeartbeatResponse(throttle_time_ms=0, error_code=refused.code)
        assert member.classic is not None, "_classic_member refuses the others"
        if request.generation_id != member.member_epoch:
            return m.HeartbeatResponse(throttle_time_ms=0, error_code=Errors.IllegalGenerationError.errno)
        self.ctx.schedule(SessionTimer(group.group_id, member.member_id), now_ms + member.classic.session_timeout_ms)
        if self._must_rejoin(group, member):
            return m.HeartbeatResponse(throttle_time_ms=0, error_code=self._rebalance_in_progress(group, member, now_ms))
        return m.HeartbeatResponse(throttle_time_ms=0, error_code=0)

    # --- LeaveGroup (Kafka's classicGroupLeaveToConsumerGroup) --------------------------------------

    def leave_group(self, request, now_ms: int, group: ConsumerGroup):
        version = request.API_VERSION or 0
        leaving = [(request.member_id, None)] if version < 3 else [(mb.member_id, mb.group_instance_id) for mb in request.members or ()]
        outcomes, removed = [], []
        for member_id, instance_id in leaving:
            try:
                member = self._classic_member(group, member_id, instance_id)
            except RequestError as refused:
                outcomes.append((member_id, instance_id, refused.code))
                continue
            if member not in removed:
                removed.append(member)
            outcomes.append((member.member_id, instance_id, 0))
        if removed:
            self.consumer.remove_members(group, removed, now_ms)
        return leave_response(version, 0, outcomes)
