"""The Kafka source's offsets as a Spark checkpoint keeps them, and what they must agree with.

Offsets alone do not say which log they belong to: a checkpoint left from a run against another
broker, or from before a topic was recreated, holds positions in *another* log, and resuming
from them silently skips or mixes records (and the checkpoint's state is another run's). So the
offsets record where they came from — the cluster id and each topic's id — and before a batch
is planned they are checked against the cluster as it is now:

* a different cluster, or a topic whose id changed (deleted and recreated);
* a position beyond the partition's end (a new or truncated log);
* a position before the partition's start (records deleted before they were processed).

Each is possible data loss. With Spark's ``failOnDataLoss`` (the default) the query fails
naming the topic, partition and positions and what to do; without it, a warning, and the read
continues as Spark's own Kafka source would: a recreated topic is read from its beginning (a new
topic), a position beyond the end from the current end, a position before the start from the
start. The checkpoint's state is kept either way (``--checkpoint`` elsewhere starts afresh).

The format (JSON): ``{"cluster": ID, "topic_ids": {TOPIC: UUID}, "offsets": {"TOPIC:PARTITION":
NEXT_OFFSET}}``. Older checkpoints (the bare ``offsets`` map) and Spark's own connector's
(``{TOPIC: {PARTITION: OFFSET}}``) are read too, without ids.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

#: Spark's option name (its Kafka source's), and ours.
FAIL_ON_DATA_LOSS = "failOnDataLoss"


def partition_key(topic: str, partition: int) -> str:
    # Kafka topic names cannot contain ':' so the split is unambiguous.
    return f"{topic}:{partition}"


def split_partition_key(key: str) -> tuple[str, int]:
    topic, _, partition = key.rpartition(":")
    return topic, int(partition)


@dataclass(frozen=True)
class SourceOffsets:
    """Next offset per ``"topic:partition"``, and the log they belong to."""

    positions: Mapping[str, int]
    cluster_id: str | None = None
    topic_ids: Mapping[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"cluster": self.cluster_id, "topic_ids": dict(self.topic_ids), "offsets": dict(self.positions)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SourceOffsets:
        if "offsets" in data and isinstance(data["offsets"], Mapping):
            return cls(dict(data["offsets"]), data.get("cluster"), dict(data.get("topic_ids") or {}))
        if all(isinstance(value, Mapping) for value in data.values()):  # Spark's own Kafka source
            return cls({partition_key(topic, int(p)): int(o) for topic, by in data.items() for p, o in by.items()})
        return cls({key: int(offset) for key, offset in data.items()})  # pystreams before ids were recorded


@dataclass(frozen=True)
class LogView:
    """The cluster's logs now: their ids, and each partition's first and next offset."""

    cluster_id: str | None
    topic_ids: Mapping[str, str]
    starts: Mapping[str, int]
    ends: Mapping[str, int]


@dataclass(frozen=True)
class DataLoss:
    """One partition whose recorded position does not fit the log it now names."""

    topic: str
    partition: int | None
    reason: str
    #: Where a read that goes on anyway (failOnDataLoss=false) starts, as Spark would.
    resume_at: int | None = None


def find_data_loss(recorded: SourceOffsets, now: LogView) -> list[DataLoss]:
    """What makes ``recorded`` unsafe to resume from against ``now`` (empty: nothing)."""
    losses: list[DataLoss] = []
    if recorded.cluster_id and now.cluster_id and recorded.cluster_id != now.cluster_id:
        topics = sorted({split_partition_key(key)[0] for key in recorded.positions})
        return [DataLoss(topic, None, f"the offsets were recorded on cluster {recorded.cluster_id!r}, this is {now.cluster_id!r}", 0) for topic in topics]
    recreated: set[str] = set()
    for topic, old_id in sorted(recorded.topic_ids.items()):
        new_id = now.topic_ids.get(topic)
        if new_id is not None and new_id != old_id:
            recreated.add(topic)
            losses.append(DataLoss(topic, None, f"the topic was recreated (id {old_id} when the offsets were recorded, {new_id} now)", 0))
    for key, position in sorted(recorded.positions.items()):
        topic, partition = split_partition_key(key)
        if topic in recreated or key not in now.ends:
            continue  # a deleted partition has nothing left to lose: Spark drops it too
        start, end = now.starts.get(key, 0), now.ends[key]
        if position > end:
            losses.append(DataLoss(topic, partition, f"the recorded position {position} is beyond the end of the log ({end}): another or a truncated log", end))
        elif position < start:
            losses.append(
                DataLoss(
                    topic,
                    partition,
                    f"the recorded position {position} is before the start of the log ({start}): records {position}..{start - 1} were deleted unread",
                    start,
                )
            )
    return losses


class DataLossError(RuntimeError):
    """Resuming would skip or mix records (``failOnDataLoss``); the message says what to do."""

    def __init__(self, losses: Iterable[DataLoss], where: str) -> None:
        self.losses = list(losses)
        lines = [f"  {loss.topic}" + (f"-{loss.partition}" if loss.partition is not None else "") + f": {loss.reason}" for loss in self.losses]
        super().__init__(
            f"the Kafka offsets in {where} do not belong to the logs the cluster has now, so resuming from them "
            "would skip or mix records (and reuse another run's state):\n" + "\n".join(lines) + "\n"
            "Start afresh with a new checkpoint (delete it, or --checkpoint DIR elsewhere), or pass "
            "--fail-on-data-loss false (Spark's failOnDataLoss) to go on anyway, keeping the checkpoint's state."
        )


def resume_positions(recorded: SourceOffsets, now: LogView, *, fail_on_data_loss: bool, where: str) -> dict[str, int]:
    """Where each recorded partition's read starts: its recorded position, unless the log
    does not fit it (``DataLossError`` with ``fail_on_data_loss``, else a warning and Spark's
    way on)."""
    losses = find_data_loss(recorded, now)
    positions = dict(recorded.positions)
    if not losses:
        return positions
    if fail_on_data_loss:
        raise DataLossError(losses, where)
    for loss in losses:
        log.warning(
            "possible data loss in %s (failOnDataLoss=false, going on): %s%s: %s",
            where,
            loss.topic,
            "" if loss.partition is None else f"-{loss.partition}",
            loss.reason,
        )
        for key in positions:
            topic, partition = split_partition_key(key)
            if topic == loss.topic and loss.partition in (None, partition):
                resume = loss.resume_at if loss.partition is not None else None
                positions[key] = resume if resume is not None else now.starts.get(key, 0)
    return positions


def checkpoint_offsets(checkpoint: str | Path) -> dict[str, SourceOffsets]:
    """The newest source offsets Spark wrote in each query's directory under ``checkpoint``
    (``<query>/offsets/<batch>``: a version line, the batch metadata, one line per source)."""
    found: dict[str, SourceOffsets] = {}
    root = Path(checkpoint)
    if not root.is_dir():
        return found
    for offsets_dir in sorted(root.glob("*/offsets")):
        batches = [p for p in offsets_dir.iterdir() if p.name.isdigit()]
        if not batches:
            continue
        newest = max(batches, key=lambda p: int(p.name))
        sources = [line.strip() for line in newest.read_text().splitlines()[2:]]
        for number, line in enumerate(sources):
            if line and line != "-":  # "-": a source that has not read yet
                where = f"batch {newest.name}" + (f", source {number}" if len(sources) > 1 else "")
                found[f"{offsets_dir.parent.name} ({where})"] = SourceOffsets.from_json(json.loads(line))
    return found
