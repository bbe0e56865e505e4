"""One Kafka-protocol connection over asyncio, with several requests in flight.

The member driver talks to the group coordinator over it, and the coordinator's log writer to
Kafka brokers (``pystreams.coordinator.log_writer``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable

from kafka.protocol.api_message import ApiMessage

from pystreams.protocol.framing import ClientFraming
from pystreams.protocol.handshake import ServerInfo, client_handshake
from pystreams.protocol.security import ClientSecurity

Address = tuple[str, int]


def parse_bootstrap(bootstrap: str | Iterable[str | Address]) -> list[Address]:
    """``"h1:9092,h2:9092"``, or a list of ``"host:port"`` strings or (host, port) pairs."""
    items: Iterable[str | Address] = bootstrap.split(",") if isinstance(bootstrap, str) else bootstrap
    addresses: list[Address] = []
    for item in items:
        if isinstance(item, str):
            host, _, port = item.strip().rpartition(":")
            if not host or not port:
                raise ValueError(f"bootstrap address {item!r} is not host:port")
            addresses.append((host, int(port)))
        else:
            addresses.append((item[0], int(item[1])))
    if not addresses:
        raise ValueError("at least one bootstrap address is needed")
    return addresses


class ConnectionLost(ConnectionError):
    """The connection closed (or was closed) before the response arrived."""


class KafkaConnection:
    """One Kafka-protocol connection with several requests in flight, matched by correlation id.

    ``open`` connects (TLS when the security settings say so) and runs the client handshake
    (ApiVersions, then SASL when configured); ``server`` is what ApiVersions said.
    """

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, address: Address, client_id: str) -> None:
        self.address = address
        self._reader = reader
        self._writer = writer
        self._framing = ClientFraming(client_id)
        #: correlation id -> the waiting future
        self._pending: dict[int, asyncio.Future[ApiMessage]] = {}
        self._closed = False
        self._close_reason: BaseException | None = None
        self.server: ServerInfo | None = None
        self._reader_task = asyncio.create_task(self._read_responses(), name=f"kafka-connection-{address}")

    @classmethod
    async def open(
        cls,
        address: Address,
        client_id: str,
        timeout_s: float,
        security: ClientSecurity | None = None,
    ) -> KafkaConnection:
        security = security or ClientSecurity()
        context = security.ssl_context()
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection(*address, ssl=context, server_hostname=address[0] if context else None)
        connection = cls(reader, writer, address, client_id)
        try:
            connection.server = await connection._drive(client_handshake(security, address[0]), timeout_s)
        except BaseException:
            connection.close()
            raise
        return connection

    async def _drive(self, steps, timeout_s: float) -> ServerInfo:
        try:
            request, version = next(steps)
            while True:
                request, version = steps.send(await self.send(request, version, timeout_s))
        except StopIteration as done:
            return done.value

    @property
    def closed(self) -> bool:
        return self._closed

    async def send(self, request: ApiMessage, version: int, timeout_s: float) -> ApiMessage:
        """Send and wait for the answer. Raises ConnectionLost, or TimeoutError (which closes
        the connection)."""
        if self._closed:
            raise ConnectionLost(f"connection to {self.address} is closed")
        correlation_id, data = self._framing.request_bytes(request, version)
        future: asyncio.Future[ApiMessage] = asyncio.get_running_loop().create_future()
        self._pending[correlation_id] = future
        try:
            self._writer.write(data)
            async with asyncio.timeout(timeout_s):
                await self._writer.drain()
                return await future
        except TimeoutError:
            self.close(TimeoutError(f"{type(request).__name__} timed out after {timeout_s} s"))
            raise
        except (ConnectionError, OSError) as exc:
            self.close(exc)
            raise ConnectionLost(str(exc)) from exc
        finally:
            self._pending.pop(correlation_id, None)
            self._framing.forget(correlation_id)

    def close(self, reason: BaseException | None = None) -> None:
        if self._closed:
            return
        self._closed = True
        self._close_reason = reason
        self._writer.close()
        if asyncio.current_task() is not self._reader_task:
            self._reader_task.cancel()
        for future in self._pending.values():
            if not future.done():
                future.set_exception(ConnectionLost(f"connection to {self.address} closed: {reason!r}"))
        self._pending.clear()

    async def wait_closed(self) -> None:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._reader_task
        with contextlib.suppress(Exception):
            await self._writer.wait_closed()

    async def _read_responses(self) -> None:
        try:
            while True:
                chunk = await self._reader.read(1 << 20)
                if not chunk:
                    raise ConnectionLost(f"{self.address} closed the connection")
                for correlation_id, response in self._framing.receive(chunk):
                    future = self._pending.get(correlation_id)
                    if future is not None and not future.done():
                        future.set_result(response)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # EOF, reset, or a response we cannot parse: all fatal here
            self.close(exc)
