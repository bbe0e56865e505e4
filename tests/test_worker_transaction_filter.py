"""The fetch-side transaction filter: the pure rule on records and markers, then the same rule
fed by kafka-python's own parsing of hand-built record batches (transactional data batches and
COMMIT/ABORT control batches, as a broker writes them), through the fetcher hook."""

from __future__ import annotations

import struct

from kafka import TopicPartition
from kafka.consumer.fetcher import Fetcher
from kafka.record import MemoryRecords
from kafka.record._crc32c import crc as crc32c
from kafka.record.default_records import DefaultRecordBatchBuilder

from pystreams.worker.committed_consumer import _FilteringPartitionRecords
from pystreams.worker.transaction_filter import NO_TRANSACTION, TransactionFilter

# -- the rule -----------------------------------------------------------------------------------


def test_records_outside_transactions_pass_at_once() -> None:
    f = TransactionFilter()
    f.add_batch(NO_TRANSACTION, [0, 1, 2])
    assert f.take_released() == [0, 1, 2]
    assert f.held == 0


def test_a_transaction_is_held_until_its_commit_marker() -> None:
    f = TransactionFilter()
    f.add_batch(7, [0, 1])
    f.add_batch(7, [2])
    assert f.take_released() == []
    assert f.held == 3 and f.open_producers == {7}
    f.add_marker(7, committed=True)
    assert f.take_released() == [0, 1, 2]
    assert f.held == 0 and not f.open_producers


def test_an_aborted_transaction_is_dropped_and_counted() -> None:
    f = TransactionFilter()
    f.add_batch(7, [0, 1])
    f.add_marker(7, committed=False)
    f.add_batch(NO_TRANSACTION, [3])
    assert f.take_released() == [3]
    assert f.aborted_records == 2


def test_records_behind_an_open_transaction_wait_so_release_stays_in_offset_order() -> None:
    f = TransactionFilter()
    f.add_batch(7, [0])  # open
    f.add_batch(NO_TRANSACTION, [1])  # committed by nature, but behind 0
    f.add_batch(8, [2])
    f.add_marker(8, committed=True)  # 8 is resolved, still behind 0
    assert f.take_released() == []
    f.add_marker(7, committed=False)
    assert f.take_released() == [1, 2]
    assert f.aborted_records == 1


def test_interleaved_producers_resolve_independently() -> None:
    f = TransactionFilter()
    f.add_batch(7, ["a0"])
    f.add_batch(8, ["b1"])
    f.add_batch(7, ["a2"])
    f.add_marker(7, committed=True)
    assert f.take_released() == ["a0"]  # b1 is still open, a2 waits behind it
    assert [pid for pid, _ in f.pending()] == [8]
    f.add_marker(8, committed=False)
    assert f.take_released() == ["a2"]


def test_a_marker_for_a_transaction_that_started_before_the_reader_changes_nothing() -> None:
    f = TransactionFilter()
    f.add_marker(9, committed=False)
    f.add_batch(NO_TRANSACTION, [5])
    assert f.take_released() == [5]
    assert f.aborted_records == 0


def test_out_of_offset_order_a_transaction_is_released_when_it_ends_not_behind_others() -> None:
    # The positions reader's mode: a writer that died with a transaction open must not hide
    # what others committed after it.
    f = TransactionFilter(in_offset_order=False)
    f.add_batch(7, ["dead-1"])
    f.add_batch(8, ["a-1"])
    f.add_batch(NO_TRANSACTION, ["plain"])
    assert f.take_released() == ["plain"]
    f.add_marker(8, committed=True)
    assert f.take_released() == ["a-1"] and f.held == 1
    f.add_batch(9, ["b-1"])
    f.add_marker(9, committed=False)
    assert f.take_released() == [] and f.aborted_records == 1
    assert [(pid, list(records)) for pid, records in f.pending()] == [(7, ["dead-1"])]
    f.add_marker(7, committed=True)
    assert f.take_released() == ["dead-1"] and f.held == 0 and f.pending() == []


def test_in_offset_order_the_same_records_wait_for_the_open_transaction_ahead() -> None:
    f = TransactionFilter()
    f.add_batch(7, ["dead-1"])
    f.add_batch(8, ["a-1"])
    f.add_batch(NO_TRANSACTION, ["plain"])
    f.add_marker(8, committed=True)
    assert f.take_released() == [] and f.held == 3
    f.add_marker(7, committed=True)
    assert f.take_released() == ["dead-1", "a-1", "plain"]


def test_pending_lists_the_open_transactions_with_their_records() -> None:
    f = TransactionFilter()
    f.add_batch(7, ["x"])
    f.add_batch(7, ["y"])
    f.add_batch(8, ["z"])
    assert [(pid, list(records)) for pid, records in f.pending()] == [(7, ["x", "y"]), (8, ["z"])]


# -- hand-built batches through kafka-python's parsing -------------------------------------------

_BASE_OFFSET = struct.Struct(">q")
_ATTRIBUTES_AT = 21  # base offset (8) + length (4) + leader epoch (4) + magic (1) + crc (4)
_CRC_AT = 17
_CONTROL = 0x20


def data_batch(base_offset: int, values: list[bytes], *, producer_id: int = -1) -> bytes:
    transactional = producer_id >= 0
    builder = DefaultRecordBatchBuilder(2, 0, transactional, producer_id, 0 if transactional else -1, 0 if transactional else -1, 1 << 20)
    for delta, value in enumerate(values):
        builder.append(delta, timestamp=1_000 + delta, key=None, value=value, headers=[])
    return _with_base_offset(bytes(builder.build()), base_offset)


def marker_batch(offset: int, producer_id: int, *, commit: bool) -> bytes:
    """A control batch as a broker writes it: one record, key = (version 0, type 1 COMMIT / 0 ABORT)."""
    builder = DefaultRecordBatchBuilder(2, 0, True, producer_id, 0, -1, 1 << 20)
    builder.append(0, timestamp=2_000, key=struct.pack(">hh", 0, 1 if commit else 0), value=b"\x00\x00\x00\x00\x00\x00", headers=[])
    raw = bytearray(_with_base_offset(bytes(builder.build()), offset))
    raw[_ATTRIBUTES_AT + 1] |= _CONTROL  # attributes are an int16; the control bit is in its low byte
    return _recrc(raw)


def _with_base_offset(raw: bytes, base_offset: int) -> bytes:
    patched = bytearray(raw)
    _BASE_OFFSET.pack_into(patched, 0, base_offset)
    return bytes(patched)


def _recrc(raw: bytearray) -> bytes:
    struct.pack_into(">I", raw, _CRC_AT, crc32c(bytes(raw[_ATTRIBUTES_AT:])))
    return bytes(raw)


def fetch(raw: bytes, fetch_offset: int, filters: dict) -> tuple[list[int], int]:
    class Records(_FilteringPartitionRecords):
        pass

    Records.filters = filters
    parsed = Records(fetch_offset, TopicPartition("t", 0), MemoryRecords(raw))
    records = parsed.take()
    return [r.offset for r in records], parsed.next_fetch_offset


def test_the_hook_builds_well_formed_batches_kafka_python_recognises() -> None:
    records = MemoryRecords(data_batch(0, [b"a"], producer_id=5) + marker_batch(1, 5, commit=False))
    data = records.next_batch()
    marker = records.next_batch()
    assert data.is_transactional and not data.is_control_batch and data.producer_id == 5 and data.validate_crc()
    assert marker.is_control_batch and marker.validate_crc() and next(iter(marker)).abort


def test_committed_aborted_and_plain_batches_come_out_as_read_committed_means() -> None:
    raw = (
        data_batch(0, [b"c0", b"c1", b"c2"], producer_id=1)
        + marker_batch(3, 1, commit=True)
        + data_batch(4, [b"a4"], producer_id=1)
        + marker_batch(5, 1, commit=False)
        + data_batch(6, [b"p6"])
    )
    filters: dict = {}
    offsets, next_offset = fetch(raw, 0, filters)
    assert offsets == [0, 1, 2, 6]
    assert next_offset == 7
    assert filters[TopicPartition("t", 0)].aborted_records == 1


def test_a_transaction_whose_marker_comes_in_a_later_fetch_is_held_across_fetches() -> None:
    filters: dict = {}
    offsets, next_offset = fetch(data_batch(0, [b"x", b"y"], producer_id=3) + data_batch(2, [b"p"]), 0, filters)
    assert offsets == [] and next_offset == 3  # the position moves on; the filter keeps them
    offsets, next_offset = fetch(marker_batch(3, 3, commit=True), 3, filters)
    assert offsets == [0, 1, 2] and next_offset == 4


def test_a_fetch_from_the_middle_of_a_batch_skips_its_earlier_records() -> None:
    filters: dict = {}
    offsets, _ = fetch(data_batch(10, [b"a", b"b", b"c"], producer_id=2) + marker_batch(13, 2, commit=True), 11, filters)
    assert offsets == [11, 12]


def test_the_hook_keeps_kafka_pythons_record_shape() -> None:
    class Records(_FilteringPartitionRecords):
        pass

    Records.filters = {}
    parsed = Records(0, TopicPartition("t", 0), MemoryRecords(data_batch(0, [b"v"])))
    [record] = parsed.take()
    assert (record.topic, record.partition, record.offset, record.value, record.timestamp) == ("t", 0, 0, b"v", 1_000)
    assert issubclass(_FilteringPartitionRecords, Fetcher.PartitionRecords)
