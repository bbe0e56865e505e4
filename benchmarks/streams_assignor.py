"""Streams task assignor benchmark: ``StickyTaskAssignor.assign`` on large groups.

Groups (one standby replica per stateful task, client tags over three zones with
``rack.aware.assignment.tags=zone``):

* 100 processes × 3 threads (300 members), 2,000 stateful tasks;
* 1,000 processes × 1 thread (1,000 members), the same 2,000 tasks.

The topology is ``examples/dedupe_processor.py`` on a 2,000-partition input: one sub-topology
with a changelogged store, so every task is stateful and gets a standby. Each group goes
through the assignments a real group sees, each timed as the median over a few runs
through the full ``assign`` (metadata decoding, placement, metadata encoding):

* ``initial``: no member has a target or state yet;
* ``steady``: every member holds its previous target and reports lags (0 for its actives,
  a few hundred records for its standbys) — the common case, nothing should move;
* ``process_lost``: one process is gone; its tasks go to processes with standbys;
* ``process_added``: a new process with no state joins; actives stay and it gets warm-ups.

Kafka's Java sticky Streams assignor takes about 0.1–2.6 ms at 1,000 members. Then the
``failover`` section: time to resumed processing after the active worker of a 1,000,000-key
store is killed, with a standby and without (real processes; ``streams_failover.py``). Prints
one JSON document.

    python benchmarks/streams_assignor.py                   # 7 runs per case, then fail-over
    python benchmarks/streams_assignor.py --quick           # 3 runs per case
    python benchmarks/streams_assignor.py --skip-failover   # the assignor only
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import random
import statistics
import sys
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

import streams_failover
from pystreams.assignors.api import AssignmentSpec, AssignorMetadata, GroupAssignment, MemberSpec, TopicMetadata
from pystreams.assignors.streams import (
    MAXIMUM_METADATA_VERSION,
    MINIMUM_METADATA_VERSION,
    HaConfig,
    StickyTaskAssignor,
    StreamsAssignmentMetadata,
    StreamsMemberMetadata,
    decode_assignment_metadata,
    encode_member_metadata,
)
from pystreams.assignors.streams.metadata import task_lags_from
from pystreams.topology.ir import TaskId
from pystreams.topology.resolve import ResolvedTopology, resolve

from pystreams.app import load_app

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "dedupe_processor.py"
TASKS = 2_000
GROUPS = ((100, 3), (1_000, 1))  # (processes, threads per process)
ZONES = ("zone-a", "zone-b", "zone-c")
HA = HaConfig(num_standby_replicas=1, max_warmup_replicas=2, rack_aware_assignment_tags=("zone",))


def _resolved() -> ResolvedTopology:
    topology = load_app(str(EXAMPLE)).topology()
    return resolve(topology, dict.fromkeys(topology.external_source_topics, TASKS))


def _topics(resolved: ResolvedTopology) -> dict[uuid.UUID, TopicMetadata]:
    names = sorted({t for ts in resolved.source_topics.values() for t in ts})
    return {uuid.uuid5(uuid.NAMESPACE_URL, name): TopicMetadata(uuid.uuid5(uuid.NAMESPACE_URL, name), name, resolved.partitions[name]) for name in names}


class Group:
    """A group of worker processes: member ids, process ids, zones; specs built from it."""

    def __init__(self, resolved: ResolvedTopology, processes: int, threads: int, seed: int = 1) -> None:
        rng = random.Random(seed)
        self.resolved = resolved
        self.topics = _topics(resolved)
        self.topology_hash = resolved.topology.hash
        # Random-looking ids, like the coordinator's, so sorted order is not creation order.
        self.members: dict[str, tuple[uuid.UUID, int]] = {}
        for index in range(processes):
            process_id = uuid.UUID(int=rng.getrandbits(128), version=4)
            for _ in range(threads):
                self.members[str(uuid.UUID(int=rng.getrandbits(128), version=4))] = (process_id, index)

    def spec(
        self,
        member_ids: list[str],
        targets: Mapping[str, Mapping[uuid.UUID, frozenset[int]]] | None = None,
        lags: Mapping[str, Mapping[TaskId, int]] | None = None,
    ) -> AssignmentSpec:
        subscription = frozenset(self.topics)
        members = {}
        for mid in member_ids:
            process_id, index = self.members[mid]
            data = encode_member_metadata(
                StreamsMemberMetadata(
                    process_id=process_id,
                    user_endpoint=f"worker-{index}:8080",
                    client_tags={"zone": ZONES[index % len(ZONES)]},
                    topology_hash=self.topology_hash,
                    task_lags=task_lags_from((lags or {}).get(mid, {})),
                )
            )
            members[mid] = MemberSpec(
                subscribed_topic_ids=subscription,
                target_partitions=(targets or {}).get(mid, {}),
                metadata=AssignorMetadata(
                    reason=0,
                    version=MAXIMUM_METADATA_VERSION,
                    data=data,
                    minimum_version=MINIMUM_METADATA_VERSION,
                    maximum_version=MAXIMUM_METADATA_VERSION,
                ),
            )
        return AssignmentSpec(members=members, topics=self.topics)


def _timed(assignor: StickyTaskAssignor, spec: AssignmentSpec, runs: int) -> tuple[float, GroupAssignment]:
    timings = []
    result = None
    for _ in range(runs):
        gc.collect()  # don't charge this run for the previous one's garbage; GC stays enabled
        started = time.perf_counter()
        result = assignor.assign(spec)
        timings.append((time.perf_counter() - started) * 1000)
    assert result is not None
    return round(statistics.median(timings), 3), result


def _decoded(result: GroupAssignment) -> dict[str, StreamsAssignmentMetadata]:
    return {mid: decode_assignment_metadata(member.metadata_version, member.metadata) for mid, member in result.members.items()}


def _lags_after(decoded: Mapping[str, StreamsAssignmentMetadata], standby_lag: int) -> dict[str, dict[TaskId, int]]:
    """What each member reports once its assignment ran a while: actives at the changelog end,
    standbys a little behind."""
    lags: dict[str, dict[TaskId, int]] = {}
    for mid, meta in decoded.items():
        mine = dict.fromkeys(meta.active_task_ids(), 0)
        mine.update(dict.fromkeys(meta.standby_task_ids(), standby_lag))
        lags[mid] = mine
    return lags


def _actives(decoded: Mapping[str, StreamsAssignmentMetadata]) -> dict[TaskId, str]:
    return {task: mid for mid, meta in decoded.items() for task in meta.active_task_ids()}


def _case(ms: float, result: GroupAssignment, previous: Mapping[str, StreamsAssignmentMetadata] | None) -> tuple[dict, dict]:
    decoded = _decoded(result)
    summary = {
        "ms": ms,
        "actives": sum(len(m.active_tasks) for m in decoded.values()),
        "standbys": sum(len(m.standby_tasks) for m in decoded.values()),
        "warmups": sum(len(m.warmup_tasks) for m in decoded.values()),
        "metadata_bytes_per_member": round(statistics.mean(len(m.metadata) for m in result.members.values())),
    }
    if previous is not None:
        before, after = _actives(previous), _actives(decoded)
        summary["actives_moved"] = sum(1 for task, mid in before.items() if after.get(task) != mid)
    return summary, decoded


def run_group(resolved: ResolvedTopology, processes: int, threads: int, runs: int) -> dict:
    group = Group(resolved, processes, threads)
    assignor = StickyTaskAssignor(resolved, process_id=uuid.UUID(int=1), ha=HA)
    member_ids = list(group.members)
    cases = {}

    ms, initial = _timed(assignor, group.spec(member_ids), runs)
    cases["initial"], initial_decoded = _case(ms, initial, None)

    targets = {mid: member.partitions for mid, member in initial.members.items()}
    lags = _lags_after(initial_decoded, standby_lag=300)
    ms, steady = _timed(assignor, group.spec(member_ids, targets, lags), runs)
    cases["steady"], steady_decoded = _case(ms, steady, initial_decoded)

    lost_index = group.members[member_ids[0]][1]
    survivors = [mid for mid in member_ids if group.members[mid][1] != lost_index]
    ms, lost = _timed(assignor, group.spec(survivors, targets, lags), runs)
    cases["process_lost"], _ = _case(ms, lost, steady_decoded)

    newcomer = Group(resolved, 1, threads, seed=99)
    for mid, (process_id, _) in newcomer.members.items():
        group.members[mid] = (process_id, processes)
    ms, added = _timed(assignor, group.spec(member_ids + list(newcomer.members), targets, lags), runs)
    cases["process_added"], _ = _case(ms, added, steady_decoded)

    return {"processes": processes, "threads": threads, "members": processes * threads, "tasks": len(resolved.tasks), "cases": cases}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 runs per case instead of 7")
    parser.add_argument("--skip-failover", action="store_true", help="no fail-over runs (they take a few minutes)")
    parser.add_argument("--failover-keys", type=int, default=1_000_000)
    args = parser.parse_args(argv)
    runs = 3 if args.quick else 7
    resolved = _resolved()
    report = {
        "benchmark": "streams_assignor",
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "config": {
            "num_standby_replicas": HA.num_standby_replicas,
            "max_warmup_replicas": HA.max_warmup_replicas,
            "acceptable_recovery_lag": HA.acceptable_recovery_lag,
            "rack_aware_assignment_tags": list(HA.rack_aware_assignment_tags),
            "zones": len(ZONES),
        },
        "runs_per_case": runs,
        "groups": [run_group(resolved, processes, threads, runs) for processes, threads in GROUPS],
    }
    if not args.skip_failover:
        report["failover"] = streams_failover.run(args.failover_keys)
    json.dump(report, sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
