"""The Streams task assignor: tasks from partitions, co-partitioning, stickiness, balance,
determinism, and the topology-hash check; plus the metadata encodings."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from pystreams.assignors.api import AssignmentSpec, AssignorMetadata, MemberSpec, TopicMetadata
from pystreams.assignors.streams import (
    AssignmentError,
    MemberReason,
    MetadataDecodeError,
    StickyTaskAssignor,
    StreamsAssignmentMetadata,
    StreamsMemberMetadata,
    decode_assignment_metadata,
    decode_member_metadata,
    encode_assignment_metadata,
    encode_member_metadata,
)
from pystreams.topology.ir import TaskId
from pystreams.topology.resolve import resolve

from pystreams.app import load_app

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.fixture(scope="module")
def join_topology():
    """orders ⋈ payments (co-partitioned, 6 partitions) plus a repartitioned customer join."""
    app = load_app(str(EXAMPLES / "orders_enrich_join.py"))
    topology = app.topology()
    counts = {t: 6 for t in topology.external_source_topics}
    return resolve(topology, counts)


def _topics(resolved) -> dict[uuid.UUID, TopicMetadata]:
    topics = {}
    for name in sorted({t for ts in resolved.source_topics.values() for t in ts}):
        topic_id = uuid.uuid5(uuid.NAMESPACE_URL, name)
        topics[topic_id] = TopicMetadata(topic_id=topic_id, name=name, num_partitions=resolved.partitions[name])
    return topics


def _assignor(resolved, process: int = 0, endpoint: str = "") -> StickyTaskAssignor:
    return StickyTaskAssignor(resolved, process_id=uuid.UUID(int=process + 1), user_endpoint=endpoint)


def _spec(resolved, member_ids, targets=None, hashes=None, lags=None) -> AssignmentSpec:
    topics = _topics(resolved)
    members = {}
    for index, mid in enumerate(member_ids):
        assignor = _assignor(resolved, index, f"host{index}:80")
        if lags and mid in lags:
            assignor.set_task_lags(lags[mid])
        meta = assignor.metadata()
        if hashes and mid in hashes:
            data = encode_member_metadata(StreamsMemberMetadata(process_id=uuid.UUID(int=index + 1), topology_hash=hashes[mid]))
            meta = AssignorMetadata(reason=0, version=1, data=data, minimum_version=1, maximum_version=1)
        members[mid] = MemberSpec(
            subscribed_topic_ids=frozenset(topics),
            target_partitions=(targets or {}).get(mid, {}),
            metadata=meta,
        )
    return AssignmentSpec(members=members, topics=topics)


def _tasks_of(assignment, mid) -> list[TaskId]:
    member = assignment.members[mid]
    return decode_assignment_metadata(member.metadata_version, member.metadata).active_task_ids()


def test_every_task_exactly_once_with_its_partitions(join_topology):
    spec = _spec(join_topology, ["a", "b", "c"])
    result = _assignor(join_topology).assign(spec)
    assert result.error == 0
    all_tasks = [t for mid in spec.members for t in _tasks_of(result, mid)]
    assert sorted(all_tasks) == sorted(join_topology.tasks)
    seen: set[tuple[uuid.UUID, int]] = set()
    for member in result.members.values():
        for topic_id, partitions in member.partitions.items():
            pairs = {(topic_id, p) for p in partitions}
            assert not pairs & seen
            seen |= pairs
    total = sum(topic.num_partitions for topic in spec.topics.values())
    assert len(seen) == total


def test_co_partitioned_inputs_go_to_one_member(join_topology):
    spec = _spec(join_topology, ["a", "b", "c", "d"])
    result = _assignor(join_topology).assign(spec)
    names = {t: m.name for t, m in spec.topics.items()}
    for mid, member in result.members.items():
        held = {(names[t], p) for t, ps in member.partitions.items() for p in ps}
        for task in _tasks_of(result, mid):
            assert set(join_topology.input_partitions(task)) <= held
        # orders-N and payments-N always together
        orders = {p for n, p in held if n == "orders"}
        payments = {p for n, p in held if n == "payments"}
        assert orders == payments


def test_sticky_when_nothing_changed(join_topology):
    members = ["a", "b", "c"]
    first = _assignor(join_topology).assign(_spec(join_topology, members))
    targets = {mid: first.members[mid].partitions for mid in members}
    # The member ids of the spec change order of computation nowhere: same result.
    second = _assignor(join_topology, 2).assign(_spec(join_topology, members, targets))
    assert {mid: second.members[mid].partitions for mid in members} == targets


def test_sticky_scale_out_moves_only_what_balance_needs(join_topology):
    members = ["a", "b"]
    first = _assignor(join_topology).assign(_spec(join_topology, members))
    targets = {mid: first.members[mid].partitions for mid in members}
    before = {mid: set(_tasks_of(first, mid)) for mid in members}
    # Every task here is stateful: "c" must have caught-up state for tasks to move to it now
    # (without it they stay put and "c" warms up: tests/test_assignors_streams_placement.py).
    caught_up = {"c": dict.fromkeys(join_topology.tasks, 0)}
    second = _assignor(join_topology).assign(_spec(join_topology, ["a", "b", "c"], targets, lags=caught_up))
    after = {mid: set(_tasks_of(second, mid)) for mid in ["a", "b", "c"]}
    total = len(join_topology.tasks)
    for mid in members:
        assert after[mid] <= before[mid]  # kept tasks never move between old members
    assert len(after["c"]) == total // 3 or len(after["c"]) == total // 3 + 1
    moved = sum(len(before[mid] - after[mid]) for mid in members)
    assert moved == len(after["c"])


def test_balanced_by_task_count(join_topology):
    for size in range(1, 8):
        members = [f"m{i}" for i in range(size)]
        result = _assignor(join_topology).assign(_spec(join_topology, members))
        counts = [len(_tasks_of(result, mid)) for mid in members]
        assert max(counts) - min(counts) <= 1
        assert sum(counts) == len(join_topology.tasks)


def test_balance_restored_after_a_member_leaves_with_stickiness(join_topology):
    members = ["a", "b", "c"]
    first = _assignor(join_topology).assign(_spec(join_topology, members))
    targets = {mid: first.members[mid].partitions for mid in ["a", "b"]}
    before = {mid: set(_tasks_of(first, mid)) for mid in ["a", "b"]}
    second = _assignor(join_topology).assign(_spec(join_topology, ["a", "b"], targets))
    for mid in ["a", "b"]:
        assert before[mid] <= set(_tasks_of(second, mid))
    counts = [len(_tasks_of(second, mid)) for mid in ["a", "b"]]
    assert max(counts) - min(counts) <= 1


def test_deterministic(join_topology):
    spec = _spec(join_topology, ["z", "a", "m"])
    one = _assignor(join_topology).assign(spec)
    two = _assignor(join_topology, 5).assign(spec)
    assert one == two


def test_inconsistent_topology_keeps_targets_and_reports_error(join_topology):
    members = ["a", "b"]
    first = _assignor(join_topology).assign(_spec(join_topology, members))
    targets = {mid: first.members[mid].partitions for mid in members}
    spec = _spec(join_topology, members, targets, hashes={"b": uuid.uuid4()})
    result = _assignor(join_topology).assign(spec)
    assert result.error == AssignmentError.INCONSISTENT_TOPOLOGY == 3
    for mid in members:
        member = result.members[mid]
        assert member.partitions == targets[mid]
        assert decode_assignment_metadata(member.metadata_version, member.metadata).error == 3


def test_partitions_by_host(join_topology):
    spec = _spec(join_topology, ["a", "b"])
    result = _assignor(join_topology).assign(spec)
    member = result.members["a"]
    meta = decode_assignment_metadata(member.metadata_version, member.metadata)
    assert set(meta.partitions_by_host) == {"host0:80", "host1:80"}
    assert sum(len(v) for v in meta.partitions_by_host.values()) == sum(t.num_partitions for t in spec.topics.values())


def test_metadata_round_trip_and_reason():
    member = StreamsMemberMetadata(
        process_id=uuid.uuid4(),
        user_endpoint="h:1",
        client_tags={"rack": "r1"},
        topology_hash=uuid.uuid4(),
        task_lags={"0_1": 5},
    )
    assert decode_member_metadata(1, encode_member_metadata(member)) == member
    assignment = StreamsAssignmentMetadata(
        active_tasks=(TaskId(0, 1),),
        standby_tasks=(TaskId(1, 2),),
        warmup_tasks=(TaskId(1, 0),),
        partitions_by_host={"h:1": [("t", 1)]},
        standby_partitions_by_host={"h:2": [("t", 2)]},
        error=2,
    )
    assert decode_assignment_metadata(2, encode_assignment_metadata(assignment, 2)) == assignment
    # v1 has no standby partitions by host; the rest survives.
    from_v1 = decode_assignment_metadata(1, encode_assignment_metadata(assignment, 1))
    assert from_v1 == StreamsAssignmentMetadata(
        active_tasks=(TaskId(0, 1),),
        standby_tasks=(TaskId(1, 2),),
        warmup_tasks=(TaskId(1, 0),),
        partitions_by_host={"h:1": [("t", 1)]},
        error=2,
    )
    assert decode_member_metadata(2, encode_member_metadata(member)) == member  # one layout
    with pytest.raises(MetadataDecodeError):
        decode_member_metadata(3, encode_member_metadata(member))
    assert [r.value for r in MemberReason] == [0, 1, 2, 3, 4]
    assert [e.value for e in AssignmentError] == [0, 1, 2, 3]


def test_v2_partitions_by_host_name_each_topic_once_and_round_trip():
    hosts = {f"worker-{i}.example:8080": [("orders", i), ("customers-changelog", i), ("orders", i + 100)] for i in range(50)}
    assignment = StreamsAssignmentMetadata(
        active_tasks=(TaskId(0, 1),),
        partitions_by_host=hosts,
        standby_partitions_by_host={"worker-0.example:8080": [("orders", 7)]},
    )
    v2, v1 = encode_assignment_metadata(assignment, 2), encode_assignment_metadata(assignment, 1)
    decoded = decode_assignment_metadata(2, v2)
    assert decoded.partitions_by_host == {host: sorted(pairs) for host, pairs in hosts.items()}
    assert decoded.standby_partitions_by_host == {"worker-0.example:8080": [("orders", 7)]}
    assert v2.count(b"customers-changelog") == 1 and v1.count(b"customers-changelog") == 50
    assert len(v2) < len(v1)


def test_v2_topic_index_outside_the_topic_list_is_a_decode_error():
    import msgspec

    bad = msgspec.msgpack.encode({"topics": ["t"], "partitions_by_host": {"h:1": {3: [0]}}})
    with pytest.raises(MetadataDecodeError, match="topic index"):
        decode_assignment_metadata(2, bad)


def test_reason_travels_in_the_assignor_field(join_topology):
    assignor = _assignor(join_topology)
    assert assignor.metadata().reason == 0
    assignor.set_reason(MemberReason.TOPOLOGY_CHANGED)
    assert assignor.metadata().reason == 4
    decoded = decode_member_metadata(assignor.metadata().version, assignor.metadata().data)
    assert decoded.topology_hash == join_topology.topology.hash
