"""How an engine commits, chosen once by ``processing.guarantee``: the engine calls the same
methods either way and never asks which guarantee it runs under.

* :class:`AtLeastOnceCommits` — flush outputs, then hand the input offsets to the coordinator
  (periodic commits in the background, so processing goes on while the coordinator is briefly
  away; commits that end ownership wait), then checkpoint. A crash between the flush and the
  offsets makes the next owner process those inputs again.
* :class:`ExactlyOnceCommits` — one Kafka transaction per commit (KIP-447: one transactional
  producer per stream thread) holding the sink, repartition and changelog writes and the input
  positions (:mod:`pystreams.worker.positions`). Before the transaction commits, the offsets
  go to the coordinator synchronously with the member epoch: a refusal (fenced or unknown
  member) aborts it and the tasks migrate. Checkpoints are written only when a task closes
  cleanly; a running task has none, so a crash makes its state rebuilt from the changelog.

Both read and write through the clients the engine creates with their settings
(``consumer_overrides``, ``wrap_consumer``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pystreams.state import TopicPartition
from pystreams.topology.ir import TaskId

from .committed_consumer import CommittedConsumer
from .errors import RecordProcessingError
from .position_reader import PositionReader
from .positions import Lost, PositionKind, Resume, encode_position, positions_partition
from .transaction import CommitOutcome, MembershipLost, TransactionErrorKind, classify
from .transactional_producer import TransactionalProducer

if TYPE_CHECKING:
    from .kafka_io import RecordSender
    from .tasks import StreamTask

log = logging.getLogger(__name__)

#: Reads committed input offsets (our coordinator's OffsetFetch); partitions without a
#: committed offset are left out and start from the earliest offset.
CommittedOffsetsReader = Callable[[Sequence[TopicPartition]], Mapping[TopicPartition, int]]
#: Commits input offsets (to our coordinator, with the member epoch). Under exactly-once it
#: raises MembershipLost when the coordinator says the member lost its partitions.
OffsetCommitter = Callable[[Mapping[TopicPartition, int]], None]
#: Resume positions per task: None for a partition-less answer (start from the beginning).
ResumePositions = dict[TaskId, dict[TopicPartition, int]]


class TaskMigratedError(RuntimeError):
    """Exactly-once: another owner took this thread's tasks over (its producer was fenced, or
    the coordinator refused the member). The engine dropped every task without committing;
    the member must find out what it owns now before starting tasks again."""


def _input_partitions(tasks: Sequence[StreamTask]) -> list[TopicPartition]:
    return [p for task in tasks for p in task.input_partitions]


class AtLeastOnceCommits:
    exactly_once = False
    consumer_overrides: Mapping[str, Any] = {}

    def __init__(
        self,
        *,
        committed_offsets: CommittedOffsetsReader | None,
        commit_offsets: OffsetCommitter | None,
        commit_offsets_in_background: OffsetCommitter | None,
    ) -> None:
        self._committed_offsets = committed_offsets
        self._commit_offsets = commit_offsets
        #: Periodic commits hand their offsets here and go on processing (the coordinator may be
        #: away for a while); commits that end a task's ownership always wait (``commit_offsets``).
        self._commit_offsets_in_background = commit_offsets_in_background
        self.producer: Any = None

    # -- clients ----------------------------------------------------------------------------------

    def open_producer(self, make_producer: Callable[[dict[str, Any]], Any], on_new_producer: Callable[[Any], None]) -> Any:
        self.producer = make_producer({})
        return self.producer

    def wrap_consumer(self, consumer: Any) -> Any:
        return consumer

    def ensure_open(self) -> None:
        pass

    def close(self) -> None:
        if self.producer is not None:
            self.producer.close()

    # -- tasks ------------------------------------------------------------------------------------

    def resume(self, tasks: Sequence[StreamTask], *, reviving: bool = False) -> ResumePositions:
        committed = dict(self._committed_offsets(_input_partitions(tasks))) if self._committed_offsets else {}
        return {task.id: {p: committed[p] for p in task.input_partitions if p in committed} for task in tasks}

    def tasks_started(self, tasks: Sequence[StreamTask]) -> bool:
        """Whether the engine must commit before the tasks process (exactly-once claims)."""
        return False

    def commit(self, sender: RecordSender, tasks: Sequence[StreamTask], *, releasing: Collection[TaskId] = (), background: bool = False) -> CommitOutcome:
        for task in tasks:
            task.flush()
        sender.flush()
        offsets: dict[TopicPartition, int] = {}
        for task in tasks:
            offsets.update(task.next_offsets)
        committer = self._commit_offsets_in_background if background and self._commit_offsets_in_background else self._commit_offsets
        if committer is not None and offsets:
            committer(offsets)
        for task in tasks:
            task.checkpoint()
        return CommitOutcome.COMMITTED

    def abort(self, sender: RecordSender) -> CommitOutcome:
        """Nothing to take back: what was written stays written (at-least-once)."""
        return CommitOutcome.ABORTED

    def release(self, sender: RecordSender, task_ids: Collection[TaskId]) -> CommitOutcome:
        return CommitOutcome.ABORTED

    def forget(self, task_ids: Collection[TaskId]) -> None:
        pass

    # -- counters ---------------------------------------------------------------------------------

    @property
    def transactions_committed(self) -> int:
        return 0

    @property
    def transactions_aborted(self) -> int:
        return 0


class ExactlyOnceCommits:
    exactly_once = True
    consumer_overrides: Mapping[str, Any] = {"isolation_level": "read_committed"}

    def __init__(
        self,
        *,
        transactional_id: str,
        positions_topic: str,
        make_positions_consumer: Callable[[], Any],
        make_fencing_producer: Callable[[str], Any],
        committed_offsets: CommittedOffsetsReader | None,
        commit_offsets: OffsetCommitter | None,
        transaction_timeout_ms: int,
    ) -> None:
        self.transactional_id = transactional_id
        self.positions_topic = positions_topic
        self._make_positions_consumer = make_positions_consumer
        self._make_fencing_producer = make_fencing_producer
        self._committed_offsets = committed_offsets
        self._commit_offsets = commit_offsets
        self._transaction_timeout_ms = transaction_timeout_ms
        self._transactional: TransactionalProducer | None = None
        self._reader: PositionReader | None = None
        #: The positions each task's latest record in the topic holds (written by us).
        self._written: dict[TaskId, dict[TopicPartition, int]] = {}
        #: Tasks started but whose claim is not committed yet.
        self._claims: set[TaskId] = set()
        self._coordinator_warned = False

    # -- clients ----------------------------------------------------------------------------------

    @property
    def producer(self) -> Any:
        assert self._transactional is not None
        return self._transactional.producer

    def open_producer(self, make_producer: Callable[[dict[str, Any]], Any], on_new_producer: Callable[[Any], None]) -> Any:
        overrides = {
            "transactional_id": self.transactional_id,
            "enable_idempotence": True,
            "transaction_timeout_ms": self._transaction_timeout_ms,
        }
        self._transactional = TransactionalProducer(
            self.transactional_id,
            lambda: make_producer(overrides),
            # Past the transaction timeout a broker would have aborted the transaction itself.
            end_timeout_ms=self._transaction_timeout_ms,
            on_new_producer=on_new_producer,
        )
        from .position_reader import PositionReader

        self._reader = PositionReader(
            self._make_positions_consumer(),
            self.positions_topic,
            fence=self._fence,
        )
        return self._transactional.producer

    def _fence(self, writer: str) -> None:
        from .transactional_producer import fence_transactional_id

        fence_transactional_id(writer, self._make_fencing_producer)

    def wrap_consumer(self, consumer: Any) -> Any:
        return CommittedConsumer(consumer)

    def ensure_open(self) -> None:
        assert self._transactional is not None
        self._transactional.ensure_open()

    def close(self) -> None:
        if self._transactional is not None:
            self._transactional.close()
        if self._reader is not None:
            self._reader.close()

    @property
    def fenced_writers(self) -> frozenset[str]:
        return frozenset(self._reader.fenced) if self._reader is not None else frozenset()

    # -- tasks ------------------------------------------------------------------------------------

    def resume(self, tasks: Sequence[StreamTask], *, reviving: bool = False) -> ResumePositions:
        """Take the tasks over (fencing previous owners that did not release them) and return
        where each resumes: its latest committed position record, else the coordinator's offsets
        (an app moving from at-least-once), else the beginning."""
        assert self._reader is not None
        plans = self._reader.takeover([t.id for t in tasks], me=self.transactional_id, reviving=reviving)
        lost = {t: plan.owner for t, plan in plans.items() if isinstance(plan, Lost)}
        if lost:
            raise TaskMigratedError(f"tasks {', '.join(f'{t} (now written by {o})' for t, o in sorted(lost.items()))} have another owner")
        positions: ResumePositions = {}
        without = []
        for task in tasks:
            plan = plans[task.id]
            assert isinstance(plan, Resume)  # Lost ones raised above
            offsets = plan.offsets
            if offsets is None:
                without.append(task)
            else:
                positions[task.id] = {p: offsets[p] for p in task.input_partitions if p in offsets}
                self._written[task.id] = dict(positions[task.id])
        if without:
            committed = dict(self._committed_offsets(_input_partitions(without))) if self._committed_offsets else {}
            for task in without:
                positions[task.id] = {p: committed[p] for p in task.input_partitions if p in committed}
        return positions

    def tasks_started(self, tasks: Sequence[StreamTask]) -> bool:
        """The tasks' stores are about to take uncommitted writes: no checkpoint from now until
        they close cleanly. Their claims must be committed before they process anything."""
        for task in tasks:
            task.state.invalidate_checkpoint()
            self._claims.add(task.id)
        return bool(tasks)

    def commit(self, sender: RecordSender, tasks: Sequence[StreamTask], *, releasing: Collection[TaskId] = (), background: bool = False) -> CommitOutcome:
        """One transaction for every task of the thread (they share it): ``tasks`` must be all
        of them. ``background`` makes no difference: an exactly-once commit always waits."""
        assert self._transactional is not None
        self._transactional.ensure_open()
        offsets: dict[TopicPartition, int] = {}
        written: dict[TaskId, dict[TopicPartition, int]] = {}
        try:
            for task in tasks:
                task.flush()
            for task in tasks:
                current = dict(task.next_offsets)
                offsets.update(current)
                if task.id in releasing:
                    kind = PositionKind.RELEASE
                elif task.id in self._claims:
                    kind = PositionKind.CLAIM
                elif self._written.get(task.id) != current:
                    kind = PositionKind.COMMIT
                else:
                    continue
                key, value = encode_position(task.id, kind, self.transactional_id, current)
                sender.send_to_partition(self.positions_topic, positions_partition(task.id), key, value)
                written[task.id] = current
        except RecordProcessingError as error:
            if classify(error) is TransactionErrorKind.FENCED:
                # A flush forwarded to a sink whose send the fenced producer refused: the tasks
                # moved, which is not the app's error (as the processing path treats it too).
                outcome = self._transactional.fail(error)
                sender.discard()
                return outcome
            # A store flush forwarded into a failing node: the app's error, the caller's to report.
            # Part of the commit's writes are in the transaction: none of them may become visible.
            self.abort(sender)
            raise
        except Exception as error:
            outcome = self._transactional.fail(error)  # a client error: abort, or fenced
            sender.discard()
            return outcome
        outcome = self._transactional.commit(flush=sender.flush, confirm=lambda: self._confirm(offsets))
        if outcome is CommitOutcome.COMMITTED:
            for task in tasks:
                task.committed()
            self._written.update(written)
            for task_id in releasing:
                self._written.pop(task_id, None)
            self._claims -= {task.id for task in tasks}
        else:
            sender.discard()
        return outcome

    def _confirm(self, offsets: Mapping[TopicPartition, int]) -> None:
        """The coordinator's offsets, in step, and its word that the member still owns them
        (the counterpart of KIP-447's TxnOffsetCommit generation check). A coordinator that
        cannot answer does not stop the commit: positions and fencing keep it exact."""
        if self._commit_offsets is None or not offsets:
            return
        try:
            self._commit_offsets(offsets)
        except MembershipLost:
            raise
        except Exception as error:
            if not self._coordinator_warned:
                log.warning(
                    "%s: the coordinator did not take the offsets (%s); committing the transaction anyway "
                    "(positions are in it), the coordinator's offsets catch up later",
                    self.transactional_id,
                    error,
                )
            self._coordinator_warned = True
            return
        if self._coordinator_warned:
            log.info("%s: the coordinator takes offsets again", self.transactional_id)
        self._coordinator_warned = False

    def release(self, sender: RecordSender, task_ids: Collection[TaskId]) -> CommitOutcome:
        """After the revocation's commit aborted: release the tasks at their last committed
        positions (what they wrote since is gone), so that their next owner need not fence this
        thread, which keeps its other tasks."""
        assert self._transactional is not None
        known = [t for t in task_ids if t in self._written]
        if not known:
            return CommitOutcome.ABORTED
        self._transactional.ensure_open()
        for task_id in known:
            key, value = encode_position(task_id, PositionKind.RELEASE, self.transactional_id, self._written[task_id])
            sender.send_to_partition(self.positions_topic, positions_partition(task_id), key, value)
        outcome = self._transactional.commit(flush=sender.flush, confirm=lambda: None)
        if outcome is CommitOutcome.COMMITTED:
            for task_id in known:
                self._written.pop(task_id, None)
        else:
            sender.discard()
        return outcome

    def abort(self, sender: RecordSender) -> CommitOutcome:
        assert self._transactional is not None
        outcome = self._transactional.abort()
        sender.discard()
        return outcome

    def forget(self, task_ids: Collection[TaskId]) -> None:
        """Tasks closed without a release (lost, or rebuilt): their claims are void."""
        for task_id in task_ids:
            self._claims.discard(task_id)
            self._written.pop(task_id, None)

    # -- counters ---------------------------------------------------------------------------------

    @property
    def transactions_committed(self) -> int:
        return self._transactional.transaction.committed_count if self._transactional is not None else 0

    @property
    def transactions_aborted(self) -> int:
        return self._transactional.transaction.aborted_count if self._transactional is not None else 0
