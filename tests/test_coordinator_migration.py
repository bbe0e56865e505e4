"""Online migration between classic and consumer groups (KIP-848 "Supporting Online Consumer Group
Upgrade"): the upgrade by the first KIP-848 member, classic members living in a consumer group,
the downgrade when the last KIP-848 member goes, the migration policy, client-side assignors at
metadata version -1, offsets across both conversions, and the KIP's Online Migration case study."""

from __future__ import annotations

import kafka.errors as Errors
import msgspec
import pytest
from classic_support import SESSION_MS, Classic, assignment, decoded, form_group
from coordinator_support import FAST, GROUP, HB, NAMES, Harness, RoundRobinAssignor, parts

from pystreams.coordinator import records as r
from pystreams.coordinator.classic_group import ClassicGroup, ClassicGroupState
from pystreams.coordinator.config import MIGRATION_POLICY
from pystreams.coordinator.consumer_group import ConsumerGroup
from pystreams.coordinator.context import DEFERRED
from pystreams.coordinator.timers import SessionTimer
from pystreams.protocol import consumer_protocol as cp
from pystreams.protocol import messages as m
from pystreams.protocol.sentinels import LEAVE_EPOCH

Prepare, Install = m.ConsumerGroupPrepareAssignmentRequest, m.ConsumerGroupInstallAssignmentRequest
DELAY = FAST.initial_rebalance_delay_ms


def harness(**config) -> Harness:
    h = Harness(msgspec.structs.replace(FAST, **config) if config else FAST, assignors={"range": RoundRobinAssignor()})
    h.topics(foo=4, bar=2)
    return h


def kinds(records) -> list[str]:
    """Records as 'Kind(member)' (or 'Kind' / 'Kind-' for a tombstone), to pin their order."""
    out = []
    for record in records:
        name = type(record).__name__ + ("-" if record.value is None else "")
        member = getattr(record, "member_id", None)
        out.append(f"{name}({member})" if member else name)
    return out


def classic_pair(h: Harness, **fields) -> tuple[Classic, Classic]:
    a, b = Classic(h, **fields), Classic(h, **fields)
    form_group(h, [a, b], {0: {"foo": [0, 1]}, 1: {"foo": [2, 3]}})
    return a, b


def scripted_harness(**config) -> Harness:
    """Targets the test spells out (``h.scripted.next``), for steps that depend on them."""
    h = Harness(msgspec.structs.replace(FAST, **config) if config else FAST)
    h.topics(foo=4, bar=2)
    return h


def settle(h: Harness, classics: list[Classic], kip848: list[str]) -> None:
    """Every member follows its protocol until the group is Stable: classic members rejoin when
    told (cooperatively: reporting what they own) and sync; KIP-848 members heartbeat."""
    for _ in range(6):
        for member in classics:
            if member.heartbeat() == Errors.RebalanceInProgressError.errno:
                member.join()
                member.owned = decoded(member.sync().assignment)
        for member_id in kip848:
            member = h.group.members[member_id]
            h.heartbeat(member_id, member.member_epoch, owned_spec=member.assigned.describe(NAMES))
        if h.group.state.value == "Stable":
            return
    raise AssertionError(f"the group did not settle: {held(h)}")


def held(h: Harness) -> dict[str, tuple[int, str]]:
    return {mid: (mb.member_epoch, (mb.assigned | mb.revoking).describe(NAMES)) for mid, mb in sorted(h.group.members.items())}


# --- upgrade --------------------------------------------------------------------------------


def test_upgrade_from_a_stable_group_writes_kafkas_records_and_keeps_every_assignment() -> None:
    h = harness()
    a, b = classic_pair(h)
    assert h.join("n", server_assignor="range").error_code == 0
    A, B = a.member_id, b.member_id
    assert kinds(h.last_records) == [
        "ClassicGroupMetadata-",
        f"MemberMetadata({A})",
        f"MemberMetadata({B})",
        "GroupMetadata",
        f"TargetAssignmentMember({A})",
        f"TargetAssignmentMember({B})",
        "TargetAssignmentMetadata",
        f"CurrentAssignment({A})",
        f"CurrentAssignment({B})",
        # then the joiner, as any KIP-848 join: its subscription, the topics, a new epoch, a target
        "MemberMetadata(n)",
        "PartitionMetadata",
        "GroupMetadata",
        f"TargetAssignmentMember({A})",
        f"TargetAssignmentMember({B})",
        "TargetAssignmentMember(n)",
        "TargetAssignmentMetadata",
        "CurrentAssignment(n)",
    ]
    group = h.group
    assert isinstance(group, ConsumerGroup) and group.group_epoch == 2
    converted = h.last_records[1].value
    assert converted.group_epoch == 1 and converted.classic_member.session_timeout_ms == SESSION_MS
    assert [p.name for p in converted.classic_member.supported_protocols] == ["range"]
    assert h.last_records[3].value.epoch == 1 and h.last_records[6].value.assignment_epoch == 1
    # Everyone was reconciled at epoch = generation with its classic assignment; the joiner waits.
    assert held(h) == {A: (1, "foo-0, foo-1"), B: (1, "foo-2, foo-3"), "n": (2, "")}
    # Classic members keep their own session timeout.
    assert h.shard.timers.deadline(SessionTimer(GROUP, A)) == h.now + SESSION_MS
    h.assert_replay_equals_live()


def test_classic_members_are_reconciled_through_their_own_protocol_eager() -> None:
    h = scripted_harness()
    a, b = classic_pair(h)
    h.scripted.next = {a.member_id: "foo-0", b.member_id: "foo-2", "n": "foo-1, foo-3"}
    h.join("n")
    assert a.heartbeat() == Errors.RebalanceInProgressError.errno  # its epoch is behind the target
    a.owned = {}  # eager: everything revoked before rejoining
    joined = a.join()
    assert (joined.error_code, joined.generation_id, joined.protocol_name, joined.leader, joined.members) == (0, 2, "range", "", [])
    assert decoded(a.sync().assignment) == {"foo": [0]}
    assert a.heartbeat() == 0
    assert h.heartbeat("n", 2).assignment is not None
    assert held(h)["n"] == (2, "foo-1")  # foo-3 is still b's
    assert b.heartbeat() == Errors.RebalanceInProgressError.errno
    b.owned = {}
    b.join()
    assert decoded(b.sync().assignment) == {"foo": [2]}
    h.heartbeat("n", 2)
    assert held(h) == {a.member_id: (2, "foo-0"), b.member_id: (2, "foo-2"), "n": (2, "foo-1, foo-3")}
    assert h.group.state.value == "Stable"
    h.assert_replay_equals_live()


def test_a_cooperative_classic_member_revokes_only_what_moves() -> None:
    h = scripted_harness()
    a, b = classic_pair(h)
    h.scripted.next = {a.member_id: "foo-0", b.member_id: "foo-2", "n": "foo-1, foo-3"}
    h.join("n")
    assert a.heartbeat() == Errors.RebalanceInProgressError.errno
    joined = a.join()  # still owns foo-0 and foo-1: foo-1 must be revoked first
    assert joined.generation_id == 1
    assert decoded(a.sync().assignment) == {"foo": [0]}  # what it keeps
    assert a.heartbeat() == Errors.RebalanceInProgressError.errno  # revoke, then rejoin
    a.owned = {"foo": [0]}
    assert a.join().generation_id == 2
    assert decoded(a.sync().assignment) == {"foo": [0]}
    assert a.heartbeat() == 0
    h.heartbeat("n", 2)
    assert held(h)["n"] == (2, "foo-1")
    h.assert_replay_equals_live()


def test_a_classic_member_waiting_for_a_released_partition_is_told_to_rejoin() -> None:
    h = scripted_harness()
    a, b = classic_pair(h)
    h.scripted.next = {a.member_id: "foo-0, foo-1", b.member_id: "foo-2, foo-3"}
    h.join("n")
    c = Classic(h)
    assert c.join().error_code == Errors.MemberIdRequiredError.errno
    assert c.member_id.startswith("member-")  # a bare id in a consumer group
    h.scripted.next = {a.member_id: "foo-0", b.member_id: "foo-2, foo-3", "n": "", c.member_id: "foo-1"}
    joined = c.join()
    assert (joined.error_code, joined.generation_id, joined.leader, joined.members) == (0, 3, "", [])  # never the leader
    assert decoded(c.sync().assignment) == {}  # foo-1 is still a's
    assert c.heartbeat() == 0  # waiting: nothing it waits for was released
    a.owned = {}
    a.join()
    a.sync()
    assert c.heartbeat() == Errors.RebalanceInProgressError.errno  # foo-1 is free: rejoin to take it
    c.join()
    assert decoded(c.sync().assignment) == {"foo": [1]}


def test_upgrade_while_preparing_answers_parked_joins_rebalance_in_progress() -> None:
    h = harness()
    a, b = classic_pair(h)
    assert a.join() is DEFERRED  # the leader rejoins: PreparingRebalance, a parked
    assert h.join("n", server_assignor="range").error_code == 0
    parked = a.answer()
    assert parked.error_code == Errors.RebalanceInProgressError.errno
    assert held(h)[b.member_id] == (1, "foo-2, foo-3")
    h.assert_replay_equals_live()


def test_upgrade_while_completing_keeps_the_previous_assignment_at_the_new_generation() -> None:
    h = harness()
    a, b = classic_pair(h)
    a.join()
    b.join()
    h.advance(0)
    a.answer(), b.answer()
    assert h.group.state is ClassicGroupState.COMPLETING_REBALANCE and h.group.generation == 2
    assert b.sync() is DEFERRED
    h.join("n", server_assignor="range")
    assert b.answer().error_code == Errors.RebalanceInProgressError.errno
    # Kafka's test: members at the new generation (2) with the generation-1 assignment.
    assert {mid: v for mid, v in held(h).items() if mid != "n"} == {a.member_id: (2, "foo-0, foo-1"), b.member_id: (2, "foo-2, foo-3")}


def test_upgrade_of_a_group_in_its_first_rebalance() -> None:
    """Kafka had a bug here (KAFKA-17733: members that never synced have 0-byte assignments)."""
    h = harness()
    a, b = Classic(h), Classic(h)
    a.join_fully(), b.join_fully()
    assert h.group.state is ClassicGroupState.PREPARING_REBALANCE and h.group.protocol_name is None
    assert h.join("n", server_assignor="range").error_code == 0
    assert a.answer().error_code == b.answer().error_code == Errors.RebalanceInProgressError.errno
    # Nobody held anything yet: the members are at generation 0 with no partitions, and the
    # joiner's epoch bump assigns everything.
    assert {mid: v for mid, v in held(h).items() if mid != "n"} == {a.member_id: (0, ""), b.member_id: (0, "")}
    assert h.group.group_epoch == 1 and sum(len(t.partitions) for t in h.group.targets.values()) == 4
    h.assert_replay_equals_live()


def test_upgrade_mid_rebalance_keeps_what_cooperative_members_report_owning_until_they_revoke_it() -> None:
    """A rebalance begun in CompletingRebalance resets every classic assignment, while
    cooperative members keep processing what they own and say so in their JoinGroup. Kafka's
    conversion reads only the assignment, so the joiner was handed those partitions at once:
    two owners (simulator, migration seeds 118, 200). They are now pending revocation."""
    h = harness()
    a, b = classic_pair(h)
    a.owned, b.owned = {"foo": [0, 1]}, {"foo": [2, 3]}
    a.join(), b.join()
    h.advance(0)
    a.answer(), b.answer()
    assert h.group.state is ClassicGroupState.COMPLETING_REBALANCE
    Classic(h).join_fully()  # a newcomer: PreparingRebalance again, assignments reset
    assert h.group.state is ClassicGroupState.PREPARING_REBALANCE
    assert h.group.members[a.member_id].assignment == b""
    response = h.join("n", server_assignor="range")
    assert response.error_code == 0
    assert held(h)[a.member_id][1] == "foo-0, foo-1" and held(h)[b.member_id][1] == "foo-2, foo-3"
    assert not response.assignment or not response.assignment.assigned_topic_partitions
    h.assert_replay_equals_live()


@pytest.mark.parametrize("policy", ["disabled", "downgrade"])
def test_a_refused_upgrade_is_group_id_not_found_with_the_reason_and_leaves_no_trace(policy: str) -> None:
    h = harness(migration_policy=policy)
    a, b = classic_pair(h)
    log_size = len(h.log)
    response = h.join("n", server_assignor="range")
    assert response.error_code == Errors.GroupIdNotFoundError.errno
    assert "online upgrade is disabled" in response.error_message and policy in response.error_message
    assert len(h.log) == log_size and isinstance(h.group, ClassicGroup) and h.group.state is ClassicGroupState.STABLE
    assert b.heartbeat() == 0


def test_the_policy_is_also_a_group_config() -> None:
    h = harness()
    a, b = classic_pair(h)
    Resource = m.IncrementalAlterConfigsRequest.AlterConfigsResource
    alter = m.IncrementalAlterConfigsRequest(
        validate_only=False,
        resources=[
            Resource(resource_type=16, resource_name=GROUP, configs=[Resource.AlterableConfig(name=MIGRATION_POLICY, config_operation=0, value="downgrade")])
        ],
    )
    assert h.send(alter).responses[0].error_code == 0
    assert h.join("n").error_code == Errors.GroupIdNotFoundError.errno


def test_empty_groups_convert_under_any_policy_and_keep_their_offsets() -> None:
    h = harness(migration_policy="disabled")
    a = Classic(h)
    form_group(h, [a], {0: {"foo": [0, 1, 2, 3]}})
    assert a.commit(offset=7) == 0
    assert a.leave() == 0
    assert h.join("n").error_code == 0
    assert kinds(h.last_records)[0] == "ClassicGroupMetadata-"
    assert isinstance(h.group, ConsumerGroup)
    assert h.heartbeat("n", LEAVE_EPOCH).error_code == 0
    # ... and back: a JoinGroup replaces the empty consumer group.
    c = Classic(h)
    assert c.join().error_code == Errors.MemberIdRequiredError.errno
    assert kinds(h.last_records)[:3] == ["PartitionMetadata-", "TargetAssignmentMetadata-", "GroupMetadata-"]
    assert isinstance(h.group, ClassicGroup)
    assert h.shard.offsets.of(GROUP)[("foo", 0)].offset == 7
    h.assert_replay_equals_live()


def test_upgrade_refusals_name_the_reason() -> None:
    h = harness()
    a = Classic(h)
    a.join(protocol_type="connect", protocols=[("default", b"not a consumer subscription")])
    a.join(protocol_type="connect", protocols=[("default", b"not a consumer subscription")])
    h.advance(DELAY)
    a.answer()
    a.sync({a.member_id: b"whatever"}, protocol_name=None)
    response = h.join("n")
    assert response.error_code == Errors.GroupIdNotFoundError.errno and "consumer embedded protocol" in response.error_message

    h = harness()
    a = Classic(h)
    form_group(h, [a], {0: {"foo": [0]}})
    h.group.members[a.member_id].assignment = b"\x00\x03\xff"  # a leader that wrote garbage
    response = h.join("n")
    assert response.error_code == Errors.GroupIdNotFoundError.errno and "malformed" in response.error_message

    h = harness(max_group_size=1)
    classic_pair(h)
    response = h.join("n")
    assert response.error_code == Errors.GroupIdNotFoundError.errno and "maximum size" in response.error_message


def test_a_static_classic_member_restarting_with_the_new_protocol_replaces_itself() -> None:
    h = harness()
    s, t = Classic(h, instance_id="s"), Classic(h, instance_id="t")
    form_group(h, [s, t], {0: {"foo": [0, 1]}, 1: {"foo": [2, 3]}})
    response = h.join("s2", server_assignor="range", instance_id="s")
    assert response.error_code == 0  # no UNRELEASED_INSTANCE_ID: it is the same instance (KAFKA-17228)
    assert s.member_id not in h.group.members
    assert held(h)["s2"] == (1, "foo-0, foo-1")  # the assignment it had, at the generation
    assert h.group.group_epoch == 1  # switching protocols alone does not reassign
    assert s.heartbeat() == Errors.FencedInstanceIdError.errno  # its instance is s2 now
    h.assert_replay_equals_live()


def test_an_upgrade_writes_the_subscription_metadata_and_bumps_so_a_stale_classic_assignment_is_replaced() -> None:
    """Kafka's conversion does not write the subscription metadata: the joiner's heartbeat
    computes it, finds it changed and bumps the epoch, so a new target covers every member,
    even when the joiner only replaces a static member (testConsumerGroupHeartbeatToClassicGroup
    FromExistingStaticMember). Without that, a group converted mid-rebalance kept a target made
    of the last classic assignment: here t left, so nobody was ever given foo-2 and foo-3
    (simulator, migration seeds 39 and 47)."""
    h = harness()
    s, t = Classic(h, instance_id="s"), Classic(h, instance_id="t")
    form_group(h, [s, t], {0: {"foo": [0, 1]}, 1: {"foo": [2, 3]}})
    assert t.leave() == 0  # t goes: a rebalance begins; s still holds only foo-0, foo-1
    assert h.group.state is ClassicGroupState.PREPARING_REBALANCE
    response = h.join("s2", server_assignor="range", instance_id="s")
    assert response.error_code == 0
    # Kafka's order: the conversion, the replacement, then the joiner's heartbeat.
    assert kinds(h.last_records)[-5:] == [
        "PartitionMetadata",
        "GroupMetadata",
        "TargetAssignmentMember(s2)",
        "TargetAssignmentMetadata",
        "CurrentAssignment(s2)",
    ]
    assert h.group.group_epoch == 2 and h.group.assignment_epoch == 2
    assert set(h.group.subscribed_topics) == {"foo"}
    assert h.group.targets["s2"].partitions.describe(NAMES) == "foo-0, foo-1, foo-2, foo-3"
    h.assert_replay_equals_live()


# --- classic members in a consumer group ------------------------------------------------------


def test_classic_member_errors_in_a_consumer_group() -> None:
    h = harness()
    a, b = classic_pair(h)
    h.join("n", server_assignor="range")
    assert a.heartbeat(generation=7) == Errors.IllegalGenerationError.errno
    assert a.sync(generation=7).error_code == Errors.IllegalGenerationError.errno
    assert a.sync(protocol_name="sticky").error_code == Errors.InconsistentGroupProtocolError.errno
    assert Classic(h, member_id="n", generation=2).heartbeat() == Errors.UnknownMemberIdError.errno  # n is not classic
    assert Classic(h, member_id="ghost", generation=2).sync().error_code == Errors.UnknownMemberIdError.errno
    stranger = Classic(h, protocols=("roundrobin",))
    assert stranger.join().error_code == Errors.InconsistentGroupProtocolError.errno
    assert a.sync().error_code == Errors.RebalanceInProgressError.errno  # behind the target, not revoking


def test_a_classic_member_leaving_mid_migration_bumps_the_epoch_once() -> None:
    h = harness()
    a, b = classic_pair(h)
    c = Classic(h)
    h.join("n", server_assignor="range")
    c.join_fully()
    epoch = h.group.group_epoch
    from classic_support import leave

    response = leave(h, [(a.member_id, None), ("n", None), (c.member_id, None)])
    assert [mb.error_code for mb in response.members] == [0, Errors.UnknownMemberIdError.errno, 0]
    assert h.group.group_epoch == epoch + 1 and set(h.group.members) == {b.member_id, "n"}
    assert isinstance(h.group, ConsumerGroup)
    h.assert_replay_equals_live()


def test_classic_members_that_do_not_rejoin_or_sync_in_time_are_fenced() -> None:
    h = harness()
    a, b = classic_pair(h, rebalance_ms=8_000)
    h.join("n", server_assignor="range")
    for member in (a, b):
        assert member.heartbeat() == Errors.RebalanceInProgressError.errno
    b.owned = {}
    b.join()  # b rejoins but never syncs; a never rejoins
    for _ in range(20):
        h.advance(500)
        a.heartbeat()
        h.heartbeat("n", h.group.members["n"].member_epoch)
    assert a.member_id not in h.group.members and b.member_id not in h.group.members
    assert isinstance(h.group, ConsumerGroup) and set(h.group.members) == {"n"}


def test_classic_members_commit_at_their_epoch_without_rebalance_checks() -> None:
    h = harness()
    a, b = classic_pair(h)
    h.join("n", server_assignor="range")
    assert a.commit(offset=5, generation=1) == 0  # behind the group epoch, still its own epoch
    assert a.commit(offset=5, generation=2) == Errors.IllegalGenerationError.errno
    assert a.commit(offset=5, generation=1, version=2) == 0  # any OffsetCommit version


def test_consumer_group_describe_tells_member_types_apart() -> None:
    h = harness()
    a, b = classic_pair(h)
    h.join("n", server_assignor="range")
    request = m.ConsumerGroupDescribeRequest(group_ids=[GROUP], include_authorized_operations=False)
    described = h.send(request).groups[0]
    assert {mb.member_id: mb.member_type for mb in described.members} == {a.member_id: 0, b.member_id: 0, "n": 1}
    listed = h.send(m.ListGroupsRequest(states_filter=[], types_filter=[])).groups
    assert [(g.group_type, g.protocol_type) for g in listed] == [("consumer", "consumer")]


# --- downgrade ------------------------------------------------------------------------------


def upgraded_and_settled(h: Harness, **join) -> tuple[Classic, Classic]:
    """Two classic members, upgraded by n, everyone reconciled (n holds foo-1 and foo-3)."""
    a, b = classic_pair(h)
    h.scripted.next = {a.member_id: "foo-0", b.member_id: "foo-2", "n": "foo-1, foo-3"}
    h.join("n", **join)
    settle(h, [a, b], ["n"])
    return a, b


def test_downgrade_when_the_last_kip848_member_leaves() -> None:
    h = scripted_harness()
    a, b = upgraded_and_settled(h)
    assert a.commit(offset=9) == 0
    response = h.heartbeat("n", LEAVE_EPOCH)
    assert (response.error_code, response.member_epoch) == (0, LEAVE_EPOCH)
    A, B = a.member_id, b.member_id
    assert kinds(h.last_records) == [
        f"CurrentAssignment-({A})",
        f"CurrentAssignment-({B})",
        "CurrentAssignment-(n)",
        f"TargetAssignmentMember-({A})",
        f"TargetAssignmentMember-({B})",
        "TargetAssignmentMember-(n)",
        "TargetAssignmentMetadata-",
        f"MemberMetadata-({A})",
        f"MemberMetadata-({B})",
        "MemberMetadata-(n)",
        "PartitionMetadata-",
        "GroupMetadata-",
        "ClassicGroupMetadata",
    ]
    value = h.last_records[-1].value
    assert (value.generation, value.protocol, value.protocol_type) == (2, "range", "consumer")
    assert {mv.member_id: decoded(mv.assignment) for mv in value.members} == {A: {"foo": [0]}, B: {"foo": [2]}}
    group = h.group
    assert isinstance(group, ClassicGroup) and group.state is ClassicGroupState.PREPARING_REBALANCE
    # The classic members follow a classic rebalance from their generation.
    assert a.heartbeat() == b.heartbeat() == Errors.RebalanceInProgressError.errno
    a.join(), b.join()
    assert a.answer().generation_id == 3 and b.answer() is not None
    assert h.shard.offsets.of(GROUP)[("foo", 0)].offset == 9
    h.assert_replay_equals_live()


@pytest.mark.parametrize("fence", ["session", "rebalance"])
def test_downgrade_when_the_last_kip848_member_is_fenced(fence: str) -> None:
    h = scripted_harness()
    a, b = upgraded_and_settled(h)
    if fence == "session":
        for _ in range(2):
            h.advance(FAST.session_timeout_ms // 2 + 1)
            a.heartbeat(), b.heartbeat()
    else:
        # n must give up a partition for a newcomer and never confirms; its rebalance timeout is short.
        h.heartbeat("n", 2, rebalance_timeout_ms=300)
        h.scripted.next = {a.member_id: "foo-0", b.member_id: "foo-2", "n": "foo-1", "c": "foo-3"}
        c = Classic(h)
        h.scripted.next = None
        c.join()
        h.scripted.next = {a.member_id: "foo-0", b.member_id: "foo-2", "n": "foo-1", c.member_id: "foo-3"}
        assert c.join().error_code == 0
        assert h.heartbeat("n", 2, owned_spec="foo-1, foo-3").error_code == 0 and h.group.members["n"].revoking
        h.advance(300)
    assert isinstance(h.group, ClassicGroup)
    assert "n" not in h.group.members
    h.assert_replay_equals_live()


def test_a_policy_that_forbids_downgrades_keeps_a_consumer_group_of_classic_members() -> None:
    h = scripted_harness(migration_policy="upgrade")
    a, b = upgraded_and_settled(h)
    h.scripted.next = {a.member_id: "foo-0, foo-1", b.member_id: "foo-2, foo-3"}
    assert h.heartbeat("n", LEAVE_EPOCH).error_code == 0
    assert isinstance(h.group, ConsumerGroup) and set(h.group.members) == {a.member_id, b.member_id}
    assert not any(isinstance(rec, r.ClassicGroupMetadata) for rec in h.last_records)
    # ... and it still works for them.
    assert a.heartbeat() == Errors.RebalanceInProgressError.errno
    a.join()
    assert a.sync().error_code == 0


def test_no_downgrade_when_the_classic_members_exceed_the_classic_group_size() -> None:
    h = scripted_harness()
    a, b = upgraded_and_settled(h)
    h.shard.ctx.config = msgspec.structs.replace(h.shard.config, classic_max_group_size=1)
    h.scripted.next = {a.member_id: "foo-0, foo-1", b.member_id: "foo-2, foo-3"}
    h.heartbeat("n", LEAVE_EPOCH)
    assert isinstance(h.group, ConsumerGroup) and len(h.group.members) == 2


def test_a_classic_static_member_replacing_the_last_kip848_one_downgrades_without_a_rebalance() -> None:
    h = scripted_harness()
    a, b = upgraded_and_settled(h, instance_id="x")
    h.heartbeat("n", -2, instance_id="x")  # it restarts...
    x = Classic(h, instance_id="x")
    joined = x.join()  # ... with the classic protocol
    assert joined.error_code == 0 and joined.generation_id == 2
    assert isinstance(h.group, ClassicGroup) and h.group.state is ClassicGroupState.STABLE
    assert kinds(h.last_records)[-1] == "ClassicGroupMetadata"
    assert decoded(x.sync().assignment) == {"foo": [1, 3]}
    assert a.heartbeat() == 0  # nobody rebalances
    h.assert_replay_equals_live()


def test_a_static_replacement_downgrade_makes_the_replacement_a_leader_back_without_a_rebalance() -> None:
    """Without a rebalance no classic member would know that it leads the converted group, and
    the leader is the one that watches the topics for new partitions: partitions added later
    went to nobody (the simulator's migration seed 101613). The replacement is answered as a
    static leader back from a restart (KIP-814 SkipAssignment), with every member's metadata."""
    h = scripted_harness()
    a, b = upgraded_and_settled(h, instance_id="x")
    h.heartbeat("n", -2, instance_id="x")  # it restarts...
    x = Classic(h, instance_id="x", version=9)
    joined = x.join()  # ... with the classic protocol
    assert joined.error_code == 0 and joined.generation_id == 2 and joined.protocol_name == "range"
    assert joined.leader == joined.member_id and joined.skip_assignment
    assert sorted(mb.member_id for mb in joined.members) == sorted([a.member_id, b.member_id, joined.member_id])
    group = h.group
    assert isinstance(group, ClassicGroup) and group.state is ClassicGroupState.STABLE and group.leader_id == joined.member_id
    assert decoded(x.sync().assignment) == {"foo": [1, 3]}
    assert a.heartbeat() == 0  # still nobody rebalances
    h.assert_replay_equals_live()


def test_a_downgrade_whose_rebalance_died_with_the_coordinator_rebalances_once_loaded() -> None:
    """The rebalance a downgrade starts lives in memory; the log holds the converted group,
    Stable, with the leaver's partitions in nobody's hands. A coordinator that dies before the
    members rejoined loads that and, unless it rebalances, members heartbeating the stored
    generation never hear of it (the simulator's migration seed 104060)."""
    h = scripted_harness()
    a, b = upgraded_and_settled(h)
    assert h.heartbeat("n", LEAVE_EPOCH).error_code == 0  # n's foo-1 and foo-3 are nobody's now
    assert h.group.state is ClassicGroupState.PREPARING_REBALANCE
    shard = h.replayed()
    assert shard.groups[GROUP].state is ClassicGroupState.STABLE
    h.shard = shard
    h.topics(foo=4, bar=2)
    h._collect(shard.on_loaded(h.now))
    assert h.group.state is ClassicGroupState.PREPARING_REBALANCE
    assert a.heartbeat() == b.heartbeat() == Errors.RebalanceInProgressError.errno


def test_a_static_replacement_downgrade_rebalances_when_a_target_is_not_reached_yet() -> None:
    """The targets become the classic assignments; one that moves a partition its holder has
    not revoked yet would be handed to the replacement at once while the holder keeps it until
    it hears of the new generation: two owners (simulator, migration seed 192). Newer Kafka
    rebalances on a stale target (KAFKA-19546, KAFKA-20273); so do we on an unreached one."""
    h = scripted_harness()
    a, b = upgraded_and_settled(h, instance_id="x")
    epoch = h.group.members["n"].member_epoch
    h.scripted.next = {a.member_id: "", b.member_id: "foo-2", "n": "foo-0, foo-1, foo-3"}
    # n subscribes to more: a new target moves foo-0 from a (which has not revoked it) to n.
    h.heartbeat("n", epoch, owned_spec="foo-1, foo-3", subscribed_topic_names=["foo", "bar"])
    assert not h.group.is_reconciled(h.group.members[a.member_id])
    h.heartbeat("n", -2, instance_id="x")  # it restarts...
    x = Classic(h, instance_id="x", topics=("bar", "foo"))
    assert x.join().error_code == 0  # ... with the classic protocol, and the same subscription
    group = h.group
    assert isinstance(group, ClassicGroup) and group.state is ClassicGroupState.PREPARING_REBALANCE
    assert x.sync().error_code == Errors.RebalanceInProgressError.errno  # foo-0 is not handed out
    assert a.heartbeat() != 0  # a hears of the new generation before anyone gets foo-0
    h.assert_replay_equals_live()


def test_a_downgrade_writes_what_members_hold_so_an_upgrade_before_the_rebalance_ends_hands_nothing_held() -> None:
    """A member that has not reached its target still holds its current assignment (a classic
    member revoking before its LeaveGroup holds it until the LeaveGroup lands). Kafka's
    fromConsumerGroup writes the target as the classic assignment; the upgrade that follows
    before the classic rebalance ends reads that assignment as what each member holds, so a
    partition its holder never revoked was handed to the joiner at once: two owners
    (simulator, migration seeds 101460, 103461, 104217, 104488, 104682)."""
    h = scripted_harness()
    a, b = upgraded_and_settled(h)
    epoch = h.group.members["n"].member_epoch
    # A new target moves foo-0 from a to b; a has not heard of it, so it still holds foo-0.
    h.scripted.next = {a.member_id: "", b.member_id: "foo-0, foo-2", "n": "foo-1, foo-3"}
    h.heartbeat("n", epoch, owned_spec="foo-1, foo-3", subscribed_topic_names=["foo", "bar"])
    assert held(h)[a.member_id][1] == "foo-0" and not h.group.is_reconciled(h.group.members[a.member_id])
    assert h.heartbeat("n", LEAVE_EPOCH).error_code == 0  # the last KIP-848 member goes: downgrade
    group = h.group
    assert isinstance(group, ClassicGroup) and group.state is ClassicGroupState.PREPARING_REBALANCE
    value = h.last_records[-1].value
    assert {mv.member_id: decoded(mv.assignment) for mv in value.members} == {a.member_id: {"foo": [0]}, b.member_id: {"foo": [2]}}
    # A KIP-848 member joins before the classic rebalance ends: the group converts back, and
    # foo-0 stays a's until a gives it up.
    h.scripted.next = {a.member_id: "", b.member_id: "foo-2", "k": "foo-0, foo-1, foo-3"}
    response = h.join("k")
    assert response.error_code == 0 and isinstance(h.group, ConsumerGroup)
    assert held(h)[a.member_id][1] == "foo-0"
    assert "foo-0" not in held(h)["k"][1]
    h.assert_replay_equals_live()


# --- client-side assignors across the migration (the KIP, beyond Kafka) ------------------------


def streams_assignor(lo=-1, hi=2, metadata=b"kip848-meta"):
    return HB.Assignor(name="streams", minimum_version=lo, maximum_version=hi, reason=0, metadata_version=2, metadata_bytes=metadata)


def streams_classic_group(h: Harness) -> tuple[Classic, Classic]:
    a = Classic(h, protocols=("streams",), user_data=b"sub-a")
    b = Classic(h, protocols=("streams",), user_data=b"sub-b")
    for member in (a, b):
        member.join_fully()
    for _ in range(2):
        h.advance(DELAY)
    a.answer(), b.answer()
    b.sync(protocol_name="streams")
    a.sync({a.member_id: assignment(user_data=b"tasks-a", foo=[0, 1]), b.member_id: assignment(user_data=b"tasks-b", foo=[2, 3])}, protocol_name="streams")
    a.answer(), b.answer()
    return a, b


def test_classic_subscription_userdata_reaches_the_client_assignor_at_version_minus_one() -> None:
    h = harness()
    a, b = streams_classic_group(h)
    response = h.join("n", client_assignors=[streams_assignor()])
    assert response.error_code == 0 and response.should_compute_assignment
    # The classic assignment's userData survives the upgrade as metadata -1.
    assert (h.group.members[a.member_id].metadata_version, h.group.members[a.member_id].metadata) == (-1, b"tasks-a")
    prepared = h.send(Prepare(group_id=GROUP, member_id="n", member_epoch=response.member_epoch))
    by_member = {mb.member_id: mb.assignor for mb in prepared.members}
    assert (by_member[a.member_id].metadata_version, by_member[a.member_id].metadata_bytes) == (-1, b"sub-a")
    assert (by_member["n"].metadata_version, by_member["n"].metadata_bytes) == (2, b"kip848-meta")
    members = [
        Install.Member(member_id=a.member_id, partitions=parts("foo-0").to_wire(Install.Member.TopicPartitions), metadata_version=-1, metadata_bytes=b"new-a"),
        Install.Member(member_id=b.member_id, partitions=parts("foo-2").to_wire(Install.Member.TopicPartitions), metadata_version=-1, metadata_bytes=b"new-b"),
        Install.Member(member_id="n", partitions=parts("foo-1, foo-3").to_wire(Install.Member.TopicPartitions), metadata_version=2, metadata_bytes=b"new-n"),
    ]
    installed = h.send(Install(group_id=GROUP, member_id="n", member_epoch=response.member_epoch, group_epoch=prepared.group_epoch, error=0, members=members))
    assert installed.error_code == 0
    assert a.heartbeat() == Errors.RebalanceInProgressError.errno
    a.owned = {}
    a.join(protocols=[("streams", cp.encode_subscription(cp.Subscription(("foo",), user_data=b"sub-a")))])
    synced = cp.decode_assignment(a.sync(protocol_name="streams").assignment)
    assert (dict(synced.partitions), synced.user_data) == ({"foo": frozenset({0})}, b"new-a")
    h.assert_replay_equals_live()


@pytest.mark.parametrize(
    "assignors, reason",
    [
        ([streams_assignor(lo=1)], "includes -1"),
        ([HB.Assignor(name="other", minimum_version=-1, maximum_version=2, reason=0, metadata_version=2, metadata_bytes=b"")], "streams"),
    ],
)
def test_a_kip848_member_that_cannot_read_classic_metadata_is_refused_and_nothing_converts(assignors, reason) -> None:
    h = harness()
    streams_classic_group(h)
    log_size = len(h.log)
    response = h.join("n", client_assignors=assignors)
    assert response.error_code == Errors.InvalidRequestError.errno and reason in response.error_message
    assert len(h.log) == log_size and isinstance(h.group, ClassicGroup)


def test_downgrade_hands_the_assignors_classic_output_back_as_userdata() -> None:
    h = harness()
    a, b = streams_classic_group(h)
    h.join("n", client_assignors=[streams_assignor()])
    assert h.heartbeat("n", LEAVE_EPOCH).error_code == 0
    value = h.last_records[-1].value
    assert {mv.member_id: cp.decode_assignment(mv.assignment).user_data for mv in value.members} == {a.member_id: b"tasks-a", b.member_id: b"tasks-b"}


# --- fail-over ---------------------------------------------------------------------------------


def test_a_coordinator_that_dies_mid_migration_resumes_from_its_log() -> None:
    h = harness()
    a, b = classic_pair(h)
    h.join("n", server_assignor="range")
    shard = h.replayed()
    h.shard = shard
    h._collect(shard.on_loaded(h.now))
    # Every member's session is re-armed: classic members with their own timeout.
    assert shard.timers.deadline(SessionTimer(GROUP, a.member_id)) == h.now + SESSION_MS
    assert a.heartbeat() == Errors.RebalanceInProgressError.errno
    a.owned = {}
    assert a.join().generation_id == 2
    assert decoded(a.sync().assignment) == {"foo": [0]}
    h.assert_replay_equals_live()


# --- the KIP's Online Migration case study --------------------------------------------------


def test_the_kips_online_migration_case_study() -> None:
    """KIP-848 "Online Migration", step by step in its notation (A, B, C; foo-0..5). A is a
    static member so that its restart with the new protocol keeps its partitions."""
    h = Harness(FAST)
    h.topics(foo=6)
    A = Classic(h, instance_id="A")
    B, C = Classic(h, instance_id="B"), Classic(h, instance_id="C")
    form_group(h, [A, B, C], {0: {"foo": [0, 1]}, 1: {"foo": [3, 4]}, 2: {"foo": [2, 5]}})
    # The group is at generation 22 in the KIP; ours is at 1: epochs below are relative to it.
    g = h.group.generation

    # A leaves and rejoins with the new protocol enabled. The group is converted.
    h.join("A", server_assignor="scripted", instance_id="A")
    assert h.target() == {"A": "foo-0, foo-1", B.member_id: "foo-3, foo-4", C.member_id: "foo-2, foo-5"}
    assert h.members() == {"A": (g, "foo-0, foo-1", ""), B.member_id: (g, "foo-3, foo-4", ""), C.member_id: (g, "foo-2, foo-5", "")}
    assert h.group.group_epoch == g

    # B leaves the group: the epoch is bumped and a new target computed; C must rebalance.
    h.scripted.next = {"A": "foo-0, foo-1, foo-3", C.member_id: "foo-2, foo-5, foo-4"}
    assert B.leave() == 0
    assert h.group.group_epoch == g + 1
    assert h.target() == {"A": "foo-0, foo-1, foo-3", C.member_id: "foo-2, foo-4, foo-5"}
    assert C.heartbeat() == Errors.RebalanceInProgressError.errno

    # C revokes everything (eager) and rejoins: it owns nothing, so it moves to the new epoch.
    C.owned = {}
    assert C.join().generation_id == g + 1
    assert h.members()[C.member_id] == (g + 1, "foo-2, foo-4, foo-5", "")
    # A heartbeats and transitions too.
    h.heartbeat("A", g)
    assert h.members()["A"] == (g + 1, "foo-0, foo-1, foo-3", "")
    # C syncs and collects everything: all free.
    assert decoded(C.sync().assignment) == {"foo": [2, 4, 5]}
    C.owned = {"foo": [2, 4, 5]}

    # B rejoins with the new protocol: a new epoch and target; C must revoke foo-4.
    h.scripted.next = {"A": "foo-0, foo-1", "B": "foo-3, foo-4", C.member_id: "foo-2, foo-5"}
    h.join("B", server_assignor="scripted")
    assert h.group.group_epoch == g + 2
    assert h.members()["B"] == (g + 2, "", "foo-3, foo-4")
    # A is told to revoke foo-3; B gets nothing yet; C is told to rebalance.
    h.heartbeat("A", g + 1, owned_spec="foo-0, foo-1, foo-3")
    assert h.group.members["A"].revoking.describe(NAMES) == "foo-3"
    h.heartbeat("B", g + 2)
    assert h.members()["B"] == (g + 2, "", "foo-3, foo-4")
    assert C.heartbeat() == Errors.RebalanceInProgressError.errno
    C.owned = {}
    assert C.join().generation_id == g + 2  # foo-4 is released
    assert decoded(C.sync().assignment) == {"foo": [2, 5]}
    # A confirms the revocation of foo-3 and moves to the epoch; B then gets both.
    h.heartbeat("A", g + 1, owned_spec="foo-0, foo-1")
    assert h.members()["A"] == (g + 2, "foo-0, foo-1", "")
    h.heartbeat("B", g + 2)
    assert h.members() == {"A": (g + 2, "foo-0, foo-1", ""), "B": (g + 2, "foo-3, foo-4", ""), C.member_id: (g + 2, "foo-2, foo-5", "")}
    h.assert_replay_equals_live()


def test_a_settled_classic_member_rejoining_with_new_userdata_bumps_and_one_told_to_rejoin_does_not() -> None:
    """A classic member has no other way to ask for a new assignment than to rejoin with new
    metadata (a Streams member's task lags, say): when it was settled, that bumps the group epoch.
    A member rejoining because it was told to only follows the rebalance under way."""
    h = harness()
    a, b = classic_pair(h)
    h.join("n")
    settle(h, [a, b], ["n"])
    epoch = h.group.group_epoch
    a.user_data = b"new lags"
    assert a.join().error_code == 0
    assert h.group.group_epoch == epoch + 1
    assert b.heartbeat() == Errors.RebalanceInProgressError.errno
    b.user_data = b"other lags"
    assert b.join().error_code == 0
    assert h.group.group_epoch == epoch + 1
    # The same userData again from a settled member changes nothing.
    settle(h, [a, b], ["n"])
    epoch = h.group.group_epoch
    assert a.join().error_code == 0
    assert h.group.group_epoch == epoch
    h.assert_replay_equals_live()
