"""The app API: decorators that *declare* a stream-processing topology.

    app = App("wordcount")
    lines = app.topic("text-lines", value=serdes.Text())

    @app.flat_map(lines)
    def words(key, line):
        for word in line.lower().split():
            yield word, 1                 # a new key: a repartition topic goes in front of counts

    @app.aggregate(words, store="counts", initial=0)
    def counts(total, key, value):
        return total + value

    counts.to("word-counts")

Nothing runs at import except building the graph. Each decorated function becomes a node
named after the function (``name=`` overrides it) and the decorator returns a handle — a
``Stream``, a ``Table`` or ``Branches`` — to build on, with decorators or with the handle's
fluent methods (``words.filter(fn)``, ``counts.to(topic)``). Every function is a plain
synchronous callable and receives the record key first: ``fn(key, value)``; aggregators get
the accumulator before it, ``fn(acc, key, value)``; joiners ``fn(key, left, right)``.

Serdes: a source declares its own (``key=``, ``value=``); an operation that produces new keys or
values takes ``key=``/``value=`` for them; anything undeclared uses the app defaults
(``Text()`` keys, ``Json()`` values). ``count`` yields ``Int()`` (8-byte big-endian) values, and
``aggregate`` picks its value serde from ``initial`` (int → ``Int``, str → ``Text``, bytes →
``Bytes``, a Struct → ``Struct``) unless ``value=`` says otherwise.

``App.topology()`` turns the declarations into the IR (``pystreams.topology.ir``).
"""

from __future__ import annotations

import inspect
import re
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from types import MethodType
from typing import TYPE_CHECKING, Any, Concatenate, Generic, ParamSpec, TypeAlias, TypeVar, cast, overload

from pystreams import serdes
from pystreams.app_loader import AppLoadError as AppLoadError
from pystreams.app_loader import AppNotFound as AppNotFound
from pystreams.app_loader import load_app as load_app
from pystreams.app_queries import AppQueries
from pystreams.guarantee import ProcessingGuarantee
from pystreams.serdes import Serde
from pystreams.topology import foreign_key as fk
from pystreams.topology.errors import (
    InvalidNameError,
    MissingSourceError,
    StoreError,
    TopologyError,
)
from pystreams.topology.ir import (
    AggregateNode,
    BranchNode,
    BranchOutputNode,
    CogroupAggregateNode,
    CogroupNode,
    CountNode,
    EmitStrategy,
    ErrorPolicies,
    ErrorPolicy,
    FilterNode,
    FkForeignUpdateNode,
    FkJoinNode,
    FkSubscribeNode,
    FkSubscriptionsNode,
    FlatMapNode,
    FlatMapValuesNode,
    GlobalTableSpec,
    JoinHow,
    JoinSide,
    MapNode,
    MapValuesNode,
    MergeNode,
    Node,
    PeekNode,
    ProcessorNode,
    PunctuationType,
    ReduceNode,
    RepartitionNode,
    SelectKeyNode,
    SinkNode,
    SourceNode,
    Store,
    StoreKind,
    StreamGlobalJoinNode,
    StreamStreamJoinNode,
    StreamTableJoinNode,
    SuppressNode,
    TableAggregateNode,
    TableFilterNode,
    TableGroupByNode,
    TableJoinNode,
    TableJoinSideNode,
    TableMapValuesNode,
    TableSourceNode,
    TableViewNode,
    ToStreamNode,
    is_materialized,
    is_table,
    stores_of,
    window_of,
)
from pystreams.topology.naming import check_name, repartition_source_node
from pystreams.topology.patterns import compile_pattern
from pystreams.topology.processor import Processor, ProcessorContext, punctuate, punctuations_of
from pystreams.topology.suppress import Suppression, UntilTimeLimit, UntilWindowCloses, until_time_limit, until_window_closes
from pystreams.topology.windows import (
    AggregationWindow,
    Duration,
    HoppingWindow,
    JoinWindow,
    SessionWindow,
    SlidingWindow,
    TumblingWindow,
    Windowed,
    to_millis,
    window_problems,
)

if TYPE_CHECKING:
    from pystreams.topology.ir import Topology

__all__ = [
    "App",
    "Branches",
    "CogroupedStreams",
    "HoppingWindow",
    "JoinWindow",
    "Processor",
    "ProcessorContext",
    "PunctuationType",
    "SessionWindow",
    "SlidingWindow",
    "StoreDeclaration",
    "Stream",
    "Table",
    "TumblingWindow",
    "Windowed",
    "kv_store",
    "load_app",
    "punctuate",
    "session_store",
    "until_time_limit",
    "until_window_closes",
    "window_store",
]

F = TypeVar("F", bound=Callable[..., Any])
StatelessNode: TypeAlias = MapNode | MapValuesNode | FlatMapNode | FlatMapValuesNode | FilterNode | PeekNode | SelectKeyNode
TimestampExtractor = Callable[[Any, Any, int], int]


# --------------------------------------------------------------------------- processor stores


@dataclass(frozen=True, slots=True)
class StoreDeclaration:
    """A store a low-level processor owns; make one with ``kv_store``, ``window_store`` or
    ``session_store``. ``None`` serdes mean the app defaults."""

    name: str
    kind: StoreKind
    key: Serde | None = None
    value: Serde | None = None
    window_size_ms: int | None = None
    retention_ms: int | None = None
    retain_duplicates: bool = False
    logging: bool = True


def kv_store(name: str, *, key: Serde | None = None, value: Serde | None = None, logging: bool = True) -> StoreDeclaration:
    return StoreDeclaration(check_name("store", name), StoreKind.KEY_VALUE, key, value, logging=logging)


def window_store(
    name: str,
    *,
    size: Duration,
    retention: Duration | None = None,
    key: Serde | None = None,
    value: Serde | None = None,
    retain_duplicates: bool = False,
    logging: bool = True,
) -> StoreDeclaration:
    size_ms = to_millis(size, f"window store {name!r} size", allow_zero=False)
    retention_ms = size_ms if retention is None else to_millis(retention, f"window store {name!r} retention")
    if retention_ms < size_ms:
        raise ValueError(f"window store {name!r}: retention ({retention_ms} ms) is shorter than a window ({size_ms} ms)")
    return StoreDeclaration(check_name("store", name), StoreKind.WINDOW, key, value, size_ms, retention_ms, retain_duplicates, logging)


def session_store(name: str, *, retention: Duration, key: Serde | None = None, value: Serde | None = None, logging: bool = True) -> StoreDeclaration:
    retention_ms = to_millis(retention, f"session store {name!r} retention", allow_zero=False)
    return StoreDeclaration(check_name("store", name), StoreKind.SESSION, key, value, None, retention_ms, False, logging)


# --------------------------------------------------------------------------- built-in steps
# Module-level (not lambdas) so they pickle by reference for runtimes that ship functions.


def count_step(count: int, key: Any, value: Any) -> int:
    """COUNT's aggregator."""
    return count + 1


def uncount_step(count: int, key: Any, value: Any) -> int:
    """A grouped table's count, its row gone (it stays 0, as Kafka Streams' does)."""
    return count - 1


def sum_merger(key: Any, older: int, newer: int) -> int:
    """COUNT's session merger."""
    return older + newer


class ReduceMerger:
    """A reducer used as a session merger: ``merger(key, older, newer) = reducer(older, key, newer)``."""

    def __init__(self, reducer: Callable[[Any, Any, Any], Any]) -> None:
        self.reducer = reducer

    def __call__(self, key: Any, older: Any, newer: Any) -> Any:
        return self.reducer(older, key, newer)


# --------------------------------------------------------------------------- the app


class App(AppQueries):
    """One stream-processing application: its id, default serdes and declared topology.

    ``name`` is the application id: it prefixes internal topics and names the consumer group.

    What a bad record does, with Kafka Streams' handlers' names (``"fail"``, the default,
    ``"log-and-continue"`` or ``"dead-letter"``): ``deserialization_errors`` for records whose
    key or value cannot be deserialized (``default.deserialization.exception.handler``; a
    source may set its own), ``processing_errors`` for exceptions raised by the app's
    functions (``processing.exception.handler``), and ``dead_letter_topic`` where dead letters
    go (``errors.dead.letter.queue.topic.name``). ``pystreams worker`` and ``pystreams spark``
    options replace the app-wide ones.

    Interactive queries (``query``, ``query_windows``, ...) come from ``AppQueries``.
    """

    def __init__(
        self,
        name: str,
        *,
        key_serde: Serde | None = None,
        value_serde: Serde | None = None,
        deserialization_errors: str = "fail",
        processing_errors: str = "fail",
        dead_letter_topic: str | None = None,
        processing_guarantee: str = "at_least_once",
    ) -> None:
        self.app_id = check_name("app", name)
        #: The workers' default ``processing.guarantee`` (``--processing-guarantee`` overrides it).
        self.processing_guarantee = ProcessingGuarantee.parse(str(processing_guarantee))
        self.default_key_serde = key_serde or serdes.Text()
        self.default_value_serde = value_serde or serdes.Json()
        self._nodes: dict[str, Node] = {}
        self._stores: dict[str, Store] = {}
        self._sources_by_topic: dict[str, str] = {}
        self.error_policies = ErrorPolicies(
            _policy(deserialization_errors, "deserialization_errors"),
            _policy(processing_errors, "processing_errors"),
            None if dead_letter_topic is None else check_name("topic", dead_letter_topic),
        )
        #: Sources with a deserialization policy of their own.
        self._source_policies: dict[str, ErrorPolicy] = {}
        self._global_tables: dict[str, GlobalTableSpec] = {}

    def __repr__(self) -> str:
        return f"<App {self.app_id!r}: {len(self._nodes)} nodes>"

    # ----------------------------------------------------------------- build

    def topology(self) -> Topology:
        """Validate the declarations and build the IR (raises ``TopologyError``)."""
        from pystreams.topology.builder import build

        errors = ErrorPolicies(
            self.error_policies.deserialization, self.error_policies.processing, self.error_policies.dead_letter_topic, self._source_policies
        )
        return build(self.app_id, list(self._nodes.values()), list(self._stores.values()), errors, list(self._global_tables.values()))

    # ----------------------------------------------------------------- sources

    def topic(
        self,
        topic: str | Sequence[str] | None = None,
        *,
        pattern: str | None = None,
        key: Serde | None = None,
        value: Serde | None = None,
        timestamp: TimestampExtractor | None = None,
        name: str | None = None,
        deserialization_errors: str | None = None,
    ) -> Stream:
        """A stream read from a topic (or several), or from every topic matching an RE2 pattern.

        ``timestamp(key, value, record_timestamp_ms) -> ms`` sets event time; without it the
        record's own timestamp is used. ``deserialization_errors`` (``"fail"``,
        ``"log-and-continue"``, ``"dead-letter"``): this source's own policy for records it
        cannot deserialize, instead of the app's.
        """
        if (topic is None) == (pattern is None):
            raise TopologyError(f"source {name or topic or pattern!r}: give exactly one of a topic or pattern=")
        if pattern is not None:
            node_name = self._fresh_name(name, "pattern-source")
            compile_pattern(pattern, node_name)
            topics: tuple[str, ...] = ()
        else:
            assert topic is not None  # exactly one of topic and pattern, checked above
            topics = (topic,) if isinstance(topic, str) else tuple(topic)
            if not topics:
                raise TopologyError(f"source {name!r}: no topics given")
            if name is None and len(topics) > 1:
                raise InvalidNameError(f"a source of several topics {list(topics)} needs name=")
            node_name = name or topics[0]
        node = SourceNode(
            name=node_name,
            key_serde=key or self.default_key_serde,
            value_serde=value or self.default_value_serde,
            topics=tuple(check_name("topic", t) for t in topics),
            pattern=pattern,
            timestamp_extractor=None if timestamp is None else _callable(timestamp, "timestamp extractor"),
        )
        self._add_source(node)
        self._set_source_policy(node_name, deserialization_errors)
        return Stream(self, node_name)

    def table(
        self,
        topic: str,
        *,
        store: str | None = None,
        key: Serde | None = None,
        value: Serde | None = None,
        timestamp: TimestampExtractor | None = None,
        name: str | None = None,
        deserialization_errors: str | None = None,
        versioned: Duration | None = None,
    ) -> Table:
        """A table read from a topic: the latest value per key, kept in ``store``
        (``deserialization_errors``: as for ``topic``).

        ``versioned=history`` (Kafka Streams' versioned tables, KIP-889/914) keeps every value
        each key held within ``history`` of stream time: a stream–table join then looks up the
        value *as of* each stream record's timestamp, out-of-order table updates included
        (they change the table's past, not its current value, so they emit nothing), and an
        update older than ``history`` is dropped, counted as late."""
        node_name = name or topic
        store_name = store or node_name
        history_ms = None if versioned is None else to_millis(versioned, f"table {node_name!r} versioned history")
        node = TableSourceNode(
            name=node_name,
            key_serde=key or self.default_key_serde,
            value_serde=value or self.default_value_serde,
            topic=check_name("topic", topic),
            timestamp_extractor=None if timestamp is None else _callable(timestamp, "timestamp extractor"),
            store=store_name,
        )
        self._add_source(node)
        self._set_source_policy(node_name, deserialization_errors)
        self._add_store(
            Store(
                name=store_name,
                kind=StoreKind.KEY_VALUE,
                owner=node_name,
                key_serde=node.key_serde,
                value_serde=node.value_serde,
                history_ms=history_ms,
            )
        )
        return Table(self, node_name)

    def global_table(self, topic: str, *, store: str | None = None, key: Serde | None = None, value: Serde | None = None) -> GlobalTable:
        """A table every worker holds whole (Kafka Streams' ``GlobalKTable``): all partitions of
        ``topic``, restored before the worker's tasks start and kept current as the topic grows.

        Join a stream with it on any key — ``stream.join(customers, fn, foreign_key=lambda k, v:
        v["customer"])`` — with no co-partitioning and no repartition; query it on any worker
        (``app.query(store, key)``). Its store, named ``store`` (default: the topic), keeps the
        topic's bytes as written: ``key``/``value`` are the serdes a lookup reads them with."""
        store_name = check_name("store", store or topic)
        owner = self._sources_by_topic.get(topic)
        if owner is not None:
            raise InvalidNameError(f"topic {topic!r} is already read by {owner!r}; a topic feeds one source or global table", nodes=[owner], topics=[topic])
        if store_name in self._stores or store_name in self._nodes or store_name in self._global_tables:
            raise InvalidNameError(f"global table {store_name!r}: the name is taken; pass store= to choose another", nodes=[store_name])
        self._global_tables[store_name] = GlobalTableSpec(
            name=store_name,
            topic=check_name("topic", topic),
            key_serde=key or self.default_key_serde,
            value_serde=value or self.default_value_serde,
        )
        self._sources_by_topic[topic] = store_name
        return GlobalTable(self, store_name)

    # ----------------------------------------------------------------- stateless

    def map(
        self,
        stream: Stream,
        *,
        key: Serde | None = None,
        value: Serde | None = None,
        key_changing: bool = True,
        name: str | None = None,
    ) -> Callable[[Callable], Stream]:
        """``fn(key, value) -> (key, value)``. Pass ``key_changing=False`` if keys never change."""
        return self._stateless(
            MapNode,
            stream,
            name,
            key=key,
            value=value,
            key_changing=key_changing,
            inherit_key=_keeps_keys(key, key_changing),
        )

    @overload
    def map_values(self, stream: Stream, *, value: Serde | None = None, name: str | None = None) -> Callable[[Callable], Stream]: ...
    @overload
    def map_values(self, stream: Table, *, value: Serde | None = None, name: str | None = None, store: str | None = None) -> Callable[[Callable], Table]: ...
    def map_values(self, stream: Stream | Table, *, value: Serde | None = None, name: str | None = None, store: str | None = None) -> Callable[[Callable], Any]:
        """``fn(key, value) -> value``; keys stay, so no repartition follows. On a table
        (Kafka Streams' ``KTable.mapValues``): a table of ``fn``'s values, tombstones passing
        as tombstones; kept in ``store`` (queryable) when given, else computed on read."""
        if isinstance(stream, Table):
            return self._derived_table(stream, name, store, value, "map_values", lambda fn: {"fn": fn})
        self._no_store_on_streams(store, "map_values")
        return self._stateless(MapValuesNode, stream, name, value=value, inherit_key=True)

    def flat_map(
        self,
        stream: Stream,
        *,
        key: Serde | None = None,
        value: Serde | None = None,
        key_changing: bool = True,
        name: str | None = None,
    ) -> Callable[[Callable], Stream]:
        """``fn(key, value) -> iterable of (key, value)`` (a generator is fine)."""
        return self._stateless(
            FlatMapNode,
            stream,
            name,
            key=key,
            value=value,
            key_changing=key_changing,
            inherit_key=_keeps_keys(key, key_changing),
        )

    def flat_map_values(self, stream: Stream, *, value: Serde | None = None, name: str | None = None) -> Callable[[Callable], Stream]:
        """``fn(key, value) -> iterable of value``; keys stay."""
        return self._stateless(FlatMapValuesNode, stream, name, value=value, inherit_key=True)

    @overload
    def filter(self, stream: Stream, *, name: str | None = None) -> Callable[[Callable], Stream]: ...
    @overload
    def filter(self, stream: Table, *, name: str | None = None, store: str | None = None) -> Callable[[Callable], Table]: ...
    def filter(self, stream: Stream | Table, *, name: str | None = None, store: str | None = None) -> Callable[[Callable], Any]:
        """``fn(key, value) -> bool``: keep records for which it is true. On a table (Kafka
        Streams' ``KTable.filter``): the rows for which it is true, a row it drops becoming a
        tombstone; kept in ``store`` (queryable) when given, else computed on read."""
        if isinstance(stream, Table):
            return self._derived_table(stream, name, store, None, "filter", lambda fn: {"fn": fn, "keep": True})
        self._no_store_on_streams(store, "filter")
        return self._stateless(FilterNode, stream, name, inherit_key=True, inherit_value=True)

    @overload
    def filter_not(self, stream: Stream, *, name: str | None = None) -> Callable[[Callable], Stream]: ...
    @overload
    def filter_not(self, stream: Table, *, name: str | None = None, store: str | None = None) -> Callable[[Callable], Table]: ...
    def filter_not(self, stream: Stream | Table, *, name: str | None = None, store: str | None = None) -> Callable[[Callable], Any]:
        """Kafka Streams' ``filterNot``: ``filter`` keeping what ``fn`` is false for."""
        if isinstance(stream, Table):
            return self._derived_table(stream, name, store, None, "filter_not", lambda fn: {"fn": fn, "keep": False})
        self._no_store_on_streams(store, "filter_not")
        declare = self._stateless(FilterNode, stream, name, inherit_key=True, inherit_value=True)

        def declare_not(fn: Callable) -> Stream:
            return declare(_Negated(_callable(fn)))

        return declare_not

    def peek(self, stream: Stream, *, name: str | None = None) -> Callable[[Callable], Stream]:
        """``fn(key, value)`` for its side effect; records pass unchanged."""
        return self._stateless(PeekNode, stream, name, inherit_key=True, inherit_value=True)

    @overload
    def group_by(self, stream: Stream, *, key: Serde | None = None, name: str | None = None) -> Callable[[Callable], GroupedStream]: ...
    @overload
    def group_by(
        self, stream: Table, *, key: Serde | None = None, value: Serde | None = None, name: str | None = None
    ) -> Callable[[Callable], GroupedTable]: ...
    def group_by(self, stream: Stream | Table, *, key: Serde | None = None, value: Serde | None = None, name: str | None = None) -> Callable[[Callable], Any]:
        """Group for an aggregation, as Kafka Streams' ``groupBy``. On a stream: ``fn(key,
        value) -> new key``, a grouped stream for ``count`` / ``aggregate`` / ``reduce`` /
        ``cogroup`` (which repartition). On a table (``KTable.groupBy``): ``fn(key, value) ->
        (new key, new value)``, a grouped table whose ``count`` / ``reduce`` / ``aggregate``
        subtract a row's old pair from its old group when the row changes, and add the new.
        ``select_key`` re-keys a stream without grouping it."""
        if isinstance(stream, Table):
            return self._table_group_by(stream, key, value, name)
        if value is not None:
            raise TypeError("group_by: value= is for a table's group_by; a stream's keeps its values")
        select = self._stateless(SelectKeyNode, stream, name, key=key, inherit_value=True, key_changing=True)

        def declare(fn: Callable) -> GroupedStream:
            return GroupedStream(self, select(fn).name)

        return declare

    def select_key(self, stream: Stream, *, key: Serde | None = None, name: str | None = None) -> Callable[[Callable], Stream]:
        """Kafka Streams' ``selectKey``: ``fn(key, value) -> new key``, the same values under new
        keys (a join or aggregation after it repartitions)."""
        return self._stateless(SelectKeyNode, stream, name, key=key, inherit_value=True, key_changing=True)

    def group_by_key(self, stream: Stream) -> GroupedStream:
        """Kafka Streams' ``groupByKey``: the stream grouped by the key it has, for an
        aggregation (which repartitions it only if an upstream step changed keys)."""
        return GroupedStream(self, self._stream(stream, "group_by_key").name)

    def _table_group_by(self, table: Table, key: Serde | None, value: Serde | None, name: str | None) -> Callable[[Callable], GroupedTable]:
        def declare(fn: Callable) -> GroupedTable:
            parent = self._table(table, "group_by")
            if not is_table(parent) or _table_window(self, parent) is not None:
                raise TopologyError(f"group_by: {parent.name!r} is not a table of plain keys a group_by can re-key row by row", nodes=[parent.name])
            node_name = self._function_name(fn, name, parent, "group-by")
            store_name = check_name("store", f"{node_name}-rows")
            self._add(
                TableGroupByNode(
                    name=node_name,
                    parents=(parent.name,),
                    fn=_callable(fn),
                    key_serde=key or self.default_key_serde,
                    value_serde=serdes.Change(value or self.default_value_serde),
                    store=store_name,
                )
            )
            self._add_store(Store(name=store_name, kind=StoreKind.KEY_VALUE, owner=node_name, key_serde=parent.key_serde, value_serde=serdes.Bytes()))
            return GroupedTable(self, node_name)

        return declare

    def _table_aggregation(
        self,
        grouped: GroupedTable,
        operation: str,
        name: str | None,
        store: str | None,
        *,
        adder: Callable,
        subtractor: Callable | None,
        initial: Any,
        value_serde: Serde | None,
        reduce: bool = False,
    ) -> Table:
        parent = grouped.node
        if subtractor is None:
            raise TypeError(f"{operation} of the grouped table {parent.name!r} needs subtractor=: an update takes the row's old value out of its group")
        node_name = self._fresh_name(name or store, f"{parent.name}-{operation}")
        store_name = check_name("store", store or node_name)
        if value_serde is None:  # a reduce keeps the grouped values; an aggregate's default is the app's
            value_serde = cast(serdes.Change, parent.value_serde).inner if reduce else self.default_value_serde
        self._add(
            TableAggregateNode(
                name=node_name,
                parents=(parent.name,),
                key_serde=parent.key_serde,
                value_serde=value_serde,
                adder=_callable(adder, "adder"),
                subtractor=_callable(subtractor, "subtractor"),
                initial=initial,
                reduce=reduce,
                store=store_name,
            )
        )
        self._add_store(Store(name=store_name, kind=StoreKind.KEY_VALUE, owner=node_name, key_serde=parent.key_serde, value_serde=value_serde))
        return Table(self, node_name)

    def branch(self, stream: Stream, *, branches: Sequence[str], name: str | None = None) -> Callable[[Callable], Branches]:
        """``fn(key, value) -> label or None``: route each record to one named branch (None drops)."""
        labels = tuple(branches)
        if not labels or len(set(labels)) != len(labels):
            raise TopologyError(f"branch {name!r}: branches must be distinct labels, got {list(labels)}")

        def declare(fn: Callable) -> Branches:
            parent = self._stream(stream, "branch")
            node_name = self._function_name(fn, name, parent, "branch")
            for label in labels:
                check_name(f"branch {node_name!r} label", label)
            self._add(
                BranchNode(
                    name=node_name,
                    parents=(parent.name,),
                    fn=_callable(fn),
                    key_serde=parent.key_serde,
                    value_serde=parent.value_serde,
                    branches=labels,
                )
            )
            streams = {}
            for label in labels:
                output = BranchOutputNode(
                    name=f"{node_name}-{label}",
                    parents=(node_name,),
                    key_serde=parent.key_serde,
                    value_serde=parent.value_serde,
                    label=label,
                )
                self._add(output)
                streams[label] = Stream(self, output.name)
            return Branches(streams)

        return declare

    def merge(self, *streams: Stream, name: str | None = None) -> Stream:
        """One stream of the records of all ``streams`` (serdes of the first)."""
        if len(streams) < 2:
            raise TopologyError(f"merge {name!r} needs at least two streams")
        parents = [self._stream(s, "merge") for s in streams]
        names = [p.name for p in parents]
        if len(set(names)) != len(names):
            raise TopologyError(f"merge {name!r}: a stream is given twice: {names}", nodes=names)
        node_name = self._fresh_name(name, f"{names[0]}-merge")
        self._add(
            MergeNode(
                name=node_name,
                parents=tuple(names),
                key_serde=parents[0].key_serde,
                value_serde=parents[0].value_serde,
            )
        )
        return Stream(self, node_name)

    def repartition(self, stream: Stream, *, name: str | None = None, partitions: int | None = None) -> Stream:
        """Write the stream through ``<app>-<name>-repartition`` (``name`` defaults to the
        stream's) so it is partitioned by its current key; ``partitions`` fixes the count."""
        parent = self._stream(stream, "repartition")
        if partitions is not None and (not isinstance(partitions, int) or partitions < 1):
            raise TopologyError(f"repartition of {parent.name!r}: partitions must be a positive int, got {partitions!r}")
        base = check_name("repartition", name or parent.name)
        node_name = repartition_source_node(base)
        self._add(
            RepartitionNode(
                name=node_name,
                parents=(parent.name,),
                key_serde=parent.key_serde,
                value_serde=parent.value_serde,
                partitions=partitions,
            )
        )
        return Stream(self, node_name)

    def to_stream(self, table: Table, *, name: str | None = None) -> Stream:
        """The table's updates as a stream."""
        parent = self._table(table, "to_stream")
        node_name = self._fresh_name(name, f"{parent.name}-stream")
        self._add(
            ToStreamNode(
                name=node_name,
                parents=(parent.name,),
                key_serde=parent.key_serde,
                value_serde=parent.value_serde,
            )
        )
        return Stream(self, node_name)

    def suppress(self, table: Table, suppression: Suppression, *, store: str | None = None, name: str | None = None) -> Table:
        """Kafka Streams' ``KTable.suppress``: the table's updates held back in a changelogged
        buffer (``store``, default ``<name>-buffer``; not queryable) and emitted as
        ``suppression`` says — ``until_window_closes()`` (windowed tables: each window's final
        value once) or ``until_time_limit(duration, max_records=, max_bytes=, when_full=)``."""
        parent = self._table(table, "suppress")
        node_name = self._fresh_name(name, f"{parent.name}-suppress")
        if not isinstance(suppression, UntilWindowCloses | UntilTimeLimit):
            raise TypeError(f"suppress {node_name!r}: give until_window_closes() or until_time_limit(...), got {suppression!r}")
        parent_window = _table_window(self, parent)
        window = parent_window if isinstance(parent_window, TumblingWindow | HoppingWindow | SlidingWindow | SessionWindow) else None
        if isinstance(suppression, UntilWindowCloses) and window is None:
            raise TopologyError(
                f"suppress {node_name!r}: until_window_closes() needs a windowed table, but {parent.name!r} has no windows (use until_time_limit(...))",
                nodes=[node_name, parent.name],
            )
        store_name = check_name("store", store or f"{node_name}-buffer")
        self._add(
            SuppressNode(
                name=node_name,
                parents=(parent.name,),
                key_serde=parent.key_serde,
                value_serde=parent.value_serde,
                suppression=suppression,
                store=store_name,
                window=window,
            )
        )
        self._add_store(Store(name=store_name, kind=StoreKind.KEY_VALUE, owner=node_name, key_serde=serdes.Bytes(), value_serde=serdes.Bytes()))
        return Table(self, node_name)

    # ----------------------------------------------------------------- stateful

    def count(
        self,
        stream: Stream | GroupedTable,
        *,
        store: str | None = None,
        window: AggregationWindow | None = None,
        emit: str = "update",
        name: str | None = None,
    ) -> Table:
        """Records per key (per window with ``window=``); values are ``Int()`` (8-byte big-endian).
        ``emit="final"`` (windowed only): one count per window, when it closes (KIP-825). Of a
        grouped table: rows per group, a changed row leaving its old group (0 stays a count)."""
        if isinstance(stream, GroupedTable):
            if window is not None or emit != "update":
                raise TypeError("count of a grouped table takes no window= or emit=")
            return self._table_aggregation(stream, "count", name, store, adder=count_step, subtractor=uncount_step, initial=0, value_serde=serdes.Int())
        parent = self._stream(stream, "count")
        node_name = self._fresh_name(name or store, f"{parent.name}-count")
        return self._aggregation(
            CountNode,
            parent,
            node_name,
            store,
            window,
            fn=count_step,
            initial=0,
            merger=sum_merger,
            value_serde=serdes.Int(),
            emit=emit,
        )

    def aggregate(
        self,
        stream: Stream | GroupedTable,
        *,
        initial: Any,
        store: str | None = None,
        window: AggregationWindow | None = None,
        merge: Callable[[Any, Any, Any], Any] | None = None,
        subtractor: Callable[[Any, Any, Any], Any] | None = None,
        value: Serde | None = None,
        emit: str = "update",
        name: str | None = None,
    ) -> Callable[[Callable], Table]:
        """``fn(acc, key, value) -> acc`` per key (per window), from ``initial`` (a value, or a
        zero-argument factory such as ``list``). Session windows need ``merge(key, older, newer)``.
        ``emit``: ``"update"`` (every change, folded per commit) or, windowed only, ``"final"``
        (each window's value once, when it closes: stream time past its end + grace). Of a
        grouped table, ``fn`` adds a row's new value and ``subtractor(acc, key, value)`` takes
        its old one out (Kafka Streams' ``KGroupedTable.aggregate``)."""
        if isinstance(stream, GroupedTable):
            if window is not None or merge is not None or emit != "update":
                raise TypeError("aggregate of a grouped table takes no window=, merge= or emit=")
            grouped = stream

            def declare_grouped(fn: Callable) -> Table:
                return self._table_aggregation(
                    grouped, "aggregate", name, store, adder=fn, subtractor=subtractor, initial=initial, value_serde=value or serdes.inferred_from(initial)
                )

            return declare_grouped
        if subtractor is not None:
            raise TypeError("aggregate: subtractor= is for a grouped table; a stream's records are only added")

        def declare(fn: Callable) -> Table:
            parent = self._stream(stream, "aggregate")
            node_name = self._function_name(fn, name, parent, "aggregate")
            value_serde = value or serdes.inferred_from(initial) or self.default_value_serde
            merger = None if merge is None else _callable(merge, "merger")
            return self._aggregation(
                AggregateNode,
                parent,
                node_name,
                store,
                window,
                fn=_callable(fn),
                initial=initial,
                merger=merger,
                value_serde=value_serde,
                emit=emit,
            )

        return declare

    def reduce(
        self,
        stream: Stream | GroupedTable,
        *,
        store: str | None = None,
        window: AggregationWindow | None = None,
        subtractor: Callable[[Any, Any, Any], Any] | None = None,
        emit: str = "update",
        name: str | None = None,
    ) -> Callable[[Callable], Table]:
        """``fn(acc, key, value) -> acc``; a key's first value is its accumulator (``emit``: as
        for ``aggregate``). Of a grouped table, ``subtractor(acc, key, value)`` takes a row's
        old value out (Kafka Streams' ``KGroupedTable.reduce``)."""
        if isinstance(stream, GroupedTable):
            if window is not None or emit != "update":
                raise TypeError("reduce of a grouped table takes no window= or emit=")
            grouped = stream

            def declare_grouped(fn: Callable) -> Table:
                return self._table_aggregation(grouped, "reduce", name, store, adder=fn, subtractor=subtractor, initial=None, value_serde=None, reduce=True)

            return declare_grouped
        if subtractor is not None:
            raise TypeError("reduce: subtractor= is for a grouped table; a stream's records are only added")

        def declare(fn: Callable) -> Table:
            parent = self._stream(stream, "reduce")
            node_name = self._function_name(fn, name, parent, "reduce")
            fn = _callable(fn)
            return self._aggregation(
                ReduceNode,
                parent,
                node_name,
                store,
                window,
                fn=fn,
                initial=None,
                merger=ReduceMerger(fn),
                value_serde=parent.value_serde,
                emit=emit,
            )

        return declare

    def cogroup(self) -> CogroupedStreams:
        """Start a cogroup: several streams into one aggregate with one store, each with its
        own aggregator (see ``CogroupedStreams``)."""
        return CogroupedStreams(self)

    @overload
    def join(
        self,
        left: Stream,
        right: GlobalTable,
        *,
        how: str = "inner",
        value: Serde | None = None,
        name: str | None = None,
        foreign_key: Callable[[Any, Any], Any] | None = None,
    ) -> Callable[[Callable], Stream]: ...
    @overload
    def join(
        self,
        left: Stream,
        right: Stream | Table,
        *,
        window: JoinWindow | None = None,
        how: str = "inner",
        value: Serde | None = None,
        name: str | None = None,
        grace: Duration | None = None,
    ) -> Callable[[Callable], Stream]: ...
    @overload
    def join(
        self,
        left: Table,
        right: Table,
        *,
        how: str = "inner",
        value: Serde | None = None,
        name: str | None = None,
        store: str | None = None,
        foreign_key: Callable[[Any, Any], Any] | None = None,
    ) -> Callable[[Callable], Table]: ...
    def join(
        self,
        left: Stream | Table,
        right: Stream | Table | GlobalTable,
        *,
        window: JoinWindow | None = None,
        how: str = "inner",
        value: Serde | None = None,
        name: str | None = None,
        store: str | None = None,
        foreign_key: Callable[[Any, Any], Any] | None = None,
        grace: Duration | None = None,
    ) -> Callable[[Callable], Any]:
        """``fn(key, left_value, right_value) -> value``.

        A stream with a ``Table``: a stream–table join (``how`` inner or left; no window). With
        a versioned table, ``grace=`` holds each stream record until stream time is ``grace``
        past it, so table updates arriving late still count (KIP-923). With a ``Stream``: a
        windowed stream–stream join (``window=JoinWindow(...)``; inner, left or outer). Both
        sides must be co-partitioned; re-keyed sides are repartitioned first.

        A table with a table: a table–table join on the key (``how`` inner, left or outer), a
        table of the joined rows; kept in ``store`` (queryable) when given, else computed as
        its sides update. With ``foreign_key=fn(key, value)`` (Kafka Streams' foreign-key
        join, KIP-213; inner or left): each left row joins the right row whose key ``fn``
        gives, keyed by the left key; the sides need not be co-partitioned.

        A stream with a ``GlobalTable`` (``how`` inner or left): each record joins the global
        table's row for ``foreign_key(key, value)`` — its own key when not given — with no
        co-partitioning (Kafka Streams' stream–GlobalKTable join).
        """
        if isinstance(left, Table):

            def declare_table(fn: Callable) -> Table:
                left_node = self._table(left, "join")
                node_name = self._function_name(fn, name, left_node, "join")
                if window is not None:
                    raise TopologyError(f"join {node_name!r}: a table-table join takes no window", nodes=[node_name])
                if foreign_key is not None:
                    return self._foreign_key_join(
                        node_name,
                        left_node,
                        right,
                        _join_how(how, node_name),
                        _callable(fn),
                        value or self.default_value_serde,
                        store,
                        _callable(foreign_key, "foreign key extractor"),
                    )
                return self._table_table_join(node_name, left_node, right, _join_how(how, node_name), _callable(fn), value or self.default_value_serde, store)

            return declare_table
        self._no_store_on_streams(store, "join")
        if grace is not None and not isinstance(right, Table):
            raise TypeError("join: grace= is for a stream joining a versioned table (a stream-stream join's grace is JoinWindow(grace=...))")
        if isinstance(right, GlobalTable):
            return self._stream_global_join(left, right, window=window, how=how, value=value, name=name, foreign_key=foreign_key)
        if foreign_key is not None:
            raise TypeError(
                "join: foreign_key= joins two tables, or a stream with a global table; a stream joins a table on its key (re-key it with select_key first)"
            )

        def declare(fn: Callable) -> Stream:
            left_node = self._stream(left, "join")
            node_name = self._function_name(fn, name, left_node, "join")
            join_how = _join_how(how, node_name)
            value_serde = value or self.default_value_serde
            if isinstance(right, Table):
                return self._stream_table_join(node_name, left_node, right, window, join_how, _callable(fn), value_serde, grace)
            if isinstance(right, Stream):
                return self._stream_stream_join(node_name, left_node, right, window, join_how, _callable(fn), value_serde)
            raise TypeError(f"join {node_name!r}: the right side must be a Stream or Table, got {right!r}")

        return declare

    def processor(
        self,
        stream: Stream,
        *,
        stores: Sequence[StoreDeclaration | str] = (),
        key: Serde | None = None,
        value: Serde | None = None,
        key_changing: bool = True,
        name: str | None = None,
    ) -> Callable[[type[Processor]], Stream]:
        """A low-level ``Processor`` subclass; one instance per task.

        ``stores`` lists stores it owns (``kv_store(...)`` etc.) and, by name, stores of other
        nodes it may read — those must be in the same sub-topology. A processor with stores
        gets a repartition in front of it when its input's key changed.
        """

        def declare(processor_class: type[Processor]) -> Stream:
            parent = self._stream(stream, "processor")
            if not (isinstance(processor_class, type) and issubclass(processor_class, Processor)):
                raise TypeError(f"@app.processor needs a Processor subclass, got {processor_class!r}")
            punctuations = punctuations_of(processor_class)
            for method in ("init", "process", "close", *(p.method for p in punctuations)):
                _callable(getattr(processor_class, method), f"{processor_class.__name__}.{method}")
            node_name = check_name("node", name or processor_class.__name__)
            store_names = []
            owned = []
            for entry in stores:
                if isinstance(entry, StoreDeclaration):
                    owned.append(entry)
                    store_names.append(entry.name)
                elif isinstance(entry, str):
                    store_names.append(entry)
                else:
                    raise TypeError(f"processor {node_name!r}: stores must be store declarations or names, got {entry!r}")
            self._add(
                ProcessorNode(
                    name=node_name,
                    parents=(parent.name,),
                    fn=processor_class,
                    key_serde=key or (self.default_key_serde if key_changing else parent.key_serde),
                    value_serde=value or self.default_value_serde,
                    key_changing=key_changing,
                    stores=tuple(store_names),
                    punctuations=punctuations,
                )
            )
            for declaration in owned:
                self._add_store(
                    Store(
                        name=declaration.name,
                        kind=declaration.kind,
                        owner=node_name,
                        key_serde=declaration.key or self.default_key_serde,
                        value_serde=declaration.value or self.default_value_serde,
                        window=TumblingWindow(declaration.window_size_ms) if declaration.window_size_ms else None,
                        retention_ms=declaration.retention_ms,
                        retain_duplicates=declaration.retain_duplicates,
                        logging=declaration.logging,
                    )
                )
            return Stream(self, node_name)

        return declare

    # ----------------------------------------------------------------- sinks

    def to(
        self,
        source: Stream | Table,
        topic: str,
        *,
        key: Serde | None = None,
        value: Serde | None = None,
        name: str | None = None,
    ) -> None:
        """Write a stream's records, or a table's updates, to ``topic``."""
        parent = self._stream(source, "to") if isinstance(source, GroupedStream) else self._handle(source, "to")
        check_name("topic", topic)
        node_name = self._fresh_name(name, f"{parent.name}-to-{topic}")
        self._add(
            SinkNode(
                name=node_name,
                parents=(parent.name,),
                topic=topic,
                key_serde=key or parent.key_serde,
                value_serde=value or parent.value_serde,
            )
        )

    # ----------------------------------------------------------------- internals

    def _add(self, node: Node) -> None:
        check_name(f"{node.kind} node", node.name)
        existing = self._nodes.get(node.name)
        if existing is not None:
            raise InvalidNameError(
                f"node name {node.name!r} is already used by a {existing.kind} node; pass name= to choose another",
                nodes=[node.name],
            )
        self._nodes[node.name] = node

    def _add_source(self, node: SourceNode | TableSourceNode) -> None:
        for topic in node.topics:
            owner = self._sources_by_topic.get(topic)
            if owner is not None:
                raise InvalidNameError(
                    f"topic {topic!r} is already read by source {owner!r}; source {node.name!r} cannot read it too — reuse that stream",
                    nodes=[owner, node.name],
                    topics=[topic],
                )
        self._add(node)
        for topic in node.topics:
            self._sources_by_topic[topic] = node.name

    def _set_source_policy(self, node_name: str, policy: str | None) -> None:
        if policy is not None:
            self._source_policies[node_name] = _policy(policy, f"source {node_name!r}: deserialization_errors")

    def _add_store(self, store: Store) -> None:
        check_name("store", store.name)
        existing = self._stores.get(store.name)
        if existing is not None:
            raise StoreError(
                f"store {store.name!r} is declared by both {existing.owner!r} and {store.owner!r}",
                nodes=[existing.owner, store.owner],
            )
        self._stores[store.name] = store

    def _fresh_name(self, name: str | None, base: str) -> str:
        """``name`` if given (it must be free), else ``base``, numbered if taken."""
        if name is not None:
            return check_name("node", name)
        candidate, number = base, 2
        while candidate in self._nodes:
            candidate, number = f"{base}-{number}", number + 1
        return check_name("node", candidate)

    def _function_name(self, fn: Callable, name: str | None, parent: Node, kind: str) -> str:
        """The node name for a decorated function: ``name=``, else the function's name (which
        must be free), else — for lambdas — ``<parent>-<kind>``, numbered if taken."""
        if not callable(fn):
            raise TypeError(f"@app.{kind} decorates a function, got {fn!r}")
        if name is not None:
            return check_name("node", name)
        function_name = getattr(fn, "__name__", "")
        if function_name.isidentifier() and function_name != "<lambda>":
            return check_name("node", function_name)
        return self._fresh_name(None, f"{parent.name}-{kind}")

    def _handle(self, handle: Any, operation: str) -> Node:
        if not isinstance(handle, _Handle):
            raise TypeError(f"{operation} needs a Stream or Table of app {self.app_id!r}, got {handle!r}")
        if handle.app is not self:
            raise MissingSourceError(
                f"{operation}: {handle.name!r} belongs to app {handle.app.app_id!r}, not {self.app_id!r}",
                nodes=[handle.name],
            )
        return handle.node

    def _stream(self, handle: Any, operation: str) -> Node:
        node = self._handle(handle, operation)
        if isinstance(handle, Table):
            raise TopologyError(f"{operation} needs a stream, but {node.name!r} is a table; use .to_stream() first", nodes=[node.name])
        if isinstance(handle, GroupedStream) and operation not in _GROUPED_STREAM_OPERATIONS:
            warnings.warn(
                f"{operation} on the grouped stream {node.name!r}: group_by groups a stream for an aggregation, as Kafka "
                "Streams' groupBy; use select_key(...) for a re-keyed stream (a grouped stream used as a stream is deprecated)",
                DeprecationWarning,
                stacklevel=4,
            )
        return node

    def _table(self, handle: Any, operation: str) -> Node:
        node = self._handle(handle, operation)
        if not isinstance(handle, Table):
            raise TopologyError(f"{operation} needs a table, but {node.name!r} is a stream", nodes=[node.name])
        return node

    @staticmethod
    def _no_store_on_streams(store: str | None, operation: str) -> None:
        if store is not None:
            raise TypeError(f"{operation}: store= materializes a table; a stream's {operation} keeps nothing")

    def _derived_table(
        self,
        table: Table,
        name: str | None,
        store: str | None,
        value: Serde | None,
        operation: str,
        fields: Callable[[Callable], dict[str, Any]],
    ) -> Callable[[Callable], Table]:
        """A table step (filter, filter_not, map_values) over ``table``: materialized in
        ``store`` when given, else computed on read from the nearest materialized ancestor."""

        def declare(fn: Callable) -> Table:
            parent = self._table(table, operation)
            if not is_table(parent):
                raise TopologyError(f"{operation}: {parent.name!r} ({parent.kind}) is not a table a step can read row by row", nodes=[parent.name])
            node_name = self._function_name(fn, name, parent, operation.replace("_", "-"))
            node_type = TableMapValuesNode if operation == "map_values" else TableFilterNode
            store_name = None if store is None else check_name("store", store)
            if store_name is not None and _table_window(self, parent) is not None:
                raise TopologyError(
                    f"{operation} {node_name!r}: store= on the windowed table {parent.name!r} is not supported; leave it computed on read",
                    nodes=[node_name, parent.name],
                )
            node = node_type(
                name=node_name,
                parents=(parent.name,),
                key_serde=parent.key_serde,
                value_serde=(value or self.default_value_serde) if node_type is TableMapValuesNode else parent.value_serde,
                store=store_name,
                **fields(_callable(fn)),
            )
            self._add(node)
            if store_name is not None:
                self._add_store(Store(name=store_name, kind=StoreKind.KEY_VALUE, owner=node_name, key_serde=node.key_serde, value_serde=node.value_serde))
            return Table(self, node_name)

        return declare

    def _stateless(
        self,
        node_type: type[StatelessNode],
        stream: Stream,
        name: str | None,
        *,
        key: Serde | None = None,
        value: Serde | None = None,
        inherit_key: bool = False,
        inherit_value: bool = False,
        key_changing: bool = False,
    ) -> Callable[[Callable], Stream]:
        def declare(fn: Callable) -> Stream:
            kind = str(node_type.kind)
            parent = self._stream(stream, kind)
            node_name = self._function_name(fn, name, parent, kind)
            node = node_type(
                name=node_name,
                parents=(parent.name,),
                fn=_callable(fn),
                key_serde=parent.key_serde if inherit_key else key or self.default_key_serde,
                value_serde=parent.value_serde if inherit_value else value or self.default_value_serde,
            )
            # Only maps and flat-maps may say whether they change keys; the others never do.
            if isinstance(node, (MapNode, FlatMapNode)):
                node = replace(node, key_changing=key_changing)
            self._add(node)
            return Stream(self, node_name)

        return declare

    def _aggregation(
        self,
        node_type: type[CountNode] | type[AggregateNode] | type[ReduceNode],
        parent: Node,
        node_name: str,
        store: str | None,
        window: AggregationWindow | None,
        *,
        fn: Callable,
        initial: Any,
        merger: Callable | None,
        value_serde: Serde,
        emit: str = "update",
    ) -> Table:
        kind = node_type.kind
        if window is not None and not isinstance(window, TumblingWindow | HoppingWindow | SlidingWindow | SessionWindow):
            raise TypeError(f"{kind} {node_name!r}: window must be a Tumbling, Hopping, Sliding or Session window, got {window!r}")
        _check_window(window, kind, node_name)
        try:
            strategy = EmitStrategy(emit)
        except ValueError:
            raise TopologyError(f"{kind} {node_name!r}: emit must be one of {[e.value for e in EmitStrategy]}, got {emit!r}", nodes=[node_name]) from None
        if strategy is EmitStrategy.FINAL and window is None:
            raise TopologyError(
                f"{kind} {node_name!r}: emit='final' needs window= (a table without windows never closes; use table.suppress(until_time_limit(...)))",
                nodes=[node_name],
            )
        if strategy is EmitStrategy.FINAL and isinstance(window, SlidingWindow):
            raise TopologyError(
                f"{kind} {node_name!r}: emit='final' is not supported over sliding windows yet; emit on update, or use tumbling or hopping windows",
                nodes=[node_name],
            )
        if isinstance(window, SessionWindow):
            if merger is None:
                raise TopologyError(f"aggregate {node_name!r} over session windows needs merge=(key, older, newer)", nodes=[node_name])
        elif node_type is AggregateNode and merger is not None:
            raise TopologyError(f"aggregate {node_name!r}: merge= only applies to session windows", nodes=[node_name])
        else:
            merger = None
        store_name = check_name("store", store or node_name)
        store_kind = StoreKind.KEY_VALUE if window is None else StoreKind.SESSION if isinstance(window, SessionWindow) else StoreKind.WINDOW
        emitted_store = check_name("store", f"{store_name}-emit-final") if strategy is EmitStrategy.FINAL else None
        self._add(
            node_type(
                name=node_name,
                parents=(parent.name,),
                fn=fn,
                initial=initial,
                merger=merger,
                key_serde=serdes.WindowedKey(parent.key_serde) if window is not None else parent.key_serde,
                value_serde=value_serde,
                store=store_name,
                window=window,
                emit=strategy,
                emitted_store=emitted_store,
            )
        )
        if emitted_store is not None:
            self._add_store(Store(name=emitted_store, kind=StoreKind.KEY_VALUE, owner=node_name, key_serde=serdes.Bytes(), value_serde=serdes.Bytes()))
        self._add_store(
            Store(
                name=store_name,
                kind=store_kind,
                owner=node_name,
                key_serde=parent.key_serde,
                value_serde=value_serde,
                window=window,
                retention_ms=window.retention_ms if window is not None else None,
            )
        )
        return Table(self, node_name)

    def _cogroup(
        self,
        inputs: Sequence[tuple[Stream, Callable]],
        *,
        initial: Any,
        store: str | None,
        window: AggregationWindow | None,
        merge: Callable[[Any, Any, Any], Any] | None,
        value: Serde | None,
        name: str | None,
    ) -> Table:
        if not inputs:
            raise TopologyError(f"cogroup {name or store!r} has no input streams; add them with .cogroup(stream, fn)")
        parents = [self._stream(stream, "cogroup") for stream, _ in inputs]
        node_name = self._fresh_name(name or store, f"{parents[0].name}-cogroup")
        if window is not None and not isinstance(window, TumblingWindow | HoppingWindow | SlidingWindow | SessionWindow):
            raise TypeError(f"cogroup {node_name!r}: window must be a Tumbling, Hopping, Sliding or Session window, got {window!r}")
        _check_window(window, "cogroup", node_name)
        key_serde = parents[0].key_serde
        different = [parent.name for parent in parents if parent.key_serde != key_serde]
        if different:
            raise TopologyError(
                f"cogroup {node_name!r}: its streams must share one key serde (one store holds their keys), but "
                f"{different} use another than {parents[0].name!r} ({key_serde.name})",
                nodes=[node_name, parents[0].name, *different],
            )
        if isinstance(window, SessionWindow):
            if merge is None:
                raise TopologyError(f"cogroup {node_name!r} over session windows needs merge=(key, older, newer)", nodes=[node_name])
            merger: Callable[[Any, Any, Any], Any] | None = _callable(merge, "merger")
        elif merge is not None:
            raise TopologyError(f"cogroup {node_name!r}: merge= only applies to session windows", nodes=[node_name])
        else:
            merger = None
        store_name = check_name("store", store or node_name)
        value_serde = value or serdes.inferred_from(initial) or self.default_value_serde
        table_key_serde = serdes.WindowedKey(key_serde) if window is not None else key_serde
        step_names = [self._fresh_name(None, f"{node_name}-cogroup-agg-{index}") for index in range(len(inputs))]
        for step_name, parent, (_, fn) in zip(step_names, parents, inputs, strict=True):
            self._add(
                CogroupAggregateNode(
                    name=step_name,
                    parents=(parent.name,),
                    fn=fn,
                    initial=initial,
                    merger=merger,
                    key_serde=table_key_serde,
                    value_serde=value_serde,
                    store=store_name,
                    window=window,
                    cogroup=node_name,
                )
            )
        self._add(
            CogroupNode(
                name=node_name,
                parents=tuple(step_names),
                key_serde=table_key_serde,
                value_serde=value_serde,
                store=store_name,
                window=window,
                initial=initial,
                merger=merger,
            )
        )
        store_kind = StoreKind.KEY_VALUE if window is None else StoreKind.SESSION if isinstance(window, SessionWindow) else StoreKind.WINDOW
        self._add_store(
            Store(
                name=store_name,
                kind=store_kind,
                owner=node_name,
                key_serde=key_serde,
                value_serde=value_serde,
                window=window,
                retention_ms=window.retention_ms if window is not None else None,
            )
        )
        return Table(self, node_name)

    def _stream_table_join(
        self,
        node_name: str,
        left: Node,
        right: Table,
        window: JoinWindow | None,
        how: JoinHow,
        fn: Callable,
        value_serde: Serde,
        grace: Duration | None = None,
    ) -> Stream:
        table = self._table(right, "join")
        if window is not None:
            raise TopologyError(f"join {node_name!r}: a stream-table join takes no window", nodes=[node_name])
        if how is JoinHow.OUTER:
            raise TopologyError(f"join {node_name!r}: a stream-table join is inner or left, not outer", nodes=[node_name])
        if not is_table(table):
            raise TopologyError(f"join {node_name!r}: {table.name!r} is not a table", nodes=[node_name, table.name])
        if _table_window(self, table) is not None:
            raise TopologyError(
                f"join {node_name!r}: cannot join a stream with the windowed table {table.name!r}",
                nodes=[node_name, table.name],
            )
        table_store, view = self._table_rows(table, node_name)
        grace_ms = buffer_store = None
        if grace is not None:
            grace_ms = to_millis(grace, f"join {node_name!r} grace")
            history_ms = self._stores[table_store].history_ms
            if history_ms is None:
                raise TopologyError(
                    f"join {node_name!r}: a grace period needs a versioned table; declare {table.name!r} with app.table(..., versioned=...)",
                    nodes=[node_name, table.name],
                )
            if history_ms < grace_ms:
                raise TopologyError(
                    f"join {node_name!r}: grace {grace_ms} ms exceeds table {table.name!r}'s history of {history_ms} ms; "
                    "the history must cover the grace period (lookups reach that far back)",
                    nodes=[node_name, table.name],
                )
            buffer_store = f"{node_name}-buffer"
            # It keeps the stream's records: their key and value serdes.
            self._add_store(Store(name=buffer_store, kind=StoreKind.KEY_VALUE, owner=node_name, key_serde=left.key_serde, value_serde=left.value_serde))
        self._add(
            StreamTableJoinNode(
                name=node_name,
                parents=(left.name,),
                fn=fn,
                key_serde=left.key_serde,
                value_serde=value_serde,
                how=how,
                table=table.name,
                table_store=table_store,
                table_view=view,
                grace_ms=grace_ms,
                buffer_store=buffer_store,
            )
        )
        return Stream(self, node_name)

    def _stream_global_join(
        self,
        left: Stream,
        right: GlobalTable,
        *,
        window: JoinWindow | None,
        how: str,
        value: Serde | None,
        name: str | None,
        foreign_key: Callable[[Any, Any], Any] | None,
    ) -> Callable[[Callable], Stream]:
        if right.app is not self:
            raise MissingSourceError(f"join: global table {right.name!r} belongs to app {right.app.app_id!r}, not {self.app_id!r}", nodes=[right.name])

        def declare(fn: Callable) -> Stream:
            left_node = self._stream(left, "join")
            node_name = self._function_name(fn, name, left_node, "join")
            if window is not None:
                raise TopologyError(f"join {node_name!r}: a stream-global table join takes no window", nodes=[node_name])
            join_how = _join_how(how, node_name)
            if join_how is JoinHow.OUTER:
                raise TopologyError(f"join {node_name!r}: a stream-global table join is inner or left, not outer", nodes=[node_name])
            self._add(
                StreamGlobalJoinNode(
                    name=node_name,
                    parents=(left_node.name,),
                    fn=_callable(fn),
                    key_serde=left_node.key_serde,
                    value_serde=value or self.default_value_serde,
                    how=join_how,
                    global_table=right.name,
                    foreign_key=None if foreign_key is None else _callable(foreign_key, "foreign key extractor"),
                )
            )
            return Stream(self, node_name)

        return declare

    def _table_rows(self, table: Node, join_name: str) -> tuple[str, tuple[TableViewNode, ...]]:
        """Where a join reads ``table``'s rows: the store of its nearest materialized ancestor,
        through the steps computed on read from it."""
        stored, view = _materialized_ancestor(self, table)
        if not is_materialized(stored):
            raise TopologyError(
                f"join {join_name!r}: table {table.name!r} is computed on read from the table-table join {stored.name!r}, "
                f"which keeps no rows to look up; give {stored.name!r} store=",
                nodes=[join_name, stored.name],
            )
        return stores_of(stored)[0], view

    def _table_table_join(self, node_name: str, left: Node, right: Any, how: JoinHow, fn: Callable, value_serde: Serde, store: str | None) -> Table:
        right_node = self._table(right, "join")
        tables = {JoinSide.LEFT: left, JoinSide.RIGHT: right_node}
        for table in tables.values():
            if not is_table(table):
                raise TopologyError(f"join {node_name!r}: {table.name!r} ({table.kind}) is not a table a join can look up", nodes=[node_name, table.name])
            if _table_window(self, table) is not None:
                raise TopologyError(f"join {node_name!r}: cannot join the windowed table {table.name!r}", nodes=[node_name, table.name])
        store_name = None if store is None else check_name("store", store)
        side_names = {side: f"{node_name}-{side}" for side in tables}
        for side, this in tables.items():
            other = tables[JoinSide.RIGHT if side is JoinSide.LEFT else JoinSide.LEFT]
            other_store, other_view = self._table_rows(other, node_name)
            self._add(
                TableJoinSideNode(
                    name=side_names[side],
                    parents=(this.name,),
                    key_serde=left.key_serde,
                    value_serde=value_serde,
                    fn=fn,
                    how=how,
                    side=side,
                    this_table=this.name,
                    other_table=other.name,
                    other_store=other_store,
                    other_view=other_view,
                )
            )
        node = TableJoinNode(
            name=node_name,
            parents=(side_names[JoinSide.LEFT], side_names[JoinSide.RIGHT]),
            key_serde=left.key_serde,
            value_serde=value_serde,
            how=how,
            store=store_name,
        )
        self._add(node)
        if store_name is not None:
            self._add_store(Store(name=store_name, kind=StoreKind.KEY_VALUE, owner=node_name, key_serde=node.key_serde, value_serde=value_serde))
        return Table(self, node_name)

    def _foreign_key_join(
        self, node_name: str, left: Node, right: Any, how: JoinHow, fn: Callable, value_serde: Serde, store: str | None, extractor: Callable
    ) -> Table:
        right_node = self._table(right, "join")
        if how is JoinHow.OUTER:
            raise TopologyError(f"join {node_name!r}: a foreign-key join is inner or left, not outer", nodes=[node_name])
        for table in (left, right_node):
            if not is_table(table) or _table_window(self, table) is not None:
                raise TopologyError(
                    f"join {node_name!r}: {table.name!r} is not a table of plain keys a foreign-key join can look up", nodes=[node_name, table.name]
                )
        left_join = how is JoinHow.LEFT
        left_store, left_view = self._table_rows(left, node_name)
        foreign_store, foreign_view = self._table_rows(right_node, node_name)
        names = {part: check_name("node", f"{node_name}-{part}") for part in ("subscribe", "subscriptions", "foreign", "responses")}
        keys_store = check_name("store", f"{node_name}-foreign-keys")
        subscriptions_store = check_name("store", f"{node_name}-subscriptions-store")
        subscription_serde = fk.SubscriptionSerde(left.key_serde)
        response_serde = fk.ResponseSerde(right_node.value_serde)
        self._add(
            FkSubscribeNode(
                name=names["subscribe"],
                parents=(left.name,),
                key_serde=right_node.key_serde,
                value_serde=subscription_serde,
                fn=extractor,
                left_value_serde=left.value_serde,
                store=keys_store,
            )
        )
        self._add_store(Store(name=keys_store, kind=StoreKind.KEY_VALUE, owner=names["subscribe"], key_serde=left.key_serde, value_serde=serdes.Bytes()))
        self._add(
            FkSubscriptionsNode(
                name=names["subscriptions"],
                parents=(names["subscribe"],),
                key_serde=left.key_serde,
                value_serde=response_serde,
                store=subscriptions_store,
                foreign_table=right_node.name,
                foreign_store=foreign_store,
                foreign_view=foreign_view,
            )
        )
        self._add_store(
            Store(name=subscriptions_store, kind=StoreKind.KEY_VALUE, owner=names["subscriptions"], key_serde=serdes.Bytes(), value_serde=subscription_serde)
        )
        self._add(
            FkForeignUpdateNode(
                name=names["foreign"],
                parents=(right_node.name,),
                key_serde=left.key_serde,
                value_serde=response_serde,
                subscriptions_store=subscriptions_store,
                foreign_key_serde=right_node.key_serde,
            )
        )
        self._add(MergeNode(name=names["responses"], parents=(names["subscriptions"], names["foreign"]), key_serde=left.key_serde, value_serde=response_serde))
        store_name = None if store is None else check_name("store", store)
        self._add(
            FkJoinNode(
                name=node_name,
                parents=(names["responses"],),
                key_serde=left.key_serde,
                value_serde=value_serde,
                fn=fn,
                left_join=left_join,
                left_table=left.name,
                left_store=left_store,
                left_view=left_view,
                left_value_serde=left.value_serde,
                store=store_name,
            )
        )
        if store_name is not None:
            self._add_store(Store(name=store_name, kind=StoreKind.KEY_VALUE, owner=node_name, key_serde=left.key_serde, value_serde=value_serde))
        return Table(self, node_name)

    def _stream_stream_join(
        self,
        node_name: str,
        left: Node,
        right: Stream,
        window: JoinWindow | None,
        how: JoinHow,
        fn: Callable,
        value_serde: Serde,
    ) -> Stream:
        right_node = self._stream(right, "join")
        if not isinstance(window, JoinWindow):
            raise TopologyError(
                f"join {node_name!r}: a stream-stream join needs window=JoinWindow(...)",
                nodes=[node_name, left.name, right_node.name],
            )
        _check_window(window, "join", node_name)
        sides = {JoinSide.LEFT: left, JoinSide.RIGHT: right_node}
        side_names = {side: f"{node_name}-{side}" for side in sides}
        store_names = {side: f"{node_name}-{side}-store" for side in sides}
        # Left and outer joins hold their unmatched records until the window closes (Kafka
        # Streams >= 3.1), in one store both sides share.
        outer_store = None if how is JoinHow.INNER else check_name("store", f"{node_name}-outer-store")
        for side, input_node in sides.items():
            other = JoinSide.RIGHT if side is JoinSide.LEFT else JoinSide.LEFT
            self._add(
                StreamStreamJoinNode(
                    name=side_names[side],
                    parents=(input_node.name,),
                    fn=fn,
                    key_serde=left.key_serde,
                    value_serde=value_serde,
                    how=how,
                    side=side,
                    other=side_names[other],
                    window=window,
                    this_store=store_names[side],
                    other_store=store_names[other],
                    outer_store=outer_store,
                )
            )
        if outer_store is not None:
            self._add_store(
                Store(name=outer_store, kind=StoreKind.KEY_VALUE, owner=side_names[JoinSide.LEFT], key_serde=serdes.Bytes(), value_serde=serdes.Bytes())
            )
        for side, input_node in sides.items():
            self._add_store(
                Store(
                    name=check_name("store", store_names[side]),
                    kind=StoreKind.WINDOW,
                    owner=side_names[side],
                    key_serde=input_node.key_serde,
                    value_serde=input_node.value_serde,
                    window=window,
                    retention_ms=window.retention_ms,
                    retain_duplicates=True,
                )
            )
        self._add(
            MergeNode(
                name=node_name,
                parents=(side_names[JoinSide.LEFT], side_names[JoinSide.RIGHT]),
                key_serde=left.key_serde,
                value_serde=value_serde,
            )
        )
        return Stream(self, node_name)

    # --------------------------------------------------------------------------- helpers

    def to_spark(self, spark, **options):
        """This app as Spark Structured Streaming queries on ``spark`` (for spark-submit users);
        see ``pystreams.spark.to_spark`` for the options."""
        from pystreams.spark import to_spark

        return to_spark(self, spark, **options)


# --------------------------------------------------------------------------- handles
# A handle's fluent methods are the App's operations with the handle as their input:
# ``stream.count(...)`` is ``app.count(stream, ...)`` and ``stream.map(fn, ...)`` is
# ``app.map(stream, ...)(fn)``. They are built from the App methods, so each one keeps its App
# method's parameters, defaults and docstring for ``help()``, ``inspect.signature``, IDEs and mypy.

HandleT = TypeVar("HandleT", bound="_Handle | GroupedTable")
P = ParamSpec("P")
R = TypeVar("R")


class _Forward(Generic[HandleT, P, R]):
    """A handle's method built from an ``App`` operation (by ``_applied`` or ``_decorating``); a
    descriptor rather than the bare function so that the method learns its name and class when
    the class is created, for ``help()`` and tracebacks."""

    def __init__(self, method: Callable[Concatenate[HandleT, P], R], operation: Callable[..., Any], spelling: str) -> None:
        self._method = method
        self._operation = operation
        self._spelling = spelling

    def __set_name__(self, owner: type, name: str) -> None:
        self._method.__name__ = name
        self._method.__qualname__ = f"{owner.__qualname__}.{name}"
        handle = owner.__name__.lstrip("_").lower()
        self._method.__doc__ = (
            f"{self._spelling.format(handle=handle, method=name, operation=self._operation.__name__)}\n\n{inspect.cleandoc(self._operation.__doc__ or '')}"
        )

    @overload
    def __get__(self, handle: None, owner: type) -> Callable[Concatenate[HandleT, P], R]: ...

    @overload
    def __get__(self, handle: HandleT, owner: type) -> Callable[P, R]: ...

    def __get__(self, handle: HandleT | None, owner: type) -> Callable[..., R]:
        return self._method if handle is None else MethodType(self._method, handle)


def _applied(operation: Callable[Concatenate[App, HandleT, P], R]) -> _Forward[HandleT, P, R]:
    """The method ``handle.op(...)`` = ``app.op(handle, ...)``."""

    def method(handle: HandleT, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return operation(handle.app, handle, *args, **kwargs)

    _adopt_signature(method, operation, (), inspect.signature(operation).return_annotation)
    return _Forward(method, operation, "``{handle}.{method}(...)`` is ``app.{operation}({handle}, ...)``:")


def _decorating(operation: Callable[Concatenate[App, HandleT, P], Callable[[F], R]], *, takes: str = "fn") -> _Forward[HandleT, Concatenate[F, P], R]:
    """The method ``handle.op(fn, ...)`` = ``app.op(handle, ...)(fn)``, for an operation that
    returns a decorator; ``takes`` names the decorated argument."""

    def method(handle: HandleT, fn: F, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return operation(handle.app, handle, *args, **kwargs)(fn)

    # ``Callable[[Fn], Result]`` (annotations are strings in this module): what the decorator
    # takes becomes the method's first argument, what it returns the method's result.
    decorator = re.fullmatch(r"Callable\[\[(.+)\], (\w+)\]", inspect.signature(operation).return_annotation)
    assert decorator is not None, f"App.{operation.__name__} does not return a decorator"
    _adopt_signature(method, operation, (inspect.Parameter(takes, inspect.Parameter.POSITIONAL_ONLY, annotation=decorator[1]),), decorator[2])
    return _Forward(method, operation, f"``{{handle}}.{{method}}({takes}, ...)`` is ``app.{{operation}}({{handle}}, ...)({takes})``:")


def _adopt_signature(method: Callable[..., Any], operation: Callable[..., Any], leading: tuple[inspect.Parameter, ...], returns: Any) -> None:
    """Give ``method`` the signature of ``operation`` as a handle's method: ``self`` stands for
    the app and the handle, ``leading`` comes next (a variadic first input stays: ``merge``)."""
    parameters = list(inspect.signature(operation).parameters.values())
    rest = parameters[1:] if parameters[1].kind is inspect.Parameter.VAR_POSITIONAL else parameters[2:]
    self_kind = inspect.Parameter.POSITIONAL_ONLY if leading else inspect.Parameter.POSITIONAL_OR_KEYWORD
    signature = inspect.Signature([inspect.Parameter("self", self_kind), *leading, *rest], return_annotation=returns)
    method.__signature__ = signature  # type: ignore[attr-defined]
    method.__annotations__ = {p.name: p.annotation for p in signature.parameters.values() if p.annotation is not p.empty} | {"return": returns}


class _Handle:
    """A named node of one app; what decorators and fluent methods build on."""

    __slots__ = ("app", "name")

    def __init__(self, app: App, name: str) -> None:
        self.app = app
        self.name = name

    @property
    def node(self) -> Node:
        """The node as declared (before the builder wires children and sub-topologies)."""
        return self.app._nodes[self.name]

    to = _applied(App.to)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} of app {self.app.app_id!r}>"


class Stream(_Handle):
    """A record stream. Methods mirror the ``App`` decorators, taking the function first."""

    __slots__ = ()

    map = _decorating(App.map)
    map_values = _decorating(App.map_values)
    flat_map = _decorating(App.flat_map)
    flat_map_values = _decorating(App.flat_map_values)
    filter = _decorating(App.filter)
    filter_not = _decorating(App.filter_not)
    peek = _decorating(App.peek)
    group_by = _decorating(App.group_by)
    merge = _applied(App.merge)
    repartition = _applied(App.repartition)
    count = _applied(App.count)
    aggregate = _decorating(App.aggregate)
    reduce = _decorating(App.reduce)
    process = _decorating(App.processor, takes="processor_class")
    select_key = _decorating(App.select_key)
    group_by_key = _applied(App.group_by_key)

    # Written out where the fluent spelling is not the App method's with the stream in front.

    def branch(self, fn: Callable, branches: Sequence[str], **options: Any) -> Branches:
        """``app.branch(stream, branches=branches, ...)(fn)``, the labels also by position."""
        return self.app.branch(self, branches=branches, **options)(fn)

    def join(self, other: Stream | Table | GlobalTable, fn: Callable, **options: Any) -> Stream:
        """``app.join(stream, other, ...)(fn)``: the other side comes before the joiner."""
        return self.app.join(self, other, **options)(fn)

    def cogroup(self, fn: Callable) -> CogroupedStreams:
        """This stream as the first input of a cogroup, aggregated by ``fn(acc, key, value)``;
        add more with ``.cogroup(stream, fn)``, then ``.aggregate(initial=...)``."""
        return self.app.cogroup().cogroup(self, fn)


#: What a grouped stream is for (Kafka Streams' KGroupedStream); anything else uses it as the
#: re-keyed stream it is, deprecated.
_GROUPED_STREAM_OPERATIONS = frozenset({"count", "aggregate", "reduce", "cogroup", "group_by_key"})


class GroupedStream(Stream):
    """A stream grouped for an aggregation (Kafka Streams' ``KGroupedStream``): by
    ``group_by``'s new keys, or by its own (``group_by_key``). ``count``, ``aggregate``,
    ``reduce`` and ``cogroup`` take it; anything else still treats it as the re-keyed stream
    it is, with a DeprecationWarning pointing at ``select_key``."""

    __slots__ = ()


class Table(_Handle):
    """A table: the latest value per key, kept in a store (``store``), or computed on read
    from its parent table's (``store`` is None: a filter or map_values without ``store=``)."""

    __slots__ = ()

    @property
    def store(self) -> str | None:
        node = self.node
        return stores_of(node)[0] if is_materialized(node) or isinstance(node, SuppressNode) else None

    @property
    def windowed(self) -> bool:
        return _table_window(self.app, self.node) is not None

    to_stream = _applied(App.to_stream)
    suppress = _applied(App.suppress)

    def filter(self, fn: Callable, *, name: str | None = None, store: str | None = None) -> Table:
        """``app.filter(table, ...)(fn)``: the rows ``fn(key, value)`` is true for."""
        return self.app.filter(self, name=name, store=store)(fn)

    def filter_not(self, fn: Callable, *, name: str | None = None, store: str | None = None) -> Table:
        """``app.filter_not(table, ...)(fn)``: the rows ``fn(key, value)`` is false for."""
        return self.app.filter_not(self, name=name, store=store)(fn)

    def map_values(self, fn: Callable, *, value: Serde | None = None, name: str | None = None, store: str | None = None) -> Table:
        """``app.map_values(table, ...)(fn)``: a table of ``fn(key, value)``."""
        return self.app.map_values(self, value=value, name=name, store=store)(fn)

    def group_by(self, fn: Callable, *, key: Serde | None = None, value: Serde | None = None, name: str | None = None) -> GroupedTable:
        """``app.group_by(table, ...)(fn)``: rows re-keyed by ``fn(key, value) -> (key, value)``."""
        return self.app.group_by(self, key=key, value=value, name=name)(fn)

    def join(
        self,
        other: Table,
        fn: Callable,
        *,
        how: str = "inner",
        value: Serde | None = None,
        name: str | None = None,
        store: str | None = None,
        foreign_key: Callable[[Any, Any], Any] | None = None,
    ) -> Table:
        """``app.join(table, other, ...)(fn)``: a table–table join on the key — or, with
        ``foreign_key=fn(key, value)``, on the right key each left row names — ``fn(key,
        left_value, right_value)`` per joined row."""
        return self.app.join(self, other, how=how, value=value, name=name, store=store, foreign_key=foreign_key)(fn)


class GlobalTable:
    """A table every worker holds whole (``app.global_table``): join streams with it
    (``stream.join(global_table, fn, foreign_key=...)``) and query it on any worker. It is no
    node of the graph, so it has no steps of its own."""

    __slots__ = ("app", "name")

    def __init__(self, app: App, name: str) -> None:
        self.app = app
        self.name = name

    @property
    def store(self) -> str:
        return self.name

    @property
    def topic(self) -> str:
        return self.app._global_tables[self.name].topic

    def __repr__(self) -> str:
        return f"<GlobalTable {self.name!r} of {self.topic!r}>"


class GroupedTable:
    """A table's rows re-keyed by ``group_by`` (Kafka Streams' ``KGroupedTable``), on their way
    into ``count``, ``reduce`` or ``aggregate``; each takes a subtractor, since a changed row
    leaves its old group."""

    __slots__ = ("app", "name")

    def __init__(self, app: App, name: str) -> None:
        self.app = app
        self.name = name

    @property
    def node(self) -> Node:
        return self.app._nodes[self.name]

    def count(self, *, store: str | None = None, name: str | None = None) -> Table:
        return self.app.count(self, store=store, name=name)

    def reduce(self, adder: Callable, subtractor: Callable, *, store: str | None = None, name: str | None = None) -> Table:
        """``adder(acc, key, value)`` / ``subtractor(acc, key, value)``; a group's first value
        is its accumulator."""
        return self.app.reduce(self, subtractor=subtractor, store=store, name=name)(adder)

    def aggregate(
        self, initial: Any, adder: Callable, subtractor: Callable, *, value: Serde | None = None, store: str | None = None, name: str | None = None
    ) -> Table:
        """``adder(acc, key, value)`` / ``subtractor(acc, key, value)`` from ``initial``."""
        return self.app.aggregate(self, initial=initial, subtractor=subtractor, value=value, store=store, name=name)(adder)

    def __repr__(self) -> str:
        return f"<GroupedTable {self.name!r} of app {self.app.app_id!r}>"


class CogroupedStreams:
    """Several streams, each with its own aggregator, on their way into one aggregate with one
    store (Kafka Streams' ``cogroup``). Nothing is declared until ``aggregate``.

        activity = app.cogroup()

        @activity.cogroup(clicks)
        def clicked(total, key, click):
            return total + 1

        @activity.cogroup(purchases)
        def bought(total, key, purchase):
            return total + purchase["amount"]

        totals = activity.aggregate(initial=0, store="activity", window=TumblingWindow(60_000))

    or, fluently: ``clicks.cogroup(clicked).cogroup(purchases, bought).aggregate(initial=0)``.
    Every stream is grouped by its current key (a re-keyed one is repartitioned first), the
    streams must be co-partitioned and have the same key serde, and each record is aggregated
    by its own stream's function into the key's (window's) one accumulator.
    """

    def __init__(self, app: App) -> None:
        self.app = app
        self._inputs: list[tuple[Stream, Callable]] = []

    def cogroup(self, stream: Stream, fn: Callable | None = None) -> Any:
        """Add ``stream``, aggregated by ``fn(acc, key, value)``. With ``fn``: returns this
        cogroup (to chain); without: a decorator that adds the function it decorates (and
        returns it unchanged)."""
        self.app._stream(stream, "cogroup")
        if any(existing.name == stream.name for existing, _ in self._inputs):
            raise TopologyError(f"cogroup: stream {stream.name!r} is already one of its inputs", nodes=[stream.name])
        if fn is None:

            def add(function: Callable) -> Callable:
                self._inputs.append((stream, _callable(function, "cogroup aggregator")))
                return function

            return add
        self._inputs.append((stream, _callable(fn, "cogroup aggregator")))
        return self

    def aggregate(
        self,
        *,
        initial: Any,
        store: str | None = None,
        window: AggregationWindow | None = None,
        merge: Callable[[Any, Any, Any], Any] | None = None,
        value: Serde | None = None,
        name: str | None = None,
    ) -> Table:
        """Declare the cogroup: one accumulator per key (per window with ``window``), from
        ``initial`` (a value, or a zero-argument factory), updated by each input's function.
        Session windows need ``merge(key, older, newer)``."""
        return self.app._cogroup(self._inputs, initial=initial, store=store, window=window, merge=merge, value=value, name=name)


class Branches(Mapping[str, Stream]):
    """The streams of a ``branch``, by label: ``branches["big"]`` or ``branches.big``."""

    def __init__(self, streams: dict[str, Stream]) -> None:
        self._streams = streams

    def __getitem__(self, label: str) -> Stream:
        return self._streams[label]

    def __getattr__(self, label: str) -> Stream:
        try:
            return self._streams[label]
        except KeyError:
            raise AttributeError(f"no branch {label!r}; branches are {sorted(self._streams)}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._streams)

    def __len__(self) -> int:
        return len(self._streams)


class _Negated:
    """``filter_not``'s predicate: the user's, negated, keeping its name for the node."""

    __slots__ = ("__name__", "fn")

    def __init__(self, fn: Callable) -> None:
        self.fn = fn
        self.__name__ = getattr(fn, "__name__", "filter_not")

    def __call__(self, key: Any, value: Any) -> bool:
        return not self.fn(key, value)


def _materialized_ancestor(app: App, table: Node) -> tuple[Node, tuple[TableViewNode, ...]]:
    """The nearest table at or above ``table`` that keeps a store, and the steps computed on
    read from it down to ``table`` (Kafka Streams' value getter chain), in order."""
    view: list[TableViewNode] = []
    node = table
    while isinstance(node, TableFilterNode | TableMapValuesNode) and node.store is None:
        view.append(node)
        node = app._nodes[node.parents[0]]
    return node, tuple(reversed(view))


def _table_window(app: App, table: Node) -> Any:
    """The window of a table's keys: its own, or its nearest windowed ancestor's through the
    row-by-row table steps, which keep keys."""
    node = table
    while isinstance(node, TableFilterNode | TableMapValuesNode):
        node = app._nodes[node.parents[0]]
    return window_of(node)


def _callable(fn: Any, what: str = "function") -> Callable:
    """Check that ``fn`` is a plain synchronous callable: runtimes call it inline, per record."""
    if not callable(fn):
        raise TypeError(f"expected a {what}, got {fn!r}")
    if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
        raise TypeError(f"{what} {getattr(fn, '__name__', fn)!r} is async; pystreams functions are plain synchronous callables")
    return fn


def _check_window(window: AggregationWindow | JoinWindow | None, kind: str, node_name: str) -> None:
    """Refuse a window spec that cannot work (a size of zero, a negative grace, ...), naming
    the node declared with it."""
    if window is None:
        return
    problems = window_problems(window)
    if problems:
        raise TopologyError(f"{kind} {node_name!r}: {'; '.join(problems)}", nodes=[node_name])


def _keeps_keys(key: Serde | None, key_changing: bool) -> bool:
    """A map promising unchanged keys keeps its input's key serde unless it names one."""
    return key is None and not key_changing


def _policy(policy: str, what: str) -> ErrorPolicy:
    try:
        return ErrorPolicy(policy)
    except ValueError:
        raise TopologyError(f"{what} must be one of {[p.value for p in ErrorPolicy]}, got {policy!r}") from None


def _join_how(how: str, node_name: str) -> JoinHow:
    try:
        return JoinHow(how)
    except ValueError:
        raise TopologyError(f"join {node_name!r}: how must be one of {[h.value for h in JoinHow]}, got {how!r}", nodes=[node_name]) from None
