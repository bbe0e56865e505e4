"""High-availability placement of Streams tasks: properties of ``place_tasks`` over random
groups, and the Streams assignor's scenarios (warm-ups, promotion after catching up,
rack-aware standbys, rolling upgrade between metadata versions, shutdown)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from pathlib import Path

import pytest
from assignor_support import PROPERTY_SETTINGS
from hypothesis import assume, given
from hypothesis import strategies as st
from pystreams.assignors.api import AssignmentSpec, AssignorMetadata, MemberSpec, TopicMetadata
from pystreams.assignors.streams import (
    AssignmentError,
    HaConfig,
    MemberReason,
    MemberTasks,
    MetadataDecodeError,
    ProcessSpec,
    StickyTaskAssignor,
    StreamsMemberMetadata,
    decode_assignment_metadata,
    decode_member_metadata,
    encode_member_metadata,
    place_tasks,
)
from pystreams.topology.ir import TaskId
from pystreams.topology.resolve import resolve

from pystreams.app import load_app

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
ACCEPTABLE = 100
LAG_CHOICES = (0, 7, ACCEPTABLE, ACCEPTABLE + 1, 5_000)

# -- a random group -----------------------------------------------------------------------------


@st.composite
def groups(draw, all_caught_up: bool = False):
    """(tasks, stateful, processes, owners, config) for a random group."""
    partitions = draw(st.lists(st.integers(1, 8), min_size=1, max_size=3))
    tasks = [TaskId(sub, p) for sub, count in enumerate(partitions) for p in range(count)]
    stateful_subs = draw(st.sets(st.sampled_from(range(len(partitions)))))
    stateful = {task for task in tasks if task.subtopology in stateful_subs}
    process_count = draw(st.integers(1, 6))
    zones = draw(st.integers(1, 3))
    processes = []
    for index in range(process_count):
        threads = draw(st.integers(1, 3))
        if all_caught_up:
            lags = dict.fromkeys(sorted(stateful), 0)
        else:
            lags = draw(st.dictionaries(st.sampled_from(sorted(stateful)), st.sampled_from(LAG_CHOICES))) if stateful else {}
        processes.append(
            ProcessSpec(
                process_id=f"p{index}",
                member_ids=tuple(f"p{index}-t{t}" for t in range(threads)),
                client_tags={"zone": f"z{index % zones}"},
                task_lags=lags,
            )
        )
    member_ids = [mid for process in processes for mid in process.member_ids]
    owners = draw(st.dictionaries(st.sampled_from(tasks), st.sampled_from(member_ids)))
    config = HaConfig(
        num_standby_replicas=draw(st.integers(0, 2)),
        max_warmup_replicas=draw(st.integers(0, 3)),
        acceptable_recovery_lag=ACCEPTABLE,
        rack_aware_assignment_tags=draw(st.sampled_from([(), ("zone",)])),
    )
    return tasks, stateful, processes, owners, config


def _process_of(processes) -> dict[str, str]:
    return {mid: process.process_id for process in processes for mid in process.member_ids}


def _actives(result: Mapping[str, MemberTasks]) -> dict[TaskId, str]:
    return {task: mid for mid, tasks in result.items() for task in tasks.active}


def _lag(processes, owners, task, process_id) -> int | None:
    """The lag placement sees: the owner's process is caught up (0)."""
    by_id = {p.process_id: p for p in processes}
    if task in owners and _process_of(processes)[owners[task]] == process_id:
        return 0
    return by_id[process_id].task_lags.get(task)


# -- properties ---------------------------------------------------------------------------------


@PROPERTY_SETTINGS
@given(groups())
def test_every_task_has_exactly_one_active(group):
    tasks, stateful, processes, owners, config = group
    result = place_tasks(tasks, stateful, processes, owners, config)
    actives = [task for member in result.values() for task in member.active]
    assert sorted(actives) == sorted(tasks)
    assert set(result) == set(_process_of(processes))


@PROPERTY_SETTINGS
@given(groups())
def test_replicas_of_a_task_are_on_distinct_processes(group):
    """No standby on its active's process, no two replicas (active, standby, warm-up) of a
    task on one process, and as many standbys as there are other processes allow."""
    tasks, stateful, processes, owners, config = group
    result = place_tasks(tasks, stateful, processes, owners, config)
    process_of = _process_of(processes)
    holders: dict[TaskId, list[str]] = {task: [] for task in tasks}
    standbys: dict[TaskId, int] = dict.fromkeys(tasks, 0)
    for mid, member in result.items():
        for task in member.active + member.standby + member.warmup:
            holders[task].append(process_of[mid])
        for task in member.standby:
            standbys[task] += 1
            assert task in stateful
    for task, where in holders.items():
        assert len(where) == len(set(where)), (task, where)
        expected = min(config.num_standby_replicas, len(processes) - 1) if task in stateful else 0
        assert standbys[task] == expected


@PROPERTY_SETTINGS
@given(groups())
def test_warmups_within_the_limit_and_only_where_the_active_is_held_back(group):
    tasks, stateful, processes, owners, config = group
    result = place_tasks(tasks, stateful, processes, owners, config)
    warmups = [task for member in result.values() for task in member.warmup]
    assert len(warmups) <= config.max_warmup_replicas
    assert set(warmups) <= stateful
    process_of, actives = _process_of(processes), _actives(result)
    standbys = {(process_of[mid], task) for mid, member in result.items() for task in member.standby}
    for mid, member in result.items():
        here = process_of[mid]
        for task in member.warmup:
            assert process_of[actives[task]] != here  # a warm-up prepares a move elsewhere
            lag = _lag(processes, owners, task, here)
            assert lag is None or lag > config.acceptable_recovery_lag  # else it could run it now
            assert (here, task) not in standbys  # a standby there restores it already


@PROPERTY_SETTINGS
@given(groups())
def test_stateful_actives_run_only_where_state_is_caught_up(group):
    tasks, stateful, processes, owners, config = group
    result = place_tasks(tasks, stateful, processes, owners, config)
    process_of = _process_of(processes)
    ids = [p.process_id for p in processes]
    for task, mid in _actives(result).items():
        if task not in stateful:
            continue
        lags = {pid: _lag(processes, owners, task, pid) for pid in ids}
        known = [lag for lag in lags.values() if lag is not None]
        if not known:
            continue  # no state anywhere: placed freely
        here = lags[process_of[mid]]
        if min(known) <= ACCEPTABLE:
            assert here is not None and here <= ACCEPTABLE, (task, mid, lags)
        else:
            assert here == min(known), (task, mid, lags)


@PROPERTY_SETTINGS
@given(groups(all_caught_up=True))
def test_balanced_per_member_when_lags_allow(group):
    tasks, stateful, processes, owners, config = group
    result = place_tasks(tasks, stateful, processes, owners, config)
    counts = [len(member.active) for member in result.values()]
    assert max(counts) - min(counts) <= 1
    assert not any(member.warmup for member in result.values())


@PROPERTY_SETTINGS
@given(groups(), st.randoms(use_true_random=False))
def test_deterministic_whatever_the_order_of_the_input(group, rng):
    tasks, stateful, processes, owners, config = group
    first = place_tasks(tasks, stateful, processes, owners, config)
    assert place_tasks(tasks, stateful, processes, owners, config) == first
    shuffled = []
    for process in processes:
        member_ids = list(process.member_ids)
        rng.shuffle(member_ids)
        lags = list(process.task_lags.items())
        rng.shuffle(lags)
        shuffled.append(ProcessSpec(process.process_id, tuple(member_ids), process.client_tags, dict(lags)))
    rng.shuffle(shuffled)
    tasks = list(reversed(tasks))
    owner_items = list(owners.items())
    rng.shuffle(owner_items)
    assert place_tasks(tasks, set(stateful), shuffled, dict(owner_items), config) == first


def _next_round(processes, first, owners, stateful) -> list[ProcessSpec]:
    """The lags workers report after an assignment: what they reported before, plus lag 0 for
    tasks a process ran before (the state is still on its disk) and some progress for its
    warm-ups (not enough to take over yet)."""
    process_of = _process_of(processes)
    extra = {(process_of[mid], task): 0 for task, mid in owners.items() if task in stateful}
    extra.update({(process_of[mid], task): ACCEPTABLE + 1 for mid, member in first.items() for task in member.warmup})
    return [
        ProcessSpec(
            p.process_id,
            p.member_ids,
            p.client_tags,
            {**{task: lag for (pid, task), lag in extra.items() if pid == p.process_id}, **p.task_lags},
        )
        for p in processes
    ]


def _overload(result: Mapping[str, MemberTasks], task_count: int) -> int:
    """Actives above the balanced share (ceil(T / M)), summed over members."""
    share = -(-task_count // len(result))
    return sum(max(0, len(member.active) - share) for member in result.values())


@PROPERTY_SETTINGS
@given(groups(all_caught_up=True))
def test_sticky_identical_result_when_nothing_changed_and_all_caught_up(group):
    tasks, stateful, processes, owners, config = group
    first = place_tasks(tasks, stateful, processes, owners, config)
    second = place_tasks(tasks, stateful, processes, _actives(first), config)
    assert second == first


def _steady_reports(processes, result, standby_lag: int = 30) -> list[ProcessSpec]:
    """Exactly what workers report after running ``result`` for a while: their actives at the
    changelog end, their standbys a little behind; no other state."""
    process_of = _process_of(processes)
    lags: dict[str, dict[TaskId, int]] = {p.process_id: {} for p in processes}
    for mid, member in result.items():
        lags[process_of[mid]].update(dict.fromkeys(member.active, 0))
        lags[process_of[mid]].update(dict.fromkeys(member.standby, standby_lag))
    return [ProcessSpec(p.process_id, p.member_ids, p.client_tags, lags[p.process_id]) for p in processes]


@PROPERTY_SETTINGS
@given(groups())
def test_sticky_no_active_moves_when_nothing_changed(group):
    """A group that runs a settled assignment and reports its state (actives caught up,
    standbys a little behind): the next assignment is the same, standbys included.

    Settled means nothing is held back by lag: every member within one task of every other.
    "No overload and no warm-ups" is not enough: a task held back on a process over its share
    may have no warm-up (``max_warmup_replicas`` 0, or a standby already restoring it), and once
    that replica reports caught up the task is promoted, as it should be (see
    ``test_a_caught_up_standby_takes_over_a_held_back_task``)."""
    tasks, stateful, processes, owners, config = group
    first = place_tasks(tasks, stateful, processes, owners, config)
    counts = [len(member.active) for member in first.values()]
    assume(max(counts) - min(counts) <= 1)
    assert not any(member.warmup for member in first.values())  # warm-ups only for held-back tasks
    steady = place_tasks(tasks, stateful, _steady_reports(processes, first), _actives(first), config)
    assert _actives(steady) == _actives(first)
    assert steady == first


@PROPERTY_SETTINGS
@given(groups())
def test_an_unchanged_group_never_moves_actives_to_make_things_worse(group):
    """With arbitrary extra state on disks, the second look may still move an active (the
    placement is greedy), but only to a process that may run it and never adding overload."""
    tasks, stateful, processes, owners, config = group
    first = place_tasks(tasks, stateful, processes, owners, config)
    reports = _next_round(processes, first, owners, stateful)
    second = place_tasks(tasks, stateful, reports, _actives(first), config)
    assert _overload(second, len(tasks)) <= _overload(first, len(tasks))
    process_of = _process_of(processes)
    for task, mid in _actives(second).items():
        if task in stateful and _actives(first)[task] != mid:
            lag = _lag(reports, _actives(first), task, process_of[mid])
            assert lag is not None and lag <= ACCEPTABLE, (task, mid, lag)


@PROPERTY_SETTINGS
@given(groups())
def test_a_settled_group_gets_the_identical_assignment(group):
    """After a change, standbys and warm-ups keep shifting while warm-ups report progress
    (each caught-up one frees the warm-up budget for the next); the group settles within a
    bounded number of rounds, and then the whole result comes back identical."""
    tasks, stateful, processes, owners, config = group
    previous = place_tasks(tasks, stateful, processes, owners, config)
    for _ in range(len(tasks) + 3):
        processes, owners = _next_round(processes, previous, owners, stateful), _actives(previous)
        current = place_tasks(tasks, stateful, processes, owners, config)
        if current == previous:
            break
        previous = current
    else:
        pytest.fail(f"the assignment did not settle within {len(tasks) + 3} rounds")
    assert place_tasks(tasks, stateful, processes, owners, config) == current


@PROPERTY_SETTINGS
@given(groups(all_caught_up=True))
def test_sticky_keeps_every_owned_task_that_balance_allows(group):
    """(With stateful and stateless tasks mixed, stateful ones claim their slots first and a
    stateless task may move instead: moving it costs nothing.)"""
    tasks, stateful, processes, owners, config = group
    assume(not stateful or stateful == set(tasks))
    result = place_tasks(tasks, stateful, processes, owners, config)
    actives = _actives(result)
    members = sorted(_process_of(processes))
    base, extra = divmod(len(tasks), len(members))
    kept_per_member = {mid: sum(1 for task, owner in owners.items() if owner == mid and actives[task] == mid) for mid in members}
    owned_per_member = {mid: sum(1 for owner in owners.values() if owner == mid) for mid in members}
    for mid in members:
        # A member keeps all it owns up to the base share.
        assert kept_per_member[mid] >= min(owned_per_member[mid], base)


def test_config_validation():
    with pytest.raises(ValueError, match="num.standby.replicas"):
        HaConfig(num_standby_replicas=-1)
    with pytest.raises(ValueError, match="max.warmup.replicas"):
        HaConfig(max_warmup_replicas=-2)
    with pytest.raises(ValueError, match="acceptable.recovery.lag"):
        HaConfig(acceptable_recovery_lag=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="rack.aware.assignment.tags"):
        HaConfig(rack_aware_assignment_tags="zone")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="duplicates"):
        HaConfig(rack_aware_assignment_tags=("zone", "zone"))
    assert HaConfig(rack_aware_assignment_tags=["zone"]).rack_aware_assignment_tags == ("zone",)  # type: ignore[arg-type]


# -- placement scenarios ------------------------------------------------------------------------


def _two_processes_and_a_newcomer(newcomer_lag: int | None):
    tasks = [TaskId(0, p) for p in range(6)]
    lags = {} if newcomer_lag is None else dict.fromkeys(tasks, newcomer_lag)
    processes = [
        ProcessSpec("a", ("a-0",)),
        ProcessSpec("b", ("b-0",)),
        ProcessSpec("c", ("c-0",), task_lags=lags),
    ]
    owners = {task: ("a-0" if task.partition < 3 else "b-0") for task in tasks}
    return tasks, processes, owners


def test_lagging_target_gets_a_warmup_while_the_caught_up_owner_keeps_the_active():
    tasks, processes, owners = _two_processes_and_a_newcomer(newcomer_lag=None)
    config = HaConfig(max_warmup_replicas=1, acceptable_recovery_lag=ACCEPTABLE)
    result = place_tasks(tasks, set(tasks), processes, owners, config)
    assert _actives(result) == owners  # nothing moved: "c" has no state
    assert len(result["c-0"].warmup) == 1  # the one warm-up allowed, on the intended owner
    assert result["c-0"].active == []
    # Stateless tasks have no such rule: they move at once.
    stateless = place_tasks(tasks, set(), processes, owners, config)
    assert len(stateless["c-0"].active) == 2 and not stateless["c-0"].warmup


def test_after_catching_up_the_task_moves():
    tasks, processes, owners = _two_processes_and_a_newcomer(newcomer_lag=None)
    config = HaConfig(max_warmup_replicas=2, acceptable_recovery_lag=ACCEPTABLE)
    first = place_tasks(tasks, set(tasks), processes, owners, config)
    warming = first["c-0"].warmup
    assert len(warming) == 2
    # The warm-ups restore to just over the acceptable lag: still held back.
    processes[2] = ProcessSpec("c", ("c-0",), task_lags=dict.fromkeys(warming, ACCEPTABLE + 1))
    assert _actives(place_tasks(tasks, set(tasks), processes, _actives(first), config)) == owners
    # Within the acceptable lag (the worker's WarmUpReady): they move, and nothing else does.
    processes[2] = ProcessSpec("c", ("c-0",), task_lags=dict.fromkeys(warming, ACCEPTABLE))
    second = place_tasks(tasks, set(tasks), processes, _actives(first), config)
    assert second["c-0"].active == warming
    assert not any(member.warmup for member in second.values())
    moved = {task for task, mid in _actives(second).items() if owners[task] != mid}
    assert moved == set(warming)


def test_the_most_caught_up_process_takes_over_when_the_owner_is_gone():
    tasks = [TaskId(0, 0)]
    processes = [
        ProcessSpec("a", ("a-0",), task_lags={tasks[0]: 5_000}),
        ProcessSpec("b", ("b-0",), task_lags={tasks[0]: 50}),
        ProcessSpec("c", ("c-0",), task_lags={tasks[0]: 70}),
    ]
    result = place_tasks(tasks, set(tasks), processes, {}, HaConfig(num_standby_replicas=1, acceptable_recovery_lag=ACCEPTABLE))
    assert result["b-0"].active == tasks
    assert result["c-0"].standby == tasks  # the standby goes where state is (c beats a)


def test_a_caught_up_standby_takes_over_a_held_back_task():
    """Only "p2" has state at first, so it runs all 8 stateful tasks, one over its share (held
    back; no warm-up: every other process has a standby). Members are then 3, 3, 2 against 2
    and 1: no one above ceil(T / M), yet not balanced. Once the standbys report caught up, one
    stateful task moves off "p2" and the group is balanced; from then on nothing moves."""
    stateful = {TaskId(0, p) for p in range(8)}
    tasks = sorted(stateful) + [TaskId(1, p) for p in range(3)]
    processes = [
        ProcessSpec("p0", ("p0-t0",)),
        ProcessSpec("p1", ("p1-t0",)),
        ProcessSpec("p2", ("p2-t0", "p2-t1", "p2-t2"), task_lags=dict.fromkeys(sorted(stateful), 0)),
    ]
    config = HaConfig(num_standby_replicas=2, max_warmup_replicas=3, acceptable_recovery_lag=ACCEPTABLE)
    first = place_tasks(tasks, stateful, processes, {}, config)
    assert sorted(len(member.active) for member in first.values()) == [1, 2, 2, 3, 3]
    assert _overload(first, len(tasks)) == 0 and not any(member.warmup for member in first.values())
    second = place_tasks(tasks, stateful, _steady_reports(processes, first), _actives(first), config)
    assert sorted(len(member.active) for member in second.values()) == [2, 2, 2, 2, 3]
    moved = {task: mid for task, mid in _actives(second).items() if _actives(first)[task] != mid}
    moved_stateful = {task: mid for task, mid in moved.items() if task in stateful}
    assert len(moved_stateful) == 1 and set(moved_stateful.values()) <= {"p0-t0", "p1-t0"}
    # (It may take a slot a stateless task held, which then moves: that costs nothing.)
    assert all(task in stateful or mid in ("p0-t0", "p1-t0") for task, mid in moved.items())
    third = place_tasks(tasks, stateful, _steady_reports(processes, second), _actives(second), config)
    assert third == second


def test_no_warmup_where_a_standby_already_restores():
    tasks, processes, owners = _two_processes_and_a_newcomer(newcomer_lag=None)
    config = HaConfig(num_standby_replicas=2, max_warmup_replicas=2, acceptable_recovery_lag=ACCEPTABLE)
    result = place_tasks(tasks, set(tasks), processes, owners, config)
    # With two standbys over three processes, "c" holds a standby of every task.
    assert result["c-0"].standby == tasks
    assert not result["c-0"].warmup


def test_rack_aware_standbys_land_in_another_zone():
    tasks = [TaskId(0, p) for p in range(12)]
    processes = [ProcessSpec(f"p{i}", (f"p{i}-0",), client_tags={"zone": "east" if i < 3 else "west"}) for i in range(4)]
    config = HaConfig(num_standby_replicas=1, rack_aware_assignment_tags=("zone",))
    result = place_tasks(tasks, set(tasks), processes, {}, config)
    zone = {f"p{i}-0": ("east" if i < 3 else "west") for i in range(4)}
    actives = _actives(result)
    for mid, member in result.items():
        for task in member.standby:
            assert zone[mid] != zone[actives[task]], (task, mid, actives[task])
    # Without the tag setting the same group puts some standbys in the active's zone.
    plain = place_tasks(tasks, set(tasks), processes, {}, HaConfig(num_standby_replicas=1))
    plain_actives = _actives(plain)
    assert any(zone[mid] == zone[plain_actives[task]] for mid, member in plain.items() for task in member.standby)


def test_rack_aware_falls_back_when_tags_cannot_differ():
    tasks = [TaskId(0, p) for p in range(4)]
    processes = [ProcessSpec(f"p{i}", (f"p{i}-0",), client_tags={"zone": "only"}) for i in range(3)]
    config = HaConfig(num_standby_replicas=2, rack_aware_assignment_tags=("zone",))
    result = place_tasks(tasks, set(tasks), processes, {}, config)
    # Every process shares the zone: standbys are still placed, spread by load.
    assert sorted(len(member.standby) for member in result.values()) == [2, 3, 3]


def test_balance_is_per_thread_across_and_inside_processes():
    tasks = [TaskId(0, p) for p in range(40)]
    processes = [ProcessSpec("big", ("big-0", "big-1", "big-2")), ProcessSpec("small", ("small-0",))]
    result = place_tasks(tasks, set(), processes, {}, HaConfig())
    assert {mid: len(member.active) for mid, member in result.items()} == {"big-0": 10, "big-1": 10, "big-2": 10, "small-0": 10}


def test_scale_of_a_large_group_stays_correct():
    """300 members, 2,000 stateful tasks, one standby (timing: benchmarks/): balanced, every
    standby in another zone, and the same result when fed back with the lags workers report."""
    tasks = [TaskId(0, p) for p in range(2_000)]
    processes = [ProcessSpec(f"p{i:03}", tuple(f"p{i:03}-{t}" for t in range(3)), client_tags={"zone": f"z{i % 3}"}) for i in range(100)]
    config = HaConfig(num_standby_replicas=1, rack_aware_assignment_tags=("zone",))
    result = place_tasks(tasks, set(tasks), processes, {}, config)
    counts = [len(m.active) for m in result.values()]
    assert max(counts) - min(counts) <= 1
    actives = _actives(result)
    zone_of = {mid: p.client_tags["zone"] for p in processes for mid in p.member_ids}
    standbys = [(task, mid) for mid, m in result.items() for task in m.standby]
    assert len(standbys) == len(tasks)
    assert all(zone_of[mid] != zone_of[actives[task]] for task, mid in standbys)
    process_of = _process_of(processes)
    reported = [
        ProcessSpec(p.process_id, p.member_ids, p.client_tags, {task: 30 for task, mid in standbys if process_of[mid] == p.process_id}) for p in processes
    ]
    assert place_tasks(tasks, set(tasks), reported, actives, config) == result


# -- the assignor: metadata versions, shutdown ---------------------------------------------------


@pytest.fixture(scope="module")
def dedupe():
    """One stateful sub-topology (a changelogged store) on 6 partitions."""
    topology = load_app(str(EXAMPLES / "dedupe_processor.py")).topology()
    return resolve(topology, dict.fromkeys(topology.external_source_topics, 6))


def _topics(resolved) -> dict[uuid.UUID, TopicMetadata]:
    names = sorted({t for ts in resolved.source_topics.values() for t in ts})
    return {uuid.uuid5(uuid.NAMESPACE_URL, n): TopicMetadata(uuid.uuid5(uuid.NAMESPACE_URL, n), n, resolved.partitions[n]) for n in names}


def _member(resolved, topics, index, versions=(1, 2), reason=0, lags=None, targets=None, zone="z") -> MemberSpec:
    data = encode_member_metadata(
        StreamsMemberMetadata(
            process_id=uuid.UUID(int=index + 1),
            user_endpoint=f"host{index}:80",
            client_tags={"zone": zone},
            topology_hash=resolved.topology.hash,
            task_lags=lags or {},
        )
    )
    low, high = versions
    return MemberSpec(
        subscribed_topic_ids=frozenset(topics),
        target_partitions=targets or {},
        metadata=AssignorMetadata(reason=reason, version=high, data=data, minimum_version=low, maximum_version=high),
    )


def test_rolling_upgrade_each_member_gets_the_version_it_understands(dedupe):
    topics = _topics(dedupe)
    spec = AssignmentSpec(
        members={
            "old": _member(dedupe, topics, 0, versions=(1, 1)),
            "new1": _member(dedupe, topics, 1),
            "new2": _member(dedupe, topics, 2),
        },
        topics=topics,
    )
    assignor = StickyTaskAssignor(dedupe, process_id=uuid.UUID(int=9), ha=HaConfig(num_standby_replicas=1))
    result = assignor.assign(spec)
    assert result.error == 0
    assert [result.members[m].metadata_version for m in ("old", "new1", "new2")] == [1, 2, 2]
    old = decode_assignment_metadata(1, result.members["old"].metadata)
    with pytest.raises(MetadataDecodeError):
        decode_assignment_metadata(2, result.members["old"].metadata)
    new = {m: decode_assignment_metadata(2, result.members[m].metadata) for m in ("new1", "new2")}
    assert old.standby_partitions_by_host == {}
    assert new["new1"].standby_partitions_by_host  # v2 carries where the standbys are
    assert old.partitions_by_host == new["new1"].partitions_by_host
    everyone = [old, new["new1"], new["new2"]]
    assert sorted(t for m in everyone for t in m.active_task_ids()) == list(dedupe.tasks)
    assert sorted(t for m in everyone for t in m.standby_task_ids()) == list(dedupe.tasks)  # v1 keeps its standbys
    standby_hosts = new["new1"].standby_partitions_by_host
    assert sum(len(pairs) for pairs in standby_hosts.values()) == len(dedupe.tasks)


def test_member_metadata_goes_out_at_the_version_an_old_member_reads(dedupe):
    """Member metadata has one layout in v1 and v2, so it is sent as v1: if the coordinator
    ends up picking an old member (range [1, 1]) to compute, it can read everyone's. The range
    starts at -1: this member reads classic members' metadata (KIP-848's migration rule)."""
    metadata = StickyTaskAssignor(dedupe, process_id=uuid.UUID(int=3), user_endpoint="h:1").metadata()
    assert (metadata.minimum_version, metadata.maximum_version) == (-1, 2)
    assert metadata.version == 1
    assert decode_member_metadata(1, metadata.data).user_endpoint == "h:1"


def test_a_member_asking_to_shut_down_shuts_down_everyone(dedupe):
    topics = _topics(dedupe)
    first = StickyTaskAssignor(dedupe, process_id=uuid.UUID(int=9)).assign(
        AssignmentSpec(members={f"m{i}": _member(dedupe, topics, i) for i in range(3)}, topics=topics)
    )
    targets = {mid: member.partitions for mid, member in first.members.items()}
    members = {f"m{i}": _member(dedupe, topics, i, targets=targets[f"m{i}"], versions=(1, 1) if i == 0 else (1, 2)) for i in range(3)}
    members["m2"] = _member(dedupe, topics, 2, reason=MemberReason.SHUTDOWN, targets=targets["m2"])
    result = StickyTaskAssignor(dedupe, process_id=uuid.UUID(int=9)).assign(AssignmentSpec(members=members, topics=topics))
    for mid, member in result.members.items():
        decoded = decode_assignment_metadata(member.metadata_version, member.metadata)
        assert decoded.error == AssignmentError.SHUTDOWN
        assert member.partitions == targets[mid]  # nothing moves while the app stops
    # The member's assignor reports it to the worker as the error.
    seen = []
    worker = StickyTaskAssignor(dedupe, process_id=uuid.UUID(int=1), on_assignment=lambda error, meta, epoch: seen.append(error))
    worker.on_assignment(0, result.members["m0"], 7)
    assert seen == [AssignmentError.SHUTDOWN] and worker.latest_error == AssignmentError.SHUTDOWN


def test_assignor_standbys_and_lags_through_metadata(dedupe):
    """Lags travel as task-id strings; the owner keeps a task its new target has no state for."""
    topics = _topics(dedupe)
    ha = HaConfig(num_standby_replicas=1, max_warmup_replicas=1)
    assignor = StickyTaskAssignor(dedupe, process_id=uuid.UUID(int=9), ha=ha)
    first = assignor.assign(AssignmentSpec(members={f"m{i}": _member(dedupe, topics, i) for i in range(2)}, topics=topics))
    decoded = {mid: decode_assignment_metadata(m.metadata_version, m.metadata) for mid, m in first.members.items()}
    lags = {mid: {str(t): 0 for t in d.active_task_ids()} | {str(t): 20 for t in d.standby_task_ids()} for mid, d in decoded.items()}
    members = {mid: _member(dedupe, topics, i, lags=lags[mid], targets=first.members[mid].partitions) for i, mid in enumerate(["m0", "m1"])}
    members["m2"] = _member(dedupe, topics, 2)
    second = assignor.assign(AssignmentSpec(members=members, topics=topics))
    after = {mid: decode_assignment_metadata(m.metadata_version, m.metadata) for mid, m in second.members.items()}
    assert after["m2"].active_task_ids() == []
    assert len(after["m2"].warmup_task_ids()) + len(after["m2"].standby_task_ids()) >= 1
    for mid in ("m0", "m1"):
        assert after[mid].active_task_ids() == decoded[mid].active_task_ids()
