"""The serdes of the table and foreign-key join topics read what other tasks wrote: any bytes —
truncated, garbage, huge — either decode or raise SerdeError naming the serde, never another
exception; and what they write reads back."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from pystreams.topology import foreign_key as fk

from pystreams import serdes
from pystreams.serdes import SerdeError

SERDES = [serdes.Change(serdes.Int()), fk.SubscriptionSerde(serdes.Text()), fk.ResponseSerde(serdes.Json())]


def _decodes_or_refuses(data: bytes) -> None:
    for serde in SERDES:
        try:
            serde.deserialize(data)
        except SerdeError:
            pass


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=64))
def test_any_bytes_decode_or_raise_serde_error(data: bytes) -> None:
    _decodes_or_refuses(data)


def test_huge_inputs_decode_or_raise_serde_error() -> None:
    for data in (b"\x92" + b"\xc6\x7f\xff\xff\xff" + b"x" * 1000, b"\xff" * 1_000_000, serdes.Change(serdes.Bytes()).serialize((b"x" * 5_000_000, None))):
        _decodes_or_refuses(data)


def test_what_they_write_reads_back_and_every_truncation_is_a_serde_error_or_a_value() -> None:
    values = [
        (serdes.Change(serdes.Int()), (5, None)),
        (fk.SubscriptionSerde(serdes.Text()), fk.Subscription(b"h" * 16, fk.Instruction.DELETE_KEY_NO_PROPAGATE, "o1")),
        (fk.ResponseSerde(serdes.Json()), fk.SubscriptionResponse(None, {"city": "Oslo"})),
    ]
    for serde, value in values:
        data = serde.serialize(value)
        assert serde.deserialize(data) == value
        for cut in range(len(data)):
            try:
                serde.deserialize(data[:cut])
            except SerdeError:
                pass


def test_strings_that_are_not_utf8_are_a_serde_error_in_every_msgspec_serde() -> None:
    """msgspec raises Python's UnicodeDecodeError, not its DecodeError, for a string that is
    not UTF-8; a serde reports it as the bad input it is."""
    import msgspec

    class Row(msgspec.Struct):
        name: str

    cases = [
        (serdes.Json(), b'"\x80"'),
        (serdes.Struct(Row), b"\x81\xa4name\xa1\x80"),
        (serdes.Struct(Row, format="json"), b'{"name": "\x80"}'),
        (fk.ResponseSerde(serdes.Json()), b"\x92\xa1\x80\xc0"),
    ]
    for serde, data in cases:
        try:
            serde.deserialize(data)
        except SerdeError as error:
            assert serde.name in str(error)
        else:
            raise AssertionError(f"{serde.name} read {data!r}")
