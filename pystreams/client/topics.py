"""Topic names and topic ids, for members that speak the classic protocol.

KIP-848 names partitions by topic id; the classic protocol (JoinGroup subscriptions, SyncGroup
assignments) names topics. A classic member holds ``PartitionSet`` values like the KIP-848
member, so it translates through a :class:`TopicResolver` its caller injects: the worker's
cluster metadata, a test's dictionary, the simulator's topic table. The member only *reads* it,
synchronously; keeping it fresh (``refresh``) is the caller's IO, done by the driver before it
hands the member a response naming topics the resolver does not know.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol, runtime_checkable
from uuid import UUID

from pystreams.assignors.api import TopicMetadata


@runtime_checkable
class TopicResolver(Protocol):
    def topic(self, name: str) -> TopicMetadata | None:
        """The topic called ``name`` (id, partition count), or None when unknown."""
        ...

    def name_of(self, topic_id: UUID) -> str | None: ...

    def topic_names(self) -> Iterable[str]:
        """Every topic known, for regex subscriptions (matched on the client, as Kafka's classic
        consumer does)."""
        ...


@runtime_checkable
class RefreshableTopics(TopicResolver, Protocol):
    """A resolver over the cluster's metadata, which the driver refreshes."""

    def refresh(self) -> None:
        """Read the cluster's topics again (blocking IO: the driver runs it off the loop)."""
        ...


class StaticTopics:
    """A resolver over a fixed table (tests, the simulator); ``add`` creates or grows a topic."""

    def __init__(self, topics: Iterable[TopicMetadata] | Mapping[str, TopicMetadata] = ()) -> None:
        values = topics.values() if isinstance(topics, Mapping) else topics
        self._by_name: dict[str, TopicMetadata] = {}
        self._by_id: dict[UUID, TopicMetadata] = {}
        for topic in values:
            self.add(topic)

    def add(self, topic: TopicMetadata) -> None:
        self._by_name[topic.name] = topic
        self._by_id[topic.topic_id] = topic

    def topic(self, name: str) -> TopicMetadata | None:
        return self._by_name.get(name)

    def name_of(self, topic_id: UUID) -> str | None:
        topic = self._by_id.get(topic_id)
        return None if topic is None else topic.name

    def topic_names(self) -> Iterable[str]:
        return list(self._by_name)
