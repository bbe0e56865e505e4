"""Human views of a topology: a text description and a Mermaid flowchart.

The text lists sub-topologies with their nodes (arrows to children, from parents), their
tasks, the stores and every topic with how it is sized. With a ``ResolvedTopology`` the tasks
and partition counts are concrete; without one they are stated as rules.
"""

from __future__ import annotations

import re

from .ir import (
    AggregationNode,
    BranchOutputNode,
    EmitStrategy,
    JoinKind,
    Node,
    ProcessorNode,
    SinkNode,
    SourceNode,
    StreamGlobalJoinNode,
    StreamStreamJoinNode,
    StreamTableJoinNode,
    SubTopology,
    SuppressNode,
    TableFilterNode,
    TableJoinNode,
    TableJoinSideNode,
    TableMapValuesNode,
    TableSourceNode,
    TopicRole,
    Topology,
    is_source,
    stores_of,
    topics_of,
    window_of,
)
from .resolve import ResolvedTopology
from .suppress import describe_suppression
from .windows import describe_window


def _node_line(node: Node) -> str:
    match node:
        case SourceNode(pattern=str(pattern)):
            line = f"Source: {node.name} (pattern {pattern!r})"
        case SourceNode():
            line = f"Source: {node.name} (topics {list(node.topics)})"
        case TableSourceNode():
            line = f"Table source: {node.name} (topics {list(node.topics)})"
        case SinkNode():
            line = f"Sink: {node.name} (topic {node.topic!r})"
        case _:
            line = f"Processor: {node.name} ({node.kind})"
    details = []
    stores, window = stores_of(node), window_of(node)
    if stores:
        details.append(f"stores {list(stores)}")
    if window is not None:
        details.append(describe_window(window))
    match node:
        case AggregationNode(emit=EmitStrategy.FINAL):
            details.append("emit final")
        case SuppressNode():
            details.append(describe_suppression(node.suppression))
        case StreamTableJoinNode():
            through = f" with table {node.table!r} computed on read" if node.table_view else ""
            grace = f", grace {node.grace_ms} ms" if node.grace_ms is not None else ""
            details.append(f"{node.how} {JoinKind.STREAM_TABLE} join{through}{grace}")
        case TableFilterNode() | TableMapValuesNode() | TableJoinNode():
            details.append("materialized" if node.store is not None else "computed on read")
        case TableJoinSideNode():
            details.append(f"{node.how} table-table join, {node.side} side, looks up {node.other_table!r}")
        case StreamStreamJoinNode():
            details.append(f"{node.how} {JoinKind.STREAM_STREAM} join, {node.side} side")
        case StreamGlobalJoinNode():
            details.append(f"{node.how} join with global table {node.global_table!r}")
        case ProcessorNode(punctuations=punctuations) if punctuations:
            details.append("punctuate " + ", ".join(f"{p.method} every {p.interval_ms}ms {p.type}" for p in punctuations))
        case SourceNode() | TableSourceNode() if node.timestamp_extractor is not None:
            details.append("event time from extractor")
        case BranchOutputNode():
            details.append(f"branch {node.label!r}")
    details.append(f"serdes {node.key_serde.name}/{node.value_serde.name}")
    return f"{line} [{'; '.join(details)}]"


def _tasks_line(topology: Topology, sub: SubTopology, resolved: ResolvedTopology | None) -> str:
    if resolved is not None:
        tasks = resolved.tasks_of(sub.id)
        shown = ", ".join(str(t) for t in tasks[:8]) + (", ..." if len(tasks) > 8 else "")
        return f"tasks ({len(tasks)}): {shown}"
    inputs = [*sub.source_topics, *(f"/{p}/" for p in sub.source_patterns)]
    return f"tasks: {sub.id}_0 .. {sub.id}_(N-1), one per partition; N = max partitions of {inputs}"


def describe(topology: Topology, resolved: ResolvedTopology | None = None) -> str:
    lines = [f"Topology {topology.app_id} (hash {topology.hash})"]
    for sub in topology.subtopologies:
        lines.append(f"Sub-topology {sub.id}")
        lines.append(f"  {_tasks_line(topology, sub, resolved)}")
        for node in topology.nodes_of(sub.id):
            lines.append(f"  {_node_line(node)}")
            if node.children:
                lines.append(f"    --> {', '.join(node.children)}")
            if node.parents:
                lines.append(f"    <-- {', '.join(node.parents)}")
    if topology.stores:
        lines.append("Stores")
        for store in topology.stores.values():
            window = f", {describe_window(store.window)}" if store.window is not None else ""
            changelog = store.changelog_topic or "no changelog"
            if store.history_ms is not None:
                window += f", versioned (history {store.history_ms} ms)"
            lines.append(f"  {store.name}: {store.kind} in sub-topology {store.subtopology}, owner {store.owner}{window}, {changelog}")
    if topology.global_tables:
        lines.append("Global tables (every worker holds all of each, restored before its tasks start)")
        for table in topology.global_tables.values():
            lines.append(f"  {table.name}: key-value, from topic {table.topic!r}{_partitions(resolved, table.topic)}")
    lines.append("Topics")
    for topic in topology.external_source_topics:
        lines.append(f"  {topic}: source{_partitions(resolved, topic)}")
    for pattern in topology.source_patterns:
        matched = ""
        if resolved is not None:
            node = next(n for n in topology.nodes.values() if isinstance(n, SourceNode) and n.pattern == pattern)
            matched = f" -> {list(resolved.source_topics[node.name])}"
        lines.append(f"  /{pattern}/: source pattern{matched}")
    for topic in topology.sink_topics:
        lines.append(f"  {topic}: sink{_partitions(resolved, topic)}")
    for internal in topology.internal_topics.values():
        if internal.role is TopicRole.REPARTITION:
            role = f"repartition, written by sub-topology {internal.subtopology}, read by {internal.reader_subtopology}"
        else:
            role = f"changelog of store {internal.store}"
        if resolved is not None:
            size = f"{resolved.partitions[internal.name]} partitions"
        elif internal.partitions:
            size = f"{internal.partitions} partitions"
        else:
            size = f"partitions = tasks of sub-topology {internal.subtopology}"
        config = " ".join(f"{k}={v}" for k, v in sorted(internal.config.items()))
        lines.append(f"  {internal.name}: {role}; {size}; {config}")
    for group in topology.copartition_groups:
        lines.append(
            f"Co-partitioned for {', '.join(group.required_by)}: "
            f"{list(group.topics) or ''}{' + patterns' if len(group.topics) < len(group.source_nodes) else ''}"
        )
    return "\n".join(lines) + "\n"


def _partitions(resolved: ResolvedTopology | None, topic: str) -> str:
    if resolved is None or topic not in resolved.partitions:
        return ""
    return f", {resolved.partitions[topic]} partitions"


# --------------------------------------------------------------------------- Mermaid


def _mermaid_id(prefix: str, name: str) -> str:
    # Mermaid ids must be plain words; the prefix keeps nodes, topics and stores apart.
    return prefix + re.sub(r"[^A-Za-z0-9_]", lambda m: f"_{ord(m.group()):x}_", name)


def _label(text: str) -> str:
    return '"' + text.replace('"', "#quot;") + '"'


def to_mermaid(topology: Topology) -> str:
    """A ``flowchart LR``: sub-topologies as subgraphs, topics as asymmetric boxes, stores as
    cylinders (dotted links to the nodes using them)."""
    lines = ["flowchart LR"]
    topics: dict[str, str] = {}
    for node in topology.nodes.values():
        for topic in topics_of(node):
            topics.setdefault(topic, _mermaid_id("t_", topic))
        if isinstance(node, SourceNode) and node.pattern is not None:
            topics.setdefault(f"/{node.pattern}/", _mermaid_id("t_", f"/{node.pattern}/"))
    for name, topic_id in topics.items():
        lines.append(f"  {topic_id}>{_label(name)}]")
    for sub in topology.subtopologies:
        lines.append(f"  subgraph st{sub.id}[{_label(f'Sub-topology {sub.id}')}]")
        for node in topology.nodes_of(sub.id):
            label = _label(f"{node.name}<br/>{node.kind}")
            node_id = _mermaid_id("n_", node.name)
            shape = f"([{label}])" if is_source(node) or isinstance(node, SinkNode) else f"[{label}]"
            lines.append(f"    {node_id}{shape}")
        for store in sub.stores:
            lines.append(f"    {_mermaid_id('s_', store)}[({_label(store)})]")
        lines.append("  end")
    for node in topology.nodes.values():
        node_id = _mermaid_id("n_", node.name)
        match node:
            case SourceNode(pattern=str(pattern)):
                lines.append(f"  {topics[f'/{pattern}/']} --> {node_id}")
            case SourceNode() | TableSourceNode():
                lines.extend(f"  {topics[topic]} --> {node_id}" for topic in node.topics)
            case SinkNode():
                lines.append(f"  {node_id} --> {topics[node.topic]}")
        for child in node.children:
            lines.append(f"  {node_id} --> {_mermaid_id('n_', child)}")
        for store in stores_of(node):
            lines.append(f"  {node_id} -.- {_mermaid_id('s_', store)}")
        if isinstance(node, StreamGlobalJoinNode):
            lines.append(f"  {node_id} -.- {_mermaid_id('g_', node.global_table)}")
    for table in topology.global_tables.values():
        # Outside every sub-topology: each worker holds all of it.
        topic_id = _mermaid_id("t_", table.topic)
        lines.append(f"  {topic_id}>{_label(table.topic)}]")
        lines.append(f"  {_mermaid_id('g_', table.name)}[({_label(f'{table.name}<br/>global table')})]")
        lines.append(f"  {topic_id} --> {_mermaid_id('g_', table.name)}")
    return "\n".join(lines) + "\n"
