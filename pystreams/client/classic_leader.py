"""The classic group leader's one job: every member's assignment, from the JoinGroup member list.

The coordinator of a classic group elects a leader and hands it every member's subscription for
the selected protocol; the leader runs that protocol's assignor and sends the result back in its
SyncGroup (Kafka's ``ConsumerCoordinator.onLeaderElected``). Here the assignor is one of
pystreams' own, fed the same :class:`~pystreams.assignors.api.AssignmentSpec` a KIP-848 assignor
gets:

* a server-style assignor (``range``, ``uniform``) sees each member's subscribed topic ids, rack
  and, as the partitions to stick to, the target this leader computed last generation when it
  did, else the partitions the member says it owns;
* a client-side assignor (the KIP's ``ClientAssignor``) also sees each member's subscription
  ``userData`` as its metadata at version **-1**, KIP-848's rule for classic members, and its
  per-member metadata goes back as the assignment's ``userData``.

**Cooperative (KIP-429) two-phase moves.** Under the cooperative protocol a partition that the
assignor moves from its current owner to another member is left out of the new owner's
assignment this generation: the owner sees it gone, revokes it and rejoins, and the rebalance
that follows hands it over. The rule is applied here for every assignor, so none has to know
the protocol (Kafka makes each cooperative assignor do it and checks the result). A partition
two members claim to own is withheld from both until they have let it go.

An assignment is written at the version of the member's own subscription, so an older client
reads it. The assignor raising :class:`PartitionAssignorError` keeps every member on what it
owns, as KIP-848 keeps the target when a client-side assignor fails.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol
from uuid import UUID

from pystreams.assignors.api import (
    AssignmentSpec,
    AssignorMetadata,
    ClientAssignor,
    GroupAssignment,
    MemberSpec,
    PartitionAssignorError,
    ServerAssignor,
    TopicMetadata,
)
from pystreams.client.topics import TopicResolver
from pystreams.partitions import NO_PARTITIONS, PartitionSet
from pystreams.protocol.consumer_protocol import (
    Assignment,
    ConsumerProtocolError,
    NamedPartitions,
    Subscription,
    decode_subscription,
    encode_assignment,
    named_partitions,
)

log = logging.getLogger(__name__)

#: The assignor metadata version a classic member's subscription userData is seen at (KIP-848).
CLASSIC_METADATA_VERSION = -1


class RebalanceProtocol(enum.Enum):
    """Kafka's ``RebalanceProtocol``: EAGER revokes everything before every rejoin; COOPERATIVE
    (KIP-429) revokes only what moves, then rejoins."""

    EAGER = "eager"
    COOPERATIVE = "cooperative"


@dataclass(frozen=True)
class JoinedMember:
    """One entry of the leader's JoinGroup response, decoded."""

    member_id: str
    instance_id: str | None
    #: None when the member's metadata is not a consumer-protocol subscription.
    subscription: Subscription | None


@dataclass(frozen=True)
class LeaderAssignment:
    #: SyncGroup's assignments: member id -> ConsumerProtocolAssignment bytes.
    assignments: dict[str, bytes]
    #: What the assignor decided (before the cooperative withholding): next generation's stickiness.
    targets: dict[str, PartitionSet]
    #: Partition count of every topic the group subscribes to (None: unknown), for the metadata watch.
    topic_partition_counts: dict[str, int | None]


class JoinGroupMemberWire(Protocol):
    """A JoinGroupResponse member as kafka-python decodes it (its structs are untyped)."""

    member_id: str
    group_instance_id: str | None
    metadata: bytes


def decode_members(members: Sequence[JoinGroupMemberWire]) -> list[JoinedMember]:
    """JoinGroupResponse.members, with each member's subscription decoded (None if malformed)."""
    joined = []
    for member in members:
        try:
            subscription: Subscription | None = decode_subscription(bytes(member.metadata))
        except ConsumerProtocolError as error:
            log.warning("member %s sent a subscription that cannot be read (%s); it gets no partitions", member.member_id, error)
            subscription = None
        joined.append(JoinedMember(member.member_id, member.group_instance_id, subscription))
    return joined


def to_ids(named: NamedPartitions, topics: TopicResolver) -> PartitionSet:
    """Named partitions as a ``PartitionSet``; topics the resolver does not know are left out."""
    by_id: dict[UUID, frozenset[int]] = {}
    for name, numbers in named.items():
        topic = topics.topic(name)
        if topic is not None:
            by_id[topic.topic_id] = numbers
    return PartitionSet(by_id)


def to_names(partitions: PartitionSet, topics: Mapping[UUID, TopicMetadata] | TopicResolver) -> NamedPartitions:
    pairs = []
    for topic_id, numbers in partitions.by_topic.items():
        if isinstance(topics, Mapping):
            name = topics[topic_id].name if topic_id in topics else None
        else:
            name = topics.name_of(topic_id)
        if name is not None:
            pairs.append((name, numbers))
    return named_partitions(pairs)


def assign_group(
    assignor: ServerAssignor | ClientAssignor,
    *,
    client_side: bool,
    members: Sequence[JoinedMember],
    topics: TopicResolver,
    protocol: RebalanceProtocol,
    previous_targets: Mapping[str, PartitionSet] | None = None,
) -> LeaderAssignment:
    """Run ``assignor`` (``assign(spec) -> GroupAssignment``) over the joined members."""
    subscribed_names = sorted({name for m in members if m.subscription for name in m.subscription.topics})
    counts: dict[str, int | None] = {}
    topic_table: dict[UUID, TopicMetadata] = {}
    for name in subscribed_names:
        topic = topics.topic(name)
        counts[name] = None if topic is None else topic.num_partitions
        if topic is not None:
            topic_table[topic.topic_id] = topic

    owned = {m.member_id: to_ids(m.subscription.owned_partitions, topics) if m.subscription else NO_PARTITIONS for m in members}
    spec_members: dict[str, MemberSpec] = {}
    for member in members:
        subscription = member.subscription
        topic_ids = frozenset(t.topic_id for name in (subscription.topics if subscription else ()) if (t := topics.topic(name)) is not None)
        sticky_to = owned[member.member_id]
        if previous_targets is not None and member.member_id in previous_targets:
            sticky_to = previous_targets[member.member_id]
        metadata = None
        if client_side:
            metadata = AssignorMetadata(
                reason=0,
                version=CLASSIC_METADATA_VERSION,
                data=(subscription.user_data or b"") if subscription else b"",
                minimum_version=CLASSIC_METADATA_VERSION,
                maximum_version=CLASSIC_METADATA_VERSION,
            )
        spec_members[member.member_id] = MemberSpec(
            subscribed_topic_ids=topic_ids,
            target_partitions=sticky_to.by_topic,
            instance_id=member.instance_id,
            rack_id=subscription.rack_id if subscription else None,
            metadata=metadata,
        )
    spec = AssignmentSpec(members=spec_members, topics=topic_table)

    result: GroupAssignment | None
    try:
        result = assignor.assign(spec)
    except PartitionAssignorError as error:
        log.error("assignor %s failed (%s); every member keeps what it owns", getattr(assignor, "name", assignor), error)
        result = None

    targets: dict[str, PartitionSet] = {}
    user_data: dict[str, bytes | None] = {}
    for member in members:
        entry = result.members.get(member.member_id) if result is not None else None
        if entry is None:
            targets[member.member_id] = owned[member.member_id]
            user_data[member.member_id] = None
        else:
            targets[member.member_id] = PartitionSet.of(entry.partitions) & _known(topic_table)
            user_data[member.member_id] = bytes(entry.metadata) if client_side and entry.metadata else None

    handed = targets
    if protocol is RebalanceProtocol.COOPERATIVE:
        handed = _withhold_moving_partitions(targets, owned)

    assignments = {}
    for member in members:
        version = member.subscription.version if member.subscription else 0
        assignments[member.member_id] = encode_assignment(
            Assignment(partitions=to_names(handed[member.member_id], topic_table), user_data=user_data[member.member_id]),
            version,
        )
    return LeaderAssignment(assignments=assignments, targets=targets, topic_partition_counts=counts)


def _known(topic_table: Mapping[UUID, TopicMetadata]) -> PartitionSet:
    """Every partition of the known topics: an assignor's output is clipped to it."""
    return PartitionSet({topic_id: range(topic.num_partitions) for topic_id, topic in topic_table.items()})


def _withhold_moving_partitions(targets: Mapping[str, PartitionSet], owned: Mapping[str, PartitionSet]) -> dict[str, PartitionSet]:
    """KIP-429's first phase: a member gets no partition that another member still owns."""
    claimants: dict[tuple[UUID, int], set[str]] = {}
    for member_id, partitions in owned.items():
        for partition in partitions:
            claimants.setdefault(partition, set()).add(member_id)
    handed = {}
    for member_id, target in targets.items():
        held_elsewhere = PartitionSet.from_pairs(p for p in target if p in claimants and claimants[p] != {member_id})
        handed[member_id] = target - held_elsewhere
    return handed
