"""The KIP-848 member state machine, driven with hand-built coordinator responses."""

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
)

from pystreams.client.listener import NoOpRebalanceListener, notify_listener
from pystreams.client.member import (
    ASSIGNOR_FAILED,
    AssignmentAbandoned,
    AssignmentInstalled,
    ConsumerGroupMember,
    CoordinatorUnavailable,
    InstanceIdUnreleased,
    LeftGroup,
    MemberConfig,
    MemberFailed,
    MemberFatalError,
    MemberState,
    PartitionsAssigned,
    PartitionsLost,
    RevokePartitions,
)
from pystreams.partitions import PartitionSet, TopicIdPartition
from pystreams.protocol.messages import (
    ConsumerGroupHeartbeatRequest,
    ConsumerGroupHeartbeatResponse,
    ConsumerGroupInstallAssignmentRequest,
    ConsumerGroupInstallAssignmentResponse,
    ConsumerGroupPrepareAssignmentRequest,
    ConsumerGroupPrepareAssignmentResponse,
)

FOO = UUID(int=0xF00)
BAR = UUID(int=0xBA2)
INTERVAL = 1_000
BACKOFF = 100

FENCED = Errors.FencedMemberEpochError.errno
UNKNOWN_MEMBER = Errors.UnknownMemberIdError.errno
STALE = Errors.StaleMemberEpochError.errno
UNRELEASED = Errors.UnreleasedInstanceIdError.errno


def parts(topic: UUID, *numbers: int) -> PartitionSet:
    return PartitionSet.from_pairs(TopicIdPartition(topic, n) for n in numbers)


def wire(partitions) -> list[ConsumerGroupHeartbeatResponse.Assignment.TopicPartitions]:
    by_topic: dict[UUID, list[int]] = {}
    for topic_id, n in sorted(partitions):
        by_topic.setdefault(topic_id, []).append(n)
    return [ConsumerGroupHeartbeatResponse.Assignment.TopicPartitions(topic_id=t, partitions=ps) for t, ps in by_topic.items()]


def hb_response(
    *,
    epoch: int,
    member_id: str | None = None,
    assigned=None,
    pending=frozenset(),
    error: int = 0,
    error_message: str | None = None,
    should_compute: bool = False,
    interval: int = INTERVAL,
    assignment_error: int = 0,
    metadata_version: int = 0,
    metadata_bytes: bytes = b"",
) -> ConsumerGroupHeartbeatResponse:
    assignment = None
    if assigned is not None:
        assignment = ConsumerGroupHeartbeatResponse.Assignment(
            error=assignment_error,
            assigned_topic_partitions=wire(assigned),
            pending_topic_partitions=wire(pending),
            metadata_version=metadata_version,
            metadata_bytes=metadata_bytes,
        )
    return ConsumerGroupHeartbeatResponse(
        throttle_time_ms=0,
        error_code=error,
        error_message=error_message,
        member_id=member_id,
        member_epoch=epoch,
        should_compute_assignment=should_compute,
        heartbeat_interval_ms=interval,
        assignment=assignment,
    )


def error_response(code: int, message: str | None = None) -> ConsumerGroupHeartbeatResponse:
    return hb_response(epoch=0, error=code, error_message=message, interval=0)


def member(**config) -> ConsumerGroupMember:
    config.setdefault("group_id", "g")
    config.setdefault("retry_backoff_ms", BACKOFF)
    return ConsumerGroupMember(MemberConfig(**config))


def only_heartbeat(m: ConsumerGroupMember, now: int) -> ConsumerGroupHeartbeatRequest:
    requests = m.poll(now)
    assert len(requests) == 1, requests
    assert isinstance(requests[0], ConsumerGroupHeartbeatRequest)
    return requests[0]


def owned_in(request: ConsumerGroupHeartbeatRequest):
    assert request.topic_partitions is not None, "expected the owned partitions in the heartbeat"
    return PartitionSet.from_wire(request.topic_partitions)


def join(m: ConsumerGroupMember, now: int = 0, *, epoch: int = 1, assigned=None, pending=frozenset(), topics=("foo",), **response):
    """Subscribe, send the join heartbeat and answer it; returns the join request."""
    m.subscribe(topics=topics)
    request = only_heartbeat(m, now)
    m.on_response(request, hb_response(member_id="m-1", epoch=epoch, assigned=assigned, pending=pending, **response), now)
    return request


# ---------------------------------------------------------------------------- joining & fields


def test_first_heartbeat_carries_every_field_and_epoch_zero():
    m = member(instance_id="pod-0", rack_id="rack-a", rebalance_timeout_ms=45_000, server_assignor="uniform")
    assert m.poll(0) == [] and m.next_deadline() is None  # not subscribed: nothing to do
    m.subscribe(topics=["foo", "bar"])
    assert m.state is MemberState.JOINING
    assert m.next_deadline() == 0
    request = only_heartbeat(m, 0)
    assert request.group_id == "g"
    assert request.member_id == ""
    assert request.member_epoch == 0
    assert request.instance_id == "pod-0"
    assert request.rack_id == "rack-a"
    assert request.rebalance_timeout_ms == 45_000
    assert request.subscribed_topic_names == ["bar", "foo"]
    assert request.subscribed_topic_regex is None
    assert request.server_assignor == "uniform"
    assert request.client_assignors is None
    assert request.topic_partitions == []
    # One heartbeat in flight at a time.
    assert m.poll(0) == []
    assert m.next_deadline() is None


def test_second_heartbeat_with_nothing_changed_has_all_nullable_fields_null():
    m = member(instance_id="pod-0", rack_id="rack-a", server_assignor="uniform")
    join(m, 0, epoch=3)
    assert m.member_id == "m-1" and m.member_epoch == 3 and m.state is MemberState.STABLE
    assert m.next_deadline() == INTERVAL
    assert m.poll(INTERVAL - 1) == []
    request = only_heartbeat(m, INTERVAL)
    assert request.member_id == "m-1"
    assert request.member_epoch == 3
    assert request.instance_id is None
    assert request.rack_id is None
    assert request.rebalance_timeout_ms == -1
    assert request.subscribed_topic_names is None
    assert request.subscribed_topic_regex is None
    assert request.server_assignor is None
    assert request.client_assignors is None
    assert request.topic_partitions is None


def test_heartbeat_interval_counts_from_the_send_and_follows_the_coordinator():
    m = member()
    m.subscribe(topics=["foo"])
    request = only_heartbeat(m, 10)
    m.on_response(request, hb_response(member_id="m-1", epoch=1, interval=500), 200)
    assert m.heartbeat_interval_ms == 500
    assert m.next_deadline() == 510


def test_subscription_change_sends_only_subscribed_topic_names_at_once():
    m = member(instance_id="pod-0", server_assignor="range")
    join(m, 0)
    m.subscribe(topics=["foo", "bar"])
    assert m.next_deadline() == 0  # immediately, not at the next interval
    request = only_heartbeat(m, 5)
    assert request.subscribed_topic_names == ["bar", "foo"]
    assert request.subscribed_topic_regex is None
    assert request.instance_id is None
    assert request.rebalance_timeout_ms == -1
    assert request.server_assignor is None
    assert request.topic_partitions is None
    assert request.member_epoch == 1


def test_same_subscription_again_is_not_a_change():
    m = member()
    join(m, 0, topics=("b", "a"))
    m.subscribe(topics=["a", "b"])
    assert m.next_deadline() == INTERVAL


def test_switching_to_a_regex_sends_the_regex_and_clears_the_names():
    m = member()
    join(m, 0)
    m.subscribe(regex="foo-.*")
    request = only_heartbeat(m, 1)
    assert request.subscribed_topic_regex == "foo-.*"
    assert request.subscribed_topic_names == []
    m.on_response(request, hb_response(epoch=1), 2)
    # Back to names: the regex is cleared with "".
    m.subscribe(topics=["foo"])
    request = only_heartbeat(m, 3)
    assert request.subscribed_topic_names == ["foo"]
    assert request.subscribed_topic_regex == ""


def test_regex_join_sends_the_regex_and_empty_names():
    m = member()
    m.subscribe(regex="^orders-")
    request = only_heartbeat(m, 0)
    assert request.subscribed_topic_regex == "^orders-"
    assert request.subscribed_topic_names == []


@pytest.mark.parametrize("kwargs", [{}, {"topics": ["a"], "regex": "a"}, {"topics": []}, {"regex": ""}])
def test_subscribe_wants_exactly_one_non_empty_subscription(kwargs):
    with pytest.raises(ValueError):
        member().subscribe(**kwargs)


def test_config_rejects_both_assignor_kinds():
    with pytest.raises(ValueError):
        MemberConfig(group_id="g", server_assignor="range", client_assignors=[RecordingAssignor()])


@pytest.mark.parametrize(
    "code",
    [Errors.CoordinatorLoadInProgressError.errno, Errors.NotCoordinatorError.errno, Errors.CoordinatorNotAvailableError.errno],
)
def test_after_a_retriable_error_the_next_heartbeat_carries_every_field(code):
    m = member(instance_id="pod-0", rack_id="r", server_assignor="range")
    join(m, 0, epoch=2, assigned=parts(FOO, 0))
    m.take_events()
    request = only_heartbeat(m, INTERVAL)  # carries the owned partitions (acknowledgement)
    m.on_response(request, hb_response(epoch=2), INTERVAL)
    request = only_heartbeat(m, 2 * INTERVAL)
    assert request.topic_partitions is None
    m.on_response(request, error_response(code), 2 * INTERVAL + 7)
    events = m.take_events()
    if code in (Errors.NotCoordinatorError.errno, Errors.CoordinatorNotAvailableError.errno):
        assert events == [CoordinatorUnavailable(code)]
    else:
        assert events == []
    # Retried after the back-off, not at the interval; partitions are kept.
    assert m.next_deadline() == 2 * INTERVAL + 7 + BACKOFF
    assert m.owned_partitions == parts(FOO, 0)
    assert m.poll(2 * INTERVAL + 7 + BACKOFF - 1) == []
    request = only_heartbeat(m, 2 * INTERVAL + 7 + BACKOFF)
    assert request.member_epoch == 2
    assert request.instance_id == "pod-0"
    assert request.rack_id == "r"
    assert request.rebalance_timeout_ms == 300_000
    assert request.subscribed_topic_names == ["foo"]
    assert request.server_assignor == "range"
    assert owned_in(request) == parts(FOO, 0)


def test_after_a_failed_request_the_next_heartbeat_carries_every_field():
    m = member(rack_id="r")
    join(m, 0, epoch=2)
    request = only_heartbeat(m, INTERVAL)
    m.on_request_failed(request, INTERVAL + 30)
    assert m.state is MemberState.STABLE and m.member_epoch == 2
    request = only_heartbeat(m, INTERVAL + 30 + BACKOFF)
    assert request.rack_id == "r"
    assert request.rebalance_timeout_ms == 300_000
    assert request.subscribed_topic_names == ["foo"]
    assert request.topic_partitions == []
    # Once answered, back to changed fields only.
    m.on_response(request, hb_response(epoch=2), INTERVAL + 200)
    request = only_heartbeat(m, 2 * INTERVAL + 200)
    assert request.rack_id is None and request.topic_partitions is None


def test_a_failed_join_is_retried_with_epoch_zero():
    m = member()
    m.subscribe(topics=["foo"])
    request = only_heartbeat(m, 0)
    m.on_request_failed(request, 50)
    assert m.state is MemberState.JOINING
    request = only_heartbeat(m, 150)
    assert request.member_epoch == 0 and request.member_id == ""
    assert request.subscribed_topic_names == ["foo"]


def test_answers_to_requests_no_longer_in_flight_are_ignored():
    m = member()
    join(m, 0, epoch=1)
    request = only_heartbeat(m, INTERVAL)
    m.on_response(request, hb_response(epoch=2, assigned=parts(FOO, 0)), INTERVAL)
    # The network duplicates the answer; a different epoch must not be taken from it.
    m.on_response(request, hb_response(epoch=9, assigned=parts(FOO, 5)), INTERVAL + 1)
    assert m.member_epoch == 2
    assert m.owned_partitions == parts(FOO, 0)


# ---------------------------------------------------------------------------- reconciliation


def test_revocation_shrinks_owned_at_once_and_is_acked_right_after_revocation_done():
    m = member()
    join(m, 0, epoch=1, assigned=parts(FOO, 0, 1, 2))
    assert m.take_events() == [PartitionsAssigned(parts(FOO, 0, 1, 2), 1)]
    request = only_heartbeat(m, INTERVAL)
    assert owned_in(request) == parts(FOO, 0, 1, 2)
    m.on_response(request, hb_response(epoch=1, assigned=parts(FOO, 0, 1)), INTERVAL + 5)

    events = m.take_events()
    assert len(events) == 1 and isinstance(events[0], RevokePartitions)
    revoke = events[0]
    assert revoke.partitions == parts(FOO, 2)
    assert m.owned_partitions == parts(FOO, 0, 1)  # no longer processed
    assert m.revoking_partitions == parts(FOO, 2)
    assert m.state is MemberState.RECONCILING

    # Before the caller is done, heartbeats still report foo-2 as owned (no ack yet).
    request = only_heartbeat(m, 2 * INTERVAL)
    assert owned_in(request) == parts(FOO, 0, 1, 2)
    m.on_response(request, hb_response(epoch=1), 2 * INTERVAL)
    assert m.poll(2 * INTERVAL + 10) == []

    m.revocation_done(2 * INTERVAL + 10, revoke.revocation_id)
    assert m.state is MemberState.ACKNOWLEDGING
    assert m.next_deadline() == 2 * INTERVAL + 10
    ack = only_heartbeat(m, 2 * INTERVAL + 10)
    assert ack.member_epoch == 1
    assert owned_in(ack) == parts(FOO, 0, 1)
    m.on_response(ack, hb_response(epoch=2, assigned=parts(FOO, 0, 1)), 2 * INTERVAL + 20)
    assert m.state is MemberState.STABLE
    assert m.member_epoch == 2
    assert m.take_events() == []


def test_the_ack_waits_for_the_heartbeat_in_flight():
    m = member()
    join(m, 0, epoch=1, assigned=parts(FOO, 0, 1))
    m.take_events()
    request = only_heartbeat(m, INTERVAL)
    m.on_response(request, hb_response(epoch=1, assigned=parts(FOO, 0)), INTERVAL)
    (revoke,) = m.take_events()
    in_flight = only_heartbeat(m, 2 * INTERVAL)
    m.revocation_done(2 * INTERVAL + 1, revoke.revocation_id)
    assert m.poll(2 * INTERVAL + 1) == []
    m.on_response(in_flight, hb_response(epoch=1), 2 * INTERVAL + 50)
    ack = only_heartbeat(m, 2 * INTERVAL + 50)  # at once, not at the interval
    assert owned_in(ack) == parts(FOO, 0)


def test_a_lost_ack_is_sent_again_with_every_field():
    m = member()
    join(m, 0, epoch=1, assigned=parts(FOO, 0, 1))
    m.take_events()
    request = only_heartbeat(m, INTERVAL)
    m.on_response(request, hb_response(epoch=1, assigned=parts(FOO, 1)), INTERVAL)
    (revoke,) = m.take_events()
    m.revocation_done(INTERVAL + 1, revoke.revocation_id)
    ack = only_heartbeat(m, INTERVAL + 1)
    m.on_request_failed(ack, INTERVAL + 2)
    assert m.state is MemberState.ACKNOWLEDGING
    again = only_heartbeat(m, INTERVAL + 2 + BACKOFF)
    assert owned_in(again) == parts(FOO, 1)
    assert again.subscribed_topic_names == ["foo"]
    m.on_response(again, hb_response(epoch=2), INTERVAL + 200)
    assert m.state is MemberState.STABLE


def test_pending_partitions_are_assigned_as_they_are_released():
    m = member()
    join(m, 0, epoch=3, assigned=parts(FOO, 0), pending=parts(FOO, 1, 2) | parts(BAR, 0))
    assert m.take_events() == [PartitionsAssigned(parts(FOO, 0), 3)]
    assert m.owned_partitions == parts(FOO, 0)
    assert m.pending_partitions == parts(FOO, 1, 2) | parts(BAR, 0)

    request = only_heartbeat(m, INTERVAL)
    m.on_response(request, hb_response(epoch=3, assigned=parts(FOO, 0, 1), pending=parts(FOO, 2) | parts(BAR, 0)), INTERVAL)
    assert m.take_events() == [PartitionsAssigned(parts(FOO, 1), 3)]
    assert m.pending_partitions == parts(FOO, 2) | parts(BAR, 0)

    request = only_heartbeat(m, 2 * INTERVAL)
    assert owned_in(request) == parts(FOO, 0, 1)
    m.on_response(request, hb_response(epoch=3, assigned=parts(FOO, 0, 1, 2) | parts(BAR, 0)), 2 * INTERVAL)
    assert m.take_events() == [PartitionsAssigned(parts(FOO, 2) | parts(BAR, 0), 3)]
    assert m.pending_partitions == frozenset()
    assert m.owned_partitions == parts(FOO, 0, 1, 2) | parts(BAR, 0)


def test_no_assignment_in_the_response_changes_nothing():
    m = member()
    join(m, 0, epoch=1, assigned=parts(FOO, 0))
    m.take_events()
    request = only_heartbeat(m, INTERVAL)
    m.on_response(request, hb_response(epoch=1), INTERVAL)
    assert m.take_events() == []
    assert m.owned_partitions == parts(FOO, 0)


def test_new_partitions_wait_until_the_revocation_is_done():
    m = member()
    join(m, 0, epoch=1, assigned=parts(FOO, 0, 1))
    m.take_events()
    request = only_heartbeat(m, INTERVAL)
    m.on_response(request, hb_response(epoch=1, assigned=parts(FOO, 0)), INTERVAL)
    (revoke,) = m.take_events()
    # The target moves on while the caller is still committing foo-1: foo-1 comes back and
    # foo-2 is new. Neither may be processed before the revocation of foo-1 is complete.
    request = only_heartbeat(m, 2 * INTERVAL)
    m.on_response(request, hb_response(epoch=1, assigned=parts(FOO, 0, 1, 2)), 2 * INTERVAL)
    assert m.take_events() == []
    assert m.owned_partitions == parts(FOO, 0)
    m.revocation_done(2 * INTERVAL + 1, revoke.revocation_id)
    assert m.take_events() == [PartitionsAssigned(parts(FOO, 1, 2), 1)]
    ack = only_heartbeat(m, 2 * INTERVAL + 1)
    assert owned_in(ack) == parts(FOO, 0, 1, 2)


def test_further_revocations_start_while_one_is_in_progress():
    m = member()
    join(m, 0, epoch=1, assigned=parts(FOO, 0, 1, 2))
    m.take_events()
    request = only_heartbeat(m, INTERVAL)
    m.on_response(request, hb_response(epoch=1, assigned=parts(FOO, 0, 1)), INTERVAL)
    (first,) = m.take_events()
    request = only_heartbeat(m, 2 * INTERVAL)
    m.on_response(request, hb_response(epoch=1, assigned=parts(FOO, 0)), 2 * INTERVAL)
    (second,) = m.take_events()
    assert second.partitions == parts(FOO, 1) and second.revocation_id != first.revocation_id
    assert m.owned_partitions == parts(FOO, 0)
    m.revocation_done(2 * INTERVAL + 1, first.revocation_id)
    assert m.state is MemberState.RECONCILING  # foo-1 is still being committed
    assert m.poll(2 * INTERVAL + 1) == []
    m.revocation_done(2 * INTERVAL + 2, second.revocation_id)
    ack = only_heartbeat(m, 2 * INTERVAL + 2)
    assert owned_in(ack) == parts(FOO, 0)


# ---------------------------------------------------------------------------- fencing & errors


@pytest.mark.parametrize("code", [FENCED, UNKNOWN_MEMBER])
def test_fenced_or_unknown_loses_everything_and_rejoins_with_epoch_zero(code):
    m = member(instance_id="pod-0", server_assignor="uniform")
    join(m, 0, epoch=4, assigned=parts(FOO, 0, 1, 2))
    m.take_events()
    request = only_heartbeat(m, INTERVAL)
    m.on_response(request, hb_response(epoch=4, assigned=parts(FOO, 0, 1)), INTERVAL)
    (revoke,) = m.take_events()  # foo-2 is being revoked when the fence comes

    request = only_heartbeat(m, 2 * INTERVAL)
    m.on_response(request, error_response(code), 2 * INTERVAL + 3)
    assert m.take_events() == [PartitionsLost(parts(FOO, 0, 1, 2), code)]
    assert m.owned_partitions == frozenset() and m.revoking_partitions == frozenset()
    assert m.state is MemberState.FENCED
    assert m.member_epoch == 0 and m.member_id == "m-1"
    assert m.next_deadline() == 2 * INTERVAL + 3  # at once

    rejoin = only_heartbeat(m, 2 * INTERVAL + 3)
    assert m.state is MemberState.JOINING
    assert rejoin.member_id == "m-1"
    assert rejoin.member_epoch == 0
    assert rejoin.instance_id == "pod-0"
    assert rejoin.rebalance_timeout_ms == 300_000
    assert rejoin.subscribed_topic_names == ["foo"]
    assert rejoin.server_assignor == "uniform"
    assert rejoin.topic_partitions == []

    # The caller finishing the old revocation after the fence changes nothing.
    m.revocation_done(2 * INTERVAL + 4, revoke.revocation_id)
    assert m.state is MemberState.JOINING
    m.on_response(rejoin, hb_response(epoch=6, assigned=parts(FOO, 2)), 2 * INTERVAL + 5)
    assert m.state is MemberState.STABLE and m.member_epoch == 6
    assert m.take_events() == [PartitionsAssigned(parts(FOO, 2), 6)]


def test_a_member_whose_group_went_back_to_classic_rejoins_and_a_join_refused_so_is_fatal():
    """Cut off past its session, the last KIP-848 member is removed and the coordinator converts
    the group back to classic for the classic members left (KIP-848's downgrade); its next
    heartbeat is told GROUP_ID_NOT_FOUND. Its membership is gone, as when fenced: it loses its
    partitions and rejoins at epoch 0, which upgrades the group again. Kafka's consumer dies
    here (the simulator's migration seed 1002341). A join refused the same way stays fatal."""
    not_found = Errors.GroupIdNotFoundError.errno
    m = member()
    join(m, 0, epoch=3, assigned=parts(FOO, 0, 1))
    m.take_events()
    request = only_heartbeat(m, INTERVAL)
    m.on_response(request, error_response(not_found, "Group g is not a consumer group"), INTERVAL + 1)
    assert m.take_events() == [PartitionsLost(parts(FOO, 0, 1), not_found)]
    assert m.state is MemberState.FENCED and m.owned_partitions == frozenset()
    rejoin = only_heartbeat(m, INTERVAL + 1)
    assert rejoin.member_epoch == 0 and rejoin.member_id == "m-1"
    m.on_response(rejoin, error_response(not_found, "Group g is not a consumer group"), INTERVAL + 2)
    assert m.state is MemberState.FATAL
    (failed,) = m.take_events()
    assert isinstance(failed, MemberFailed) and "GROUP_ID_NOT_FOUND" in failed.message


def test_a_static_join_refused_with_unreleased_instance_id_is_retried_with_backoff_until_it_succeeds():
    """A crash-restart: the previous incarnation holds the instance id until its session ends."""
    m = member(instance_id="pod-7", retry_backoff_ms=100)
    m.subscribe(topics=["foo"])
    now, delays = 0, []
    for attempt in range(1, 7):
        request = only_heartbeat(m, now)
        assert request.member_epoch == 0 and request.instance_id == "pod-7"
        m.on_response(request, error_response(UNRELEASED, "instance pod-7 is in use"), now + 1)
        (event,) = m.take_events()
        assert event == InstanceIdUnreleased("pod-7", attempt, event.retry_in_ms)
        assert m.state is not MemberState.FATAL and m.next_deadline() == now + 1 + event.retry_in_ms
        assert m.poll(now + event.retry_in_ms) == []  # nothing before the back-off ends
        delays.append(event.retry_in_ms)
        now = m.next_deadline()
    assert delays == sorted(delays) and delays[0] == 200 and delays[-1] == 2_000  # grows, then capped
    request = only_heartbeat(m, now)
    m.on_response(request, hb_response(epoch=1, member_id="m-1"), now + 1)
    assert m.state is not MemberState.FATAL and m.member_epoch == 1


def test_unreleased_instance_id_after_joining_is_fatal_with_a_clear_message():
    """Outside a join (the coordinator gave the id to someone else meanwhile) it stays fatal."""
    m = member(instance_id="pod-7")
    join(m, 0, epoch=2, assigned=parts(FOO, 0))
    m.take_events()
    request = only_heartbeat(m, INTERVAL)
    m.on_response(request, error_response(UNRELEASED, "instance pod-7 is in use"), INTERVAL + 1)
    assert m.state is MemberState.FATAL
    failed = [e for e in m.take_events() if isinstance(e, MemberFailed)][0]
    for text in ("UNRELEASED_INSTANCE_ID", "'pod-7'", "'g'", "instance pod-7 is in use"):
        assert text in failed.message
    with pytest.raises(MemberFatalError, match="UNRELEASED_INSTANCE_ID"):
        m.subscribe(topics=["foo"])


@pytest.mark.parametrize(
    "code",
    [
        Errors.UnsupportedAssignorError.errno,
        Errors.InvalidRequestError.errno,
        Errors.GroupAuthorizationFailedError.errno,
        Errors.GroupMaxSizeReachedError.errno,
    ],
)
def test_other_non_retriable_heartbeat_errors_are_fatal_and_drop_partitions(code):
    m = member()
    join(m, 0, epoch=1, assigned=parts(FOO, 0))
    m.take_events()
    request = only_heartbeat(m, INTERVAL)
    m.on_response(request, error_response(code), INTERVAL)
    events = m.take_events()
    assert events[0] == PartitionsLost(parts(FOO, 0), code)
    assert isinstance(events[1], MemberFailed) and str(code) in events[1].message
    assert m.owned_partitions == frozenset()
    assert m.poll(10 * INTERVAL) == []


def test_session_guard_drops_partitions_before_the_coordinator_can_expire_the_member():
    m = member(session_timeout_ms=3 * INTERVAL)
    join(m, 0, epoch=1, assigned=parts(FOO, 0))  # the join was sent at 0 and answered
    m.take_events()
    request = only_heartbeat(m, INTERVAL)
    m.on_request_failed(request, INTERVAL + 500)
    request = only_heartbeat(m, INTERVAL + 600)  # no answer at all from here on
    assert m.next_deadline() == 3 * INTERVAL
    assert m.poll(3 * INTERVAL - 1) == []
    rejoin = only_heartbeat(m, 3 * INTERVAL)
    assert m.take_events() == [PartitionsLost(parts(FOO, 0), Errors.RequestTimedOutError.errno)]
    assert rejoin.member_epoch == 0 and rejoin.member_id == "m-1"
    # The old heartbeat's late answer belongs to the expired session.
    m.on_response(request, hb_response(epoch=1, assigned=parts(FOO, 0)), 3 * INTERVAL + 1)
    assert m.owned_partitions == frozenset() and m.state is MemberState.JOINING


def test_an_unacknowledged_revocation_past_the_rebalance_timeout_loses_everything():
    m = member(rebalance_timeout_ms=5 * INTERVAL)
    join(m, 0, epoch=1, assigned=parts(FOO, 0, 1))
    m.take_events()
    settled = only_heartbeat(m, INTERVAL)  # answered with nothing to revoke
    m.on_response(settled, hb_response(epoch=1, assigned=parts(FOO, 0, 1)), INTERVAL)
    request = only_heartbeat(m, 2 * INTERVAL)
    m.on_response(request, hb_response(epoch=1, assigned=parts(FOO, 0)), 2 * INTERVAL)
    (revoke,) = m.take_events()
    # The coordinator's timer started no earlier than the send of the first heartbeat after
    # the last settled answer: the one (at 2 * INTERVAL) whose answer asked for the revocation.
    assert m.next_deadline() == 2 * INTERVAL + INTERVAL  # next heartbeat first
    m.revocation_done(3 * INTERVAL, revoke.revocation_id)
    ack = only_heartbeat(m, 3 * INTERVAL)
    m.on_request_failed(ack, 3 * INTERVAL + 50)
    for now in range(3 * INTERVAL + 150, 7 * INTERVAL, 100):  # every acknowledgement is lost
        for request in m.poll(now):
            m.on_request_failed(request, now)
    assert m.next_deadline() == 7 * INTERVAL and m.state is MemberState.ACKNOWLEDGING
    rejoin = only_heartbeat(m, 7 * INTERVAL)
    assert m.take_events() == [PartitionsLost(parts(FOO, 0), Errors.RequestTimedOutError.errno)]
    assert rejoin.member_epoch == 0 and m.owned_partitions == frozenset()


def test_an_acknowledged_revocation_clears_the_rebalance_timeout():
    m = member(rebalance_timeout_ms=5 * INTERVAL)
    join(m, 0, epoch=1, assigned=parts(FOO, 0, 1))
    request = only_heartbeat(m, INTERVAL)
    m.on_response(request, hb_response(epoch=1, assigned=parts(FOO, 0)), INTERVAL)
    m.take_events()
    m.revocation_done(INTERVAL + 1)
    ack = only_heartbeat(m, INTERVAL + 1)
    m.on_response(ack, hb_response(epoch=2, assigned=parts(FOO, 0)), INTERVAL + 2)
    assert m.state is MemberState.STABLE
    for now in range(2 * INTERVAL + 1, 20 * INTERVAL, INTERVAL):
        request = only_heartbeat(m, now)
        m.on_response(request, hb_response(epoch=2), now)
    assert m.owned_partitions == parts(FOO, 0)


# ---------------------------------------------------------------------------- leaving


def test_leave_revokes_then_sends_minus_one():
    m = member()
    join(m, 0, epoch=5, assigned=parts(FOO, 0, 1))
    m.take_events()
    m.leave(100)
    assert m.state is MemberState.PREPARE_LEAVING
    (revoke,) = m.take_events()
    assert revoke.partitions == parts(FOO, 0, 1)
    assert m.owned_partitions == frozenset()
    assert m.poll(100) == []  # the leave waits for the commit
    m.revocation_done(200, revoke.revocation_id)
    assert m.state is MemberState.LEAVING
    leave = only_heartbeat(m, 200)
    assert leave.member_epoch == -1 and leave.member_id == "m-1"
    assert leave.topic_partitions is None and leave.subscribed_topic_names is None
    assert m.poll(300) == [] and m.next_deadline() is None
    m.on_response(leave, hb_response(epoch=-1, interval=0), 300)
    assert m.state is MemberState.UNSUBSCRIBED
    assert m.take_events() == [LeftGroup(-1)]
    assert m.poll(10 * INTERVAL) == []


def test_a_member_that_cannot_commit_loses_its_partitions_and_leaves_at_once():
    # Its processing failed: nothing can be committed, so no revocation is waited for (the
    # one under way included); the leave heartbeat goes out at once, -1 even for a static member.
    m = member(instance_id="pod-3")
    join(m, 0, epoch=5, assigned=parts(FOO, 0, 1, 2))
    m.take_events()
    request = only_heartbeat(m, INTERVAL)
    m.on_response(request, hb_response(epoch=5, assigned=parts(FOO, 0, 1)), INTERVAL)
    (revoke,) = m.take_events()
    assert revoke.partitions == parts(FOO, 2)
    m.leave(INTERVAL + 10, permanent=True, lose=True)
    assert m.take_events() == [PartitionsLost(parts(FOO, 0, 1, 2), 0)]
    assert m.owned_partitions == frozenset() and m.revoking_partitions == frozenset()
    leave = only_heartbeat(m, INTERVAL + 10)
    assert leave.member_epoch == -1
    m.on_response(leave, hb_response(epoch=-1, interval=0), INTERVAL + 20)
    assert m.state is MemberState.UNSUBSCRIBED
    assert m.take_events() == [LeftGroup(-1)]


def test_static_member_leaves_temporarily_with_minus_two():
    m = member(instance_id="pod-3")
    join(m, 0, epoch=5)
    m.leave(100)
    leave = only_heartbeat(m, 100)
    assert leave.member_epoch == -2
    assert leave.instance_id == "pod-3"
    m.on_request_failed(leave, 200)  # best effort: not retried
    assert m.state is MemberState.UNSUBSCRIBED
    assert m.take_events() == [LeftGroup(-2)]


def test_static_member_can_leave_for_good():
    m = member(instance_id="pod-3")
    join(m, 0, epoch=5)
    m.leave(100, permanent=True)
    assert only_heartbeat(m, 100).member_epoch == -1


def test_leave_before_the_join_is_answered_waits_for_the_member_id():
    m = member()
    m.subscribe(topics=["foo"])
    join_request = only_heartbeat(m, 0)
    m.leave(1)
    assert m.state is MemberState.PREPARE_LEAVING
    m.on_response(join_request, hb_response(member_id="m-9", epoch=1, assigned=parts(FOO, 0)), 2)
    assert m.take_events() == []  # a leaving member takes nothing
    leave = only_heartbeat(m, 2)
    assert (leave.member_id, leave.member_epoch) == ("m-9", -1)


def test_a_member_accepted_at_epoch_zero_heartbeats_incrementally_and_leaves_with_minus_one():
    # The coordinator may keep a new member at epoch 0 while a client-side assignment is
    # computed: it is in the group all the same.
    m = member()
    join(m, 0, epoch=0)
    assert m.state is MemberState.STABLE
    request = only_heartbeat(m, INTERVAL)
    assert (request.member_id, request.member_epoch) == ("m-1", 0)
    assert request.rebalance_timeout_ms == -1 and request.subscribed_topic_names is None
    m.on_response(request, hb_response(epoch=0), INTERVAL)
    m.leave(INTERVAL + 1)
    leave = only_heartbeat(m, INTERVAL + 1)
    assert (leave.member_id, leave.member_epoch) == ("m-1", -1)


def test_leave_without_a_member_is_immediate():
    m = member()
    m.subscribe(topics=["foo"])
    m.leave(0)
    assert m.state is MemberState.UNSUBSCRIBED
    assert m.take_events() == [LeftGroup(None)]
    assert m.poll(0) == []


def test_rejoining_after_a_leave_keeps_the_member_id_and_sends_every_field():
    m = member()
    join(m, 0, epoch=5)
    m.leave(1)
    m.on_response(only_heartbeat(m, 1), hb_response(epoch=-1), 2)
    m.subscribe(topics=["bar"])
    request = only_heartbeat(m, 3)
    assert (request.member_id, request.member_epoch) == ("m-1", 0)
    assert request.subscribed_topic_names == ["bar"] and request.rebalance_timeout_ms == 300_000


def test_close_leaves_and_refuses_to_subscribe_again():
    m = member()
    join(m, 0, epoch=5)
    m.close(1)
    assert only_heartbeat(m, 1).member_epoch == -1
    with pytest.raises(RuntimeError):
        m.subscribe(topics=["foo"])


def test_fenced_while_leaving_ends_the_leave_without_a_leave_heartbeat():
    m = member()
    join(m, 0, epoch=5, assigned=parts(FOO, 0))
    m.take_events()
    m.leave(1)
    (revoke,) = m.take_events()
    request = only_heartbeat(m, INTERVAL)  # the session is still kept while committing
    m.on_response(request, error_response(FENCED), INTERVAL)
    assert m.take_events() == [PartitionsLost(parts(FOO, 0), FENCED), LeftGroup(None)]
    assert m.state is MemberState.UNSUBSCRIBED
    m.revocation_done(INTERVAL + 1, revoke.revocation_id)
    assert m.poll(INTERVAL + 1) == []


# ------------------------------------------------------------------- client-side assignment


class RecordingAssignor:
    name = "streams"
    minimum_version = 1
    maximum_version = 3

    def __init__(self) -> None:
        self.current = AssignorMetadata(reason=0, version=3, data=b"meta-1")
        self.specs: list[AssignmentSpec] = []
        self.on_assignment_calls: list[tuple[int, MemberAssignment, int]] = []
        self.result = GroupAssignment(members={})
        self.raises = False

    def metadata(self) -> AssignorMetadata:
        return self.current

    def assign(self, spec: AssignmentSpec) -> GroupAssignment:
        self.specs.append(spec)
        if self.raises:
            raise PartitionAssignorError("topologies differ")
        return self.result

    def on_assignment(self, error: int, assignment: MemberAssignment, group_epoch: int) -> None:
        self.on_assignment_calls.append((error, assignment, group_epoch))


def prepare_response(*, error: int = 0, group_epoch: int = 7, assignor_name: str = "streams") -> ConsumerGroupPrepareAssignmentResponse:
    R = ConsumerGroupPrepareAssignmentResponse
    return R(
        throttle_time_ms=0,
        error_code=error,
        error_message=None,
        group_epoch=group_epoch,
        assignor_name=assignor_name,
        members=[
            R.Member(
                member_id="m-1",
                member_epoch=6,
                instance_id="pod-0",
                rack_id="rack-a",
                subscribed_topic_ids=[FOO, BAR],
                assignor=R.Member.Assignor(reason=2, minimum_version=1, maximum_version=3, metadata_version=3, metadata_bytes=b"lags-1"),
                topic_partitions=[R.Member.TopicPartitions(topic_id=FOO, partitions=[0, 1])],
            ),
            R.Member(
                member_id="m-2",
                member_epoch=6,
                instance_id=None,
                rack_id=None,
                subscribed_topic_ids=[FOO],
                assignor=R.Member.Assignor(reason=0, minimum_version=1, maximum_version=2, metadata_version=2, metadata_bytes=b""),
                topic_partitions=[],
            ),
        ],
        topics=[
            R.TopicMetadata(topic_id=FOO, topic_name="foo", num_partitions=3),
            R.TopicMetadata(topic_id=BAR, topic_name="bar", num_partitions=1),
        ],
    )


def install_response(error: int = 0) -> ConsumerGroupInstallAssignmentResponse:
    return ConsumerGroupInstallAssignmentResponse(throttle_time_ms=0, error_code=error, error_message=None)


def computing_member(assignor: RecordingAssignor) -> tuple[ConsumerGroupMember, int]:
    """A joined member told to compute the assignment; returns it and the current time."""
    m = member(client_assignors=[assignor])
    join(m, 0, epoch=6, should_compute=True)
    return m, 0


def test_client_assignors_metadata_goes_into_the_join_heartbeat():
    assignor = RecordingAssignor()
    m = member(client_assignors=[assignor])
    m.subscribe(topics=["foo"])
    request = only_heartbeat(m, 0)
    assert request.server_assignor is None
    (entry,) = request.client_assignors
    assert (entry.name, entry.minimum_version, entry.maximum_version) == ("streams", 1, 3)
    assert (entry.reason, entry.metadata_version, entry.metadata_bytes) == (0, 3, b"meta-1")


def test_assignor_metadata_is_sent_when_it_changes_and_only_then():
    assignor = RecordingAssignor()
    m = member(client_assignors=[assignor])
    join(m, 0, epoch=1)
    now = INTERVAL
    request = only_heartbeat(m, now)
    assert request.client_assignors is None
    m.on_response(request, hb_response(epoch=1), now)

    # A reason asks for a new assignment: sent once...
    assignor.current = AssignorMetadata(reason=2, version=3, data=b"lags-2")
    m.request_heartbeat()
    request = only_heartbeat(m, now + 1)
    (entry,) = request.client_assignors
    assert (entry.reason, entry.metadata_bytes) == (2, b"lags-2")
    m.on_response(request, hb_response(epoch=2), now + 1)
    # ...not again while metadata() keeps saying the same...
    request = only_heartbeat(m, now + 1 + INTERVAL)
    assert request.client_assignors is None
    m.on_response(request, hb_response(epoch=2), now + 1 + INTERVAL)
    # ...and the reason goes back to 0 only when the assignor says so.
    assignor.current = AssignorMetadata(reason=0, version=3, data=b"lags-2")
    request = only_heartbeat(m, now + 1 + 2 * INTERVAL)
    (entry,) = request.client_assignors
    assert (entry.reason, entry.metadata_bytes) == (0, b"lags-2")


def test_assignor_version_range_from_metadata_wins_when_given():
    assignor = RecordingAssignor()
    assignor.current = AssignorMetadata(reason=0, version=2, data=b"", minimum_version=-1, maximum_version=2)
    m = member(client_assignors=[assignor])
    m.subscribe(topics=["foo"])
    (entry,) = only_heartbeat(m, 0).client_assignors
    assert (entry.minimum_version, entry.maximum_version) == (-1, 2)


def test_client_side_assignment_loop():
    assignor = RecordingAssignor()
    assignor.result = GroupAssignment(
        members={
            "m-2": MemberAssignment(partitions={FOO: frozenset({2})}, metadata_version=2, metadata=b"for-m2"),
            "m-1": MemberAssignment(partitions={FOO: frozenset({1, 0}), BAR: frozenset({0})}, metadata_version=3, metadata=b"for-m1"),
        },
    )
    m, now = computing_member(assignor)
    assert m.computing_assignment
    (prepare,) = m.poll(now)
    assert isinstance(prepare, ConsumerGroupPrepareAssignmentRequest)
    assert (prepare.group_id, prepare.member_id, prepare.member_epoch) == ("g", "m-1", 6)
    assert m.poll(now) == []  # one Prepare in flight

    m.on_response(prepare, prepare_response(group_epoch=7), now + 1)
    (spec,) = assignor.specs
    assert set(spec.members) == {"m-1", "m-2"}
    first = spec.members["m-1"]
    assert first.subscribed_topic_ids == frozenset({FOO, BAR})
    assert first.target_partitions == {FOO: frozenset({0, 1})}
    assert (first.instance_id, first.rack_id) == ("pod-0", "rack-a")
    assert first.metadata == AssignorMetadata(reason=2, version=3, data=b"lags-1", minimum_version=1, maximum_version=3)
    second = spec.members["m-2"]
    assert second.target_partitions == {} and second.instance_id is None
    assert second.metadata.maximum_version == 2
    assert spec.topics[FOO].name == "foo" and spec.topics[FOO].num_partitions == 3
    assert spec.topics[BAR].num_partitions == 1

    (install,) = m.poll(now + 1)
    assert isinstance(install, ConsumerGroupInstallAssignmentRequest)
    assert (install.group_id, install.member_id, install.member_epoch) == ("g", "m-1", 6)
    assert install.group_epoch == 7
    assert install.error == 0
    assert [member.member_id for member in install.members] == ["m-1", "m-2"]
    m1 = install.members[0]
    assert PartitionSet.from_wire(m1.partitions) == parts(FOO, 0, 1) | parts(BAR, 0)
    assert (m1.metadata_version, m1.metadata_bytes) == (3, b"for-m1")
    assert install.members[1].metadata_bytes == b"for-m2"

    m.on_response(install, install_response(), now + 2)
    assert AssignmentInstalled(7) in m.take_events()
    assert not m.computing_assignment
    # The installed target holds the member's new assignment: it heartbeats at once for it,
    # not an interval later.
    fetch = only_heartbeat(m, now + 2)
    assert fetch.member_epoch == 6
    m.on_response(fetch, hb_response(epoch=6), now + 3)
    assert m.poll(now + 3) == []
    # Asked again later: a new round.
    later = now + 2 + INTERVAL
    request = only_heartbeat(m, later)
    m.on_response(request, hb_response(epoch=8, should_compute=True), later)
    (prepare,) = m.poll(later)
    assert prepare.member_epoch == 8


def test_should_compute_again_while_computing_does_not_start_a_second_round():
    assignor = RecordingAssignor()
    m, now = computing_member(assignor)
    (prepare,) = m.poll(now)
    request = only_heartbeat(m, INTERVAL)
    m.on_response(request, hb_response(epoch=6, should_compute=True), INTERVAL)
    assert m.poll(INTERVAL) == []


def test_prepare_stale_member_epoch_is_retried_after_the_next_heartbeat_response():
    assignor = RecordingAssignor()
    m, now = computing_member(assignor)
    (prepare,) = m.poll(now)
    m.on_response(prepare, prepare_response(error=STALE), now + 1)
    assert m.computing_assignment and assignor.specs == []
    # Nothing but a heartbeat (sent at once, to learn the epoch) until its answer comes.
    (heartbeat,) = m.poll(now + 1)
    assert isinstance(heartbeat, ConsumerGroupHeartbeatRequest)
    assert m.poll(now + 2) == []
    m.on_response(heartbeat, hb_response(epoch=9), now + 3)
    (retry,) = m.poll(now + 3)
    assert isinstance(retry, ConsumerGroupPrepareAssignmentRequest)
    assert retry.member_epoch == 9


@pytest.mark.parametrize("code", [UNKNOWN_MEMBER, Errors.NotCoordinatorError.errno])
def test_prepare_errors_abandon_the_round(code):
    assignor = RecordingAssignor()
    m, now = computing_member(assignor)
    (prepare,) = m.poll(now)
    m.on_response(prepare, prepare_response(error=code), now + 1)
    events = m.take_events()
    assert [type(e) for e in events] == [AssignmentAbandoned]
    assert events[0].api == "prepare" and events[0].error_code == code
    assert not m.computing_assignment and assignor.specs == []
    assert m.poll(now + 1) == []
    # The member stays in the group.
    assert m.state is MemberState.STABLE and m.member_epoch == 6


def test_a_failed_prepare_is_retried_after_the_backoff():
    m, now = computing_member(RecordingAssignor())
    (prepare,) = m.poll(now)
    m.on_request_failed(prepare, now + 10)
    assert m.next_deadline() == now + 10 + BACKOFF
    assert m.poll(now + 10 + BACKOFF - 1) == []
    (again,) = m.poll(now + 10 + BACKOFF)
    assert isinstance(again, ConsumerGroupPrepareAssignmentRequest)


def test_install_stale_member_epoch_is_retried_with_the_new_epoch():
    assignor = RecordingAssignor()
    assignor.result = GroupAssignment(members={"m-1": MemberAssignment(partitions={FOO: frozenset({0, 1, 2})})})
    m, now = computing_member(assignor)
    (prepare,) = m.poll(now)
    m.on_response(prepare, prepare_response(group_epoch=7), now)
    (install,) = m.poll(now)
    m.on_response(install, install_response(STALE), now + 1)
    assert m.computing_assignment
    (heartbeat,) = m.poll(now + 1)
    assert isinstance(heartbeat, ConsumerGroupHeartbeatRequest)
    m.on_response(heartbeat, hb_response(epoch=8), now + 2)
    (retry,) = m.poll(now + 2)
    assert isinstance(retry, ConsumerGroupInstallAssignmentRequest)
    assert (retry.member_epoch, retry.group_epoch) == (8, 7)  # same assignment, new epoch
    assert retry.members == install.members
    assert len(assignor.specs) == 1  # not recomputed
    m.on_response(retry, install_response(), now + 3)
    assert m.take_events() == [AssignmentInstalled(7)]


@pytest.mark.parametrize("code", [Errors.GroupIdNotFoundError.errno, UNKNOWN_MEMBER, Errors.InvalidRequestError.errno])
def test_install_other_errors_abandon_the_round(code):
    m, now = computing_member(RecordingAssignor())
    (prepare,) = m.poll(now)
    m.on_response(prepare, prepare_response(), now)
    (install,) = m.poll(now)
    m.on_response(install, install_response(code), now + 1)
    (abandoned,) = m.take_events()
    assert abandoned == AssignmentAbandoned("install", code, abandoned.message)
    assert not m.computing_assignment
    request = only_heartbeat(m, INTERVAL)  # only heartbeats from now on
    m.on_response(request, hb_response(epoch=7), INTERVAL)
    assert m.poll(INTERVAL) == []


def test_a_failed_install_is_abandoned_not_resent():
    m, now = computing_member(RecordingAssignor())
    (prepare,) = m.poll(now)
    m.on_response(prepare, prepare_response(), now)
    (install,) = m.poll(now)
    m.on_request_failed(install, now + 1)
    assert not m.computing_assignment
    assert [type(e) for e in m.take_events()] == [AssignmentAbandoned]


def test_an_assignor_error_is_installed_as_an_assignment_error():
    assignor = RecordingAssignor()
    assignor.raises = True
    m, now = computing_member(assignor)
    (prepare,) = m.poll(now)
    m.on_response(prepare, prepare_response(), now)
    (install,) = m.poll(now)
    assert install.error == ASSIGNOR_FAILED and install.members == []


def test_an_unknown_selected_assignor_abandons_the_round():
    m, now = computing_member(RecordingAssignor())
    (prepare,) = m.poll(now)
    m.on_response(prepare, prepare_response(assignor_name="other"), now)
    (abandoned,) = m.take_events()
    assert abandoned.api == "assign" and "'other'" in abandoned.message
    assert m.poll(now) == []


def test_fencing_abandons_the_round_and_ignores_its_late_answers():
    assignor = RecordingAssignor()
    m, now = computing_member(assignor)
    (prepare,) = m.poll(now)
    heartbeat = only_heartbeat(m, INTERVAL)
    m.on_response(heartbeat, error_response(FENCED), INTERVAL)
    assert not m.computing_assignment
    m.on_response(prepare, prepare_response(), INTERVAL + 1)
    assert assignor.specs == []
    assert all(isinstance(r, ConsumerGroupHeartbeatRequest) for r in m.poll(INTERVAL + 1))


def test_on_assignment_is_called_once_per_member_epoch_with_the_target():
    assignor = RecordingAssignor()
    m = member(client_assignors=[assignor])
    join(m, 0, epoch=3, assigned=parts(FOO, 0), pending=parts(FOO, 1), metadata_version=3, metadata_bytes=b"tasks-e3", assignment_error=0)
    assert assignor.on_assignment_calls == [
        (0, MemberAssignment(partitions={FOO: frozenset({0, 1})}, metadata_version=3, metadata=b"tasks-e3"), 3),
    ]
    # Same epoch, foo-1 released: the listener hears about it, the assignor does not.
    request = only_heartbeat(m, INTERVAL)
    m.on_response(request, hb_response(epoch=3, assigned=parts(FOO, 0, 1), metadata_version=3, metadata_bytes=b"tasks-e3"), INTERVAL)
    assert len(assignor.on_assignment_calls) == 1
    assert m.take_events()[-1] == PartitionsAssigned(parts(FOO, 1), 3)
    # No assignment in the response: nothing.
    request = only_heartbeat(m, 2 * INTERVAL)
    m.on_response(request, hb_response(epoch=4), 2 * INTERVAL)
    assert len(assignor.on_assignment_calls) == 1
    # Next epoch with its assignment: called again, with the error the assignor reported.
    request = only_heartbeat(m, 3 * INTERVAL)
    m.on_response(request, hb_response(epoch=4, assigned=parts(FOO, 0, 1), assignment_error=2, metadata_version=3, metadata_bytes=b"tasks-e4"), 3 * INTERVAL)
    assert len(assignor.on_assignment_calls) == 2
    error, assignment, epoch = assignor.on_assignment_calls[1]
    assert (error, epoch, assignment.metadata) == (2, 4, b"tasks-e4")


def test_on_assignment_is_called_again_after_a_rejoin_even_at_an_equal_epoch():
    assignor = RecordingAssignor()
    m = member(client_assignors=[assignor])
    join(m, 0, epoch=3, assigned=parts(FOO, 0))
    request = only_heartbeat(m, INTERVAL)
    m.on_response(request, error_response(FENCED), INTERVAL)
    rejoin = only_heartbeat(m, INTERVAL)
    m.on_response(rejoin, hb_response(epoch=3, assigned=parts(FOO, 0)), INTERVAL)
    assert [call[2] for call in assignor.on_assignment_calls] == [3, 3]


# ---------------------------------------------------------------------------- listener


def test_notify_listener_maps_partition_events_to_callbacks():
    calls = []

    class Listener(NoOpRebalanceListener):
        def on_partitions_revoked(self, partitions):
            calls.append(("revoked", partitions))

        def on_partitions_assigned(self, partitions):
            calls.append(("assigned", partitions))

        def on_partitions_lost(self, partitions):
            calls.append(("lost", partitions))

    listener = Listener()
    assert notify_listener(listener, PartitionsAssigned(parts(FOO, 1), 3))
    assert notify_listener(listener, RevokePartitions(parts(FOO, 1), 1))
    assert notify_listener(listener, PartitionsLost(parts(BAR, 0), FENCED))
    assert not notify_listener(listener, LeftGroup(-1))
    assert calls == [("assigned", parts(FOO, 1)), ("revoked", parts(FOO, 1)), ("lost", parts(BAR, 0))]


def test_newly_assigned_partitions_are_acknowledged_in_the_very_next_heartbeat():
    # As Kafka's consumer once it has reconciled: the coordinator learns at once that the
    # member reached its target, instead of an interval later.
    m = member()
    join(m, 0, epoch=1)
    assert m.poll(1) == []  # nothing to acknowledge yet
    request = only_heartbeat(m, INTERVAL)
    m.on_response(request, hb_response(epoch=2, assigned=parts(FOO, 0, 1)), INTERVAL + 1)
    assert [type(event) for event in m.take_events()] == [PartitionsAssigned]
    ack = only_heartbeat(m, INTERVAL + 1)
    assert owned_in(ack) == parts(FOO, 0, 1) and ack.member_epoch == 2
    m.on_response(ack, hb_response(epoch=2), INTERVAL + 2)
    assert m.poll(INTERVAL + 2) == []  # then the interval again
