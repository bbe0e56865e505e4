"""Topic-id partition sets for the member client.

The protocol names partitions by topic id only (a re-created topic is a different topic), so
the member keeps flat sets of :class:`TopicIdPartition`: set arithmetic (owned - assigned,
assigned - owned) is then exactly the reconciliation the KIP describes, and an invariant checker
can intersect two members' sets directly.

Converters go to and from the wire (``TopicPartitions`` structs of any of the KIP-848 messages)
and to and from the assignor API's ``Mapping[UUID, frozenset[int]]``. Wire lists are sorted, so
the same set always encodes to the same bytes (deterministic simulation relies on it).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple, TypeVar
from uuid import UUID


class TopicIdPartition(NamedTuple):
    topic_id: UUID
    partition: int

    def __repr__(self) -> str:
        # Short form keeps event and assertion messages readable.
        return f"{str(self.topic_id)[:8]}-{self.partition}"


PartitionSet = frozenset[TopicIdPartition]

NO_PARTITIONS: PartitionSet = frozenset()

WireTopicPartitions = TypeVar("WireTopicPartitions")


def partitions_from_wire(entries: Iterable[Any] | None) -> PartitionSet:
    """Flatten ``[TopicPartitions(topic_id, partitions)]`` (any message's struct) into a set."""
    if not entries:
        return NO_PARTITIONS
    return frozenset(
        TopicIdPartition(entry.topic_id, partition)
        for entry in entries
        for partition in entry.partitions
    )


def partitions_to_wire(
    partitions: Iterable[TopicIdPartition], struct: type[WireTopicPartitions]
) -> list[WireTopicPartitions]:
    """Group a set by topic id into ``struct(topic_id=..., partitions=[...])``, sorted."""
    return [
        struct(topic_id=topic_id, partitions=sorted(numbers))  # type: ignore[call-arg]
        for topic_id, numbers in sorted(partitions_to_mapping(partitions).items())
    ]


def partitions_to_mapping(partitions: Iterable[TopicIdPartition]) -> dict[UUID, frozenset[int]]:
    """The assignor API's shape: partitions keyed by topic id."""
    by_topic: dict[UUID, set[int]] = {}
    for topic_id, partition in partitions:
        by_topic.setdefault(topic_id, set()).add(partition)
    return {topic_id: frozenset(numbers) for topic_id, numbers in by_topic.items()}


def partitions_from_mapping(mapping: Mapping[UUID, Iterable[int]]) -> PartitionSet:
    return frozenset(
        TopicIdPartition(topic_id, partition)
        for topic_id, numbers in mapping.items()
        for partition in numbers
    )
