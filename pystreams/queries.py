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
import urllib.parse
import urllib.request
from collections.abc import Sequence
from typing import Any

from pystreams.serdes import Serde
from pystreams.topology.kernels import partition_for_key


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
        """The value bytes of ``key`` (serialized) in key-value store ``store``."""
        return self._ask_owner(store, key, "", {}, timeout_s=timeout_s, stale=stale)

    def fetch_windows_bytes(
        self, store: str, key: bytes, time_from: int | None = None, time_to: int | None = None, *, timeout_s: float = 10.0, stale: bool = False
    ) -> list[tuple[int, bytes]]:
        """Window store: (window start, value bytes) of ``key``'s windows whose start lies in
        ``[time_from, time_to]`` (None: unbounded), oldest first (Kafka Streams' ``fetch``)."""
        query = {name: str(t) for name, t in (("from", time_from), ("to", time_to)) if t is not None}
        body = self._ask_owner(store, key, "/windows", query, timeout_s=timeout_s, stale=stale)
        return [(start, bytes.fromhex(value)) for start, value in json.loads(body)["windows"]]

    def fetch_sessions_bytes(self, store: str, key: bytes, *, timeout_s: float = 10.0, stale: bool = False) -> list[tuple[int, int, bytes]]:
        """Session store: (start, end, value bytes) of every session of ``key``."""
        body = self._ask_owner(store, key, "/sessions", {}, timeout_s=timeout_s, stale=stale)
        return [(start, end, bytes.fromhex(value)) for start, end, value in json.loads(body)["sessions"]]

    def scan_bytes(
        self,
        store: str,
        *,
        key_from: bytes | None = None,
        key_to: bytes | None = None,
        prefix: bytes | None = None,
        timeout_s: float = 10.0,
        stale: bool = False,
    ) -> list[tuple[bytes, bytes]]:
        """Key-value store: the entries with ``key_from <= key <= key_to`` (None: unbounded),
        or with keys starting with ``prefix``, from every task, ordered by serialized key."""
        if prefix is not None:
            query = {"prefix": prefix.hex()}
        else:
            query = {name: key.hex() for name, key in (("from", key_from), ("to", key_to)) if key is not None}
        deadline = time.monotonic() + timeout_s
        while True:
            metadata = self.metadata()
            placement = self._placement(metadata, store)
            if placement.get("global"):
                answer = self._request(self._any_host(metadata), f"/v1/stores/{store}", query)
                if isinstance(answer, bytes):
                    return sorted((bytes.fromhex(k), bytes.fromhex(v)) for k, v in json.loads(answer)["entries"])
                if time.monotonic() >= deadline:
                    raise NotAvailableYet(f"store {store!r}: not available yet ({answer})")
                time.sleep(0.2)
                continue
            by_host: dict[str, list[int]] = {}
            unhosted = []
            for partition in range(placement["partitions"]):
                hosts = self._hosts(metadata, placement, partition, stale)
                if hosts:
                    by_host.setdefault(hosts[0], []).append(partition)
                else:
                    unhosted.append(partition)
            reason = f"no worker hosts partitions {unhosted} of {placement['topic']} yet" if unhosted else ""
            entries: list[tuple[bytes, bytes]] = []
            for host, partitions in sorted(by_host.items()):
                if reason:
                    break
                answer = self._request(host, f"/v1/stores/{store}", {**query, "partitions": ",".join(map(str, partitions)), **_stale(stale)})
                if isinstance(answer, str):
                    reason = answer
                    break
                entries.extend((bytes.fromhex(k), bytes.fromhex(v)) for k, v in json.loads(answer)["entries"])
            if not reason:
                return sorted(entries)
            if time.monotonic() >= deadline:
                raise NotAvailableYet(f"store {store!r}: not available yet ({reason})")
            time.sleep(0.2)

    # -- routing --------------------------------------------------------------------------------

    @staticmethod
    def _placement(metadata: dict[str, Any], store: str) -> dict[str, Any]:
        if store not in metadata["stores"]:
            raise QueryError(f"store {store!r} is not queryable (queryable: {sorted(metadata['stores'])})")
        return metadata["stores"][store]

    def _any_host(self, metadata: dict[str, Any]) -> str:
        """Who answers for a global table: the worker whose metadata this is (every worker
        holds all of it)."""
        return str(metadata.get("endpoint") or self.endpoints[0])

    @staticmethod
    def _hosts(metadata: dict[str, Any], placement: dict[str, Any], partition: int, stale: bool) -> list[str]:
        """The workers hosting ``partition``'s task: the active first, then (stale) standbys."""
        wanted = [placement["topic"], partition]
        hosts = [host for host, pairs in sorted(metadata["active"].items()) if wanted in pairs]
        if stale:
            hosts += [host for host, pairs in sorted(metadata["standby"].items()) if wanted in pairs]
        return hosts

    def _request(self, host: str, path: str, query: dict[str, str]) -> bytes | str:
        """The body of a 200; a reason (str) to retry on; raises for what retrying cannot fix."""
        try:
            status, body = _http_get(f"http://{host}{path}" + (f"?{urllib.parse.urlencode(query)}" if query else ""), self.request_timeout_s)
        except OSError as error:
            return f"{host}: {error}"
        if status == 200:
            return body
        if status == 404:
            raise KeyNotFound(_message(body))
        if status != 503:
            raise QueryError(f"{host}: {_message(body)}")
        return f"{host}: {_message(body)}"

    def _ask_owner(self, store: str, key: bytes, suffix: str, query: dict[str, str], *, timeout_s: float, stale: bool) -> bytes:
        """Ask the worker hosting ``key``'s task (then, ``stale``, its standbys) until one
        answers or the deadline passes (NotAvailableYet)."""
        deadline = time.monotonic() + timeout_s
        while True:
            metadata = self.metadata()
            placement = self._placement(metadata, store)
            if placement.get("global"):
                hosts = [self._any_host(metadata)]
                reason = ""
            else:
                partition = partition_for_key(key, placement["partitions"])
                hosts = self._hosts(metadata, placement, partition, stale)
                reason = "" if hosts else f"no worker hosts partition {partition} of {placement['topic']} yet"
            for host in hosts:
                answer = self._request(host, f"/v1/stores/{store}/{key.hex()}{suffix}", {**query, **_stale(stale)})
                if isinstance(answer, bytes):
                    return answer
                reason = answer
            if time.monotonic() >= deadline:
                raise NotAvailableYet(f"store {store!r}: not available yet ({reason})")
            time.sleep(0.2)

    def get(self, store: str, key: Any, key_serde: Serde, value_serde: Serde, **options: Any) -> Any:
        return value_serde.deserialize(self.get_bytes(store, serialized_key(store, key, key_serde), **options))


def serialized_key(store: str, key: Any, key_serde: Serde) -> bytes:
    """The bytes a key routes by; a key that serializes to None (a None key) is refused before
    any worker is asked, as Kafka Streams refuses a null key."""
    key_bytes = key_serde.serialize(key)
    if key_bytes is None:
        raise ValueError(f"store {store!r}: an interactive query needs a key, not None")
    return key_bytes


def _stale(stale: bool) -> dict[str, str]:
    return {"stale": "1"} if stale else {}
