"""Sets of partitions named by topic id, as the KIP-848 protocol carries them: one value type.

``PartitionSet`` is what the coordinator, the member client, the worker and the simulator hold:
an immutable set of ``TopicIdPartition`` (topic id, partition). Set algebra (``|``, ``-``, ``&``,
``<=``, ``isdisjoint``) is exactly the reconciliation the KIP describes; ``by_topic`` is the
topic-keyed view (``Mapping[UUID, frozenset[int]]``), the shape of the KIP's assignor interface,
which ``assignors.api`` keeps. The conversions live here and nowhere else: to and from wire
structs and record values (``from_wire``/``to_wire``: any struct with ``topic_id`` and
``partitions``), pairs (``from_pairs``) and topic-keyed mappings (``of``). Wire lists are sorted,
so the same set always encodes to the same bytes (deterministic simulation relies on it).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from collections.abc import Set as AbstractSet
from types import MappingProxyType
from typing import Any, NamedTuple, TypeVar
from uuid import UUID

WireStruct = TypeVar("WireStruct")


class TopicIdPartition(NamedTuple):
    topic_id: UUID
    partition: int

    def __repr__(self) -> str:
        # Short form keeps event and assertion messages readable.
        return f"{str(self.topic_id)[:8]}-{self.partition}"


class PartitionSet(AbstractSet[TopicIdPartition]):
    """An immutable set of ``TopicIdPartition``, stored by topic (empty topics never kept)."""

    __slots__ = ("_topics", "_hash_value", "_size", "_view")

    def __init__(self, partitions: Mapping[UUID, Iterable[int]] | None = None) -> None:
        topics: dict[UUID, frozenset[int]] = {}
        for topic, numbers in (partitions or {}).items():
            numbers = numbers if isinstance(numbers, frozenset) else frozenset(numbers)
            if numbers:
                topics[topic] = numbers
        self._topics = topics
        self._hash_value: int | None = None
        self._size: int | None = None
        self._view: Mapping[UUID, frozenset[int]] | None = None

    @classmethod
    def _of(cls, topics: dict[UUID, frozenset[int]]) -> PartitionSet:
        """Wrap an already normalised dict (non-empty frozensets) without copying it."""
        made = object.__new__(cls)
        made._topics = topics
        made._hash_value = None
        made._size = None
        made._view = None
        return made

    # --- conversions -------------------------------------------------------------------------

    @classmethod
    def of(cls, partitions: PartitionSet | Mapping[UUID, Iterable[int]] | None) -> PartitionSet:
        """``partitions`` as a set: itself if it already is one, else from a topic-keyed mapping."""
        return partitions if isinstance(partitions, PartitionSet) else cls(partitions)

    @classmethod
    def from_wire(cls, entries: Iterable[Any] | None) -> PartitionSet:
        """From ``[TopicPartitions(topic_id, partitions)]``: any message's struct or a record value's."""
        topics: dict[UUID, set[int]] = {}
        for entry in entries or ():
            if entry.partitions:
                topics.setdefault(entry.topic_id, set()).update(entry.partitions)
        return cls._of({topic: frozenset(numbers) for topic, numbers in topics.items()})

    def to_wire(self, struct: type[WireStruct]) -> list[WireStruct]:
        """To ``struct(topic_id=..., partitions=[...])``, sorted by topic id then partition."""
        return [struct(topic_id=topic, partitions=sorted(self._topics[topic])) for topic in sorted(self._topics)]  # type: ignore[call-arg]  # kafka-python's generated structs are untyped

    @classmethod
    def from_pairs(cls, pairs: Iterable[tuple[UUID, int]]) -> PartitionSet:
        topics: dict[UUID, set[int]] = {}
        for topic, partition in pairs:
            topics.setdefault(topic, set()).add(partition)
        return cls._of({topic: frozenset(numbers) for topic, numbers in topics.items()})

    @property
    def by_topic(self) -> Mapping[UUID, frozenset[int]]:
        """The topic-keyed view (read-only, one per set): the shape of the KIP's assignor interface.

        An assignor that hands a member's target back unchanged returns this very object, which
        the coordinator recognises without comparing."""
        if self._view is None:
            self._view = MappingProxyType(self._topics)
        return self._view

    def partitions_of(self, topic: UUID) -> frozenset[int]:
        return self._topics.get(topic, frozenset())

    # --- a set of TopicIdPartition -----------------------------------------------------------

    def __iter__(self) -> Iterator[TopicIdPartition]:
        for topic, numbers in self._topics.items():
            for partition in numbers:
                yield TopicIdPartition(topic, partition)

    def __len__(self) -> int:
        if self._size is None:
            self._size = sum(len(numbers) for numbers in self._topics.values())
        return self._size

    def __contains__(self, item: object) -> bool:
        if not isinstance(item, tuple) or len(item) != 2:
            return False
        numbers = self._topics.get(item[0])
        return numbers is not None and item[1] in numbers

    def __bool__(self) -> bool:
        return bool(self._topics)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PartitionSet):
            return self._topics == other._topics
        if isinstance(other, AbstractSet):  # a plain set of (topic id, partition) pairs
            return len(self) == len(other) and all(pair in self for pair in other)
        return NotImplemented

    def __hash__(self) -> int:
        # The hash of the same pairs in a frozenset, since the two compare equal.
        if self._hash_value is None:
            self._hash_value = hash(frozenset(self))
        return self._hash_value

    def __repr__(self) -> str:
        return f"PartitionSet({{{', '.join(f'{str(t)[:8]}: {sorted(p)}' for t, p in sorted(self._topics.items()))}}})"

    # --- set algebra (the other side may also be a plain set of pairs) ------------------------

    @staticmethod
    def _coerce(other: object) -> PartitionSet:
        if isinstance(other, PartitionSet):
            return other
        if isinstance(other, AbstractSet):
            return PartitionSet.from_pairs(other)
        raise TypeError(f"not a set of partitions: {type(other).__name__}")

    def __or__(self, other: AbstractSet[object]) -> PartitionSet:  # as wide as Set's; _coerce refuses non-partitions
        other = self._coerce(other)
        if not other:
            return self
        if not self:
            return other
        out = dict(self._topics)
        for topic, numbers in other._topics.items():
            out[topic] = out[topic] | numbers if topic in out else numbers
        return PartitionSet._of(out)

    __ror__ = __or__

    def union(self, *others: AbstractSet[tuple[UUID, int]]) -> PartitionSet:
        out = self
        for each in others:
            out = out | each
        return out

    def __sub__(self, other: AbstractSet[tuple[UUID, int]]) -> PartitionSet:
        other = self._coerce(other)
        if not other or not self:
            return self
        theirs = other._topics
        out = {}
        for topic, numbers in self._topics.items():
            rest = numbers - theirs[topic] if topic in theirs else numbers
            if rest:
                out[topic] = rest
        return PartitionSet._of(out)

    def __rsub__(self, other: AbstractSet[tuple[UUID, int]]) -> PartitionSet:
        return self._coerce(other) - self

    def __and__(self, other: AbstractSet[tuple[UUID, int]]) -> PartitionSet:
        theirs = self._coerce(other)._topics
        out = {}
        for topic, numbers in self._topics.items():
            if topic in theirs:
                both = numbers & theirs[topic]
                if both:
                    out[topic] = both
        return PartitionSet._of(out)

    __rand__ = __and__

    def __le__(self, other: AbstractSet[tuple[UUID, int]]) -> bool:
        theirs = self._coerce(other)._topics
        return all(topic in theirs and numbers <= theirs[topic] for topic, numbers in self._topics.items())

    issubset = __le__

    def __ge__(self, other: AbstractSet[tuple[UUID, int]]) -> bool:
        return self._coerce(other) <= self

    def isdisjoint(self, other: Iterable[object]) -> bool:  # as wide as Set's; _coerce refuses non-partitions
        theirs = self._coerce(other)._topics
        return not any(topic in theirs and not numbers.isdisjoint(theirs[topic]) for topic, numbers in self._topics.items())

    def describe(self, names: Mapping[UUID, str] | None = None) -> str:
        """``foo-0, foo-1`` in the KIP's case-study notation (topic id when the name is unknown)."""
        names = names or {}
        return ", ".join(
            f"{names.get(topic, str(topic))}-{p}" for topic in sorted(self._topics, key=lambda t: names.get(t, str(t))) for p in sorted(self._topics[topic])
        )


NO_PARTITIONS = PartitionSet()
