"""An asyncio TCP server that speaks the Kafka wire protocol and hands requests to a handler.

The server owns the connection-level duties of a Kafka broker's socket server, and every one of
them is bounded, since anyone who can reach the port can send anything (``ServerLimits``):

* size-prefixed frames; a frame larger than ``max_request_bytes`` (Kafka's
  ``socket.request.max.bytes``) or with a negative size closes the connection without reading
  the body; a frame that has started must arrive whole within ``request_read_timeout_ms`` (a
  slow sender cannot hold a connection and its buffer for ever);
* at most ``max_connections`` connections, and ``max_connections_per_ip`` from one address
  (Kafka's ``max.connections`` and ``max.connections.per.ip``): a connection over either is
  closed at once;
* one request at a time per connection, answered in order (Kafka mutes a channel while its
  request is processed), so a connection holds at most one request: that is the in-flight limit;
  large frames (over ``decode_in_thread_bytes``) are read under a shared byte budget
  (``queued_max_request_bytes``, Kafka's ``queued.max.request.bytes``) and decoded on a worker
  thread, so neither memory nor the event loop is held hostage by big requests;
* requests that do not decode close the connection, except ApiVersions at an unknown version,
  which is answered with UNSUPPORTED_VERSION (see ``codec``); a request that decodes but breaks
  its schema (a null where the schema has none, a string over 32767 bytes) is answered with
  INVALID_REQUEST naming the field;
* connections idle for ``connections_max_idle_ms`` (Kafka's default 10 minutes) are closed.

Each refusal is counted in ``refusals`` (by reason) for the metrics.

It answers ApiVersions itself from the registry and, through overridable methods, Metadata and
FindCoordinator as a one-broker cluster that coordinates every group. Everything else goes to
``await handler(header, request)``, which returns the response. A handler exception becomes the
API's error response (the exception's ``errno`` if it is a ``kafka.errors.BrokerResponseError``,
UNKNOWN_SERVER_ERROR otherwise), as Kafka answers a request whose processing failed.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextvars
import logging
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import kafka.errors as Errors
from kafka.protocol.api_header import RequestHeader
from kafka.protocol.api_message import ApiMessage
from kafka.protocol.metadata.find_coordinator import CoordinatorType

from pystreams.protocol import codec
from pystreams.protocol import messages as m
from pystreams.protocol.registry import advertised_versions
from pystreams.protocol.sasl import SaslServer
from pystreams.protocol.security import ListenerSecurity, principal_from_certificate

log = logging.getLogger(__name__)

RequestHandler = Callable[[RequestHeader, ApiMessage], Awaitable[ApiMessage]]

_FRAME_SIZE_BYTES = 4


def _buffered(reader: asyncio.StreamReader) -> int:
    """Bytes the reader already holds. A read of no more than these returns at once, so it
    needs no timeout: arming one per read cost a twentieth of a small request's CPU. (The
    buffer is StreamReader's private attribute; without it every read is timed, as before.)"""
    buffer = getattr(reader, "_buffer", None)
    return 0 if buffer is None else len(buffer)


_WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::"})

# KIP-511: ApiVersions v3+ client software name and version must match this, else INVALID_REQUEST.
_SOFTWARE_NAME_OR_VERSION = re.compile(r"[a-zA-Z0-9](?:[a-zA-Z0-9\-.]*[a-zA-Z0-9])?")

ANONYMOUS = "User:ANONYMOUS"


@dataclass
class Session:
    """What the server knows of one connection: where it comes from and who it is.

    ``principal`` is Kafka's: ``User:ANONYMOUS`` on PLAINTEXT, the client certificate's
    distinguished name on TLS with a client certificate, ``User:NAME`` once SASL succeeds.
    """

    peer: tuple[str, int] | None
    principal: str = ANONYMOUS
    sasl: SaslServer | None = None

    @property
    def authenticated(self) -> bool:
        return self.sasl is None or self.sasl.authenticated

    @property
    def host(self) -> str:
        return self.peer[0] if self.peer else ""


_current_session: contextvars.ContextVar[Session | None] = contextvars.ContextVar("pystreams_protocol_session", default=None)

#: Before SASL authentication only these are served (Kafka closes the connection on anything else).
_BEFORE_AUTHENTICATION = frozenset({m.ApiVersionsRequest.API_KEY, m.SaslHandshakeRequest.API_KEY, m.SaslAuthenticateRequest.API_KEY})


def current_session() -> Session | None:
    """The connection whose request is being handled (peer, principal); None outside one.

    Set for the duration of each connection's task, so a handler can call it while serving a
    request."""
    return _current_session.get()


def current_peer() -> tuple[str, int] | None:
    """(host, port) of the client whose request is being handled, for ClientHost fields."""
    session = _current_session.get()
    return session.peer if session is not None else None


class _IdleWatch:
    """connections.max.idle.ms for one connection: closes it once it has waited that long for
    a request (an answer still being written is flushed first; the pending read then ends). One timer, moved only when it fires, instead of one armed and cancelled around
    every read (a twentieth of the CPU of a small request went to those)."""

    def __init__(self, idle_s: float, close: Callable[[], None]) -> None:
        self._loop = asyncio.get_running_loop()
        self._idle_s = idle_s
        self._close = close
        self._waiting_since: float | None = None
        self.expired = False
        self._timer = self._loop.call_later(idle_s, self._check)

    def waiting(self) -> None:
        self._waiting_since = self._loop.time()

    def busy(self) -> None:
        self._waiting_since = None

    def stop(self) -> None:
        self._timer.cancel()

    def _check(self) -> None:
        now = self._loop.time()
        since = self._waiting_since
        if since is not None and now - since >= self._idle_s:
            self.expired = True
            self._close()
            return
        self._timer = self._loop.call_at((now if since is None else since) + self._idle_s, self._check)


@dataclass(frozen=True)
class ServerLimits:
    """What one server lets its clients hold; Kafka's names where Kafka has the setting."""

    #: socket.request.max.bytes: the largest frame accepted (Kafka's default, 100 MiB).
    max_request_bytes: int = 100 * 1024 * 1024
    #: connections.max.idle.ms: a connection with no request for this long is closed.
    connections_max_idle_ms: int | None = 10 * 60 * 1000
    #: A frame that has started must be read whole within this time.
    request_read_timeout_ms: int = 30_000
    #: max.connections and max.connections.per.ip.
    max_connections: int = 4096
    max_connections_per_ip: int = 1024
    #: Frames above this size are decoded on a worker thread and count against the budget below.
    decode_in_thread_bytes: int = 1024 * 1024
    #: queued.max.request.bytes: the bytes of large frames being read or served at once.
    queued_max_request_bytes: int = 256 * 1024 * 1024

    def __post_init__(self) -> None:
        for name in (
            "max_request_bytes",
            "request_read_timeout_ms",
            "max_connections",
            "max_connections_per_ip",
            "decode_in_thread_bytes",
            "queued_max_request_bytes",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.queued_max_request_bytes < self.max_request_bytes:
            raise ValueError("queued_max_request_bytes must be >= max_request_bytes, or the largest frame could never be read")


class _ByteBudget:
    """Bytes of large frames in flight across connections; a frame waits for room (FIFO)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._waiters: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()

    async def acquire(self, size: int) -> None:
        if not self._waiters and self.used + size <= self.limit:
            self.used += size
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((size, waiter))
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self.release(size)  # granted just as we were cancelled
            else:
                self._waiters.remove((size, waiter))
            raise

    def release(self, size: int) -> None:
        self.used -= size
        while self._waiters and self.used + self._waiters[0][0] <= self.limit:
            size, waiter = self._waiters.popleft()
            if not waiter.done():
                self.used += size
                waiter.set_result(None)


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
        limits: ServerLimits | None = None,
        security: ListenerSecurity | None = None,
        node_id: int = 0,
        advertised_host: str | None = None,
        advertised_port: int | None = None,
        cluster_id: str = "pystreams",
        locate_group: Callable[[str], BrokerAddress | str] | None = None,
        cluster_nodes: Callable[[], Sequence[BrokerAddress]] | None = None,
    ) -> None:
        """``port`` 0 binds a free port (see ``port``). The advertised address, given to clients in
        Metadata and FindCoordinator, defaults to the bound host and port; like Kafka's
        ``advertised.listeners``, it must be given when binding a wildcard address.
        ``locate_group(group_id)``: the node that coordinates a group, or why none does now
        (FindCoordinator answers that COORDINATOR_NOT_AVAILABLE with the reason); default: this
        server for every group. ``cluster_nodes()``: every coordinator node, for Metadata
        (default: this server alone)."""
        if advertised_host is None and host in _WILDCARD_HOSTS:
            raise ValueError(f"binding {host!r} needs an advertised_host that clients can reach")
        self._host = host
        self._requested_port = port
        self._handler = handler
        self.limits = limits or ServerLimits()
        self.security = security or ListenerSecurity()
        self._ssl_context = self.security.ssl_context()
        self._node_id = node_id
        self._advertised_host = advertised_host
        self._advertised_port = advertised_port
        self.cluster_id = cluster_id
        self._locate_group = locate_group
        self._cluster_nodes = cluster_nodes
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        #: Set by close(): a connection cancelled from then on ends quietly.
        self._closing = False
        self._per_ip: collections.Counter[str] = collections.Counter()
        self._budget = _ByteBudget(self.limits.queued_max_request_bytes)
        self._decoder: concurrent.futures.ThreadPoolExecutor | None = None
        #: Connections closed or requests refused, by reason, since start (for the metrics).
        self.refusals: collections.Counter[str] = collections.Counter()

    # --- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._server is not None:
            raise RuntimeError("server already started")
        self._server = await asyncio.start_server(
            self._serve_connection,
            self._host,
            self._requested_port,
            ssl=self._ssl_context,
            ssl_handshake_timeout=self.limits.request_read_timeout_ms / 1000 if self._ssl_context else None,
        )
        log.info("Kafka protocol server listening on %s://%s:%d", self.security.protocol, self._host, self.port)

    async def serve_forever(self) -> None:
        if self._server is None:
            await self.start()
        assert self._server is not None
        await self._server.serve_forever()

    async def close(self) -> None:
        """Stop accepting, close every open connection (cancelling requests in progress), wait."""
        server, self._server = self._server, None
        self._closing = True
        if server is not None:
            server.close()
        tasks = list(self._connections)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if server is not None:
            await server.wait_closed()
        decoder, self._decoder = self._decoder, None
        if decoder is not None:
            decoder.shutdown(wait=False, cancel_futures=True)

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

    def set_cluster(self, *, locate_group: Callable[[str], BrokerAddress | str], cluster_nodes: Callable[[], Sequence[BrokerAddress]]) -> None:
        """Answer FindCoordinator and Metadata for a cluster of coordinators from now on (the
        node's own address is known only once it listens)."""
        self._locate_group, self._cluster_nodes = locate_group, cluster_nodes

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
                header,
                Errors.InvalidRequestError.errno,
                "invalid client software name or version",
                request,
            )
        return m.ApiVersionsResponse(
            error_code=0,
            throttle_time_ms=0,
            api_keys=[m.ApiVersionsResponse.ApiVersion(api_key=key, min_version=low, max_version=high) for key, low, high in advertised_versions()],
        )

    async def handle_metadata(self, header: RequestHeader, request: ApiMessage) -> ApiMessage:
        """Every coordinator node as a broker (this server alone unless it is one of a cluster),
        this server as the controller; it hosts no topics, so each requested topic is
        UNKNOWN_TOPIC_OR_PARTITION (all topics: an empty list)."""
        me = self.address
        unknown = Errors.UnknownTopicOrPartitionError.errno
        topics = []
        for topic in request.topics or []:
            name = topic.name
            if name is None and header.request_api_version < 12:  # nullable only from v12
                name = ""
            topics.append(
                m.MetadataResponse.MetadataResponseTopic(
                    error_code=unknown,
                    name=name,
                    topic_id=topic.topic_id,
                    is_internal=False,
                    partitions=[],
                )
            )
        nodes = list(self._cluster_nodes()) if self._cluster_nodes is not None else []
        if all(node.node_id != me.node_id for node in nodes):
            nodes.append(me)
        return m.MetadataResponse(
            throttle_time_ms=0,
            brokers=[
                m.MetadataResponse.MetadataResponseBroker(node_id=n.node_id, host=n.host, port=n.port, rack=None)
                for n in sorted(nodes, key=lambda n: n.node_id)
            ],
            cluster_id=self.cluster_id,
            controller_id=me.node_id,
            topics=topics,
        )

    def coordinator_for(self, key: str, key_type: int) -> BrokerAddress | str:
        """Which node coordinates ``key`` (see ``locate_group``); otherwise why none does, answered
        with COORDINATOR_NOT_AVAILABLE: a group whose shard has no owner now, transactional ids
        and share groups, which no node serves."""
        if key_type != CoordinatorType.GROUP:
            return "this server coordinates consumer groups only"
        if self._locate_group is not None:
            return self._locate_group(key)
        return self.address

    async def handle_find_coordinator(self, header: RequestHeader, request: ApiMessage) -> ApiMessage:
        not_available = Errors.CoordinatorNotAvailableError.errno
        if header.request_api_version < 4:
            node = self.coordinator_for(request.key, request.key_type)
            if isinstance(node, str):
                return codec.error_response(header, not_available, node, request)
            return m.FindCoordinatorResponse(
                throttle_time_ms=0,
                error_code=0,
                error_message=None,
                node_id=node.node_id,
                host=node.host,
                port=node.port,
            )
        coordinators = []
        for key in request.coordinator_keys:
            node = self.coordinator_for(key, request.key_type)
            if isinstance(node, str):
                entry = m.FindCoordinatorResponse.Coordinator(key=key, node_id=-1, host="", port=-1, error_code=not_available, error_message=node)
            else:
                entry = m.FindCoordinatorResponse.Coordinator(key=key, node_id=node.node_id, host=node.host, port=node.port, error_code=0, error_message=None)
            coordinators.append(entry)
        return m.FindCoordinatorResponse(throttle_time_ms=0, coordinators=coordinators)

    # --- connections -----------------------------------------------------------------------------

    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        host = str(peer[0]) if peer else ""
        refusal = self._over_connection_limits(host)
        if refusal is not None:
            self.refusals[refusal] += 1
            log.warning("refusing a connection from %s: %s", host, refusal.replace("_", "."))
            writer.close()
            return
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        self._per_ip[host] += 1
        session = Session(peer[:2] if peer else None)
        if self._ssl_context is not None:
            session.principal = principal_from_certificate(writer.get_extra_info("peercert")) or ANONYMOUS
        if self.security.sasl:
            assert self.security.credentials is not None
            session.sasl = SaslServer(self.security.sasl_enabled_mechanisms, self.security.credentials)
        _current_session.set(session)
        idle_ms = self.limits.connections_max_idle_ms
        idle = None if idle_ms is None else _IdleWatch(idle_ms / 1000, writer.close)
        try:
            while True:
                size = await self._read_frame_size(reader, peer, idle)
                if size is None:
                    return
                budgeted = size if size > self.limits.decode_in_thread_bytes else 0
                if budgeted:
                    await self._budget.acquire(budgeted)
                try:
                    payload = await self._read_frame_body(reader, size, peer)
                    if payload is None:
                        return
                    reply, close = await self._answer(payload, session, in_thread=bool(budgeted))
                    del payload
                    if reply is not None:
                        writer.write(reply)
                        await writer.drain()
                    if close or reply is None:
                        return
                finally:
                    if budgeted:
                        self._budget.release(budgeted)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away mid-frame or mid-reply
        except asyncio.CancelledError:
            if not self._closing:
                raise
            # close() cancels open connections: a clean stop, not an error. Ending the task
            # cancelled would make asyncio's start_server callback log an ERROR traceback
            # per connection (Python 3.11 calls task.exception() on it).
        except Exception:  # never let one connection's failure escape into the event loop
            log.exception("connection from %s failed", peer)
        finally:
            if idle is not None:
                idle.stop()
            self._connections.discard(task)
            self._per_ip[host] -= 1
            if self._per_ip[host] <= 0:
                del self._per_ip[host]
            writer.close()
            try:
                await writer.wait_closed()
            except OSError:
                pass  # the peer reset the connection first

    def _over_connection_limits(self, host: str) -> str | None:
        if len(self._connections) >= self.limits.max_connections:
            return "max_connections"
        if self._per_ip[host] >= self.limits.max_connections_per_ip:
            return "max_connections_per_ip"
        return None

    async def _read_frame_size(self, reader: asyncio.StreamReader, peer: object, idle: _IdleWatch | None) -> int | None:
        """The size of the next frame, or None when the connection should close."""
        if _buffered(reader) >= _FRAME_SIZE_BYTES:  # pipelined: no wait, so no timer
            size_bytes = await reader.readexactly(_FRAME_SIZE_BYTES)
        else:
            if idle is not None:
                idle.waiting()
            try:
                first = await reader.readexactly(1)
            except asyncio.IncompleteReadError:
                if idle is not None and idle.expired:
                    log.info("closing connection from %s idle for %d ms", peer, self.limits.connections_max_idle_ms)
                return None  # a clean close between requests, or idle for too long
            finally:
                if idle is not None:
                    idle.busy()
            if _buffered(reader) >= _FRAME_SIZE_BYTES - 1:
                rest = await reader.readexactly(_FRAME_SIZE_BYTES - 1)
            else:
                try:
                    async with asyncio.timeout(self.limits.request_read_timeout_ms / 1000):
                        rest = await reader.readexactly(_FRAME_SIZE_BYTES - 1)
                except TimeoutError:
                    self._read_timed_out(peer)
                    return None
            size_bytes = first + rest
        size = int.from_bytes(size_bytes, "big", signed=True)
        if size < 0 or size > self.limits.max_request_bytes:
            # Kafka's InvalidReceiveException: the connection is closed without reading the body.
            self.refusals["frame_too_large" if size > 0 else "bad_frame_size"] += 1
            log.warning("closing connection from %s: frame size %d outside 0..%d", peer, size, self.limits.max_request_bytes)
            return None
        return size

    async def _read_frame_body(self, reader: asyncio.StreamReader, size: int, peer: object) -> bytes | None:
        if _buffered(reader) >= size:  # the usual case: the whole request came in one read
            return await reader.readexactly(size)
        try:
            async with asyncio.timeout(self.limits.request_read_timeout_ms / 1000):
                return await reader.readexactly(size)
        except TimeoutError:
            self._read_timed_out(peer)
            return None

    def _read_timed_out(self, peer: object) -> None:
        self.refusals["request_read_timeout"] += 1
        log.warning("closing connection from %s: a request was not received whole within %d ms", peer, self.limits.request_read_timeout_ms)
        return None

    async def _decode(self, payload: bytes, in_thread: bool) -> codec.DecodedRequest:
        if not in_thread:
            return codec.decode_request(payload)
        if self._decoder is None:
            # One thread: large frames queue behind each other instead of all holding the GIL.
            self._decoder = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="pystreams-decode")
        return await asyncio.get_running_loop().run_in_executor(self._decoder, codec.decode_request, payload)

    async def _answer(self, payload: bytes, session: Session, *, in_thread: bool = False) -> tuple[bytes | None, bool]:
        """(the framed reply to one request or None, whether to close the connection after it)."""
        reply = await self._reply(payload, session, in_thread=in_thread)
        if isinstance(reply, tuple):
            return reply
        return reply, False

    async def _reply(self, payload: bytes, session: Session, *, in_thread: bool) -> bytes | None | tuple[bytes | None, bool]:
        peer = session.peer
        try:
            decoded = await self._decode(payload, in_thread)
        except codec.UnsupportedApiVersionError as exc:
            if exc.answerable:
                header = exc.header
                return codec.encode_response(
                    header,
                    codec.error_response(header, Errors.UnsupportedVersionError.errno),
                )
            self.refusals["unsupported_version"] += 1
            log.warning("closing connection from %s: %s", peer, exc)
            return None
        except codec.InvalidFieldError as exc:
            self.refusals["invalid_request"] += 1
            log.info("invalid request from %s: %s", peer, exc)
            return self._encoded_error(exc.header, exc.request, Errors.InvalidRequestError.errno, str(exc))
        except codec.RequestDecodeError as exc:
            self.refusals["malformed_request"] += 1
            log.warning("closing connection from %s: %s", peer, exc)
            return None

        if not session.authenticated and decoded.api_key not in _BEFORE_AUTHENTICATION:
            self.refusals["unauthenticated_request"] += 1
            log.warning("closing connection from %s: %s before SASL authentication", peer, decoded.spec.name)
            return None
        if decoded.api_key in (m.SaslHandshakeRequest.API_KEY, m.SaslAuthenticateRequest.API_KEY):
            return self._sasl_step(decoded, session)
        try:
            response = await self._dispatch(decoded)
            return codec.encode_response(decoded.header, response)
        except Exception as exc:
            # A Kafka error raised on purpose is an answer; anything else is a bug worth a traceback.
            expected = isinstance(exc, Errors.BrokerResponseError)
            log.log(
                logging.DEBUG if expected else logging.ERROR,
                "%s v%d (correlation id %d) from %s failed: %r",
                decoded.spec.name,
                decoded.api_version,
                decoded.correlation_id,
                peer,
                exc,
                exc_info=not expected,
            )
            if isinstance(exc, Errors.BrokerResponseError) and exc.errno is not None:
                code, message = exc.errno, (str(exc.args[0]) if exc.args else None)
            else:  # internal details stay in the log
                code, message = Errors.UnknownError.errno, None
            return self._encoded_error(decoded.header, decoded.request, code, message)

    def _sasl_step(self, decoded: codec.DecodedRequest, session: Session) -> tuple[bytes | None, bool]:
        """SaslHandshake / SaslAuthenticate; a failure is answered, then the connection closes."""
        request = decoded.request
        if session.sasl is None:
            self.refusals["sasl_not_enabled"] += 1
            code = Errors.IllegalSaslStateError.errno
            return codec.encode_response(decoded.header, codec.error_response(decoded.header, code, "this listener does not use SASL", request)), True
        if decoded.api_key == m.SaslHandshakeRequest.API_KEY:
            code = session.sasl.handshake(request.mechanism)
            response = m.SaslHandshakeResponse(error_code=code, mechanisms=list(session.sasl.mechanisms))
            if code:
                self.refusals["authentication_failed"] += 1
            return codec.encode_response(decoded.header, response), code == Errors.IllegalSaslStateError.errno
        step = session.sasl.authenticate(bytes(request.auth_bytes))
        response = m.SaslAuthenticateResponse(
            error_code=step.error_code,
            error_message=step.error_message,
            auth_bytes=step.auth_bytes,
            session_lifetime_ms=0,
        )
        if step.error_code:
            self.refusals["authentication_failed"] += 1
            log.warning("authentication failed for %s: %s", session.peer, step.error_message)
            return codec.encode_response(decoded.header, response), True
        if step.principal is not None:
            session.principal = step.principal
            log.info("%s authenticated as %s", session.peer, step.principal)
        return codec.encode_response(decoded.header, response), False

    async def _dispatch(self, decoded: codec.DecodedRequest) -> ApiMessage:
        header, request = decoded.header, decoded.request
        if decoded.api_key == m.ApiVersionsRequest.API_KEY:
            return self.api_versions_response(header, request)
        if decoded.api_key == m.MetadataRequest.API_KEY:
            return await self.handle_metadata(header, request)
        if decoded.api_key == m.FindCoordinatorRequest.API_KEY:
            return await self.handle_find_coordinator(header, request)
        return await self._handler(header, request)

    def _encoded_error(self, header: RequestHeader, request: ApiMessage, code: int, message: str | None) -> bytes | None:
        """The API's error response, shaped after the request where the API needs that; built
        without the request when its contents cannot be echoed (a null name in an invalid one)."""
        for echoed in (request, None):
            try:
                return codec.encode_response(header, codec.error_response(header, code, message, echoed))
            except Exception:
                continue
        log.error("cannot build the error response to API %d; closing the connection", header.request_api_key)
        return None
