"""The Streams task assignor with classic members: their metadata is read at version -1 (KIP-848's
rule for classic members in a migrating group), they are answered at -1, and the same assignor
runs on a classic group's leader."""

from __future__ import annotations

import uuid

from pystreams.assignors.api import AssignmentSpec, AssignorMetadata, MemberSpec
from pystreams.assignors.streams import (
    CLASSIC_METADATA_VERSION,
    AssignmentError,
    ClassicStreamsMemberMetadata,
    MemberReason,
    StickyTaskAssignor,
    decode_assignment_metadata,
    decode_member_metadata,
)
from test_assignors_streams_placement import _member, _topics, dedupe  # noqa: F401  (fixture)

from pystreams.client.classic import ClassicGroupMember, ClassicMemberConfig, RebalanceProtocol
from pystreams.client.topics import StaticTopics
from pystreams.partitions import PartitionSet
from pystreams.protocol import messages as m
from pystreams.protocol.consumer_protocol import decode_assignment


def _classic(resolved, topics, index, *, reason=MemberReason.NONE, targets=None) -> MemberSpec:
    """A classic member as the coordinator (or a classic leader) hands it to the assignor."""
    assignor = StickyTaskAssignor(resolved, process_id=uuid.UUID(int=index + 1), user_endpoint=f"host{index}:80")
    assignor.set_reason(reason)
    return MemberSpec(
        subscribed_topic_ids=frozenset(topics),
        target_partitions=targets or {},
        metadata=AssignorMetadata(
            reason=0,
            version=CLASSIC_METADATA_VERSION,
            data=assignor.classic_metadata(),
            minimum_version=CLASSIC_METADATA_VERSION,
            maximum_version=CLASSIC_METADATA_VERSION,
        ),
    )


def test_classic_metadata_is_v1s_layout_with_the_reason_and_a_v1_reader_reads_it(dedupe):
    assignor = StickyTaskAssignor(dedupe, process_id=uuid.UUID(int=5), user_endpoint="h:1", client_tags={"zone": "a"})
    assignor.report({}, MemberReason.WARM_UP_READY)
    data = assignor.classic_metadata()
    classic = decode_member_metadata(CLASSIC_METADATA_VERSION, data)
    assert isinstance(classic, ClassicStreamsMemberMetadata) and classic.reason == MemberReason.WARM_UP_READY
    as_v1 = decode_member_metadata(1, data)
    assert (as_v1.process_id, as_v1.user_endpoint, as_v1.client_tags, as_v1.topology_hash) == (uuid.UUID(int=5), "h:1", {"zone": "a"}, dedupe.topology.hash)


def test_a_mixed_group_answers_classic_members_at_minus_one_and_the_others_at_two(dedupe):
    topics = _topics(dedupe)
    spec = AssignmentSpec(
        members={
            "classic-a": _classic(dedupe, topics, 0),
            "classic-b": _classic(dedupe, topics, 1),
            "kip848": _member(dedupe, topics, 2, versions=(-1, 2)),
        },
        topics=topics,
    )
    result = StickyTaskAssignor(dedupe, process_id=uuid.UUID(int=9)).assign(spec)
    assert result.error == 0
    versions = {mid: member.metadata_version for mid, member in result.members.items()}
    assert versions == {"classic-a": -1, "classic-b": -1, "kip848": 2}
    decoded = {mid: decode_assignment_metadata(member.metadata_version, member.metadata) for mid, member in result.members.items()}
    # -1 is v2's layout: the classic members' bytes read the same as v2.
    assert decode_assignment_metadata(2, result.members["classic-a"].metadata) == decoded["classic-a"]
    tasks = sorted(t for d in decoded.values() for t in d.active_task_ids())
    assert tasks == sorted(dedupe.tasks) and all(d.active_task_ids() for d in decoded.values())
    assert decoded["classic-a"].partitions_by_host == decoded["kip848"].partitions_by_host


def test_a_classic_member_asking_to_shut_down_reaches_everyone(dedupe):
    topics = _topics(dedupe)
    spec = AssignmentSpec(
        members={
            "classic": _classic(dedupe, topics, 0, reason=MemberReason.SHUTDOWN),
            "kip848": _member(dedupe, topics, 1, versions=(-1, 2)),
        },
        topics=topics,
    )
    result = StickyTaskAssignor(dedupe, process_id=uuid.UUID(int=9)).assign(spec)
    for member in result.members.values():
        assert decode_assignment_metadata(member.metadata_version, member.metadata).error == AssignmentError.SHUTDOWN


def test_a_classic_leader_runs_the_streams_assignor_and_its_followers_hear_their_tasks(dedupe):
    """The worker's classic mode: every stream thread is a classic member whose protocol is the
    Streams assignor; the leader assigns all tasks, each member's assignor hears its own."""
    topics = _topics(dedupe)
    resolver = StaticTopics(topics.values())
    heard: dict[str, list] = {"leader": [], "follower": []}
    assignors = {
        name: StickyTaskAssignor(
            dedupe,
            process_id=uuid.UUID(int=i + 1),
            user_endpoint=f"host{i}:80",
            on_assignment=lambda error, meta, epoch, name=name: heard[name].append((error, meta, epoch)),
        )
        for i, name in enumerate(("leader", "follower"))
    }
    members = {name: ClassicGroupMember(ClassicMemberConfig(group_id="app", assignors=(assignor,)), resolver) for name, assignor in assignors.items()}
    assert all(member.rebalance_protocol is RebalanceProtocol.COOPERATIVE for member in members.values())
    names = sorted(t.name for t in topics.values())
    joins = {}
    for name, member in members.items():
        member.subscribe(names)
        [joins[name]] = member.poll(0)
    protocol = joins["leader"].protocols[0]
    assert protocol.name == "streams"
    entries = [
        m.JoinGroupResponse.JoinGroupResponseMember(member_id=name, group_instance_id=None, metadata=joins[name].protocols[0].metadata) for name in members
    ]
    members["leader"].on_response(
        joins["leader"],
        m.JoinGroupResponse(
            error_code=0, generation_id=1, protocol_type="consumer", protocol_name="streams", leader="leader", member_id="leader", members=entries
        ),
        0,
    )
    members["follower"].on_response(
        joins["follower"],
        m.JoinGroupResponse(
            error_code=0, generation_id=1, protocol_type="consumer", protocol_name="streams", leader="leader", member_id="follower", members=[]
        ),
        0,
    )
    [leader_sync] = members["leader"].poll(0)
    [follower_sync] = members["follower"].poll(0)
    handed = {a.member_id: bytes(a.assignment) for a in leader_sync.assignments}
    for name, sync in (("leader", leader_sync), ("follower", follower_sync)):
        members[name].on_response(sync, m.SyncGroupResponse(error_code=0, protocol_type="consumer", protocol_name="streams", assignment=handed[name]), 0)
    owned = {name: member.owned_partitions for name, member in members.items()}
    assert owned["leader"] and owned["follower"] and owned["leader"].isdisjoint(owned["follower"])
    everything = PartitionSet({t.topic_id: range(t.num_partitions) for t in topics.values()})
    assert owned["leader"] | owned["follower"] == everything
    for name in members:
        [(error, metadata, epoch)] = heard[name]
        assert (error, epoch) == (AssignmentError.NONE, 1)
        # The tasks in the member's metadata are the ones whose partitions it was handed.
        assert sorted(metadata.active_task_ids()) == sorted(
            {t for t in dedupe.tasks if all((topics_by_name(topics)[n], p) in owned[name] for n, p in dedupe.input_partitions(t))}
        )
        assert decode_assignment(handed[name]).user_data  # the Streams metadata rides in userData


def topics_by_name(topics):
    return {t.name: t.topic_id for t in topics.values()}
