"""Serdes round-trip, keep Kafka's wire formats, and fail loudly on the wrong input."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pystreams.topology.windows import Windowed

from pystreams import serdes
from pystreams.serdes import SerdeError


class Point(msgspec.Struct):
    x: int
    y: float
    label: str
    tags: list[str] = []


points = st.builds(
    Point,
    x=st.integers(min_value=-(2**63), max_value=2**63 - 1),
    y=st.floats(allow_nan=False),
    label=st.text(),
    tags=st.lists(st.text(), max_size=4),
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**64 - 1) | st.text() | st.floats(allow_nan=False, allow_infinity=False),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4),
    max_leaves=20,
)


@given(st.binary())
def test_bytes_round_trip(value):
    assert serdes.Bytes().deserialize(serdes.Bytes().serialize(value)) == value


@given(st.text())
def test_text_round_trip_is_utf8(value):
    data = serdes.Text().serialize(value)
    assert data == value.encode("utf-8")
    assert serdes.Text().deserialize(data) == value


@given(st.integers(min_value=-(2**63), max_value=2**63 - 1))
def test_int_round_trip_is_8_byte_big_endian(value):
    data = serdes.Int().serialize(value)
    assert data == value.to_bytes(8, "big", signed=True)
    assert serdes.Int().deserialize(data) == value


@given(st.integers(min_value=-(2**31), max_value=2**31 - 1))
def test_int32_round_trip(value):
    serde = serdes.Int(size=4)
    assert len(serde.serialize(value)) == 4
    assert serde.deserialize(serde.serialize(value)) == value


@given(json_values)
def test_json_round_trip(value):
    assert serdes.Json().deserialize(serdes.Json().serialize(value)) == value


@given(points, st.sampled_from(["msgpack", "json"]))
def test_struct_round_trip(point, format):
    if format == "json":
        # JSON has no infinities (msgspec writes null); MessagePack keeps them.
        point = msgspec.structs.replace(point, y=point.y if abs(point.y) != float("inf") else 0.0)
    serde = serdes.Struct(Point, format=format)
    decoded = serde.deserialize(serde.serialize(point))
    assert isinstance(decoded, Point)
    assert decoded == point


@given(st.text(), st.integers(min_value=0, max_value=2**62), st.integers(min_value=0, max_value=2**62))
def test_windowed_key_round_trip(key, start, end):
    serde = serdes.WindowedKey(serdes.Text())
    data = serde.serialize(Windowed(key, start, end))
    assert data[:-16] == key.encode()
    assert serde.deserialize(data) == Windowed(key, start, end)


@pytest.mark.parametrize(
    "serde",
    [
        serdes.Bytes(),
        serdes.Text(),
        serdes.Int(),
        serdes.Json(),
        serdes.Struct(Point),
        serdes.WindowedKey(serdes.Int()),
    ],
)
def test_none_passes_through_both_ways(serde):
    assert serde.serialize(None) is None
    assert serde.deserialize(None) is None


def test_int_matches_kafka_long_serializer_bytes():
    assert serdes.Int().serialize(1) == b"\x00\x00\x00\x00\x00\x00\x00\x01"
    assert serdes.Int().serialize(-1) == b"\xff" * 8
    assert serdes.Int().serialize(258) == b"\x00\x00\x00\x00\x00\x00\x01\x02"


@pytest.mark.parametrize(
    ("serde", "value", "message"),
    [
        (serdes.Int(), "7", "needs int"),
        (serdes.Int(), True, "needs int"),
        (serdes.Int(size=4), 2**31, "does not fit"),
        (serdes.Text(), b"raw", "needs str"),
        (serdes.Bytes(), "text", "needs bytes"),
        (serdes.Json(), object(), "cannot encode"),
        (serdes.Struct(Point), {"x": 1}, "needs a Point"),
        (serdes.WindowedKey(serdes.Text()), "plain", "needs a Windowed key"),
    ],
)
def test_wrong_values_are_rejected(serde, value, message):
    with pytest.raises(SerdeError, match=message):
        serde.serialize(value)


@pytest.mark.parametrize(
    ("serde", "data", "message"),
    [
        (serdes.Int(), b"\x00\x01", "exactly 8 bytes"),
        (serdes.Text(), b"\xff\xfe\xfa", "not valid utf-8"),
        (serdes.Json(), b"{not json", "bad JSON"),
        (serdes.Json(type=list[int]), b'["a"]', "bad JSON"),
        (serdes.Struct(Point), b"\x01", "bad msgpack"),
        (serdes.WindowedKey(serdes.Text()), b"short", "at least 16 bytes"),
    ],
)
def test_bad_bytes_are_rejected(serde, data, message):
    with pytest.raises(SerdeError, match=message):
        serde.deserialize(data)


def test_typed_json_builds_the_type():
    assert serdes.Json(type=Point).deserialize(b'{"x": 1, "y": 2.5, "label": "a"}') == Point(1, 2.5, "a")


def test_names_are_stable_and_distinguish_formats():
    names = [
        serdes.Bytes().name,
        serdes.Text().name,
        serdes.Text("latin-1").name,
        serdes.Int().name,
        serdes.Int(size=4).name,
        serdes.Json().name,
        serdes.Json(type=Point).name,
        serdes.Struct(Point).name,
        serdes.Struct(Point, format="json").name,
        serdes.WindowedKey(serdes.Text()).name,
    ]
    assert names == [
        "bytes",
        "text",
        "text:latin-1",
        "int64",
        "int32",
        "json",
        "json:Point",
        "struct:Point:msgpack",
        "struct:Point:json",
        "windowed(text)",
    ]
    assert serdes.Text() == serdes.Text("UTF-8") and serdes.Int() != serdes.Int(size=4)


def test_constructor_arguments_are_checked():
    with pytest.raises(ValueError, match="size"):
        serdes.Int(size=3)
    with pytest.raises(TypeError, match="msgspec.Struct"):
        serdes.Struct(dict)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="format"):
        serdes.Struct(Point, format="xml")
    with pytest.raises(LookupError):
        serdes.Text("no-such-encoding")


def test_value_serde_inference_for_aggregate_initials():
    assert serdes.for_value(0) == serdes.Int()
    assert serdes.for_value("") == serdes.Text()
    assert serdes.for_value(b"") == serdes.Bytes()
    assert serdes.for_value(Point(1, 2.0, "p")) == serdes.Struct(Point)
    assert serdes.for_value(Point) == serdes.Struct(Point)
    assert serdes.for_value([]) is None
    assert serdes.for_value(False) is None
