"""From declared nodes and stores (what ``App`` records) to a validated ``Topology``.

Steps, in order:

1. **Check references**: unique names, every parent declared, every non-source node has a
   parent, every store a node names exists.
2. **Repartition**: a stream whose key may have changed (after ``map``, ``flat_map``,
   ``group_by``, or a key-changing processor, through any key-preserving steps) is written to
   ``<app>-<node>-repartition`` before it reaches a node that needs keyed input (count,
   aggregate, reduce, joins, processors with stores). ``<node>`` is the node whose output is
   repartitioned; all its keyed consumers share one topic. ``app.repartition`` declares one
   explicitly.
3. **Split** the graph into sub-topologies: connected parts once cut at repartition topics. A
   stream–table join also connects the join to its table, whose store it reads. Sub-topologies
   are numbered in declaration order.
4. **Stores**: each belongs to its owner's sub-topology; a node of another sub-topology using
   it is an error. Logged stores get ``<app>-<store>-changelog`` (compacted; windowed stores
   also delete after their retention plus a day, as Kafka Streams does).
5. **Co-partitioning**: the source topics feeding each join (both sides) form a group whose
   partition counts must be equal; ``resolve`` checks it against the cluster.
6. **Sanity**: patterns compile and do not match named sources, no sink writes to an
   internal topic, no cycle between sub-topologies.
7. **Hash** the structure.
"""

from __future__ import annotations

import graphlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from .errors import (
    CopartitionError,
    InvalidNameError,
    InvalidPatternError,
    MissingSourceError,
    StoreError,
    TopologyError,
)
from .hashing import canonical_form, topology_hash
from .ir import (
    AggregationNode,
    CogroupNode,
    CopartitionGroup,
    ErrorPolicies,
    FkJoinNode,
    FkSubscriptionsNode,
    GlobalTableSpec,
    InternalTopic,
    JoinSide,
    Node,
    ProcessorNode,
    RepartitionNode,
    SinkNode,
    SourceNode,
    Store,
    StoreKind,
    StreamGlobalJoinNode,
    StreamStreamJoinNode,
    StreamTableJoinNode,
    SubTopology,
    TableAggregateNode,
    TableJoinNode,
    TableSourceNode,
    TopicRole,
    Topology,
    changes_key,
    is_source,
    rows_carry_timestamps,
    stores_of,
    topics_of,
)
from .naming import changelog_topic, check_name, repartition_sink_node, repartition_source_node, repartition_topic
from .patterns import compile_pattern

#: Kafka Streams' ``windowstore.changelog.additional.retention.ms`` default: one day, so a
#: changelog never drops a window its store still keeps.
WINDOW_CHANGELOG_EXTRA_RETENTION_MS = 24 * 60 * 60 * 1000

#: Repartition topics as Kafka Streams creates them: records are only needed until the
#: reading task commits, after which the runtime may purge them (DeleteRecords).
REPARTITION_TOPIC_CONFIG = {"cleanup.policy": "delete", "segment.ms": "600000", "retention.ms": "-1"}


def build(
    app_id: str,
    nodes: Sequence[Node],
    stores: Sequence[Store],
    errors: ErrorPolicies | None = None,
    global_tables: Sequence[GlobalTableSpec] = (),
) -> Topology:
    check_name("app", app_id)
    declared = _index(nodes)
    errors = errors or ErrorPolicies()
    for source in errors.sources:
        if source not in declared or not is_source(declared[source]):
            raise TopologyError(f"an error policy names {source!r}, which is not a source node", nodes=[source])
    store_index = {store.name: store for store in stores}
    _check_references(declared, store_index)
    ordered = _insert_repartitions(app_id, declared)
    ordered = _wire_children(ordered)
    components = _split(ordered)
    ordered = {name: replace(node, subtopology=components[name]) for name, node in ordered.items()}
    built_stores = _place_stores(app_id, ordered, store_index)
    subtopologies = _subtopologies(ordered, built_stores)
    internal_topics = _internal_topics(app_id, ordered, built_stores)
    groups = _copartition_groups(ordered)
    _check_sources_and_sinks(ordered, internal_topics)
    _check_acyclic(subtopologies, internal_topics)
    globals_by_name = _check_global_tables(ordered, built_stores, internal_topics, global_tables)

    node_list = list(ordered.values())
    canonical = canonical_form(
        app_id, node_list, list(built_stores.values()), subtopologies, list(internal_topics.values()), groups, list(globals_by_name.values())
    )
    external_sources = sorted({t for n in node_list if _reads_external_topics(n) for t in topics_of(n)})
    return Topology(
        app_id=app_id,
        nodes=ordered,
        stores=built_stores,
        subtopologies=tuple(subtopologies),
        internal_topics=internal_topics,
        external_source_topics=tuple(external_sources),
        source_patterns=tuple(n.pattern for n in node_list if isinstance(n, SourceNode) and n.pattern is not None),
        sink_topics=tuple(sorted({n.topic for n in node_list if isinstance(n, SinkNode) and not n.internal})),
        copartition_groups=tuple(groups),
        hash=topology_hash(canonical),
        errors=errors,
        global_tables=globals_by_name,
    )


def _reads_external_topics(node: Node) -> bool:
    """A source of other systems' topics (not of a repartition topic)."""
    return isinstance(node, TableSourceNode) or (isinstance(node, SourceNode) and not node.internal)


# --------------------------------------------------------------------------- 1. references


def _index(nodes: Sequence[Node]) -> dict[str, Node]:
    index: dict[str, Node] = {}
    for node in nodes:
        check_name(f"{node.kind} node", node.name)
        if node.name in index:
            raise InvalidNameError(f"two nodes are named {node.name!r}", nodes=[node.name])
        index[node.name] = node
    if not any(is_source(node) for node in nodes):
        raise MissingSourceError("the topology has no source: declare one with app.topic(...) or app.table(...)")
    return index


def _check_references(declared: dict[str, Node], stores: dict[str, Store]) -> None:
    seen: set[str] = set()
    for node in declared.values():
        if isinstance(node, SourceNode | TableSourceNode):
            if node.parents:
                raise TopologyError(f"source {node.name!r} cannot have parents", nodes=[node.name])
            if not node.topics and not (isinstance(node, SourceNode) and node.pattern is not None):
                raise MissingSourceError(f"source {node.name!r} reads no topic and no pattern", nodes=[node.name])
        elif not node.parents:
            raise MissingSourceError(f"{node.kind} node {node.name!r} has no input", nodes=[node.name])
        for parent in node.parents:
            if parent not in declared:
                raise MissingSourceError(
                    f"{node.kind} node {node.name!r} reads from {parent!r}, which is not declared",
                    nodes=[node.name, parent],
                )
            if parent not in seen:
                # Declarations come parents first; anything else is a cycle or a forward reference.
                raise TopologyError(
                    f"{node.kind} node {node.name!r} reads from {parent!r}, declared after it",
                    nodes=[node.name, parent],
                )
        looked_up = _looked_up_table(node)
        if looked_up is not None and looked_up not in declared:
            raise MissingSourceError(
                f"join {node.name!r} reads table {looked_up!r}, which is not declared",
                nodes=[node.name, looked_up],
            )
        for store_name in stores_of(node):
            if store_name not in stores:
                raise StoreError(f"{node.kind} node {node.name!r} uses store {store_name!r}, which no node declares", nodes=[node.name])
        seen.add(node.name)
    for store in stores.values():
        owner = declared.get(store.owner)
        if owner is None or store.name not in stores_of(owner):
            raise StoreError(f"store {store.name!r} names owner {store.owner!r}, which does not use it", nodes=[store.owner])


# --------------------------------------------------------------------------- 2. repartition


def _needs_keyed_input(node: Node) -> bool:
    match node:
        case AggregationNode() | StreamTableJoinNode() | StreamStreamJoinNode() | TableAggregateNode() | FkSubscriptionsNode() | FkJoinNode():
            return True
        case ProcessorNode():
            return bool(node.stores)
        case _:
            return False


def _insert_repartitions(app_id: str, declared: dict[str, Node]) -> dict[str, Node]:
    """Expand declared repartitions and insert automatic ones; returns nodes in processing order."""
    key_changed: dict[str, bool] = {}
    ordered: dict[str, Node] = {}
    #: repartitioned parent -> the source node reading its repartition topic
    repartitioned: dict[str, str] = {}

    def emit(node: Node) -> None:
        if node.name in ordered:
            raise InvalidNameError(f"node name {node.name!r} clashes with a repartition node; pass name=", nodes=[node.name])
        ordered[node.name] = node

    def emit_pair(base: str, parent: Node, source: Node | None, partitions: int | None) -> str:
        topic = repartition_topic(app_id, base)
        sink_name = repartition_sink_node(base)
        if sink_name in declared:
            raise InvalidNameError(
                f"node name {sink_name!r} clashes with the repartition of {parent.name!r}; pass name=",
                nodes=[sink_name, parent.name],
            )
        emit(
            SinkNode(
                name=sink_name,
                parents=(parent.name,),
                topic=topic,
                internal=True,
                partitions=partitions,
                key_serde=parent.key_serde,
                value_serde=parent.value_serde,
            )
        )
        source_name = source.name if source is not None else repartition_source_node(base)
        emit(
            SourceNode(
                name=source_name,
                key_serde=parent.key_serde,
                value_serde=parent.value_serde,
                topics=(topic,),
                internal=True,
                partitions=partitions,
            )
        )
        key_changed[source_name] = False
        return source_name

    for node in declared.values():
        if isinstance(node, RepartitionNode):
            parent = declared[node.parents[0]]
            base = node.name.removesuffix("-repartition-source")
            source_name = emit_pair(base, parent, node, node.partitions)
            if base == parent.name:
                repartitioned.setdefault(parent.name, source_name)
            continue
        parents = list(node.parents)
        if _needs_keyed_input(node):
            for index, parent_name in enumerate(parents):
                if not key_changed[parent_name]:
                    continue
                if parent_name not in repartitioned:
                    auto_name = repartition_source_node(parent_name)
                    if auto_name in declared:
                        raise InvalidNameError(
                            f"node name {auto_name!r} clashes with the repartition of {parent_name!r}; pass name=",
                            nodes=[auto_name, parent_name],
                        )
                    repartitioned[parent_name] = emit_pair(parent_name, ordered[parent_name], None, None)
                parents[index] = repartitioned[parent_name]
            key_changed[node.name] = changes_key(node)
        elif is_source(node):
            key_changed[node.name] = False
        else:
            key_changed[node.name] = changes_key(node) or any(key_changed[p] for p in parents)
        emit(replace(node, parents=tuple(parents)))
    return ordered


def _wire_children(nodes: dict[str, Node]) -> dict[str, Node]:
    children: dict[str, list[str]] = {name: [] for name in nodes}
    for node in nodes.values():
        for parent in node.parents:
            children[parent].append(node.name)
    return {name: replace(node, children=tuple(children[name])) for name, node in nodes.items()}


# --------------------------------------------------------------------------- 3. split


def _looked_up_table(node: Node) -> str | None:
    """The table a node looks rows up in without reading its updates: it must share the
    table's task (its sub-topology and partition)."""
    match node:
        case StreamTableJoinNode():
            return node.table
        case FkSubscriptionsNode():
            return node.foreign_table
        case FkJoinNode():
            return node.left_table
        case _:
            return None


def _split(nodes: dict[str, Node]) -> dict[str, int]:
    """Sub-topology id per node: connected components, numbered by first appearance."""
    root = {name: name for name in nodes}

    def find(name: str) -> str:
        while root[name] != name:
            root[name] = root[root[name]]
            name = root[name]
        return name

    def union(a: str, b: str) -> None:
        root[find(a)] = find(b)

    for node in nodes.values():
        for parent in node.parents:
            union(node.name, parent)
        looked_up = _looked_up_table(node)
        if looked_up is not None:
            union(node.name, looked_up)
    ids: dict[str, int] = {}
    assignment = {}
    for name in nodes:
        assignment[name] = ids.setdefault(find(name), len(ids))
    return assignment


# --------------------------------------------------------------------------- 4. stores


def _place_stores(app_id: str, nodes: dict[str, Node], stores: dict[str, Store]) -> dict[str, Store]:
    users: dict[str, list[str]] = {name: [] for name in stores}
    for node in nodes.values():
        for store_name in stores_of(node):
            users[store_name].append(node.name)
    placed = {}
    for name in sorted(stores):
        store = stores[name]
        home = nodes[store.owner].subtopology
        strangers = [user for user in users[name] if nodes[user].subtopology != home]
        if strangers:
            where = ", ".join(f"{user!r} (sub-topology {nodes[user].subtopology})" for user in strangers)
            raise StoreError(
                f"store {name!r} is used by two sub-topologies: its owner {store.owner!r} is in sub-topology "
                f"{home}, but {where} uses it too; a store is local to one task, so its users must read "
                "the same partitions",
                nodes=[store.owner, *strangers],
            )
        placed[name] = replace(
            store,
            subtopology=home,
            changelog_topic=changelog_topic(app_id, name) if store.logging else None,
            readers=tuple(user for user in users[name] if user != store.owner),
            timestamped=rows_carry_timestamps(nodes[store.owner], store),
        )
    return placed


def _changelog_config(store: Store) -> dict[str, str]:
    if store.kind is StoreKind.KEY_VALUE:
        return {"cleanup.policy": "compact"}
    retention = (store.retention_ms or 0) + WINDOW_CHANGELOG_EXTRA_RETENTION_MS
    return {"cleanup.policy": "compact,delete", "retention.ms": str(retention)}


def _internal_topics(app_id: str, nodes: dict[str, Node], stores: dict[str, Store]) -> dict[str, InternalTopic]:
    topics: dict[str, InternalTopic] = {}
    readers = {n.topics[0]: n.subtopology for n in nodes.values() if isinstance(n, SourceNode) and n.internal}
    fk_join_topics = {
        n.topics[0]
        for n in nodes.values()
        if isinstance(n, SourceNode) and n.internal and any(isinstance(nodes[child], FkSubscriptionsNode | FkJoinNode) for child in n.children)
    }
    for node in nodes.values():
        if isinstance(node, SinkNode) and node.internal:
            topic = node.topic
            topics[topic] = InternalTopic(
                name=topic,
                role=TopicRole.REPARTITION,
                subtopology=node.subtopology,
                config=dict(REPARTITION_TOPIC_CONFIG),
                partitions=node.partitions,
                reader_subtopology=readers[topic],
                sized_by_reader=topic in fk_join_topics,
            )
    for store in stores.values():
        if store.changelog_topic is not None:
            if store.changelog_topic in topics:
                raise InvalidNameError(
                    f"changelog of store {store.name!r} clashes with topic {store.changelog_topic!r}",
                    nodes=[store.owner],
                    topics=[store.changelog_topic],
                )
            topics[store.changelog_topic] = InternalTopic(
                name=store.changelog_topic,
                role=TopicRole.CHANGELOG,
                subtopology=store.subtopology,
                config=_changelog_config(store),
                store=store.name,
            )
    return dict(sorted(topics.items()))


def _subtopologies(nodes: dict[str, Node], stores: dict[str, Store]) -> list[SubTopology]:
    count = max(node.subtopology for node in nodes.values()) + 1
    result = []
    for sub_id in range(count):
        members = [node for node in nodes.values() if node.subtopology == sub_id]
        sources = [n for n in members if isinstance(n, SourceNode | TableSourceNode)]
        sinks = [n for n in members if isinstance(n, SinkNode)]
        result.append(
            SubTopology(
                id=sub_id,
                nodes=tuple(n.name for n in members),
                source_nodes=tuple(n.name for n in sources),
                sink_nodes=tuple(n.name for n in sinks),
                source_topics=tuple(t for n in sources for t in n.topics),
                source_patterns=tuple(n.pattern for n in sources if isinstance(n, SourceNode) and n.pattern is not None),
                sink_topics=tuple(dict.fromkeys(n.topic for n in sinks)),
                stores=tuple(sorted(s.name for s in stores.values() if s.subtopology == sub_id)),
            )
        )
    return result


# --------------------------------------------------------------------------- 5. co-partitioning


def _upstream_sources(nodes: dict[str, Node], start: str) -> set[str]:
    found, stack, seen = set(), [start], set()
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        node = nodes[name]
        if is_source(node):
            found.add(name)
        stack.extend(node.parents)
    return found


def _copartition_groups(nodes: dict[str, Node]) -> list[CopartitionGroup]:
    """One group per set of joins sharing sources; each lists the sources feeding both sides."""
    requirements: list[tuple[str, set[str]]] = []
    for node in nodes.values():
        looked_up = _looked_up_table(node)
        if looked_up is not None:
            sources = _upstream_sources(nodes, node.parents[0]) | _upstream_sources(nodes, looked_up)
            requirements.append((node.name, sources))
        elif isinstance(node, StreamStreamJoinNode) and node.side is JoinSide.LEFT:
            join_name = node.children[0] if node.children else node.name
            sources = _upstream_sources(nodes, node.name) | _upstream_sources(nodes, node.other)
            requirements.append((join_name, sources))
        elif isinstance(node, CogroupNode | TableJoinNode):
            # One store for every input (a cogroup), or each side looks the other's up (a
            # table-table join): a key's records must all reach one task.
            sources = set().union(*(_upstream_sources(nodes, parent) for parent in node.parents))
            requirements.append((node.name, sources))
    # Merge requirements that share a source: they constrain the same topics.
    merged: list[tuple[list[str], set[str]]] = []
    for join_name, sources in requirements:
        overlapping = [group for group in merged if group[1] & sources]
        joins, union = [join_name], set(sources)
        for group in overlapping:
            merged.remove(group)
            joins = group[0] + joins
            union |= group[1]
        merged.append((joins, union))
    order = {name: index for index, name in enumerate(nodes)}
    groups = []
    for joins, sources in merged:
        source_nodes = sorted(sources, key=order.__getitem__)
        members = [nodes[s] for s in source_nodes]
        if len(members) < 2 and not any(isinstance(n, SourceNode) and n.pattern for n in members):
            continue  # one named topic is trivially co-partitioned with itself
        topics = tuple(t for n in members for t in topics_of(n))
        explicit = {n.topics[0]: n.partitions for n in members if isinstance(n, SourceNode) and n.internal and n.partitions is not None}
        if len(set(explicit.values())) > 1:
            raise CopartitionError(
                f"join {', '.join(map(repr, joins))} needs co-partitioned inputs, but repartition topics have different fixed partition counts: {explicit}",
                nodes=joins,
                topics=list(explicit),
            )
        groups.append(CopartitionGroup(source_nodes=tuple(source_nodes), topics=topics, required_by=tuple(joins)))
    groups.sort(key=lambda g: order[g.source_nodes[0]])
    return groups


# --------------------------------------------------------------------------- 6. sanity


def _check_sources_and_sinks(nodes: dict[str, Node], internal_topics: dict[str, InternalTopic]) -> None:
    named_sources = {t: n.name for n in nodes.values() if _reads_external_topics(n) for t in topics_of(n)}
    for node in nodes.values():
        match node:
            case SourceNode(pattern=str(pattern)):
                compiled = compile_pattern(pattern, node.name)
                clashes = sorted(t for t in named_sources if compiled.fullmatch(t))
                if clashes:
                    raise InvalidPatternError(
                        f"source {node.name!r}: pattern {pattern!r} also matches {clashes}, already read by "
                        f"{sorted({named_sources[t] for t in clashes})}; a topic can feed only one source",
                        nodes=[node.name, *sorted({named_sources[t] for t in clashes})],
                        topics=clashes,
                    )
            case SinkNode(internal=False) if node.topic in internal_topics:
                raise InvalidNameError(
                    f"sink {node.name!r} writes to {node.topic!r}, an internal topic of this app",
                    nodes=[node.name],
                    topics=[node.topic],
                )
    for name, source in named_sources.items():
        if name in internal_topics:
            raise InvalidNameError(f"source {source!r} reads {name!r}, an internal topic of this app", nodes=[source], topics=[name])


def _check_global_tables(
    nodes: Mapping[str, Node], stores: Mapping[str, Store], internal_topics: Mapping[str, InternalTopic], global_tables: Sequence[GlobalTableSpec]
) -> dict[str, GlobalTableSpec]:
    """Global tables have names of their own, read topics no source reads, and every global
    join names one of them."""
    by_name: dict[str, GlobalTableSpec] = {}
    by_topic: dict[str, str] = {}
    named_sources = {t: n.name for n in nodes.values() if _reads_external_topics(n) for t in topics_of(n)}
    for table in global_tables:
        check_name("global table", table.name)
        if table.name in by_name or table.name in stores or table.name in nodes:
            raise InvalidNameError(f"global table {table.name!r}: the name is taken by another node, store or global table", nodes=[table.name])
        if table.topic in by_topic:
            raise InvalidNameError(
                f"global tables {by_topic[table.topic]!r} and {table.name!r} both read {table.topic!r}; a topic feeds one table",
                nodes=[by_topic[table.topic], table.name],
                topics=[table.topic],
            )
        reader = named_sources.get(table.topic)
        if reader is None:
            reader = next(
                (n.name for n in nodes.values() if isinstance(n, SourceNode) and n.pattern and compile_pattern(n.pattern, n.name).fullmatch(table.topic)), None
            )
        if reader is not None:
            raise InvalidNameError(
                f"global table {table.name!r} reads {table.topic!r}, which source {reader!r} reads too; a topic feeds one source",
                nodes=[table.name, reader],
                topics=[table.topic],
            )
        if table.topic in internal_topics:
            raise InvalidNameError(
                f"global table {table.name!r} reads {table.topic!r}, an internal topic of this app", nodes=[table.name], topics=[table.topic]
            )
        by_name[table.name] = table
        by_topic[table.topic] = table.name
    for node in nodes.values():
        if isinstance(node, StreamGlobalJoinNode) and node.global_table not in by_name:
            raise MissingSourceError(
                f"join {node.name!r} reads global table {node.global_table!r}, which is not declared",
                nodes=[node.name, node.global_table],
            )
    return by_name


def subtopology_order(subtopologies: Iterable[SubTopology], internal_topics: Mapping[str, InternalTopic]) -> list[int]:
    """Sub-topology ids, each after the ones writing its repartition topics — except a topic
    its reader's co-partitioning sizes (a foreign-key join's two topics, which run both ways
    between its sides)."""
    sorter: graphlib.TopologicalSorter[int] = graphlib.TopologicalSorter()
    for sub in subtopologies:
        sorter.add(sub.id)
    for topic in internal_topics.values():
        reader = topic.reader_subtopology
        if topic.role is TopicRole.REPARTITION and reader is not None and reader != topic.subtopology and not topic.sized_by_reader:
            sorter.add(reader, topic.subtopology)
    try:
        return list(sorter.static_order())
    except graphlib.CycleError as error:
        cycle = error.args[1]
        topics = sorted(
            t.name for t in internal_topics.values() if t.role is TopicRole.REPARTITION and t.subtopology in cycle and t.reader_subtopology in cycle
        )
        raise TopologyError(f"sub-topologies {cycle} feed each other through repartition topics {topics}", topics=topics) from None


def _check_acyclic(subtopologies: list[SubTopology], internal_topics: dict[str, InternalTopic]) -> None:
    subtopology_order(subtopologies, internal_topics)
