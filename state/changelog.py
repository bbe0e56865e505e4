"""What a store needs from the outside world: where changelog records go, where restored
records come from, and how restore progress is reported.

Changelog I/O itself lives in the runtime (kafka-python); these protocols are the seam."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol


class TopicPartition(NamedTuple):
    topic: str
    partition: int


class ChangelogRecord(NamedTuple):
    """One changelog record as read back for restore; ``value`` None is a tombstone."""

    offset: int
    key: bytes
    value: bytes | None
    #: The record's timestamp: a timestamped store's row timestamp (-1: none).
    timestamp: int = -1


class ChangelogSink(Protocol):
    """Receives the folded changes of a store at flush time (one record per key).

    The runtime implements it with a kafka-python producer; offsets of written records come
    back to the state layer through ``TaskState.checkpoint(written_offsets)``."""

    def send(self, topic: str, partition: int, key: bytes, value: bytes | None, timestamp: int | None = None) -> None:
        """``timestamp``: the record's (a timestamped store's row timestamp); None: the
        producer's clock."""
        ...


class ChangelogReader(Protocol):
    """Reads a changelog partition for restore (active start-up, standby, warm-up)."""

    def end_offset(self, changelog: TopicPartition) -> int:
        """Offset one past the last record currently in the partition."""
        ...

    def read(self, changelog: TopicPartition, start_offset: int | None, end_offset: int) -> Iterable[Sequence[ChangelogRecord]]:
        """Batches of records from ``start_offset`` (None: from the beginning) up to
        ``end_offset`` (exclusive), in offset order."""
        ...


@dataclass(frozen=True, slots=True)
class RestoreProgress:
    """Reported after every restored batch and once when a store has caught up."""

    task_id: str
    store_name: str
    changelog: TopicPartition
    restored_records: int  # records applied by this restore so far
    position: int | None  # next changelog offset to apply
    end_offset: int
    done: bool

    @property
    def lag(self) -> int:
        return max(0, self.end_offset - (self.position or 0))


def changelog_topic_name(application_id: str, store_name: str) -> str:
    """Kafka Streams' naming: ``<application.id>-<store name>-changelog``."""
    return f"{application_id}-{store_name}-changelog"


# Kafka Streams keeps windowed changelogs a day longer than the store retains windows
# (windowstore.changelog.additional.retention.ms), so a restore never misses live windows.
WINDOWED_CHANGELOG_EXTRA_RETENTION_MS = 24 * 60 * 60 * 1000


def changelog_topic_config(retention_ms: int | None = None) -> dict[str, str]:
    """Topic configs for creating a store's changelog: compacted for key-value stores
    (``retention_ms`` None); compacted and time-limited for window and session stores."""
    if retention_ms is None:
        return {"cleanup.policy": "compact"}
    return {
        "cleanup.policy": "compact,delete",
        "retention.ms": str(retention_ms + WINDOWED_CHANGELOG_EXTRA_RETENTION_MS),
    }
