"""A small blocking Kafka-protocol client, for the command-line tools.

``KafkaProtocolClient(host, port)`` opens one connection (TLS when the security settings say
so), runs the client handshake (ApiVersions, then SASL when configured; see ``handshake``), and
``send(request)`` writes one request and reads its response at the newest version both sides
speak. Framing is the shared sans-IO ``ClientFraming``. One request in flight at a time; no
retries, no metadata, no coordinator lookup — the tools talk to the coordinator they are
pointed at.
"""

from __future__ import annotations

import socket
from types import TracebackType

from kafka.protocol.api_message import ApiMessage

from pystreams.protocol.framing import ClientFraming, FramingError
from pystreams.protocol.handshake import HandshakeError, ServerInfo, client_handshake
from pystreams.protocol.registry import api_spec
from pystreams.protocol.security import ClientSecurity


class ProtocolClientError(Exception):
    """The server could not be reached, closed the connection, or answered something unreadable."""


class KafkaProtocolClient:
    def __init__(
        self,
        host: str,
        port: int,
        *,
        client_id: str = "pystreams-tools",
        timeout_s: float = 10.0,
        security: ClientSecurity | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.client_id = client_id
        self.timeout_s = timeout_s
        self.security = security or ClientSecurity()
        self._socket: socket.socket | None = None
        self._framing = ClientFraming(client_id)
        self.server: ServerInfo | None = None

    @property
    def server_versions(self) -> dict[int, tuple[int, int]]:
        """api key -> (min, max) the server advertised; empty until connected."""
        return self.server.versions if self.server is not None else {}

    # -- connection ----------------------------------------------------------------------------

    def connect(self) -> KafkaProtocolClient:
        if self._socket is not None:
            return self
        try:
            sock = socket.create_connection((self.host, self.port), timeout=self.timeout_s)
        except OSError as error:
            raise ProtocolClientError(f"cannot connect to {self.host}:{self.port}: {error}") from error
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        context = self.security.ssl_context()
        if context is not None:
            try:
                sock = context.wrap_socket(sock, server_hostname=self.host)
            except OSError as error:  # ssl.SSLError included
                sock.close()
                raise ProtocolClientError(f"TLS with {self.host}:{self.port} failed: {error}") from error
        self._socket = sock
        self._framing = ClientFraming(self.client_id)
        try:
            self.server = self._drive(client_handshake(self.security, self.host))
        except HandshakeError as error:
            self.close()
            raise ProtocolClientError(f"{self.host}:{self.port}: {error}") from error
        except BaseException:
            self.close()
            raise
        return self

    def _drive(self, steps):
        """Run a handshake generator to its end over this connection."""
        try:
            request, version = next(steps)
            while True:
                request, version = steps.send(self._exchange(request, version))
        except StopIteration as done:
            return done.value

    def close(self) -> None:
        sock, self._socket = self._socket, None
        if sock is not None:
            sock.close()

    def __enter__(self) -> KafkaProtocolClient:
        return self.connect()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    # -- requests ------------------------------------------------------------------------------

    def version_for(self, api_key: int) -> int:
        """The highest version of this API both pystreams and the server speak."""
        spec = api_spec(api_key)
        if spec is None:
            raise ValueError(f"API key {api_key} is not in pystreams' protocol registry")
        if self.server is None:
            return spec.max_version
        version = self.server.version_for(api_key)
        if version is None:
            raise ProtocolClientError(f"the server at {self.host}:{self.port} serves no {spec.name} version pystreams speaks")
        return version

    def send(self, request: ApiMessage, version: int | None = None) -> ApiMessage:
        """Send ``request`` and return its response (at ``version``, or the best common one)."""
        self.connect()
        spec = api_spec(request.API_KEY)
        if spec is None:
            raise ValueError(f"API key {request.API_KEY} is not in pystreams' protocol registry")
        if version is None:
            version = self.version_for(spec.api_key)
        elif not spec.supports(version):
            raise ValueError(f"{spec.name} v{version} is outside pystreams' range {spec.min_version}-{spec.max_version}")
        return self._exchange(request, version)

    def _exchange(self, request: ApiMessage, version: int) -> ApiMessage:
        assert self._socket is not None
        correlation_id, data = self._framing.request_bytes(request, version)
        try:
            self._socket.sendall(data)
            while True:
                chunk = self._socket.recv(1 << 20)
                if not chunk:
                    raise ProtocolClientError(f"{self.host}:{self.port} closed the connection")
                for answered, response in self._framing.receive(chunk):
                    if answered == correlation_id:
                        return response
        except OSError as error:  # includes socket.timeout and ssl.SSLError
            self.close()
            raise ProtocolClientError(f"talking to {self.host}:{self.port} failed: {error}") from error
        except FramingError as error:
            self.close()
            raise ProtocolClientError(f"{self.host}:{self.port}: {error}") from error
        except ProtocolClientError:
            self.close()
            raise
