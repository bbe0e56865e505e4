"""Reading the positions topic when tasks start under exactly-once, and taking tasks over from
their previous owners (the rule is :func:`pystreams.worker.positions.plan_takeover`).

The reader's consumer is ``read_uncommitted`` with the transaction filter: it releases committed
records, and also shows the *open* transactions (the filter holds their records), whose writers
a takeover must know about. Unlike a ``read_committed`` consumer it does not stop at the first
open transaction: tasks of every sub-topology share a positions partition, and the transaction
of another task's owner (open for a moment, or for good if that owner died) must not hide what
this task's owner committed after it. So each transaction is released when it ends and the
table keeps the record at the highest offset per task; open transactions with records of the
task itself are the takeover rule's business (fence, or wait). Partitions stay assigned and
are read on from where the last takeover stopped.

"The end" of a partition is re-established after every fence: a fresh ListOffsets, then reading
until the consumer's position reaches it. A fetch returns whole batches, so reaching the
reported offset means the last batch at that moment was read, even on the embedded broker,
whose ListOffsets reports the last batch's base offset + 1.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence

from kafka import KafkaConsumer
from kafka import TopicPartition as KafkaTopicPartition

from pystreams.topology.ir import TaskId

from .committed_consumer import CommittedConsumer
from .positions import Fence, Lost, PositionTable, Resume, Takeover, Wait, pending_writers, plan_takeover, positions_partition, still_fenced

log = logging.getLogger(__name__)


class TakeoverTimeout(TimeoutError):
    """The positions could not be read to a settled state in time (the caller retries)."""


#: How long a takeover waits for a fenced writer's open transaction before fencing it again.
REFENCE_AFTER_S = 5.0


class PositionReader:
    def __init__(
        self,
        consumer: KafkaConsumer,
        topic: str,
        *,
        fence: Callable[[str], None],
        timeout_s: float = 60.0,
    ) -> None:
        """``consumer``: a manual-assignment ``read_uncommitted`` KafkaConsumer (the reader puts
        its own transaction filter in front of it)."""
        self._consumer = CommittedConsumer(consumer, in_offset_order=False)
        self.topic = topic
        self._fence = fence
        self._timeout_s = timeout_s
        self._tables: dict[int, PositionTable] = {}
        #: Writers this thread fenced -> per positions partition, its end offset just after the
        #: fence: records of the writer below it are covered; later ones are a new incarnation.
        self._fenced_at: dict[str, dict[int, int]] = {}

    @property
    def fenced(self) -> set[str]:
        """Writers this thread fenced (a revival may resume after them)."""
        return set(self._fenced_at)

    def takeover(self, task_ids: Sequence[TaskId], *, me: str, reviving: bool = False) -> dict[TaskId, Resume | Lost]:
        """For each task: where it resumes (Resume) or that another owner has it (Lost, only
        when ``reviving``). Fences previous owners that did not release a task cleanly."""
        partitions = sorted({positions_partition(t) for t in task_ids})
        self._assign(partitions)
        deadline = time.monotonic() + self._timeout_s
        waiting_since: float | None = None
        while True:
            self._read_to_end(partitions, deadline)
            pending = {
                p: pending_writers((r.offset, r.key, r.value) for _, records in self._consumer.pending(KafkaTopicPartition(self.topic, p)) for r in records)
                for p in partitions
            }
            plans: dict[TaskId, Takeover] = {}
            for task_id in task_ids:
                partition = positions_partition(task_id)
                table = self._tables[partition]
                latest, writers = table.latest.get(task_id), pending[partition].get(task_id, {})
                newest = dict(writers)
                if latest is not None:
                    newest[latest.writer] = max(newest.get(latest.writer, -1), table.offset_of(task_id))
                fenced_here = {w: at[partition] for w, at in self._fenced_at.items() if partition in at}
                plans[task_id] = plan_takeover(
                    latest,
                    set(writers),
                    me=me,
                    fenced=still_fenced(fenced_here, newest),
                    reviving=reviving,
                )
            to_fence = sorted({w for plan in plans.values() if isinstance(plan, Fence) for w in plan.writers})
            waiting = [t for t, plan in plans.items() if isinstance(plan, Wait)]
            if to_fence:
                # Where the partitions end *before* the fences: every record below is covered by
                # them (its transaction is aborted if still open); one at or past it may come from
                # an incarnation that starts right after a fence, and is fenced again if it holds
                # a task (measured after, a new incarnation's records could pass as covered).
                tps = [KafkaTopicPartition(self.topic, p) for p in partitions]
                ends = self._consumer.end_offsets(tps)
                for writer in to_fence:
                    log.warning("fencing %s: it owned a task now ours and did not release it (crashed, or a zombie)", writer)
                    self._fence(writer)
                    self._fenced_at.setdefault(writer, {}).update({tp.partition: ends[tp] for tp in tps})
                continue
            if waiting:
                now = time.monotonic()
                if now > deadline:
                    raise TakeoverTimeout(f"open transactions of fenced writers still hold the positions of {', '.join(map(str, waiting))}")
                if waiting_since is None:
                    waiting_since = now
                elif now - waiting_since > REFENCE_AFTER_S:
                    # A fence's abort markers land at once; a transaction still open this long
                    # belongs to an incarnation the fence did not reach: fence its writers again.
                    for plan in plans.values():
                        if isinstance(plan, Wait):
                            for writer in plan.writers:
                                self._fenced_at.pop(writer, None)
                    waiting_since = None
                time.sleep(0.05)
                continue
            return {t: plan for t, plan in plans.items() if isinstance(plan, (Resume, Lost))}

    def _assign(self, partitions: Iterable[int]) -> None:
        new = [p for p in partitions if p not in self._tables]
        if not new:
            return
        for partition in new:
            self._tables[partition] = PositionTable()
        self._consumer.assign([KafkaTopicPartition(self.topic, p) for p in sorted(self._tables)])
        self._consumer.seek_to_beginning(*[KafkaTopicPartition(self.topic, p) for p in new])

    def _read_to_end(self, partitions: Sequence[int], deadline: float) -> None:
        tps = [KafkaTopicPartition(self.topic, p) for p in partitions]
        ends = self._consumer.end_offsets(tps)
        while True:
            behind = [tp for tp in tps if self._consumer.position(tp) < ends[tp]]
            if not behind:
                return
            if time.monotonic() > deadline:
                raise TakeoverTimeout(f"could not read {self.topic} to its end ({', '.join(f'{tp.partition}@{ends[tp]}' for tp in behind)})")
            for tp, records in self._consumer.poll(timeout_ms=200).items():
                self._tables[tp.partition].apply((r.offset, r.key, r.value) for r in records)

    def close(self) -> None:
        self._consumer.close()
