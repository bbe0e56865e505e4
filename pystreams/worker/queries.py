"""Interactive queries: each worker serves its local key-value stores over HTTP on its user
endpoint (the ``UserEndPoint`` it advertises in its Streams metadata).

    GET /v1/metadata                  where every task's partitions are (from the assignment)
    GET /v1/stores/STORE/KEYHEX       the value bytes of one key (KEYHEX: the serialized key)
                                      ?stale=1 also reads standby replicas

Answers: 200 with the value's bytes as the store serializes them; 404 (JSON) when the task is
here and the key has no value; 503 (JSON, ``"retry": true``) when the task is restoring here
or not here (moving, or the asker's routing is stale); 400 for a bad request. Reads run on the
engine thread that owns the task, between two polls, so they see the store's cache too.
Clients route with ``pystreams.queries`` (``App.query``, ``pystreams query``).
"""
from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlsplit

from pystreams.topology.ir import StoreKind, TaskId
from pystreams.topology.resolve import ResolvedTopology

from .packing import partition_for_key

if TYPE_CHECKING:
    from .process import StreamThread

log = logging.getLogger(__name__)

_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 503: "Service Unavailable"}


def queryable_stores(resolved: ResolvedTopology) -> dict[str, dict[str, Any]]:
    """Key-value stores with the topic and partition count that place their keys: a key
    lives in the task whose partition its serialized bytes hash to (Kafka's partitioner)."""
    stores = {}
    for name, spec in sorted(resolved.topology.stores.items()):
        if spec.kind is not StoreKind.KEY_VALUE:
            continue
        task = TaskId(spec.subtopology, 0)
        inputs = resolved.input_partitions(task)
        if not inputs:
            continue
        stores[name] = {"topic": inputs[0][0], "partitions": resolved.task_counts[spec.subtopology]}
    return stores


class QueryServer:
    def __init__(self, resolved: ResolvedTopology, threads: Sequence[StreamThread], endpoint: str) -> None:
        host, _, port = endpoint.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"user endpoint {endpoint!r} is not HOST:PORT")
        self.endpoint = endpoint
        self._host, self._port = host, int(port)
        self._resolved = resolved
        self._threads = threads
        self._stores = queryable_stores(resolved)
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        # Listen on every interface: the endpoint is what others use to reach this host.
        bind = "127.0.0.1" if self._host in ("127.0.0.1", "localhost") else "0.0.0.0"
        self._server = await asyncio.start_server(self._handle, bind, self._port)
        log.info("serving interactive queries on %s", self.endpoint)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    # -- HTTP -----------------------------------------------------------------------------------

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request_line = await asyncio.wait_for(reader.readline(), 10)
            while (await asyncio.wait_for(reader.readline(), 10)) not in (b"\r\n", b"\n", b""):
                pass  # headers: nothing here needs them
            parts = request_line.decode("latin-1").split()
            if len(parts) != 3 or parts[0] != "GET":
                status, body, content_type = self._error(400, "only GET requests are served")
            else:
                status, body, content_type = await self._route(parts[1])
        except (asyncio.TimeoutError, ConnectionError, UnicodeDecodeError):
            writer.close()
            return
        except Exception as error:  # a query must never take the worker down
            log.exception("interactive query failed")
            status, body, content_type = self._error(500, f"internal error: {error!r}")
        head = (
            f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        writer.write(head.encode("latin-1") + body)
        try:
            await writer.drain()
        finally:
            writer.close()

    @staticmethod
    def _error(status: int, message: str, **extra: Any) -> tuple[int, bytes, str]:
        return status, json.dumps({"error": message, **extra}).encode(), "application/json"

    async def _route(self, target: str) -> tuple[int, bytes, str]:
        url = urlsplit(target)
        # Only the leading slash goes: an empty key (b"") is a trailing empty segment.
        path = [unquote(p) for p in url.path.removeprefix("/").split("/")]
        if path == ["v1", "metadata"]:
            return 200, json.dumps(self.metadata()).encode(), "application/json"
        if len(path) == 4 and path[:2] == ["v1", "stores"]:
            stale = parse_qs(url.query).get("stale", ["0"])[0] in ("1", "true")
            try:
                key = bytes.fromhex(path[3])
            except ValueError:
                return self._error(400, "the key must be the serialized key's bytes in hex")
            return await self._get(path[2], key, stale)
        return self._error(400, f"unknown path {url.path!r}; see /v1/metadata and /v1/stores/STORE/KEYHEX")

    # -- answers --------------------------------------------------------------------------------

    def metadata(self) -> dict[str, Any]:
        assignment = next((t.assignment for t in self._threads if t.assignment is not None), None)
        return {
            "endpoint": self.endpoint,
            "stores": self._stores,
            "active": assignment.partitions_by_host if assignment is not None else {},
            "standby": assignment.standby_partitions_by_host if assignment is not None else {},
        }

    async def _get(self, store: str, key: bytes, stale: bool) -> tuple[int, bytes, str]:
        if store not in self._resolved.topology.stores:
            return self._error(400, f"no store named {store!r}")
        if store not in self._stores:
            return self._error(400, f"store {store!r} is not a key-value store; only those are queryable")
        spec = self._resolved.topology.stores[store]
        task = TaskId(spec.subtopology, partition_for_key(key, self._stores[store]["partitions"]))
        for thread in self._threads:
            if task in thread.restoring:
                return self._error(503, f"task {task} of store {store!r} is restoring here; not available yet",
                                   retry=True)
        for thread in self._threads:
            found, value = await thread.read_store(task, store, key, include_standby=stale)
            if found:
                if value is None:
                    return self._error(404, f"no value for this key in store {store!r}")
                return 200, value, "application/octet-stream"
        return self._error(503, f"task {task} of store {store!r} is not hosted here (moving, or stale routing)",
                           retry=True)
