"""Property: for random request/timer/metadata sequences, replaying the emitted records gives
the live state; epochs never go backwards; no partition is held by two members."""

from coordinator_support import GROUP, HB, Harness, RoundRobinAssignor
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pystreams.coordinator.consumer_group import LEAVE_STATIC_EPOCH
from pystreams.partitions import PartitionSet
from pystreams.protocol import messages as m

MEMBERS = ["m0", "m1", "m2", "m3"]
TOPIC_SETS = [("foo",), ("foo", "bar"), ("bar",)]

events = st.one_of(
    st.tuples(st.just("join"), st.sampled_from(MEMBERS), st.sampled_from(TOPIC_SETS), st.booleans()),
    st.tuples(st.just("heartbeat"), st.sampled_from(MEMBERS), st.booleans()),  # ack revocations?
    st.tuples(st.just("bad-epoch"), st.sampled_from(MEMBERS), st.integers(-1, 50)),
    st.tuples(st.just("leave"), st.sampled_from(MEMBERS), st.sampled_from([-1, -2])),
    st.tuples(st.just("time"), st.integers(1, 600)),
    st.tuples(st.just("topics"), st.integers(1, 4), st.integers(0, 3)),
    st.tuples(st.just("commit"), st.sampled_from(MEMBERS), st.integers(0, 100)),
)


def check_invariants(h: Harness, seen_epochs: dict) -> None:
    for group in h.shard.groups.values():
        holders = {}
        for member in group.members.values():
            for pair in member.assigned | member.revoking:
                assert pair not in holders, f"{pair} held by {holders[pair]} and {member.member_id}"
                holders[pair] = member.member_id
            if member.member_epoch != LEAVE_STATIC_EPOCH:
                assert member.member_epoch <= group.assignment_epoch <= group.group_epoch
            key = (group.group_id, member.member_id)
            if member.member_epoch >= 0:
                assert member.member_epoch >= seen_epochs.get(key, 0), "member epoch went backwards"
                seen_epochs[key] = member.member_epoch
        previous = seen_epochs.get(group.group_id, (0, 0))
        assert group.group_epoch >= previous[0] and group.assignment_epoch >= previous[1]
        seen_epochs[group.group_id] = (group.group_epoch, group.assignment_epoch)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(events, min_size=1, max_size=60))
def test_replay_equals_live_and_invariants_hold(sequence):
    h = Harness(assignors={"scripted": RoundRobinAssignor()})
    h.topics(foo=3, bar=2)
    seen: dict = {}
    for event in sequence:
        kind, *args = event
        group = h.shard.groups.get(GROUP)
        member = group.members.get(args[0]) if group and kind not in ("time", "topics") else None
        if kind == "join":
            mid, topics, static = args
            h.join(mid, subscribe=topics, instance_id=f"pod-{mid}" if static else None)
        elif kind == "heartbeat" and member is not None and member.member_epoch != LEAVE_STATIC_EPOCH:
            ack = args[1]
            held = member.assigned | member.revoking
            report = member.assigned if ack else held
            h.send(
                HB(
                    group_id=GROUP,
                    member_id=member.member_id,
                    member_epoch=member.member_epoch,
                    topic_partitions=PartitionSet.of(report).to_wire(HB.TopicPartitions),
                )
            )
        elif kind == "bad-epoch":
            h.heartbeat(args[0], args[1] if args[1] != 0 else 1, "")
        elif kind == "leave" and member is not None:
            h.heartbeat(member.member_id, args[1], instance_id=member.instance_id)
        elif kind == "time":
            h.advance(args[0])
        elif kind == "topics":
            extra = {"baz": args[1]} if args[1] else {}
            h.topics(foo=args[0], bar=2, **extra)
        elif kind == "commit" and member is not None:
            commit = m.OffsetCommitRequest(
                group_id=GROUP,
                generation_id_or_member_epoch=member.member_epoch,
                member_id=member.member_id,
                topics=[
                    m.OffsetCommitRequest.OffsetCommitRequestTopic(
                        name="foo",
                        partitions=[m.OffsetCommitRequest.OffsetCommitRequestTopic.OffsetCommitRequestPartition(partition_index=0, committed_offset=args[1])],
                    )
                ],
            )
            h.send(commit)
        check_invariants(h, seen)
    h.assert_replay_equals_live()
