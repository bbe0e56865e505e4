"""ConsumerGroupHeartbeat: every validation rule, every error, membership and sessions."""

import kafka.errors as Errors
import pytest
from coordinator_support import (
    FAST,
    GROUP,
    HB,
    Harness,
    assert_records,
    assignment_records,
    current,
    group_epoch,
    member_metadata,
    partition_metadata,
    response_parts,
    target_epoch,
    target_member,
)

from pystreams.coordinator.consumer_group import GroupState

INVALID = Errors.InvalidRequestError.errno


def assignor(name="streams", lo=0, hi=2, version=None, reason=0, metadata=b""):
    return HB.Assignor(
        name=name, minimum_version=lo, maximum_version=hi, reason=reason, metadata_version=hi if version is None else version, metadata_bytes=metadata
    )


@pytest.mark.parametrize(
    "fields, fragment",
    [
        (dict(group_id=""), "GroupId must be non-empty"),
        (dict(member_epoch=5, member_id=""), "MemberId must be non-empty"),
        (dict(member_epoch=-3, member_id="x"), "MemberEpoch must be >= -1"),
        (dict(instance_id=""), "InstanceId, if provided, must be non-empty"),
        (dict(rebalance_timeout_ms=-1), "RebalanceTimeoutMs must be larger than zero"),
        (dict(rebalance_timeout_ms=0), "RebalanceTimeoutMs must be larger than zero"),
        (dict(subscribed_topic_names=None), "SubscribedTopicNames or SubscribedTopicRegex must be set"),
        (dict(subscribed_topic_regex="foo("), "not a valid RE2 regular expression"),
        (dict(server_assignor="uniform", client_assignors=[assignor()]), "cannot be used together"),
        (dict(client_assignors=[assignor(name="")]), "Assignor.Name must be non-empty"),
        (dict(client_assignors=[assignor(lo=-2, hi=1, version=0)]), "MinimumVersion must be >= -1"),
        (dict(client_assignors=[assignor(lo=0, hi=-1, version=0)]), "MaximumVersion must be >= 0"),
        (dict(client_assignors=[assignor(lo=3, hi=2, version=2)]), "MaximumVersion must be >= 0 and >= MinimumVersion"),
        (dict(client_assignors=[assignor(lo=1, hi=2, version=3)]), "MetadataVersion must lie within"),
        (dict(member_epoch=-2, member_id="x", instance_id=None), "requires the member's InstanceId"),
    ],
)
def test_invalid_requests_are_rejected_with_a_reason(fields, fragment):
    h = Harness()
    h.topics(foo=1)
    request = dict(group_id=GROUP, member_id="A", member_epoch=0, rebalance_timeout_ms=1000, subscribed_topic_names=["foo"])
    request.update(fields)
    response = h.send(HB(**request))
    assert response.error_code == INVALID
    assert fragment in response.error_message
    assert h.log == []  # a refused request changes nothing


def test_unknown_server_assignor_is_unsupported():
    h = Harness()
    response = h.join("A", server_assignor="sticky-magic")
    assert response.error_code == Errors.UnsupportedAssignorError.errno
    assert "sticky-magic" in response.error_message


def test_client_assignor_range_must_overlap_the_group():
    h = Harness()
    h.topics(foo=2)
    assert h.join("A", client_assignors=[assignor(lo=1, hi=2)]).error_code == 0
    response = h.join("B", client_assignors=[assignor(lo=3, hi=4)])
    assert response.error_code == Errors.UnsupportedAssignorError.errno
    assert "do not overlap" in response.error_message
    assert "B" not in h.group.members
    assert h.join("C", client_assignors=[assignor(lo=2, hi=4, version=3)]).error_code == 0


def test_unknown_member_and_unknown_group():
    h = Harness()
    h.topics(foo=1)
    assert h.heartbeat("ghost", 3).error_code == Errors.UnknownMemberIdError.errno
    h.scripted.next = {"A": "foo-0"}
    h.join("A")
    assert h.heartbeat("ghost", 1).error_code == Errors.UnknownMemberIdError.errno
    assert h.heartbeat("ghost", -1).error_code == Errors.UnknownMemberIdError.errno


def test_member_ids_are_generated_uuids_when_the_member_has_none():
    import uuid

    from coordinator_support import ScriptedAssignor, topics

    from pystreams.coordinator.shard import GroupCoordinatorShard

    scripted = ScriptedAssignor()
    shard = GroupCoordinatorShard(assignors={"uniform": scripted, "range": scripted})
    shard.update_topics(topics(foo=1), 0)
    scripted.next = {}
    response = shard.handle(HB(group_id=GROUP, member_id="", member_epoch=0, rebalance_timeout_ms=1000, subscribed_topic_names=["foo"]), 0).response
    assert response.error_code == 0
    assert uuid.UUID(response.member_id)  # a real UUID
    assert response.member_id in shard.groups[GROUP].members


def test_fenced_epoch_removes_the_member_and_bumps_the_group():
    h = Harness()
    h.topics(foo=2)
    h.scripted.next = {"A": "foo-0, foo-1"}
    h.join("A")
    epoch = h.group.group_epoch
    response = h.heartbeat("A", 7, "foo-0, foo-1")
    assert response.error_code == Errors.FencedMemberEpochError.errno
    assert "rejoin with epoch 0" in response.error_message
    assert "A" not in h.shard.groups[GROUP].members
    assert h.group.group_epoch == epoch + 1
    # Rejoining with epoch 0 and the same member id works (KIP: "rejoins with the same member ID").
    h.scripted.next = {"A": "foo-0, foo-1"}
    response = h.join("A")
    assert (response.error_code, response.member_epoch, response_parts(response)) == (0, epoch + 2, "foo-0, foo-1")
    h.assert_replay_equals_live()


def test_lost_response_is_tolerated_when_owned_partitions_are_a_subset():
    h = Harness()
    h.topics(foo=2)
    h.scripted.next = {"A": "foo-0, foo-1"}
    h.join("A")
    h.scripted.next = {"A": "foo-0", "B": "foo-1"}
    h.join("B")
    h.heartbeat("A", 1)  # told to revoke foo-1
    moved = h.heartbeat("A", 1, "foo-0")  # moves to epoch 2 ... and this response is lost
    assert moved.member_epoch == 2
    retry = h.heartbeat("A", 1, "foo-0")  # it retries with the epoch it knows
    assert retry.error_code == 0 and retry.member_epoch == 2
    # Two responses lost: C joins, A is moved on to epoch 3 and misses that answer too; it is
    # still accepted while what it reports is within what it holds.
    h.scripted.next = {"A": "foo-0", "B": "foo-1", "C": ""}
    h.join("C")
    assert h.heartbeat("A", 2).member_epoch == 3  # lost
    retry = h.heartbeat("A", 1, "foo-0")
    assert (retry.error_code, retry.member_epoch) == (0, 3)
    # Not a subset of what it holds: fenced.
    h.scripted.next = {"B": "foo-0, foo-1", "C": ""}
    assert h.heartbeat("A", 1, "foo-0, foo-1").error_code == Errors.FencedMemberEpochError.errno


def test_leave_removes_the_member_and_frees_its_partitions():
    h = Harness()
    h.topics(foo=2)
    h.scripted.next = {"A": "foo-0, foo-1"}
    h.join("A")
    h.scripted.next = {"A": "foo-0", "B": "foo-1"}
    h.join("B")
    assert h.members()["B"] == (2, "", "foo-1")
    h.scripted.next = {"B": "foo-0, foo-1"}
    response = h.heartbeat("A", -1)
    assert response.member_epoch == -1 and response.error_code == 0
    assert set(h.group.members) == {"B"}
    assert response_parts(h.heartbeat("B", 2)) == "foo-0, foo-1"
    h.assert_replay_equals_live()


def test_session_timeout_removes_a_silent_member():
    h = Harness()
    h.topics(foo=1)
    h.scripted.next = {"A": "foo-0"}
    h.join("A")
    assert h.shard.next_deadline() == FAST.session_timeout_ms
    h.advance(FAST.session_timeout_ms - 1)
    assert "A" in h.group.members
    h.scripted.next = {}
    h.advance(1)
    assert GROUP in h.shard.groups and not h.group.members
    assert h.group.state is GroupState.EMPTY


def test_rebalance_timeout_fences_a_member_that_does_not_revoke():
    h = Harness()
    h.topics(foo=2)
    h.scripted.next = {"A": "foo-0, foo-1"}
    h.join("A", rebalance_timeout_ms=300)
    h.scripted.next = {"A": "foo-0", "B": "foo-1"}
    h.join("B")
    h.heartbeat("A", 1)  # told to revoke; the revocation clock starts
    for _ in range(2):
        h.advance(100)
        h.heartbeat("A", 1)  # keeps heartbeating without letting go
        h.heartbeat("B", 2)
    h.scripted.next = {"B": "foo-0, foo-1"}
    h.advance(100)
    assert "A" not in h.group.members
    assert response_parts(h.heartbeat("B", h.group.members["B"].member_epoch)) == "foo-0, foo-1"


def test_group_max_size():
    import msgspec

    from pystreams.coordinator.config import CoordinatorConfig

    config = CoordinatorConfig(**{**msgspec.structs.asdict(FAST), "max_group_size": 1})
    h = Harness(config)
    h.topics(foo=1)
    h.scripted.next = {"A": "foo-0"}
    h.join("A")
    response = h.join("B")
    assert response.error_code == Errors.GroupMaxSizeReachedError.errno
    assert "maximum of 1" in response.error_message


def test_fields_are_applied_only_when_sent_and_trigger_epoch_bumps():
    h = Harness()
    h.topics(foo=1, bar=1)
    h.scripted.next = {"A": "foo-0"}
    h.join("A")
    epoch = h.group.group_epoch
    h.heartbeat("A", 1)  # nothing sent: nothing changes
    assert h.group.group_epoch == epoch
    h.heartbeat("A", 1, rack_id="rack-1")  # not a rebalance trigger, but persisted
    assert h.group.group_epoch == epoch and h.group.members["A"].rack_id == "rack-1"
    h.scripted.next = {"A": "foo-0, bar-0"}
    response = h.heartbeat("A", 1, subscribed_topic_names=["foo", "bar"])
    assert h.group.group_epoch == epoch + 1
    assert response_parts(response) == "bar-0, foo-0"
    h.scripted.next = {"A": "foo-0, bar-0"}
    h.heartbeat("A", 2, server_assignor="scripted")
    assert h.group.group_epoch == epoch + 2
    h.assert_replay_equals_live()


def test_regex_subscription_follows_topic_creation():
    h = Harness()
    h.topics(foo=1)
    h.scripted.next = {"A": "foo-0"}
    h.join("A", subscribed_topic_regex="ba.*|foo")
    assert h.target() == {"A": "foo-0"}
    epoch = h.group.group_epoch
    h.scripted.next = {"A": "foo-0, bar-0, baz-0"}
    h.topics(foo=1, bar=1, baz=1, qux=1)
    assert h.group.group_epoch == epoch + 1
    assert set(h.group.subscribed_topics) == {"foo", "bar", "baz"}
    h.topics(foo=1, bar=1, baz=1, qux=2)  # not subscribed: no rebalance
    assert h.group.group_epoch == epoch + 1


def test_recreated_topic_gets_a_new_id_and_rebalances():
    import uuid

    from pystreams.assignors.api import TopicMetadata

    h = Harness()
    h.topics(foo=1)
    h.scripted.next = {"A": "foo-0"}
    h.join("A")
    epoch = h.group.group_epoch
    new_id = uuid.UUID(int=99)
    h.scripted.next = {}
    h.shard.update_topics({"foo": TopicMetadata(new_id, "foo", 1)}, h.now)
    assert h.group.group_epoch == epoch + 1
    assert h.group.subscribed_topics["foo"].topic_id == new_id
    assert h.scripted.specs[-1].topics.keys() == {new_id}


def joined_alone(member_id: str, spec: str) -> list:
    """What a first member writes when it joins and is given ``spec`` at once."""
    return [
        group_epoch(0),
        member_metadata(member_id, 0),
        partition_metadata(foo=2),
        group_epoch(1),
        target_member(member_id, spec),
        target_epoch(1),
        current(member_id, 1, 0, spec),
    ]


def joined_second(member_id: str, **target: str) -> list:
    """What a second member writes when its joining moves ``target`` into place (epoch 2)."""
    return [member_metadata(member_id, 1), group_epoch(2), *assignment_records(GROUP, **target), target_epoch(2), current(member_id, 2, 0)]


# The interval answered is not state: answering the short one or the group's writes nothing of
# its own, so each step below writes exactly what its membership change does, no more.


def test_heartbeat_interval_comes_from_group_config():
    h = Harness()
    h.topics(foo=2)
    h.scripted.next = {"A": "foo-0, foo-1"}
    assert h.join("A").heartbeat_interval_ms == FAST.heartbeat_interval_ms
    assert_records(h.last_records, joined_alone("A", "foo-0, foo-1"))
    assert h.heartbeat("A", 1, "foo-0, foo-1").heartbeat_interval_ms == FAST.heartbeat_interval_ms
    assert_records(h.last_records, [])


def test_a_member_with_work_in_a_rebalance_is_told_the_short_interval_and_a_stable_one_the_groups():
    from pystreams.coordinator.config import CoordinatorConfig

    config = CoordinatorConfig(
        session_timeout_ms=45_000,
        heartbeat_interval_ms=5_000,
        rebalance_heartbeat_interval_ms=100,
        min_heartbeat_interval_ms=10,
        max_heartbeat_interval_ms=15_000,
    )
    h = Harness(config)
    h.topics(foo=2)
    h.scripted.next = {"A": "foo-0, foo-1"}
    joined = h.join("A")
    assert response_parts(joined) == "foo-0, foo-1" and joined.heartbeat_interval_ms == 5_000  # reached its target at once
    assert_records(h.last_records, joined_alone("A", "foo-0, foo-1"))
    assert h.heartbeat("A", joined.member_epoch, "foo-0, foo-1").heartbeat_interval_ms == 5_000
    assert_records(h.last_records, [])
    # B joins: foo-1 moves from A to B. A has a partition to revoke, B one to receive.
    h.scripted.next = {"A": "foo-0", "B": "foo-1"}
    b = h.join("B")
    assert b.heartbeat_interval_ms == 100
    assert_records(h.last_records, joined_second("B", A="foo-0", B="foo-1"))
    revoke = h.heartbeat("A", joined.member_epoch)
    assert response_parts(revoke) == "foo-0" and revoke.heartbeat_interval_ms == 100
    assert_records(h.last_records, [current("A", 1, 0, "foo-0", revoking="foo-1")])
    assert h.heartbeat("B", b.member_epoch).heartbeat_interval_ms == 100  # still waits for foo-1
    assert_records(h.last_records, [])  # the short interval again, and nothing changed: nothing written
    released = h.heartbeat("A", joined.member_epoch, "foo-0")
    assert released.heartbeat_interval_ms == 5_000  # A reached its target: back to the group's
    assert_records(h.last_records, [current("A", 2, 1, "foo-0")])
    received = h.heartbeat("B", b.member_epoch)
    assert response_parts(received) == "foo-1" and received.heartbeat_interval_ms == 5_000
    assert_records(h.last_records, [current("B", 2, 0, "foo-1")])
    assert h.group.state is GroupState.STABLE
    # Steady state: the group's interval, whatever the member reports, and nothing written.
    assert h.heartbeat("A", released.member_epoch).heartbeat_interval_ms == 5_000
    assert_records(h.last_records, [])
    assert h.heartbeat("B", received.member_epoch, "foo-1").heartbeat_interval_ms == 5_000
    assert_records(h.last_records, [])


def test_the_short_interval_is_never_longer_than_the_groups_own():
    from pystreams.coordinator.config import CoordinatorConfig

    config = CoordinatorConfig(heartbeat_interval_ms=50, rebalance_heartbeat_interval_ms=100, min_heartbeat_interval_ms=10)
    h = Harness(config)
    h.topics(foo=2)
    h.scripted.next = {"A": "foo-0, foo-1"}
    joined = h.join("A")
    assert_records(h.last_records, joined_alone("A", "foo-0, foo-1"))
    h.scripted.next = {"A": "foo-0", "B": "foo-1"}
    assert h.join("B").heartbeat_interval_ms == 50
    assert_records(h.last_records, joined_second("B", A="foo-0", B="foo-1"))
    assert h.heartbeat("A", joined.member_epoch).heartbeat_interval_ms == 50
    assert_records(h.last_records, [current("A", 1, 0, "foo-0", revoking="foo-1")])
