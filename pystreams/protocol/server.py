"""An asyncio TCP server that speaks the Kafka wire protocol and hands requests to a handler.

The server owns the connection-level duties of a Kafka broker's socket server:

* size-prefixed frames; a frame larger than ``max_request_bytes`` (Kafka's
  ``socket.request.max.bytes``, 100 MiB) or with a negative size closes the connection;
* one request at a time per connection, answered in order (Kafka mutes a channel while its request
  is processed); different connections run concurrently;
* requests that do not decode close the connection, except ApiVersions at an unknown version,
  which is answered with UNSUPPORTED_VERSION (see ``codec``);
* connections idle for ``connections_max_idle_ms`` (Kafka's default 10 minutes) are closed.

It answers ApiVersions itself from the registry and, through overridable methods, Metadata and
FindCoordinator as a one-broker cluster that coordinates every group. Everything else goes to
``await handler(header, request)``, which returns the response. A handler exception becomes the
API's error response (the exception's ``errno`` if it is a ``kafka.errors.BrokerResponseError``,
UNKNOWN_SERVER_ERROR otherwise), as Kafka answers a request whose processing failed.
"""
from __future__ import annotations

import asyncio
import contextvars
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import kafka.errors as Errors
from kafka.protocol.api_header import RequestHeader
from kafka.protocol.api_message import ApiMessage
from kafka.protocol.metadata.find_coordinator import CoordinatorType

from pystreams.protocol import codec
from pystreams.protocol import messages as m
from pystreams.protocol.registry import advertised_versions

log = logging.getLogger(__name__)

RequestHandler = Callable[[RequestHeader, ApiMessage], Awaitable[ApiMessage]]

DEFAULT_MAX_REQUEST_BYTES = 100 * 1024 * 1024  # socket.request.max.bytes
DEFAULT_CONNECTIONS_MAX_IDLE_MS = 10 * 60 * 1000  # connections.max.idle.ms
_FRAME_SIZE_BYTES = 4
_WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::"})

# KIP-511: ApiVersions v3+ client software name and version must match this, else INVALID_REQUEST.
_SOFTWARE_NAME_OR_VERSION = re.compile(r"[a-zA-Z0-9](?:[a-zA-Z0-9\-.]*[a-zA-Z0-9])?")

_current_peer: contextvars.ContextVar[tuple[str, int] | None] = contextvars.ContextVar(
    "pystreams_protocol_peer", default=None,
)


def current_peer() -> tuple[str, int] | None:
    """(host, port) of the client whose request is being handled, for ClientHost fields.

    Set for the duration of each connection's task, so a handler can call it while serving a
    request; None outside a connection.
    """
    return _current_peer.get()


@dataclass(frozen=True)
class BrokerAddress:
    node_id: int
    host: str
    port: int


class KafkaProtocolServer:
    """A Kafka-protocol TCP server for the coordinator; see the module docstring."""

    def __init__(
        self,
        host: str,
        port: int,
        handler: RequestHandler,
        *,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
        connections_max_idle_ms: int | None = DEFAULT_CONNECTIONS_MAX_IDLE_MS,
        node_id: int = 0,
        advertised_host: str | None = None,
        advertised_port: int | None = None,
        cluster_id: str = "pystreams",
    ) -> None:
        """``port`` 0 binds a free port (see ``port``). The advertised address, given to clients in
        Metadata and FindCoordinator, defaults to the bound host and port; like Kafka's
        ``advertised.listeners``, it must be given when binding a wildcard address."""
        if advertised_host is None and host in _WILDCARD_HOSTS:
            raise ValueError(f"binding {host!r} needs an advertised_host that clients can reach")
        self._host = host
        self._requested_port = port
        self._handler = handler
        self._max_request_bytes = max_request_bytes
        self._connections_max_idle_ms = connections_max_idle_ms
        self._node_id = node_id
        self._advertised_host = advertised_host
        self._advertised_port = advertised_port
        self.cluster_id = cluster_id
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    # --- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._server is not None:
            raise RuntimeError("server already started")
        self._server = await asyncio.start_server(self._serve_connection, self._host, self._requested_port)
        log.info("Kafka protocol server listening on %s:%d", self._host, self.port)

    async def serve_forever(self) -> None:
        if self._server is None:
            await self.start()
        assert self._server is not None
        await self._server.serve_forever()

    async def close(self) -> None:
        """Stop accepting, close every open connection (cancelling requests in progress), wait."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        tasks = list(self._connections)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if server is not None:
            await server.wait_closed()

    async def __aenter__(self) -> KafkaProtocolServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def port(self) -> int:
        """The bound port (the real one when constructed with port 0)."""
        if self._server is None or not self._server.sockets:
            raise RuntimeError("server not started")
        return self._server.sockets[0].getsockname()[1]

    @property
    def address(self) -> BrokerAddress:
        """This server as clients should reach it."""
        return BrokerAddress(
            node_id=self._node_id,
            host=self._advertised_host or self._host,
            port=self._advertised_port if self._advertised_port is not None else self.port,
        )

    @property
    def connection_count(self) -> int:
        return len(self._connections)

    # --- overridable built-in answers ------------------------------------------------------------

    def api_versions_response(self, header: RequestHeader, request: ApiMessage) -> ApiMessage:
        if header.request_api_version >= 3 and not (
            _SOFTWARE_NAME_OR_VERSION.fullmatch(request.client_software_name or "")
            and _SOFTWARE_NAME_OR_VERSION.fullmatch(request.client_software_version or "")
        ):
            return codec.error_response(
                header, Errors.InvalidRequestError.errno, "invalid client software name or version", request,
            )
        return m.ApiVersionsResponse(
            error_code=0,
            throttle_time_ms=0,
            api_keys=[
                m.ApiVersionsResponse.ApiVersion(api_key=key, min_version=low, max_version=high)
                for key, low, high in advertised_versions()
            ],
        )

    async def handle_metadata(self, header: RequestHeader, request: ApiMessage) -> ApiMessage:
        """This server as the only broker and the controller; it hosts no topics, so each
        requested topic is UNKNOWN_TOPIC_OR_PARTITION (all topics: an empty list)."""
        me = self.address
        unknown = Errors.UnknownTopicOrPartitionError.errno
        topics = []
        for topic in request.topics or []:
            name = topic.name
            if name is None and header.request_api_version < 12:  # nullable only from v12
                name = ""
            topics.append(m.MetadataResponse.MetadataResponseTopic(
                error_code=unknown, name=name, topic_id=topic.topic_id, is_internal=False, partitions=[],
            ))
        return m.MetadataResponse(
            throttle_time_ms=0,
            brokers=[m.MetadataResponse.MetadataResponseBroker(node_id=me.node_id, host=me.host, port=me.port, rack=None)],
            cluster_id=self.cluster_id,
            controller_id=me.node_id,
            topics=topics,
        )

    def coordinator_for(self, key: str, key_type: int) -> BrokerAddress | None:
        """Which node coordinates ``key``: this server for every group; None (answered with
        COORDINATOR_NOT_AVAILABLE) for transactional ids and share groups, which it does not serve."""
        if key_type != CoordinatorType.GROUP:
            return None
        return self.address

    async def handle_find_coordinator(self, header: RequestHeader, request: ApiMessage) -> ApiMessage:
        not_available = Errors.CoordinatorNotAvailableError.errno
        if header.request_api_version < 4:
            node = self.coordinator_for(request.key, request.key_type)
            if node is None:
                return codec.error_response(header, not_available, None, request)
            return m.FindCoordinatorResponse(
                throttle_time_ms=0, error_code=0, error_message=None,
                node_id=node.node_id, host=node.host, port=node.port,
            )
        coordinators = []
        for key in request.coordinator_keys:
            node = self.coordinator_for(key, request.key_type)
            coordinators.append(m.FindCoordinatorResponse.Coordinator(
                key=key,
                node_id=node.node_id if node else -1,
                host=node.host if node else "",
                port=node.port if node else -1,
                error_code=0 if node else not_available,
                error_message=None,
            ))
        return m.FindCoordinatorResponse(throttle_time_ms=0, coordinators=coordinators)

    # --- connections -----------------------------------------------------------------------------

    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        peer = writer.get_extra_info("peername")
        _current_peer.set(peer[:2] if peer else None)
        try:
            while True:
                payload = await self._read_frame(reader, peer)
                if payload is None:
                    return
                reply = await self._answer(payload, peer)
                if reply is None:
                    return
                writer.write(reply)
                await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away mid-frame or mid-reply
        except Exception:  # never let one connection's failure escape into the event loop
            log.exception("connection from %s failed", peer)
        finally:
            self._connections.discard(task)
            writer.close()
            try:
                await writer.wait_closed()
            except OSError:
                pass  # the peer reset the connection first

    async def _read_frame(self, reader: asyncio.StreamReader, peer: object) -> bytes | None:
        """The next request's bytes, or None when the connection should close."""
        idle_ms = self._connections_max_idle_ms
        try:
            async with asyncio.timeout(None if idle_ms is None else idle_ms / 1000):
                size_bytes = await reader.readexactly(_FRAME_SIZE_BYTES)
        except asyncio.IncompleteReadError:
            return None  # clean close between requests
        except TimeoutError:
            log.info("closing connection from %s idle for %d ms", peer, idle_ms)
            return None
        size = int.from_bytes(size_bytes, "big", signed=True)
        if size < 0 or size > self._max_request_bytes:
            # Kafka's InvalidReceiveException: the connection is closed without reading the body.
            log.warning("closing connection from %s: frame size %d outside 0..%d", peer, size, self._max_request_bytes)
            return None
        return await reader.readexactly(size)

    async def _answer(self, payload: bytes, peer: object) -> bytes | None:
        """The framed reply to one request, or None to close the connection."""
        try:
            decoded = codec.decode_request(payload)
        except codec.UnsupportedApiVersionError as exc:
            if exc.answerable:
                header = exc.header
                return codec.encode_response(
                    header, codec.error_response(header, Errors.UnsupportedVersionError.errno),
                )
            log.warning("closing connection from %s: %s", peer, exc)
            return None
        except codec.RequestDecodeError as exc:
            log.warning("closing connection from %s: %s", peer, exc)
            return None

        try:
            response = await self._dispatch(decoded)
            return codec.encode_response(decoded.header, response)
        except Exception as exc:
            # A Kafka error raised on purpose is an answer; anything else is a bug worth a traceback.
            expected = isinstance(exc, Errors.BrokerResponseError)
            log.log(
                logging.DEBUG if expected else logging.ERROR,
                "%s v%d (correlation id %d) from %s failed: %r",
                decoded.spec.name, decoded.api_version, decoded.correlation_id, peer, exc,
                exc_info=not expected,
            )
            return self._encoded_error(decoded, exc)

    async def _dispatch(self, decoded: codec.DecodedRequest) -> ApiMessage:
        header, request = decoded.header, decoded.request
        if decoded.api_key == m.ApiVersionsRequest.API_KEY:
            return self.api_versions_response(header, request)
        if decoded.api_key == m.MetadataRequest.API_KEY:
            return await self.handle_metadata(header, request)
        if decoded.api_key == m.FindCoordinatorRequest.API_KEY:
            return await self.handle_find_coordinator(header, request)
        return await self._handler(header, request)

    def _encoded_error(self, decoded: codec.DecodedRequest, exc: Exception) -> bytes | None:
        if isinstance(exc, Errors.BrokerResponseError) and exc.errno is not None:
            code, message = exc.errno, (str(exc.args[0]) if exc.args else None)
        else:  # internal details stay in the log
            code, message = Errors.UnknownError.errno, None
        try:
            return codec.encode_response(
                decoded.header, codec.error_response(decoded.header, code, message, decoded.request),
            )
        except Exception:
            log.exception("cannot build the error response to %s; closing the connection", decoded.spec.name)
            return None
