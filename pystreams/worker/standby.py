"""Standby and warm-up replicas: a task's stores kept close to their changelogs' end without
processing any input, so that promoting the task to active restores only the remainder.

A warm-up is a standby the assignor placed where it wants the active to move once caught up;
on the worker both are the same thing: a :class:`StandbyTask` followed by the
:class:`StandbyUpdater`'s consumer (one per engine, separate from the input and the restore
consumers so that following changelogs never disturbs their positions).

Lags come from the high watermark of the replica consumer's last fetch. Before a first fetch
they fall back to ListOffsets LATEST, which on the embedded broker may report the last batch's
base offset + 1 instead of the high watermark (a lag reading up to one batch low).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from typing import Any

from kafka import TopicPartition as KafkaTopicPartition

from pystreams.state import CacheLimits, ChangelogRecord, TaskState, TopicPartition
from pystreams.topology.ir import TaskId
from pystreams.topology.resolve import ResolvedTopology

from .processing import open_task_stores

log = logging.getLogger(__name__)


class _ReadOnlyChangelog:
    """A standby never writes its changelogs: the active does."""

    def send(self, topic: str, partition: int, key: bytes, value: bytes | None, timestamp: int | None = None) -> None:
        raise RuntimeError(f"a standby replica wrote to {topic}-{partition}")


def stateful_tasks(resolved: ResolvedTopology) -> frozenset[TaskId]:
    """Tasks with at least one logged store: the only ones a replica helps."""
    stateful = resolved.stateful_subtopologies
    return frozenset(task for task in resolved.tasks if task.subtopology in stateful)


class StandbyTask:
    """A replica of one task's stores (it locks the task directory like an active would)."""

    def __init__(
        self,
        resolved: ResolvedTopology,
        task_id: TaskId,
        *,
        state_dir: str | os.PathLike[str],
        cache_limits: CacheLimits,
        checkpoint_min_records: int = 0,
    ) -> None:
        self.id = task_id
        self.changelogs = tuple(TopicPartition(*pair) for pair in resolved.changelog_partitions(task_id))
        self.state = TaskState(
            state_dir,
            resolved.topology.app_id,
            str(task_id),
            task_id.partition,
            _ReadOnlyChangelog(),
            checkpoint_min_records=checkpoint_min_records,
        )
        try:
            open_task_stores(resolved, task_id, self.state, cache_limits=cache_limits)
        except BaseException:
            self.state.close(wipe=False)
            raise
        self.records_applied = 0

    def positions(self) -> dict[TopicPartition, int | None]:
        """Where to continue reading each changelog (None: from its beginning)."""
        positions = self.state.restore_positions()
        return {changelog: positions.get(changelog) for changelog in self.changelogs}

    def apply(self, changelog: TopicPartition, records: Iterable[ChangelogRecord]) -> None:
        self.records_applied += self.state.apply_changelog(changelog, list(records))

    def lag(self, end_offsets: Mapping[TopicPartition, int]) -> int:
        return sum(self.state.changelog_lags({c: end_offsets.get(c, 0) for c in self.changelogs}).values())

    def checkpoint(self) -> None:
        self.state.checkpoint()

    def close(self) -> None:
        """Checkpoint and release the task directory (the active may open it next)."""
        self.state.close()


class StandbyUpdater:
    """Follows the changelogs of every standby with one consumer."""

    def __init__(self, consumer: Any) -> None:
        self._consumer = consumer
        self._tasks: dict[TaskId, StandbyTask] = {}
        self._task_of: dict[TopicPartition, StandbyTask] = {}

    @property
    def tasks(self) -> Mapping[TaskId, StandbyTask]:
        return self._tasks

    def add(self, task: StandbyTask) -> None:
        self._tasks[task.id] = task
        for changelog in task.changelogs:
            self._task_of[changelog] = task
        self._assign()
        for changelog, position in task.positions().items():
            partition = KafkaTopicPartition(*changelog)
            if position is None:
                self._consumer.seek_to_beginning(partition)
            else:
                self._consumer.seek(partition, position)

    def remove(self, task_id: TaskId) -> StandbyTask | None:
        task = self._tasks.pop(task_id, None)
        if task is not None:
            for changelog in task.changelogs:
                self._task_of.pop(changelog, None)
            self._assign()
        return task

    def _assign(self) -> None:
        # assign() keeps the positions of partitions that stay assigned.
        self._consumer.assign([KafkaTopicPartition(*c) for c in self._task_of])

    def poll(self, timeout_ms: int = 0) -> int:
        """Apply what the consumer has fetched; returns the records applied."""
        if not self._task_of:
            return 0
        applied = 0
        for partition, records in self._consumer.poll(timeout_ms=timeout_ms).items():
            changelog = TopicPartition(partition.topic, partition.partition)
            task = self._task_of.get(changelog)
            if task is None or not records:
                continue
            task.apply(changelog, [ChangelogRecord(r.offset, r.key, r.value, r.timestamp) for r in records])
            applied += len(records)
        return applied

    def lags(self) -> dict[TaskId, int]:
        """Records each standby is behind its changelogs' end: the high watermark of the last
        fetch (exact), else ListOffsets (see the module docstring)."""
        if not self._task_of:
            return {}
        end_offsets: dict[TopicPartition, int] = {}
        unknown = []
        for changelog in self._task_of:
            high_watermark = self._consumer.highwater(KafkaTopicPartition(*changelog))
            if high_watermark is None:
                unknown.append(changelog)
            else:
                end_offsets[changelog] = high_watermark
        end_offsets.update(self.end_offsets(unknown))
        return {task_id: task.lag(end_offsets) for task_id, task in self._tasks.items()}

    def end_offsets(self, changelogs: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        partitions = [KafkaTopicPartition(*c) for c in changelogs]
        if not partitions:
            return {}
        reported = self._consumer.end_offsets(partitions)
        return {TopicPartition(tp.topic, tp.partition): offset for tp, offset in reported.items()}

    def close(self) -> None:
        self._consumer.close()
