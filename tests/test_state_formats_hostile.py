"""What this change stores and reads back — a packed repartition record with headers (format
2) and a versioned key's history — given garbage, every truncation, nulls and huge inputs:
each decodes, or fails with its format's own error (which the runtime turns into a failed
record or a StateError naming the store), never another exception."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pystreams.state import InMemoryChangelog, StateError, TaskState

from pystreams.worker.packing import PACKED_WITH_HEADERS, PackedFormatError, RepartitionBuffers, unpack
from pystreams.worker.packing import UnpackedRecord as Record


def packed_v2(data: bytes) -> Record:
    return Record("t", 0, 0, 0, None, data, tuple(PACKED_WITH_HEADERS))


def unpacks_or_refuses(data: bytes) -> None:
    try:
        unpack(packed_v2(data))
    except (msgspec.MsgspecError, PackedFormatError):
        pass


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=64))
def test_any_bytes_as_a_packed_record_with_headers_unpack_or_raise_a_decode_error(data: bytes) -> None:
    unpacks_or_refuses(data)


def test_every_truncation_of_a_packed_record_with_headers_and_huge_ones() -> None:
    buffers = RepartitionBuffers({"t": 1})
    sink = buffers.sink("t")
    sink(b"k", b"v", 1, (("h", b"x"), ("null", None)))
    sink(None, None, 2, ())
    ((_, _, value, _),) = list(buffers.drain())
    assert [tuple(entry[:3]) for entry in unpack(packed_v2(value))] == [(b"k", b"v", 1), (None, None, 2)]
    for end in range(len(value)):
        unpacks_or_refuses(value[:end])
    for huge in (b"\xff" * 1_000_000, b"\x91\x94\xc0\xc0\x00\x91\x92\xa1h\xc6\x7f\xff\xff\xff" + b"x" * 1000):
        unpacks_or_refuses(huge)


@pytest.mark.parametrize("stored", [b"", b"\xc1", b"\x91\x92\x01", b"\x91\x92\xa1x\xc0", b"\xff" * 1_000_000, b"\x92\x92\x01\xc4\x01a\x92\x02"])
def test_an_unreadable_history_is_a_state_error_naming_the_store(stored: bytes) -> None:
    with TaskState(None, "app", "0_0", 0, InMemoryChangelog()) as state:
        store = state.versioned_store("prices", history_ms=10)
        store._write(b"\x01k", stored)  # what no writer of ours produces
        for read in (lambda: store.get(b"k"), lambda: store.get_as_of(b"k", 5), lambda: store.put_version(b"k", b"v", 5)):
            with pytest.raises(StateError, match="versioned store 'prices'"):
                read()


def test_a_history_survives_every_truncation_as_a_state_error_or_a_history() -> None:
    with TaskState(None, "app", "0_0", 0, InMemoryChangelog()) as state:
        store = state.versioned_store("prices", history_ms=1000)
        for timestamp, value in ((1, b"a"), (5, None), (9, b"c" * 300)):
            store.put_version(b"k", value, timestamp)
        whole = msgspec.msgpack.encode(store.history(b"k"))
        for end in range(len(whole)):
            store._write(b"\x01k", whole[:end] or None)
            try:
                store.get(b"k")
            except StateError:
                pass
