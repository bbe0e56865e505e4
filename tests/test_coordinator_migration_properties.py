"""Property: classic and KIP-848 members of one group, in any interleaving of joins, syncs,
heartbeats, leaves, crashes and time, never make a handler fail; replaying the records gives
the live state; no partition has two holders; and a group that converts keeps its epochs."""

from __future__ import annotations

import kafka.errors as Errors
from classic_support import Classic, decoded, form_group
from coordinator_support import GROUP, NAMES, Harness, RoundRobinAssignor
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pystreams.coordinator.classic_group import ClassicGroup
from pystreams.coordinator.consumer_group import ConsumerGroup
from pystreams.coordinator.context import DEFERRED
from pystreams.protocol.sentinels import LEAVE_EPOCH, LEAVE_STATIC_EPOCH

CLASSIC = ["c0", "c1", "c2"]
KIP848 = ["k0", "k1"]

classic_round = st.tuples(st.just("classic-join"), st.sampled_from(CLASSIC), st.booleans())  # eager (revoke all first)?
events = st.one_of(
    classic_round,
    classic_round,
    st.tuples(st.just("classic-sync"), st.sampled_from(CLASSIC)),
    st.tuples(st.just("classic-sync"), st.sampled_from(CLASSIC)),
    st.tuples(st.just("classic-heartbeat"), st.sampled_from(CLASSIC)),
    st.tuples(st.just("classic-leave"), st.sampled_from(CLASSIC)),
    st.tuples(st.just("classic-crash"), st.sampled_from(CLASSIC)),
    st.tuples(st.just("join"), st.sampled_from(KIP848), st.booleans()),  # static?
    st.tuples(st.just("heartbeat"), st.sampled_from(KIP848)),
    st.tuples(st.just("heartbeat"), st.sampled_from(KIP848)),
    st.tuples(st.just("leave"), st.sampled_from(KIP848), st.sampled_from([LEAVE_EPOCH, LEAVE_STATIC_EPOCH])),
    st.tuples(st.just("time"), st.integers(1, 4_000)),
    st.tuples(st.just("policy"), st.sampled_from(["bidirectional", "upgrade", "downgrade", "disabled"])),
)


def check(h: Harness) -> None:
    group = h.shard.groups.get(GROUP)
    if isinstance(group, ConsumerGroup):
        holders: dict = {}
        for member in group.members.values():
            for pair in member.assigned | member.revoking:
                assert pair not in holders, f"{pair} held by {holders[pair]} and {member.member_id}"
                holders[pair] = member.member_id
            if member.member_epoch != LEAVE_STATIC_EPOCH:
                assert member.member_epoch <= group.assignment_epoch <= group.group_epoch
    elif isinstance(group, ClassicGroup):
        assert group.leader_id is None or group.leader_id in group.members
        assert group.pending_sync <= set(group.members)
    h.assert_replay_equals_live()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(events, min_size=1, max_size=60))
def test_any_interleaving_of_both_protocols_keeps_the_coordinator_consistent(sequence) -> None:
    h = Harness(assignors={"range": RoundRobinAssignor()})
    h.topics(foo=4)
    classic = {name: Classic(h, instance_id=name if name == "c0" else None) for name in CLASSIC}
    form_group(h, [classic["c0"], classic["c1"]], {0: {"foo": [0, 1]}, 1: {"foo": [2, 3]}})  # a live classic group to migrate
    epochs = {name: 0 for name in KIP848}
    for kind, *args in sequence:
        group = h.shard.groups.get(GROUP)
        if kind == "classic-join":
            member, eager = classic[args[0]], args[1]
            if eager:
                member.owned = {}
            member.join_fully()
        elif kind == "classic-sync":
            member = classic[args[0]]
            leader = isinstance(group, ClassicGroup) and group.leader_id == member.member_id
            plan = {}
            if leader:  # the leader deals the partitions round-robin over the group's members
                members = sorted(group.members)
                plan = {mid: _assignment(i, len(members)) for i, mid in enumerate(members)}
            response = member.sync(plan)
            if response is not DEFERRED and response.error_code == 0:
                member.owned = decoded(response.assignment)
        elif kind == "classic-heartbeat":
            classic[args[0]].heartbeat()
        elif kind == "classic-leave":
            classic[args[0]].leave()
            classic[args[0]].member_id, classic[args[0]].owned = "", {}
        elif kind == "classic-crash":
            classic[args[0]].member_id, classic[args[0]].owned, classic[args[0]].pending = "", {}, None
        elif kind == "join":
            name, static = args
            response = h.join(name, server_assignor="range", instance_id=f"pod-{name}" if static else None)
            if response.error_code == 0:
                epochs[name] = response.member_epoch
        elif kind == "heartbeat":
            name = args[0]
            member = group.members.get(name) if isinstance(group, ConsumerGroup) else None
            if member is not None and member.member_epoch != LEAVE_STATIC_EPOCH:
                held = member.assigned.describe(NAMES)
                response = h.heartbeat(name, member.member_epoch, owned_spec=held)
                assert response.error_code in (0, Errors.FencedMemberEpochError.errno, Errors.UnknownMemberIdError.errno)
        elif kind == "leave":
            name, epoch = args
            h.heartbeat(name, epoch, instance_id=f"pod-{name}" if epoch == LEAVE_STATIC_EPOCH else None)
        elif kind == "time":
            h.advance(args[0])
        elif kind == "policy":
            h.shard.ctx.config = h.shard.config.__class__(**{**_fields(h.shard.config), "migration_policy": args[0]})
        # Deferred answers are collected by the members; nothing raised (a handler failure
        # would have raised HandlerFailed through h.send).
        for member in classic.values():
            member.answer()
        check(h)


def _assignment(index: int, count: int) -> bytes:
    from classic_support import assignment

    return assignment(foo=[p for p in range(4) if p % count == index])


def _fields(config) -> dict:
    import msgspec

    return msgspec.structs.asdict(config)
