"""The topology IR: what an app *is*, as plain frozen data both runtimes consume.

A ``Topology`` is a graph of nodes (sources, processors, sinks) grouped into
``SubTopology`` s, plus the ``Store`` s the nodes use and the internal topics the app needs.
Sub-topologies are the connected parts of the graph once it is cut at repartition topics; a
*task* is one sub-topology working on one partition number, ``TaskId(subtopology, partition)``.

Partition counts are unknown until run time (they come from the cluster), so the IR only
states *constraints*: which topics must be co-partitioned, and how each internal topic's count
follows from its sub-topology's inputs. ``pystreams.topology.resolve.resolve`` turns a
topology plus the cluster's partition counts into tasks and concrete counts.

A node is one small frozen type per kind (``MapNode``, ``AggregateNode``, ...: the union
``Node``) holding only the fields its kind uses; code dispatches with ``match`` on the type,
which narrows it, and a node's ``kind`` (``"map"``, ``"aggregate"``) is only the type's name,
for people and for the topology hash. Callables (the user's functions, timestamp extractors,
processor classes) are held by reference; nothing here is serialized. The topology hash covers
structure only. The rules each kind follows live in ``pystreams.topology.kernels``, which
both runtimes wrap.

How a runtime executes each node kind (named here in capitals: ``BRANCH_OUTPUT`` is
``BranchOutputNode``; ``key``/``value`` are deserialized objects; a record
also carries a timestamp, inherited by every record derived from it):

=====================  ===========================================================================
kind                   behaviour, and the signature of ``fn``
=====================  ===========================================================================
SOURCE                 reads ``topics`` (or topics matching ``pattern``), deserializes with
                       ``key_serde``/``value_serde``; the timestamp is
                       ``timestamp_extractor(key, value, record_timestamp_ms)`` if set, else the
                       record's own. ``internal`` sources read repartition topics.
TABLE_SOURCE           as SOURCE, then upserts ``key -> value`` into ``stores[0]`` (deletes on a
                       ``None`` value) and forwards the update.
SINK                   serializes with its serdes and produces to ``topics[0]`` using Kafka's
                       default partitioner (murmur2 of the key bytes), so Java clients agree.
MAP                    ``fn(key, value) -> (key, value)``
MAP_VALUES             ``fn(key, value) -> value``
FLAT_MAP               ``fn(key, value) -> iterable of (key, value)``
FLAT_MAP_VALUES        ``fn(key, value) -> iterable of value``
FILTER                 ``fn(key, value) -> bool``; forwards when true
PEEK                   ``fn(key, value) -> None``; forwards unchanged
SELECT_KEY             ``fn(key, value) -> new key`` (``group_by``); forwards ``(new key, value)``
BRANCH                 ``fn(key, value) -> label or None``; forwards to the child BRANCH_OUTPUT whose
                       ``label`` matches (``None`` drops the record)
BRANCH_OUTPUT          forwards unchanged (it only exists so each branch is a named stream)
MERGE                  forwards records from every parent unchanged
TO_STREAM              forwards a table's updates as a stream
TABLE_FILTER           a table of the parent table's rows for which ``fn(key, value)`` is true
                       (false with ``keep=False``: ``filter_not``); a row filtered out is a
                       tombstone. With ``store`` (materialized) it keeps its rows there and sends a
                       tombstone only for a key it held; without, it forwards one per filtered-out
                       update, and lookups compute it on read from the parent's store
TABLE_MAP_VALUES       a table of ``fn(key, value)`` per row of the parent table (tombstones pass
                       as tombstones, ``fn`` is not called); ``store`` as for TABLE_FILTER
COUNT                  like AGGREGATE with ``initial=0`` and ``fn=acc+1``; both are filled in so a
                       runtime may treat COUNT as AGGREGATE
AGGREGATE              ``acc = fn(acc, key, value)`` with ``acc`` starting at ``initial`` (or
                       ``initial()`` when callable); stores in ``stores[0]``; forwards
                       ``(key, acc)``, or ``(Windowed(key, start, end), acc)`` per window when
                       ``window`` is set. Session windows merge with ``merger(key, older, newer)``.
                       ``emit=final`` (windowed only): nothing per update; each window's value
                       once, when it closes, from the store (``emitted_store`` keeps how far).
REDUCE                 like AGGREGATE, but the first value of a key is the accumulator itself
COGROUP_AGGREGATE      one input of a cogroup: like AGGREGATE with its own ``fn``, into the store
                       of its COGROUP node (shared by every input); forwards nothing
COGROUP                the cogroup's table: owns the store its COGROUP_AGGREGATE parents write and
                       forwards its updates as an aggregation's table does
STREAM_TABLE_JOIN      looks the record's key up in the table's store (``table_store``), through
                       ``table_view`` when the table is computed on read (an unmaterialized
                       TABLE_FILTER / TABLE_MAP_VALUES chain over that store) — in a versioned
                       table, the value as of the record's timestamp; forwards
                       ``(key, fn(key, value, table_value))``; an inner join drops misses,
                       a left join calls ``fn`` with ``None`` (a null-key record too, KIP-962).
                       Table updates trigger nothing. With ``grace_ms`` (versioned tables) records
                       wait in ``buffer_store`` until stream time passes their time + grace.
STREAM_GLOBAL_JOIN     looks ``foreign_key(key, value)`` (the record's key when None) up in the
                       global table ``global_table`` (every worker holds all of it); forwards
                       ``(key, fn(key, value, row))``; an inner join drops misses and a left
                       join calls ``fn`` with None. A null foreign key skips the record, counted
                       as a null key, except that a left join joins a null-key record whose
                       foreign key is null with None (Kafka Streams' KStreamGlobalKTableJoin).
STREAM_STREAM_JOIN     one node per side (``side``): stores the record in ``this_store``,
                       looks up ``other_store`` within ``window`` and forwards
                       ``(key, fn(key, left_value, right_value))``. A left or outer join holds a
                       record that met no partner in ``outer_store`` and emits it with None once
                       its window closes, unless a partner comes first (Kafka Streams >= 3.1).
                       The two sides feed a MERGE node that carries the join's name.
TABLE_JOIN_SIDE        one side of a table–table join: on an update of its table (``this_table``),
                       reads the other table's row (``other_store`` through ``other_view``) and
                       forwards the join's row for the key (``table_join_row``), or nothing
                       when the join had no row to change; feeds the join's TABLE_JOIN
TABLE_JOIN             the table a table–table join makes of its two sides' rows; ``store`` as
                       for TABLE_FILTER (a join computed on read cannot be looked up downstream)
TABLE_GROUP_BY         ``fn(key, value) -> (new key, new value)`` per row of the parent table
                       (Kafka Streams' ``KTable.groupBy``); keeps each row's pair in ``store``
                       and forwards ``(new key, (new value, old value))`` — one record when
                       the key stays, else ``(old key, (None, old))`` then ``(new key, (new,
                       None))`` — for the repartition topic (serde ``Change``)
TABLE_AGGREGATE        a grouped table's ``count`` / ``reduce`` / ``aggregate``: per ``(new,
                       old)`` it subtracts ``old`` (``subtractor(acc, key, old)``), then adds
                       ``new`` (``adder(acc, key, new)``, from ``initial`` — or ``new`` itself
                       when ``reduce`` — when there is no accumulator); keeps it in ``store``
FK_SUBSCRIBE           a foreign-key join's left side: per left row, ``fn(value)`` is its foreign
                       key; forwards ``(foreign key, Subscription)`` records (rules in
                       ``pystreams.topology.foreign_key``) for the registration repartition
                       topic; ``store`` keeps each left key's last foreign key
FK_SUBSCRIPTIONS       the right side: keeps the subscriptions (``store``), looks the right row
                       up (``foreign_store`` through ``foreign_view``) and forwards
                       ``(left key, SubscriptionResponse)``
FK_FOREIGN_UPDATE      the right side: on a right row's update, answers every subscriber of it
FK_JOIN                the join's table: answers (through the response repartition topic) whose
                       hash matches the current left row (``left_store`` through ``left_view``)
                       become its rows; ``store`` as for TABLE_FILTER
SUPPRESS               a table's updates held in a changelogged buffer (``stores[0]``) and
                       emitted when the ``suppression`` says (until the window closes, or
                       until a time limit / a full buffer)
PROCESSOR              ``fn`` is a ``Processor`` subclass: one instance per task, ``init(context)``,
                       ``process(key, value)``, ``close()``; ``punctuations`` name methods to call
                       with a timestamp on stream time or wall-clock time.
=====================  ===========================================================================

Window stores for stream–stream joins keep duplicates (several records per key and time);
aggregation window stores keep one value per (key, window).
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeAlias
from uuid import UUID

from pystreams.serdes import Serde

from .suppress import Suppression
from .windows import AggregationWindow, JoinWindow, SlidingWindow, Window


class EmitStrategy(enum.StrEnum):
    """When a windowed aggregation emits (Kafka Streams' ``EmitStrategy``, KIP-825):
    ``update``, every change of a window, folded per commit; ``final``, one result per window
    when it closes."""

    UPDATE = "update"
    FINAL = "final"


class StoreKind(enum.StrEnum):
    KEY_VALUE = "key-value"
    WINDOW = "window"
    SESSION = "session"


class JoinKind(enum.StrEnum):
    STREAM_TABLE = "stream-table"
    STREAM_STREAM = "stream-stream"


class JoinHow(enum.StrEnum):
    INNER = "inner"
    LEFT = "left"
    OUTER = "outer"


class JoinSide(enum.StrEnum):
    LEFT = "left"
    RIGHT = "right"


class PunctuationType(enum.StrEnum):
    #: Fires as stream time (the highest record timestamp a task has seen) advances.
    STREAM_TIME = "stream-time"
    #: Fires on the worker's clock, even when no records arrive.
    WALL_CLOCK_TIME = "wall-clock-time"


class ErrorPolicy(enum.StrEnum):
    """What a record that cannot be deserialized or processed does, with Kafka Streams'
    handlers' meanings: ``fail`` stops processing (nothing after the last commit is committed;
    the task's next owner meets the record again), ``log-and-continue`` logs and skips it,
    ``dead-letter`` writes its original bytes to the dead-letter topic, with headers saying
    where it came from and why, then skips it."""

    FAIL = "fail"
    LOG_AND_CONTINUE = "log-and-continue"
    DEAD_LETTER = "dead-letter"


@dataclass(frozen=True, slots=True)
class ErrorPolicies:
    """An app's error policies: Kafka Streams' ``default.deserialization.exception.handler``,
    ``processing.exception.handler`` and ``errors.dead.letter.queue.topic.name``, plus a
    deserialization policy of its own per source node (``sources``), which wins over the
    app's for that source's records. Runtime settings (``pystreams worker
    --deserialization-errors ...``) replace the app's defaults, not a source's own policy."""

    deserialization: ErrorPolicy = ErrorPolicy.FAIL
    processing: ErrorPolicy = ErrorPolicy.FAIL
    dead_letter_topic: str | None = None
    sources: Mapping[str, ErrorPolicy] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("deserialization", "processing"):
            object.__setattr__(self, name, ErrorPolicy(getattr(self, name)))
        object.__setattr__(self, "sources", {node: ErrorPolicy(p) for node, p in self.sources.items()})

    def check(self) -> None:
        """Runtimes call this before running: the dead-letter policy needs its topic, which
        may come from the app or from the command line."""
        dead_letters = [self.deserialization, self.processing, *self.sources.values()]
        if ErrorPolicy.DEAD_LETTER in dead_letters and not self.dead_letter_topic:
            from .errors import TopologyError

            raise TopologyError("the dead-letter error policy needs a dead-letter topic (--dead-letter-topic, or dead_letter_topic= in App(...))")

    def deserialization_policy(self, source_node: str | None) -> ErrorPolicy:
        return self.sources.get(source_node, self.deserialization) if source_node else self.deserialization

    def overridden(
        self,
        *,
        deserialization: ErrorPolicy | str | None = None,
        processing: ErrorPolicy | str | None = None,
        dead_letter_topic: str | None = None,
    ) -> ErrorPolicies:
        """These policies with the app-wide ones given here replaced (None: kept)."""
        return ErrorPolicies(
            deserialization=ErrorPolicy(deserialization) if deserialization is not None else self.deserialization,
            processing=ErrorPolicy(processing) if processing is not None else self.processing,
            dead_letter_topic=dead_letter_topic if dead_letter_topic is not None else self.dead_letter_topic,
            sources=self.sources,
        )


class TopicRole(enum.StrEnum):
    SOURCE = "source"
    SINK = "sink"
    REPARTITION = "repartition"
    CHANGELOG = "changelog"


@dataclass(frozen=True, slots=True)
class Punctuation:
    """Call ``processor.<method>(timestamp_ms)`` every ``interval_ms`` of ``type`` time."""

    method: str
    interval_ms: int
    type: PunctuationType


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeBase:
    """What every node has; each kind below adds only the fields it uses. Serdes describe the
    records a node *emits* (for a sink: the records it writes; for a source: the records it
    reads). Code that needs a kind's fields matches on the node's type (``match node: case
    AggregationNode(): ...``), which narrows it; a field several kinds share has a function
    over the union below (``stores_of``, ``window_of``, ...)."""

    #: The kind's name for people and for the topology hash, derived from the type
    #: (``MapValuesNode`` -> ``"map-values"``); code dispatches on the type, not on this.
    kind: ClassVar[str]
    name: str
    key_serde: Serde
    value_serde: Serde
    parents: tuple[str, ...] = ()
    children: tuple[str, ...] = ()
    #: The sub-topology id; -1 in declarations, before the builder assigns it.
    subtopology: int = -1

    def __init_subclass__(cls) -> None:
        # No super() call: the slots dataclass is a copy of the class, which zero-argument
        # super() does not know; object's hook does nothing anyway.
        cls.kind = re.sub(r"(?<!^)(?=[A-Z])", "-", cls.__name__.removesuffix("Node")).lower()


@dataclass(frozen=True, slots=True, kw_only=True)
class SourceNode(NodeBase):
    """Reads ``topics``, or every topic matching the RE2 ``pattern`` (then ``topics`` is empty);
    ``internal`` sources read repartition topics."""

    topics: tuple[str, ...] = ()
    pattern: str | None = None
    timestamp_extractor: Callable[[Any, Any, int], int] | None = None
    internal: bool = False
    partitions: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class TableSourceNode(NodeBase):
    topic: str
    store: str
    timestamp_extractor: Callable[[Any, Any, int], int] | None = None

    @property
    def topics(self) -> tuple[str, ...]:
        return (self.topic,)

    @property
    def stores(self) -> tuple[str, ...]:
        return (self.store,)


@dataclass(frozen=True, slots=True, kw_only=True)
class SinkNode(NodeBase):
    topic: str
    #: A repartition topic's sink.
    internal: bool = False
    partitions: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class MapNode(NodeBase):
    fn: Callable[..., Any]
    key_changing: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class MapValuesNode(NodeBase):
    fn: Callable[..., Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class FlatMapNode(NodeBase):
    fn: Callable[..., Any]
    key_changing: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class FlatMapValuesNode(NodeBase):
    fn: Callable[..., Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class FilterNode(NodeBase):
    fn: Callable[..., Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class PeekNode(NodeBase):
    fn: Callable[..., Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class SelectKeyNode(NodeBase):
    fn: Callable[..., Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class BranchNode(NodeBase):
    fn: Callable[..., Any]
    #: The labels ``fn`` may return, one BRANCH_OUTPUT child each.
    branches: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class BranchOutputNode(NodeBase):
    label: str


@dataclass(frozen=True, slots=True, kw_only=True)
class MergeNode(NodeBase):
    """Forwards records from every parent unchanged."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ToStreamNode(NodeBase):
    """Forwards a table's updates as a stream."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TableFilterNode(NodeBase):
    """Kafka Streams' ``KTable.filter`` (``keep``) and ``filterNot`` (not ``keep``); kept in
    ``store`` when materialized, else computed from the parent table on read."""

    fn: Callable[..., Any]
    keep: bool = True
    store: str | None = None

    @property
    def stores(self) -> tuple[str, ...]:
        return () if self.store is None else (self.store,)


@dataclass(frozen=True, slots=True, kw_only=True)
class TableMapValuesNode(NodeBase):
    """Kafka Streams' ``KTable.mapValues``; ``store`` as for TABLE_FILTER."""

    fn: Callable[..., Any]
    store: str | None = None

    @property
    def stores(self) -> tuple[str, ...]:
        return () if self.store is None else (self.store,)


#: A table computed on read from its parent's (a value getter's step, in Kafka Streams' terms).
TableViewNode: TypeAlias = TableFilterNode | TableMapValuesNode


@dataclass(frozen=True, slots=True, kw_only=True)
class TableJoinSideNode(NodeBase):
    """One side (``side``) of a table–table join on the same key: its parent is its table
    (``this_table``); it reads the other table's rows from ``other_store`` through
    ``other_view`` and feeds the join's TABLE_JOIN node."""

    fn: Callable[..., Any]
    how: JoinHow
    side: JoinSide
    this_table: str
    other_table: str
    other_store: str
    other_view: tuple[TableViewNode, ...] = ()

    @property
    def stores(self) -> tuple[str, ...]:
        return (self.other_store,)


@dataclass(frozen=True, slots=True, kw_only=True)
class TableJoinNode(NodeBase):
    """The table a table–table join makes (Kafka Streams' ``KTable.join`` / ``leftJoin`` /
    ``outerJoin``): its parents are the two TABLE_JOIN_SIDE nodes; kept in ``store`` when
    materialized."""

    how: JoinHow
    store: str | None = None

    @property
    def stores(self) -> tuple[str, ...]:
        return () if self.store is None else (self.store,)


@dataclass(frozen=True, slots=True, kw_only=True)
class TableGroupByNode(NodeBase):
    """Kafka Streams' ``KTable.groupBy``: re-keys a table's rows with ``fn(key, value) ->
    (key, value)``; ``store`` keeps each row's last pair, which an update subtracts."""

    fn: Callable[..., Any]
    store: str

    @property
    def stores(self) -> tuple[str, ...]:
        return (self.store,)


@dataclass(frozen=True, slots=True, kw_only=True)
class TableAggregateNode(NodeBase):
    """Kafka Streams' ``KGroupedTable.count`` / ``reduce`` / ``aggregate`` (``reduce``: a
    key's first value is its accumulator, ``initial`` is unused), kept in ``store``."""

    adder: Callable[..., Any]
    subtractor: Callable[..., Any]
    store: str
    initial: Any = None
    reduce: bool = False

    @property
    def stores(self) -> tuple[str, ...]:
        return (self.store,)


@dataclass(frozen=True, slots=True, kw_only=True)
class FkSubscribeNode(NodeBase):
    """A foreign-key join's left side (Kafka Streams' SubscriptionSendProcessor)."""

    fn: Callable[..., Any]
    #: The left table's value serde: the hash covers its bytes.
    left_value_serde: Any
    store: str

    @property
    def stores(self) -> tuple[str, ...]:
        return (self.store,)


@dataclass(frozen=True, slots=True, kw_only=True)
class FkSubscriptionsNode(NodeBase):
    """A foreign-key join's right side, on subscriptions (SubscriptionReceive + Join)."""

    store: str
    foreign_table: str
    foreign_store: str
    foreign_view: tuple[TableViewNode, ...] = ()

    @property
    def stores(self) -> tuple[str, ...]:
        return (self.store, self.foreign_store)


@dataclass(frozen=True, slots=True, kw_only=True)
class FkForeignUpdateNode(NodeBase):
    """A foreign-key join's right side, on right rows (ForeignTableJoin): reads the
    subscriptions ``subscriptions_store``."""

    subscriptions_store: str
    #: The right table's key serde (the subscriptions are kept by its bytes).
    foreign_key_serde: Any = None

    @property
    def stores(self) -> tuple[str, ...]:
        return (self.subscriptions_store,)


@dataclass(frozen=True, slots=True, kw_only=True)
class FkJoinNode(NodeBase):
    """A foreign-key join's table (ResponseJoin): ``fn(key, left, right)`` per answer that is
    not stale."""

    fn: Callable[..., Any]
    left_join: bool
    left_table: str
    left_store: str
    left_view: tuple[TableViewNode, ...] = ()
    left_value_serde: Any = None
    store: str | None = None

    @property
    def stores(self) -> tuple[str, ...]:
        return (self.left_store,) if self.store is None else (self.store, self.left_store)


@dataclass(frozen=True, slots=True, kw_only=True)
class RepartitionNode(NodeBase):
    """Only in declarations: the builder replaces it with a repartition sink + source pair."""

    partitions: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class AggregationNode(NodeBase):
    """COUNT, AGGREGATE and REDUCE: ``fn(acc, key, value) -> acc`` per key (per window with
    ``window``), kept in ``store``."""

    fn: Callable[..., Any]
    store: str
    window: AggregationWindow | None = None
    #: The starting accumulator, or a zero-argument factory of it (REDUCE has none).
    initial: Any = None
    #: Session windows: ``merger(key, older, newer) -> merged``.
    merger: Callable[[Any, Any, Any], Any] | None = None
    emit: EmitStrategy = EmitStrategy.UPDATE
    #: ``emit=final``: the key-value store keeping the node's stream time, hence which
    #: windows have had their final result emitted (Kafka Streams keeps it as processor
    #: metadata committed with the offsets; here it is changelogged with the window store).
    emitted_store: str | None = None

    @property
    def stores(self) -> tuple[str, ...]:
        return (self.store,) if self.emitted_store is None else (self.store, self.emitted_store)

    @property
    def emits_final(self) -> bool:
        return self.emit is EmitStrategy.FINAL


@dataclass(frozen=True, slots=True, kw_only=True)
class CountNode(AggregationNode):
    """Records per key: an aggregation with ``initial=0`` and ``fn=acc+1``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AggregateNode(AggregationNode):
    """``acc = fn(acc, key, value)`` from ``initial``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ReduceNode(AggregationNode):
    """Like an aggregate, but a key's first value is the accumulator itself."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CogroupAggregateNode(AggregationNode):
    """One input stream of a cogroup (Kafka Streams' ``cogroup``): aggregates its records
    with its own ``fn`` into ``store``, which the COGROUP node ``cogroup`` owns and all the
    cogroup's inputs share. It forwards nothing; the cogroup's table emits the updates."""

    cogroup: str


@dataclass(frozen=True, slots=True, kw_only=True)
class CogroupNode(NodeBase):
    """The table of a cogroup: its parents are the COGROUP_AGGREGATE inputs, ``store`` (one
    value per key, or per key and window with ``window``) is theirs to write and its own to
    emit, as an aggregation's store is."""

    store: str
    window: AggregationWindow | None = None
    initial: Any = None
    merger: Callable[[Any, Any, Any], Any] | None = None

    @property
    def stores(self) -> tuple[str, ...]:
        return (self.store,)


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamTableJoinNode(NodeBase):
    """Looks each record's key up in ``table_store``, the store of the table node ``table``."""

    fn: Callable[..., Any]
    how: JoinHow
    table: str
    table_store: str
    #: The unmaterialized table steps between ``table_store``'s owner and ``table``, applied
    #: in order to the stored value on every lookup.
    table_view: tuple[TableViewNode, ...] = ()
    #: A versioned table only (KIP-923): stream records wait up to ``grace_ms`` behind stream
    #: time in ``buffer_store`` (this node's), then join as of their timestamps in time order.
    grace_ms: int | None = None
    buffer_store: str | None = None

    @property
    def stores(self) -> tuple[str, ...]:
        return (self.table_store,) if self.buffer_store is None else (self.table_store, self.buffer_store)


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamGlobalJoinNode(NodeBase):
    """Looks each record up in the global table ``global_table`` by ``foreign_key(key,
    value)`` (the record's own key when None). A global table is no task's store: every
    worker holds it whole, so the join needs no co-partitioning."""

    fn: Callable[..., Any]
    how: JoinHow
    global_table: str
    foreign_key: Callable[[Any, Any], Any] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamStreamJoinNode(NodeBase):
    """One side of a windowed stream–stream join: ``side``, the other side's node ``other``,
    the store this side writes and the store it probes."""

    fn: Callable[..., Any]
    how: JoinHow
    side: JoinSide
    other: str
    window: JoinWindow
    this_store: str
    other_store: str
    #: Left and outer joins: the key-value store both sides keep their unmatched records in
    #: until their window closes.
    outer_store: str | None = None

    @property
    def stores(self) -> tuple[str, ...]:
        if self.outer_store is None:
            return (self.this_store, self.other_store)
        return (self.this_store, self.other_store, self.outer_store)


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcessorNode(NodeBase):
    #: A ``Processor`` subclass.
    fn: Callable[..., Any]
    key_changing: bool = True
    stores: tuple[str, ...] = ()
    punctuations: tuple[Punctuation, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class SuppressNode(NodeBase):
    """Holds a table's updates back in a changelogged buffer (``store``) and emits them as
    ``suppression`` says (``pystreams.topology.suppress``); ``window`` is the windowed table's
    window, which ``until_window_closes`` needs to know when a window closes."""

    suppression: Suppression
    store: str
    window: AggregationWindow | None = None

    @property
    def stores(self) -> tuple[str, ...]:
        return (self.store,)


#: One step of the graph: match on the type to reach a kind's fields.
Node: TypeAlias = (
    SourceNode
    | TableSourceNode
    | SinkNode
    | MapNode
    | MapValuesNode
    | FlatMapNode
    | FlatMapValuesNode
    | FilterNode
    | PeekNode
    | SelectKeyNode
    | BranchNode
    | BranchOutputNode
    | MergeNode
    | ToStreamNode
    | TableFilterNode
    | TableMapValuesNode
    | TableJoinSideNode
    | TableJoinNode
    | TableGroupByNode
    | TableAggregateNode
    | FkSubscribeNode
    | FkSubscriptionsNode
    | FkForeignUpdateNode
    | FkJoinNode
    | RepartitionNode
    | CountNode
    | AggregateNode
    | ReduceNode
    | CogroupAggregateNode
    | CogroupNode
    | StreamTableJoinNode
    | StreamGlobalJoinNode
    | StreamStreamJoinNode
    | ProcessorNode
    | SuppressNode
)


def is_source(node: Node) -> bool:
    return isinstance(node, SourceNode | TableSourceNode)


def is_table(node: Node) -> bool:
    """Whether the node's output is a table (an update stream of a keyed state)."""
    return isinstance(
        node,
        TableSourceNode
        | CountNode
        | AggregateNode
        | ReduceNode
        | CogroupNode
        | TableFilterNode
        | TableMapValuesNode
        | TableJoinNode
        | TableAggregateNode
        | FkJoinNode,
    )


def is_materialized(node: Node) -> bool:
    """Whether a table node keeps its rows in a store of its own (else it is computed on read)."""
    return is_table(node) and not (isinstance(node, TableFilterNode | TableMapValuesNode | TableJoinNode | FkJoinNode) and node.store is None)


def changes_key(node: Node) -> bool:
    """True if the node may emit keys other than the ones it received."""
    match node:
        case MapNode() | FlatMapNode() | ProcessorNode():
            return node.key_changing
        case SelectKeyNode() | TableGroupByNode() | FkSubscribeNode() | FkSubscriptionsNode() | FkForeignUpdateNode():
            return True
        case _:
            return False


def topics_of(node: Node) -> tuple[str, ...]:
    """Sources: the topics read by name (none for a pattern); a sink: ``(topic,)``."""
    match node:
        case SourceNode() | TableSourceNode():
            return node.topics
        case SinkNode():
            return (node.topic,)
        case _:
            return ()


def rows_carry_timestamps(owner: Node, store: Store) -> bool:
    """Whether ``store`` keeps each row with its timestamp (Kafka Streams' timestamped
    stores): a table's rows and an aggregation's results, whose timestamps later results are
    computed from (an aggregation's is the largest folded into it, a table–table join's the
    later of its rows'). A sliding window keeps its newest timestamp in its value, a session
    is stamped with its end, and a versioned table keeps every version's: none needs it."""
    if store.history_ms is not None or store.kind is StoreKind.SESSION:
        return False
    if isinstance(owner, AggregationNode | CogroupNode):
        return store.name == owner.store and not isinstance(owner.window, SlidingWindow)
    if isinstance(owner, TableSourceNode | TableFilterNode | TableMapValuesNode | TableJoinNode | TableAggregateNode | FkJoinNode):
        return store.name == owner.store
    return False


def stores_of(node: Node) -> tuple[str, ...]:
    """Stores the node reads or writes. The owner is ``Store.owner``."""
    match node:
        case (
            TableSourceNode()
            | AggregationNode()
            | CogroupNode()
            | StreamTableJoinNode()
            | StreamStreamJoinNode()
            | ProcessorNode()
            | SuppressNode()
            | TableFilterNode()
            | TableMapValuesNode()
            | TableJoinSideNode()
            | TableJoinNode()
            | TableGroupByNode()
            | TableAggregateNode()
            | FkSubscribeNode()
            | FkSubscriptionsNode()
            | FkForeignUpdateNode()
            | FkJoinNode()
        ):
            return node.stores
        case _:
            return ()


def window_of(node: Node) -> Window | None:
    match node:
        case AggregationNode() | CogroupNode() | StreamStreamJoinNode() | SuppressNode():
            return node.window
        case _:
            return None


@dataclass(frozen=True, slots=True, kw_only=True)
class Store:
    """A state store: local (RocksDB in the worker) and backed by a changelog topic."""

    name: str
    kind: StoreKind
    #: The node that writes the store; others in ``readers`` only read it.
    owner: str
    #: Serdes of the stored key and value; for WINDOW/SESSION stores the key is the grouping
    #: key, and the store adds the window bounds in its own byte layout.
    key_serde: Serde
    value_serde: Serde
    #: WINDOW/SESSION stores: the window spec, and how long entries are kept.
    window: Window | None = None
    retention_ms: int | None = None
    #: WINDOW stores of stream–stream joins keep every record of a key, not one per window.
    retain_duplicates: bool = False
    #: KEY_VALUE stores of versioned tables: how long each key's past versions are kept
    #: (Kafka Streams' history retention, also the store's grace period); None: unversioned.
    history_ms: int | None = None
    #: False: no changelog, the store starts empty on every new owner.
    logging: bool = True
    #: Each row kept with its timestamp (``rows_carry_timestamps``; set by the builder).
    timestamped: bool = False
    changelog_topic: str | None = None
    subtopology: int = -1
    readers: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class GlobalTableSpec:
    """A table every worker holds whole (Kafka Streams' GlobalKTable): all partitions of
    ``topic``, restored before any task starts and kept current as the topic grows. The topic
    is its changelog; its store, named ``name``, keeps the topic's key and value bytes."""

    name: str
    topic: str
    key_serde: Serde
    value_serde: Serde

    @property
    def store(self) -> Store:
        """Its store as tasks and queries read it: a key-value store no task owns."""
        return Store(
            name=self.name,
            kind=StoreKind.KEY_VALUE,
            owner=self.name,
            key_serde=self.key_serde,
            value_serde=self.value_serde,
            logging=False,
            changelog_topic=self.topic,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class InternalTopic:
    """A topic the app creates itself.

    Its partition count is ``partitions`` if set, else the number of tasks of
    ``subtopology`` (for a repartition topic, the one writing it; for a changelog, the one
    owning the store); ``resolve`` computes it, and co-partitioning may raise it.
    """

    name: str
    role: TopicRole
    subtopology: int
    #: Topic configs to create it with (``cleanup.policy``, ``retention.ms``, ...).
    config: Mapping[str, str]
    partitions: int | None = None
    #: REPARTITION: the sub-topology reading it. CHANGELOG: the store it logs.
    reader_subtopology: int | None = None
    store: str | None = None
    #: REPARTITION: sized by its reader's co-partitioning, not by its writer (a foreign-key
    #: join's registration and response topics, which run both ways between its sides).
    sized_by_reader: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class CopartitionGroup:
    """Sources whose topics must all have the same partition count, and the joins needing it."""

    source_nodes: tuple[str, ...]
    #: Named topics of those sources (external and repartition); patterns expand at resolve.
    topics: tuple[str, ...]
    required_by: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class SubTopology:
    id: int
    #: Node names in processing order (every parent before its children).
    nodes: tuple[str, ...]
    source_nodes: tuple[str, ...]
    sink_nodes: tuple[str, ...]
    #: Named topics read (external and repartition) and the patterns subscribed.
    source_topics: tuple[str, ...]
    source_patterns: tuple[str, ...]
    #: Topics written (external and repartition).
    sink_topics: tuple[str, ...]
    stores: tuple[str, ...]


@dataclass(frozen=True, slots=True, order=True)
class TaskId:
    """One unit of work: a sub-topology on one partition number. Printed as ``"1_3"``."""

    subtopology: int
    partition: int

    def __str__(self) -> str:
        return f"{self.subtopology}_{self.partition}"

    @classmethod
    def parse(cls, text: str) -> TaskId:
        subtopology, _, partition = text.partition("_")
        return cls(int(subtopology), int(partition))


@dataclass(frozen=True, slots=True, kw_only=True)
class Topology:
    """A built, validated topology. Build it with ``App.topology()`` (or ``builder.build``)."""

    app_id: str
    #: Every node, in processing order.
    nodes: Mapping[str, Node]
    stores: Mapping[str, Store]
    subtopologies: tuple[SubTopology, ...]
    internal_topics: Mapping[str, InternalTopic]
    #: Topics of other systems: read by name, and written.
    external_source_topics: tuple[str, ...]
    source_patterns: tuple[str, ...]
    sink_topics: tuple[str, ...]
    copartition_groups: tuple[CopartitionGroup, ...]
    #: Stable across processes; changes whenever the structure changes (KIP-848 TopologyHash).
    hash: UUID = field(default=UUID(int=0))
    #: What bad records do (not part of the structure: no effect on the hash).
    errors: ErrorPolicies = field(default_factory=ErrorPolicies)
    #: Global tables by name: outside the sub-topologies, held whole by every worker.
    global_tables: Mapping[str, GlobalTableSpec] = field(default_factory=dict)

    def node(self, name: str) -> Node:
        return self.nodes[name]

    def source(self, name: str) -> SourceNode | TableSourceNode:
        """The source node ``name`` (as ``SubTopology.source_nodes`` names them)."""
        match self.nodes[name]:
            case SourceNode() | TableSourceNode() as node:
                return node
            case node:
                raise KeyError(f"{name!r} is a {node.kind} node, not a source")

    def subtopology_of(self, node: str) -> SubTopology:
        return self.subtopologies[self.nodes[node].subtopology]

    def nodes_of(self, subtopology: int) -> Iterable[Node]:
        return (self.nodes[name] for name in self.subtopologies[subtopology].nodes)

    @property
    def repartition_topics(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.internal_topics.values() if t.role is TopicRole.REPARTITION)

    def store_spec(self, name: str) -> Store | None:
        """Store ``name``: a task's, or a global table's (None: no such store)."""
        table = self.global_tables.get(name)
        return table.store if table is not None else self.stores.get(name)

    @property
    def global_topics(self) -> tuple[str, ...]:
        return tuple(sorted(table.topic for table in self.global_tables.values()))

    @property
    def changelog_topics(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.internal_topics.values() if t.role is TopicRole.CHANGELOG)
