"""The consumer group (KIP-848 "Data Model") and how records change it.

Nothing here decides anything: the manager in ``consumer.py`` generates records, and ``replay``
applies a record to the model — live, and identically when a shard loads its log. ``pre_image``
is replay's inverse for one key: the record that restores what the key holds now.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from uuid import UUID

import kafka.errors as Errors

from pystreams.coordinator import records as r
from pystreams.coordinator.errors import RequestError
from pystreams.partitions import NO_PARTITIONS, PartitionSet
from pystreams.protocol.consumer_protocol import ConsumerProtocolError, decode_subscription
from pystreams.protocol.sentinels import LEAVE_STATIC_EPOCH

#: The metadata version a classic member's subscription userData reaches client-side assignors
#: at, and its assignment userData comes back at (KIP-848 "Kafka Streams Migration").
CLASSIC_METADATA_VERSION = -1

CONSUMER = "consumer"
CLASSIC = "classic"


class GroupState(enum.Enum):
    """The states of KIP-848 "Consumer Group States"; values are Kafka's display names."""

    EMPTY = "Empty"
    ASSIGNING = "Assigning"
    RECONCILING = "Reconciling"
    STABLE = "Stable"
    DEAD = "Dead"


@dataclass(slots=True)
class TargetMember:
    partitions: PartitionSet
    metadata_version: int = 0
    metadata: bytes = b""

    def value(self) -> r.TargetAssignmentMemberValue:
        return r.TargetAssignmentMemberValue(self.partitions.to_wire(r.TopicPartitions), self.metadata_version, self.metadata)


@dataclass(slots=True)
class ConsumerMember:
    member_id: str
    client_id: str = ""
    client_host: str = ""
    rebalance_timeout_ms: int = -1
    subscribed_topic_names: tuple[str, ...] = ()
    subscribed_topic_regex: str | None = None
    instance_id: str | None = None
    rack_id: str | None = None
    server_assignor: str | None = None
    assignors: tuple[r.AssignorValue, ...] = ()
    # The current assignment (CurrentAssignment record).
    member_epoch: int = 0
    previous_member_epoch: int = -1
    assigned: PartitionSet = NO_PARTITIONS
    revoking: PartitionSet = NO_PARTITIONS
    error: int = 0
    metadata_version: int = 0
    metadata: bytes = b""
    #: Set while the member speaks the classic protocol (online migration): its session timeout
    #: and every JoinGroup protocol. Its ``assignors`` are then derived from those protocols.
    classic: r.ClassicMemberMetadataValue | None = None

    @property
    def uses_classic_protocol(self) -> bool:
        return self.classic is not None

    def classic_protocol_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.classic.supported_protocols) if self.classic is not None else ()

    def metadata_value(self, group_epoch: int) -> r.MemberMetadataValue:
        return r.MemberMetadataValue(
            group_epoch=group_epoch,
            client_id=self.client_id,
            client_host=self.client_host,
            rebalance_timeout_ms=self.rebalance_timeout_ms,
            subscribed_topic_names=list(self.subscribed_topic_names),
            instance_id=self.instance_id,
            rack_id=self.rack_id,
            subscribed_topic_regex=self.subscribed_topic_regex,
            server_assignor=self.server_assignor,
            assignors=list(self.assignors) if self.classic is None else [],
            classic_member=self.classic,
        )

    def assignment_value(self) -> r.CurrentAssignmentValue:
        return r.CurrentAssignmentValue(
            member_epoch=self.member_epoch,
            previous_member_epoch=self.previous_member_epoch,
            assigned=self.assigned.to_wire(r.TopicPartitions),
            revoking=self.revoking.to_wire(r.TopicPartitions),
            error=self.error,
            metadata_version=self.metadata_version,
            metadata=self.metadata,
        )

    def assignor(self, name: str) -> r.AssignorValue | None:
        for assignor in self.assignors:
            if assignor.name == name:
                return assignor
        return None


@dataclass(slots=True)
class ConsumerGroup:
    group_id: str
    group_epoch: int = 0
    members: dict[str, ConsumerMember] = field(default_factory=dict)
    static_members: dict[str, str] = field(default_factory=dict)  # instance id -> member id
    #: Metadata of the subscribed topics, by topic name (the PartitionMetadata record).
    subscribed_topics: dict[str, r.TopicMetadataValue] = field(default_factory=dict)
    assignment_epoch: int = 0
    assignment_error: int = 0
    targets: dict[str, TargetMember] = field(default_factory=dict)
    #: Who holds each partition (assigned or still revoking): a partition has one holder.
    owners: dict[tuple[UUID, int], str] = field(default_factory=dict)

    group_type = CONSUMER

    # --- derived views ---------------------------------------------------------------------

    def target_of(self, member_id: str) -> PartitionSet:
        target = self.targets.get(member_id)
        return target.partitions if target is not None else NO_PARTITIONS

    def is_reconciled(self, member: ConsumerMember) -> bool:
        return (
            member.member_epoch in (self.assignment_epoch, LEAVE_STATIC_EPOCH) and not member.revoking and member.assigned == self.target_of(member.member_id)
        )

    @property
    def state(self) -> GroupState:
        if not self.members:
            return GroupState.EMPTY
        if self.group_epoch > self.assignment_epoch:
            return GroupState.ASSIGNING
        if all(self.is_reconciled(m) for m in self.members.values()):
            return GroupState.STABLE
        return GroupState.RECONCILING

    @property
    def is_empty(self) -> bool:
        return not self.members

    def topic_names_by_id(self) -> dict[UUID, str]:
        return {t.topic_id: t.name for t in self.subscribed_topics.values()}

    def is_free_for(self, member_id: str, topic_id: UUID, partition: int) -> bool:
        owner = self.owners.get((topic_id, partition))
        return owner is None or owner == member_id

    # --- classic members (online migration) ----------------------------------------------

    def classic_members(self) -> list[ConsumerMember]:
        return [member for member in self.members.values() if member.classic is not None]

    def all_classic_except(self, member_id: str) -> bool:
        """Every member but ``member_id`` speaks the classic protocol, and ``member_id`` does not
        (Kafka's allMembersUseClassicProtocolExcept)."""
        member = self.members.get(member_id)
        return (
            member is not None and member.classic is None and all(other.classic is not None for other in self.members.values() if other.member_id != member_id)
        )

    def supports_classic_protocols(self, protocol_type: str, names: list[str]) -> bool:
        """A classic JoinGroup fits this group: protocol type ``consumer``, and (unless the group
        is empty) one offered protocol every classic member offers too."""
        if protocol_type != CONSUMER or not names:
            return False
        classic = self.classic_members()
        if not classic:
            return True
        return any(all(name in member.classic_protocol_names() for member in classic) for name in names)

    def waiting_on_unreleased_partition(self, member: ConsumerMember) -> bool:
        """Some partition of the member's target is still held by another member."""
        return any(not self.is_free_for(member.member_id, *pair) for pair in self.target_of(member.member_id) - member.assigned)

    # --- offsets (Kafka's Group.validateOffsetCommit / validateOffsetFetch) ------------------

    def validate_offset_commit(self, member_id: str, member_epoch: int, instance_id: str | None = None) -> None:
        """A member commits with its member epoch: a newer one is FENCED, an older one STALE; a
        classic member commits with its generation (= its member epoch), any other is
        ILLEGAL_GENERATION. Admin tools commit with no member and epoch -1, only while the
        group has no members."""
        if member_epoch < 0 and not member_id:
            if self.members:
                raise RequestError(Errors.UnknownMemberIdError, "Commits without a member are only accepted while the group has no members.")
            return
        member = self._member_for_offsets(member_id, instance_id)
        if member.classic is not None:
            if member_epoch != member.member_epoch:
                raise RequestError(Errors.IllegalGenerationError, f"Generation {member_epoch} is not member {member_id}'s {member.member_epoch}.")
            return
        self._validate_member_epoch(member, member_epoch)

    def validate_offset_fetch(self, member_id: str | None, member_epoch: int) -> None:
        if member_id or member_epoch >= 0:
            member = self._member_for_offsets(member_id or "", None)
            if member.classic is None:
                self._validate_member_epoch(member, member_epoch)

    def _member_for_offsets(self, member_id: str, instance_id: str | None) -> ConsumerMember:
        if instance_id is not None:
            holder = self.static_members.get(instance_id)
            if holder is not None and holder != member_id:
                raise RequestError(Errors.FencedInstanceIdError, f"Instance id {instance_id} is now member {holder}; member {member_id} is fenced.")
        member = self.members.get(member_id)
        if member is None:
            raise RequestError(Errors.UnknownMemberIdError, f"Member {member_id!r} is not a member of group {self.group_id}.")
        return member

    def _validate_member_epoch(self, member: ConsumerMember, member_epoch: int) -> None:
        if member_epoch > member.member_epoch:
            raise RequestError(Errors.FencedMemberEpochError, f"Member epoch {member_epoch} is newer than the coordinator's {member.member_epoch}.")
        if member_epoch < member.member_epoch:
            raise RequestError(Errors.StaleMemberEpochError, f"Member epoch {member_epoch} is stale; the member's epoch is {member.member_epoch}.")

    # --- replay -----------------------------------------------------------------------------

    def replay(self, record: r.Record) -> None:
        match record:
            case r.GroupMetadata(value=value):
                self.group_epoch = value.epoch if value is not None else 0
            case r.PartitionMetadata(value=value):
                self.subscribed_topics = {t.name: t for t in value.topics} if value else {}
            case r.MemberMetadata(member_id=member_id, value=value):
                self._replay_member_metadata(member_id, value)
            case r.TargetAssignmentMetadata(value=None):
                self.assignment_epoch, self.assignment_error = 0, 0
            case r.TargetAssignmentMetadata(value=r.TargetAssignmentMetadataValue() as value):
                self.assignment_epoch, self.assignment_error = value.assignment_epoch, value.error
            case r.TargetAssignmentMember(member_id=member_id, value=None):
                self.targets.pop(member_id, None)
            case r.TargetAssignmentMember(member_id=member_id, value=r.TargetAssignmentMemberValue() as value):
                self.targets[member_id] = TargetMember(PartitionSet.from_wire(value.partitions), value.metadata_version, value.metadata)
            case r.CurrentAssignment(member_id=member_id, value=value):
                self._replay_current_assignment(member_id, value)
            case _:  # pragma: no cover - the shard routes only consumer group records here
                raise TypeError(f"not a consumer group record: {record!r}")

    def pre_image(self, record: r.Record) -> r.Record:
        """The record that restores what ``record``'s key holds in this group now."""
        g = self.group_id
        match record:
            case r.GroupMetadata():
                return r.GroupMetadata(g, r.GroupMetadataValue(self.group_epoch, self.group_type))
            case r.PartitionMetadata():
                topics = list(self.subscribed_topics.values())
                return r.PartitionMetadata(g, r.PartitionMetadataValue(topics) if topics else None)
            case r.MemberMetadata(member_id=member_id):
                member = self.members.get(member_id)
                return r.MemberMetadata(g, member_id, member.metadata_value(self.group_epoch) if member else None)
            case r.TargetAssignmentMetadata():
                return r.TargetAssignmentMetadata(g, r.TargetAssignmentMetadataValue(self.assignment_epoch, self.assignment_error))
            case r.TargetAssignmentMember(member_id=member_id):
                target = self.targets.get(member_id)
                return r.TargetAssignmentMember(g, member_id, target.value() if target else None)
            case r.CurrentAssignment(member_id=member_id):
                member = self.members.get(member_id)
                return r.CurrentAssignment(g, member_id, member.assignment_value() if member else None)
        raise TypeError(f"not a consumer group record: {record!r}")  # pragma: no cover

    def _replay_member_metadata(self, member_id: str, value: r.MemberMetadataValue | None) -> None:
        member = self.members.get(member_id)
        if value is None:
            if member is not None:
                self._release(member)
                del self.members[member_id]
                if member.instance_id is not None and self.static_members.get(member.instance_id) == member_id:
                    del self.static_members[member.instance_id]
            return
        if member is None:
            member = self.members[member_id] = ConsumerMember(member_id)
        if member.instance_id is not None and member.instance_id != value.instance_id:
            self.static_members.pop(member.instance_id, None)
        member.client_id = value.client_id
        member.client_host = value.client_host
        member.rebalance_timeout_ms = value.rebalance_timeout_ms
        member.subscribed_topic_names = tuple(value.subscribed_topic_names)
        member.subscribed_topic_regex = value.subscribed_topic_regex
        member.instance_id = value.instance_id
        member.rack_id = value.rack_id
        member.server_assignor = value.server_assignor
        member.classic = value.classic_member
        member.assignors = tuple(value.assignors) if value.classic_member is None else classic_assignors(value.classic_member)
        if value.instance_id is not None:
            self.static_members[value.instance_id] = member_id

    def _replay_current_assignment(self, member_id: str, value: r.CurrentAssignmentValue | None) -> None:
        member = self.members.get(member_id)
        if member is None:
            # Tombstones follow the member's metadata tombstone, which released everything.
            return
        self._release(member)
        if value is None:
            member.member_epoch, member.previous_member_epoch = 0, -1
            member.assigned, member.revoking = NO_PARTITIONS, NO_PARTITIONS
            member.error, member.metadata_version, member.metadata = 0, 0, b""
            return
        member.member_epoch = value.member_epoch
        member.previous_member_epoch = value.previous_member_epoch
        member.assigned = PartitionSet.from_wire(value.assigned)
        member.revoking = PartitionSet.from_wire(value.revoking)
        member.error = value.error
        member.metadata_version = value.metadata_version
        member.metadata = value.metadata
        for holding in (member.assigned, member.revoking):
            for pair in holding:
                holder = self.owners.get(pair)
                if holder is not None and holder != member_id:
                    raise AssertionError(f"partition {pair} handed to {member_id} while {holder} holds it")
                self.owners[pair] = member_id

    def _release(self, member: ConsumerMember) -> None:
        for holding in (member.assigned, member.revoking):
            for pair in holding:
                if self.owners.get(pair) == member.member_id:
                    del self.owners[pair]

    # --- comparison (tests, simulation: replayed state == live state) -------------------------

    def snapshot(self) -> dict:
        """Everything records determine, as plain data."""
        return {
            "group_type": self.group_type,
            "group_epoch": self.group_epoch,
            "assignment_epoch": self.assignment_epoch,
            "assignment_error": self.assignment_error,
            "subscribed_topics": dict(self.subscribed_topics),
            "static_members": dict(self.static_members),
            "members": {mid: (m.metadata_value(0), m.assignment_value()) for mid, m in sorted(self.members.items())},
            "targets": {mid: (t.partitions, t.metadata_version, t.metadata) for mid, t in sorted(self.targets.items())},
            "owners": dict(self.owners),
        }


def classic_assignors(classic: r.ClassicMemberMetadataValue) -> tuple[r.AssignorValue, ...]:
    """A classic member as client-side assignors see it: each JoinGroup protocol is an assignor
    of that name whose only version is -1 and whose metadata is the subscription's userData."""
    assignors = []
    for protocol in classic.supported_protocols:
        try:
            user_data = decode_subscription(protocol.metadata).user_data or b""
        except ConsumerProtocolError:
            user_data = b""  # refused at join time; a record is never refused on replay
        assignors.append(r.AssignorValue(protocol.name, CLASSIC_METADATA_VERSION, CLASSIC_METADATA_VERSION, 0, CLASSIC_METADATA_VERSION, user_data))
    return tuple(assignors)
