"""Typed views of a task's stores: what a Processor's ``context.store(name)`` returns and what
interactive queries read. Stores hold bytes behind one interface (pystreams.state.interface:
RocksDB on the worker, memory in the test driver, Spark state on Spark); these apply the
store's serdes, so processors see one store API on every runtime."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from pystreams.serdes import Serde

from .ir import Store, StoreKind, SuppressNode, Topology, stores_of
from .sliding import aggregate_bytes
from .windows import SlidingWindow


class _TypedStore:
    """Applies a store's serdes around the byte-level store it wraps (``raw``)."""

    def __init__(self, store: Any, key_serde: Serde, value_serde: Serde) -> None:
        self.raw = store
        self.name = store.name
        self._key = key_serde.serialize
        self._key_of = key_serde.deserialize
        self._value = value_serde.serialize
        self._value_of: Callable[[Any], Any] = value_serde.deserialize


class TypedKeyValueStore(_TypedStore):
    def get(self, key: Any) -> Any:
        return self._value_of(self.raw.get(self._key(key)))

    def put(self, key: Any, value: Any) -> None:
        self.raw.put(self._key(key), self._value(value))

    def put_if_absent(self, key: Any, value: Any) -> Any:
        return self._value_of(self.raw.put_if_absent(self._key(key), self._value(value)))

    def delete(self, key: Any) -> None:
        self.raw.delete(self._key(key))

    def items(self) -> Iterator[tuple[Any, Any]]:
        key_of, value_of = self._key_of, self._value_of
        return ((key_of(k), value_of(v)) for k, v in self.raw.all())

    all = items

    def range(self, key_from: Any, key_to: Any) -> Iterator[tuple[Any, Any]]:
        low = None if key_from is None else self._key(key_from)
        high = None if key_to is None else self._key(key_to)
        return ((self._key_of(k), self._value_of(v)) for k, v in self.raw.range(low, high))

    def approximate_count(self) -> int:
        return self.raw.approximate_count()


class TypedVersionedStore(TypedKeyValueStore):
    """A versioned table's store: ``get`` and the scans read the latest versions; ``get_as_of``
    the value a key had at a time. Written only by its table (``put`` raises)."""

    def get_as_of(self, key: Any, timestamp: int) -> Any:
        return self._value_of(self.raw.get_as_of(self._key(key), timestamp))


class TypedWindowStore(_TypedStore):
    def put(self, key: Any, window_start: int, value: Any) -> bool:
        return self.raw.put(self._key(key), window_start, self._value(value))

    def get(self, key: Any, window_start: int) -> Any:
        return self._value_of(self.raw.get(self._key(key), window_start))

    def fetch(self, key: Any, time_from: int, time_to: int) -> Iterator[tuple[int, Any]]:
        return ((start, self._value_of(v)) for start, v in self.raw.fetch(self._key(key), time_from, time_to))

    def items(self) -> Iterator[tuple[tuple[Any, int], Any]]:
        """((key, window start), value) of every live window."""
        return (((self._key_of(w.key), w.window_start), self._value_of(w.value)) for w in self.raw.all())

    all = items


class TypedSlidingWindowStore(TypedWindowStore):
    """A sliding aggregation's store: read-only, values are the aggregates (the store also
    keeps each window's newest record timestamp, which only the aggregation uses)."""

    def __init__(self, store: Any, key_serde: Serde, value_serde: Serde) -> None:
        super().__init__(store, key_serde, value_serde)
        self._aggregate_of = value_serde.deserialize
        self._value_of = self._stored_aggregate

    def _stored_aggregate(self, stored: Any) -> Any:
        return self._aggregate_of(aggregate_bytes(stored))

    def put(self, key: Any, window_start: int, value: Any) -> bool:
        raise TypeError(f"store {self.name!r} belongs to a sliding-window aggregation: it is read-only")


class TypedSessionStore(_TypedStore):
    def put(self, key: Any, start: int, end: int, value: Any) -> bool:
        return self.raw.put(self._key(key), start, end, self._value(value))

    def remove(self, key: Any, start: int, end: int) -> bool:
        return self.raw.remove(self._key(key), start, end)

    def fetch(self, key: Any) -> Iterator[tuple[int, int, Any]]:
        return ((s.start, s.end, self._value_of(s.value)) for s in self.raw.fetch(self._key(key)))

    def items(self) -> Iterator[tuple[tuple[Any, int, int], Any]]:
        """((key, session start, session end), value) of every live session."""
        return (((self._key_of(s.key), s.start, s.end), self._value_of(s.value)) for s in self.raw.all())

    all = items


TypedStore = TypedKeyValueStore | TypedVersionedStore | TypedWindowStore | TypedSlidingWindowStore | TypedSessionStore


def typed(store: Any, spec: Store) -> TypedStore:
    """The typed view of the byte store ``store`` described by ``spec``."""
    if spec.history_ms is not None:
        return TypedVersionedStore(store, spec.key_serde, spec.value_serde)
    view = TypedSlidingWindowStore if isinstance(spec.window, SlidingWindow) else _VIEWS[spec.kind]
    return view(store, spec.key_serde, spec.value_serde)


_VIEWS: dict[StoreKind, Callable[[Any, Serde, Serde], TypedStore]] = {
    StoreKind.KEY_VALUE: TypedKeyValueStore,
    StoreKind.WINDOW: TypedWindowStore,
    StoreKind.SESSION: TypedSessionStore,
}


def not_queryable_reason(topology: Topology, store: str) -> str | None:
    """Why interactive queries may not read ``store`` (None: they may), as in Kafka Streams:
    a stream-stream join's store keeps every record, not one value per window; a suppression
    buffer and an emit-final aggregation's stream time are the node's own bookkeeping."""
    spec = topology.stores[store]
    owner = topology.nodes[spec.owner]
    if spec.retain_duplicates:
        return "a stream-stream join's store"
    if isinstance(owner, SuppressNode):
        return f"the suppression buffer of {owner.name!r}; query the table it suppresses"
    owned = stores_of(owner)
    if owned and owned[0] != store:
        return f"bookkeeping of node {owner.name!r} (query its store {owned[0]!r})"
    return None
