"""Smoke test: real GroupMembers against the real coordinator shard over a lossy, reordering,
seeded in-memory network. Not the simulator (pystreams/sim); just enough to show the two state
machines agree: no partition is ever owned by two members in their own views, and once the
network heals the group converges with every partition owned exactly once."""

from __future__ import annotations

import random
import uuid

import pytest
from pystreams.assignors.api import (
    AssignorMetadata,
    GroupAssignment,
    MemberAssignment,
    TopicMetadata,
)

from pystreams.client.member import (
    ConsumerGroupMember,
    MemberConfig,
    MemberFailed,
    MemberState,
    RevokePartitions,
)
from pystreams.coordinator.config import CoordinatorConfig
from pystreams.coordinator.shard import GroupCoordinatorShard

FOO = uuid.UUID(int=1)
BAR = uuid.UUID(int=2)
PARTITION_COUNT = 6 + 3


class RoundRobinAssignor:
    """A client-side assignor: partitions dealt to members in member id order."""

    name = "round-robin"
    minimum_version = 0
    maximum_version = 1

    def metadata(self) -> AssignorMetadata:
        return AssignorMetadata(version=1)

    def assign(self, spec):
        partitions = sorted((t, p) for t, md in spec.topics.items() for p in range(md.num_partitions))
        member_ids = sorted(spec.members)
        dealt: dict[str, dict[uuid.UUID, set[int]]] = {member_id: {} for member_id in member_ids}
        for i, (topic_id, partition) in enumerate(partitions):
            dealt[member_ids[i % len(member_ids)]].setdefault(topic_id, set()).add(partition)
        return GroupAssignment({member_id: MemberAssignment({t: frozenset(ps) for t, ps in by_topic.items()}) for member_id, by_topic in dealt.items()})

    def on_assignment(self, error, assignment, group_epoch) -> None:
        pass


def run(seed: int, client_side: bool, steps: int = 2_500, drop: float = 0.05) -> list[ConsumerGroupMember]:
    rnd = random.Random(seed)
    config = CoordinatorConfig(
        session_timeout_ms=3_000,
        min_session_timeout_ms=100,
        max_session_timeout_ms=10_000,
        heartbeat_interval_ms=200,
        min_heartbeat_interval_ms=10,
        max_heartbeat_interval_ms=1_000,
    )
    member_ids = (f"m{i}" for i in range(1_000_000))
    shard = GroupCoordinatorShard(config, new_member_id=lambda: next(member_ids))
    now = 0
    shard.update_topics({"foo": TopicMetadata(FOO, "foo", 6), "bar": TopicMetadata(BAR, "bar", 3)}, now)

    def new_member() -> ConsumerGroupMember:
        assignors = {"client_assignors": [RoundRobinAssignor()]} if client_side else {"server_assignor": "uniform"}
        member = ConsumerGroupMember(MemberConfig(group_id="g", session_timeout_ms=3_000, rebalance_timeout_ms=2_000, **assignors))
        member.subscribe(topics=["foo", "bar"])
        return member

    members = [new_member() for _ in range(3)]
    in_flight: list[tuple[int, str, ConsumerGroupMember, object, object]] = []
    revocations: list[tuple[int, ConsumerGroupMember, int]] = []
    for step in range(steps):
        now += rnd.randint(1, 30)
        shard.expire(now)
        for member in members:
            for request in member.poll(now):
                in_flight.append((now + rnd.randint(1, 40), "request", member, request, None))
        due = [item for item in in_flight if item[0] <= now]
        in_flight = [item for item in in_flight if item[0] > now]
        rnd.shuffle(due)  # reordering
        for _, kind, member, request, response in due:
            if rnd.random() < drop:
                member.on_request_failed(request, now)
            elif kind == "request":
                answer = shard.handle(request, now).response
                in_flight.append((now + rnd.randint(1, 40), "response", member, request, answer))
            else:
                member.on_response(request, response, now)
        for member in members:
            for event in member.take_events():
                assert not isinstance(event, MemberFailed), event
                if isinstance(event, RevokePartitions):  # the worker commits for a while
                    revocations.append((now + rnd.randint(0, 300), member, event.revocation_id))
        for _due, member, revocation_id in [r for r in revocations if r[0] <= now]:
            member.revocation_done(now, revocation_id)
        revocations = [r for r in revocations if r[0] > now]

        owners: dict[object, str] = {}
        for member in members:
            for partition in member.owned_partitions:
                assert partition not in owners, f"seed {seed} step {step}: {partition} owned by {owners[partition]} and {member.member_id}"
                owners[partition] = member.member_id

        if step == steps // 3:
            members.append(new_member())
        if step == steps // 2:
            members[0].leave(now)
        if step > steps * 3 // 4:
            drop = 0.0
    return [member for member in members if member.state is not MemberState.UNSUBSCRIBED]


@pytest.mark.parametrize("client_side", [False, True], ids=["server-assignor", "client-assignor"])
@pytest.mark.parametrize("seed", range(3))
def test_members_and_coordinator_never_double_own_and_converge(seed, client_side):
    live = run(seed, client_side)
    assert len(live) == 3
    assert all(member.state is MemberState.STABLE for member in live)
    assert sum(len(member.owned_partitions) for member in live) == PARTITION_COUNT
    assert len({member.member_epoch for member in live}) == 1
