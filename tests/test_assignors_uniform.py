"""The ``uniform`` server-side assignor: the KIP-848 case studies, edge cases, and properties
over random specs (validity, balance, determinism, stickiness)."""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterable, Mapping

import pytest
from assignor_support import PROPERTY_SETTINGS, member, moved, of_topic, topic_id, topics
from hypothesis import given
from hypothesis import strategies as st
from pystreams.assignors.api import (
    AssignmentSpec,
    GroupAssignment,
    MemberSpec,
    Partitions,
    ServerAssignor,
    TopicMetadata,
)
from pystreams.assignors.server import (
    DEFAULT_SERVER_ASSIGNOR,
    SERVER_ASSIGNORS,
    UnknownServerAssignorError,
    server_assignor,
)
from pystreams.assignors.uniform import UniformAssignor

FOO, BAR, GONE = topic_id("foo"), topic_id("bar"), topic_id("gone")


def assign(members: Mapping[str, MemberSpec], topic_metadata: Mapping[uuid.UUID, TopicMetadata]) -> GroupAssignment:
    return UniformAssignor().assign(AssignmentSpec(members=dict(members), topics=dict(topic_metadata)))


def partitions_of(result: GroupAssignment) -> dict[str, Partitions]:
    return {member_id: assignment.partitions for member_id, assignment in result.members.items()}


def follow_up(previous: GroupAssignment, subscribed: Iterable[uuid.UUID], *new_members: str) -> dict[str, MemberSpec]:
    """The next spec of a case study: every member keeps its target, plus joining members."""
    subscription = frozenset(subscribed)
    specs = {m: MemberSpec(subscribed_topic_ids=subscription, target_partitions=a.partitions) for m, a in previous.members.items()}
    specs.update({m: MemberSpec(subscribed_topic_ids=subscription) for m in new_members})
    return specs


# --------------------------------------------------------------------------- KIP-848 case studies


def test_basic_case_study_a_then_b_then_c_join_a_three_partition_topic():
    foo = topics(foo=3)
    alone = assign({"A": member(FOO)}, foo)
    assert of_topic(alone, FOO) == {"A": [0, 1, 2]}

    with_b = assign(follow_up(alone, [FOO], "B"), foo)
    assert of_topic(with_b, FOO) == {"A": [0, 1], "B": [2]}

    with_c = assign(follow_up(with_b, [FOO], "C"), foo)
    assert of_topic(with_c, FOO) == {"A": [0], "B": [2], "C": [1]}


def test_incremental_case_study_c_joins_two_members_with_six_partitions():
    result = assign(
        {"A": member(FOO, target={FOO: [0, 1, 2]}), "B": member(FOO, target={FOO: [3, 4, 5]}), "C": member(FOO)},
        topics(foo=6),
    )
    assert of_topic(result, FOO) == {"A": [0, 1], "B": [3, 4], "C": [2, 5]}


def test_member_failure_case_study_a_leaves_and_its_partitions_go_to_b_then_c():
    result = assign(
        {"B": member(FOO, target={FOO: [3, 4]}), "C": member(FOO, target={FOO: [2, 5]})},
        topics(foo=6),
    )
    assert of_topic(result, FOO) == {"B": [0, 3, 4], "C": [1, 2, 5]}


def test_partition_added_case_study_new_partition_goes_to_the_empty_member():
    result = assign({"A": member(FOO, target={FOO: [0]}), "B": member(FOO)}, topics(foo=2))
    assert of_topic(result, FOO) == {"A": [0], "B": [1]}


# --------------------------------------------------------------------------- rules


def test_fresh_group_fills_members_in_id_order_with_contiguous_runs_across_topics():
    # 8 partitions for 3 members: 3, 3, 2, filled in (topic name, partition) order.
    result = assign({"C": member(FOO, BAR), "A": member(FOO, BAR), "B": member(FOO, BAR)}, topics(bar=4, foo=4))
    assert of_topic(result, BAR) == {"A": [0, 1, 2], "B": [3], "C": []}
    assert of_topic(result, FOO) == {"A": [], "B": [0, 1], "C": [2, 3]}


def test_extra_partition_stays_with_a_member_that_already_holds_more_than_the_minimum():
    # 5 partitions, 2 members: one gets 3. B holds 3 now, so B keeps them although A sorts first.
    result = assign({"A": member(FOO, target={FOO: [0, 1]}), "B": member(FOO, target={FOO: [2, 3, 4]})}, topics(foo=5))
    assert of_topic(result, FOO) == {"A": [0, 1], "B": [2, 3, 4]}


def test_every_member_appears_even_with_nothing_to_get():
    result = assign({"A": member(FOO), "B": member(FOO), "C": member(BAR), "D": member()}, topics(foo=1))
    assert of_topic(result, FOO) == {"A": [0], "B": [], "C": [], "D": []}
    assert all(not a.partitions for m, a in result.members.items() if m != "A")


def test_empty_group_gets_an_empty_assignment():
    assert assign({}, topics(foo=3)).members == {}


def test_partitions_of_deleted_topics_and_beyond_the_partition_count_are_dropped():
    result = assign(
        {"A": member(FOO, GONE, target={FOO: [0, 1, 5], GONE: [0]}), "B": member(FOO, target={FOO: [2]})},
        topics(foo=3),
    )
    assert partitions_of(result) == {"A": {FOO: frozenset({0, 1})}, "B": {FOO: frozenset({2})}}


def test_partitions_of_unsubscribed_topics_are_revoked_and_left_to_subscribers():
    # A no longer subscribes to bar: B, the only subscriber, takes it, then hands foo-1 to A
    # to even the counts (2 and 2).
    result = assign(
        {"A": member(FOO, target={FOO: [0], BAR: [0, 1]}), "B": member(FOO, BAR, target={FOO: [1]})},
        topics(foo=2, bar=2),
    )
    assert partitions_of(result) == {"A": {FOO: frozenset({0, 1})}, "B": {BAR: frozenset({0, 1})}}


def test_a_partition_claimed_by_two_members_stays_with_the_first_by_member_id():
    result = assign({"B": member(FOO, target={FOO: [0]}), "A": member(FOO, target={FOO: [0]})}, topics(foo=2))
    assert of_topic(result, FOO) == {"A": [0], "B": [1]}


def test_members_with_disjoint_subscriptions_are_balanced_separately():
    result = assign(
        {"A": member(FOO), "B": member(FOO), "C": member(BAR)},
        topics(foo=4, bar=2),
    )
    assert partitions_of(result) == {
        "A": {FOO: frozenset({0, 1})},
        "B": {FOO: frozenset({2, 3})},
        "C": {BAR: frozenset({0, 1})},
    }


def test_mixed_subscriptions_hand_out_the_most_constrained_topic_first():
    # bar has one subscriber (A), so A takes it and B gets foo: 2 and 2.
    result = assign({"A": member(FOO, BAR), "B": member(FOO)}, topics(foo=2, bar=2))
    assert partitions_of(result) == {"A": {BAR: frozenset({0, 1})}, "B": {FOO: frozenset({0, 1})}}


def test_mixed_subscriptions_balance_along_a_chain_of_members():
    # A can only take foo, which B holds; B can take bar, which C holds. Balance needs
    # C -> B (bar) and B -> A (foo): 2 + 2 moves, the fewest possible.
    before = {
        "A": member(FOO),
        "B": member(FOO, BAR, target={FOO: [0, 1]}),
        "C": member(BAR, target={BAR: [0, 1, 2, 3]}),
    }
    result = assign(before, topics(foo=2, bar=4))
    held = partitions_of(result)
    assert sorted(sum(map(len, p.values())) for p in held.values()) == [2, 2, 2]
    assert set(held["A"]) == {FOO} and set(held["C"]) == {BAR}
    assert moved({m: s.target_partitions for m, s in before.items()}, held) == 4


# --------------------------------------------------------------------------- registry


def test_registry_offers_both_kip_848_server_assignors_with_uniform_first():
    assert list(SERVER_ASSIGNORS) == ["uniform", "range"]
    assert DEFAULT_SERVER_ASSIGNOR == "uniform"
    assignor = server_assignor("uniform")
    assert isinstance(assignor, UniformAssignor) and isinstance(assignor, ServerAssignor)
    assert assignor.name == "uniform"


def test_registry_rejects_unknown_names_listing_the_known_ones():
    with pytest.raises(UnknownServerAssignorError, match="'sticky'.*range, uniform"):
        server_assignor("sticky")


# --------------------------------------------------------------------------- properties


@st.composite
def specs(draw: st.DrawFn, homogeneous: bool = False) -> AssignmentSpec:
    """Random groups: 0-30 members, 0-5 topics of 0-20 partitions, random subscriptions (maybe
    to a deleted topic) and random, possibly stale or conflicting, target partitions."""
    topic_metadata = {topic_id(f"t{i}"): TopicMetadata(topic_id(f"t{i}"), f"t{i}", draw(st.integers(0, 20))) for i in range(draw(st.integers(0, 5)))}
    known = sorted(topic_metadata, key=str)
    universe = [*known, GONE]
    names = draw(st.lists(st.text("abcdefghij", min_size=1, max_size=3), max_size=30, unique=True))
    shared = draw(st.frozensets(st.sampled_from(universe)))
    members = {}
    for name in names:
        subscribed = shared if homogeneous else draw(st.frozensets(st.sampled_from(universe)))
        target = {}
        for t in draw(st.frozensets(st.sampled_from(universe), max_size=3)):
            size = topic_metadata[t].num_partitions if t in topic_metadata else 4
            partitions = draw(st.frozensets(st.integers(0, size + 2), max_size=6))
            if partitions:
                target[t] = partitions
        members[name] = MemberSpec(subscribed_topic_ids=subscribed, target_partitions=target)
    return AssignmentSpec(members=members, topics=topic_metadata)


def effective_subscription(spec: AssignmentSpec, member_id: str) -> frozenset[uuid.UUID]:
    return frozenset(spec.members[member_id].subscribed_topic_ids & spec.topics.keys())


def counts(result: GroupAssignment) -> dict[str, int]:
    return {m: sum(map(len, a.partitions.values())) for m, a in result.members.items()}


def assert_valid(spec: AssignmentSpec, result: GroupAssignment) -> None:
    """Everyone appears; members get only existing partitions of topics they subscribe to; every
    partition of a subscribed topic is assigned exactly once; others stay unassigned."""
    assert set(result.members) == set(spec.members)
    owners: dict[tuple[uuid.UUID, int], str] = {}
    for member_id, assignment in result.members.items():
        for t, partitions in assignment.partitions.items():
            assert t in effective_subscription(spec, member_id)
            assert partitions, "no empty partition sets in the result"
            assert isinstance(partitions, frozenset)
            for p in partitions:
                assert 0 <= p < spec.topics[t].num_partitions
                assert (t, p) not in owners, f"{t}-{p} assigned twice"
                owners[(t, p)] = member_id
    subscribed = set().union(*(effective_subscription(spec, m) for m in spec.members))
    expected = {(t, p) for t in subscribed for p in range(spec.topics[t].num_partitions)}
    assert set(owners) == expected


def with_targets(spec: AssignmentSpec, result: GroupAssignment) -> AssignmentSpec:
    return AssignmentSpec(
        members={m: MemberSpec(subscribed_topic_ids=s.subscribed_topic_ids, target_partitions=result.members[m].partitions) for m, s in spec.members.items()},
        topics=spec.topics,
    )


@PROPERTY_SETTINGS
@given(specs())
def test_every_subscribed_partition_is_assigned_exactly_once_and_only_to_subscribers(spec):
    assert_valid(spec, UniformAssignor().assign(spec))


@PROPERTY_SETTINGS
@given(specs())
def test_result_does_not_depend_on_dict_order(spec):
    reordered = AssignmentSpec(members=dict(reversed(list(spec.members.items()))), topics=dict(reversed(list(spec.topics.items()))))
    assert UniformAssignor().assign(spec) == UniformAssignor().assign(reordered)


@PROPERTY_SETTINGS
@given(specs())
def test_members_with_identical_subscriptions_differ_by_at_most_one_partition(spec):
    held = counts(UniformAssignor().assign(spec))
    by_subscription: dict[frozenset[uuid.UUID], list[int]] = {}
    for member_id in spec.members:
        by_subscription.setdefault(effective_subscription(spec, member_id), []).append(held[member_id])
    for subscription, group_counts in by_subscription.items():
        if subscription:
            assert max(group_counts) - min(group_counts) <= 1


@PROPERTY_SETTINGS
@given(specs())
def test_no_partition_could_move_along_any_chain_to_a_member_with_two_fewer(spec):
    """The balance optimum for mixed subscriptions: if some member could hand a partition,
    directly or through other members, to one holding two fewer, the result was not balanced."""
    result = UniformAssignor().assign(spec)
    held = counts(result)
    subscriptions = {m: effective_subscription(spec, m) for m in spec.members}
    can_give_to = {
        giver: {taker for taker in spec.members if taker != giver and subscriptions[taker] & set(a.partitions)} for giver, a in result.members.items()
    }
    for source in spec.members:
        reachable, stack = set(), [source]
        while stack:
            for taker in can_give_to[stack.pop()]:
                if taker not in reachable:
                    reachable.add(taker)
                    stack.append(taker)
        for taker in reachable:
            assert held[taker] >= held[source] - 1, (source, taker)


@PROPERTY_SETTINGS
@given(specs())
def test_reassigning_its_own_result_moves_nothing(spec):
    result = UniformAssignor().assign(spec)
    assert UniformAssignor().assign(with_targets(spec, result)) == result


@PROPERTY_SETTINGS
@given(specs(homogeneous=True), st.text("klmnop", min_size=1, max_size=3))
def test_a_join_moves_at_most_the_newcomers_fair_share(spec, newcomer):
    if newcomer in spec.members:
        return
    stable = with_targets(spec, UniformAssignor().assign(spec))
    subscription = next(iter(spec.members.values())).subscribed_topic_ids if spec.members else frozenset()
    joined = AssignmentSpec(members={**stable.members, newcomer: MemberSpec(subscribed_topic_ids=subscription)}, topics=spec.topics)
    after = UniformAssignor().assign(joined)
    assert_valid(joined, after)
    before = {m: s.target_partitions for m, s in stable.members.items()}
    total = sum(spec.topics[t].num_partitions for t in subscription & spec.topics.keys())
    assert moved(before, partitions_of(after)) <= math.ceil(total / (len(spec.members) + 1))


@PROPERTY_SETTINGS
@given(specs(homogeneous=True), st.data())
def test_a_leave_moves_only_the_leavers_partitions(spec, data):
    if not spec.members:
        return
    stable = with_targets(spec, UniformAssignor().assign(spec))
    leaver = data.draw(st.sampled_from(sorted(spec.members)))
    stayers = {m: s for m, s in stable.members.items() if m != leaver}
    after = UniformAssignor().assign(AssignmentSpec(members=stayers, topics=spec.topics))
    before = {m: s.target_partitions for m, s in stayers.items()}
    assert moved(before, partitions_of(after)) == 0
