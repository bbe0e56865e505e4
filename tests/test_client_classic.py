"""The classic member state machine (``client.classic``), driven with hand-built coordinator
responses: Kafka's consumer rules for JoinGroup / SyncGroup / Heartbeat / LeaveGroup, eager and
cooperative rebalances, static members, the leader's assignment, and the same member inside a
KIP-848 group during an online migration."""

from __future__ import annotations

from uuid import UUID

import kafka.errors as Errors
import pytest
from pystreams.assignors.api import (
    AssignmentSpec,
    AssignorMetadata,
    GroupAssignment,
    MemberAssignment,
    PartitionAssignorError,
    TopicMetadata,
)

from pystreams.client.classic import (
    JOIN_GROUP_TIMEOUT_LAPSE_MS,
    ClassicGroupMember,
    ClassicMemberConfig,
    ClassicState,
    RebalanceProtocol,
    topic_names_in,
)
from pystreams.client.classic_leader import JoinedMember, assign_group
from pystreams.client.events import (
    CoordinatorUnavailable,
    LeftGroup,
    MemberFailed,
    MemberFatalError,
    MemberState,
    PartitionsAssigned,
    PartitionsLost,
    RevokePartitions,
)
from pystreams.client.topics import StaticTopics
from pystreams.partitions import PartitionSet, TopicIdPartition
from pystreams.protocol import messages as m
from pystreams.protocol.consumer_protocol import (
    Assignment,
    Subscription,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
    named_partitions,
)

FOO = UUID(int=0xF00)
BAR = UUID(int=0xBA2)
INTERVAL = 1_000
SESSION = 10_000
REBALANCE = 30_000
BACKOFF = 100

NONE = 0
UNKNOWN_MEMBER = Errors.UnknownMemberIdError.errno
ILLEGAL_GENERATION = Errors.IllegalGenerationError.errno
REBALANCE_IN_PROGRESS = Errors.RebalanceInProgressError.errno
MEMBER_ID_REQUIRED = Errors.MemberIdRequiredError.errno
FENCED_INSTANCE = Errors.FencedInstanceIdError.errno
NOT_COORDINATOR = Errors.NotCoordinatorError.errno
COORDINATOR_NOT_AVAILABLE = Errors.CoordinatorNotAvailableError.errno
LOAD_IN_PROGRESS = Errors.CoordinatorLoadInProgressError.errno
TIMED_OUT = Errors.RequestTimedOutError.errno


def topics() -> StaticTopics:
    return StaticTopics([TopicMetadata(FOO, "foo", 4), TopicMetadata(BAR, "bar", 2)])


def parts(topic: UUID, *numbers: int) -> PartitionSet:
    return PartitionSet.from_pairs(TopicIdPartition(topic, n) for n in numbers)


def make(*, assignors=("range",), instance_id=None, resolver=None, rebalance_timeout_ms=REBALANCE, **overrides) -> ClassicGroupMember:
    config = ClassicMemberConfig(
        group_id="g",
        session_timeout_ms=SESSION,
        heartbeat_interval_ms=INTERVAL,
        rebalance_timeout_ms=rebalance_timeout_ms,
        retry_backoff_ms=BACKOFF,
        assignors=assignors,
        instance_id=instance_id,
        **overrides,
    )
    return ClassicGroupMember(config, resolver or topics())


def assignment_bytes(partitions: dict[str, list[int]], *, user_data: bytes | None = None, version: int = 3) -> bytes:
    return encode_assignment(Assignment(named_partitions(partitions.items()), user_data), version)


def join_response(
    *, generation=1, member_id="m1", leader="leader", protocol="range", error=NONE, members=(), skip=False, protocol_type="consumer"
) -> m.JoinGroupResponse:
    return m.JoinGroupResponse(
        error_code=error,
        generation_id=generation,
        protocol_type=protocol_type,
        protocol_name=protocol,
        leader=leader,
        skip_assignment=skip,
        member_id=member_id,
        members=[m.JoinGroupResponse.JoinGroupResponseMember(member_id=mid, group_instance_id=iid, metadata=data) for mid, iid, data in members],
    )


def sync_response(assignment: bytes = b"", *, error=NONE, protocol="range") -> m.SyncGroupResponse:
    return m.SyncGroupResponse(error_code=error, protocol_type="consumer", protocol_name=protocol, assignment=assignment)


def only(requests, kind):
    assert [type(r) for r in requests] == [kind], requests
    return requests[0]


def join(member: ClassicGroupMember, now: int, response: m.JoinGroupResponse) -> m.SyncGroupRequest:
    request = only(member.poll(now), m.JoinGroupRequest)
    member.on_response(request, response, now)
    return only(member.poll(now), m.SyncGroupRequest)


def to_stable(member: ClassicGroupMember, assigned: dict[str, list[int]], *, now=0, generation=1, member_id="m1", protocol="range") -> None:
    """Subscribe (if needed), join as a follower and sync ``assigned``."""
    if member.classic_state is ClassicState.UNJOINED and member.state is MemberState.UNSUBSCRIBED:
        member.subscribe(["foo", "bar"])
    sync = join(member, now, join_response(generation=generation, member_id=member_id, protocol=protocol))
    member.on_response(sync, sync_response(assignment_bytes(assigned), protocol=protocol), now)
    assert member.classic_state is ClassicState.STABLE


def subscription_of(request: m.JoinGroupRequest, index: int = 0) -> Subscription:
    return decode_subscription(bytes(request.protocols[index].metadata))


# ----------------------------------------------------------------------------- joining


def test_first_join_sends_a_v3_subscription_per_assignor_then_rejoins_with_the_required_member_id() -> None:
    member = make(assignors=("range", "cooperative-sticky"), rack_id="r1")
    assert member.state is MemberState.UNSUBSCRIBED and member.poll(0) == []
    member.subscribe(["foo", "bar"])
    assert member.state is MemberState.JOINING
    request = only(member.poll(0), m.JoinGroupRequest)
    assert (request.group_id, request.member_id, request.group_instance_id, request.protocol_type) == ("g", "", None, "consumer")
    assert (request.session_timeout_ms, request.rebalance_timeout_ms) == (SESSION, REBALANCE)
    assert [p.name for p in request.protocols] == ["range", "cooperative-sticky"]
    subscription = subscription_of(request)
    assert subscription == Subscription(topics=("bar", "foo"), user_data=None, owned_partitions=named_partitions([]), generation_id=-1, rack_id="r1", version=3)
    # No second JoinGroup while one is in flight.
    assert member.poll(5) == []
    # KIP-394: the coordinator reserves an id; the member rejoins with it at once, having lost nothing.
    member.on_response(request, join_response(error=MEMBER_ID_REQUIRED, member_id="m-reserved", generation=-1), 5)
    assert member.take_events() == []
    again = only(member.poll(5), m.JoinGroupRequest)
    assert again.member_id == "m-reserved"
    assert member.next_deadline() is None or member.next_deadline() > 5


def test_a_follower_syncs_without_assignments_and_takes_what_sync_group_hands_it() -> None:
    member = make()
    member.subscribe(["foo"])
    sync = join(member, 0, join_response(generation=7, member_id="m1", leader="other"))
    assert (sync.generation_id, sync.member_id, sync.protocol_type, sync.protocol_name, sync.assignments) == (7, "m1", "consumer", "range", [])
    assert member.member_epoch == 7 and member.classic_state is ClassicState.COMPLETING_REBALANCE
    assert not member.is_leader
    member.on_response(sync, sync_response(assignment_bytes({"foo": [0, 2]})), 10)
    assert member.take_events() == [PartitionsAssigned(parts(FOO, 0, 2), 7)]
    assert member.state is MemberState.STABLE and member.owned_partitions == parts(FOO, 0, 2)


def test_the_join_group_long_poll_outlasts_the_rebalance_timeout() -> None:
    member = make()
    member.subscribe(["foo"])
    request = only(member.poll(0), m.JoinGroupRequest)
    assert member.request_timeout_ms(request, 30_000) == max(30_000, REBALANCE + JOIN_GROUP_TIMEOUT_LAPSE_MS)
    assert member.request_timeout_ms(request, 60_000) == 60_000
    heartbeat = m.HeartbeatRequest(group_id="g", generation_id=1, member_id="m", group_instance_id=None)
    assert member.request_timeout_ms(heartbeat, 30_000) == 30_000


def test_heartbeats_run_from_the_join_answer_at_the_interval_and_not_during_a_join() -> None:
    member = make()
    member.subscribe(["foo"])
    join_request = only(member.poll(0), m.JoinGroupRequest)
    assert member.poll(INTERVAL * 3) == []  # the join is in flight: no heartbeat
    member.on_response(join_request, join_response(), 100)
    sync = only(member.poll(100), m.SyncGroupRequest)
    assert member.next_deadline() == 100 + INTERVAL
    heartbeat = only(member.poll(100 + INTERVAL), m.HeartbeatRequest)  # also while the sync is in flight
    assert (heartbeat.generation_id, heartbeat.member_id, heartbeat.group_instance_id) == (1, "m1", None)
    member.on_response(sync, sync_response(assignment_bytes({"foo": [1]})), 1200)
    member.on_response(heartbeat, m.HeartbeatResponse(error_code=NONE), 1200)
    assert member.next_deadline() == 100 + 2 * INTERVAL  # the interval counts from the send


# ----------------------------------------------------------------------------- rebalances


def test_eager_rebalance_revokes_everything_before_rejoining() -> None:
    member = make()
    to_stable(member, {"foo": [0, 1], "bar": [0]})
    member.take_events()
    heartbeat = only(member.poll(INTERVAL), m.HeartbeatRequest)
    member.on_response(heartbeat, m.HeartbeatResponse(error_code=REBALANCE_IN_PROGRESS), INTERVAL)
    assert member.poll(INTERVAL) == []  # no JoinGroup before the revocation is done
    [revoke] = member.take_events()
    assert revoke == RevokePartitions(parts(FOO, 0, 1) | parts(BAR, 0), revoke.revocation_id)
    assert member.state is MemberState.RECONCILING and member.owned_partitions == PartitionSet()
    # Heartbeats go on meanwhile, so the session stays alive.
    assert isinstance(only(member.poll(2 * INTERVAL), m.HeartbeatRequest), m.HeartbeatRequest)
    member.revocation_done(2 * INTERVAL, revoke.revocation_id)
    rejoin = only(member.poll(2 * INTERVAL), m.JoinGroupRequest)
    assert rejoin.member_id == "m1"
    assert subscription_of(rejoin).owned_partitions == {} and subscription_of(rejoin).generation_id == 1
    member.on_response(rejoin, join_response(generation=2), 2 * INTERVAL)
    sync = only(member.poll(2 * INTERVAL), m.SyncGroupRequest)
    member.on_response(sync, sync_response(assignment_bytes({"foo": [0]})), 2 * INTERVAL)
    assert member.take_events() == [PartitionsAssigned(parts(FOO, 0), 2)]


def test_cooperative_rebalance_keeps_what_stays_and_revokes_only_what_moves_then_rejoins() -> None:
    member = make(assignors=("cooperative-sticky",))
    assert member.rebalance_protocol is RebalanceProtocol.COOPERATIVE
    to_stable(member, {"foo": [0, 1, 2, 3]}, protocol="cooperative-sticky")
    member.take_events()
    heartbeat = only(member.poll(INTERVAL), m.HeartbeatRequest)
    member.on_response(heartbeat, m.HeartbeatResponse(error_code=REBALANCE_IN_PROGRESS), INTERVAL)
    rejoin = only(member.poll(INTERVAL), m.JoinGroupRequest)  # at once: nothing to revoke first
    assert member.take_events() == []
    assert subscription_of(rejoin).owned_partitions == {"foo": frozenset({0, 1, 2, 3})}
    member.on_response(rejoin, join_response(generation=2, protocol="cooperative-sticky"), INTERVAL)
    sync = only(member.poll(INTERVAL), m.SyncGroupRequest)
    member.on_response(sync, sync_response(assignment_bytes({"foo": [0, 1]}), protocol="cooperative-sticky"), INTERVAL)
    [revoke] = member.take_events()
    assert revoke.partitions == parts(FOO, 2, 3)
    assert member.owned_partitions == parts(FOO, 0, 1)  # kept, and processed all along
    assert member.poll(INTERVAL) == []  # the follow-up join waits for the revocation
    member.revocation_done(INTERVAL + 5, revoke.revocation_id)
    follow_up = only(member.poll(INTERVAL + 5), m.JoinGroupRequest)
    assert follow_up.reason == "need to revoke partitions and re-join"
    assert subscription_of(follow_up).owned_partitions == {"foo": frozenset({0, 1})}
    assert subscription_of(follow_up).generation_id == 2


def test_cooperative_member_revokes_partitions_of_topics_it_no_longer_subscribes_to_before_joining() -> None:
    member = make(assignors=("cooperative-sticky",))
    to_stable(member, {"foo": [0], "bar": [1]}, protocol="cooperative-sticky")
    member.take_events()
    member.subscribe(["foo"])
    assert member.poll(0) == []
    [revoke] = member.take_events()
    assert revoke.partitions == parts(BAR, 1) and member.owned_partitions == parts(FOO, 0)
    member.revocation_done(1, revoke.revocation_id)
    rejoin = only(member.poll(1), m.JoinGroupRequest)
    assert subscription_of(rejoin).topics == ("foo",)
    assert subscription_of(rejoin).owned_partitions == {"foo": frozenset({0})}


def test_an_assignment_outside_the_current_subscription_is_not_applied_and_the_member_rejoins() -> None:
    member = make()
    member.subscribe(["foo", "bar"])
    sync = join(member, 0, join_response())
    member.subscribe(["foo"])  # changed while the rebalance completes
    member.on_response(sync, sync_response(assignment_bytes({"bar": [0]})), 1)
    assert member.take_events() == [] and member.owned_partitions == PartitionSet()
    rejoin = only(member.poll(1), m.JoinGroupRequest)
    assert subscription_of(rejoin).topics == ("foo",)


def test_a_reason_from_a_client_side_assignor_makes_the_member_rejoin_with_its_new_metadata() -> None:
    assignor = RecordingAssignor()
    member = make(assignors=(assignor,))
    member.subscribe(["foo"])
    first = only(member.poll(0), m.JoinGroupRequest)
    assert subscription_of(first).user_data == b"classic-v0"
    sync = only_sync_after(member, first, join_response(protocol="recording"))
    member.on_response(sync, sync_response(assignment_bytes({"foo": [0]}, user_data=b"task-info"), protocol="recording"), 1)
    assert assignor.heard == [(0, {FOO: frozenset({0})}, -1, b"task-info", 1)]
    member.request_heartbeat()  # lags changed, reason still 0: no rebalance
    assignor.data = b"classic-v1"
    member.request_heartbeat()
    assert only(member.poll(1), m.HeartbeatRequest)
    assignor.reason = 2  # e.g. WarmUpReady
    member.request_heartbeat()
    assert member.state is MemberState.ACKNOWLEDGING
    rejoin = [r for r in member.poll(2) if isinstance(r, m.JoinGroupRequest)]
    assert len(rejoin) == 1 and subscription_of(rejoin[0]).user_data == b"classic-v1"


def only_sync_after(member, join_request, response, now=0):
    member.on_response(join_request, response, now)
    return only(member.poll(now), m.SyncGroupRequest)


class RecordingAssignor:
    """A client-side assignor that records what it is told and gives everyone partition 0."""

    name = "recording"
    minimum_version = -1
    maximum_version = 0

    def __init__(self) -> None:
        self.reason = 0
        self.data = b"classic-v0"
        self.heard: list[tuple] = []
        self.specs: list[AssignmentSpec] = []
        self.fail = False

    def metadata(self) -> AssignorMetadata:
        return AssignorMetadata(reason=self.reason, version=0, data=b"kip848:" + self.data, minimum_version=-1, maximum_version=0)

    def classic_metadata(self) -> bytes:
        return self.data

    def assign(self, spec: AssignmentSpec) -> GroupAssignment:
        self.specs.append(spec)
        if self.fail:
            raise PartitionAssignorError("cannot")
        first = sorted(spec.members)[0]
        return GroupAssignment(
            members={
                mid: MemberAssignment(partitions={FOO: frozenset({0})} if mid == first else {}, metadata_version=-1, metadata=f"for-{mid}".encode())
                for mid in spec.members
            }
        )

    def on_assignment(self, error: int, assignment: MemberAssignment, group_epoch: int) -> None:
        self.heard.append((error, dict(assignment.partitions), assignment.metadata_version, assignment.metadata, group_epoch))


# ----------------------------------------------------------------------------- the leader


def member_entry(member_id: str, topics_: tuple[str, ...], *, owned=None, user_data=None, version=3, instance=None, generation=-1):
    data = encode_subscription(
        Subscription(topics=topics_, user_data=user_data, owned_partitions=named_partitions((owned or {}).items()), generation_id=generation), version
    )
    return (member_id, instance, data)


def test_the_leader_runs_range_over_every_members_subscription_and_writes_each_at_its_version() -> None:
    member = make()
    member.subscribe(["foo"])
    request = only(member.poll(0), m.JoinGroupRequest)
    members = [member_entry("a", ("foo",)), member_entry("b", ("foo", "bar"), version=0)]
    member.on_response(request, join_response(member_id="a", leader="a", members=members), 0)
    assert member.is_leader
    sync = only(member.poll(0), m.SyncGroupRequest)
    out = {a.member_id: bytes(a.assignment) for a in sync.assignments}
    assert decode_assignment(out["a"]).partitions == {"foo": frozenset({0, 1})}
    assert decode_assignment(out["b"]).partitions == {"foo": frozenset({2, 3}), "bar": frozenset({0, 1})}
    assert decode_assignment(out["b"]).version == 0  # b speaks v0: it is answered in v0


def test_a_static_leader_told_to_skip_the_assignment_sends_none() -> None:
    member = make(instance_id="i-1")
    member.subscribe(["foo"])
    request = only(member.poll(0), m.JoinGroupRequest)
    assert request.group_instance_id == "i-1"
    member.on_response(request, join_response(member_id="a", leader="a", skip=True, members=[member_entry("a", ("foo",))]), 0)
    assert only(member.poll(0), m.SyncGroupRequest).assignments == []


def test_cooperative_two_phase_move_withholds_a_partition_until_its_owner_released_it() -> None:
    resolver = topics()
    uniform_leader = ClassicMemberConfig(group_id="g", assignors=("cooperative-sticky",))
    assignor = ClassicGroupMember(uniform_leader, resolver)._protocols[0].assignor
    old = JoinedMember("a", None, decode_subscription(member_entry("a", ("foo",), owned={"foo": [0, 1, 2, 3]})[2]))
    new = JoinedMember("b", None, decode_subscription(member_entry("b", ("foo",))[2]))
    first = assign_group(assignor, client_side=False, members=[old, new], topics=resolver, protocol=RebalanceProtocol.COOPERATIVE)
    moving = first.targets["b"]
    assert len(moving) == 2 and first.targets["a"] | moving == parts(FOO, 0, 1, 2, 3)
    # Phase one: b gets nothing a still owns; a is told to keep only its half.
    assert decode_assignment(first.assignments["b"]).partitions == {}
    kept = decode_assignment(first.assignments["a"]).partitions
    assert kept == {"foo": frozenset(p.partition for p in first.targets["a"])}
    # a revokes the rest and rejoins; phase two hands the freed half to b.
    old_after = JoinedMember("a", None, decode_subscription(member_entry("a", ("foo",), owned={"foo": sorted(kept["foo"])})[2]))
    new_after = JoinedMember("b", None, decode_subscription(member_entry("b", ("foo",))[2]))
    second = assign_group(
        assignor, client_side=False, members=[old_after, new_after], topics=resolver, protocol=RebalanceProtocol.COOPERATIVE, previous_targets=first.targets
    )
    assert decode_assignment(second.assignments["b"]).partitions == {"foo": frozenset(p.partition for p in moving)}
    assert decode_assignment(second.assignments["a"]).partitions == kept
    # Eager hands everything at once (its members revoked all before joining).
    eager = assign_group(assignor, client_side=False, members=[old, new], topics=resolver, protocol=RebalanceProtocol.EAGER)
    assert decode_assignment(eager.assignments["b"]).partitions == {"foo": frozenset(p.partition for p in eager.targets["b"])}


def test_a_partition_two_members_claim_goes_to_nobody_until_both_let_go() -> None:
    resolver = topics()
    assignor = ClassicGroupMember(ClassicMemberConfig(group_id="g", assignors=("cooperative-sticky",)), resolver)._protocols[0].assignor
    both = [JoinedMember(mid, None, decode_subscription(member_entry(mid, ("foo",), owned={"foo": [0]})[2])) for mid in "ab"]
    result = assign_group(assignor, client_side=False, members=both, topics=resolver, protocol=RebalanceProtocol.COOPERATIVE)
    for mid in "ab":
        assert 0 not in decode_assignment(result.assignments[mid]).partitions.get("foo", frozenset())


def test_a_client_side_assignor_sees_classic_metadata_at_version_minus_one_and_its_metadata_becomes_user_data() -> None:
    assignor = RecordingAssignor()
    member = make(assignors=(assignor,))
    member.subscribe(["foo"])
    request = only(member.poll(0), m.JoinGroupRequest)
    members = [member_entry("a", ("foo",), user_data=b"meta-a"), member_entry("b", ("foo",), user_data=b"meta-b", instance="i-b")]
    member.on_response(request, join_response(member_id="a", leader="a", protocol="recording", members=members), 0)
    sync = only(member.poll(0), m.SyncGroupRequest)
    [spec] = assignor.specs
    assert spec.members["a"].metadata == AssignorMetadata(reason=0, version=-1, data=b"meta-a", minimum_version=-1, maximum_version=-1)
    assert spec.members["b"].instance_id == "i-b" and spec.members["b"].subscribed_topic_ids == frozenset({FOO})
    assert set(spec.topics) == {FOO}
    out = {a.member_id: decode_assignment(bytes(a.assignment)) for a in sync.assignments}
    assert (out["a"].partitions, out["a"].user_data) == ({"foo": frozenset({0})}, b"for-a")
    assert (out["b"].partitions, out["b"].user_data) == ({}, b"for-b")


def test_an_assignor_failure_keeps_every_member_on_what_it_owns() -> None:
    assignor = RecordingAssignor()
    assignor.fail = True
    member = make(assignors=(assignor,))
    member.subscribe(["foo"])
    request = only(member.poll(0), m.JoinGroupRequest)
    members = [member_entry("a", ("foo",), owned={"foo": [3]}), member_entry("b", ("foo",), owned={"foo": [1]})]
    member.on_response(request, join_response(member_id="a", leader="a", protocol="recording", members=members), 0)
    sync = only(member.poll(0), m.SyncGroupRequest)
    out = {a.member_id: decode_assignment(bytes(a.assignment)).partitions for a in sync.assignments}
    assert out == {"a": {"foo": frozenset({3})}, "b": {"foo": frozenset({1})}}


def test_a_member_with_an_unreadable_subscription_gets_nothing_and_the_rest_are_assigned() -> None:
    member = make()
    member.subscribe(["foo"])
    request = only(member.poll(0), m.JoinGroupRequest)
    members = [member_entry("a", ("foo",)), ("broken", None, b"\x00\x01\x00")]
    member.on_response(request, join_response(member_id="a", leader="a", members=members), 0)
    sync = only(member.poll(0), m.SyncGroupRequest)
    out = {a.member_id: decode_assignment(bytes(a.assignment)).partitions for a in sync.assignments}
    assert out == {"a": {"foo": frozenset({0, 1, 2, 3})}, "broken": {}}


def test_the_leader_rebalances_when_a_subscribed_topic_grows() -> None:
    resolver = topics()
    member = make(resolver=resolver, assignors=("cooperative-sticky",))
    member.subscribe(["foo"])
    request = only(member.poll(0), m.JoinGroupRequest)
    member.on_response(request, join_response(member_id="a", leader="a", members=[member_entry("a", ("foo",))], protocol="cooperative-sticky"), 0)
    sync = only(member.poll(0), m.SyncGroupRequest)
    member.on_response(sync, sync_response(bytes(sync.assignments[0].assignment), protocol="cooperative-sticky"), 0)
    member.metadata_changed()
    assert member.state is MemberState.STABLE  # nothing changed
    resolver.add(TopicMetadata(FOO, "foo", 6))
    member.metadata_changed()
    assert isinstance(only(member.poll(1), m.JoinGroupRequest), m.JoinGroupRequest)


def test_a_static_leader_back_without_a_rebalance_watches_the_groups_topics_from_then_on() -> None:
    """Told to skip the assignment (KIP-814), a returning static leader keeps the group's
    assignment but watches every topic the group subscribes to, as Kafka's onLeaderElected sets
    its assignment snapshot to the metadata it sees then. Without the watch a partition added
    later went to nobody (the simulator's migration seed 101613)."""
    resolver = topics()
    member = make(instance_id="i-1", resolver=resolver, assignors=("cooperative-sticky",))
    member.subscribe(["foo"])
    request = only(member.poll(0), m.JoinGroupRequest)
    members = [member_entry("a", ("foo",)), member_entry("b", ("bar",))]
    member.on_response(request, join_response(member_id="a", leader="a", skip=True, members=members, protocol="cooperative-sticky"), 0)
    sync = only(member.poll(0), m.SyncGroupRequest)
    assert sync.assignments == []
    member.on_response(sync, sync_response(assignment_bytes({"foo": [0, 1, 2, 3]}), protocol="cooperative-sticky"), 0)
    member.metadata_changed()
    assert member.state is MemberState.STABLE  # nothing changed since it came back
    resolver.add(TopicMetadata(BAR, "bar", 3))  # another member's topic grows
    member.metadata_changed()
    rejoin = only(member.poll(1), m.JoinGroupRequest)
    assert rejoin.reason == "the metadata of a subscribed topic changed"


def test_a_guarded_cooperative_member_that_gave_up_what_it_joined_with_rejoins_once_synced() -> None:
    """Its JoinGroup reported owning foo-0 and foo-1; the guard gave them up while the join
    phase ran; the leader, believing the report, kept foo-1 (moving elsewhere) from its new
    owner until this member lets it go. With nothing left to revoke the member must still
    rejoin, or foo-1 stays nobody's (the simulator's migration seeds 101469, 104590)."""
    short = 3 * INTERVAL  # the rebalance timeout
    member = make(assignors=("cooperative-sticky",), rebalance_timeout_ms=short, lose_partitions_on_session_timeout=True)
    to_stable(member, {"foo": [0, 1]}, protocol="cooperative-sticky")
    member.take_events()
    heartbeat = only(member.poll(INTERVAL), m.HeartbeatRequest)
    member.on_response(heartbeat, m.HeartbeatResponse(error_code=REBALANCE_IN_PROGRESS), INTERVAL)
    rejoin = only(member.poll(INTERVAL), m.JoinGroupRequest)
    assert subscription_of(rejoin).owned_partitions == {"foo": frozenset({0, 1})}
    member.poll(INTERVAL + short)  # the join phase outlasts the guard
    assert member.take_events() == [PartitionsLost(parts(FOO, 0, 1), TIMED_OUT)]
    later = INTERVAL + short + 10
    member.on_response(rejoin, join_response(generation=2, protocol="cooperative-sticky"), later)
    sync = only(member.poll(later), m.SyncGroupRequest)
    member.on_response(sync, sync_response(assignment_bytes({"foo": [0]}), protocol="cooperative-sticky"), later)
    assert member.take_events() == [PartitionsAssigned(parts(FOO, 0), 2)]
    follow_up = only(member.poll(later), m.JoinGroupRequest)
    assert follow_up.reason == "partitions it reported owning moved, and it no longer owns them"
    assert subscription_of(follow_up).owned_partitions == {"foo": frozenset({0})}


def test_a_regex_subscription_is_matched_against_the_resolver_and_follows_new_topics() -> None:
    resolver = topics()
    resolver.add(TopicMetadata(UUID(int=9), "__internal-foo", 1))
    member = make(resolver=resolver, assignors=("cooperative-sticky",))
    member.subscribe(regex=".*o.*")
    request = only(member.poll(0), m.JoinGroupRequest)
    assert subscription_of(request).topics == ("foo",)  # internal topics never match
    member.on_response(request, join_response(protocol="cooperative-sticky"), 0)
    member.on_response(only(member.poll(0), m.SyncGroupRequest), sync_response(assignment_bytes({"foo": [0]}), protocol="cooperative-sticky"), 0)
    resolver.add(TopicMetadata(UUID(int=7), "orders", 1))
    member.metadata_changed()
    rejoin = only(member.poll(1), m.JoinGroupRequest)
    assert subscription_of(rejoin).topics == ("foo", "orders")
    with pytest.raises(ValueError, match="invalid subscription regex"):
        make().subscribe(regex="orders-(")


# ----------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "code",
    [
        FENCED_INSTANCE,
        Errors.GroupMaxSizeReachedError.errno,
        Errors.InconsistentGroupProtocolError.errno,
        Errors.InvalidSessionTimeoutError.errno,
        Errors.InvalidGroupIdError.errno,
        Errors.GroupAuthorizationFailedError.errno,
        Errors.UnsupportedVersionError.errno,
    ],
)
def test_fatal_join_group_errors_fail_the_member_with_the_reason(code: int) -> None:
    member = make(instance_id="i-1")
    member.subscribe(["foo"])
    request = only(member.poll(0), m.JoinGroupRequest)
    member.on_response(request, join_response(error=code, member_id="", generation=-1), 0)
    [failed] = member.take_events()
    assert isinstance(failed, MemberFailed) and failed.error_code == code
    assert "JoinGroup failed with" in failed.message and "fatal" in failed.message
    assert member.state is MemberState.FATAL and member.fatal_error == failed.message
    assert member.poll(10_000) == [] and member.next_deadline() is None
    with pytest.raises(MemberFatalError):
        member.subscribe(["foo"])


def test_join_group_unknown_member_resets_the_member_id_and_rejoins_at_once() -> None:
    member = make()
    to_stable(member, {"foo": [0]})
    member.take_events()
    heartbeat = only(member.poll(INTERVAL), m.HeartbeatRequest)
    member.on_response(heartbeat, m.HeartbeatResponse(error_code=REBALANCE_IN_PROGRESS), INTERVAL)
    assert member.poll(INTERVAL) == []  # eager: the revocation comes first
    [revoke] = member.take_events()
    member.revocation_done(INTERVAL, revoke.revocation_id)
    rejoin = only(member.poll(INTERVAL), m.JoinGroupRequest)
    member.on_response(rejoin, join_response(error=UNKNOWN_MEMBER, member_id="", generation=-1), INTERVAL)
    again = only(member.poll(INTERVAL), m.JoinGroupRequest)
    assert again.member_id == "" and subscription_of(again).generation_id == -1


@pytest.mark.parametrize("code,event", [(NOT_COORDINATOR, True), (COORDINATOR_NOT_AVAILABLE, True), (LOAD_IN_PROGRESS, False)])
def test_join_group_coordinator_errors_retry_after_the_backoff(code: int, event: bool) -> None:
    member = make()
    member.subscribe(["foo"])
    request = only(member.poll(0), m.JoinGroupRequest)
    member.on_response(request, join_response(error=code, member_id="", generation=-1), 0)
    assert member.take_events() == ([CoordinatorUnavailable(code)] if event else [])
    assert member.poll(BACKOFF - 1) == [] and member.next_deadline() == BACKOFF
    assert isinstance(only(member.poll(BACKOFF), m.JoinGroupRequest), m.JoinGroupRequest)


def test_join_group_rebalance_in_progress_and_failures_retry() -> None:
    member = make()
    member.subscribe(["foo"])
    request = only(member.poll(0), m.JoinGroupRequest)
    member.on_response(request, join_response(error=REBALANCE_IN_PROGRESS, member_id="", generation=-1), 0)
    again = only(member.poll(0), m.JoinGroupRequest)  # at once
    member.on_request_failed(again, 50)
    assert member.poll(50) == []
    assert isinstance(only(member.poll(50 + BACKOFF), m.JoinGroupRequest), m.JoinGroupRequest)


def test_sync_group_rebalance_in_progress_rejoins_at_once_keeping_generation_and_id() -> None:
    member = make()
    member.subscribe(["foo"])
    sync = join(member, 0, join_response(generation=3, member_id="m1"))
    member.on_response(sync, sync_response(error=REBALANCE_IN_PROGRESS), 1)
    rejoin = only(member.poll(1), m.JoinGroupRequest)
    assert (rejoin.member_id, subscription_of(rejoin).generation_id) == ("m1", 3)


@pytest.mark.parametrize("code,keeps_id", [(UNKNOWN_MEMBER, False), (ILLEGAL_GENERATION, True)])
def test_sync_group_unknown_member_or_illegal_generation_loses_partitions_and_resets(code: int, keeps_id: bool) -> None:
    member = make(assignors=("cooperative-sticky",))
    to_stable(member, {"foo": [0, 1]}, protocol="cooperative-sticky")
    member.take_events()
    member.request_rejoin("test")
    rejoin = only(member.poll(1), m.JoinGroupRequest)
    member.on_response(rejoin, join_response(generation=2, protocol="cooperative-sticky"), 1)
    sync = only(member.poll(1), m.SyncGroupRequest)
    member.on_response(sync, sync_response(error=code, protocol="cooperative-sticky"), 2)
    assert member.take_events() == [PartitionsLost(parts(FOO, 0, 1), code)]
    again = only(member.poll(2), m.JoinGroupRequest)
    assert again.member_id == ("m1" if keeps_id else "")
    assert subscription_of(again).generation_id == -1 and subscription_of(again).owned_partitions == {}


def test_sync_group_fenced_instance_is_fatal_and_coordinator_errors_rejoin_after_the_backoff() -> None:
    fenced = make(instance_id="i-1")
    fenced.subscribe(["foo"])
    sync = join(fenced, 0, join_response())
    fenced.on_response(sync, sync_response(error=FENCED_INSTANCE), 1)
    assert fenced.state is MemberState.FATAL and "another member uses instance id 'i-1'" in fenced.fatal_error

    moved = make()
    moved.subscribe(["foo"])
    sync = join(moved, 0, join_response())
    moved.on_response(sync, sync_response(error=NOT_COORDINATOR), 1)
    assert moved.take_events() == [CoordinatorUnavailable(NOT_COORDINATOR)]
    assert [type(r) for r in moved.poll(1)] in ([], [m.HeartbeatRequest])
    assert m.JoinGroupRequest in [type(r) for r in moved.poll(1 + BACKOFF)]


def test_inconsistent_protocol_answers_and_unreadable_assignments_are_fatal_with_their_reason() -> None:
    named = make()
    named.subscribe(["foo"])
    sync = join(named, 0, join_response())
    named.on_response(sync, sync_response(assignment_bytes({"foo": [0]}), protocol="roundrobin"), 1)
    assert "SyncGroup answered protocol 'roundrobin', not 'range'" in named.fatal_error

    typed = make()
    typed.subscribe(["foo"])
    request = only(typed.poll(0), m.JoinGroupRequest)
    typed.on_response(request, join_response(protocol_type="connect"), 0)
    assert "protocol type 'connect'" in typed.fatal_error

    garbled = make()
    garbled.subscribe(["foo"])
    sync = join(garbled, 0, join_response())
    garbled.on_response(sync, sync_response(b"\x00\x00\x00"), 1)
    assert "the assignment from SyncGroup cannot be read" in garbled.fatal_error

    unknown = make()
    unknown.subscribe(["foo"])
    request = only(unknown.poll(0), m.JoinGroupRequest)
    unknown.on_response(request, join_response(member_id="a", leader="a", protocol="sticky", members=[member_entry("a", ("foo",))]), 0)
    assert "selected protocol 'sticky'" in unknown.fatal_error


def test_an_empty_assignment_is_no_partitions() -> None:
    member = make()
    member.subscribe(["foo"])
    sync = join(member, 0, join_response())
    member.on_response(sync, sync_response(b""), 1)
    assert member.state is MemberState.STABLE and member.owned_partitions == PartitionSet()


@pytest.mark.parametrize("code,keeps_id", [(UNKNOWN_MEMBER, False), (ILLEGAL_GENERATION, True)])
def test_heartbeat_unknown_member_or_illegal_generation_loses_everything_and_rejoins(code: int, keeps_id: bool) -> None:
    member = make()
    to_stable(member, {"foo": [0, 1]})
    member.take_events()
    heartbeat = only(member.poll(INTERVAL), m.HeartbeatRequest)
    member.on_response(heartbeat, m.HeartbeatResponse(error_code=code), INTERVAL)
    assert member.take_events() == [PartitionsLost(parts(FOO, 0, 1), code)]
    assert member.state is MemberState.JOINING and member.member_epoch == -1
    rejoin = only(member.poll(INTERVAL), m.JoinGroupRequest)
    assert rejoin.member_id == ("m1" if keeps_id else "")


def test_heartbeat_fenced_instance_is_fatal() -> None:
    member = make(instance_id="i-1")
    to_stable(member, {"foo": [0]})
    member.take_events()
    heartbeat = only(member.poll(INTERVAL), m.HeartbeatRequest)
    member.on_response(heartbeat, m.HeartbeatResponse(error_code=FENCED_INSTANCE), INTERVAL)
    events = member.take_events()
    assert events[0] == PartitionsLost(parts(FOO, 0), FENCED_INSTANCE) and isinstance(events[1], MemberFailed)
    assert member.state is MemberState.FATAL


def test_heartbeat_answers_for_an_older_generation_are_ignored() -> None:
    member = make(assignors=("cooperative-sticky",))
    to_stable(member, {"foo": [0]}, protocol="cooperative-sticky")
    member.take_events()
    old_heartbeat = only(member.poll(INTERVAL), m.HeartbeatRequest)
    member.request_rejoin("test")
    rejoin = only(member.poll(INTERVAL), m.JoinGroupRequest)
    member.on_response(rejoin, join_response(generation=2, protocol="cooperative-sticky"), INTERVAL)
    member.on_response(old_heartbeat, m.HeartbeatResponse(error_code=ILLEGAL_GENERATION), INTERVAL)
    assert member.take_events() == [] and member.member_epoch == 2


def test_heartbeat_rebalance_in_progress_is_ignored_while_completing_and_other_errors_retry() -> None:
    member = make()
    member.subscribe(["foo"])
    sync = join(member, 0, join_response())
    heartbeat = only(member.poll(INTERVAL), m.HeartbeatRequest)
    member.on_response(heartbeat, m.HeartbeatResponse(error_code=REBALANCE_IN_PROGRESS), INTERVAL)
    member.on_response(sync, sync_response(assignment_bytes({"foo": [0]})), INTERVAL)
    assert member.state is MemberState.STABLE  # not asked to rejoin
    heartbeat = only(member.poll(2 * INTERVAL), m.HeartbeatRequest)
    member.on_response(heartbeat, m.HeartbeatResponse(error_code=NOT_COORDINATOR), 2 * INTERVAL)
    assert CoordinatorUnavailable(NOT_COORDINATOR) in member.take_events()
    assert member.next_deadline() == 2 * INTERVAL + BACKOFF
    heartbeat = only(member.poll(2 * INTERVAL + BACKOFF), m.HeartbeatRequest)
    member.on_response(heartbeat, m.HeartbeatResponse(error_code=Errors.GroupAuthorizationFailedError.errno), 2 * INTERVAL + BACKOFF)
    assert member.state is MemberState.STABLE and member.next_deadline() == 2 * INTERVAL + 2 * BACKOFF


# ----------------------------------------------------------------------------- guards


def test_a_revocation_not_done_within_the_rebalance_timeout_loses_everything_and_rejoins_afresh() -> None:
    member = make()
    to_stable(member, {"foo": [0, 1]})
    member.take_events()
    heartbeat = only(member.poll(INTERVAL), m.HeartbeatRequest)
    member.on_response(heartbeat, m.HeartbeatResponse(error_code=REBALANCE_IN_PROGRESS), INTERVAL + 10)
    assert member.poll(INTERVAL + 10) == []
    [revoke] = member.take_events()
    # The rebalance may have begun right after the SyncGroup (sent at 0) was answered.
    assert member.next_deadline() <= REBALANCE
    # Heartbeats keep going (and keep being answered) while the application is stuck.
    now = 2 * INTERVAL
    while now < REBALANCE:
        for request in member.poll(now):
            member.on_response(request, m.HeartbeatResponse(error_code=REBALANCE_IN_PROGRESS), now)
        now += INTERVAL
    requests = member.poll(REBALANCE)
    assert member.take_events() == [PartitionsLost(parts(FOO, 0, 1), TIMED_OUT)]
    rejoin = only(requests, m.JoinGroupRequest)
    assert rejoin.member_id == ""
    member.revocation_done(now, revoke.revocation_id)  # too late: ignored
    assert member.take_events() == []


def test_the_rebalance_guard_counts_from_the_last_settled_answer_not_from_the_first_rebalance_answer() -> None:
    """In a classic group the coordinator's rebalance (and its timer) may have started as soon
    as it answered the member's last heartbeat without error; the heartbeat that hears of it
    may be sent an interval later. The guard must not fire after the coordinator may hand the
    partitions on."""
    member = make()
    to_stable(member, {"foo": [0, 1]})  # the SyncGroup, sent at 0, answered at 0
    member.take_events()
    heartbeat = only(member.poll(INTERVAL), m.HeartbeatRequest)
    member.on_response(heartbeat, m.HeartbeatResponse(error_code=NONE), INTERVAL + 10)
    heartbeat = only(member.poll(2 * INTERVAL), m.HeartbeatRequest)
    member.on_response(heartbeat, m.HeartbeatResponse(error_code=REBALANCE_IN_PROGRESS), 2 * INTERVAL + 10)
    assert member.poll(2 * INTERVAL + 10) == []
    [revoke] = member.take_events()  # eager: revokes everything, stuck in the application
    # The rebalance began after the coordinator answered the heartbeat sent at INTERVAL.
    assert member.next_deadline() <= INTERVAL + REBALANCE
    now = 3 * INTERVAL
    while now < INTERVAL + REBALANCE:
        for request in member.poll(now):
            member.on_response(request, m.HeartbeatResponse(error_code=REBALANCE_IN_PROGRESS), now)
        now += INTERVAL
    assert member.revoking_partitions == parts(FOO, 0, 1)
    rejoin = only(member.poll(INTERVAL + REBALANCE), m.JoinGroupRequest)
    assert member.take_events() == [PartitionsLost(parts(FOO, 0, 1), TIMED_OUT)]
    assert rejoin.member_id == ""


def test_a_leaving_member_stuck_revoking_past_the_rebalance_timeout_loses_its_partitions_and_leaves() -> None:
    """Leaving, a member revokes everything before its LeaveGroup and heartbeats meanwhile; a
    rebalance the coordinator starts then (REBALANCE_IN_PROGRESS) removes it once the rebalance
    timeout passes without its rejoin, and hands its partitions on. Found by the simulator's
    migration profile (seed 21): the member kept revoking them while another owned them."""
    member = make()
    to_stable(member, {"foo": [0, 1]})
    member.take_events()
    member.leave(INTERVAL // 2)
    [revoke] = member.take_events()
    heartbeat = only(member.poll(INTERVAL), m.HeartbeatRequest)
    member.on_response(heartbeat, m.HeartbeatResponse(error_code=REBALANCE_IN_PROGRESS), INTERVAL + 10)
    assert member.next_deadline() <= REBALANCE
    now = 2 * INTERVAL
    while now < REBALANCE:
        for request in member.poll(now):
            member.on_response(request, m.HeartbeatResponse(error_code=REBALANCE_IN_PROGRESS), now)
        now += INTERVAL
    assert member.revoking_partitions == parts(FOO, 0, 1)
    leave = only(member.poll(REBALANCE), m.LeaveGroupRequest)  # best effort, as Kafka's
    assert member.take_events() == [PartitionsLost(parts(FOO, 0, 1), TIMED_OUT)]
    assert member.revoking_partitions == PartitionSet() and member.owned_partitions == PartitionSet()
    member.revocation_done(REBALANCE + 1, revoke.revocation_id)  # too late: ignored
    member.on_response(leave, m.LeaveGroupResponse(error_code=UNKNOWN_MEMBER, members=[]), REBALANCE + 2)
    assert member.take_events() == [LeftGroup(-1)]


def test_a_leaving_member_without_answers_for_a_session_loses_what_it_still_revokes_when_guarded() -> None:
    member = make(lose_partitions_on_session_timeout=True)
    to_stable(member, {"foo": [0]})
    member.take_events()
    member.leave(1)
    member.take_events()
    for now in range(INTERVAL, SESSION, INTERVAL):
        for request in member.poll(now):
            member.on_request_failed(request, now)
    member.poll(SESSION)
    events = member.take_events()
    assert PartitionsLost(parts(FOO, 0), TIMED_OUT) in events
    assert member.revoking_partitions == PartitionSet()


def test_a_cooperative_member_whose_join_goes_unanswered_gives_up_its_partitions_when_guarded() -> None:
    """A cooperative member keeps processing while its JoinGroup waits (KIP-429), and sends no
    heartbeats then. If the JoinGroup or its answer is lost, the coordinator removes the member
    a rebalance timeout after the rebalance began (it never joined) or after answering it (it
    never synced) and hands its partitions on, while the member waits out the JoinGroup's
    request timeout. Guarded, the member lets them go by then; Kafka's consumer keeps them.
    Found by the simulator's migration profile (seeds 8, 31: two owners)."""
    for guarded in (False, True):
        member = make(assignors=("cooperative-sticky",), lose_partitions_on_session_timeout=guarded)
        to_stable(member, {"foo": [0, 1]}, protocol="cooperative-sticky")  # SyncGroup sent at 0
        member.take_events()
        heartbeat = only(member.poll(INTERVAL), m.HeartbeatRequest)
        member.on_response(heartbeat, m.HeartbeatResponse(error_code=REBALANCE_IN_PROGRESS), INTERVAL + 10)
        only(member.poll(INTERVAL + 10), m.JoinGroupRequest)
        assert member.owned_partitions == parts(FOO, 0, 1)  # kept while joining
        assert member.poll(REBALANCE - 1) == [] and member.take_events() == []
        assert member.poll(REBALANCE) == []  # still waiting for the JoinGroup's answer
        if not guarded:
            assert member.take_events() == [] and member.owned_partitions == parts(FOO, 0, 1)
            continue
        assert member.take_events() == [PartitionsLost(parts(FOO, 0, 1), TIMED_OUT)]
        assert member.owned_partitions == PartitionSet()
        # The JoinGroup stays outstanding (the coordinator may have had it in time): no new one.
        assert member.poll(REBALANCE + 5) == [] and member.take_events() == []


def test_a_guarded_member_rejoining_on_its_own_counts_from_its_last_answer_not_its_join() -> None:
    """A member that rejoins by itself (here its subscription changed) stops heartbeating. A
    rebalance it never heard of may have begun right after the coordinator's last answer; if
    its JoinGroup is lost the join phase ends without it a rebalance timeout later, and the
    coordinator hands its partitions on. The guard counts from that last answer's send, not
    from the JoinGroup's (the simulator's migration seeds 1016713, 1012499 and seven more: a
    classic member rejoining after a topic change beside the new owner)."""
    member = make(assignors=("cooperative-sticky",), lose_partitions_on_session_timeout=True)
    to_stable(member, {"foo": [0, 1]}, protocol="cooperative-sticky")
    member.take_events()
    heartbeat = only(member.poll(INTERVAL), m.HeartbeatRequest)
    member.on_response(heartbeat, m.HeartbeatResponse(error_code=NONE), INTERVAL + 10)
    member.subscribe(["foo"])
    only(member.poll(3 * INTERVAL), m.JoinGroupRequest)  # lost on its way
    assert member.owned_partitions == parts(FOO, 0, 1)  # kept while rejoining (KIP-429)
    assert member.next_deadline() == INTERVAL + REBALANCE
    assert member.poll(INTERVAL + REBALANCE - 1) == [] and member.take_events() == []
    assert member.poll(INTERVAL + REBALANCE) == []  # the JoinGroup stays outstanding
    assert member.take_events() == [PartitionsLost(parts(FOO, 0, 1), TIMED_OUT)]
    assert member.owned_partitions == PartitionSet()


def test_a_guarded_member_without_answers_for_a_rebalance_timeout_shorter_than_its_session_gives_up() -> None:
    """A rebalance may begin right after the coordinator's last answer; with every later answer
    lost the member never hears of it, and the join phase ends without it a rebalance timeout
    later (a static member stays in the group and the leader assigns around its old partitions;
    a dynamic one is dropped), while its session still runs. Found by the simulator's migration
    profile (seeds 359, 391: a static member at the old generation beside the new owner)."""
    short = 3 * INTERVAL  # the rebalance timeout, below the session timeout
    for guarded in (False, True):
        member = make(instance_id="i-1", rebalance_timeout_ms=short, lose_partitions_on_session_timeout=guarded)
        to_stable(member, {"foo": [0]})  # SyncGroup sent and answered at 0
        member.take_events()
        assert member.next_deadline() <= (short if guarded else INTERVAL)
        for now in range(INTERVAL, short, INTERVAL):
            for request in member.poll(now):
                member.on_request_failed(request, now)
        assert member.take_events() == [] and member.owned_partitions == parts(FOO, 0)
        requests = member.poll(short)
        if not guarded:
            assert member.take_events() == [] and member.owned_partitions == parts(FOO, 0)
            continue
        assert member.take_events() == [CoordinatorUnavailable(TIMED_OUT), PartitionsLost(parts(FOO, 0), TIMED_OUT)]
        rejoin = only(requests, m.JoinGroupRequest)
        assert (rejoin.member_id, rejoin.group_instance_id) == ("", "i-1")


def test_a_guarded_member_answered_after_a_whole_join_phase_still_syncs() -> None:
    """The JoinGroup is a long poll: answered a rebalance timeout after it was sent, the member
    is in the new generation, not out of the group (else every member gives up in turn: the
    simulator's migration seeds 20 and 69 never converged)."""
    short = 3 * INTERVAL
    member = make(rebalance_timeout_ms=short, lose_partitions_on_session_timeout=True)
    member.subscribe(["foo"])
    join_request = only(member.poll(0), m.JoinGroupRequest)
    member.on_response(join_request, join_response(generation=1), short + 10)
    sync = only(member.poll(short + 10), m.SyncGroupRequest)
    assert member.take_events() == []
    member.on_response(sync, sync_response(assignment_bytes({"foo": [0]})), short + 20)
    assert member.classic_state is ClassicState.STABLE and member.owned_partitions == parts(FOO, 0)


def test_a_guarded_cooperative_member_not_synced_a_rebalance_timeout_after_its_join_gives_up() -> None:
    """Once it answers a JoinGroup the coordinator waits a rebalance timeout for the member's
    successful SyncGroup (a KIP-848 group's sync timer for a classic member, a classic group's
    pending sync); a SyncGroup told REBALANCE_IN_PROGRESS and a rejoin that never arrives leave
    that timer running. The member counts from that JoinGroup's send, not its rejoin's (the
    simulator's migration seeds 179, 277, 290, 353: fenced, its partitions handed on)."""
    member = make(assignors=("cooperative-sticky",), lose_partitions_on_session_timeout=True)
    to_stable(member, {"foo": [0, 1]}, protocol="cooperative-sticky")
    member.take_events()
    heartbeat = only(member.poll(INTERVAL), m.HeartbeatRequest)
    member.on_response(heartbeat, m.HeartbeatResponse(error_code=REBALANCE_IN_PROGRESS), INTERVAL)
    rejoin = only(member.poll(INTERVAL), m.JoinGroupRequest)
    member.on_response(rejoin, join_response(generation=2, protocol="cooperative-sticky"), INTERVAL)
    sync = only(member.poll(INTERVAL), m.SyncGroupRequest)
    member.on_response(sync, sync_response(error=REBALANCE_IN_PROGRESS, protocol="cooperative-sticky"), 2 * INTERVAL)
    only(member.poll(2 * INTERVAL), m.JoinGroupRequest)  # never answered
    assert member.owned_partitions == parts(FOO, 0, 1)
    member.poll(INTERVAL + REBALANCE - 1)
    assert member.take_events() == []
    member.poll(INTERVAL + REBALANCE)  # the first JoinGroup's send + the rebalance timeout
    assert member.take_events() == [PartitionsLost(parts(FOO, 0, 1), TIMED_OUT)]


def test_a_guarded_member_leaving_while_not_synced_gives_up_what_it_revokes_at_the_sync_deadline() -> None:
    """The coordinator's sync timer (Kafka's scheduleConsumerGroupSyncTimeout) keeps running
    when the member's SyncGroup is lost and its rejoin never arrives; a leave() then drops the
    join it waited for and turns what it owned into revocations, but not that timer: the member
    is removed a rebalance timeout after its JoinGroup and its partitions handed on while it
    still revokes them, so it gives them up then (LeaveGroup, best effort). Heartbeats answered
    meanwhile do not stop the timer. Found by the simulator's migration profile (seed 103095: a
    leaving classic member revoking a partition its successor already owned)."""
    member = make(assignors=("cooperative-sticky",), lose_partitions_on_session_timeout=True)
    to_stable(member, {"foo": [0, 1]}, protocol="cooperative-sticky")
    member.take_events()
    heartbeat = only(member.poll(INTERVAL), m.HeartbeatRequest)
    member.on_response(heartbeat, m.HeartbeatResponse(error_code=REBALANCE_IN_PROGRESS), INTERVAL)
    rejoin = only(member.poll(INTERVAL), m.JoinGroupRequest)
    member.on_response(rejoin, join_response(generation=2, protocol="cooperative-sticky"), INTERVAL)
    sync = only(member.poll(INTERVAL), m.SyncGroupRequest)
    heartbeat = only(member.poll(2 * INTERVAL), m.HeartbeatRequest)
    member.on_response(heartbeat, m.HeartbeatResponse(error_code=NONE), 2 * INTERVAL)  # session kept
    member.on_request_failed(sync, 3 * INTERVAL)
    only(member.poll(3 * INTERVAL + BACKOFF), m.JoinGroupRequest)  # never answered
    member.leave(4 * INTERVAL)
    [revoke] = member.take_events()
    assert member.state is MemberState.PREPARE_LEAVING and member.revoking_partitions == parts(FOO, 0, 1)
    assert member.next_deadline() <= INTERVAL + REBALANCE
    for now in range(5 * INTERVAL, INTERVAL + REBALANCE, INTERVAL):  # heartbeats still answered
        for request in member.poll(now):
            member.on_response(request, m.HeartbeatResponse(error_code=NONE), now)
    member.poll(INTERVAL + REBALANCE - 1)
    assert member.take_events() == [] and member.revoking_partitions == parts(FOO, 0, 1)
    leave = only(member.poll(INTERVAL + REBALANCE), m.LeaveGroupRequest)  # the rejoin's send + the rebalance timeout
    assert member.take_events() == [PartitionsLost(parts(FOO, 0, 1), TIMED_OUT)]
    assert member.revoking_partitions == PartitionSet() and member.owned_partitions == PartitionSet()
    member.revocation_done(INTERVAL + REBALANCE + 1, revoke.revocation_id)  # too late: ignored
    member.on_response(leave, m.LeaveGroupResponse(error_code=UNKNOWN_MEMBER, members=[]), INTERVAL + REBALANCE + 2)
    assert member.take_events() == [LeftGroup(-1)]


def test_without_answers_for_a_session_the_member_looks_the_coordinator_up_again() -> None:
    member = make()
    to_stable(member, {"foo": [0]})
    member.take_events()
    for now in range(INTERVAL, SESSION, INTERVAL):
        for request in member.poll(now):
            member.on_request_failed(request, now)
    member.poll(SESSION)
    assert member.take_events() == [CoordinatorUnavailable(TIMED_OUT)]
    assert member.owned_partitions == parts(FOO, 0)  # Kafka's behaviour: kept

    guarded = make(lose_partitions_on_session_timeout=True)
    to_stable(guarded, {"foo": [0]})
    guarded.take_events()
    requests = guarded.poll(SESSION)
    assert guarded.take_events() == [CoordinatorUnavailable(TIMED_OUT), PartitionsLost(parts(FOO, 0), TIMED_OUT)]
    assert only(requests, m.JoinGroupRequest).member_id == ""


# ----------------------------------------------------------------------------- leaving


def test_a_dynamic_member_revokes_then_sends_leave_group() -> None:
    member = make()
    to_stable(member, {"foo": [0]})
    member.take_events()
    member.leave(5)
    [revoke] = member.take_events()
    assert member.state is MemberState.PREPARE_LEAVING and member.poll(5) == []
    member.revocation_done(6, revoke.revocation_id)
    leave = only(member.poll(6), m.LeaveGroupRequest)
    assert [(e.member_id, e.group_instance_id) for e in leave.members] == [("m1", None)]
    member.on_response(leave, m.LeaveGroupResponse(error_code=NONE, members=[]), 7)
    assert member.take_events() == [LeftGroup(-1)]
    assert member.state is MemberState.UNSUBSCRIBED and member.member_id == ""


def test_a_static_member_keeps_its_session_on_close_unless_leaving_for_good() -> None:
    member = make(instance_id="i-1")
    to_stable(member, {"foo": [0]})
    member.take_events()
    member.close(5)
    [revoke] = member.take_events()
    member.revocation_done(6, revoke.revocation_id)
    assert member.poll(6) == []  # no LeaveGroup: the session keeps its assignment for its return
    assert member.take_events() == [LeftGroup(-2)]
    with pytest.raises(RuntimeError, match="closed"):
        member.subscribe(["foo"])

    for_good = make(instance_id="i-2")
    to_stable(for_good, {"foo": [0]})
    for_good.take_events()
    for_good.leave(5, permanent=True)
    [revoke] = for_good.take_events()
    for_good.revocation_done(6, revoke.revocation_id)
    leave = only(for_good.poll(6), m.LeaveGroupRequest)
    assert [(e.member_id, e.group_instance_id) for e in leave.members] == [("m1", "i-2")]
    for_good.on_request_failed(leave, 7)  # best effort
    assert for_good.take_events() == [LeftGroup(-1)]


def test_a_member_that_cannot_commit_loses_its_partitions_and_sends_leave_group_at_once() -> None:
    # Its processing failed: no revocation is waited for, and a static member leaves for good.
    member = make(instance_id="i-1")
    to_stable(member, {"foo": [0, 1]})
    member.take_events()
    member.leave(5, permanent=True, lose=True)
    assert member.take_events() == [PartitionsLost(parts(FOO, 0, 1), 0)]
    assert member.owned_partitions == frozenset()
    leave = only(member.poll(5), m.LeaveGroupRequest)
    assert [(e.member_id, e.group_instance_id) for e in leave.members] == [("m1", "i-1")]
    member.on_response(leave, m.LeaveGroupResponse(error_code=NONE, members=[]), 6)
    assert member.take_events() == [LeftGroup(-1)]


def test_leaving_before_joining_sends_nothing() -> None:
    member = make()
    member.subscribe(["foo"])
    member.leave(0)
    assert member.poll(0) == [] and member.take_events() == [LeftGroup(None)]


# ----------------------------------------------------------------------------- inside a KIP-848 group


def test_inside_a_consumer_group_a_cooperative_member_reconciles_through_rejoins() -> None:
    """Kafka's testReconciliationInJoiningConsumerGroupWithCooperativeProtocol, from the member's
    side: the coordinator answers as for a follower, generation = member epoch; the member holds
    foo-0..3 at epoch 10 and its target at epoch 11 is foo-0,1 plus bar-0, which another member
    still holds."""
    member = make(assignors=("cooperative-sticky",))
    to_stable(member, {"foo": [0, 1, 2, 3]}, generation=10, protocol="cooperative-sticky")
    member.take_events()
    # The group epoch moved: Heartbeat says REBALANCE_IN_PROGRESS.
    heartbeat = only(member.poll(INTERVAL), m.HeartbeatRequest)
    member.on_response(heartbeat, m.HeartbeatResponse(error_code=REBALANCE_IN_PROGRESS), INTERVAL)
    rejoin = only(member.poll(INTERVAL), m.JoinGroupRequest)
    assert subscription_of(rejoin).owned_partitions == {"foo": frozenset({0, 1, 2, 3})}
    # UNREVOKED_PARTITIONS: still epoch 10; SyncGroup gives current ∩ target, encoded at v1.
    member.on_response(rejoin, join_response(generation=10, leader="", protocol="cooperative-sticky"), INTERVAL)
    sync = only(member.poll(INTERVAL), m.SyncGroupRequest)
    assert sync.generation_id == 10 and sync.assignments == []
    member.on_response(sync, sync_response(assignment_bytes({"foo": [0, 1]}, version=1), protocol="cooperative-sticky"), INTERVAL)
    [revoke] = member.take_events()
    assert revoke.partitions == parts(FOO, 2, 3)
    member.revocation_done(INTERVAL + 1, revoke.revocation_id)
    # The rejoin advances it to epoch 11 (UNRELEASED_PARTITIONS: bar-0 not released yet).
    again = only(member.poll(INTERVAL + 1), m.JoinGroupRequest)
    member.on_response(again, join_response(generation=11, leader="", protocol="cooperative-sticky"), INTERVAL + 1)
    sync = only(member.poll(INTERVAL + 1), m.SyncGroupRequest)
    member.on_response(sync, sync_response(assignment_bytes({"foo": [0, 1]}), protocol="cooperative-sticky"), INTERVAL + 1)
    assert member.take_events() == [] and member.member_epoch == 11
    # bar-0 is released: Heartbeat says REBALANCE_IN_PROGRESS again; the rejoin collects it.
    now = 2 * INTERVAL + 1
    heartbeat = only(member.poll(now), m.HeartbeatRequest)
    assert heartbeat.generation_id == 11
    member.on_response(heartbeat, m.HeartbeatResponse(error_code=REBALANCE_IN_PROGRESS), now)
    last = only(member.poll(now), m.JoinGroupRequest)
    member.on_response(last, join_response(generation=11, leader="", protocol="cooperative-sticky"), now)
    sync = only(member.poll(now), m.SyncGroupRequest)
    member.on_response(sync, sync_response(assignment_bytes({"foo": [0, 1], "bar": [0]}), protocol="cooperative-sticky"), now)
    assert member.take_events() == [PartitionsAssigned(parts(BAR, 0), 11)]
    assert member.owned_partitions == parts(FOO, 0, 1) | parts(BAR, 0) and member.state is MemberState.STABLE


def test_inside_a_consumer_group_an_eager_member_revokes_all_and_advances_on_rejoin() -> None:
    member = make()
    to_stable(member, {"foo": [0, 1]}, generation=10)
    member.take_events()
    heartbeat = only(member.poll(INTERVAL), m.HeartbeatRequest)
    member.on_response(heartbeat, m.HeartbeatResponse(error_code=REBALANCE_IN_PROGRESS), INTERVAL)
    assert member.poll(INTERVAL) == []
    [revoke] = member.take_events()
    assert revoke.partitions == parts(FOO, 0, 1)
    member.revocation_done(INTERVAL, revoke.revocation_id)
    rejoin = only(member.poll(INTERVAL), m.JoinGroupRequest)
    assert subscription_of(rejoin).owned_partitions == {}
    member.on_response(rejoin, join_response(generation=11, leader=""), INTERVAL)
    sync = only(member.poll(INTERVAL), m.SyncGroupRequest)
    member.on_response(sync, sync_response(assignment_bytes({"foo": [0]}, version=3)), INTERVAL)
    assert member.take_events() == [PartitionsAssigned(parts(FOO, 0), 11)]


# ----------------------------------------------------------------------------- configuration and helpers


def test_the_rebalance_protocol_is_the_best_every_assignor_supports() -> None:
    assert ClassicMemberConfig(group_id="g").rebalance_protocol is RebalanceProtocol.EAGER  # range + cooperative-sticky
    assert ClassicMemberConfig(group_id="g", assignors=("cooperative-sticky", "uniform")).rebalance_protocol is RebalanceProtocol.COOPERATIVE
    assert ClassicMemberConfig(group_id="g", assignors=(RecordingAssignor(),)).rebalance_protocol is RebalanceProtocol.COOPERATIVE


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"group_id": ""}, "group_id"),
        ({"group_id": "g", "assignors": ()}, "at least one assignor"),
        ({"group_id": "g", "assignors": ("roundrobin",)}, "unknown assignor"),
        ({"group_id": "g", "assignors": ("range", "range")}, "unique"),
        ({"group_id": "g", "heartbeat_interval_ms": 5000, "session_timeout_ms": 5000}, "heartbeat_interval_ms"),
        ({"group_id": "g", "instance_id": ""}, "instance_id"),
    ],
)
def test_bad_configuration_is_refused_with_the_reason(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        ClassicMemberConfig(**kwargs)


def test_topic_names_in_lists_what_a_response_makes_the_member_resolve() -> None:
    members = [member_entry("a", ("foo",), owned={"bar": [1]}), ("b", None, b"junk")]
    assert topic_names_in(join_response(members=members)) == {"foo", "bar"}
    assert topic_names_in(sync_response(assignment_bytes({"baz": [0]}))) == {"baz"}
    assert topic_names_in(sync_response(error=REBALANCE_IN_PROGRESS)) == set()
    assert topic_names_in(m.HeartbeatResponse(error_code=0)) == set()
