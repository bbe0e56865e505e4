"""Why a topology cannot work. Every message names the nodes (and topics) involved."""

from __future__ import annotations

from collections.abc import Iterable


class TopologyError(ValueError):
    """A topology that cannot run. ``nodes`` and ``topics`` name what is at fault."""

    def __init__(self, message: str, *, nodes: Iterable[str] = (), topics: Iterable[str] = ()) -> None:
        super().__init__(message)
        self.nodes = tuple(nodes)
        self.topics = tuple(topics)


class InvalidNameError(TopologyError):
    """A node, store, app or topic name Kafka cannot use, or a name used twice."""


class InvalidPatternError(TopologyError):
    """A source's RE2 pattern does not compile, or overlaps another source."""


class MissingSourceError(TopologyError):
    """A node reads from something that is not there: an unknown parent, or a source topic
    (or pattern) the cluster does not have."""


class StoreError(TopologyError):
    """A store declared twice, unknown, or used by nodes of two sub-topologies."""


class CopartitionError(TopologyError):
    """Topics that a join needs co-partitioned have different partition counts."""
