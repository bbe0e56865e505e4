"""The ``uniform`` server-side assignor (KIP-848 "Server Side Mode"): balanced, then sticky.

Balance comes first: members with identical subscriptions end up with partition counts that
differ by at most one, and with mixed subscriptions no partition could be shifted (directly or
along a chain of members) from a member to one holding two fewer. Within that, each member keeps
as much of its current *target* as it can, so a join moves about ``P / (N + 1)`` partitions and
a leave moves only the leaver's partitions.

The result is a pure function of the spec: members are handled in member-id order, topics in
(name, id) order and partitions in ascending order, never in dict or hash order.

Members are split into independent components (members whose subscriptions share no topic with
each other's). A component where everyone subscribes to the same topics -- the common case --
takes the homogeneous path, which works on whole topics and lists instead of per-partition
objects. Any other component takes the general path.

Homogeneous rule (reproduces the KIP-848 case studies):

1. ``quota, extra = divmod(P, N)``: every member gets ``quota`` partitions and ``extra``
   members get one more. The extra slots go first, in member-id order, to members that
   already hold more than ``quota`` (so they keep it), then to the first members by id.
2. A member keeps its current target partitions in ascending (topic, partition) order up to
   its quota. Partitions of topics it no longer subscribes to, of deleted topics, beyond the
   topic's partition count, or already claimed by a member earlier in id order are dropped.
3. The freed partitions, in ascending order, fill the members below their quota one member
   at a time in member-id order (as Kafka's homogeneous builder does), so each member gets
   contiguous runs rather than a scatter over many topics.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Mapping, Sequence
from itertools import repeat
from operator import add, sub
from uuid import UUID

from .api import (
    EMPTY_PARTITIONS,
    AssignmentSpec,
    GroupAssignment,
    MemberAssignment,
    Partitions,
    TopicMetadata,
)

__all__ = ["UniformAssignor"]


class UniformAssignor:
    """KIP-848's ``uniform`` assignor. Stateless: one instance can serve every group."""

    name = "uniform"

    def assign(self, spec: AssignmentSpec) -> GroupAssignment:
        member_ids = sorted(spec.members)
        grouped = members_by_subscription(spec, member_ids)
        subscription_of: dict[str, frozenset[UUID]] | None = None  # only the general path needs it
        assigned: dict[str, Partitions] = {}
        for component_members, component_topics, homogeneous in subscription_components(grouped):
            ordered_topics = sorted(component_topics, key=lambda t: (spec.topics[t].name, t))
            if homogeneous:
                partitions = _assign_homogeneous(spec, component_members, ordered_topics)
            else:
                if subscription_of is None:
                    subscription_of = {m: subscription for subscription, group in grouped.items() for m in group}
                partitions = _assign_heterogeneous(spec, component_members, ordered_topics, subscription_of)
            assigned.update(zip(component_members, partitions))
        return GroupAssignment(members={member_id: MemberAssignment(partitions=assigned.get(member_id, EMPTY_PARTITIONS)) for member_id in member_ids})


# --------------------------------------------------------------------------- subscriptions


def members_by_subscription(spec: AssignmentSpec, member_ids: Sequence[str]) -> dict[frozenset[UUID], list[str]]:
    """Members (in the given order) grouped by their subscribed topics that exist in ``spec.topics``.

    Members subscribed to nothing that exists are left out: they get nothing. Members usually
    share equal subscription sets, so each distinct set is intersected with the topics once
    (frozensets cache their hash, so the lookups are cheap).
    """
    topics = spec.topics.keys()
    members = spec.members
    effective_of: dict[frozenset[UUID], frozenset[UUID]] = {}
    grouped: dict[frozenset[UUID], list[str]] = {}
    last_subscribed: frozenset[UUID] | None = None
    last_group: list[str] = []
    for member_id in member_ids:
        subscribed = members[member_id].subscribed_topic_ids
        if subscribed is last_subscribed:  # shortcut: neighbours often share one set object
            last_group.append(member_id)
            continue
        effective = effective_of.get(subscribed)
        if effective is None:
            effective = subscribed if topics >= subscribed else frozenset(subscribed & topics)
            effective_of[subscribed] = effective
        if effective:
            group = grouped.setdefault(effective, [])
            group.append(member_id)
            last_subscribed, last_group = subscribed, group
        else:
            last_subscribed, last_group = subscribed, []  # a throwaway list: not assigned
    return grouped


def subscription_components(
    grouped: Mapping[frozenset[UUID], list[str]],
) -> Iterator[tuple[list[str], frozenset[UUID], bool]]:
    """Split subscription groups into components that share no topic: (member ids, topics,
    homogeneous?). Member ids come out sorted if they went in sorted."""
    distinct = list(grouped)

    # Union-find over the distinct subscriptions, joined through shared topics.
    parent = list(range(len(distinct)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first_subscription_of_topic: dict[UUID, int] = {}
    for index, subscription in enumerate(distinct):
        for topic_id in subscription:
            other = first_subscription_of_topic.setdefault(topic_id, index)
            if other != index:
                parent[root(index)] = root(other)

    components: dict[int, list[int]] = {}
    for index in range(len(distinct)):
        components.setdefault(root(index), []).append(index)
    for indexes in components.values():
        if len(indexes) == 1:
            subscription = distinct[indexes[0]]
            yield grouped[subscription], subscription, True
        else:
            members = sorted(m for i in indexes for m in grouped[distinct[i]])
            topics = frozenset().union(*(distinct[i] for i in indexes))
            yield members, topics, False


# --------------------------------------------------------------------------- homogeneous path


def _assign_homogeneous(spec: AssignmentSpec, member_ids: list[str], topic_ids: list[UUID]) -> list[Partitions]:
    """Assign the topics to members who all subscribe to exactly these topics.

    Partitions are numbered globally (topic offset + partition) so that "ascending (topic,
    partition) order" is integer order and the freed partitions are one sorted list.
    Cost: O(M + T + size of the targets + partitions that move), plus O(P) set work in C for
    topics that have unassigned partitions.
    """
    sizes = [spec.topics[t].num_partitions for t in topic_ids]
    offsets = [0]
    for size in sizes:
        offsets.append(offsets[-1] + size)
    total = offsets[-1]
    topic_index = {topic_id: index for index, topic_id in enumerate(topic_ids)}
    members = spec.members
    member_count = len(member_ids)

    # 1. Valid current targets, claimed in member-id order.
    claimed: list[set[int]] = [set() for _ in topic_ids]
    valid_targets: list[Partitions] = []
    valid_counts: list[int] = []
    index_of = topic_index.get
    for member_id in member_ids:
        target = members[member_id].target_partitions
        count = 0
        for topic_id, partitions in target.items():
            index = index_of(topic_id)
            if index is None or not partitions or not partitions.isdisjoint(claimed[index]) or min(partitions) < 0 or max(partitions) >= sizes[index]:
                break
            claimed[index].update(partitions)
            count += len(partitions)
        else:
            # All valid (the usual case): pass the member's own mapping through, uncopied.
            valid_targets.append(target)
            valid_counts.append(count)
            continue
        kept, count = _valid_part(target, count, topic_index, sizes, claimed)
        valid_targets.append(kept)
        valid_counts.append(count)

    # 2. Quotas: extra slots first to members that already hold more than the minimum.
    quota, extra = divmod(total, member_count)
    caps = [quota] * member_count
    if extra:
        for position, count in enumerate(valid_counts):
            if count > quota:
                caps[position] = quota + 1
                extra -= 1
                if not extra:
                    break
        if extra:
            for position in range(member_count):
                if caps[position] == quota:
                    caps[position] = quota + 1
                    extra -= 1
                    if not extra:
                        break

    # 3. Keep up to the quota, in ascending (topic, partition) order; release the rest.
    assignment = valid_targets  # updated in place from here on
    for position, count in enumerate(valid_counts):
        if count > caps[position]:
            kept, released = _keep_lowest(assignment[position], caps[position], topic_index)
            assignment[position] = kept
            for index, partitions in released:
                claimed[index].difference_update(partitions)
            valid_counts[position] = caps[position]

    # 4. Freed partitions (never assigned, or released above), ascending, numbered globally.
    freed: list[int] = []
    for index, size in enumerate(sizes):
        taken = claimed[index]
        if len(taken) == size:
            continue
        offset = offsets[index]
        if not taken:
            freed.extend(range(offset, offset + size))
        else:
            free = sorted(set(range(size)).difference(taken))
            freed.extend(map(add, free, repeat(offset)))

    # 5. Fill members below their quota one at a time, in member-id order.
    start = 0
    for position in range(member_count):
        missing = caps[position] - valid_counts[position]
        if missing <= 0:
            continue
        received = freed[start : start + missing]
        start += missing
        assignment[position] = _merge_global(assignment[position], received, offsets, topic_ids)
    if start != len(freed):  # unreachable if the quota arithmetic is right; never lose partitions
        raise AssertionError(f"uniform: {len(freed) - start} partitions left unassigned")
    return assignment


def _valid_part(
    target: Partitions,
    checked_count: int,
    topic_index: Mapping[UUID, int],
    sizes: list[int],
    claimed: list[set[int]],
) -> tuple[dict[UUID, frozenset[int]], int]:
    """The valid part of ``target``, whose leading entries (``checked_count`` partitions in all)
    were found valid and claimed already: drop unknown topics, partitions that no longer exist
    and partitions claimed by an earlier member, and claim the rest."""
    kept: dict[UUID, frozenset[int]] = {}
    count = 0
    for topic_id, partitions in target.items():
        if count < checked_count:
            kept[topic_id] = partitions
            count += len(partitions)
            continue
        index = topic_index.get(topic_id)
        if index is None:
            continue
        size, taken = sizes[index], claimed[index]
        valid = frozenset(p for p in partitions if 0 <= p < size and p not in taken)
        if valid:
            taken.update(valid)
            kept[topic_id] = valid
            count += len(valid)
    return kept, count


def _keep_lowest(target: Partitions, cap: int, topic_index: Mapping[UUID, int]) -> tuple[dict[UUID, frozenset[int]], list[tuple[int, list[int]]]]:
    """Keep the ``cap`` lowest (topic, partition) pairs of ``target``; return kept, released."""
    kept: dict[UUID, frozenset[int]] = {}
    released: list[tuple[int, list[int]]] = []
    room = cap
    for topic_id, partitions in sorted(target.items(), key=lambda item: topic_index[item[0]]):
        index = topic_index[topic_id]
        if room >= len(partitions):
            kept[topic_id] = partitions
            room -= len(partitions)
        elif room:
            ordered = sorted(partitions)
            kept[topic_id] = frozenset(ordered[:room])
            released.append((index, ordered[room:]))
            room = 0
        else:
            released.append((index, list(partitions)))
    return kept, released


def _merge_global(kept: Partitions, received: list[int], offsets: list[int], topic_ids: list[UUID]) -> dict[UUID, frozenset[int]]:
    """``kept`` plus ``received`` (ascending global partition numbers), keyed by topic."""
    first, last = received[0], received[-1]
    index = bisect_right(offsets, first) - 1
    if not kept and last < offsets[index + 1] and last - first == len(received) - 1:
        # The usual shape on a fresh group: one contiguous run inside one topic.
        offset = offsets[index]
        return {topic_ids[index]: frozenset(range(first - offset, last - offset + 1))}
    merged = dict(kept)
    position, end = 0, len(received)
    while position < end:
        first = received[position]
        index = bisect_right(offsets, first) - 1
        offset, limit = offsets[index], offsets[index + 1]
        run_end = end if received[-1] < limit else bisect_left(received, limit, position)
        last = received[run_end - 1]
        if last - first == run_end - 1 - position:  # a contiguous run: build from a range
            partitions = frozenset(range(first - offset, last - offset + 1))
        else:
            partitions = frozenset(map(sub, received[position:run_end], repeat(offset)))
        topic_id = topic_ids[index]
        if kept and topic_id in merged:
            partitions |= merged[topic_id]
        merged[topic_id] = partitions
        position = run_end
    return merged


# --------------------------------------------------------------------------- general path


def _assign_heterogeneous(
    spec: AssignmentSpec,
    member_ids: list[str],
    topic_ids: list[UUID],
    subscriptions: Mapping[str, frozenset[UUID]],
) -> list[Partitions]:
    """Assign topics to members with differing (overlapping) subscriptions.

    1. Keep every valid current target partition (same validity rules as the homogeneous path).
    2. Hand each unassigned partition, topic by topic (least-subscribed topics first), to the
       subscriber with the fewest partitions, ties by member id.
    3. Balance: while some member can pass a partition, directly or along a chain of members
       each passing one partition of a topic the next subscribes to, to a member holding at
       least two fewer, do so -- starting from the fullest member and preferring the shortest
       chain and the emptiest receiver. Each member on the chain other than the ends keeps its
       count, so every step strictly evens the counts and the loop ends; when it ends the
       assignment is as balanced as the subscriptions allow, and re-running it on its own
       output moves nothing.

    Cost: step 3 is O(M log M + sum of subscriptions) per chain; chains are only needed for
    imbalance that steps 1-2 could not avoid (joins, subscription changes).
    """
    topics: Mapping[UUID, TopicMetadata] = spec.topics
    topic_rank = {topic_id: rank for rank, topic_id in enumerate(topic_ids)}
    member_count = len(member_ids)
    subscribers: dict[UUID, list[int]] = {topic_id: [] for topic_id in topic_ids}
    member_topics: list[list[UUID]] = []
    for position, member_id in enumerate(member_ids):
        subscribed = sorted(subscriptions[member_id], key=topic_rank.__getitem__)
        member_topics.append(subscribed)
        for topic_id in subscribed:
            subscribers[topic_id].append(position)

    # 1. Keep valid targets.
    owned: list[dict[UUID, set[int]]] = [{} for _ in member_ids]
    previous: list[Partitions] = []
    counts = [0] * member_count
    claimed: dict[UUID, set[int]] = {topic_id: set() for topic_id in topic_ids}
    for position, member_id in enumerate(member_ids):
        subscribed = subscriptions[member_id]
        target = spec.members[member_id].target_partitions
        previous.append(target)
        for topic_id, partitions in target.items():
            if topic_id not in subscribed:
                continue
            size = topics[topic_id].num_partitions
            taken = claimed[topic_id]
            valid = {p for p in partitions if 0 <= p < size and p not in taken}
            if valid:
                taken.update(valid)
                owned[position][topic_id] = valid
                counts[position] += len(valid)

    # 2. Hand out unassigned partitions, most constrained topics first.
    for topic_id in sorted(topic_ids, key=lambda t: (len(subscribers[t]), topic_rank[t])):
        size = topics[topic_id].num_partitions
        taken = claimed[topic_id]
        if len(taken) == size:
            continue
        free = range(size) if not taken else sorted(set(range(size)).difference(taken))
        fewest_first = [(counts[position], position) for position in subscribers[topic_id]]
        heapq.heapify(fewest_first)
        for partition in free:
            count, position = fewest_first[0]
            owned[position].setdefault(topic_id, set()).add(partition)
            counts[position] = count + 1
            heapq.heapreplace(fewest_first, (count + 1, position))

    # 3. Balance along chains.
    while (chain := _find_evening_chain(counts, owned, subscribers, topic_rank)) is not None:
        _shift_along(chain, counts, owned, previous)

    return [{t: frozenset(ps) for t, ps in sorted(held.items(), key=lambda item: topic_rank[item[0]]) if ps} for held in owned]


Chain = list[tuple[int, UUID, int]]  # (giver, topic, receiver) steps, fullest member first


def _find_evening_chain(
    counts: list[int],
    owned: list[dict[UUID, set[int]]],
    subscribers: Mapping[UUID, list[int]],
    topic_rank: Mapping[UUID, int],
) -> Chain | None:
    """A shortest chain from a fullest-possible member to one holding at least two fewer.

    One breadth-first sweep over the members from the fullest down: a member reached from a
    fuller one needs no search of its own, since everything it reaches the fuller one reaches.
    """
    fewest = min(counts)
    reached = [False] * len(counts)
    via: dict[int, tuple[int, UUID]] = {}
    expanded_topics: set[UUID] = set()
    for source in sorted(range(len(counts)), key=lambda position: (-counts[position], position)):
        if counts[source] - fewest < 2:
            return None
        if reached[source]:
            continue
        reached[source] = True
        frontier = [source]
        while frontier:
            next_frontier: list[int] = []
            best: int | None = None
            for giver in frontier:
                held = owned[giver]
                for topic_id in sorted(held, key=topic_rank.__getitem__):
                    if not held[topic_id] or topic_id in expanded_topics:
                        continue
                    expanded_topics.add(topic_id)
                    for receiver in subscribers[topic_id]:
                        if reached[receiver]:
                            continue
                        reached[receiver] = True
                        via[receiver] = (giver, topic_id)
                        next_frontier.append(receiver)
                        if counts[receiver] <= counts[source] - 2 and (best is None or (counts[receiver], receiver) < (counts[best], best)):
                            best = receiver
            if best is not None:
                chain: Chain = []
                receiver = best
                while receiver != source:
                    giver, topic_id = via[receiver]
                    chain.append((giver, topic_id, receiver))
                    receiver = giver
                chain.reverse()
                return chain
            frontier = next_frontier
    return None


def _shift_along(
    chain: Chain,
    counts: list[int],
    owned: list[dict[UUID, set[int]]],
    previous: list[Partitions],
) -> None:
    """Pass partitions along the chain: the first member loses them, the last gains them.

    Several at once when the first member stands well above everyone else, so a badly skewed
    start does not cost one sweep per partition; never so many that the receiver would end
    above the giver or the giver below the next-fullest member.
    """
    source, receiver = chain[0][0], chain[-1][2]
    runner_up = max((c for position, c in enumerate(counts) if position != source), default=0)
    amount = min(
        (counts[source] - counts[receiver]) // 2,
        counts[source] - runner_up,
        min(len(owned[giver][topic_id]) for giver, topic_id, _ in chain),
    )
    amount = max(amount, 1)
    for giver, topic_id, taker in chain:
        held = owned[giver][topic_id]
        returning = previous[taker].get(topic_id, frozenset())
        staying = previous[giver].get(topic_id, frozenset())
        # Prefer partitions the taker held before, then ones the giver did not; highest first.
        ranked = sorted(held, key=lambda p: (p in returning, p not in staying, p), reverse=True)
        moving = ranked[:amount]
        held.difference_update(moving)
        owned[taker].setdefault(topic_id, set()).update(moving)
    counts[source] -= amount
    counts[receiver] += amount
