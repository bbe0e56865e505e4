"""Sets of partitions keyed by topic id, as the KIP-848 protocol carries them.

A ``Partitions`` value maps a topic id to a frozenset of partition indexes; empty sets are never
stored, so two equal assignments compare equal. Coordinator, member client and assignors share
these helpers.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from uuid import UUID

Partitions = Mapping[UUID, frozenset[int]]
EMPTY: Partitions = {}


def normalize(partitions: Mapping[UUID, Iterable[int]]) -> dict[UUID, frozenset[int]]:
    return {topic: frozenset(parts) for topic, parts in partitions.items() if parts}


def union(a: Partitions, b: Partitions) -> dict[UUID, frozenset[int]]:
    out = dict(a)
    for topic, parts in b.items():
        out[topic] = out[topic] | parts if topic in out else parts
    return out


def difference(a: Partitions, b: Partitions) -> dict[UUID, frozenset[int]]:
    out = {}
    for topic, parts in a.items():
        rest = parts - b[topic] if topic in b else parts
        if rest:
            out[topic] = rest
    return out


def intersection(a: Partitions, b: Partitions) -> dict[UUID, frozenset[int]]:
    out = {}
    for topic, parts in a.items():
        if topic in b:
            both = parts & b[topic]
            if both:
                out[topic] = both
    return out


def is_subset(a: Partitions, b: Partitions) -> bool:
    return all(topic in b and parts <= b[topic] for topic, parts in a.items())


def overlaps(a: Partitions, b: Partitions) -> bool:
    return any(topic in b and not parts.isdisjoint(b[topic]) for topic, parts in a.items())


def count(partitions: Partitions) -> int:
    return sum(len(parts) for parts in partitions.values())


def pairs(partitions: Partitions) -> Iterable[tuple[UUID, int]]:
    for topic, parts in partitions.items():
        for partition in parts:
            yield topic, partition


def from_topic_partitions(items: Iterable) -> dict[UUID, frozenset[int]]:
    """From a list of ``TopicPartitions(topic_id, partitions)`` message structs."""
    out: dict[UUID, set[int]] = {}
    for item in items:
        if item.partitions:
            out.setdefault(item.topic_id, set()).update(item.partitions)
    return {topic: frozenset(parts) for topic, parts in out.items()}


def to_topic_partitions(partitions: Partitions, struct: type) -> list:
    """To a sorted list of ``struct(topic_id=..., partitions=[...])`` message structs."""
    return [struct(topic_id=topic, partitions=sorted(partitions[topic])) for topic in sorted(partitions)]


def describe(partitions: Partitions, names: Mapping[UUID, str] | None = None) -> str:
    """``foo-0, foo-1`` in the KIP's case-study notation (topic id when the name is unknown)."""
    names = names or {}
    return ", ".join(
        f"{names.get(topic, str(topic))}-{p}"
        for topic in sorted(partitions, key=lambda t: names.get(t, str(t)))
        for p in sorted(partitions[topic])
    )
