"""Helpers the server-side assignor tests share."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping

from hypothesis import settings
from pystreams.assignors.api import GroupAssignment, MemberSpec, Partitions, TopicMetadata

PROPERTY_SETTINGS = settings(max_examples=200, deadline=None)


def topic_id(name: str) -> uuid.UUID:
    return uuid.uuid5(uuid.NAMESPACE_URL, f"pystreams-test-topic/{name}")


def member(*subscribed: uuid.UUID, target: Mapping[uuid.UUID, Iterable[int]] | None = None) -> MemberSpec:
    return MemberSpec(
        subscribed_topic_ids=frozenset(subscribed),
        target_partitions={t: frozenset(ps) for t, ps in (target or {}).items() if ps},
    )


def topics(**partition_counts: int) -> dict[uuid.UUID, TopicMetadata]:
    return {topic_id(name): TopicMetadata(topic_id(name), name, count) for name, count in partition_counts.items()}


def of_topic(result: GroupAssignment, topic: uuid.UUID) -> dict[str, list[int]]:
    """Each member's partitions of one topic, sorted."""
    return {m: sorted(a.partitions.get(topic, ())) for m, a in result.members.items()}


def moved(before: Mapping[str, Partitions], after: Mapping[str, Partitions]) -> int:
    """Partitions that left their previous owner."""
    return sum(len(partitions - after.get(m, {}).get(t, frozenset())) for m, held in before.items() for t, partitions in held.items())
