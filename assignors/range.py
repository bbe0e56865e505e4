"""The ``range`` server-side assignor (KIP-848 "Server Side Mode"): co-partitioning first.

Like Kafka's RangeAssignor, each topic's subscribers get contiguous ranges of its partitions,
the first ranges one partition longer when the count does not divide evenly. Topics with the
same subscribers and the same partition count form one *co-partitioned class*: they are cut
into the same ranges, handed to the members in the same order, so a member gets the same
partition numbers of every topic in the class -- what joins of co-partitioned streams need.

Stickiness never breaks that. It only chooses, per class, the order of the members along the
partitions and which ranges are the longer ones:

* members that currently hold partitions of the class (their target partitions) keep their
  place: walking from partition 0, each takes the range where it sits now, the longer one if
  its holdings reach that far or if that absorbs a gap left by a member that went away. So an
  unchanged group gets back exactly its current ranges, a leave is usually absorbed by a
  neighbour, and a member that replaces another (a static member rejoining under a new member
  id, with its predecessor's target) takes its place;
* members holding nothing of the class fill gaps where that lets the next member keep more,
  and otherwise take the ranges at the end, in member-id order -- on a fresh group that is
  Kafka's plain member-id order, the first ranges being the longer ones;
* the walk is a heuristic, so the plain member-id layout is computed too and used whenever it
  keeps more of the members' current partitions: range is never less sticky than Kafka's.

Cost: O(M + T + size of the targets + the output), with one range per member and class shared
by every topic of the class.
"""

from __future__ import annotations

from collections import deque
from uuid import UUID

from .api import EMPTY_PARTITIONS, AssignmentSpec, GroupAssignment, MemberAssignment, Partitions

__all__ = ["RangeAssignor"]


class CoPartitionedClass:
    """Topics with the same subscribers and partition count: cut into the same ranges."""

    __slots__ = ("subscription_indexes", "size", "topics", "holdings")

    def __init__(self, subscription_indexes: tuple[int, ...], size: int) -> None:
        self.subscription_indexes = subscription_indexes  # which subscription sets contain them
        self.size = size
        self.topics: dict[UUID, None] = {}  # ordered by (name, id); a dict for dict.fromkeys
        #: member id -> [lowest partition held, most partitions held in one topic]
        self.holdings: dict[str, list[int]] = {}

    def note_holding(self, member_id: str, partitions: frozenset[int]) -> None:
        """Record that the member's target holds ``partitions`` of one topic of the class."""
        lowest, count = min(partitions), len(partitions)
        if lowest < 0 or max(partitions) >= self.size:  # ignore partitions that no longer exist
            still_there = [p for p in partitions if 0 <= p < self.size]
            if not still_there:
                return
            lowest, count = min(still_there), len(still_there)
        held = self.holdings.get(member_id)
        if held is None:
            self.holdings[member_id] = [lowest, count]
        else:
            held[0] = min(held[0], lowest)
            held[1] = max(held[1], count)


class RangeAssignor:
    """KIP-848's ``range`` assignor. Stateless: one instance can serve every group."""

    name = "range"

    def assign(self, spec: AssignmentSpec) -> GroupAssignment:
        member_ids = sorted(spec.members)
        topics = spec.topics
        members = spec.members

        # Members grouped by the subscribed topics that exist (most groups have one such set).
        effective_of: dict[frozenset[UUID], frozenset[UUID]] = {}
        subscription_of: dict[str, frozenset[UUID]] = {}
        members_by_subscription: dict[frozenset[UUID], list[str]] = {}
        for member_id in member_ids:
            subscribed = members[member_id].subscribed_topic_ids
            effective = effective_of.get(subscribed)
            if effective is None:
                effective = subscribed if topics.keys() >= subscribed else frozenset(subscribed & topics.keys())
                effective_of[subscribed] = effective
            subscription_of[member_id] = effective
            if effective:
                members_by_subscription.setdefault(effective, []).append(member_id)
        subscription_sets = list(members_by_subscription)

        # Co-partitioned classes: a topic's subscribers are the union of the subscription sets
        # that contain it, so (those sets, partition count) identifies its class.
        sets_of_topic: dict[UUID, list[int]] = {}
        for index, subscription in enumerate(subscription_sets):
            for topic_id in subscription:
                sets_of_topic.setdefault(topic_id, []).append(index)
        class_index: dict[tuple[tuple[int, ...], int], int] = {}
        classes: list[CoPartitionedClass] = []
        class_of_topic: dict[UUID, CoPartitionedClass] = {}
        for topic_id in sorted(sets_of_topic, key=lambda t: (topics[t].name, t)):
            size = topics[topic_id].num_partitions
            if size <= 0:
                continue
            key = (tuple(sets_of_topic[topic_id]), size)
            if key not in class_index:
                class_index[key] = len(classes)
                classes.append(CoPartitionedClass(key[0], size))
            klass = classes[class_index[key]]
            klass.topics[topic_id] = None
            class_of_topic[topic_id] = klass

        # Where each member sits in each class now: lowest partition held, most held in a topic.
        everyone_subscribes_alike = len(subscription_sets) == 1
        only_class = classes[0] if everyone_subscribes_alike and len(classes) == 1 else None
        # Targets this assignor made reuse the class's topic-id objects and one frozenset for
        # all of them: recognise those by identity, in C, instead of hashing every UUID.
        only_class_topic_objects = {id(t) for t in only_class.topics} if only_class else set()
        for member_id in member_ids:
            subscribed = subscription_of[member_id]
            target = members[member_id].target_partitions
            if not subscribed or not target:
                continue
            if only_class is not None:
                held = list(target.values())
                if held.count(held[0]) == len(held) and only_class_topic_objects.issuperset(map(id, target)):
                    if held[0]:
                        only_class.note_holding(member_id, held[0])
                    continue
            seen_partitions: frozenset[int] | None = None
            seen_class: CoPartitionedClass | None = None
            for topic_id, partitions in target.items():
                klass = class_of_topic.get(topic_id)
                if klass is None or not partitions:
                    continue
                if partitions is seen_partitions and klass is seen_class:
                    continue  # co-partitioned topics usually share one frozenset: seen it already
                if not everyone_subscribes_alike and topic_id not in subscribed:
                    continue
                seen_partitions, seen_class = partitions, klass
                klass.note_holding(member_id, partitions)

        assigned: dict[str, dict[UUID, frozenset[int]]] = {}
        for klass in classes:
            if len(klass.subscription_indexes) == 1:
                subscribers = members_by_subscription[subscription_sets[klass.subscription_indexes[0]]]
            else:
                subscribers = sorted(m for i in klass.subscription_indexes for m in members_by_subscription[subscription_sets[i]])
            held_by = klass.holdings
            if held_by:
                holders = sorted((lowest, lowest + count, m) for m, (lowest, count) in held_by.items())
                newcomers = [member_id for member_id in subscribers if member_id not in held_by]
                ranges = _cut_ranges(holders, newcomers, klass.size)
                # The walk above is a heuristic; never be less sticky than plain member-id order.
                plain = _cut_in_order(subscribers, klass.size)
                if _kept(plain, held_by) > _kept(ranges, held_by):
                    ranges = plain
            else:
                ranges = _cut_in_order(subscribers, klass.size)
            for member_id, first, end in ranges:
                # The same frozenset for every topic of the class; dict.fromkeys over a dict
                # reuses its stored hashes (UUID.__hash__ is Python code, and this is hot).
                by_topic = dict.fromkeys(klass.topics, frozenset(range(first, end)))
                if member_id in assigned:
                    assigned[member_id].update(by_topic)
                else:
                    assigned[member_id] = by_topic

        empty: Partitions = EMPTY_PARTITIONS
        return GroupAssignment(members={member_id: MemberAssignment(partitions=assigned.get(member_id, empty)) for member_id in member_ids})


def _cut_in_order(members: list[str], size: int) -> list[tuple[str, int, int]]:
    """Kafka's layout: contiguous ranges in the given order, the first ones one longer."""
    base, longer = divmod(size, len(members))
    ranges = []
    first = 0
    for index, member_id in enumerate(members):
        width = base + 1 if index < longer else base
        if not width:
            break
        ranges.append((member_id, first, first + width))
        first += width
    return ranges


def _kept(ranges: list[tuple[str, int, int]], held_by: dict[str, list[int]]) -> int:
    """How many partitions members keep with these ranges, taking each member's holdings as
    the run [lowest held, lowest held + count) -- exact for what this assignor hands out."""
    kept = 0
    for member_id, first, end in ranges:
        held = held_by.get(member_id)
        if held is not None:
            lowest, count = held
            kept += max(0, min(end, lowest + count) - max(first, lowest))  # overlap, inlined: hot
    return kept


def _overlap(first: int, end: int, other_first: int, other_end: int) -> int:
    """Length of the intersection of [first, end) and [other_first, other_end)."""
    return max(0, min(end, other_end) - max(first, other_first))


def _cut_ranges(holders: list[tuple[int, int, str]], newcomers: list[str], size: int) -> list[tuple[str, int, int]]:
    """Cut partitions ``0..size-1`` into contiguous ranges: (member, first, end), non-empty only.

    ``holders`` are (lowest held, lowest held + count held, member), sorted: where each member
    sits along the partitions now. Walking from partition 0, each holder takes the range at the
    current position, one longer when its holdings reach that far (or, with no one left to fill
    it, when a gap follows that would otherwise shift everyone after it). A newcomer -- or a
    holder whose holdings all lie behind the current position -- fills a gap before the next
    holder when that lets the holder keep more; the rest of them take the ranges at the end.
    Ranges are ``base`` or ``base + 1`` long, exactly ``size % members`` of them longer.
    """
    base, longer = divmod(size, len(holders) + len(newcomers))
    placeless: deque[str] = deque(newcomers)
    ranges: list[tuple[str, int, int]] = []
    position, next_holder = 0, 0
    slots_left = len(holders) + len(newcomers)

    def width(at: int, reach: int, longer: int, slots_left: int) -> int:
        """Width of the range at ``at``: the longer one when every remaining range must be
        longer, or when what the member should cover extends to ``reach`` beyond ``at + base``."""
        if longer and (longer == slots_left or reach > at + base):
            return base + 1
        return base

    while slots_left:
        while next_holder < len(holders) and holders[next_holder][1] <= position:
            placeless.append(holders[next_holder][2])
            next_holder += 1
        if next_holder < len(holders):
            lowest, held_end, member_id = holders[next_holder]
            following = holders[next_holder + 1][0] if next_holder + 1 < len(holders) else size
            holder_width = width(position, held_end if placeless else max(held_end, following), longer, slots_left)
            take_holder = True
            if lowest > position and placeless:
                filler_width = width(position, lowest, longer, slots_left)
                later = position + filler_width
                longer_after = longer - (filler_width > base)
                later_width = width(later, held_end, longer_after, slots_left - 1)
                take_holder = _overlap(later, later + later_width, lowest, held_end) <= _overlap(position, position + holder_width, lowest, held_end)
            if take_holder:
                next_holder += 1
                chosen, chosen_width = member_id, holder_width
            else:
                chosen, chosen_width = placeless.popleft(), filler_width
        else:
            chosen, chosen_width = placeless.popleft(), width(position, size, longer, slots_left)
        if chosen_width > base:
            longer -= 1
        if chosen_width:
            ranges.append((chosen, position, position + chosen_width))
            position += chosen_width
        slots_left -= 1
    return ranges
