"""What the KIP-848 member and the classic member keep the same way: a subscription (topic names
or one regex, checked once) and the book of revocations handed to the caller."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from pystreams.client.events import RevokePartitions
from pystreams.partitions import NO_PARTITIONS, PartitionSet


@dataclass(frozen=True)
class Subscription:
    topics: tuple[str, ...]  # sorted; empty for a regex subscription
    regex: str  # "" for a topic-name subscription


def parse_subscription(topics: Iterable[str] | None, regex: str | None) -> Subscription:
    """Topic names or one regex, exactly one of them; a clear error for anything else."""
    if (topics is None) == (regex is None):
        raise ValueError("subscribe to either topics or regex, exactly one of them")
    if topics is not None:
        if isinstance(topics, str):
            raise TypeError("topics must be an iterable of names, not a string")
        names = tuple(sorted(set(topics)))
        if not names or not all(names):
            raise ValueError("topics must be non-empty names; use leave() to unsubscribe")
        return Subscription(topics=names, regex="")
    if not regex:
        raise ValueError("regex must be non-empty")
    return Subscription(topics=(), regex=regex)


class Revocations:
    """Revocations handed to the caller (``RevokePartitions``) and not done yet, by id. Ids only
    grow, so the done-call of a revocation given up since (fenced, lost) is recognised and ignored."""

    def __init__(self) -> None:
        self._open: dict[int, PartitionSet] = {}
        self._next_id = 1

    def open(self, partitions: PartitionSet) -> RevokePartitions:
        revocation_id = self._next_id
        self._next_id += 1
        self._open[revocation_id] = partitions
        return RevokePartitions(partitions, revocation_id)

    def close(self, revocation_id: int | None) -> bool:
        """Mark one revocation done (``None``: all of them). True when that closed the last open
        one, i.e. the member may go on; False for an unknown id or while others are open."""
        if revocation_id is None:
            if not self._open:
                return False
            self._open.clear()
            return True
        if self._open.pop(revocation_id, None) is None:
            return False
        return not self._open

    def clear(self) -> None:
        self._open.clear()

    @property
    def partitions(self) -> PartitionSet:
        return NO_PARTITIONS.union(*self._open.values())

    def __bool__(self) -> bool:
        return bool(self._open)
