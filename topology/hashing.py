"""The topology hash: a UUID (KIP-848's ``TopologyHash``) that members compare to notice that
they run different topologies.

It covers the *structure* — node names, kinds and edges, topics and patterns, stores and
their windows, serde names, join and punctuation specs, internal topic configs — written as
canonical JSON and hashed with SHA-256. User functions are left out: their bytecode and
addresses vary between processes and Python versions, while a structural change (a node
added, a topic renamed, a serde or window changed) always changes the hash.
"""

from __future__ import annotations

import hashlib
from typing import Any
from uuid import UUID

import msgspec

from .ir import (
    AggregationNode,
    BranchNode,
    BranchOutputNode,
    CopartitionGroup,
    GlobalTableSpec,
    InternalTopic,
    JoinKind,
    Node,
    ProcessorNode,
    RepartitionNode,
    SinkNode,
    SourceNode,
    Store,
    StreamGlobalJoinNode,
    StreamStreamJoinNode,
    StreamTableJoinNode,
    SubTopology,
    SuppressNode,
    TableSourceNode,
    changes_key,
    stores_of,
    topics_of,
    window_of,
)
from .suppress import suppression_fields
from .windows import window_fields

#: Bump when the canonical form changes meaning, so old and new hashes never collide.
CANONICAL_FORM_VERSION = 1


def _join(node: Node) -> dict[str, Any] | None:
    # The layout the nodes had before they became one type per kind: hashes stay the same.
    if isinstance(node, StreamTableJoinNode):
        kind, table, table_store = JoinKind.STREAM_TABLE, node.table, node.table_store
        side = other = window = this_store = other_store = None
    elif isinstance(node, StreamStreamJoinNode):
        kind, table, table_store = JoinKind.STREAM_STREAM, None, None
        side, other, window = node.side.value, node.other, window_fields(node.window)
        this_store, other_store = node.this_store, node.other_store
    else:
        return None
    return {
        "kind": kind.value,
        "how": node.how.value,
        "table": table,
        "table_store": table_store,
        "side": side,
        "other": other,
        "window": window,
        "this_store": this_store,
        "other_store": other_store,
    }


def _node(node: Node) -> dict[str, Any]:
    # The layout the nodes had when every node had every field: a kind without a field
    # writes its empty value, so hashes stay the same.
    window = window_of(node)
    return {
        "name": node.name,
        "kind": node.kind,
        "parents": list(node.parents),
        "subtopology": node.subtopology,
        "key_serde": node.key_serde.name,
        "value_serde": node.value_serde.name,
        "key_changing": changes_key(node),
        "topics": list(topics_of(node)),
        "pattern": node.pattern if isinstance(node, SourceNode) else None,
        "has_timestamp_extractor": isinstance(node, SourceNode | TableSourceNode) and node.timestamp_extractor is not None,
        "internal": isinstance(node, RepartitionNode) or (isinstance(node, SourceNode | SinkNode) and node.internal),
        "partitions": node.partitions if isinstance(node, SourceNode | SinkNode | RepartitionNode) else None,
        "stores": list(stores_of(node)),
        "window": window_fields(window) if window else None,
        "join": _join(node),
        "branches": list(_branches(node)),
        "punctuations": [[p.method, p.interval_ms, p.type.value] for p in node.punctuations] if isinstance(node, ProcessorNode) else [],
        "emit": node.emit.value if isinstance(node, AggregationNode) else None,
        "suppression": suppression_fields(node.suppression) if isinstance(node, SuppressNode) else None,
    } | _added_fields(node)


def _added_fields(node: Node) -> dict[str, Any]:
    """Fields kinds gained later, written only when set: the hashes of apps without them stay."""
    if isinstance(node, StreamGlobalJoinNode):
        return {"global_join": [node.how.value, node.global_table]}
    if isinstance(node, StreamTableJoinNode) and node.grace_ms is not None:
        return {"grace_ms": node.grace_ms}
    return {}


def _branches(node: Node) -> tuple[str, ...]:
    match node:
        case BranchNode():
            return node.branches
        case BranchOutputNode():
            return (node.label,)
        case _:
            return ()


def _store(store: Store) -> dict[str, Any]:
    versioned = {} if store.history_ms is None else {"history_ms": store.history_ms}  # absent: old hashes stay
    return versioned | {
        "name": store.name,
        "kind": store.kind.value,
        "owner": store.owner,
        "key_serde": store.key_serde.name,
        "value_serde": store.value_serde.name,
        "window": window_fields(store.window) if store.window else None,
        "retention_ms": store.retention_ms,
        "retain_duplicates": store.retain_duplicates,
        "logging": store.logging,
        "changelog_topic": store.changelog_topic,
        "subtopology": store.subtopology,
    }


def _topic(topic: InternalTopic) -> dict[str, Any]:
    return {
        "name": topic.name,
        "role": topic.role.value,
        "subtopology": topic.subtopology,
        "config": dict(topic.config),
        "partitions": topic.partitions,
    }


def canonical_form(
    app_id: str,
    nodes: list[Node],
    stores: list[Store],
    subtopologies: list[SubTopology],
    internal_topics: list[InternalTopic],
    copartition_groups: list[CopartitionGroup],
    global_tables: list[GlobalTableSpec] | None = None,
) -> bytes:
    """The structure as canonical JSON (sorted keys; lists in processing or name order)."""
    form = {
        "version": CANONICAL_FORM_VERSION,
        "app": app_id,
        "nodes": [_node(node) for node in nodes],
        "stores": [_store(store) for store in sorted(stores, key=lambda s: s.name)],
        "subtopologies": [list(sub.nodes) for sub in subtopologies],
        "internal_topics": [_topic(topic) for topic in sorted(internal_topics, key=lambda t: t.name)],
        "copartition_groups": sorted(list(group.source_nodes) for group in copartition_groups),
    }
    if global_tables:  # only when there are: the hashes of apps without stay the same
        form["global_tables"] = [
            {"name": t.name, "topic": t.topic, "key_serde": t.key_serde.name, "value_serde": t.value_serde.name}
            for t in sorted(global_tables, key=lambda t: t.name)
        ]
    return msgspec.json.encode(form, order="sorted")


def topology_hash(canonical: bytes) -> UUID:
    return UUID(bytes=hashlib.sha256(canonical).digest()[:16])
