"""Online migration: a classic group becomes a consumer group and back, without stopping
(KIP-848 "Supporting Online Consumer Group Upgrade"; Apache Kafka's convertToConsumerGroup and
convertToClassicGroup).

**Upgrade.** The first KIP-848 member joining a classic group converts it: the generation becomes
the group epoch and every member's last classic assignment becomes both its target and its
current assignment, so everyone is reconciled at epoch = generation. The joiner then joins as
usual (a new epoch, a new target) and the classic members follow through their own protocol.
Parked JoinGroups and SyncGroups are answered REBALANCE_IN_PROGRESS. An empty classic group is
simply replaced, whatever the policy; otherwise ``group.consumer.migration.policy`` must allow it,
the protocol type must be ``consumer`` and the group must fit ``group.consumer.max.size``, else
GROUP_ID_NOT_FOUND with the reason (Kafka's answer).

**Downgrade.** When the last KIP-848 member leaves or is fenced and only classic members remain
(or a classic static member replaces it), the group converts back: generation = group epoch,
each member's classic assignment is its *current* assignment (assigned and still revoking), and
a rebalance starts (for a static replacement only when some member has not reached its target;
else the replacement leads the classic group and is answered as a static leader back without a
rebalance, KIP-814, so that someone watches the topics). Kafka's fromConsumerGroup writes the
target instead; the two differ only for a member that has not reached it, and then the target
lists partitions another member still holds and omits ones this member still holds (a classic
member revoking before its LeaveGroup holds everything it was given until the LeaveGroup lands
or its session ends). The classic assignment is read back as the truth of who holds what: by an
upgrade (KIP-848: "the target assignment and the member assignments are created based on the
current assignment") that comes before the rebalance ends, and by a SyncGroup after a load
brings the group back Stable. Written as the target, the upgrade handed a partition to a second
member while its holder still processed it (simulator, migration seeds 101460, 103461, 104217,
104488, 104682), and a SyncGroup after a load could too. When every member has reached its
target the two are the same. A policy that forbids it is silent: the member is removed as usual.

Conversions are records, in Kafka's order, so a coordinator that dies mid-migration resumes from
whichever side the log ends on. Committed offsets are never touched.

Where Kafka and the KIP differ, the KIP wins: assignment userData survives both ways, as the
assignor's metadata at version -1 (Kafka drops it, or refuses to upgrade since KAFKA-18134).
"""

from __future__ import annotations

import copy
import logging

import kafka.errors as Errors

from pystreams.coordinator import records as r
from pystreams.coordinator.classic import ClassicGroupManager
from pystreams.coordinator.classic_group import ClassicGroup, ClassicGroupState, ClassicMember
from pystreams.coordinator.config import allows_downgrade, allows_upgrade
from pystreams.coordinator.consumer import ConsumerGroupManager
from pystreams.coordinator.consumer_group import CLASSIC_METADATA_VERSION, CONSUMER, ConsumerGroup, ConsumerMember
from pystreams.coordinator.context import ShardContext
from pystreams.coordinator.errors import RequestError
from pystreams.coordinator.timers import ComputationTimer, EmptyGroupTimer, SessionTimer
from pystreams.partitions import PartitionSet
from pystreams.protocol import consumer_protocol as cp

log = logging.getLogger(__name__)


class Migration:
    def __init__(self, ctx: ShardContext, consumer: ConsumerGroupManager, classic: ClassicGroupManager) -> None:
        self.ctx = ctx
        self.consumer = consumer
        self.classic = classic

    # --- upgrade ------------------------------------------------------------------------------

    def upgrade(self, group: ClassicGroup, request, now_ms: int) -> ConsumerGroup | None:
        group_id = group.group_id
        if group.is_empty:
            self.classic.delete(group)
            return None
        refusal = self._upgrade_refusal(group)
        if refusal is not None:
            raise RequestError(Errors.GroupIdNotFoundError, f"Cannot upgrade classic group {group_id} to consumer group because {refusal}.")
        members = [self._converted_member(group, member) for member in group.members.values()]
        self.classic.dissolve(group)  # parked requests answered, timers cancelled, tombstone
        _drop_double_owners(group_id, members)
        epoch = group.generation
        for member, _ in members:
            self.ctx.emit(r.MemberMetadata(group_id, member.member_id, member.metadata_value(epoch)))
        self.ctx.emit(r.GroupMetadata(group_id, r.GroupMetadataValue(epoch)))
        for member, _ in members:
            if member.assigned or member.metadata_version or member.metadata:
                value = r.TargetAssignmentMemberValue(member.assigned.to_wire(r.TopicPartitions), member.metadata_version, member.metadata)
                self.ctx.emit(r.TargetAssignmentMember(group_id, member.member_id, value))
        self.ctx.emit(r.TargetAssignmentMetadata(group_id, r.TargetAssignmentMetadataValue(epoch)))
        for member, _ in members:
            self.ctx.emit(r.CurrentAssignment(group_id, member.member_id, member.assignment_value()))
        for member, session_timeout_ms in members:
            self.ctx.schedule(SessionTimer(group_id, member.member_id), now_ms + session_timeout_ms)
        log.info("group %s upgraded from classic to consumer at epoch %d (%d members)", group_id, epoch, len(members))
        return self.ctx.groups[group_id]

    def _upgrade_refusal(self, group: ClassicGroup) -> str | None:
        policy = self.ctx.migration_policy(group.group_id)
        if not allows_upgrade(policy):
            return f"online upgrade is disabled (group.consumer.migration.policy={policy})"
        if group.protocol_type != CONSUMER:
            return f"the group does not use the consumer embedded protocol (its protocol type is {group.protocol_type!r})"
        if len(group.members) > self.ctx.config.max_group_size:
            return f"the group size ({len(group.members)}) exceeds the consumer group maximum size ({self.ctx.config.max_group_size})"
        for member in group.members.values():
            try:
                cp.decode_subscription(member.metadata(self._protocol_of(group, member)))
                cp.decode_assignment(member.assignment)
            except cp.ConsumerProtocolError as error:
                return f"the embedded consumer protocol of member {member.member_id} is malformed ({error})"
        return None

    @staticmethod
    def _protocol_of(group: ClassicGroup, member: ClassicMember) -> str:
        """The group's protocol, or (a group in its first rebalance has none) the member's first."""
        return group.protocol_name or member.protocols[0][0]

    def _converted_member(self, group: ClassicGroup, member: ClassicMember) -> tuple[ConsumerMember, int]:
        """Kafka's ConsumerGroup.fromClassicGroup for one member: reconciled at epoch =
        generation with its last classic assignment (userData kept, at version -1)."""
        subscription = cp.decode_subscription(member.metadata(self._protocol_of(group, member)))
        assignment = cp.decode_assignment(member.assignment)
        topics = self.ctx.topics

        def known(partitions_by_name) -> PartitionSet:
            return PartitionSet.from_pairs(
                (topics[name].topic_id, partition)
                for name, partitions in partitions_by_name.items()
                if name in topics
                for partition in partitions
                if 0 <= partition < topics[name].num_partitions
            )

        assigned = known(assignment.partitions)
        # A cooperative member keeps what it owns through a rebalance, while its assignment is
        # reset (or, just synced, no longer lists what it is revoking): what it reported owning
        # in its JoinGroup is still its own until it rejoins without it. Kafka's fromClassicGroup
        # reads the assignment only, and the joiner is handed those partitions at once.
        revoking = known(subscription.owned_partitions) - assigned
        classic = r.ClassicMemberMetadataValue(
            session_timeout_ms=member.session_timeout_ms,
            supported_protocols=[r.ClassicProtocolValue(name, metadata) for name, metadata in member.protocols],
        )
        converted = ConsumerMember(
            member_id=member.member_id,
            client_id=member.client_id,
            client_host=member.client_host,
            rebalance_timeout_ms=member.rebalance_timeout_ms,
            subscribed_topic_names=tuple(sorted(set(subscription.topics))),
            instance_id=member.instance_id,
            rack_id=subscription.rack_id,
            member_epoch=group.generation,
            previous_member_epoch=group.generation,
            assigned=assigned,
            revoking=revoking,
            metadata_version=CLASSIC_METADATA_VERSION if assignment.user_data else 0,
            metadata=assignment.user_data or b"",
            classic=classic,
        )
        return converted, member.session_timeout_ms

    # --- downgrade ----------------------------------------------------------------------------

    def maybe_downgrade(self, group: ConsumerGroup, leaving: ConsumerMember, now_ms: int) -> bool:
        """Kafka's validateOnlineDowngradeWithFencedMember, then the conversion and a rebalance."""
        if not group.all_classic_except(leaving.member_id) or len(group.members) <= 1:
            return False
        if not self._downgrade_allowed(group, len(group.members) - 1):
            return False
        converted = self._to_classic(group, exclude=leaving.member_id, now_ms=now_ms)
        if converted is None:
            return False
        self.classic.start_rebalance(converted, now_ms)
        return True

    def downgrade_on_replacement(self, group: ConsumerGroup, now_ms: int, leader: str | None = None) -> ClassicGroup | None:
        """A classic static member replaced the last KIP-848 one: convert, and rebalance only
        when some member has not reached its target yet. Returns the classic group (None: no
        conversion).

        ``leader`` (the replacement, when it can be told so: JoinGroup v9+) leads the classic
        group. Without a rebalance no classic member would otherwise know that it leads, and
        the leader is the one that watches the group's topics for new partitions (Kafka's
        ConsumerCoordinator): it is answered as a static leader back without a rebalance
        (KIP-814 SkipAssignment), keeps its assignment and watches from then on."""
        if not all(member.classic is not None for member in group.members.values()):
            return None
        if not self._downgrade_allowed(group, len(group.members)):
            return None
        settled = group.assignment_epoch == group.group_epoch and all(group.is_reconciled(m) for m in group.members.values())
        converted = self._to_classic(group, exclude=None, now_ms=now_ms, leader=leader)
        if converted is None:
            return None
        if not settled:
            # A target not yet reached moves a partition its holder has not revoked; the
            # classic assignments (what members hold) do not say where partitions go next, and
            # members below the group epoch must hear of the new generation. Kafka's snapshot
            # skips the rebalance here; newer Kafka rebalances when the target is stale
            # (KAFKA-19546, KAFKA-20273), and a target members have not reached is stale for
            # them too. The replacement's SyncGroup is then told REBALANCE_IN_PROGRESS and
            # every member rejoins with what it owns.
            self.classic.start_rebalance(converted, now_ms)
        return converted

    def _downgrade_allowed(self, group: ConsumerGroup, remaining: int) -> bool:
        policy = self.ctx.migration_policy(group.group_id)
        if not allows_downgrade(policy):
            log.info("group %s: only classic members remain, but group.consumer.migration.policy=%s keeps it a consumer group", group.group_id, policy)
            return False
        if remaining > self.ctx.config.classic_max_group_size:
            log.info(
                "group %s: %d classic members exceed group.max.size %d; it stays a consumer group",
                group.group_id,
                remaining,
                self.ctx.config.classic_max_group_size,
            )
            return False
        return True

    def _to_classic(self, group: ConsumerGroup, exclude: str | None, now_ms: int, leader: str | None = None) -> ClassicGroup | None:
        """Kafka's ClassicGroup.fromConsumerGroup and convertToClassicGroup: every member but
        ``exclude``, generation = group epoch, each member's current assignment (what it holds,
        where Kafka writes its target) as its classic assignment; ``leader`` leads (else the
        first member, as in Kafka)."""
        group_id = group.group_id
        classic = ClassicGroup(group_id, state=ClassicGroupState.STABLE, current_state_timestamp=now_ms, generation=group.group_epoch, protocol_type=CONSUMER)
        for member in group.members.values():
            if member.member_id == exclude:
                continue
            assert member.classic is not None, "callers convert only groups whose other members are all classic"
            classic.add(
                ClassicMember(
                    member_id=member.member_id,
                    instance_id=member.instance_id,
                    client_id=member.client_id,
                    client_host=member.client_host,
                    rebalance_timeout_ms=member.rebalance_timeout_ms,
                    session_timeout_ms=member.classic.session_timeout_ms,
                    protocol_type=CONSUMER,
                    protocols=tuple((p.name, p.metadata) for p in member.classic.supported_protocols),
                )
            )
        if leader is not None and leader in classic.members:
            classic.leader_id = leader
        try:
            classic.protocol_name = classic.select_protocol()
        except AssertionError:
            log.warning("group %s: its classic members share no protocol; it stays a consumer group", group_id)
            return None
        names = {topic.topic_id: name for name, topic in self.ctx.topics.items()}
        names.update(group.topic_names_by_id())
        for classic_member in classic.members.values():
            member = group.members[classic_member.member_id]
            # What the member holds (its current assignment, revocations included), not its
            # target: see the module docstring.
            partitions = (member.assigned | member.revoking).by_topic
            user_data = member.metadata if member.metadata_version == CLASSIC_METADATA_VERSION else None
            classic_member.assignment = cp.encode_assignment(
                cp.Assignment(cp.named_partitions((names[t], ps) for t, ps in partitions.items() if t in names), user_data),
                cp.version_of(classic_member.metadata(classic.protocol_name)),
            )
        for member_id in group.members:
            self.consumer.cancel_member_timers(group_id, member_id)
        self.ctx.cancel(ComputationTimer(group_id))
        self.ctx.cancel(EmptyGroupTimer(group_id))
        self.consumer.end_computation(group_id)
        self._emit_tombstones(group)
        self.classic.install(classic, now_ms)
        log.info("group %s downgraded from consumer to classic at generation %d (%d members)", group_id, classic.generation, len(classic.members))
        return classic

    def _emit_tombstones(self, group: ConsumerGroup) -> None:
        """Kafka's createGroupTombstoneRecords, in its order."""
        group_id, member_ids = group.group_id, list(group.members)
        for member_id in member_ids:
            self.ctx.emit(r.CurrentAssignment(group_id, member_id, None))
        for member_id in member_ids:
            self.ctx.emit(r.TargetAssignmentMember(group_id, member_id, None))
        self.ctx.emit(r.TargetAssignmentMetadata(group_id, None))
        for member_id in member_ids:
            self.ctx.emit(r.MemberMetadata(group_id, member_id, None))
        self.ctx.emit(r.PartitionMetadata(group_id, None))
        self.ctx.emit(r.GroupMetadata(group_id, None))


def _drop_double_owners(group_id: str, members: list[tuple[ConsumerMember, int]]) -> None:
    """A classic leader may have handed a partition to two members; the consumer group gives
    each partition one holder, so it stays with the first and the others lose it. A partition
    assigned to one member and reported owned by another stays with the assignee."""
    held: set = set()
    for index, (member, session) in enumerate(members):
        duplicates = PartitionSet.from_pairs(pair for pair in member.assigned if pair in held)
        if duplicates:
            log.warning(
                "group %s: member %s's classic assignment repeats %d partition(s) held by another member; they are dropped",
                group_id,
                member.member_id,
                len(duplicates),
            )
            member = copy.copy(member)
            member.assigned = member.assigned - duplicates
            members[index] = (member, session)
        held.update(member.assigned)
    for index, (member, session) in enumerate(members):
        claimed = PartitionSet.from_pairs(pair for pair in member.revoking if pair in held)
        if claimed:
            member = copy.copy(member)
            member.revoking = member.revoking - claimed
            members[index] = (member, session)
        held.update(member.revoking)
