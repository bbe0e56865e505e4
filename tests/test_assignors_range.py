"""The ``range`` server-side assignor: Kafka's range layout, co-partitioning, stickiness that
never breaks either, and properties over random specs."""

from __future__ import annotations

import uuid
from collections.abc import Mapping

from assignor_support import PROPERTY_SETTINGS, member, moved, of_topic, topic_id, topics
from hypothesis import given
from hypothesis import strategies as st
from pystreams.assignors.api import (
    AssignmentSpec,
    GroupAssignment,
    MemberSpec,
    ServerAssignor,
    TopicMetadata,
)
from pystreams.assignors.range import RangeAssignor
from pystreams.assignors.server import server_assignor

FOO, BAR, BAZ, GONE = topic_id("foo"), topic_id("bar"), topic_id("baz"), topic_id("gone")


def assign(members: Mapping[str, MemberSpec], topic_metadata: Mapping[uuid.UUID, TopicMetadata]) -> GroupAssignment:
    return RangeAssignor().assign(AssignmentSpec(members=dict(members), topics=dict(topic_metadata)))


# --------------------------------------------------------------------------- layout


def test_kafkas_example_two_members_two_co_partitioned_topics():
    result = assign({"M1": member(FOO, BAR), "M0": member(FOO, BAR)}, topics(foo=3, bar=3))
    assert of_topic(result, FOO) == {"M0": [0, 1], "M1": [2]}
    assert of_topic(result, BAR) == {"M0": [0, 1], "M1": [2]}


def test_each_topic_is_cut_among_its_own_subscribers():
    result = assign({"A": member(FOO, BAR), "B": member(FOO), "C": member(BAR)}, topics(foo=4, bar=3))
    assert of_topic(result, FOO) == {"A": [0, 1], "B": [2, 3], "C": []}
    assert of_topic(result, BAR) == {"A": [0, 1], "B": [], "C": [2]}


def test_more_members_than_partitions_leaves_the_last_members_empty():
    result = assign({m: member(FOO) for m in "ABCD"}, topics(foo=2))
    assert of_topic(result, FOO) == {"A": [0], "B": [1], "C": [], "D": []}


def test_topics_with_different_partition_counts_are_cut_separately():
    result = assign({"A": member(FOO, BAR), "B": member(FOO, BAR)}, topics(foo=4, bar=3))
    assert of_topic(result, FOO) == {"A": [0, 1], "B": [2, 3]}
    assert of_topic(result, BAR) == {"A": [0, 1], "B": [2]}


def test_missing_topics_deleted_targets_and_unsubscribed_topics_are_ignored():
    result = assign(
        {"A": member(FOO, GONE, target={GONE: [0], FOO: [7]}), "B": member(FOO, target={BAR: [0]})},
        topics(foo=2, bar=2),
    )
    assert {m: dict(a.partitions) for m, a in result.members.items()} == {
        "A": {FOO: frozenset({0})},
        "B": {FOO: frozenset({1})},
    }


def test_empty_group_and_members_without_subscriptions():
    assert assign({}, topics(foo=1)).members == {}
    result = assign({"A": member(), "B": member(GONE)}, topics(foo=1))
    assert {m: dict(a.partitions) for m, a in result.members.items()} == {"A": {}, "B": {}}


# --------------------------------------------------------------------------- stickiness


def test_a_leave_at_the_end_lets_the_neighbour_take_the_longer_range():
    result = assign({"A": member(FOO, target={FOO: [0, 1, 2]}), "B": member(FOO, target={FOO: [3, 4]})}, topics(foo=7))
    assert of_topic(result, FOO) == {"A": [0, 1, 2], "B": [3, 4, 5, 6]}


def test_a_leave_in_the_middle_is_absorbed_by_a_longer_range_before_the_gap():
    # 9 partitions, 3 members -> 2 members after D leaves: 5 + 4; B absorbs D's partitions.
    before = {"B": member(FOO, target={FOO: [0, 1, 2]}), "C": member(FOO, target={FOO: [6, 7, 8]})}
    result = assign(before, topics(foo=9))
    assert of_topic(result, FOO) == {"B": [0, 1, 2, 3, 4], "C": [5, 6, 7, 8]}


def test_a_newcomer_fills_the_gap_that_keeps_the_next_member_in_place():
    # 7 partitions for 3: the newcomer C sorts last by id but takes [3, 4] so B keeps [5, 6].
    result = assign(
        {"A": member(FOO, target={FOO: [0, 1, 2, 3]}), "B": member(FOO, target={FOO: [4, 5, 6]}), "C": member(FOO)},
        topics(foo=7),
    )
    assert of_topic(result, FOO) == {"A": [0, 1, 2], "B": [5, 6], "C": [3, 4]}


def test_a_member_replacing_another_with_its_target_takes_its_place():
    # A static member rejoining under a new member id inherits its predecessor's target.
    result = assign(
        {
            "A": member(FOO, BAR, target={FOO: [0, 1], BAR: [0, 1]}),
            "Z": member(FOO, BAR, target={FOO: [2, 3], BAR: [2, 3]}),
            "C": member(FOO, BAR, target={FOO: [4, 5], BAR: [4, 5]}),
        },
        topics(foo=6, bar=6),
    )
    assert of_topic(result, FOO) == of_topic(result, BAR) == {"A": [0, 1], "Z": [2, 3], "C": [4, 5]}


def test_stickiness_never_breaks_co_partitioning():
    # Targets that disagree between two co-partitioned topics: both still get identical ranges.
    result = assign(
        {"A": member(FOO, BAR, target={FOO: [2, 3], BAR: [0, 1]}), "B": member(FOO, BAR, target={FOO: [0, 1]})},
        topics(foo=4, bar=4),
    )
    assert of_topic(result, FOO) == of_topic(result, BAR)


def test_registry_serves_the_range_assignor():
    assignor = server_assignor("range")
    assert isinstance(assignor, RangeAssignor) and isinstance(assignor, ServerAssignor)
    assert assignor.name == "range"


# --------------------------------------------------------------------------- properties


@st.composite
def specs(draw: st.DrawFn, with_targets: bool = True) -> AssignmentSpec:
    """Random groups: 0-30 members, 0-5 topics, random subscriptions (maybe to a deleted topic)
    and random, possibly stale or conflicting, targets. Partition counts come from a short list
    (0-20) so that topics with equal counts -- co-partitioned ones -- are common."""
    topic_metadata = {
        topic_id(f"t{i}"): TopicMetadata(topic_id(f"t{i}"), f"t{i}", draw(st.sampled_from([0, 1, 3, 6, 7, 20]))) for i in range(draw(st.integers(0, 5)))
    }
    universe = [*sorted(topic_metadata, key=str), GONE]
    names = draw(st.lists(st.text("abcdefghij", min_size=1, max_size=3), max_size=30, unique=True))
    # A few distinct subscriptions, so several members share each.
    subscriptions = draw(st.lists(st.frozensets(st.sampled_from(universe)), min_size=1, max_size=3))
    members = {}
    for name in names:
        target = {}
        if with_targets:
            for t in draw(st.frozensets(st.sampled_from(universe), max_size=3)):
                size = topic_metadata[t].num_partitions if t in topic_metadata else 4
                partitions = draw(st.frozensets(st.integers(0, size + 2), max_size=6))
                if partitions:
                    target[t] = partitions
        members[name] = MemberSpec(subscribed_topic_ids=draw(st.sampled_from(subscriptions)), target_partitions=target)
    return AssignmentSpec(members=members, topics=topic_metadata)


def subscribers_of(spec: AssignmentSpec) -> dict[uuid.UUID, frozenset[str]]:
    return {t: frozenset(m for m, s in spec.members.items() if t in s.subscribed_topic_ids) for t in spec.topics}


def with_targets_from(spec: AssignmentSpec, result: GroupAssignment) -> AssignmentSpec:
    return AssignmentSpec(
        members={m: MemberSpec(subscribed_topic_ids=s.subscribed_topic_ids, target_partitions=result.members[m].partitions) for m, s in spec.members.items()},
        topics=spec.topics,
    )


@PROPERTY_SETTINGS
@given(specs())
def test_every_subscribed_partition_is_assigned_exactly_once_and_only_to_subscribers(spec):
    result = RangeAssignor().assign(spec)
    assert set(result.members) == set(spec.members)
    subscribers = subscribers_of(spec)
    owners: dict[tuple[uuid.UUID, int], str] = {}
    for member_id, assignment in result.members.items():
        for t, partitions in assignment.partitions.items():
            assert member_id in subscribers[t]
            assert partitions and isinstance(partitions, frozenset)
            for p in partitions:
                assert 0 <= p < spec.topics[t].num_partitions
                assert (t, p) not in owners
                owners[(t, p)] = member_id
    expected = {(t, p) for t, ms in subscribers.items() if ms for p in range(spec.topics[t].num_partitions)}
    assert set(owners) == expected


@PROPERTY_SETTINGS
@given(specs())
def test_each_topic_is_cut_into_contiguous_ranges_differing_by_at_most_one(spec):
    result = RangeAssignor().assign(spec)
    for t, members in subscribers_of(spec).items():
        sizes = []
        for member_id in members:
            partitions = sorted(result.members[member_id].partitions.get(t, ()))
            if partitions:
                assert partitions == list(range(partitions[0], partitions[-1] + 1)), "not contiguous"
            sizes.append(len(partitions))
        if sizes:
            assert max(sizes) - min(sizes) <= 1


@PROPERTY_SETTINGS
@given(specs())
def test_topics_with_the_same_subscribers_and_partition_count_are_co_partitioned(spec):
    result = RangeAssignor().assign(spec)
    subscribers = subscribers_of(spec)
    for first in spec.topics:
        for second in spec.topics:
            if subscribers[first] == subscribers[second] and (spec.topics[first].num_partitions == spec.topics[second].num_partitions):
                for member_id in subscribers[first]:
                    held = result.members[member_id].partitions
                    assert held.get(first, frozenset()) == held.get(second, frozenset())


@PROPERTY_SETTINGS
@given(specs(with_targets=False))
def test_without_targets_the_layout_is_kafkas_range_in_member_id_order(spec):
    result = RangeAssignor().assign(spec)
    for t, members in subscribers_of(spec).items():
        ordered = sorted(members)
        if not ordered:
            continue
        base, longer = divmod(spec.topics[t].num_partitions, len(ordered))
        first = 0
        for index, member_id in enumerate(ordered):
            width = base + (index < longer)
            assert sorted(result.members[member_id].partitions.get(t, ())) == list(range(first, first + width))
            first += width


@PROPERTY_SETTINGS
@given(specs())
def test_result_does_not_depend_on_dict_order(spec):
    reordered = AssignmentSpec(members=dict(reversed(list(spec.members.items()))), topics=dict(reversed(list(spec.topics.items()))))
    assert RangeAssignor().assign(spec) == RangeAssignor().assign(reordered)


@PROPERTY_SETTINGS
@given(specs())
def test_reassigning_its_own_result_moves_nothing(spec):
    result = RangeAssignor().assign(spec)
    assert RangeAssignor().assign(with_targets_from(spec, result)) == result


@PROPERTY_SETTINGS
@given(
    st.lists(st.text("abcdef", min_size=1, max_size=2), min_size=1, max_size=12, unique=True),
    st.integers(0, 40),
    st.lists(st.tuples(st.booleans(), st.integers(0, 99)), min_size=1, max_size=5),
)
def test_joins_and_leaves_never_move_more_than_recutting_in_member_id_order(names, partition_count, changes):
    """Stickiness is never worse than Kafka's plain layout, over a run of joins and leaves."""
    two_topics = topics(foo=partition_count, bar=partition_count)
    current = {m: a.partitions for m, a in assign({m: member(FOO, BAR) for m in names}, two_topics).members.items()}
    for joins, number in changes:
        if joins and f"j{number}" not in current:
            members = {**{m: member(FOO, BAR, target=p) for m, p in current.items()}, f"j{number}": member(FOO, BAR)}
        elif not joins and len(current) > 1:
            leaver = sorted(current)[number % len(current)]
            members = {m: member(FOO, BAR, target=p) for m, p in current.items() if m != leaver}
        else:
            continue
        after = {m: a.partitions for m, a in assign(members, two_topics).members.items()}
        recut = {m: a.partitions for m, a in assign({m: member(FOO, BAR) for m in members}, two_topics).members.items()}
        assert moved(current, after) <= moved(current, recut)
        current = after
