"""``pystreams demo``: a KIP-848 rebalance replayed through the real coordinator state machine.

Members join, partitions move by incremental revoke-then-assign, a member fails and its session
expires, a partition is added; after every step the group, its target assignment and each
member's assignment are printed in the notation of the KIP's case studies. At the end a fresh
shard replays the emitted records and must arrive at the same state.
"""

from __future__ import annotations

import argparse
import uuid

TOPIC = "foo"
TOPIC_ID = uuid.UUID("00000000-0000-0000-0000-0000000000f0")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--assignor", default="uniform", choices=("uniform", "range"), help="server-side assignor (default: uniform)")
    parser.add_argument("--partitions", type=int, default=6, help="partitions of the topic at the start (default: 6)")


def run(args: argparse.Namespace) -> int:
    from pystreams.assignors.api import TopicMetadata
    from pystreams.coordinator.config import CoordinatorConfig
    from pystreams.coordinator.shard import GroupCoordinatorShard
    from pystreams.partitions import PartitionSet
    from pystreams.protocol.messages import ConsumerGroupHeartbeatRequest as HB
    from pystreams.protocol.messages import ConsumerGroupHeartbeatResponse

    config = CoordinatorConfig(
        session_timeout_ms=3_000,
        min_session_timeout_ms=1_000,
        heartbeat_interval_ms=1_000,
        min_heartbeat_interval_ms=100,
        assignors=(args.assignor,),
    )
    names = iter(["A", "B", "C", "D"])
    shard = GroupCoordinatorShard(config, new_member_id=lambda: next(names))
    log: list = []
    clock = {"now": 0}
    epochs: dict[str, int] = {}

    def topics(n: int) -> None:
        log.extend(shard.update_topics({TOPIC: TopicMetadata(TOPIC_ID, TOPIC, n)}, clock["now"]).records)

    def send(member: str, epoch: int, report=None, **fields):
        owned = None if report is None else PartitionSet.of(report).to_wire(HB.TopicPartitions)
        result = shard.handle(HB(group_id="demo", member_id=member, member_epoch=epoch, topic_partitions=owned, **fields), clock["now"])
        log.extend(result.records)
        response = result.response
        assert isinstance(response, ConsumerGroupHeartbeatResponse), "a heartbeat is answered by a heartbeat response"
        if response.error_code:
            raise SystemExit(f"unexpected error {response.error_code}: {response.error_message}")
        epochs[response.member_id] = response.member_epoch
        return response

    def join() -> str:
        return send("", 0, {}, rebalance_timeout_ms=10_000, subscribed_topic_names=[TOPIC]).member_id

    def heartbeat(member: str) -> None:
        """A well-behaved member: it reports what it still owns after any revocation."""
        held = shard.groups["demo"].members[member]
        send(member, epochs[member], held.assigned if held.revoking else None)

    def show(step: str) -> None:
        group = shard.groups["demo"]
        names_by_id = {TOPIC_ID: TOPIC}
        print(f"\n== {step}")
        print(f"   Group (epoch={group.group_epoch}) state={group.state.value}: {', '.join(sorted(group.members)) or 'no members'}")
        print(f"   Target Assignment (epoch={group.assignment_epoch})")
        for member_id, target in sorted(group.targets.items()):
            print(f"     {member_id} - partitions=[{target.partitions.describe(names_by_id)}]")
        print("   Member Assignment")
        for member_id, m in sorted(group.members.items()):
            at_target = m.member_epoch == group.assignment_epoch and not m.revoking
            pending = group.target_of(member_id) - m.assigned if at_target else PartitionSet()
            revoking = f", revoking=[{m.revoking.describe(names_by_id)}]" if m.revoking else ""
            print(
                f"     {member_id} - epoch={m.member_epoch}, partitions=[{m.assigned.describe(names_by_id)}], "
                f"pending-partitions=[{pending.describe(names_by_id)}]{revoking}"
            )

    topics(args.partitions)
    a = join()
    show(f"{a} joins: the group epoch is bumped, the target computed, {a} gets everything")
    b = join()
    show(f"{b} joins: {b} moves to the new epoch, its partitions are pending until {a} revokes them")
    heartbeat(a)
    show(f"{a} heartbeats: it is told to revoke what moves to {b}")
    heartbeat(a)
    show(f"{a} acknowledges the revocation: it moves to the new epoch and releases the partitions")
    heartbeat(b)
    show(f"{b} heartbeats: it gets the released partitions; the group is stable")
    c = join()
    for member in (a, b):
        heartbeat(member)
    show(f"{c} joins: {a} and {b} are asked to revoke, {c} waits")
    for member in (a, b, c):
        heartbeat(member)
    show("everyone heartbeats once more: revocations acknowledged, partitions handed out")
    for _ in range(4):  # A goes silent; B and C keep heartbeating until A's session expires
        clock["now"] += 1_000
        log.extend(shard.expire(clock["now"]).records)
        for member in (b, c):
            if member in shard.groups["demo"].members:
                heartbeat(member)
    show(f"{a} stops heartbeating: after the session timeout it is removed and its partitions move")
    for member in (b, c):
        heartbeat(member)
    topics(args.partitions + 2)
    for member in (b, c):
        heartbeat(member)
        heartbeat(member)
    show("two partitions are added: the coordinator notices, bumps the epoch and assigns them")

    replayed = GroupCoordinatorShard(config)
    for record in log:
        replayed.replay(record)
    same = replayed.snapshot() == shard.snapshot()
    print(f"\n{len(log)} records written; a fresh shard replaying them has the same state: {same}")
    return 0 if same and shard.groups["demo"].state.value == "Stable" else 1
