"""The consumer group (KIP-848 "Data Model") and how records change it.

Nothing here decides anything: handlers in ``consumer.py`` generate records, and ``replay``
applies a record to the model — live, and identically when a shard loads its log.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from uuid import UUID

from pystreams import partitions as tp
from pystreams.coordinator import records as r

#: The epoch a static member holds while it is away (KIP-848 "Static Membership").
LEAVE_STATIC_EPOCH = -2
LEAVE_EPOCH = -1

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
    partitions: tp.Partitions
    metadata_version: int = 0
    metadata: bytes = b""


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
    assigned: tp.Partitions = field(default_factory=dict)
    revoking: tp.Partitions = field(default_factory=dict)
    error: int = 0
    metadata_version: int = 0
    metadata: bytes = b""

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
            assignors=list(self.assignors),
        )

    def assignment_value(self) -> r.CurrentAssignmentValue:
        return r.CurrentAssignmentValue(
            member_epoch=self.member_epoch,
            previous_member_epoch=self.previous_member_epoch,
            assigned=_to_record(self.assigned),
            revoking=_to_record(self.revoking),
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
    offsets: dict[tuple[str, int], r.OffsetCommitValue] = field(default_factory=dict)

    group_type = CONSUMER

    # --- derived views ---------------------------------------------------------------------

    def target_of(self, member_id: str) -> tp.Partitions:
        target = self.targets.get(member_id)
        return target.partitions if target is not None else tp.EMPTY

    def is_reconciled(self, member: ConsumerMember) -> bool:
        return (
            member.member_epoch in (self.assignment_epoch, LEAVE_STATIC_EPOCH)
            and not member.revoking
            and dict(member.assigned) == dict(self.target_of(member.member_id))
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

    def topic_names_by_id(self) -> dict[UUID, str]:
        return {t.topic_id: t.name for t in self.subscribed_topics.values()}

    def is_free_for(self, member_id: str, topic_id: UUID, partition: int) -> bool:
        owner = self.owners.get((topic_id, partition))
        return owner is None or owner == member_id

    # --- replay -----------------------------------------------------------------------------

    def replay(self, key: r.RecordKey, value: r.RecordValue | None) -> None:
        if isinstance(key, r.GroupMetadataKey):
            self.group_epoch = value.epoch
        elif isinstance(key, r.PartitionMetadataKey):
            self.subscribed_topics = {t.name: t for t in value.topics} if value else {}
        elif isinstance(key, r.MemberMetadataKey):
            self._replay_member_metadata(key.member_id, value)
        elif isinstance(key, r.TargetAssignmentMetadataKey):
            if value is None:
                self.assignment_epoch, self.assignment_error = 0, 0
            else:
                self.assignment_epoch, self.assignment_error = value.assignment_epoch, value.error
        elif isinstance(key, r.TargetAssignmentMemberKey):
            if value is None:
                self.targets.pop(key.member_id, None)
            else:
                self.targets[key.member_id] = TargetMember(_from_record(value.partitions), value.metadata_version, value.metadata)
        elif isinstance(key, r.CurrentAssignmentKey):
            self._replay_current_assignment(key.member_id, value)
        elif isinstance(key, r.OffsetCommitKey):
            if value is None:
                self.offsets.pop((key.topic, key.partition), None)
            else:
                self.offsets[(key.topic, key.partition)] = value
        else:  # pragma: no cover - the shard routes only group records here
            raise TypeError(f"not a consumer group record: {key!r}")

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
        member.assignors = tuple(value.assignors)
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
            member.assigned, member.revoking = {}, {}
            member.error, member.metadata_version, member.metadata = 0, 0, b""
            return
        member.member_epoch = value.member_epoch
        member.previous_member_epoch = value.previous_member_epoch
        member.assigned = _from_record(value.assigned)
        member.revoking = _from_record(value.revoking)
        member.error = value.error
        member.metadata_version = value.metadata_version
        member.metadata = value.metadata
        for holding in (member.assigned, member.revoking):
            for pair in tp.pairs(holding):
                holder = self.owners.get(pair)
                if holder is not None and holder != member_id:
                    raise AssertionError(f"partition {pair} handed to {member_id} while {holder} holds it")
                self.owners[pair] = member_id

    def _release(self, member: ConsumerMember) -> None:
        for holding in (member.assigned, member.revoking):
            for pair in tp.pairs(holding):
                if self.owners.get(pair) == member.member_id:
                    del self.owners[pair]

    # --- comparison (tests, simulation: replayed state == live state) -------------------------

    def snapshot(self) -> dict:
        """Everything records determine, as plain data."""
        return {
            "group_epoch": self.group_epoch,
            "assignment_epoch": self.assignment_epoch,
            "assignment_error": self.assignment_error,
            "subscribed_topics": dict(self.subscribed_topics),
            "static_members": dict(self.static_members),
            "members": {
                mid: (m.metadata_value(0), m.assignment_value()) for mid, m in sorted(self.members.items())
            },
            "targets": {
                mid: (dict(t.partitions), t.metadata_version, t.metadata) for mid, t in sorted(self.targets.items())
            },
            "owners": dict(self.owners),
            "offsets": dict(self.offsets),
        }


def _to_record(partitions: tp.Partitions) -> list[r.TopicPartitions]:
    return [r.TopicPartitions(topic, sorted(partitions[topic])) for topic in sorted(partitions)]


def _from_record(items: list[r.TopicPartitions]) -> dict[UUID, frozenset[int]]:
    return {item.topic_id: frozenset(item.partitions) for item in items if item.partitions}


to_record_partitions = _to_record
