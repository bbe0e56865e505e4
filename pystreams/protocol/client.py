"""A small blocking Kafka-protocol client, for the command-line tools.

``KafkaProtocolClient(host, port)`` opens one TCP connection, asks the server which versions it
speaks (ApiVersions), and ``send(request)`` writes one request and reads its response at the
highest version both sides support (pystreams' side is ``registry.SUPPORTED_APIS``). One
request in flight at a time; no retries, no metadata, no coordinator lookup — the tools talk to
the coordinator they are pointed at.
"""
from __future__ import annotations

import io
import itertools
import socket
import struct
from types import TracebackType

import kafka.errors as Errors
from kafka.protocol.api_header import RequestHeader, ResponseHeader
from kafka.protocol.api_message import ApiMessage

from pystreams.protocol import messages as m
from pystreams.protocol.registry import API_VERSIONS_KEY, ApiSpec, api_spec

_FRAME_SIZE = struct.Struct(">i")
#: Refuse absurd frames rather than trying to allocate them (a wrong port, a TLS listener, ...).
MAX_RESPONSE_BYTES = 100 * 1024 * 1024
CLIENT_SOFTWARE_NAME = "pystreams-tools"
CLIENT_SOFTWARE_VERSION = "0"


class ProtocolClientError(Exception):
    """The server could not be reached, closed the connection, or answered something unreadable."""


class KafkaProtocolClient:
    def __init__(self, host: str, port: int, *, client_id: str = "pystreams-tools", timeout_s: float = 10.0) -> None:
        self.host = host
        self.port = port
        self.client_id = client_id
        self.timeout_s = timeout_s
        self._socket: socket.socket | None = None
        self._correlation_ids = itertools.count(1)
        #: api key -> (min, max) the server advertised; empty until connected.
        self.server_versions: dict[int, tuple[int, int]] = {}

    # -- connection ----------------------------------------------------------------------------

    def connect(self) -> KafkaProtocolClient:
        if self._socket is not None:
            return self
        try:
            self._socket = socket.create_connection((self.host, self.port), timeout=self.timeout_s)
        except OSError as error:
            raise ProtocolClientError(f"cannot connect to {self.host}:{self.port}: {error}") from error
        self._socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            self._negotiate()
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        sock, self._socket = self._socket, None
        if sock is not None:
            sock.close()

    def __enter__(self) -> KafkaProtocolClient:
        return self.connect()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def _negotiate(self) -> None:
        spec = _spec(API_VERSIONS_KEY)
        request = m.ApiVersionsRequest(client_software_name=CLIENT_SOFTWARE_NAME, client_software_version=CLIENT_SOFTWARE_VERSION)
        response = self._exchange(spec, request, spec.max_version)
        if response.error_code == Errors.UnsupportedVersionError.errno:
            # Kafka's fallback: the error lists the ApiVersions versions the server speaks.
            advertised = {row.api_key: row.max_version for row in response.api_keys}
            version = min(spec.max_version, advertised.get(API_VERSIONS_KEY, 0))
            response = self._exchange(spec, m.ApiVersionsRequest(), version)
        if response.error_code:
            raise ProtocolClientError(f"ApiVersions failed: {Errors.for_code(response.error_code).__name__}")
        self.server_versions = {row.api_key: (row.min_version, row.max_version) for row in response.api_keys}

    # -- requests ------------------------------------------------------------------------------

    def version_for(self, api_key: int) -> int:
        """The highest version of this API both pystreams and the server speak."""
        spec = _spec(api_key)
        low, high = spec.min_version, spec.max_version
        if self.server_versions:
            if api_key not in self.server_versions:
                raise ProtocolClientError(f"the server at {self.host}:{self.port} does not serve {spec.name}")
            server_low, server_high = self.server_versions[api_key]
            low, high = max(low, server_low), min(high, server_high)
        if low > high:
            raise ProtocolClientError(f"no {spec.name} version in common with the server at {self.host}:{self.port}")
        return high

    def send(self, request: ApiMessage, version: int | None = None) -> ApiMessage:
        """Send ``request`` and return its response (at ``version``, or the best common one)."""
        self.connect()
        spec = _spec(request.API_KEY)
        if version is None:
            version = self.version_for(spec.api_key)
        elif not spec.supports(version):
            raise ValueError(f"{spec.name} v{version} is outside pystreams' range {spec.min_version}-{spec.max_version}")
        return self._exchange(spec, request, version)

    def _exchange(self, spec: ApiSpec, request: ApiMessage, version: int) -> ApiMessage:
        correlation_id = next(self._correlation_ids)
        header = RequestHeader(
            request_api_key=spec.api_key, request_api_version=version, correlation_id=correlation_id, client_id=self.client_id,
        )
        payload = bytes(header.encode(flexible=spec.request_header_version(version) == 2)) + bytes(request.encode(version=version))
        self._write(_FRAME_SIZE.pack(len(payload)) + payload)
        stream = io.BytesIO(self._read_frame())
        # ApiVersions errors come back at v0 (the one form every client can read); see codec.
        response_version = version
        response_header = ResponseHeader.decode(stream, flexible=spec.response_header_version(version) == 1)
        if response_header.correlation_id != correlation_id:
            raise ProtocolClientError(f"response correlation id {response_header.correlation_id}, expected {correlation_id}")
        body = stream.read()
        if spec.api_key == API_VERSIONS_KEY and len(body) >= 2 and struct.unpack_from(">h", body)[0] != 0:
            response_version = 0
        try:
            response = spec.response_class.decode(body, version=response_version)
        except Exception as error:  # the generated decoder raises struct.error, ValueError, ...
            raise ProtocolClientError(f"cannot parse the {spec.name} v{response_version} response: {error!r}") from error
        return response

    def _write(self, data: bytes) -> None:
        assert self._socket is not None
        try:
            self._socket.sendall(data)
        except OSError as error:
            self.close()
            raise ProtocolClientError(f"sending to {self.host}:{self.port} failed: {error}") from error

    def _read_frame(self) -> bytes:
        (size,) = _FRAME_SIZE.unpack(self._read_exactly(_FRAME_SIZE.size))
        if not 0 <= size <= MAX_RESPONSE_BYTES:
            self.close()
            raise ProtocolClientError(f"{self.host}:{self.port} sent a frame of {size} bytes: is this a Kafka listener?")
        return self._read_exactly(size)

    def _read_exactly(self, count: int) -> bytes:
        assert self._socket is not None
        chunks, remaining = [], count
        while remaining:
            try:
                chunk = self._socket.recv(min(remaining, 1 << 20))
            except OSError as error:  # includes socket.timeout
                self.close()
                raise ProtocolClientError(f"reading from {self.host}:{self.port} failed: {error}") from error
            if not chunk:
                self.close()
                raise ProtocolClientError(f"{self.host}:{self.port} closed the connection")
            chunks.append(chunk)
            remaining -= len(chunk)
        return b"".join(chunks)


def _spec(api_key: int) -> ApiSpec:
    spec = api_spec(api_key)
    if spec is None:
        raise ValueError(f"API key {api_key} is not in pystreams' protocol registry")
    return spec
