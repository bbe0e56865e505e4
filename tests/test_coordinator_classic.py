"""Classic groups on the coordinator: JoinGroup, SyncGroup, Heartbeat and LeaveGroup with
Apache Kafka's rules (KIP-394 member ids, the initial rebalance delay, KIP-345 static members,
leader election, protocol selection, timeouts, errors), records as the truth."""

from __future__ import annotations

import kafka.errors as Errors
import msgspec
import pytest
from classic_support import REBALANCE_MS, SESSION_MS, Classic, assignment, decoded, form_group, leave
from coordinator_support import FAST, GROUP, Harness, RoundRobinAssignor

from pystreams.coordinator import records as r
from pystreams.coordinator.classic_group import ClassicGroup, ClassicGroupState
from pystreams.coordinator.context import DEFERRED
from pystreams.coordinator.shard import GroupCoordinatorShard, HandlerFailed
from pystreams.protocol import messages as m

DELAY = FAST.initial_rebalance_delay_ms
Stable, Preparing, Completing, Empty = (
    ClassicGroupState.STABLE,
    ClassicGroupState.PREPARING_REBALANCE,
    ClassicGroupState.COMPLETING_REBALANCE,
    ClassicGroupState.EMPTY,
)


def harness(**config) -> Harness:
    h = Harness(msgspec.structs.replace(FAST, **config) if config else FAST, assignors={"range": RoundRobinAssignor()})
    h.topics(foo=4, bar=2)
    return h


def wait_out_initial_delay(h: Harness, windows: int = 2) -> None:
    """Members that joined in the same window extend the delay once: step through each window."""
    for _ in range(windows):
        h.advance(DELAY)


def classic_records(h: Harness) -> list[r.ClassicGroupValue | None]:
    return [record.value for record in h.last_records if isinstance(record, r.ClassicGroupMetadata)]


# --- JoinGroup ------------------------------------------------------------------------------


def test_a_new_member_takes_a_member_id_first_then_waits_out_the_initial_delay() -> None:
    h = harness()
    a = Classic(h)
    first = a.join()
    assert first.error_code == Errors.MemberIdRequiredError.errno and first.member_id.startswith("c-")
    # The group exists because a record says so: generation 0, no members.
    assert classic_records(h) == [r.ClassicGroupValue(protocol_type="", generation=0, protocol=None, leader=None, current_state_timestamp=0)]
    assert a.join() is DEFERRED
    assert h.group.state is Preparing
    h.advance(DELAY - 1)
    assert a.answer() is None  # the initial rebalance completes only when its delay is over
    h.advance(1)
    joined = a.answer()
    assert (joined.error_code, joined.generation_id, joined.leader, joined.protocol_name) == (0, 1, a.member_id, "range")
    assert [(mb.member_id, mb.metadata) for mb in joined.members] == [(a.member_id, a.metadata())]
    assert h.last_records == []  # completing the join writes nothing: the leader's sync does
    assert h.group.state is Completing
    h.assert_replay_equals_live()


def test_members_arriving_during_the_initial_delay_extend_it_up_to_the_rebalance_timeout() -> None:
    h = harness(initial_rebalance_delay_ms=3_000)
    a, b = Classic(h, rebalance_ms=7_000), Classic(h, rebalance_ms=7_000)
    a.join_fully()
    h.advance(2_000)
    b.join_fully()  # within the first window: the delay is extended by another 3 s
    h.advance(1_000)
    assert a.answer() is None and b.answer() is None
    h.advance(2_999)
    assert a.answer() is None
    h.advance(1)
    assert a.answer().error_code == 0 and b.answer().error_code == 0
    assert h.group.generation == 1 and len(h.group.members) == 2


def test_the_leader_gets_every_members_metadata_and_the_followers_wait_for_its_assignment() -> None:
    h = harness()
    a, b = Classic(h, topics=("foo",)), Classic(h, topics=("foo", "bar"))
    for member in (a, b):
        member.join_fully()
    wait_out_initial_delay(h)
    ja, jb = a.answer(), b.answer()
    assert ja.leader == jb.leader == a.member_id
    assert {mb.member_id: mb.metadata for mb in ja.members} == {a.member_id: a.metadata(), b.member_id: b.metadata()}
    assert jb.members == []
    assert b.sync() is DEFERRED
    assert h.last_records == []
    plan = {a.member_id: assignment(foo=[0, 1]), b.member_id: assignment(foo=[2, 3], bar=[0, 1])}
    assert a.sync(plan) is DEFERRED
    stored = classic_records(h)[0]
    assert (stored.generation, stored.protocol, stored.leader) == (1, "range", a.member_id)
    assert {mv.member_id: (mv.subscription, mv.assignment) for mv in stored.members} == {
        a.member_id: (a.metadata(), plan[a.member_id]),
        b.member_id: (b.metadata(), plan[b.member_id]),
    }
    assert decoded(a.answer().assignment) == {"foo": [0, 1]}
    assert decoded(b.answer().assignment) == {"foo": [2, 3], "bar": [0, 1]}
    assert h.group.state is Stable
    h.assert_replay_equals_live()


def test_protocol_selection_is_a_vote_over_protocols_every_member_supports() -> None:
    h = harness()
    a = Classic(h, protocols=("roundrobin", "range", "sticky"))
    b = Classic(h, protocols=("range", "sticky"))
    c = Classic(h, protocols=("sticky", "range"))
    for member in (a, b, c):
        member.join_fully()
    wait_out_initial_delay(h)
    assert {member.answer().protocol_name for member in (a, b, c)} == {"range"}  # a and b vote range, c sticky
    # A newcomer must share a protocol with every member, and the group's protocol type.
    d = Classic(h, protocols=("roundrobin",))
    assert d.join().error_code == Errors.InconsistentGroupProtocolError.errno
    e = Classic(h)
    assert e.join(protocol_type="connect").error_code == Errors.InconsistentGroupProtocolError.errno


def test_a_group_rebalancing_with_no_members_left_takes_any_protocol_of_the_right_type() -> None:
    """Kafka's supportsProtocols counts a protocol no member offers as 0 supporters, which
    equals 0 members: a group whose only member left during its first join phase (still
    PreparingRebalance, not yet Empty) accepts the next member whatever its assignor. Found by
    the simulator's migration profile (seed 219: every later member failed fatally)."""
    h = harness()
    a = Classic(h)
    a.join_fully()
    assert a.leave() == 0
    assert h.group.state is ClassicGroupState.PREPARING_REBALANCE and not h.group.members
    b = Classic(h, protocols=("cooperative-sticky",))
    first = b.join()
    assert first is DEFERRED or (first.error_code == Errors.MemberIdRequiredError.errno and b.join() is DEFERRED)
    wait_out_initial_delay(h)
    answer = b.answer()
    assert (answer.error_code, answer.protocol_name) == (0, "cooperative-sticky")
    # The group's protocol type still has to match.
    assert Classic(h, protocols=("range",)).join(protocol_type="connect").error_code == Errors.InconsistentGroupProtocolError.errno


def test_join_group_validation_before_the_group() -> None:
    h = harness()
    assert Classic(h, group_id="").join().error_code == Errors.InvalidGroupIdError.errno
    assert Classic(h, session_ms=FAST.classic_min_session_timeout_ms - 1).join().error_code == Errors.InvalidSessionTimeoutError.errno
    assert Classic(h, session_ms=FAST.classic_max_session_timeout_ms + 1).join().error_code == Errors.InvalidSessionTimeoutError.errno
    # A member id the coordinator never handed out, for a group that does not exist.
    assert Classic(h, member_id="made-up").join().error_code == Errors.UnknownMemberIdError.errno
    assert GROUP not in h.shard.groups
    # No protocols at all: an empty group takes any non-empty offer only.
    assert Classic(h).join(protocols=[]).error_code == Errors.InconsistentGroupProtocolError.errno


def test_v3_members_join_without_a_member_id_round_trip() -> None:
    h = harness()
    a = Classic(h, version=3)
    assert a.join() is DEFERRED  # no MEMBER_ID_REQUIRED before v4
    # The new group's record is the empty group, even though a member is already in it: the
    # member is written with its generation. (Written with it, it replayed as a Stable member
    # without a protocol, and an upgrade then failed on its empty subscription.)
    assert classic_records(h) == [r.ClassicGroupValue(protocol_type="", generation=0, protocol=None, leader=None, current_state_timestamp=0)]
    assert h.replayed().groups[GROUP].state is ClassicGroupState.EMPTY
    h.advance(DELAY)
    joined = a.answer()
    assert joined.error_code == 0 and joined.member_id


def test_a_stable_follower_rejoining_with_the_same_protocols_gets_its_generation_back() -> None:
    h = harness()
    a, b = Classic(h), Classic(h)
    form_group(h, [a, b], {0: {"foo": [0, 1]}, 1: {"foo": [2, 3]}})
    b.owned = {}  # exactly the protocols it joined with
    again = b.join()
    assert (again.error_code, again.generation_id, again.members) == (0, 1, [])
    assert h.group.state is Stable
    # The leader rejoining always starts a rebalance (its way to force one).
    assert a.join() is DEFERRED
    assert h.group.state is Preparing
    assert b.heartbeat() == Errors.RebalanceInProgressError.errno


def test_a_rebalance_completes_when_everyone_rejoined_and_drops_dynamic_members_that_did_not() -> None:
    h = harness()
    a, b, c = Classic(h), Classic(h), Classic(h)
    form_group(h, [a, b, c], {0: {"foo": [0]}, 1: {"foo": [1]}, 2: {"foo": [2, 3]}})
    d = Classic(h)
    d.join_fully()  # a newcomer: a rebalance
    assert h.group.state is Preparing
    for member in (a, b):
        assert member.heartbeat() == Errors.RebalanceInProgressError.errno
        assert member.join() is DEFERRED
    assert a.answer() is None
    h.advance(REBALANCE_MS)  # c never rejoined: dropped when the rebalance timeout ends the join phase
    answers = {member.member_id: member.answer() for member in (a, b, d)}
    assert all(answer.generation_id == 2 for answer in answers.values())
    assert set(h.group.members) == {a.member_id, b.member_id, d.member_id}
    assert c.heartbeat() == Errors.UnknownMemberIdError.errno


def test_group_max_size_refuses_newcomers_before_handing_them_a_member_id() -> None:
    h = harness(classic_max_group_size=2)
    a, b = Classic(h), Classic(h)
    form_group(h, [a, b], {0: {"foo": [0, 1]}, 1: {"foo": [2, 3]}})
    c = Classic(h)
    assert c.join().error_code == Errors.GroupMaxSizeReachedError.errno
    assert set(h.group.members) == {a.member_id, b.member_id} and h.group.state is Stable


# --- SyncGroup, Heartbeat -------------------------------------------------------------------


def test_sync_and_heartbeat_errors() -> None:
    h = harness()
    a, b = Classic(h), Classic(h)
    form_group(h, [a, b], {0: {"foo": [0, 1]}, 1: {"foo": [2, 3]}})
    assert b.heartbeat() == 0
    assert b.heartbeat(generation=0) == Errors.IllegalGenerationError.errno
    assert b.sync(generation=7).error_code == Errors.IllegalGenerationError.errno
    assert b.sync(protocol_name="roundrobin").error_code == Errors.InconsistentGroupProtocolError.errno
    stranger = Classic(h, member_id="nobody", generation=1)
    assert stranger.heartbeat() == Errors.UnknownMemberIdError.errno
    assert stranger.sync().error_code == Errors.UnknownMemberIdError.errno
    assert Classic(h, group_id="absent", member_id="x").heartbeat() == Errors.UnknownMemberIdError.errno
    # Stable: a sync (a member that lost the answer) gets its assignment at once.
    assert decoded(b.sync().assignment) == {"foo": [2, 3]}
    # v5 must name the protocol type and name.
    request = m.SyncGroupRequest(
        group_id=GROUP, generation_id=1, member_id=b.member_id, group_instance_id=None, protocol_type=None, protocol_name=None, assignments=[]
    )
    request.API_VERSION = 5
    assert h.send(request).error_code == Errors.InconsistentGroupProtocolError.errno


def test_a_member_that_stops_heartbeating_is_removed_and_the_group_rebalances() -> None:
    h = harness()
    a, b = Classic(h), Classic(h)
    form_group(h, [a, b], {0: {"foo": [0, 1]}, 1: {"foo": [2, 3]}})
    h.advance(SESSION_MS - 1)
    assert a.heartbeat() == 0
    h.advance(1)
    assert set(h.group.members) == {a.member_id}
    assert h.group.state is Preparing  # a is the only member left: rejoining ends the join phase
    assert a.heartbeat() == Errors.RebalanceInProgressError.errno
    assert a.join() is DEFERRED
    assert a.answer().generation_id == 2


def test_members_that_joined_but_never_synced_are_removed_after_the_rebalance_timeout() -> None:
    h = harness()
    a, b = Classic(h), Classic(h)
    for member in (a, b):
        member.join_fully()
    wait_out_initial_delay(h)
    a.answer(), b.answer()
    a.sync({a.member_id: assignment(foo=[0, 1, 2, 3])})  # the leader syncs; b does not
    a.answer()
    for _ in range(4):
        h.advance(REBALANCE_MS // 4)
        a.heartbeat()  # a stays alive; b is silent after its join
    assert set(h.group.members) == {a.member_id}
    assert h.group.state is Preparing


def test_the_last_member_leaving_empties_the_group_with_a_record_and_retention_deletes_it() -> None:
    h = harness(empty_group_retention_ms=60_000)
    a = Classic(h)
    form_group(h, [a], {0: {"foo": [0, 1, 2, 3]}})
    assert a.commit(offset=42) == 0
    assert a.leave() == 0
    assert h.group.state is Empty
    value = classic_records(h)[-1]
    assert (value.generation, value.protocol, value.leader, value.members, value.protocol_type) == (2, None, None, [], "consumer")
    h.advance(60_000)
    assert GROUP not in h.shard.groups
    assert any(isinstance(rec, r.ClassicGroupMetadata) and rec.value is None for rec in h.last_records)
    assert h.shard.offsets.of(GROUP) == {}
    h.assert_replay_equals_live()


# --- static members (KIP-345) ----------------------------------------------------------------


def test_a_returning_static_member_keeps_its_assignment_without_a_rebalance() -> None:
    h = harness()
    a, b = Classic(h, instance_id="a"), Classic(h, instance_id="b")
    form_group(h, [a, b], {0: {"foo": [0, 1]}, 1: {"foo": [2, 3]}})
    old_id = b.member_id
    b_again = Classic(h, instance_id="b")  # restarted: no member id
    joined = b_again.join()
    assert joined.error_code == 0 and joined.member_id != old_id and joined.generation_id == 1
    assert joined.leader == a.member_id and joined.members == [] and not joined.skip_assignment
    assert h.group.state is Stable
    assert classic_records(h)[0].members[1].member_id == joined.member_id  # the replacement is recorded
    assert decoded(b_again.sync().assignment) == {"foo": [2, 3]}
    # The old incarnation is fenced everywhere.
    assert b.heartbeat() == Errors.FencedInstanceIdError.errno
    assert b.commit() == Errors.FencedInstanceIdError.errno
    h.assert_replay_equals_live()


def test_a_returning_static_leader_skips_the_assignment_from_v9_and_is_not_told_it_leads_before() -> None:
    h = harness()
    a, b = Classic(h, instance_id="a", version=9), Classic(h, instance_id="b", version=9)
    form_group(h, [a, b], {0: {"foo": [0, 1]}, 1: {"foo": [2, 3]}})
    new = Classic(h, instance_id="a", version=9).join()
    assert new.leader == new.member_id and new.skip_assignment and len(new.members) == 2
    old_leader = h.group.leader_id
    legacy = Classic(h, instance_id="a", version=7).join()
    assert legacy.leader == old_leader and legacy.leader != legacy.member_id


@pytest.mark.parametrize("change", ["partitions added", "subscription grew"])
def test_a_returning_static_member_rebalances_when_the_assignment_it_would_get_back_is_stale(change: str) -> None:
    """Handing a returning static member its old assignment without a rebalance (KIP-345) is
    only right while that assignment still fits: partitions added while the leader was away
    (it watches the metadata only from its return on), or a subscription that grew while it
    was (KAFKA-12759: a regex now matching a new topic), would otherwise go to nobody for good
    (the simulator's migration seeds 102217 and 102559; 101356 and 102358)."""
    h = harness()
    a, b = Classic(h, instance_id="a", version=9), Classic(h, instance_id="b", version=9)
    form_group(h, [a, b], {0: {"foo": [0, 1]}, 1: {"foo": [2, 3]}})
    if change == "partitions added":
        h.topics(foo=6, bar=2)
        returning, other = Classic(h, instance_id="a", version=9), b  # the leader
    else:
        returning, other = Classic(h, instance_id="b", version=9, topics=("bar", "foo")), a
    assert returning.join() is DEFERRED  # no SkipAssignment answer: the group rebalances
    assert h.group.state is Preparing
    assert other.heartbeat() == Errors.RebalanceInProgressError.errno
    other.join()
    joined = returning.answer()
    assert joined.error_code == 0 and joined.generation_id == 2 and not joined.skip_assignment
    h.assert_replay_equals_live()


def test_a_returning_static_member_keeps_a_current_assignment_whatever_the_topics_it_does_not_read() -> None:
    h = harness()
    a, b = Classic(h, instance_id="a", version=9), Classic(h, instance_id="b", version=9)
    form_group(h, [a, b], {0: {"foo": [0, 1]}, 1: {"foo": [2, 3]}})
    h.topics(foo=4, bar=3, baz=2)  # nobody subscribes to bar or baz
    joined = Classic(h, instance_id="a", version=9).join()
    assert joined.error_code == 0 and joined.skip_assignment and h.group.state is Stable


def test_partitions_added_to_a_subscribed_topic_rebalance_a_stable_group_unrelated_topics_do_not() -> None:
    # Kafka leaves this to the leader's metadata watch, which misses partitions added before
    # it learns it leads (a conversion without a rebalance, a static leader back): the
    # coordinator, which sees every change, rebalances (simulator, migration seed 101613).
    h = harness()
    a, b = Classic(h, instance_id="a", version=9), Classic(h, instance_id="b", version=9)
    form_group(h, [a, b], {0: {"foo": [0, 1]}, 1: {"foo": [2, 3]}})
    h.topics(foo=4, bar=3)  # nobody reads bar
    assert h.group.state is Stable
    assert h.last_records == []
    h.topics(foo=6, bar=3)
    assert h.group.state is Preparing
    # Preparing a rebalance is memory only, as in Kafka: the group's record changes when the
    # next generation's leader syncs, so the topic change itself writes nothing.
    assert h.last_records == []
    assert a.heartbeat() == Errors.RebalanceInProgressError.errno
    assert h.last_records == []
    h.assert_replay_equals_live()


def test_batch_leave_by_instance_id_reports_each_member() -> None:
    h = harness()
    a, b, c = Classic(h, instance_id="a"), Classic(h, instance_id="b"), Classic(h)
    form_group(h, [a, b, c], {0: {"foo": [0]}, 1: {"foo": [1]}, 2: {"foo": [2, 3]}})
    response = leave(h, [("", "a"), ("wrong-id", "b"), ("", "nobody"), (c.member_id, None)])
    assert [(mb.member_id, mb.error_code) for mb in response.members] == [
        ("", 0),
        ("wrong-id", Errors.FencedInstanceIdError.errno),
        ("", Errors.UnknownMemberIdError.errno),
        (c.member_id, 0),
    ]
    assert set(h.group.members) == {b.member_id}
    assert h.group.state is Preparing
    # v0-2: one member, its error at the top level.
    assert leave(h, [("nobody", None)], version=1).error_code == Errors.UnknownMemberIdError.errno


# --- offsets --------------------------------------------------------------------------------


def test_offset_commits_carry_the_generation() -> None:
    h = harness()
    a, b = Classic(h), Classic(h)
    form_group(h, [a, b], {0: {"foo": [0, 1]}, 1: {"foo": [2, 3]}})
    assert a.commit(generation=1) == 0
    assert a.commit(generation=0) == Errors.IllegalGenerationError.errno
    a.join()  # the leader rejoins: PreparingRebalance, the old generation still commits
    assert b.commit(generation=1) == 0
    b.join()
    h.advance(0)
    a.answer(), b.answer()
    assert h.group.state is Completing
    assert b.commit(generation=2) == Errors.RebalanceInProgressError.errno
    assert Classic(h, group_id="nope", member_id="x", generation=3).commit(version=9) == Errors.GroupIdNotFoundError.errno
    assert Classic(h, group_id="nope", member_id="x", generation=3).commit(version=8) == Errors.IllegalGenerationError.errno


# --- listing, describing, loading -----------------------------------------------------------


def test_list_and_describe_show_a_classic_group() -> None:
    h = harness()
    a = Classic(h)
    joined_with = a.metadata()
    form_group(h, [a], {0: {"foo": [0, 1, 2, 3]}})
    listed = h.send(m.ListGroupsRequest(states_filter=[], types_filter=["classic"])).groups
    assert [(g.group_id, g.protocol_type, g.group_state, g.group_type) for g in listed] == [(GROUP, "consumer", "Stable", "classic")]
    assert h.send(m.ListGroupsRequest(states_filter=[], types_filter=["consumer"])).groups == []
    described = h.send(m.DescribeGroupsRequest(groups=[GROUP], include_authorized_operations=False)).groups[0]
    assert (described.group_state, described.protocol_type, described.protocol_data) == ("Stable", "consumer", "range")
    assert [(mb.member_id, mb.member_metadata, decoded(mb.member_assignment)) for mb in described.members] == [
        (a.member_id, joined_with, {"foo": [0, 1, 2, 3]})
    ]
    consumer_describe = h.send(m.ConsumerGroupDescribeRequest(group_ids=[GROUP], include_authorized_operations=False)).groups[0]
    assert consumer_describe.error_code == Errors.GroupIdNotFoundError.errno


def test_a_loaded_group_comes_back_stable_and_its_members_must_keep_heartbeating() -> None:
    h = harness()
    a, b = Classic(h), Classic(h)
    form_group(h, [a, b], {0: {"foo": [0, 1]}, 1: {"foo": [2, 3]}})
    c = Classic(h)
    c.join_fully()  # a rebalance in progress is not stored: the load sees the last stable generation
    shard = h.replayed()
    group = shard.groups[GROUP]
    assert isinstance(group, ClassicGroup) and group.state is Stable and group.generation == 1
    assert set(group.members) == {a.member_id, b.member_id}
    h.shard = shard
    h._collect(shard.on_loaded(h.now))
    h.advance(SESSION_MS // 2)
    assert a.heartbeat() == 0
    h.advance(SESSION_MS // 2)  # b was not heard from since the load: its session ran out
    assert set(shard.groups[GROUP].members) == {a.member_id}


@pytest.mark.parametrize("steps", range(1, 7))
def test_live_state_is_what_replaying_its_records_gives(steps: int) -> None:
    h = harness()
    members = [Classic(h, instance_id="s" if i == 0 else None) for i in range(3)]
    form_group(h, members, {0: {"foo": [0]}, 1: {"foo": [1, 2]}, 2: {"foo": [3], "bar": [0, 1]}})
    actions = [
        lambda: members[1].leave(),
        lambda: Classic(h, instance_id="s").join(),
        lambda: h.advance(SESSION_MS),
        lambda: members[2].join(),
        lambda: h.advance(REBALANCE_MS),
        lambda: Classic(h).join_fully(),
    ]
    for action in actions[:steps]:
        action()
        h.assert_replay_equals_live()


def test_a_failing_join_leaves_no_trace(monkeypatch) -> None:
    h = harness()
    a, b = Classic(h), Classic(h)
    form_group(h, [a, b], {0: {"foo": [0, 1]}, 1: {"foo": [2, 3]}})
    from pystreams.coordinator import classic

    def broken(*args, **kwargs):
        raise RuntimeError("injected")

    monkeypatch.setattr(classic.ClassicGroupManager, "_prepare_rebalance", broken)
    c = Classic(h)
    c.join()
    before = (h.shard.snapshot(), repr(h.group), dict(h.shard.timers._deadlines))
    with pytest.raises(HandlerFailed):
        c.join()  # rebalances, then fails in the middle
    assert (h.shard.snapshot(), repr(h.group), dict(h.shard.timers._deadlines)) == before
    assert isinstance(h.shard, GroupCoordinatorShard)
