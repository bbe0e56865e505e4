"""Bytes <-> Kafka API messages for the coordinator, on top of kafka-python's ApiMessage machinery.

* ``decode_request(payload)`` reads one request (the bytes *after* the 4-byte size prefix):
  request header v1, or v2 for flexible versions, then the body.
* ``encode_response(header, response)`` writes one framed response: response header v0, or v1 for
  flexible versions, except ApiVersions which always uses v0.
* ``error_response(header, error_code, ...)`` builds the response Kafka sends when a request fails
  as a whole, in the shape of each API (top-level ErrorCode, or one error per group, topic
  partition or resource named in the request).

What Kafka does with requests it cannot serve (and what the typed errors below are for):

* unknown API key, a version outside the served range, or a body that does not parse: the broker
  closes the connection without answering (``InvalidRequestException`` in its socket server);
* except ApiVersions at a version the broker does not know: it is answered, unparsed, with
  UNSUPPORTED_VERSION in a v0 response that lists the ApiVersions versions the broker speaks, so
  the client can retry with one of them.
"""

from __future__ import annotations

import io
import struct
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import kafka.errors as Errors
from kafka.protocol.api_header import RequestHeader
from kafka.protocol.api_message import ApiMessage

from pystreams.protocol import messages as m
from pystreams.protocol.encoding import response_frame
from pystreams.protocol.linear_decoding import decode_body
from pystreams.protocol.registry import API_VERSIONS_KEY, SUPPORTED_APIS, ApiSpec, api_spec
from pystreams.protocol.validation import InvalidRequestField, check_message

# api key (int16) + api version (int16) + correlation id (int32): readable before knowing the API.
_FIXED_HEADER = struct.Struct(">hhi")
_FRAME_SIZE = struct.Struct(">i")
_INT16 = struct.Struct(">h")
_HEADER_WITH_CLIENT_ID = _FIXED_HEADER.size + _INT16.size


@dataclass(frozen=True)
class DecodedRequest:
    header: RequestHeader
    request: ApiMessage
    spec: ApiSpec

    @property
    def api_key(self) -> int:
        return self.header.request_api_key

    @property
    def api_version(self) -> int:
        return self.header.request_api_version

    @property
    def correlation_id(self) -> int:
        return self.header.correlation_id

    @property
    def client_id(self) -> str | None:
        return self.header.client_id


class RequestDecodeError(Exception):
    """A request the coordinator cannot serve. ``header`` is set when the header itself parsed.

    ``api_key``, ``api_version`` and ``correlation_id`` are set whenever the frame held the
    8 fixed header bytes, for logging.
    """

    def __init__(
        self,
        message: str,
        *,
        header: RequestHeader | None = None,
        api_key: int | None = None,
        api_version: int | None = None,
        correlation_id: int | None = None,
    ) -> None:
        super().__init__(message)
        self.header = header
        self.api_key = api_key if header is None else header.request_api_key
        self.api_version = api_version if header is None else header.request_api_version
        self.correlation_id = correlation_id if header is None else header.correlation_id


class UnknownApiKeyError(RequestDecodeError):
    """The API key is not one the coordinator serves. Kafka closes the connection."""


class UnsupportedApiVersionError(RequestDecodeError):
    """A served API at a version outside the served range; ``header`` is always set.

    Kafka answers ApiVersions with UNSUPPORTED_VERSION (see ``error_response``) and closes the
    connection for every other API.
    """

    @property
    def answerable(self) -> bool:
        return self.api_key == API_VERSIONS_KEY


class MalformedRequestError(RequestDecodeError):
    """Truncated or garbage header or body. Kafka closes the connection."""


class InvalidFieldError(RequestDecodeError):
    """The request decoded but breaks its schema (a null where none is allowed, a string too
    long). ``request`` is the decoded request; it is answered with INVALID_REQUEST."""

    def __init__(self, message: str, *, header: RequestHeader, request: ApiMessage) -> None:
        super().__init__(message, header=header)
        self.request = request


def decode_request(payload: bytes | bytearray | memoryview) -> DecodedRequest:
    """Decode one request from the bytes of a frame (without its 4-byte size prefix).

    Raises UnknownApiKeyError, UnsupportedApiVersionError or MalformedRequestError. Trailing bytes
    after the body are ignored, as Kafka ignores them.
    """
    data = memoryview(payload)
    if len(data) < _FIXED_HEADER.size:
        raise MalformedRequestError(f"frame of {len(data)} bytes is too short for a request header")
    api_key, api_version, correlation_id = _FIXED_HEADER.unpack_from(data, 0)
    spec = api_spec(api_key)
    if spec is None:
        raise UnknownApiKeyError(
            f"unknown API key {api_key}",
            api_key=api_key,
            api_version=api_version,
            correlation_id=correlation_id,
        )

    flexible_header = spec.request_header_version(api_version) == 2
    try:
        plain = _plain_header(data, api_key, api_version, correlation_id, flexible_header)
        if plain is not None:
            header, body_offset = plain
        else:
            stream = io.BytesIO(data)
            header = RequestHeader.decode(stream, flexible=flexible_header)
            body_offset = stream.tell()
    except Exception as exc:  # any failure here means the bytes are not a header
        raise MalformedRequestError(
            f"cannot parse the {spec.name} v{api_version} request header: {exc!r}",
            api_key=api_key,
            api_version=api_version,
            correlation_id=correlation_id,
        ) from exc

    if not spec.supports(api_version):
        raise UnsupportedApiVersionError(
            f"{spec.name} v{api_version} is not served (versions {spec.min_version}-{spec.max_version})",
            header=header,
        )

    body = data[body_offset:]
    try:
        request, end = decode_body(spec.request_class, body, api_version)
    except Exception as exc:  # the generated decoder raises struct.error, IndexError, ValueError, ...
        raise MalformedRequestError(
            f"cannot parse the {spec.name} v{api_version} request body: {exc!r}",
            header=header,
        ) from exc
    if end > len(body):  # a string or bytes field ran past the frame and was cut short
        raise MalformedRequestError(
            f"the {spec.name} v{api_version} request body is truncated ({len(body)} bytes, fields need {end})",
            header=header,
        )
    request._header = header  # as kafka-python's own decode(header=True) does
    try:
        check_message(request, api_version)
    except InvalidRequestField as exc:
        raise InvalidFieldError(f"{spec.name} v{api_version}: {exc}", header=header, request=request) from None
    return DecodedRequest(header=header, request=request, spec=spec)


def _plain_header(data: memoryview, api_key: int, api_version: int, correlation_id: int, flexible: bool) -> tuple[RequestHeader, int] | None:
    """The header and the body's offset when the header is the usual kind: a client id that is
    null or lies whole in the frame and, in a flexible header, no tagged fields. None for
    anything else, which kafka-python's generic decoder then reads (and refuses where it must).

    The same object kafka-python builds, without its generic machinery: a quarter of the CPU of
    decoding a small request went to the header alone."""
    if len(data) < _HEADER_WITH_CLIENT_ID:
        return None
    (length,) = _INT16.unpack_from(data, _FIXED_HEADER.size)
    offset = _HEADER_WITH_CLIENT_ID
    if length == -1:
        client_id = None
    elif 0 <= length <= len(data) - offset:
        client_id = str(data[offset : offset + length], "utf-8")
        offset += length
    else:
        return None
    if flexible:
        if offset >= len(data) or data[offset] != 0:  # tagged fields follow: the generic path
            return None
        offset += 1
    header = object.__new__(RequestHeader)
    header.request_api_key = api_key
    header.request_api_version = api_version
    header.correlation_id = correlation_id
    header.client_id = client_id
    header.tags = None
    header.unknown_tags = None
    header._version = 2 if flexible else 1
    return header, offset


def response_version(header: RequestHeader, response: ApiMessage | None = None) -> int:
    """The version a response to this request is written at: the request's, except for ApiVersions
    at an unknown version (Kafka's rule) and any ApiVersions error, which are written at v0.

    Kafka itself writes only UNSUPPORTED_VERSION at v0, but kafka-python decodes *every* ApiVersions
    error body as v0 (and the Java client falls back to v0 when the real version does not parse),
    so v0 is the one form every client reads.
    """
    spec = _served_spec(header)
    if spec.api_key == API_VERSIONS_KEY:
        if not spec.supports(header.request_api_version):
            return 0
        if response is not None and response.error_code != 0:
            return 0
    return header.request_api_version


def encode_response(header: RequestHeader, response: ApiMessage) -> bytes:
    """Encode ``response`` to the request described by ``header`` as one size-prefixed frame.

    Raises TypeError if the response is not the response class of the request's API.
    """
    spec = _served_spec(header)
    if not isinstance(response, spec.response_class):
        raise TypeError(f"a {spec.name} request needs a {spec.response_class.name}, got {type(response).__name__}")
    version = response_version(header, response)
    return response_frame(header.correlation_id, spec.response_header_version(version) == 1, response, version)


def frame(payload: bytes) -> bytes:
    """Prefix ``payload`` with its size, as every Kafka request and response is sent."""
    return _FRAME_SIZE.pack(len(payload)) + payload


def error_response(
    header: RequestHeader,
    error_code: int,
    message: str | None = None,
    request: ApiMessage | None = None,
) -> ApiMessage:
    """The response Kafka sends when the whole request fails with ``error_code``.

    Mirrors Apache Kafka's ``AbstractRequest.getErrorResponse``: APIs with a top-level ErrorCode set
    it; APIs without one (Metadata, DescribeGroups, OffsetCommit, OffsetFetch v1 and v8+,
    DescribeConfigs, IncrementalAlterConfigs, FindCoordinator v4+, ConsumerGroupDescribe) carry the
    error on every group / topic partition / resource / key named in ``request`` (pass it whenever
    the request was decoded; without it those lists are empty). ``message`` fills ErrorMessage where
    the version has one. None of the served APIs is one where Kafka closes the connection instead
    of answering (that happens only for requests that do not decode; see the module docstring).
    """
    spec = _served_spec(header)
    version = response_version(header)
    response = _error_builder(spec)(version, error_code, message, request)
    response.API_VERSION = response_version(header, response)
    return response


def _served_spec(header: RequestHeader) -> ApiSpec:
    spec = api_spec(header.request_api_key)
    if spec is None:
        raise ValueError(f"API key {header.request_api_key} is not served")
    return spec


# --- per-API error shapes ------------------------------------------------------------------------

_ErrorBuilder = Callable[[int, int, str | None, ApiMessage | None], ApiMessage]
_NO_NODE_ID, _NO_HOST, _NO_PORT = -1, "", -1  # Kafka's Node.noNode()
_ZERO_UUID = uuid.UUID(int=0)


def _api_versions_error(version: int, code: int, message: str | None, request: ApiMessage | None) -> ApiMessage:
    spec = SUPPORTED_APIS[API_VERSIONS_KEY]
    api_keys = []
    if code == Errors.UnsupportedVersionError.errno:  # the one row the client needs to retry
        api_keys.append(
            m.ApiVersionsResponse.ApiVersion(
                api_key=spec.api_key,
                min_version=spec.min_version,
                max_version=spec.max_version,
            )
        )
    return m.ApiVersionsResponse(error_code=code, api_keys=api_keys, throttle_time_ms=0)


def _metadata_error(version: int, code: int, message: str | None, request: ApiMessage | None) -> ApiMessage:
    topics = []
    for topic in getattr(request, "topics", None) or []:
        name = topic.name
        if name is None and version < 12:  # the response name is nullable only from v12
            name = ""
        topics.append(
            m.MetadataResponse.MetadataResponseTopic(
                error_code=code,
                name=name,
                topic_id=topic.topic_id or _ZERO_UUID,
                is_internal=False,
                partitions=[],
            )
        )
    return m.MetadataResponse(throttle_time_ms=0, brokers=[], topics=topics, error_code=code)


def _find_coordinator_error(version: int, code: int, message: str | None, request: ApiMessage | None) -> ApiMessage:
    if version < 4:
        return m.FindCoordinatorResponse(
            throttle_time_ms=0,
            error_code=code,
            error_message=message,
            node_id=_NO_NODE_ID,
            host=_NO_HOST,
            port=_NO_PORT,
        )
    keys = getattr(request, "coordinator_keys", None) or []
    return m.FindCoordinatorResponse(
        throttle_time_ms=0,
        coordinators=[
            m.FindCoordinatorResponse.Coordinator(
                key=key,
                node_id=_NO_NODE_ID,
                host=_NO_HOST,
                port=_NO_PORT,
                error_code=code,
                error_message=message,
            )
            for key in keys
        ],
    )


def _describe_groups_error(version: int, code: int, message: str | None, request: ApiMessage | None) -> ApiMessage:
    return m.DescribeGroupsResponse(
        throttle_time_ms=0,
        groups=[
            m.DescribeGroupsResponse.DescribedGroup(
                error_code=code,
                error_message=message,
                group_id=group_id,
                group_state="",
                protocol_type="",
                protocol_data="",
                members=[],
            )
            for group_id in (getattr(request, "groups", None) or [])
        ],
    )


def _offset_commit_error(version: int, code: int, message: str | None, request: ApiMessage | None) -> ApiMessage:
    topic_class = m.OffsetCommitResponse.OffsetCommitResponseTopic
    partition_class = topic_class.OffsetCommitResponsePartition
    return m.OffsetCommitResponse(
        throttle_time_ms=0,
        topics=[
            topic_class(
                name=topic.name,
                topic_id=topic.topic_id,
                partitions=[partition_class(partition_index=p.partition_index, error_code=code) for p in topic.partitions],
            )
            for topic in (getattr(request, "topics", None) or [])
        ],
    )


def _offset_fetch_error(version: int, code: int, message: str | None, request: ApiMessage | None) -> ApiMessage:
    if version >= 8:
        return m.OffsetFetchResponse(
            throttle_time_ms=0,
            groups=[
                m.OffsetFetchResponse.OffsetFetchResponseGroup(group_id=group.group_id, error_code=code, topics=[])
                for group in (getattr(request, "groups", None) or [])
            ],
        )
    if version >= 2:
        return m.OffsetFetchResponse(throttle_time_ms=0, error_code=code, topics=[])
    # v1 has no top-level error code: every requested partition carries it.
    topic_class = m.OffsetFetchResponse.OffsetFetchResponseTopic
    partition_class = topic_class.OffsetFetchResponsePartition
    return m.OffsetFetchResponse(
        topics=[
            topic_class(
                name=topic.name,
                partitions=[partition_class(partition_index=index, committed_offset=-1, metadata="", error_code=code) for index in topic.partition_indexes],
            )
            for topic in (getattr(request, "topics", None) or [])
        ]
    )


def _describe_configs_error(version: int, code: int, message: str | None, request: ApiMessage | None) -> ApiMessage:
    return m.DescribeConfigsResponse(
        throttle_time_ms=0,
        results=[
            m.DescribeConfigsResponse.DescribeConfigsResult(
                error_code=code,
                error_message=message,
                resource_type=resource.resource_type,
                resource_name=resource.resource_name,
                configs=[],
            )
            for resource in (getattr(request, "resources", None) or [])
        ],
    )


def _incremental_alter_configs_error(version: int, code: int, message: str | None, request: ApiMessage | None) -> ApiMessage:
    return m.IncrementalAlterConfigsResponse(
        throttle_time_ms=0,
        responses=[
            m.IncrementalAlterConfigsResponse.AlterConfigsResourceResponse(
                error_code=code,
                error_message=message,
                resource_type=resource.resource_type,
                resource_name=resource.resource_name,
            )
            for resource in (getattr(request, "resources", None) or [])
        ],
    )


def _join_group_error(version: int, code: int, message: str | None, request: ApiMessage | None) -> ApiMessage:
    return m.JoinGroupResponse(
        throttle_time_ms=0,
        error_code=code,
        generation_id=-1,
        protocol_type=None,
        protocol_name=None if version >= 7 else "",
        leader="",
        member_id="",
        members=[],
    )


def _consumer_group_describe_error(version: int, code: int, message: str | None, request: ApiMessage | None) -> ApiMessage:
    return m.ConsumerGroupDescribeResponse(
        throttle_time_ms=0,
        groups=[
            m.ConsumerGroupDescribeResponse.DescribedGroup(
                error_code=code,
                error_message=message,
                group_id=group_id,
                group_state="",
                members=[],
            )
            for group_id in (getattr(request, "group_ids", None) or [])
        ],
    )


def _top_level_error(response_class: type[ApiMessage]) -> _ErrorBuilder:
    """For APIs whose response has a top-level ErrorCode (and maybe ErrorMessage) in every version;
    every other field keeps its schema default (empty lists, null or empty strings, zero)."""
    fields = response_class.fields

    def build(version: int, code: int, message: str | None, request: ApiMessage | None) -> ApiMessage:
        values: dict[str, object] = {"error_code": code}
        if "error_message" in fields:
            values["error_message"] = message
        if "throttle_time_ms" in fields:
            values["throttle_time_ms"] = 0
        return response_class(**values)

    return build


# APIs whose error shape is not simply "top-level ErrorCode": ListGroups, SyncGroup, Heartbeat,
# LeaveGroup, ConsumerGroupHeartbeat, Prepare/InstallAssignment use _top_level_error.
_SHAPED_ERROR_BUILDERS: dict[int, _ErrorBuilder] = {
    m.ApiVersionsRequest.API_KEY: _api_versions_error,
    m.MetadataRequest.API_KEY: _metadata_error,
    m.FindCoordinatorRequest.API_KEY: _find_coordinator_error,
    m.DescribeGroupsRequest.API_KEY: _describe_groups_error,
    m.OffsetCommitRequest.API_KEY: _offset_commit_error,
    m.OffsetFetchRequest.API_KEY: _offset_fetch_error,
    m.DescribeConfigsRequest.API_KEY: _describe_configs_error,
    m.IncrementalAlterConfigsRequest.API_KEY: _incremental_alter_configs_error,
    m.JoinGroupRequest.API_KEY: _join_group_error,
    m.ConsumerGroupDescribeRequest.API_KEY: _consumer_group_describe_error,
}


def _error_builder(spec: ApiSpec) -> _ErrorBuilder:
    builder = _SHAPED_ERROR_BUILDERS.get(spec.api_key)
    if builder is not None:
        return builder
    error_code_field = spec.response_class.fields.get("error_code")
    if error_code_field is None or not all(error_code_field.for_version_q(v) for v in range(spec.min_version, spec.max_version + 1)):
        raise LookupError(f"{spec.name} has no top-level ErrorCode in every served version; add its error shape to _SHAPED_ERROR_BUILDERS")
    return _top_level_error(spec.response_class)
