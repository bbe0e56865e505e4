"""The transactional producer of one stream thread under exactly-once: kafka-python's
transactional KafkaProducer driven by the :class:`~pystreams.worker.transaction.Transaction`
state machine (which decides; this class only does what it says).

The producer is created eagerly but initialized lazily (``ensure_open``, before the first task
starts): ``init_transactions`` fences any other producer with the same transactional id (a
previous incarnation of this thread, or a zombie of it) and aborts its open transaction, so it
must not run before the member is in the group — a second process started by mistake with the
same static instance id waits outside the group and must not fence the running one.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

from .transaction import CommitOutcome, MembershipLost, Plan, Recovery, Transaction, TransactionState

log = logging.getLogger(__name__)

#: How long closing a fenced or broken producer may take (its pending records fail anyway).
_CLOSE_TIMEOUT_S = 2.0


class TransactionalProducer:
    def __init__(
        self,
        transactional_id: str,
        make_producer: Callable[[], Any],
        *,
        end_timeout_ms: int,
        on_new_producer: Callable[[Any], None] = lambda p: None,
    ) -> None:
        """``make_producer``: a transactional producer whose ``commit_transaction`` and
        ``abort_transaction`` take a ``timeout_ms`` (:class:`~pystreams.worker.kafka_io.BoundedTransactionsProducer`).
        ``end_timeout_ms``: how long a commit or abort may wait for the broker before the
        producer counts as broken (and is replaced; its transaction is aborted by the next
        producer's initialization)."""
        self.transactional_id = transactional_id
        self._end_timeout_ms = end_timeout_ms
        self.transaction = Transaction()
        self._make_producer = make_producer
        self._on_new_producer = on_new_producer
        self.producer = make_producer()

    # -- opening ----------------------------------------------------------------------------------

    def ensure_open(self) -> None:
        """Initialize (once per producer) and begin a transaction unless one is open. Raises
        when that fails; the producer is replaced first if it cannot be used again."""
        transaction = self.transaction
        if transaction.state is TransactionState.IN_TRANSACTION:
            return
        if transaction.state is TransactionState.FENCED:
            self._replace()
        try:
            if transaction.state is TransactionState.UNINITIALIZED:
                self.producer.init_transactions()
                transaction.initialized()
                log.info("transactional producer %s initialized", self.transactional_id)
            self.producer.begin_transaction()
            transaction.begin()
        except Exception as error:
            plan = transaction.failed(error)
            if plan.recovery is Recovery.REPLACE_PRODUCER:
                self._replace()
            raise

    # -- ending -----------------------------------------------------------------------------------

    def commit(self, flush: Callable[[], None], confirm: Callable[[], None]) -> CommitOutcome:
        """Commit the open transaction: ``flush`` (every record sent and acknowledged), then
        ``confirm`` (the coordinator still counts the member as the owner; raises
        MembershipLost if not), then EndTxn. Anything that fails aborts the transaction."""
        transaction = self.transaction
        transaction.commit_started()
        try:
            flush()
            confirm()
        except MembershipLost as error:
            log.warning("transaction of %s aborted: %s", self.transactional_id, error)
            return self._run(transaction.membership_lost())
        except Exception as error:
            log.warning("transaction of %s cannot commit (%r); aborting it", self.transactional_id, error)
            return self._run(transaction.failed(error))
        try:
            self.producer.commit_transaction(timeout_ms=self._end_timeout_ms)
        except Exception as error:
            log.warning("committing the transaction of %s failed (%r)", self.transactional_id, error)
            return self._run(transaction.failed(error))
        outcome = transaction.committed()
        self._begin_next()
        return outcome

    def fail(self, error: BaseException) -> CommitOutcome:
        """``error`` broke the open transaction (a send refused, a flush failed): abort it, or
        replace the producer if it was fenced; the outcome says what the tasks must do."""
        log.warning("transaction of %s failed (%r)", self.transactional_id, error)
        return self._run(self.transaction.failed(error))

    def abort(self) -> CommitOutcome:
        """Give the open transaction up (its writes never become visible)."""
        if not self.transaction.open:
            return CommitOutcome.ABORTED
        return self._run(self.transaction.abort_requested())

    def _run(self, plan: Plan) -> CommitOutcome:
        outcome = plan.outcome
        if plan.recovery is Recovery.ABORT:
            try:
                self.producer.abort_transaction(timeout_ms=self._end_timeout_ms)
                outcome = self.transaction.aborted()
                self._begin_next()
                return outcome
            except Exception as error:
                log.warning("aborting the transaction of %s failed (%r); replacing its producer", self.transactional_id, error)
                plan = self.transaction.failed(error)
                outcome = plan.outcome
        self._replace()
        return outcome

    def _begin_next(self) -> None:
        # Local only (no request until the first send); a failure here shows at the next ensure_open.
        try:
            self.producer.begin_transaction()
            self.transaction.begin()
        except Exception as error:
            log.warning("beginning a transaction of %s failed (%r)", self.transactional_id, error)
            if self.transaction.failed(error).recovery is Recovery.REPLACE_PRODUCER:
                self._replace()

    def _replace(self) -> None:
        old, self.producer = self.producer, None
        with contextlib.suppress(Exception):
            old.close(timeout=_CLOSE_TIMEOUT_S)
        self.transaction.replaced()
        self.producer = self._make_producer()
        self._on_new_producer(self.producer)
        log.info("transactional producer %s replaced; it initializes again before the next transaction", self.transactional_id)

    def close(self) -> None:
        """Abort what is open (nothing was committed for it) and close."""
        if self.transaction.open:
            with contextlib.suppress(Exception):
                self.producer.abort_transaction(timeout_ms=self._end_timeout_ms)
        with contextlib.suppress(Exception):
            self.producer.close(timeout=_CLOSE_TIMEOUT_S)


def fence_transactional_id(transactional_id: str, make_producer: Callable[[str], Any]) -> None:
    """Fence every producer that uses ``transactional_id`` (a task's previous owner): initializing
    one with that id aborts its open transaction and bumps the epoch, so the old producer's
    later sends and commits fail with ProducerFenced."""
    producer = make_producer(transactional_id)
    try:
        producer.init_transactions()
    finally:
        with contextlib.suppress(Exception):
            producer.close(timeout=_CLOSE_TIMEOUT_S)


__all__ = ["MembershipLost", "TransactionalProducer", "fence_transactional_id"]
