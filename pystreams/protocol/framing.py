"""Client-side Kafka framing, sans-IO: requests to bytes, bytes to responses.

Both wire clients of pystreams — the blocking one the command-line tools use
(``protocol.client``) and the asyncio one the member driver uses (``client.driver``) — frame
with this one object: it numbers requests (correlation ids), writes request header v1 or v2 by
the API version's flexibility, buffers whatever bytes arrive, and turns every complete frame
into ``(correlation_id, response)``, reading response header v0 or v1 and applying Kafka's rule
that an ApiVersions error is written at v0. It does no IO: callers write ``request_bytes`` and
feed what they read to ``receive``.
"""

from __future__ import annotations

import io
import struct

from kafka.protocol.api_header import ResponseHeader
from kafka.protocol.api_message import ApiMessage

from pystreams.protocol.encoding import request_frame
from pystreams.protocol.linear_decoding import decode_body
from pystreams.protocol.registry import API_VERSIONS_KEY, ApiSpec, client_api_spec

_FRAME_SIZE = struct.Struct(">i")
_CORRELATION_ID = struct.Struct(">i")
#: Refuse absurd frames rather than trying to buffer them (a wrong port, a TLS listener, ...).
MAX_RESPONSE_BYTES = 100 * 1024 * 1024


class FramingError(Exception):
    """The peer sent bytes that are not a Kafka response: a frame too large, or unparseable."""


class ClientFraming:
    def __init__(self, client_id: str, *, max_response_bytes: int = MAX_RESPONSE_BYTES) -> None:
        self.client_id = client_id
        self.max_response_bytes = max_response_bytes
        self._next_correlation_id = 0
        #: correlation id -> (spec, version) of each request whose response has not come yet.
        self._pending: dict[int, tuple[ApiSpec, int]] = {}
        self._buffer = bytearray()

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    def request_bytes(self, request: ApiMessage, version: int) -> tuple[int, bytes]:
        """(correlation id, the framed request). Raises ValueError for an API or version the
        registry does not list (served, or spoken to brokers)."""
        spec = client_api_spec(request.API_KEY)
        if spec is None or not spec.supports(version):
            raise ValueError(f"{type(request).__name__} v{version} is not an API version pystreams speaks")
        correlation_id = self._next_correlation_id
        self._next_correlation_id = (self._next_correlation_id + 1) & 0x7FFFFFFF
        request.API_VERSION = version  # as kafka-python's encode(version=...) leaves it
        framed = request_frame(correlation_id, self.client_id, spec.request_header_version(version) == 2, request, version)
        self._pending[correlation_id] = (spec, version)
        return correlation_id, framed

    def forget(self, correlation_id: int) -> None:
        """The caller gave up on this request (a timeout): its response, if it comes, is dropped."""
        self._pending.pop(correlation_id, None)

    def receive(self, data: bytes) -> list[tuple[int, ApiMessage]]:
        """Feed bytes read from the connection; every response they complete, in order."""
        self._buffer += data
        out: list[tuple[int, ApiMessage]] = []
        while len(self._buffer) >= _FRAME_SIZE.size:
            (size,) = _FRAME_SIZE.unpack_from(self._buffer, 0)
            if not 0 <= size <= self.max_response_bytes:
                raise FramingError(f"a response frame of {size} bytes: is this a Kafka listener?")
            if len(self._buffer) < _FRAME_SIZE.size + size:
                break
            frame = bytes(self._buffer[_FRAME_SIZE.size : _FRAME_SIZE.size + size])
            del self._buffer[: _FRAME_SIZE.size + size]
            decoded = self._decode(frame)
            if decoded is not None:
                out.append(decoded)
        return out

    def _decode(self, frame: bytes) -> tuple[int, ApiMessage] | None:
        if len(frame) < _CORRELATION_ID.size:
            raise FramingError(f"a response frame of {len(frame)} bytes has no header")
        (correlation_id,) = _CORRELATION_ID.unpack_from(frame, 0)
        entry = self._pending.pop(correlation_id, None)
        if entry is None:
            return None  # given up on (timed out): drop it
        spec, version = entry
        if spec.response_header_version(version) == 1 and frame[_CORRELATION_ID.size : _CORRELATION_ID.size + 1] == b"\x00":
            body = memoryview(frame)[_CORRELATION_ID.size + 1 :]  # the usual flexible header: no tags
        elif spec.response_header_version(version) == 0:
            body = memoryview(frame)[_CORRELATION_ID.size :]
        else:
            stream = io.BytesIO(frame)
            try:
                ResponseHeader.decode(stream, flexible=True)
            except Exception as error:
                raise FramingError(f"cannot parse the {spec.name} response header: {error!r}") from error
            body = memoryview(stream.read())
        if spec.api_key == API_VERSIONS_KEY and len(body) >= 2 and struct.unpack_from(">h", body)[0] != 0:
            version = 0  # ApiVersions errors are written at v0, the one form every client reads
        try:
            return correlation_id, decode_body(spec.response_class, body, version)[0]
        except Exception as error:  # the generated decoder raises struct.error, ValueError, ...
            raise FramingError(f"cannot parse the {spec.name} v{version} response: {error!r}") from error
