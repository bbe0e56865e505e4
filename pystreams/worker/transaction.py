"""The transaction of one stream thread under exactly-once (sans-IO): which step is legal now,
and what a failure means for the thread's tasks.

One transactional producer per stream thread (KIP-447): every task of the thread writes into
the same open transaction, and a commit ends it for all of them. The IO side
(:mod:`pystreams.worker.transactional_producer`) tells this machine what happened; the machine
answers with the recovery to run and the outcome for the tasks:

    UNINITIALIZED --initialized--> READY --begin--> IN_TRANSACTION --commit_started--> COMMITTING
    COMMITTING --committed--> READY
    IN_TRANSACTION/COMMITTING --failed(abortable)--> ABORTING --aborted--> READY     (ABORTED)
    COMMITTING --membership_lost--> ABORTING --aborted--> READY                     (MIGRATED)
    any --failed(fenced)--> FENCED --replaced--> UNINITIALIZED                      (MIGRATED)
    any --failed(fatal)--> FAILED

* ABORTED: the transaction's writes are gone; the thread's tasks that wrote into it hold state
  the broker never committed, so they are rebuilt (closed dirty, restored, resumed from their
  last committed positions) — Kafka Streams' "task corrupted".
* MIGRATED: another owner took over (the producer was fenced by a newer one with the same
  transactional id or by a task's new owner, or the coordinator refused the member): the
  thread drops every task without committing and asks the group what it owns now — Kafka
  Streams' "task migrated".
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from kafka import errors as kafka_errors


class TransactionState(Enum):
    UNINITIALIZED = "uninitialized"
    READY = "ready"
    IN_TRANSACTION = "in_transaction"
    COMMITTING = "committing"
    ABORTING = "aborting"
    FENCED = "fenced"
    FAILED = "failed"


class CommitOutcome(Enum):
    COMMITTED = "committed"
    #: The transaction was aborted; the tasks that wrote into it must be rebuilt.
    ABORTED = "aborted"
    #: The thread no longer owns its tasks: drop them all without committing.
    MIGRATED = "migrated"


class TransactionErrorKind(Enum):
    #: Someone else owns our transactional id or our tasks now.
    FENCED = "fenced"
    #: The transaction cannot commit, but the producer can abort it and go on.
    ABORTABLE = "abortable"
    #: Nothing a retry can fix (authorization, configuration, an unsupported broker).
    FATAL = "fatal"


class Recovery(Enum):
    ABORT = "abort"
    REPLACE_PRODUCER = "replace_producer"


class MembershipLost(Exception):
    """The group coordinator refused the member's offsets (fenced or unknown member): its tasks
    belong to someone else now."""


class TransactionError(RuntimeError):
    """A step that the transaction's state does not allow, or a fatal transaction error."""


_FENCING = (
    kafka_errors.ProducerFencedError,
    kafka_errors.InvalidProducerEpochError,
    MembershipLost,
)
_FATAL = (
    kafka_errors.TransactionalIdAuthorizationFailedError,
    kafka_errors.ClusterAuthorizationFailedError,
    kafka_errors.TopicAuthorizationFailedError,
    kafka_errors.UnsupportedVersionError,
    kafka_errors.UnsupportedForMessageFormatError,
    kafka_errors.KafkaConfigurationError,
)


def classify(error: BaseException) -> TransactionErrorKind:
    """What an error raised inside a transaction means. The errors it wraps are looked at too:
    its cause chain (our sender and the processing-error policy wrap the client's error) and
    exceptions among its arguments (kafka-python's "Cannot perform send because at least one
    previous transactional or idempotent request has failed" carries the fencing error there)."""
    seen: set[int] = set()
    pending: list[BaseException] = [error]
    kinds: set[TransactionErrorKind] = set()
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, _FENCING):
            kinds.add(TransactionErrorKind.FENCED)
        elif isinstance(current, _FATAL):
            kinds.add(TransactionErrorKind.FATAL)
        pending.extend(e for e in (current.__cause__, current.__context__, *current.args) if isinstance(e, BaseException))
    for kind in (TransactionErrorKind.FENCED, TransactionErrorKind.FATAL):
        if kind in kinds:
            return kind
    return TransactionErrorKind.ABORTABLE


@dataclass(frozen=True, slots=True)
class Plan:
    """What to do after a failure, and what the tasks will be told once it is done."""

    recovery: Recovery
    outcome: CommitOutcome


class Transaction:
    """The state of one thread's transactions, and counters for metrics."""

    def __init__(self) -> None:
        self.state = TransactionState.UNINITIALIZED
        self.committed_count = 0
        self.aborted_count = 0
        self.fenced_count = 0
        self._outcome_of_abort = CommitOutcome.ABORTED

    def _expect(self, step: str, *states: TransactionState) -> None:
        if self.state not in states:
            allowed = " or ".join(s.value for s in states)
            raise TransactionError(f"cannot {step} a transaction that is {self.state.value} (needs {allowed})")

    # -- the happy path -------------------------------------------------------------------------

    def initialized(self) -> None:
        self._expect("initialize", TransactionState.UNINITIALIZED)
        self.state = TransactionState.READY

    def begin(self) -> None:
        self._expect("begin", TransactionState.READY)
        self.state = TransactionState.IN_TRANSACTION

    def commit_started(self) -> None:
        self._expect("commit", TransactionState.IN_TRANSACTION)
        self.state = TransactionState.COMMITTING

    def committed(self) -> CommitOutcome:
        self._expect("complete the commit of", TransactionState.COMMITTING)
        self.state = TransactionState.READY
        self.committed_count += 1
        return CommitOutcome.COMMITTED

    @property
    def open(self) -> bool:
        """Sends are allowed (a transaction is open and not ending)."""
        return self.state is TransactionState.IN_TRANSACTION

    # -- failures ---------------------------------------------------------------------------------

    def abort_requested(self) -> Plan:
        """The thread gives its open transaction up (tasks lost): abort it."""
        self._expect("abort", TransactionState.IN_TRANSACTION, TransactionState.COMMITTING)
        self.state = TransactionState.ABORTING
        self._outcome_of_abort = CommitOutcome.ABORTED
        return Plan(Recovery.ABORT, CommitOutcome.ABORTED)

    def membership_lost(self) -> Plan:
        """The coordinator refused the member while the transaction was committing: abort it,
        and the tasks are migrated (not rebuilt here)."""
        self._expect("abort", TransactionState.COMMITTING)
        self.state = TransactionState.ABORTING
        self._outcome_of_abort = CommitOutcome.MIGRATED
        return Plan(Recovery.ABORT, CommitOutcome.MIGRATED)

    def failed(self, error: BaseException) -> Plan:
        """``error`` was raised by a step; raises TransactionError when it is fatal."""
        kind = classify(error)
        if kind is TransactionErrorKind.FATAL:
            self.state = TransactionState.FAILED
            raise TransactionError(f"transaction failed for good: {error!r}") from error
        if kind is TransactionErrorKind.FENCED or self.state in (TransactionState.ABORTING, TransactionState.UNINITIALIZED):
            # A failed abort or init leaves the producer in an unknown state: replace it. Its
            # transaction, if any, is aborted by the new producer's initialization.
            outcome = CommitOutcome.MIGRATED if kind is TransactionErrorKind.FENCED else self._failed_abort_outcome()
            if kind is TransactionErrorKind.FENCED:
                self.fenced_count += 1
            self.state = TransactionState.FENCED
            return Plan(Recovery.REPLACE_PRODUCER, outcome)
        self._expect("abort", TransactionState.IN_TRANSACTION, TransactionState.COMMITTING, TransactionState.READY)
        if self.state is TransactionState.READY:  # begin failed: nothing to abort
            self.state = TransactionState.FENCED
            return Plan(Recovery.REPLACE_PRODUCER, CommitOutcome.ABORTED)
        self.state = TransactionState.ABORTING
        self._outcome_of_abort = CommitOutcome.ABORTED
        return Plan(Recovery.ABORT, CommitOutcome.ABORTED)

    def _failed_abort_outcome(self) -> CommitOutcome:
        return self._outcome_of_abort if self.state is TransactionState.ABORTING else CommitOutcome.ABORTED

    def aborted(self) -> CommitOutcome:
        self._expect("complete the abort of", TransactionState.ABORTING)
        self.state = TransactionState.READY
        self.aborted_count += 1
        return self._outcome_of_abort

    def replaced(self) -> None:
        """A new producer replaces the fenced or broken one; it must be initialized again."""
        self._expect("replace the producer of", TransactionState.FENCED)
        self.state = TransactionState.UNINITIALIZED
