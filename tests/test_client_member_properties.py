"""Property tests: random coordinator answers and caller timings vs the member's invariants."""

from __future__ import annotations

from uuid import UUID

import kafka.errors as Errors
from hypothesis import given, settings
from hypothesis import strategies as st

from pystreams.client.member import (
    ConsumerGroupMember,
    LeftGroup,
    MemberConfig,
    MemberState,
    PartitionsAssigned,
    PartitionsLost,
    RevokePartitions,
)
from pystreams.partitions import PartitionSet, TopicIdPartition
from pystreams.protocol.messages import (
    ConsumerGroupHeartbeatRequest,
    ConsumerGroupHeartbeatResponse,
)

FOO = UUID(int=1)
UNIVERSE = [TopicIdPartition(FOO, n) for n in range(6)]
FENCED = Errors.FencedMemberEpochError.errno


def _wire(partitions):
    return [ConsumerGroupHeartbeatResponse.Assignment.TopicPartitions(topic_id=FOO, partitions=sorted(p.partition for p in partitions))]


def _response(epoch: int, assigned, pending, error: int = 0) -> ConsumerGroupHeartbeatResponse:
    assignment = None
    if assigned is not None:
        assignment = ConsumerGroupHeartbeatResponse.Assignment(
            error=0,
            assigned_topic_partitions=_wire(assigned),
            pending_topic_partitions=_wire(pending),
            metadata_version=0,
            metadata_bytes=b"",
        )
    return ConsumerGroupHeartbeatResponse(
        throttle_time_ms=0,
        error_code=error,
        error_message=None,
        member_id="m-1",
        member_epoch=epoch,
        should_compute_assignment=False,
        heartbeat_interval_ms=100,
        assignment=assignment,
    )


class Model:
    """What the caller can reconstruct from events alone; must always agree with the member."""

    def __init__(self) -> None:
        self.owned = PartitionSet()
        self.revoking: dict[int, PartitionSet] = {}

    def apply(self, event) -> None:
        if isinstance(event, PartitionsAssigned):
            assert not (event.partitions & self.owned), "assigned a partition already owned"
            assert not any(event.partitions & r for r in self.revoking.values()), "assigned a partition still being revoked"
            self.owned = self.owned | event.partitions
        elif isinstance(event, RevokePartitions):
            assert event.partitions and event.partitions <= self.owned
            self.owned = self.owned - event.partitions
            self.revoking[event.revocation_id] = event.partitions
        elif isinstance(event, PartitionsLost):
            everything = self.owned.union(*self.revoking.values())
            assert event.partitions == everything
            self.owned = PartitionSet()
            self.revoking.clear()


operations = st.sampled_from(["tick", "answer", "answer", "answer", "fail", "fence", "done", "done", "leave"])


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_member_invariants_hold_under_random_answers(data):
    m = ConsumerGroupMember(MemberConfig(group_id="g", retry_backoff_ms=10))
    m.subscribe(topics=["foo"])
    model = Model()
    now = 0
    in_flight: ConsumerGroupHeartbeatRequest | None = None
    epoch = 0
    target: frozenset[TopicIdPartition] | None = None
    leaving = False

    for _ in range(data.draw(st.integers(5, 60))):
        op = data.draw(operations)
        now += data.draw(st.integers(0, 150))
        if op == "tick" or in_flight is None:
            for request in m.poll(now):
                assert isinstance(request, ConsumerGroupHeartbeatRequest)
                assert in_flight is None, "two heartbeats in flight"
                in_flight = request
                if request.member_epoch in (-1, -2):
                    continue
                reported = model.owned.union(*model.revoking.values())
                if request.member_epoch == 0:
                    assert request.rebalance_timeout_ms > 0
                    assert request.subscribed_topic_names == ["foo"]
                    assert request.topic_partitions == []
                if request.topic_partitions is not None:
                    # Owned partitions are reported until their revocation is done.
                    assert PartitionSet.from_wire(request.topic_partitions) == reported
        elif op == "answer":
            if in_flight.member_epoch in (-1, -2):
                m.on_response(in_flight, _response(-1, None, ()), now)
            else:
                epoch += data.draw(st.integers(0, 1))
                if data.draw(st.booleans()):
                    assigned = frozenset(data.draw(st.sets(st.sampled_from(UNIVERSE))))
                    pending = frozenset(data.draw(st.sets(st.sampled_from(UNIVERSE)))) - assigned
                    if not leaving:
                        target = assigned
                else:
                    assigned = pending = None
                m.on_response(in_flight, _response(max(epoch, 1), assigned, pending), now)
            in_flight = None
        elif op == "fail":
            m.on_request_failed(in_flight, now)
            in_flight = None
        elif op == "fence" and in_flight.member_epoch not in (-1, -2):
            m.on_response(in_flight, _response(0, None, (), error=FENCED), now)
            in_flight = None
            target = None
        elif op == "done" and model.revoking:
            revocation_id = data.draw(st.sampled_from(sorted(model.revoking)))
            m.revocation_done(now, revocation_id)
            del model.revoking[revocation_id]
        elif op == "leave" and not leaving:
            m.leave(now)
            leaving = True

        for event in m.take_events():
            model.apply(event)
            if isinstance(event, LeftGroup):
                assert m.state is MemberState.UNSUBSCRIBED
                return

        # The member's own view agrees with what its events told the caller.
        assert m.owned_partitions == model.owned
        assert m.revoking_partitions == frozenset().union(*model.revoking.values())
        assert not (m.owned_partitions & m.revoking_partitions)
        if target is not None and not leaving:
            # Never processes a partition outside the latest assignment...
            assert m.owned_partitions <= target
            # ...and, with nothing left to revoke, processes all of it.
            if not model.revoking:
                assert m.owned_partitions == target
        if leaving:
            assert not m.owned_partitions
