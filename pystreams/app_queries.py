"""Interactive queries from the app's side: ``app.query(store, key)`` and its window, session
and range forms.

``App`` inherits these methods. Each reads the store's spec (key and value serdes, and whether
it may be queried at all) from the app's topology and asks the workers through the HTTP client
in ``pystreams.queries``, which is imported on the first query so that declaring an app does not
load it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from pystreams.topology.windows import Windowed

if TYPE_CHECKING:
    from pystreams.queries import QueryClient
    from pystreams.topology.ir import Store, Topology


class AppQueries:
    """The query methods of ``App`` (Kafka Streams' read-only store views, client side)."""

    app_id: str

    if TYPE_CHECKING:

        def topology(self) -> Topology: ...

    def query(
        self,
        store: str,
        key: Any,
        *,
        endpoints: str | Sequence[str] | None = None,
        timeout_s: float = 10.0,
        stale: bool = False,
    ) -> Any:
        """Interactive query: the value of ``key`` in key-value store ``store``, read from the
        worker hosting it (routed by the assignment's PartitionsByHost); ``None`` when the key
        has no value. ``endpoints``: any worker's user endpoint(s), HOST:PORT (default: env
        PYSTREAMS_QUERY_ENDPOINTS, comma-separated). ``stale=True`` also reads standby
        replicas. Raises ``pystreams.queries.NotAvailableYet`` while the key's task restores or
        moves for longer than ``timeout_s``.

        Keys are given as the app uses them — the store's key serde serializes them: for a
        key-value store the table's key; for window and session stores the grouping key
        (``query_windows``, ``query_sessions``), never a ``Windowed``."""
        from pystreams.queries import KeyNotFound

        spec, client = self._query_client(store, endpoints)
        try:
            return client.get(store, key, spec.key_serde, spec.value_serde, timeout_s=timeout_s, stale=stale)
        except KeyNotFound:
            return None

    def query_windows(
        self,
        store: str,
        key: Any,
        time_from: int | None = None,
        time_to: int | None = None,
        *,
        endpoints: str | Sequence[str] | None = None,
        timeout_s: float = 10.0,
        stale: bool = False,
    ) -> list[tuple[int, Any]]:
        """Window store: ``(window start ms, value)`` of the windows of ``key`` (the grouping
        key) whose start lies in ``[time_from, time_to]`` (None: unbounded), oldest first —
        Kafka Streams' ``ReadOnlyWindowStore.fetch(key, timeFrom, timeTo)``."""
        from pystreams.queries import serialized_key

        spec, client = self._query_client(store, endpoints)
        windows = client.fetch_windows_bytes(store, serialized_key(store, key, spec.key_serde), time_from, time_to, timeout_s=timeout_s, stale=stale)
        return [(start, spec.value_serde.deserialize(value)) for start, value in windows]

    def query_sessions(
        self, store: str, key: Any, *, endpoints: str | Sequence[str] | None = None, timeout_s: float = 10.0, stale: bool = False
    ) -> list[tuple[Windowed, Any]]:
        """Session store: ``(Windowed(key, start, end), value)`` of every session of ``key``
        (the grouping key) — Kafka Streams' ``ReadOnlySessionStore.fetch(key)``."""
        from pystreams.queries import serialized_key

        spec, client = self._query_client(store, endpoints)
        sessions = client.fetch_sessions_bytes(store, serialized_key(store, key, spec.key_serde), timeout_s=timeout_s, stale=stale)
        return [(Windowed(key, start, end), spec.value_serde.deserialize(value)) for start, end, value in sessions]

    def query_range(
        self,
        store: str,
        key_from: Any = None,
        key_to: Any = None,
        *,
        endpoints: str | Sequence[str] | None = None,
        timeout_s: float = 10.0,
        stale: bool = False,
    ) -> list[tuple[Any, Any]]:
        """Key-value store: ``(key, value)`` of the keys in ``[key_from, key_to]`` (both
        inclusive; None: unbounded) from every task — Kafka Streams' ``range``/``all``.
        Keys compare as their serialized bytes (text: by code point; ``Int``: negatives after
        positives), and come back in that order."""
        spec, client = self._query_client(store, endpoints)
        serialize = spec.key_serde.serialize
        entries = client.scan_bytes(
            store,
            key_from=None if key_from is None else serialize(key_from),
            key_to=None if key_to is None else serialize(key_to),
            timeout_s=timeout_s,
            stale=stale,
        )
        return [(spec.key_serde.deserialize(k), spec.value_serde.deserialize(v)) for k, v in entries]

    def query_prefix(
        self, store: str, prefix: Any, *, endpoints: str | Sequence[str] | None = None, timeout_s: float = 10.0, stale: bool = False
    ) -> list[tuple[Any, Any]]:
        """Key-value store: ``(key, value)`` of the keys whose serialized bytes start with
        ``prefix`` serialized by the store's key serde (for text keys: a text prefix) — Kafka
        Streams' ``prefixScan``; ordered by serialized key."""
        spec, client = self._query_client(store, endpoints)
        entries = client.scan_bytes(store, prefix=spec.key_serde.serialize(prefix), timeout_s=timeout_s, stale=stale)
        return [(spec.key_serde.deserialize(k), spec.value_serde.deserialize(v)) for k, v in entries]

    def _query_client(self, store: str, endpoints: str | Sequence[str] | None) -> tuple[Store, QueryClient]:
        from pystreams.queries import QueryClient, QueryError, endpoints_from
        from pystreams.topology.stores import not_queryable_reason

        topology = self.topology()
        spec = topology.store_spec(store)
        if spec is None:
            raise QueryError(f"app {self.app_id!r} has no store named {store!r}")
        if store in topology.global_tables:
            return spec, QueryClient(endpoints_from(endpoints))
        reason = not_queryable_reason(topology, store)
        if reason is not None:
            raise QueryError(f"store {store!r} of app {self.app_id!r} is not queryable: {reason}")
        return spec, QueryClient(endpoints_from(endpoints))
