"""The coordinator's wire codec: every served message at every served version, through kafka-python.

Messages are built generically from each class's JSON schema with non-default values in every
field of the version (and, in a second variant, null in every nullable one), so a field the codec
drops, mis-orders or mis-versions shows up as an inequality after the round trip.
"""

from __future__ import annotations

import io
import itertools
import struct
import uuid

import kafka.errors as Errors
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.api_header import RequestHeader, ResponseHeader
from kafka.protocol.api_message import ApiMessage
from kafka.protocol.parser import KafkaProtocol

from pystreams.protocol import codec, encoding
from pystreams.protocol import messages as m
from pystreams.protocol.framing import ClientFraming
from pystreams.protocol.registry import API_VERSIONS_KEY, BROKER_CLIENT_APIS, SUPPORTED_APIS, ApiSpec, advertised_versions

# --- building messages from their schema ---------------------------------------------------------


class _Values:
    """Distinct, non-default values, so two fields swapped by a codec bug cannot compare equal."""

    def __init__(self) -> None:
        self._counter = itertools.count(1)

    def simple(self, type_str: str, name: str, default: object) -> object:
        n = next(self._counter)
        value: object
        if type_str == "int8":
            value = n % 120 + 1
        elif type_str == "int16":
            value = 1000 + n
        elif type_str in ("int32", "uint16"):
            value = 50_000 + n
        elif type_str == "int64":
            value = 2**40 + n
        elif type_str == "bool":
            value = not default
        elif type_str == "string":
            value = f"{name}-{n}-é"  # non-ASCII: lengths are in bytes, not characters
        elif type_str in ("bytes", "records"):
            value = bytes([n % 256, 0, 255]) + name.encode()
        elif type_str == "uuid":
            value = uuid.UUID(int=n)
        elif type_str == "bitfield":
            value = {1, n % 30 + 2}
        elif type_str == "float64":
            value = n + 0.5
        else:
            raise AssertionError(f"no value for type {type_str}")
        assert value != default
        return value


def build_message(struct_field, version: int, nulls: bool, values: _Values) -> dict[str, object]:
    """Field values for one struct at ``version``; nullable fields are None when ``nulls``."""
    fields: dict[str, object] = {}
    for field in struct_field.fields.values():
        if not field.for_version_q(version):
            continue
        if nulls and field.nullable_for_version_q(version):
            fields[field.name] = None
        elif field.is_struct_array():
            fields[field.name] = [field.data_class(version=version, **build_message(field.array_of, version, nulls, values)) for _ in range(2)]
        elif field.is_struct():
            fields[field.name] = field.data_class(version=version, **build_message(field, version, nulls, values))
        elif field.is_array():
            inner = field.array_of
            fields[field.name] = [values.simple(inner.type_str, field.name, inner.default) for _ in range(2)]
        else:
            fields[field.name] = values.simple(field.type_str, field.name, field.default)
    return fields


def make(message_class: type[ApiMessage], version: int, *, nulls: bool) -> ApiMessage:
    fields = build_message(message_class._struct, version, nulls, _Values())
    if message_class is m.ApiVersionsResponse:
        # kafka-python reads any ApiVersions error body as v0 (Kafka's fallback), so a round trip
        # at a higher version needs error_code 0; the error path is tested on its own below.
        fields["error_code"] = 0
    return message_class(version=version, **fields)


def served_versions() -> list[tuple[ApiSpec, int]]:
    return [(spec, version) for spec in SUPPORTED_APIS.values() for version in range(spec.min_version, spec.max_version + 1)]


def _case_id(case: tuple[ApiSpec, int]) -> str:
    spec, version = case
    return f"{spec.name}-v{version}"


ALL_VERSIONS = pytest.mark.parametrize("case", served_versions(), ids=_case_id)
BOTH_VARIANTS = pytest.mark.parametrize("nulls", [False, True], ids=["values", "nulls"])


def header_for(spec: ApiSpec, version: int, correlation_id: int = 7, client_id: str | None = "client-é") -> RequestHeader:
    return RequestHeader(
        request_api_key=spec.api_key,
        request_api_version=version,
        correlation_id=correlation_id,
        client_id=client_id,
    )


def kafka_python_frame(request: ApiMessage, correlation_id: int = 7, client_id: str | None = "client-é") -> bytes:
    """The bytes kafka-python's client puts on the wire for ``request`` (frame size included)."""
    request.with_header(correlation_id=correlation_id, client_id=client_id)
    return bytes(request.encode(header=True, framed=True))


def payload_of(frame: bytes) -> bytes:
    (size,) = struct.unpack_from(">i", frame, 0)
    assert size == len(frame) - 4
    return frame[4:]


# --- round trips ---------------------------------------------------------------------------------


@ALL_VERSIONS
@BOTH_VARIANTS
def test_every_request_decodes_as_kafka_python_encoded_it(case, nulls):
    spec, version = case
    sent = make(spec.request_class, version, nulls=nulls)
    decoded = codec.decode_request(payload_of(kafka_python_frame(sent, correlation_id=41)))
    assert decoded.spec is spec
    assert (decoded.api_key, decoded.api_version, decoded.correlation_id) == (spec.api_key, version, 41)
    assert decoded.client_id == "client-é"
    assert decoded.header.version == (2 if spec.is_flexible(version) else 1)
    assert decoded.request == sent


@ALL_VERSIONS
@BOTH_VARIANTS
def test_every_response_is_read_by_kafka_python_client_parser(case, nulls):
    """kafka-python's own client protocol sends a request, we answer, its parser reads our bytes:
    correlation id, response header version and body all have to match what a client expects."""
    spec, version = case
    client = KafkaProtocol(client_id="client-é")
    request = make(spec.request_class, version, nulls=False)
    correlation_id = client.send_request(request)
    decoded = codec.decode_request(payload_of(client.send_bytes()))

    answer = make(spec.response_class, version, nulls=nulls)
    [(received_id, received)] = client.receive_bytes(codec.encode_response(decoded.header, answer))
    assert received_id == correlation_id
    if type(answer) is m.OffsetCommitResponse:
        # pystreams' own class (a tagged GroupEpoch): kafka-python reads it with its own class,
        # skipping the tag, and gets every other field as sent.
        assert type(received).__name__ == "OffsetCommitResponse"
        answer.group_epoch = -1  # the default, which is not written
        assert received.encode() == answer.encode()
    else:
        assert received == answer


@ALL_VERSIONS
@BOTH_VARIANTS
def test_every_response_frame_is_byte_for_byte_what_kafka_python_writes(case, nulls):
    """The compiled encoders write empty tag sections inline and the header by hand: the frame
    is still exactly kafka-python's own response header and body."""
    spec, version = case
    answer = make(spec.response_class, version, nulls=nulls)
    header = header_for(spec, version, correlation_id=2**31 - 5)
    at = codec.response_version(header, answer)
    reference = bytes(ResponseHeader(correlation_id=2**31 - 5).encode(flexible=spec.response_header_version(at) == 1)) + bytes(answer.encode(version=at))
    assert codec.encode_response(header, answer) == codec.frame(reference)


def client_versions() -> list[tuple[ApiSpec, int]]:
    specs = {**SUPPORTED_APIS, **BROKER_CLIENT_APIS}
    return [(spec, version) for spec in specs.values() for version in range(spec.min_version, spec.max_version + 1)]


@pytest.mark.parametrize("case", client_versions(), ids=_case_id)
@BOTH_VARIANTS
def test_every_request_frame_is_byte_for_byte_what_kafka_python_writes(case, nulls):
    """pystreams' own clients (the log writer, the tools) write requests with the same encoders."""
    spec, version = case
    for client_id in ("client-é", None):
        request = make(spec.request_class, version, nulls=nulls)
        framer = ClientFraming(client_id)  # type: ignore[arg-type]
        framer._next_correlation_id = 0x7FFF_FFF0
        correlation_id, framed = framer.request_bytes(request, version)
        assert framed == kafka_python_frame(make(spec.request_class, version, nulls=nulls), correlation_id=correlation_id, client_id=client_id)
        assert request.API_VERSION == version


def test_a_request_class_with_its_own_encode_fix_ups_keeps_them():
    """kafka-python's MetadataRequest writes "all topics" as an empty array at v0 (null at v1+)."""
    framed = ClientFraming("c").request_bytes(m.MetadataRequest(topics=None), 0)[1]
    assert framed == kafka_python_frame(m.MetadataRequest(topics=None, version=0), correlation_id=0, client_id="c")
    assert framed.endswith(b"\x00\x00\x00\x00")


def test_a_large_response_does_not_keep_its_buffer():
    spec = SUPPORTED_APIS[m.ListGroupsResponse.API_KEY]
    header = header_for(spec, 4)
    groups = [m.ListGroupsResponse.ListedGroup(group_id=f"g{i:07}", protocol_type="consumer", group_state="Stable") for i in range(100_000)]
    big = codec.encode_response(header, m.ListGroupsResponse(version=4, throttle_time_ms=0, error_code=0, groups=groups))
    assert len(big) > encoding.KEPT_BUFFER_BYTES
    assert getattr(encoding._local, "buffer", None) is None
    small = codec.encode_response(header, m.ListGroupsResponse(version=4, throttle_time_ms=0, error_code=0, groups=groups[:2]))
    assert len(encoding._local.buffer.buf) <= encoding.KEPT_BUFFER_BYTES
    assert m.ListGroupsResponse.decode(small[9:], version=4).groups == groups[:2]  # size, correlation id, no tags


def test_null_client_id_round_trips():
    request = m.ListGroupsRequest(version=4, states_filter=[])
    decoded = codec.decode_request(payload_of(kafka_python_frame(request, client_id=None)))
    assert decoded.client_id is None
    assert decoded.request == request


_HEADER_FIELDS = ("request_api_key", "request_api_version", "correlation_id", "client_id", "tags", "unknown_tags", "_version")


@settings(max_examples=500, deadline=None)
@given(
    flexible=st.booleans(),
    client_id=st.one_of(st.none(), st.text(max_size=20)),
    length_delta=st.sampled_from([0, 0, 0, 1, 5, -1]),
    null_length=st.sampled_from([-1, -2, -32768]),
    tags=st.one_of(st.just(b"\x00"), st.binary(min_size=1, max_size=6)),
    tail=st.binary(max_size=8),
    cut=st.integers(min_value=0, max_value=40),
)
def test_the_plain_header_path_reads_what_kafka_pythons_header_decoder_reads(flexible, client_id, length_delta, null_length, tags, tail, cut):
    """Any header bytes, also lying lengths, tagged fields and a cut frame: the fast path gives
    the same header and body offset as kafka-python's decoder, or hands the bytes over to it."""
    fixed = struct.pack(">hhi", 8, 9, 77)
    if client_id is None:
        name = struct.pack(">h", null_length)
    else:
        encoded = client_id.encode()
        name = struct.pack(">h", len(encoded) + length_delta) + encoded
    data = (fixed + name + (tags if flexible else b"") + tail)[: len(fixed) + cut] if cut < 30 else fixed + name + (tags if flexible else b"") + tail
    try:
        plain = codec._plain_header(memoryview(data), 8, 9, 77, flexible)
    except UnicodeDecodeError:  # not a header: kafka-python's decoder refuses it too
        with pytest.raises(UnicodeDecodeError):
            RequestHeader.decode(io.BytesIO(data), flexible=flexible)
        return
    if plain is None:
        return  # the generic decoder reads it, as before
    header, offset = plain
    stream = io.BytesIO(data)
    reference = RequestHeader.decode(stream, flexible=flexible)
    assert offset == stream.tell()
    assert {f: getattr(header, f) for f in _HEADER_FIELDS} == {f: getattr(reference, f) for f in _HEADER_FIELDS}


def test_the_plain_header_path_takes_the_usual_headers():
    for flexible in (False, True):
        data = struct.pack(">hhih", 8, 9, 77, 3) + b"cli" + (b"\x00" if flexible else b"") + b"body"
        plain = codec._plain_header(memoryview(data), 8, 9, 77, flexible)
        assert plain is not None and plain[0].client_id == "cli" and data[plain[1] :] == b"body"
    assert codec._plain_header(memoryview(struct.pack(">hhih", 8, 9, 77, -1) + b"\x00"), 8, 9, 77, True) is not None
    assert codec._plain_header(memoryview(struct.pack(">hhih", 8, 9, 77, 0) + b"\x01\x00\x00"), 8, 9, 77, True) is None  # a tag


@pytest.mark.parametrize(
    "request_message",
    [
        m.ApiVersionsRequest(version=3, client_software_name="kafka-python", client_software_version="3.0.12"),
        m.ApiVersionsRequest(version=0),
        m.ListGroupsRequest(version=5, states_filter=["Stable", "Empty"], types_filter=["consumer"]),
        m.ListGroupsRequest(version=2),
        m.OffsetFetchRequest(
            version=8,
            groups=[
                m.OffsetFetchRequest.OffsetFetchRequestGroup(group_id="g", topics=None),
                m.OffsetFetchRequest.OffsetFetchRequestGroup(
                    group_id="h",
                    topics=[
                        m.OffsetFetchRequest.OffsetFetchRequestGroup.OffsetFetchRequestTopics(name="t", partition_indexes=[0, 2]),
                    ],
                ),
            ],
            require_stable=True,
        ),
        m.OffsetFetchRequest(
            version=1,
            group_id="g",
            topics=[
                m.OffsetFetchRequest.OffsetFetchRequestTopic(name="t", partition_indexes=[3]),
            ],
        ),
    ],
    ids=lambda r: f"{r.name}-v{r.version}",
)
def test_requests_written_by_hand_with_kafka_python_decode(request_message):
    decoded = codec.decode_request(payload_of(kafka_python_frame(request_message, correlation_id=99, client_id="cli")))
    assert decoded.correlation_id == 99
    assert decoded.client_id == "cli"
    assert decoded.request == request_message


def test_apiversions_response_keeps_a_v0_header_at_flexible_versions():
    header = header_for(SUPPORTED_APIS[API_VERSIONS_KEY], 3, correlation_id=5)
    response = m.ApiVersionsResponse(error_code=0, api_keys=[], throttle_time_ms=0)
    body = bytes(m.ApiVersionsResponse(error_code=0, api_keys=[], throttle_time_ms=0).encode(version=3))
    # v0 header: the correlation id only, no tagged-fields byte.
    assert codec.encode_response(header, response) == struct.pack(">ii", 4 + len(body), 5) + body


def test_flexible_responses_get_a_v1_header():
    header = header_for(SUPPORTED_APIS[m.ListGroupsRequest.API_KEY], 3, correlation_id=5)
    response = m.ListGroupsResponse(error_code=0, groups=[])
    body = bytes(m.ListGroupsResponse(error_code=0, groups=[]).encode(version=3))
    # v1 header: correlation id, then an empty tagged-fields section.
    assert codec.encode_response(header, response) == struct.pack(">ii", 5 + len(body), 5) + b"\x00" + body


def test_non_flexible_responses_get_a_v0_header():
    header = header_for(SUPPORTED_APIS[m.ListGroupsRequest.API_KEY], 2, correlation_id=5)
    body = bytes(m.ListGroupsResponse(error_code=0, groups=[]).encode(version=2))
    framed = codec.encode_response(header, m.ListGroupsResponse(error_code=0, groups=[]))
    assert framed == struct.pack(">ii", 4 + len(body), 5) + body


def test_encoding_the_wrong_response_class_is_refused():
    header = header_for(SUPPORTED_APIS[m.HeartbeatRequest.API_KEY], 4)
    with pytest.raises(TypeError):
        codec.encode_response(header, m.ListGroupsResponse(error_code=0, groups=[]))


# --- what the codec refuses ----------------------------------------------------------------------


def test_unknown_api_key_is_reported_with_what_the_header_said():
    payload = struct.pack(">hhi", 1, 12, 77) + b"\x00\x03abc"  # Fetch: a real key we do not serve
    with pytest.raises(codec.UnknownApiKeyError) as caught:
        codec.decode_request(payload)
    assert (caught.value.api_key, caught.value.api_version, caught.value.correlation_id) == (1, 12, 77)
    assert caught.value.header is None


@pytest.mark.parametrize(
    "api_key, version",
    [
        (m.ListGroupsRequest.API_KEY, 6),  # above the highest
        (m.OffsetCommitRequest.API_KEY, 1),  # below the lowest (removed in Kafka 4)
        (m.ConsumerGroupHeartbeatRequest.API_KEY, 1),
        (m.MetadataRequest.API_KEY, 13),
        (m.FindCoordinatorRequest.API_KEY, -1),
    ],
)
def test_versions_outside_the_served_range_are_unsupported(api_key, version):
    payload = struct.pack(">hhih", api_key, version, 3, 1) + b"c" + b"\x00" * 16
    with pytest.raises(codec.UnsupportedApiVersionError) as caught:
        codec.decode_request(payload)
    assert caught.value.header is not None
    assert caught.value.header.client_id == "c"
    assert not caught.value.answerable


def test_apiversions_at_an_unknown_version_is_answerable_with_its_header():
    request = m.ApiVersionsRequest(version=3, client_software_name="x", client_software_version="1")
    frame = bytearray(kafka_python_frame(request, correlation_id=12, client_id="newer-client"))
    frame[6:8] = struct.pack(">h", 9)  # a version from the future, with a body we cannot know
    with pytest.raises(codec.UnsupportedApiVersionError) as caught:
        codec.decode_request(payload_of(bytes(frame)))
    assert caught.value.answerable
    assert caught.value.header.client_id == "newer-client"
    assert caught.value.header.correlation_id == 12


@pytest.mark.parametrize("case", [(s, s.max_version) for s in SUPPORTED_APIS.values()], ids=_case_id)
def test_every_truncation_of_a_request_is_malformed(case):
    spec, version = case
    payload = payload_of(kafka_python_frame(make(spec.request_class, version, nulls=False)))
    for cut in range(len(payload)):
        with pytest.raises(codec.MalformedRequestError):
            codec.decode_request(payload[:cut])


@settings(max_examples=300, deadline=None)
@given(
    case=st.sampled_from(served_versions()),
    garbage=st.binary(max_size=64),
)
def test_garbage_after_a_valid_header_never_escapes_as_another_exception(case, garbage):
    spec, version = case
    header = RequestHeader(request_api_key=spec.api_key, request_api_version=version, correlation_id=1, client_id="c")
    payload = bytes(header.encode(flexible=spec.request_header_version(version) == 2)) + garbage
    try:
        decoded = codec.decode_request(payload)
    except (codec.MalformedRequestError, codec.InvalidFieldError):
        return
    assert isinstance(decoded.request, spec.request_class)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_arbitrary_bytes_decode_or_raise_a_decode_error(payload):
    try:
        codec.decode_request(payload)
    except codec.RequestDecodeError:
        pass


# --- error responses -----------------------------------------------------------------------------


def _error_codes(message: object) -> list[int]:
    """Every error_code anywhere in a decoded message."""
    found: list[int] = []
    struct_field = getattr(message, "_struct", None)
    if struct_field is None:
        return found
    for field in struct_field.fields.values():
        if message.version is not None and not field.for_version_q(message.version):
            continue
        value = getattr(message, field.name)
        if field.name == "error_code":
            found.append(value)
        elif field.is_struct_array() and value:
            for item in value:
                found.extend(_error_codes(item))
        elif field.is_struct() and value is not None:
            found.extend(_error_codes(value))
    return found


@ALL_VERSIONS
def test_error_response_carries_the_code_for_every_api_and_version(case):
    spec, version = case
    request = make(spec.request_class, version, nulls=False)
    header = header_for(spec, version, correlation_id=3)
    code = Errors.NotCoordinatorError.errno
    client = KafkaProtocol()
    client.in_flight_requests.append(header)  # as if this client had sent the request

    response = codec.error_response(header, code, "not here", request)
    [(_, received)] = client.receive_bytes(codec.encode_response(header, response))

    codes = _error_codes(received)
    assert codes, f"{spec.name} v{version}: no error code in {received}"
    assert set(codes) == {code}


def test_error_response_mirrors_the_entries_of_the_request():
    code = Errors.CoordinatorLoadInProgressError.errno
    topic_id = uuid.uuid4()
    commit = m.OffsetCommitRequest(
        version=10,
        group_id="g",
        topics=[
            m.OffsetCommitRequest.OffsetCommitRequestTopic(
                topic_id=topic_id,
                partitions=[m.OffsetCommitRequest.OffsetCommitRequestTopic.OffsetCommitRequestPartition(partition_index=p, committed_offset=1) for p in (0, 4)],
            ),
        ],
    )
    response = codec.error_response(header_for(SUPPORTED_APIS[8], 10), code, None, commit)
    [topic] = response.topics
    assert topic.topic_id == topic_id
    assert [(p.partition_index, p.error_code) for p in topic.partitions] == [(0, code), (4, code)]

    describe = m.ConsumerGroupDescribeRequest(version=0, group_ids=["a", "b"])
    response = codec.error_response(header_for(SUPPORTED_APIS[69], 0), code, "loading", describe)
    assert [(g.group_id, g.error_code, g.error_message) for g in response.groups] == [
        ("a", code, "loading"),
        ("b", code, "loading"),
    ]

    find = m.FindCoordinatorRequest(version=4, key_type=0, coordinator_keys=["x", "y"])
    response = codec.error_response(header_for(SUPPORTED_APIS[10], 4), code, None, find)
    assert [(c.key, c.error_code, c.node_id) for c in response.coordinators] == [("x", code, -1), ("y", code, -1)]


def test_top_level_error_shapes_set_error_message_where_the_version_has_one():
    heartbeat = codec.error_response(header_for(SUPPORTED_APIS[68], 0), Errors.FencedMemberEpochError.errno, "fenced")
    assert (heartbeat.error_code, heartbeat.error_message) == (Errors.FencedMemberEpochError.errno, "fenced")
    join = codec.error_response(header_for(SUPPORTED_APIS[11], 7), Errors.RebalanceInProgressError.errno)
    assert (join.error_code, join.generation_id, join.protocol_name, join.member_id) == (27, -1, None, "")
    join_v5 = codec.error_response(header_for(SUPPORTED_APIS[11], 5), Errors.RebalanceInProgressError.errno)
    assert join_v5.protocol_name == ""  # not nullable before v7


def test_unsupported_apiversions_is_answered_at_v0_with_the_apiversions_range():
    header = header_for(SUPPORTED_APIS[API_VERSIONS_KEY], 4, correlation_id=8)
    response = codec.error_response(header, Errors.UnsupportedVersionError.errno)
    framed = codec.encode_response(header, response)

    decoded = m.ApiVersionsResponse.decode(framed, version=0, header=True, framed=True)
    assert decoded.header.correlation_id == 8
    assert decoded.error_code == Errors.UnsupportedVersionError.errno
    [row] = decoded.api_keys
    assert (row.api_key, row.min_version, row.max_version) == next(r for r in advertised_versions() if r[0] == API_VERSIONS_KEY)
    # A v0 body is exactly: error code, array of (key, min, max); nothing else.
    assert len(framed) == 4 + 4 + 2 + 4 + 6


def test_apiversions_errors_at_served_versions_are_written_at_v0_too():
    header = header_for(SUPPORTED_APIS[API_VERSIONS_KEY], 3)
    response = codec.error_response(header, Errors.InvalidRequestError.errno, "bad name")
    assert response.version == 0
    client = KafkaProtocol()
    client.in_flight_requests.append(header)
    [(_, received)] = client.receive_bytes(codec.encode_response(header, response))
    assert received.error_code == Errors.InvalidRequestError.errno
