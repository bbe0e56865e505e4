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

import json
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from aiohttp import web

from pystreams.topology.ir import StoreKind, TaskId
from pystreams.topology.resolve import ResolvedTopology

from .http import HttpSite
from .packing import partition_for_key

if TYPE_CHECKING:
    from .process import StreamThread

log = logging.getLogger(__name__)

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
    """The interactive-query routes of one worker and, with ``start``, a site serving them on
    the user endpoint's port (``bind_host``: the address to listen on; by default loopback for
    a loopback endpoint and every interface otherwise)."""

    def __init__(self, resolved: ResolvedTopology, threads: Sequence[StreamThread], endpoint: str,
                 *, bind_host: str | None = None) -> None:
        host, _, port = endpoint.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"user endpoint {endpoint!r} is not HOST:PORT")
        self.endpoint = endpoint
        self.port = int(port)
        # Listen on every interface by default: the endpoint is what others use to reach us.
        self.bind_host = bind_host or ("127.0.0.1" if host in ("127.0.0.1", "localhost") else "0.0.0.0")
        self._resolved = resolved
        self._threads = threads
        self._stores = queryable_stores(resolved)
        self.site: HttpSite | None = None

    def routes(self) -> list[web.RouteDef]:
        """The query API, ending with a catch-all that answers 400 with the reason."""
        return [
            web.get("/v1/metadata", self._metadata),
            # An empty key (b"") is an empty last segment.
            web.get("/v1/stores/{store}/{key:[^/]*}", self._store_get),
            web.route("*", "/{path:.*}", self._unknown),
        ]

    async def start(self) -> None:
        site = HttpSite(self.bind_host, self.port, self.routes())
        await site.start()
        self.site = site
        log.info("serving interactive queries on %s", self.endpoint)

    async def stop(self) -> None:
        site, self.site = self.site, None
        if site is not None:
            await site.stop()

    # -- HTTP -----------------------------------------------------------------------------------

    @staticmethod
    def _json(document: Any, status: int = 200) -> web.Response:
        # JSON is UTF-8 by definition (RFC 8259): no charset parameter.
        return web.Response(body=json.dumps(document).encode(), status=status, content_type="application/json")

    @classmethod
    def _error(cls, status: int, message: str, **extra: Any) -> web.Response:
        return cls._json({"error": message, **extra}, status=status)

    async def _metadata(self, request: web.Request) -> web.Response:
        return self._json(self.metadata())

    async def _store_get(self, request: web.Request) -> web.Response:
        try:
            key = bytes.fromhex(request.match_info["key"])
        except ValueError:
            return self._error(400, "the key must be the serialized key's bytes in hex")
        stale = request.query.get("stale", "0") in ("1", "true")
        try:
            status, value, message, retry = await self._get(request.match_info["store"], key, stale)
        except Exception as error:  # a query must never take the worker down
            log.exception("interactive query failed")
            return self._error(500, f"internal error: {error!r}")
        if status == 200:
            return web.Response(body=value, content_type="application/octet-stream")
        return self._error(status, message, **({"retry": True} if retry else {}))

    async def _unknown(self, request: web.Request) -> web.Response:
        if request.method != "GET":
            return self._error(400, "only GET requests are served")
        return self._error(400, f"unknown path {request.path!r}; see /v1/metadata and /v1/stores/STORE/KEYHEX")

    # -- answers --------------------------------------------------------------------------------

    def metadata(self) -> dict[str, Any]:
        assignment = next((t.assignment for t in self._threads if t.assignment is not None), None)
        return {
            "endpoint": self.endpoint,
            "stores": self._stores,
            "active": assignment.partitions_by_host if assignment is not None else {},
            "standby": assignment.standby_partitions_by_host if assignment is not None else {},
        }

    async def _get(self, store: str, key: bytes, stale: bool) -> tuple[int, bytes | None, str, bool]:
        """(status, value, error message, retry) for one key."""
        if store not in self._resolved.topology.stores:
            return 400, None, f"no store named {store!r}", False
        if store not in self._stores:
            return 400, None, f"store {store!r} is not a key-value store; only those are queryable", False
        spec = self._resolved.topology.stores[store]
        task = TaskId(spec.subtopology, partition_for_key(key, self._stores[store]["partitions"]))
        for thread in self._threads:
            if task in thread.restoring:
                return 503, None, f"task {task} of store {store!r} is restoring here; not available yet", True
        for thread in self._threads:
            found, value = await thread.read_store(task, store, key, include_standby=stale)
            if found:
                if value is None:
                    return 404, None, f"no value for this key in store {store!r}", False
                return 200, value, "", False
        return 503, None, f"task {task} of store {store!r} is not hosted here (moving, or stale routing)", True
