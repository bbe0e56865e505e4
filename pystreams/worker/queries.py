"""Interactive queries: each worker serves its local state stores over HTTP on its user
endpoint (the ``UserEndPoint`` it advertises in its Streams metadata), with Kafka Streams'
read-only store operations.

    GET /v1/metadata                           where every task's partitions are (from the assignment)
    GET /v1/stores/STORE/KEYHEX                key-value store: the value bytes of one key
    GET /v1/stores/STORE/KEYHEX/windows?from=MS&to=MS
                                               window store: the key's windows whose start is in
                                               [from, to] (both optional), oldest first
    GET /v1/stores/STORE/KEYHEX/sessions       session store: every session of the key
    GET /v1/stores/STORE?partitions=P,...&from=HEX&to=HEX   (or &prefix=HEX)
                                               key-value store: a range (both ends inclusive,
                                               either optional) or prefix scan of the tasks of
                                               those partitions, by serialized key

KEYHEX/HEX: serialized keys in hex. ``?stale=1`` also reads standby replicas. Answers: 200 with
the value's bytes (one key) or JSON with hex bytes (``{"windows": [[START, VALUEHEX], ...]}``,
``{"sessions": [[START, END, VALUEHEX], ...]}``, ``{"entries": [[KEYHEX, VALUEHEX], ...]}``);
404 (JSON) when the task is here and the key has no value; 503 (JSON, ``"retry": true``) when
a task is restoring here or not here (moving, or the asker's routing is stale); 400 for a bad
request. Reads run on the engine thread that owns the task, between two polls, so they see the
store's cache too. Clients route with ``pystreams.queries`` (``App.query*``, ``pystreams query``).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from aiohttp import web

from pystreams.topology.ir import StoreKind, TaskId
from pystreams.topology.kernels import table_value_reader
from pystreams.topology.resolve import ResolvedTopology
from pystreams.topology.stores import not_queryable_reason

from .http import HttpSite
from .packing import partition_for_key

if TYPE_CHECKING:
    from .process import StreamThread

log = logging.getLogger(__name__)


def queryable_stores(resolved: ResolvedTopology) -> dict[str, dict[str, Any]]:
    """Stores with their kind and the topic and partition count that place their keys: a key
    (a window or session store's grouping key) lives in the task whose partition its
    serialized bytes hash to (Kafka's partitioner). A stream-stream join's window store (it
    keeps every record, not one value per window) is not queryable, as in Kafka Streams. A
    global table (``"global": true``) is whole on every worker: any of them answers."""
    stores: dict[str, dict[str, Any]] = {
        name: {"topic": table.topic, "partitions": resolved.partitions[table.topic], "kind": str(StoreKind.KEY_VALUE), "global": True}
        for name, table in resolved.topology.global_tables.items()
    }
    for name, spec in sorted(resolved.topology.stores.items()):
        if not_queryable_reason(resolved.topology, name) is not None:
            continue
        task = TaskId(spec.subtopology, 0)
        inputs = resolved.input_partitions(task)
        if not inputs:
            continue
        stores[name] = {"topic": inputs[0][0], "partitions": resolved.task_counts[spec.subtopology], "kind": str(spec.kind), "subtopology": spec.subtopology}
    return stores


class _BadQuery(ValueError):
    """A request that cannot be answered as asked (400, with the reason)."""


class QueryServer:
    """The interactive-query routes of one worker and, with ``start``, a site serving them on
    the user endpoint's port (``bind_host``: the address to listen on; by default loopback for
    a loopback endpoint and every interface otherwise)."""

    def __init__(
        self,
        resolved: ResolvedTopology,
        threads: Sequence[StreamThread],
        endpoint: str,
        *,
        bind_host: str | None = None,
        global_stores: Mapping[str, Any] | None = None,
    ) -> None:
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
        #: The process's global tables, restored before this server started: read here directly.
        self._global_stores = global_stores or {}
        self.site: HttpSite | None = None

    def routes(self) -> list[web.RouteDef]:
        """The query API, ending with a catch-all that answers 400 with the reason."""
        return [
            web.get("/v1/metadata", self._metadata),
            # An empty key (b"") is an empty last segment.
            web.get("/v1/stores/{store}/{key:[^/]*}", self._store_get),
            web.get("/v1/stores/{store}/{key:[^/]*}/windows", self._windows_get),
            web.get("/v1/stores/{store}/{key:[^/]*}/sessions", self._sessions_get),
            web.get("/v1/stores/{store}", self._scan_get),
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

    async def _windows_get(self, request: web.Request) -> web.Response:
        spec = self._resolved.topology.stores.get(request.match_info["store"])
        # A sliding aggregation's store values carry a timestamp first; queries see aggregates.
        table_value = table_value_reader(spec.window if spec is not None else None) or _same_bytes

        def value_hex(value: bytes) -> str:
            return (table_value(value) or b"").hex()

        def fetch(key: bytes) -> Callable[[Any], list[list[Any]]]:
            time_from, time_to = _time(request, "from", MIN_TIME), _time(request, "to", MAX_TIME)
            return lambda store: [[start, value_hex(value)] for start, value in store.fetch(key, time_from, time_to)]

        return await self._answer_for_key(request, StoreKind.WINDOW, "windows", fetch)

    async def _sessions_get(self, request: web.Request) -> web.Response:
        def fetch(key: bytes) -> Callable[[Any], list[list[Any]]]:
            return lambda store: [[session.start, session.end, session.value.hex()] for session in store.fetch(key)]

        return await self._answer_for_key(request, StoreKind.SESSION, "sessions", fetch)

    async def _answer_for_key(self, request: web.Request, kind: StoreKind, field: str, reader_for: Callable[[bytes], Callable[[Any], Any]]) -> web.Response:
        """One key's answer from a window or session store; ``reader_for(key)`` checks the
        request's parameters and gives what runs on the store."""
        store = request.match_info["store"]
        try:
            key = _hex(request.match_info["key"], "the key")
            read = reader_for(key)
            self._check_kind(store, kind)
            placement = self._stores[store]
            task = TaskId(placement["subtopology"], partition_for_key(key, placement["partitions"]))
            status, found, message = await self._read(task, store, read, _stale(request))
        except _BadQuery as error:
            return self._error(400, str(error))
        except Exception as error:  # a query must never take the worker down
            log.exception("interactive query failed")
            return self._error(500, f"internal error: {error!r}")
        if status != 200:
            return self._error(status, message, retry=True)
        return self._json({field: found})

    async def _scan_get(self, request: web.Request) -> web.Response:
        store = request.match_info["store"]
        try:
            self._check_kind(store, StoreKind.KEY_VALUE)
            placement = self._stores[store]
            if "prefix" in request.query:
                prefix = _hex(request.query["prefix"], "prefix")

                def scan(kv: Any) -> list[list[str]]:
                    return [[k.hex(), v.hex()] for k, v in kv.prefix_scan(prefix)]
            else:
                key_from = _hex(request.query["from"], "from") if "from" in request.query else None
                key_to = _hex(request.query["to"], "to") if "to" in request.query else None

                def scan(kv: Any) -> list[list[str]]:
                    return [[k.hex(), v.hex()] for k, v in kv.range(key_from, key_to)]

            partitions = _partitions(request, placement["partitions"])
            entries: list[list[str]] = []
            if placement.get("global"):
                # Whole here (partitions do not split it); read off the event loop, which drives
                # the group membership.
                global_store = self._global_store(store)
                entries = await asyncio.get_running_loop().run_in_executor(None, scan, global_store)
                partitions = []
            for partition in partitions:
                task = TaskId(placement["subtopology"], partition)
                status, found, message = await self._read(task, store, scan, _stale(request))
                if status != 200:
                    return self._error(status, message, retry=True)
                entries.extend(found)
        except _BadQuery as error:
            return self._error(400, str(error))
        except Exception as error:  # a query must never take the worker down
            log.exception("interactive query failed")
            return self._error(500, f"internal error: {error!r}")
        entries.sort()  # hex of bytes sorts as the bytes do
        return self._json({"entries": entries})

    def _global_store(self, name: str) -> Any:
        store = self._global_stores.get(name)
        if store is None:
            raise _BadQuery(f"global table {name!r} is not held by this server")
        return store

    def _check_kind(self, store: str, kind: StoreKind) -> None:
        spec = self._resolved.topology.store_spec(store)
        if spec is None:
            raise _BadQuery(f"no store named {store!r}")
        if store not in self._stores:
            raise _BadQuery(f"store {store!r} is not queryable ({not_queryable_reason(self._resolved.topology, store) or 'no task reads a topic'})")
        if spec.kind is not kind:
            raise _BadQuery(f"store {store!r} is a {spec.kind} store; {_OPERATIONS[spec.kind]}")

    async def _read(self, task: TaskId, store: str, read: Callable[[Any], Any], stale: bool) -> tuple[int, Any, str]:
        """(200, what ``read`` returned on the task's store, "") or (503, None, why)."""
        for thread in self._threads:
            if task in thread.restoring:
                return 503, None, f"task {task} of store {store!r} is restoring here; not available yet"
        for thread in self._threads:
            hosted, found = await thread.read_store_with(task, store, read, include_standby=stale)
            if hosted:
                return 200, found, ""
        return 503, None, f"task {task} of store {store!r} is not hosted here (moving, or stale routing)"

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
        try:
            self._check_kind(store, StoreKind.KEY_VALUE)
            if self._stores[store].get("global"):
                value = self._global_store(store).get(key)
                return (200, value, "", False) if value is not None else (404, None, f"no value for this key in global table {store!r}", False)
        except _BadQuery as error:
            return 400, None, str(error), False
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


#: What each kind of store answers, for a request that asked it the wrong thing.
_OPERATIONS = {
    StoreKind.KEY_VALUE: "ask it for one key (/v1/stores/STORE/KEYHEX) or a range or prefix scan (/v1/stores/STORE?from=&to=)",
    StoreKind.WINDOW: "ask it for a key's windows (/v1/stores/STORE/KEYHEX/windows?from=MS&to=MS)",
    StoreKind.SESSION: "ask it for a key's sessions (/v1/stores/STORE/KEYHEX/sessions)",
}
MIN_TIME, MAX_TIME = -(2**63), 2**63 - 1


def _hex(text: str, what: str) -> bytes:
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise _BadQuery(f"{what} must be the serialized key's bytes in hex") from None


def _time(request: web.Request, name: str, default: int) -> int:
    text = request.query.get(name)
    if text is None:
        return default
    try:
        return int(text)
    except ValueError:
        raise _BadQuery(f"{name} must be a timestamp in epoch milliseconds, got {text!r}") from None


def _stale(request: web.Request) -> bool:
    return request.query.get("stale", "0") in ("1", "true")


def _partitions(request: web.Request, count: int) -> list[int]:
    text = request.query.get("partitions")
    if text is None:
        return list(range(count))
    try:
        partitions = sorted({int(p) for p in text.split(",") if p.strip()})
    except ValueError:
        raise _BadQuery(f"partitions must be comma-separated partition numbers, got {text!r}") from None
    if any(not 0 <= p < count for p in partitions):
        raise _BadQuery(f"partitions must lie in 0..{count - 1}, got {text!r}")
    return partitions


def _same_bytes(value: bytes | None) -> bytes | None:
    return value
