"""The exactly-once transaction state machine and the takeover rule of the position records
(both sans-IO), and the transactional producer wrapper driven by a scripted kafka-python
stand-in (which only records calls and raises what it is told to: the decisions are the
state machine's)."""

from __future__ import annotations

from typing import Any

import pytest
from kafka import errors as kafka_errors
from pystreams.state import TopicPartition
from pystreams.topology.ir import TaskId

from pystreams.worker.errors import ProduceError, RecordProcessingError
from pystreams.worker.positions import (
    Fence,
    Lost,
    PositionKind,
    PositionRecord,
    PositionTable,
    Resume,
    Wait,
    decode_position,
    encode_position,
    pending_writers,
    plan_takeover,
    still_fenced,
)
from pystreams.worker.transaction import (
    CommitOutcome,
    MembershipLost,
    Recovery,
    Transaction,
    TransactionError,
    TransactionErrorKind,
    TransactionState,
    classify,
)
from pystreams.worker.transactional_producer import TransactionalProducer

S = TransactionState


def open_transaction() -> Transaction:
    t = Transaction()
    t.initialized()
    t.begin()
    return t


# -- the state machine ---------------------------------------------------------------------------


def test_begin_commit_begin() -> None:
    t = open_transaction()
    assert t.state is S.IN_TRANSACTION and t.open
    t.commit_started()
    assert not t.open
    assert t.committed() is CommitOutcome.COMMITTED
    assert t.state is S.READY and t.committed_count == 1
    t.begin()
    assert t.open


def test_steps_out_of_order_are_refused() -> None:
    t = Transaction()
    with pytest.raises(TransactionError, match="cannot begin a transaction that is uninitialized"):
        t.begin()
    t.initialized()
    with pytest.raises(TransactionError, match="cannot commit"):
        t.commit_started()
    t.begin()
    with pytest.raises(TransactionError):
        t.committed()


def test_an_error_while_committing_aborts_and_the_tasks_are_rebuilt() -> None:
    t = open_transaction()
    t.commit_started()
    plan = t.failed(ProduceError("a produced record was not written: KafkaTimeoutError"))
    assert plan.recovery is Recovery.ABORT and plan.outcome is CommitOutcome.ABORTED
    assert t.state is S.ABORTING
    assert t.aborted() is CommitOutcome.ABORTED
    assert t.state is S.READY and t.aborted_count == 1


@pytest.mark.parametrize(
    "error",
    [
        kafka_errors.ProducerFencedError(),
        kafka_errors.InvalidProducerEpochError(),
        ProduceError("wrapped"),  # with the fencing error as its cause, as RecordSender raises it
    ],
)
def test_fencing_errors_from_the_broker_mean_task_migration_and_a_new_producer(error: BaseException) -> None:
    if isinstance(error, ProduceError):
        error.__cause__ = kafka_errors.ProducerFencedError()
    t = open_transaction()
    t.commit_started()
    plan = t.failed(error)
    assert plan == plan.__class__(Recovery.REPLACE_PRODUCER, CommitOutcome.MIGRATED)
    assert t.state is S.FENCED and t.fenced_count == 1
    t.replaced()
    assert t.state is S.UNINITIALIZED  # the new producer initializes before the next transaction


def test_the_coordinator_refusing_the_member_aborts_and_migrates() -> None:
    t = open_transaction()
    t.commit_started()
    plan = t.membership_lost()
    assert plan.recovery is Recovery.ABORT
    assert t.aborted() is CommitOutcome.MIGRATED


def test_an_abort_that_fails_replaces_the_producer_and_keeps_the_outcome() -> None:
    t = open_transaction()
    t.commit_started()
    t.membership_lost()
    plan = t.failed(kafka_errors.KafkaTimeoutError())
    assert plan.recovery is Recovery.REPLACE_PRODUCER and plan.outcome is CommitOutcome.MIGRATED
    assert t.state is S.FENCED


def test_fatal_errors_stop_the_thread() -> None:
    t = open_transaction()
    with pytest.raises(TransactionError, match="for good"):
        t.failed(kafka_errors.TransactionalIdAuthorizationFailedError())
    assert t.state is S.FAILED


def test_a_send_refused_after_fencing_is_a_fencing_error() -> None:
    # What kafka-python raises from send() once its producer was fenced: the cause is an argument.
    refused = kafka_errors.KafkaError(
        "Cannot perform send because at least one previous transactional or idempotent request has failed with errors.", kafka_errors.ProducerFencedError()
    )
    assert classify(refused) is TransactionErrorKind.FENCED
    wrapped = RuntimeError("node failed")
    wrapped.__cause__ = refused
    assert classify(wrapped) is TransactionErrorKind.FENCED


def test_error_classification() -> None:
    assert classify(MembershipLost("unknown member")) is TransactionErrorKind.FENCED
    assert classify(kafka_errors.KafkaTimeoutError()) is TransactionErrorKind.ABORTABLE
    assert classify(kafka_errors.ClusterAuthorizationFailedError()) is TransactionErrorKind.FATAL


# -- the producer wrapper, scripted -------------------------------------------------------------


class ScriptedProducer:
    """Records the transactional calls made; raises the error queued for a call name."""

    def __init__(self, log: list[str], failures: dict[str, BaseException]) -> None:
        self.log = log
        self.failures = failures

    def _call(self, name: str) -> None:
        self.log.append(name)
        error = self.failures.pop(name, None)
        if error is not None:
            raise error

    def init_transactions(self) -> None:
        self._call("init")

    def begin_transaction(self) -> None:
        self._call("begin")

    def commit_transaction(self, timeout_ms: int | None = None) -> None:
        self._call("commit")

    def abort_transaction(self, timeout_ms: int | None = None) -> None:
        self._call("abort")

    def close(self, timeout: Any = None) -> None:
        self._call("close")


def scripted(failures: dict[str, BaseException] | None = None) -> tuple[TransactionalProducer, list[str], list[Any]]:
    log: list[str] = []
    failures = failures if failures is not None else {}
    replaced: list[Any] = []
    producer = TransactionalProducer("app-1-0", lambda: ScriptedProducer(log, failures), end_timeout_ms=1000, on_new_producer=replaced.append)
    return producer, log, replaced


def test_the_producer_initializes_lazily_then_commits_and_begins_again() -> None:
    producer, log, _ = scripted()
    assert log == []  # nothing fences anyone before the member is in the group
    producer.ensure_open()
    producer.ensure_open()
    assert producer.commit(flush=lambda: log.append("flush"), confirm=lambda: log.append("confirm")) is CommitOutcome.COMMITTED
    assert log == ["init", "begin", "flush", "confirm", "commit", "begin"]


def test_a_refused_member_aborts_instead_of_committing() -> None:
    producer, log, _ = scripted()
    producer.ensure_open()

    def refuse() -> None:
        raise MembershipLost("FENCED_MEMBER_EPOCH")

    assert producer.commit(flush=lambda: None, confirm=refuse) is CommitOutcome.MIGRATED
    assert "commit" not in log and log[-2:] == ["abort", "begin"]


def test_a_fenced_commit_replaces_the_producer_which_initializes_again() -> None:
    producer, log, replaced = scripted({"commit": kafka_errors.ProducerFencedError()})
    producer.ensure_open()
    assert producer.commit(flush=lambda: None, confirm=lambda: None) is CommitOutcome.MIGRATED
    assert len(replaced) == 1 and log[-1] == "close"
    producer.ensure_open()
    assert log[-2:] == ["init", "begin"]


def test_a_failure_reported_mid_transaction_aborts_or_replaces_as_the_machine_says() -> None:
    producer, log, replaced = scripted()
    producer.ensure_open()
    assert producer.fail(kafka_errors.KafkaTimeoutError()) is CommitOutcome.ABORTED
    assert log[-2:] == ["abort", "begin"] and not replaced
    assert producer.fail(kafka_errors.KafkaError("refused", kafka_errors.ProducerFencedError())) is CommitOutcome.MIGRATED
    assert len(replaced) == 1


def test_a_failed_flush_aborts_and_the_next_transaction_is_open() -> None:
    producer, log, _ = scripted()
    producer.ensure_open()

    def flush() -> None:
        raise ProduceError("a produced record was not written")

    assert producer.commit(flush=flush, confirm=lambda: None) is CommitOutcome.ABORTED
    assert log[-2:] == ["abort", "begin"] and producer.transaction.open


# -- position records and the takeover rule -----------------------------------------------------

T = TaskId(1, 3)
IN = TopicPartition("in", 3)


def record(kind: PositionKind, writer: str, offset: int = 10) -> PositionRecord:
    _, value = encode_position(T, kind, writer, {IN: offset})
    decoded = decode_position(str(T).encode(), value)
    assert decoded is not None
    return decoded[1]


def test_position_records_round_trip() -> None:
    key, value = encode_position(T, PositionKind.COMMIT, "app-p-0", {IN: 42})
    task, decoded = decode_position(key, value)  # type: ignore[misc]
    assert task == T and decoded.kind is PositionKind.COMMIT and decoded.writer == "app-p-0"
    assert decoded.input_offsets() == {IN: 42}


def test_the_table_keeps_the_latest_record_and_skips_unreadable_ones() -> None:
    table = PositionTable()
    table.apply(
        [(0, *encode_position(T, PositionKind.COMMIT, "a", {IN: 1})), (1, b"1_3", b"{not json"), (2, *encode_position(T, PositionKind.COMMIT, "a", {IN: 5}))]
    )
    assert table.latest[T].input_offsets() == {IN: 5} and table.unreadable == 1


def test_the_table_keeps_the_record_at_the_highest_offset_whatever_order_transactions_end_in() -> None:
    # The reader releases each transaction when it ends: one that ended later may hold older records.
    table = PositionTable()
    table.apply([(7, *encode_position(T, PositionKind.RELEASE, "b", {IN: 12}))])
    table.apply([(3, *encode_position(T, PositionKind.COMMIT, "a", {IN: 9}))])
    assert table.latest[T].writer == "b" and table.latest[T].input_offsets() == {IN: 12}
    table.apply([(5, str(T).encode(), None)])  # an older tombstone changes nothing either
    assert table.latest[T].writer == "b"
    table.apply([(9, str(T).encode(), None)])
    assert T not in table.latest
    assert pending_writers([(4, *encode_position(T, PositionKind.COMMIT, "b", {IN: 9})), (2, *encode_position(T, PositionKind.CLAIM, "b", {IN: 8}))]) == {
        T: {"b": 4}
    }


def test_a_fence_covers_the_writers_records_before_it_and_not_a_later_incarnations() -> None:
    # "old" fenced when the partition ended at 10; "again" fenced at 10 but wrote at 12 since:
    # the same transactional id restarted (on its state directory) and must be fenced again.
    assert still_fenced({"old": 10, "again": 10}, {"old": 9, "again": 12}) == {"old"}
    assert still_fenced({"old": 10}, {}) == {"old"}
    latest = record(PositionKind.COMMIT, "again")
    fenced = still_fenced({"again": 10}, {"again": 12})
    assert plan_takeover(latest, set(), me="new", fenced=fenced, reviving=False) == Fence(frozenset({"again"}))


def test_a_released_task_is_resumed_without_fencing_anyone() -> None:
    assert plan_takeover(record(PositionKind.RELEASE, "old"), set(), me="new", fenced=set(), reviving=False) == Resume({IN: 10})


def test_an_owner_that_did_not_release_is_fenced_first() -> None:
    latest = record(PositionKind.COMMIT, "old")
    assert plan_takeover(latest, set(), me="new", fenced=set(), reviving=False) == Fence(frozenset({"old"}))
    assert plan_takeover(latest, set(), me="new", fenced={"old"}, reviving=False) == Resume({IN: 10})


def test_a_claim_names_an_owner_that_crashed_before_its_first_commit() -> None:
    assert plan_takeover(record(PositionKind.CLAIM, "crashed"), set(), me="new", fenced=set(), reviving=False) == Fence(frozenset({"crashed"}))


def test_open_transactions_with_the_task_positions_are_fenced_then_awaited() -> None:
    latest = record(PositionKind.RELEASE, "old")
    assert plan_takeover(latest, {"zombie"}, me="new", fenced=set(), reviving=False) == Fence(frozenset({"zombie"}))
    assert plan_takeover(latest, {"zombie"}, me="new", fenced={"zombie"}, reviving=False) == Wait(frozenset({"zombie"}))


def test_our_own_records_need_no_fence() -> None:
    # a restart with the same transactional id: initializing our producer fenced the old one
    assert plan_takeover(record(PositionKind.COMMIT, "me"), set(), me="me", fenced=set(), reviving=False) == Resume({IN: 10})


def test_a_task_without_position_records_resumes_from_the_coordinator() -> None:
    assert plan_takeover(None, set(), me="me", fenced=set(), reviving=False) == Resume(None)


def test_a_revival_never_fences_a_newer_owner() -> None:
    assert plan_takeover(record(PositionKind.CLAIM, "newer"), set(), me="me", fenced=set(), reviving=True) == Lost("newer")
    assert plan_takeover(record(PositionKind.COMMIT, "me"), set(), me="me", fenced=set(), reviving=True) == Resume({IN: 10})


class _FlushFails:
    """A task whose cache flush forwards into a sink whose send raises ``error``."""

    id = T
    next_offsets: dict[TopicPartition, int] = {IN: 11}

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def flush(self) -> None:
        raise self.error


class _Sender:
    def __init__(self) -> None:
        self.discarded = 0

    def discard(self) -> None:
        self.discarded += 1


def _exactly_once_commits(producer: TransactionalProducer) -> Any:
    from pystreams.worker.commits import ExactlyOnceCommits

    commits = ExactlyOnceCommits(
        transactional_id="app-1-0",
        positions_topic="app-input-positions",
        make_positions_consumer=lambda: None,
        make_fencing_producer=lambda transactional_id: None,
        committed_offsets=None,
        commit_offsets=None,
        transaction_timeout_ms=1000,
    )
    commits._transactional = producer
    return commits


def test_a_flush_refused_by_a_fenced_producer_migrates_the_tasks_instead_of_failing_the_app() -> None:
    from pystreams.topology.kernels import RecordFailure

    from pystreams.worker.errors import ErrorKind

    producer, log, replaced = scripted()
    producer.ensure_open()
    refused = kafka_errors.KafkaError("Cannot perform send because at least one previous transactional request has failed.", kafka_errors.ProducerFencedError())
    failure = RecordFailure(kind=ErrorKind.PROCESSING, task_id="1_3", topic=None, partition=None, offset=None, node="to-sink", reason="KafkaError")
    error = RecordProcessingError(failure)
    error.__cause__ = refused
    sender = _Sender()
    assert _exactly_once_commits(producer).commit(sender, [_FlushFails(error)]) is CommitOutcome.MIGRATED
    assert len(replaced) == 1 and sender.discarded == 1 and "commit" not in log


def test_a_flush_that_fails_in_the_apps_node_aborts_and_is_the_apps_error() -> None:
    from pystreams.topology.kernels import RecordFailure

    from pystreams.worker.errors import ErrorKind

    producer, log, replaced = scripted()
    producer.ensure_open()
    failure = RecordFailure(kind=ErrorKind.PROCESSING, task_id="1_3", topic=None, partition=None, offset=None, node="mapper", reason="ValueError")
    error = RecordProcessingError(failure)
    error.__cause__ = ValueError("the app's bug")
    with pytest.raises(RecordProcessingError):
        _exactly_once_commits(producer).commit(_Sender(), [_FlushFails(error)])
    assert log[-2:] == ["abort", "begin"] and not replaced
