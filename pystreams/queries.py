"""Interactive-query client: find the worker that hosts a key and ask it.

Routing uses the assignment's PartitionsByHost, which every worker serves at ``/v1/metadata``:
the key is serialized with the store's key serde, hashed to its partition as Kafka's default
partitioner does, and the host listing that partition is asked. While a task restores or moves,
workers answer "not available yet"; the client refreshes its routing and retries until its
deadline, then raises :class:`NotAvailableYet` with the last reason.
"""
from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

from pystreams.serdes import Serde
from pystreams.worker.packing import partition_for_key


class QueryError(RuntimeError):
    """The query cannot be answered (bad store, unreachable workers, ...)."""


class NotAvailableYet(QueryError):
    """The key's task is restoring or moving; asking again later will work."""


class KeyNotFound(KeyError):
    """The owner of the key's task has no value for it."""


def endpoints_from(endpoints: str | Sequence[str] | None) -> list[str]:
    """Worker endpoints (HOST:PORT) from a list, a comma-separated string, or, for None, the
    PYSTREAMS_QUERY_ENDPOINTS environment variable."""
    if endpoints is None:
        endpoints = os.environ.get("PYSTREAMS_QUERY_ENDPOINTS", "")
    if isinstance(endpoints, str):
        endpoints = endpoints.split(",")
    return [endpoint.strip() for endpoint in endpoints if endpoint.strip()]


def _http_get(url: str, timeout_s: float) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def _message(body: bytes) -> str:
    try:
        return str(json.loads(body).get("error", body[:200]))
    except (ValueError, AttributeError):
        return body[:200].decode(errors="replace")


class QueryClient:
    def __init__(self, endpoints: Sequence[str], *, request_timeout_s: float = 5.0) -> None:
        if not endpoints:
            raise ValueError("interactive queries need at least one worker endpoint (HOST:PORT)")
        self.endpoints = list(endpoints)
        self.request_timeout_s = request_timeout_s

    def metadata(self) -> dict[str, Any]:
        """The routing table from the first worker that answers with one; a worker that has
        no assignment yet (empty routing) is used only when no other answers."""
        failures = []
        unassigned: dict[str, Any] | None = None
        for endpoint in self.endpoints:
            try:
                status, body = _http_get(f"http://{endpoint}/v1/metadata", self.request_timeout_s)
            except OSError as error:
                failures.append(f"{endpoint}: {error}")
                continue
            if status != 200:
                failures.append(f"{endpoint}: HTTP {status} {_message(body)}")
                continue
            metadata = json.loads(body)
            if metadata.get("active"):
                return metadata
            unassigned = unassigned or metadata
        if unassigned is not None:
            return unassigned
        raise QueryError("no worker answered for the routing metadata: " + "; ".join(failures))

    def get_bytes(self, store: str, key: bytes, *, timeout_s: float = 10.0, stale: bool = False) -> bytes:
        """The value bytes of ``key`` (serialized) in ``store``."""
        deadline = time.monotonic() + timeout_s
        reason = "no routing metadata yet"
        while True:
            metadata = self.metadata()
            if store not in metadata["stores"]:
                raise QueryError(f"store {store!r} is not queryable (queryable: {sorted(metadata['stores'])})")
            placement = metadata["stores"][store]
            partition = partition_for_key(key, placement["partitions"])
            wanted = [placement["topic"], partition]
            hosts = [host for host, pairs in sorted(metadata["active"].items()) if wanted in pairs]
            if stale:
                hosts += [host for host, pairs in sorted(metadata["standby"].items()) if wanted in pairs]
            if not hosts:
                reason = f"no worker hosts partition {partition} of {placement['topic']} yet"
            for host in hosts:
                try:
                    status, body = _http_get(
                        f"http://{host}/v1/stores/{store}/{key.hex()}" + ("?stale=1" if stale else ""),
                        self.request_timeout_s,
                    )
                except OSError as error:
                    reason = f"{host}: {error}"
                    continue
                if status == 200:
                    return body
                if status == 404:
                    raise KeyNotFound(_message(body))
                reason = f"{host}: {_message(body)}"
                if status != 503:
                    raise QueryError(reason)
            if time.monotonic() >= deadline:
                raise NotAvailableYet(f"store {store!r}: not available yet ({reason})")
            time.sleep(0.2)

    def get(self, store: str, key: Any, key_serde: Serde, value_serde: Serde, **options: Any) -> Any:
        key_bytes = key_serde.serialize(key)
        if key_bytes is None:  # Kafka Streams refuses a null key the same way, before routing
            raise ValueError(f"store {store!r}: an interactive query needs a key, not None")
        return value_serde.deserialize(self.get_bytes(store, key_bytes, **options))
