"""The classic member against kafka-python's own classic consumer pieces, byte for byte: its
subscriptions are read by kafka-python's assignors (eager range, cooperative-sticky) when a
kafka-python member leads, and the assignments it computes as leader are read by kafka-python's
``ConsumerProtocolAssignment``. The group's messages are kafka-python's protocol classes
throughout (``pystreams.protocol.messages`` re-exports them)."""

from __future__ import annotations

from uuid import UUID

from kafka.coordinator.assignors.cooperative_sticky import CooperativeStickyAssignor
from kafka.coordinator.assignors.range import RangePartitionAssignor
from kafka.protocol.consumer.metadata import ConsumerProtocolAssignment, ConsumerProtocolSubscription
from kafka.structs import TopicPartition
from pystreams.assignors.api import TopicMetadata

from pystreams.client.classic import ClassicGroupMember, ClassicMemberConfig
from pystreams.client.events import PartitionsAssigned, RevokePartitions
from pystreams.client.topics import StaticTopics
from pystreams.partitions import PartitionSet
from pystreams.protocol import messages as m

FOO = TopicMetadata(UUID(int=1), "foo", 5)
BAR = TopicMetadata(UUID(int=2), "bar", 3)


class Cluster:
    """The part of kafka-python's ClusterMetadata its assignors read."""

    def __init__(self, *topics: TopicMetadata) -> None:
        self._partitions = {t.name: set(range(t.num_partitions)) for t in topics}

    def partitions_for_topic(self, topic: str):
        return self._partitions.get(topic)

    def topics(self, exclude_internal_topics: bool = True):
        return set(self._partitions)


def entry(member_id: str, metadata: bytes) -> m.JoinGroupResponse.JoinGroupResponseMember:
    return m.JoinGroupResponse.JoinGroupResponseMember(member_id=member_id, group_instance_id=None, metadata=metadata)


def decoded_members(entries):
    """What kafka-python's leader hands its assignor: the entries with metadata decoded."""
    out = []
    for e in entries:
        member = m.JoinGroupResponse.JoinGroupResponseMember(member_id=e.member_id, group_instance_id=e.group_instance_id, metadata=e.metadata)
        member.metadata = ConsumerProtocolSubscription.decode(bytes(e.metadata))
        out.append(member)
    return out


def ours(protocol: str) -> ClassicGroupMember:
    member = ClassicGroupMember(ClassicMemberConfig(group_id="g", assignors=(protocol,)), StaticTopics([FOO, BAR]))
    member.subscribe(["foo", "bar"])
    return member


def named(member: ClassicGroupMember) -> set[TopicPartition]:
    names = {FOO.topic_id: "foo", BAR.topic_id: "bar"}
    return {TopicPartition(names[p.topic_id], p.partition) for p in member.owned_partitions}


def follow(member: ClassicGroupMember, join: m.JoinGroupRequest, generation: int, assignment: bytes, protocol: str) -> None:
    member.on_response(
        join,
        m.JoinGroupResponse(
            error_code=0, generation_id=generation, protocol_type="consumer", protocol_name=protocol, leader="kafka-python", member_id="ours", members=[]
        ),
        0,
    )
    [sync] = member.poll(0)
    assert isinstance(sync, m.SyncGroupRequest) and sync.assignments == []
    member.on_response(sync, m.SyncGroupResponse(error_code=0, protocol_type="consumer", protocol_name=protocol, assignment=assignment), 0)


def test_kafka_pythons_range_leader_reads_our_subscription_and_we_read_its_assignment() -> None:
    member = ours("range")
    [join] = member.poll(0)
    theirs = RangePartitionAssignor.metadata({"foo", "bar"}).encode()
    entries = [entry("ours", join.protocols[0].metadata), entry("kafka-python", theirs)]
    assignments = RangePartitionAssignor.assign(Cluster(FOO, BAR), decoded_members(entries))
    follow(member, join, 1, assignments["ours"].encode(), "range")
    expected = set(ConsumerProtocolAssignment.decode(assignments["ours"].encode()).partitions())
    assert named(member) == expected and expected  # "kafka-python" < "ours": ours are the later ranges
    assert expected.isdisjoint(assignments["kafka-python"].partitions())


def test_our_range_leader_assigns_as_kafka_pythons_range_would_and_it_reads_the_bytes() -> None:
    member = ours("range")
    [join] = member.poll(0)
    theirs = RangePartitionAssignor.metadata({"foo", "bar"}).encode()
    entries = [entry("ours", join.protocols[0].metadata), entry("kafka-python", theirs)]
    member.on_response(
        join,
        m.JoinGroupResponse(error_code=0, generation_id=1, protocol_type="consumer", protocol_name="range", leader="ours", member_id="ours", members=entries),
        0,
    )
    [sync] = member.poll(0)
    handed = {a.member_id: ConsumerProtocolAssignment.decode(bytes(a.assignment)) for a in sync.assignments}
    reference = RangePartitionAssignor.assign(Cluster(FOO, BAR), decoded_members(entries))
    for member_id in ("ours", "kafka-python"):
        assert set(handed[member_id].partitions()) == set(reference[member_id].partitions())
        assert handed[member_id].partitions()
    assert handed["kafka-python"].version == 0  # it subscribed at v0: answered at v0


def test_kafka_pythons_cooperative_sticky_leader_moves_our_partitions_in_two_phases() -> None:
    member = ours("cooperative-sticky")
    [join] = member.poll(0)
    # Round 1: we are alone, and own everything.
    entries = [entry("ours", join.protocols[0].metadata)]
    leader = CooperativeStickyAssignor()
    follow(member, join, 1, leader.assign(Cluster(FOO, BAR), decoded_members(entries))["ours"].encode(), "cooperative-sticky")
    assert len(named(member)) == 8
    member.take_events()
    # A kafka-python member joins: our rejoin reports what we own (subscription v3, read by its v1 parser).
    member.request_rejoin("test")
    [join] = member.poll(0)
    newcomer = CooperativeStickyAssignor().metadata({"foo", "bar"}).encode()
    entries = [entry("ours", join.protocols[0].metadata), entry("kafka-python", newcomer)]
    first = CooperativeStickyAssignor().assign(Cluster(FOO, BAR), decoded_members(entries))
    assert first["kafka-python"].partitions() == []  # phase one: nothing moves to it yet
    follow(member, join, 2, first["ours"].encode(), "cooperative-sticky")
    [revoke] = member.take_events()
    assert isinstance(revoke, RevokePartitions) and len(revoke.partitions) == 4
    member.revocation_done(0, revoke.revocation_id)
    # Phase two: we rejoin without the revoked partitions, which now go to the newcomer.
    [join] = member.poll(0)
    entries = [entry("ours", join.protocols[0].metadata), entry("kafka-python", newcomer)]
    second = CooperativeStickyAssignor().assign(Cluster(FOO, BAR), decoded_members(entries))
    follow(member, join, 3, second["ours"].encode(), "cooperative-sticky")
    assert member.take_events() == []  # nothing new for us, nothing taken
    assert named(member).isdisjoint(second["kafka-python"].partitions())
    assert len(named(member)) + len(second["kafka-python"].partitions()) == 8


def test_our_cooperative_leader_withholds_what_a_kafka_python_member_still_owns() -> None:
    member = ours("cooperative-sticky")
    [join] = member.poll(0)
    SubTP = ConsumerProtocolSubscription.TopicPartition
    holder = ConsumerProtocolSubscription(
        version=1,
        topics=["bar", "foo"],
        user_data=b"",
        owned_partitions=[SubTP(topic="foo", partitions=[0, 1, 2, 3, 4]), SubTP(topic="bar", partitions=[0, 1, 2])],
    ).encode()
    entries = [entry("ours", join.protocols[0].metadata), entry("kafka-python", holder)]
    member.on_response(
        join,
        m.JoinGroupResponse(
            error_code=0, generation_id=2, protocol_type="consumer", protocol_name="cooperative-sticky", leader="ours", member_id="ours", members=entries
        ),
        0,
    )
    [sync] = member.poll(0)
    handed = {a.member_id: ConsumerProtocolAssignment.decode(bytes(a.assignment)) for a in sync.assignments}
    assert handed["ours"].partitions() == []  # everything it would get is still owned by kafka-python
    kept = set(handed["kafka-python"].partitions())
    assert 0 < len(kept) < 8  # kafka-python keeps its share and revokes the rest
    member.on_response(
        sync,
        m.SyncGroupResponse(
            error_code=0,
            protocol_type="consumer",
            protocol_name="cooperative-sticky",
            assignment=bytes(sync.assignments[[a.member_id for a in sync.assignments].index("ours")].assignment),
        ),
        0,
    )
    assert member.owned_partitions == PartitionSet()
    assert not any(isinstance(e, PartitionsAssigned) for e in member.take_events())
