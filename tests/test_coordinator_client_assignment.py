"""Client-side assignment: selection, ShouldComputeAssignment, Prepare/Install, validation."""

import kafka.errors as Errors
from coordinator_support import (
    GROUP,
    HB,
    TOPIC_IDS,
    Harness,
    assert_records,
    current,
    group_epoch,
    member_metadata,
    partition_metadata,
    response_parts,
    target_epoch,
    target_member,
)

from pystreams.coordinator import records as r
from pystreams.coordinator.consumer_group import GroupState
from pystreams.protocol import messages as m
from pystreams.protocol.errors import InvalidAssignmentError

Prepare, Install = m.ConsumerGroupPrepareAssignmentRequest, m.ConsumerGroupInstallAssignmentRequest


def assignor(name="streams", lo=1, hi=2, version=None, reason=0, metadata=b"meta"):
    return HB.Assignor(
        name=name, minimum_version=lo, maximum_version=hi, reason=reason, metadata_version=hi if version is None else version, metadata_bytes=metadata
    )


def install(h, member_id, epoch, group_epoch, plan: dict[str, str], error=0, metadata=b""):
    from coordinator_support import parts

    members = [
        Install.Member(
            member_id=mid, partitions=parts(spec).to_wire(Install.Member.TopicPartitions), metadata_version=2, metadata_bytes=metadata or mid.encode()
        )
        for mid, spec in plan.items()
    ]
    return h.send(Install(group_id=GROUP, member_id=member_id, member_epoch=epoch, group_epoch=group_epoch, error=error, members=members))


def test_member_selection_prefers_the_member_whose_range_covers_everyone():
    h = Harness()
    h.topics(foo=2)
    for mid, (lo, hi) in {"A": (1, 5), "B": (3, 4), "C": (2, 4)}.items():
        h.join(mid, client_assignors=[assignor(lo=lo, hi=hi)])
    assert h.shard.consumer.choose_computing_member(h.group, "streams", set()) == "A"
    assert h.shard.computations[GROUP].member_id in {"A", "B", "C"}


def compute(h, member_id, epoch, plan: dict[str, str]) -> int:
    """Prepare, then install ``plan`` for the prepared epoch; the install's error code."""
    prepared = h.send(Prepare(group_id=GROUP, member_id=member_id, member_epoch=epoch))
    assert prepared.error_code == 0, prepared
    return install(h, member_id, epoch, prepared.group_epoch, plan).error_code


def test_a_joiner_that_may_run_the_assignor_computes_its_own_join_at_once():
    """The member whose heartbeat moved the group on is told to compute in that very response,
    ahead of the stable members (who would hear of it only at their next heartbeat). It changes
    who computes, never what is written: the computation is no record."""
    h = Harness()
    h.topics(foo=4)
    assert h.join("A", client_assignors=[assignor()]).should_compute_assignment
    assert compute(h, "A", 0, {"A": "foo-0,foo-1,foo-2,foo-3"}) == 0
    assert h.heartbeat("A", 0, "").member_epoch == 1
    assert h.heartbeat("A", 1, "foo-0,foo-1,foo-2,foo-3").member_epoch == 1  # stable
    joined = h.join("B", client_assignors=[assignor()])
    assert joined.should_compute_assignment, "the joiner computes, although A sorts first"
    assert h.shard.computations[GROUP].member_id == "B"
    streams = [r.AssignorValue(name="streams", minimum_version=1, maximum_version=2, reason=0, version=2, metadata=b"meta")]
    # A join's records, as when another member computes: B reaches the current target (empty).
    assert_records(h.last_records, [member_metadata("B", 1, assignors=streams), group_epoch(2), current("B", 1, 0, "")])
    assert not h.heartbeat("A", 1, "foo-0,foo-1,foo-2,foo-3").should_compute_assignment
    # A joiner that cannot read every version in use does not compute: A still does.
    wide = h.join("C", client_assignors=[assignor(lo=2, hi=2)])
    assert h.shard.computations[GROUP].member_id == "B"  # one computation in flight at a time
    assert not wide.should_compute_assignment


def test_a_joiner_whose_version_range_is_too_narrow_leaves_the_computation_to_one_that_covers_all():
    h = Harness()
    h.topics(foo=2)
    assert h.join("A", client_assignors=[assignor(lo=1, hi=3)]).should_compute_assignment
    assert compute(h, "A", 0, {"A": "foo-0,foo-1"}) == 0
    assert h.heartbeat("A", 0, "").member_epoch == 1
    narrow = h.join("B", client_assignors=[assignor(lo=2, hi=2)])
    assert not narrow.should_compute_assignment
    assert h.shard.computations[GROUP].member_id == "A"
    narrow_value = [r.AssignorValue(name="streams", minimum_version=2, maximum_version=2, reason=0, version=2, metadata=b"meta")]
    assert_records(h.last_records, [member_metadata("B", 1, assignors=narrow_value), group_epoch(2), current("B", 1, 0, "")])


def test_the_full_prepare_install_loop():
    h = Harness()
    h.topics(foo=2)
    response = h.join("A", client_assignors=[assignor()])
    assert response.should_compute_assignment
    assert h.group.state is GroupState.ASSIGNING
    # Only the chosen member may prepare.
    h.join("B", client_assignors=[assignor(lo=1, hi=3, version=2)])
    chosen = h.shard.computations[GROUP].member_id
    other = "B" if chosen == "A" else "A"
    not_chosen = h.send(Prepare(group_id=GROUP, member_id=other, member_epoch=0))
    assert not_chosen.error_code == Errors.UnknownMemberIdError.errno

    prepared = h.send(Prepare(group_id=GROUP, member_id=chosen, member_epoch=0))
    assert prepared.error_code == 0
    assert prepared.assignor_name == "streams"
    assert prepared.group_epoch == h.group.group_epoch == 2
    assert {mb.member_id for mb in prepared.members} == {"A", "B"}
    assert all(mb.assignor.metadata_bytes == b"meta" for mb in prepared.members)
    assert [(t.topic_name, t.num_partitions) for t in prepared.topics] == [("foo", 2)]
    assert all(mb.subscribed_topic_ids == [TOPIC_IDS["foo"]] for mb in prepared.members)

    assert install(h, chosen, 0, 2, {"A": "foo-0", "B": "foo-1"}).error_code == 0
    assert h.group.assignment_epoch == 2
    assert GROUP not in h.shard.computations
    response = h.heartbeat("A", 0)
    assert (response.member_epoch, response_parts(response), response.assignment.metadata_bytes) == (2, "foo-0", b"A")
    assert not response.should_compute_assignment
    h.heartbeat("B", 0)
    assert h.group.state is GroupState.STABLE
    h.assert_replay_equals_live()


def _prepared(h):
    h.topics(foo=3)
    h.join("A", client_assignors=[assignor()])
    h.send(Prepare(group_id=GROUP, member_id="A", member_epoch=0))
    return h


def test_invalid_assignments_are_refused():
    h = _prepared(Harness())
    cases = {
        "not all partitions": {"A": "foo-0, foo-1"},
        "unknown member": {"A": "foo-0, foo-1", "Z": "foo-2"},
        "no such partition": {"A": "foo-0, foo-1, foo-2, foo-7"},
    }
    for why, plan in cases.items():
        response = install(h, "A", 0, 1, plan)
        assert response.error_code == InvalidAssignmentError.errno, why
        assert response.error_message, why
    twice = Install.Member(
        member_id="A", metadata_version=0, metadata_bytes=b"", partitions=[Install.Member.TopicPartitions(topic_id=TOPIC_IDS["foo"], partitions=[0, 1, 2, 2])]
    )
    response = h.send(Install(group_id=GROUP, member_id="A", member_epoch=0, group_epoch=1, error=0, members=[twice]))
    assert response.error_code == InvalidAssignmentError.errno and "more than once" in response.error_message
    assert h.group.assignment_epoch == 0
    response = install(h, "A", 0, 5, {"A": "foo-0, foo-1, foo-2"})
    assert response.error_code == InvalidAssignmentError.errno and "epoch" in response.error_message


def test_stale_epoch_and_unknown_group_on_prepare():
    h = _prepared(Harness())
    assert h.send(Prepare(group_id="nope", member_id="A", member_epoch=0)).error_code == Errors.GroupIdNotFoundError.errno
    assert h.send(Prepare(group_id=GROUP, member_id="A", member_epoch=4)).error_code == Errors.StaleMemberEpochError.errno
    assert h.send(Prepare(group_id=GROUP, member_id="Q", member_epoch=0)).error_code == Errors.UnknownMemberIdError.errno
    assert h.send(Prepare(group_id=GROUP, member_id="A", member_epoch=-1)).error_code == Errors.InvalidRequestError.errno
    assert h.send(Prepare(group_id="", member_id="A", member_epoch=0)).error_code == Errors.InvalidRequestError.errno


def test_an_assignment_computed_for_an_older_epoch_is_installed_then_recomputed():
    h = _prepared(Harness())
    h.join("B", client_assignors=[assignor()])  # the group moves on to epoch 2 meanwhile
    assert h.group.group_epoch == 2
    assert install(h, "A", 0, 1, {"A": "foo-0, foo-1, foo-2"}).error_code == 0
    assert h.group.assignment_epoch == 1
    assert h.target() == {"A": "foo-0, foo-1, foo-2"}  # B joined after: nothing for it yet
    assert GROUP in h.shard.computations  # a new computation starts right away
    assert h.group.state is GroupState.ASSIGNING


def test_an_assignor_error_keeps_the_current_target():
    h = _prepared(Harness())
    assert install(h, "A", 0, 1, {"A": "foo-0, foo-1, foo-2"}).error_code == 0
    h.heartbeat("A", 0)
    h.join("B", client_assignors=[assignor(reason=4)])
    chosen = h.shard.computations[GROUP].member_id
    epoch = h.group.members[chosen].member_epoch
    h.send(Prepare(group_id=GROUP, member_id=chosen, member_epoch=epoch))
    response = install(h, chosen, epoch, 2, {}, error=3)  # e.g. InconsistentTopology
    assert response.error_code == 0
    assert h.group.assignment_epoch == 2 and h.group.assignment_error == 3
    assert h.target() == {"A": "foo-0, foo-1, foo-2"}
    response = h.heartbeat("A", 1)
    assert response.assignment.error == 3 and response_parts(response) == "foo-0, foo-1, foo-2"


def test_another_member_computes_after_the_rebalance_timeout():
    h = Harness()
    h.topics(foo=2)
    h.join("A", client_assignors=[assignor()], rebalance_timeout_ms=500)
    h.join("B", client_assignors=[assignor()], rebalance_timeout_ms=500)
    first = h.shard.computations[GROUP].member_id
    assert h.heartbeat(first, 0).should_compute_assignment  # notified: its clock starts
    for _ in range(5):
        h.advance(100)
        for mid in "AB":
            h.heartbeat(mid, 0)
    second = h.shard.computations[GROUP].member_id
    assert second != first
    assert h.heartbeat(second, 0).should_compute_assignment
    assert not h.heartbeat(first, 0).should_compute_assignment


def test_a_nonzero_reason_triggers_a_new_assignment():
    h = _prepared(Harness())
    install(h, "A", 0, 1, {"A": "foo-0, foo-1, foo-2"})
    h.heartbeat("A", 0)
    epoch = h.group.group_epoch
    h.heartbeat("A", 1, client_assignors=[assignor(reason=2, metadata=b"lags")])  # WarmUpReady
    assert h.group.group_epoch == epoch + 1
    assert h.shard.computations[GROUP].member_id == "A"


def test_server_assignor_when_not_every_member_has_the_client_assignor():
    h = Harness()
    h.topics(foo=2)
    h.join("A", client_assignors=[assignor()])
    h.scripted.next = {"A": "foo-0", "B": "foo-1"}
    h.join("B")  # no client assignors: the group falls back to the server-side default
    assert GROUP not in h.shard.computations
    assert h.target() == {"A": "foo-0", "B": "foo-1"}
    assert h.shard.consumer.select_assignor(h.group) == (False, "scripted")


def test_a_reason_falling_back_to_zero_does_not_rebalance_again():
    """The member clears its reason once answered; only metadata changes or a new non-zero
    reason ask for another assignment, so one WarmUpReady costs one rebalance."""
    h = _prepared(Harness())
    install(h, "A", 0, 1, {"A": "foo-0, foo-1, foo-2"})
    h.heartbeat("A", 0)
    h.heartbeat("A", 1, client_assignors=[assignor(reason=2, metadata=b"lags")])
    asked = h.group.group_epoch
    h.heartbeat("A", 1, client_assignors=[assignor(reason=0, metadata=b"lags")])
    assert h.group.group_epoch == asked
    h.heartbeat("A", 1, client_assignors=[assignor(reason=0, metadata=b"new lags")])
    assert h.group.group_epoch == asked + 1
    h.heartbeat("A", 1, client_assignors=[assignor(reason=3, metadata=b"new lags")])  # WarmUpFailed
    assert h.group.group_epoch == asked + 2


def test_members_heartbeat_at_the_short_interval_while_the_target_is_computed_client_side():
    from pystreams.coordinator.config import CoordinatorConfig

    h = Harness(CoordinatorConfig(heartbeat_interval_ms=5_000, rebalance_heartbeat_interval_ms=100))
    h.topics(foo=2)
    streams = [r.AssignorValue(name="streams", minimum_version=1, maximum_version=2, reason=0, version=2, metadata=b"meta")]
    first = h.join("A", client_assignors=[assignor()])
    assert first.should_compute_assignment and first.heartbeat_interval_ms == 100  # it must compute
    # No target yet, so no current assignment either: the short interval itself writes nothing.
    assert_records(h.last_records, [group_epoch(0), member_metadata("A", 0, assignors=streams), partition_metadata(foo=2), group_epoch(1)])
    second = h.join("B", client_assignors=[assignor()])
    assert second.heartbeat_interval_ms == 100  # the group's target is being computed
    assert_records(h.last_records, [member_metadata("B", 1, assignors=streams), group_epoch(2)])
    chosen = h.shard.computations[GROUP].member_id
    assert h.send(Prepare(group_id=GROUP, member_id=chosen, member_epoch=0)).error_code == 0
    assert_records(h.last_records, [])
    assert install(h, chosen, 0, h.group.group_epoch, {"A": "foo-0", "B": "foo-1"}).error_code == 0
    installed = [target_member(mid, spec, metadata_version=2, metadata=mid.encode()) for mid, spec in {"A": "foo-0", "B": "foo-1"}.items()]
    assert_records(h.last_records, [*installed, target_epoch(2)])
    # Installed: each member fetches its assignment and, having reached it, is told the group's.
    assert h.heartbeat("A", 0).heartbeat_interval_ms == 5_000
    assert_records(h.last_records, [current("A", 2, 0, "foo-0", metadata_version=2, metadata=b"A")])
    assert h.heartbeat("B", 0).heartbeat_interval_ms == 5_000
    assert_records(h.last_records, [current("B", 2, 0, "foo-1", metadata_version=2, metadata=b"B")])
    assert h.group.state is GroupState.STABLE
    assert h.heartbeat("B", 2).heartbeat_interval_ms == 5_000  # stable: the group's, nothing written
    assert_records(h.last_records, [])
