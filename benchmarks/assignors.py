"""Server-side assignor benchmark, after Apache Kafka's ServerSideAssignorBenchmark.

Groups of {100, 1000, 10000} members with {5, 10} partitions per member spread over {10, 100}
topics, every member subscribed to every topic. For each assignor and group it measures:

* a full assignment (no member has a target yet): median milliseconds over a few runs;
* an incremental assignment after one member joins (everyone's target is the full assignment):
  milliseconds, partitions moved, and the ideal ``ceil(P / (N + 1))``;
* an incremental assignment after one member leaves: milliseconds, partitions moved, and the
  leaver's partition count (the ideal).

"Moved" counts previously assigned partitions whose owner changed.

It also measures steady-state heartbeats handled per second by one coordinator shard,
in-process (no network): a stable group whose members heartbeat with nothing changed — the
common case the shard must make cheap. Prints one JSON document.

    python benchmarks/assignors.py            # every case (a few minutes at most)
    python benchmarks/assignors.py --quick    # only the 100- and 1000-member groups
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import platform
import random
import statistics
import sys
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass

from pystreams.assignors.api import AssignmentSpec, GroupAssignment, MemberSpec, Partitions, TopicMetadata
from pystreams.assignors.server import SERVER_ASSIGNORS, server_assignor

MEMBER_COUNTS = (100, 1_000, 10_000)
QUICK_MEMBER_COUNTS = (100, 1_000)
PARTITIONS_PER_MEMBER = (5, 10)
TOPIC_COUNTS = (10, 100)
#: Repeat small cases for a stable median; the largest take tens of milliseconds, so 3 runs
#: keep the whole script well under a minute.
RUNS_BY_MEMBER_COUNT = {100: 7, 1_000: 5, 10_000: 3}


@dataclass(frozen=True)
class Case:
    assignor: str
    members: int
    partitions_per_member: int
    topics: int

    @property
    def partitions(self) -> int:
        return self.members * self.partitions_per_member


def benchmark_cases(member_counts: Iterable[int] = MEMBER_COUNTS, assignors: Iterable[str] = tuple(SERVER_ASSIGNORS)) -> list[Case]:
    return [
        Case(assignor, members, per_member, topic_count)
        for assignor in assignors
        for members in member_counts
        for per_member in PARTITIONS_PER_MEMBER
        for topic_count in TOPIC_COUNTS
    ]


def _member_ids(count: int, rng: random.Random) -> list[str]:
    # Random-looking ids, like the coordinator's UUIDs, so sorted order is not creation order.
    return [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(count)]


def _topics(case: Case) -> dict[uuid.UUID, TopicMetadata]:
    per_topic = case.partitions // case.topics
    ids = [uuid.UUID(int=index + 1) for index in range(case.topics)]
    return {topic_id: TopicMetadata(topic_id, f"topic-{index}", per_topic) for index, topic_id in enumerate(ids)}


def _spec(
    topics: Mapping[uuid.UUID, TopicMetadata],
    member_ids: Sequence[str],
    targets: Mapping[str, Partitions] | None = None,
) -> AssignmentSpec:
    subscription = frozenset(topics)
    targets = targets or {}
    return AssignmentSpec(
        members={member_id: MemberSpec(subscribed_topic_ids=subscription, target_partitions=targets.get(member_id, {})) for member_id in member_ids},
        topics=topics,
    )


def _timed(assign, spec: AssignmentSpec, runs: int) -> tuple[float, GroupAssignment]:
    timings = []
    for _ in range(runs):
        gc.collect()  # don't charge this run for the previous one's garbage; GC stays enabled
        started = time.perf_counter()
        result = assign(spec)
        timings.append((time.perf_counter() - started) * 1000)
    return round(statistics.median(timings), 3), result


def _partitions_of(result: GroupAssignment) -> dict[str, Partitions]:
    return {member_id: assignment.partitions for member_id, assignment in result.members.items()}


def partitions_moved(before: Mapping[str, Partitions], after: Mapping[str, Partitions]) -> int:
    """Previously assigned partitions now owned by someone else (or by no one)."""
    moved = 0
    for member_id, old in before.items():
        new = after.get(member_id, {})
        for topic_id, partitions in old.items():
            moved += len(partitions - new.get(topic_id, frozenset()))
    return moved


def run_case(case: Case) -> dict[str, object]:
    rng = random.Random(f"{case.members}/{case.partitions_per_member}/{case.topics}")
    assignor = server_assignor(case.assignor)
    topics = _topics(case)
    member_ids = _member_ids(case.members, rng)
    runs = RUNS_BY_MEMBER_COUNT.get(case.members, 1)

    full_ms, full = _timed(assignor.assign, _spec(topics, member_ids), runs)
    current = _partitions_of(full)

    joiner = _member_ids(1, rng)[0]
    join_ms, joined = _timed(assignor.assign, _spec(topics, [*member_ids, joiner], current), runs)

    leaver = rng.choice(member_ids)
    stayers = [member_id for member_id in member_ids if member_id != leaver]
    leave_ms, left = _timed(assignor.assign, _spec(topics, stayers, current), runs)

    return {
        **asdict(case),
        "partitions": case.partitions,
        "runs": runs,
        "full_ms": full_ms,
        "join_incremental_ms": join_ms,
        "join_moved": partitions_moved(current, _partitions_of(joined)),
        "join_ideal_moved": math.ceil(case.partitions / (case.members + 1)),
        "leave_incremental_ms": leave_ms,
        "leave_moved": partitions_moved(current, _partitions_of(left)),
        "leaver_partitions": sum(len(p) for p in current[leaver].values()),
    }


def run(cases: Iterable[Case]) -> dict[str, object]:
    """The assignor section of the benchmark document."""
    return {
        "benchmark": "ServerSideAssignorBenchmark (homogeneous subscriptions)",
        "python": platform.python_version(),
        "machine": platform.machine(),
        "results": [run_case(case) for case in cases],
    }


def shard_heartbeats(members: int, partitions_per_member: int = 5, seconds: float = 2.0) -> dict[str, object]:
    """Steady-state heartbeats/s of one GroupCoordinatorShard, plus the cost of forming the group."""
    from pystreams.coordinator.shard import GroupCoordinatorShard
    from pystreams.protocol.messages import ConsumerGroupHeartbeatRequest as Heartbeat

    shard = GroupCoordinatorShard()
    topic = TopicMetadata(uuid.UUID(int=7), "events", members * partitions_per_member)
    shard.update_topics({topic.name: topic}, 0)
    started = time.perf_counter()
    member_ids = []
    for _ in range(members):
        join = Heartbeat(group_id="bench", member_id="", member_epoch=0, rebalance_timeout_ms=60_000, subscribed_topic_names=[topic.name])
        member_ids.append(shard.handle(join, 0).response.member_id)
    joins_s = time.perf_counter() - started
    group = shard.groups["bench"]
    for _ in range(3):  # well-behaved members: acknowledge revocations until stable
        for member_id in member_ids:
            member = group.members[member_id]
            owned = member.assigned.to_wire(Heartbeat.TopicPartitions) if member.revoking else None
            shard.handle(Heartbeat(group_id="bench", member_id=member_id, member_epoch=member.member_epoch, topic_partitions=owned), 0)
    requests = [Heartbeat(group_id="bench", member_id=m, member_epoch=group.members[m].member_epoch) for m in member_ids]
    handled, now, started = 0, 1, time.perf_counter()
    while time.perf_counter() - started < seconds:
        for request in requests:
            shard.handle(request, now)
        handled += len(requests)
        now += 1
    elapsed = time.perf_counter() - started
    return {
        "members": members,
        "partitions": topic.num_partitions,
        "state": group.state.value,
        "steady_heartbeats_per_s": round(handled / elapsed),
        "group_formation_ms_per_join": round(joins_s * 1000 / members, 3),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="only the 100- and 1000-member groups")
    parser.add_argument(
        "--assignors",
        default=",".join(SERVER_ASSIGNORS),
        help="comma-separated server assignor names (default: all)",
    )
    args = parser.parse_args(argv)
    member_counts = QUICK_MEMBER_COUNTS if args.quick else MEMBER_COUNTS
    cases = benchmark_cases(member_counts, [name.strip() for name in args.assignors.split(",") if name.strip()])
    document = {
        "assignors": run(cases),
        # Forming a 10,000-member group one join at a time is O(N^2) assignor work: left out.
        "shard_heartbeats": [shard_heartbeats(n) for n in (100, 1000)],
    }
    json.dump(document, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
