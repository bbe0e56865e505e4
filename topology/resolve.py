"""From a topology and the cluster's partition counts to tasks and internal topic sizes.

Kafka Streams' rules:

* a sub-topology has one task per partition number of its inputs: ``max`` over its source
  topics' partition counts (co-partitioned ones are equal anyway);
* a repartition topic gets the task count of the sub-topology writing it (unless
  ``app.repartition(partitions=N)`` fixed it), then co-partitioning may override that: a
  repartition topic in a join's group takes the count of the group's external topics
  (or, with none, the group's largest);
* a changelog topic has one partition per task of the sub-topology owning its store;
* external topics of one co-partition group must have equal counts, else
  ``CopartitionError`` naming the topics, their counts and the joins;
* every named source topic must exist and every pattern match something, else
  ``MissingSourceError`` naming the source node; so must every global table's topic, whose
  partitions are all read by every worker (no task, no co-partitioning).

Sub-topologies are resolved writers-first, so every repartition topic is sized before the
sub-topology reading it counts its tasks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .builder import subtopology_order
from .errors import CopartitionError, InvalidPatternError, MissingSourceError, TopologyError
from .ir import InternalTopic, SourceNode, TableSourceNode, TaskId, TopicRole, Topology
from .patterns import matching_topics


@dataclass(frozen=True, slots=True, kw_only=True)
class TopicToCreate:
    name: str
    partitions: int
    config: Mapping[str, str]
    role: TopicRole


@dataclass(frozen=True, slots=True, kw_only=True)
class ResolvedTopology:
    topology: Topology
    #: Partition count of every topic the app reads or creates (and of known sink topics).
    partitions: Mapping[str, int]
    #: The concrete topics of each source node (patterns expanded), by node name.
    source_topics: Mapping[str, tuple[str, ...]]
    #: Number of tasks per sub-topology id.
    task_counts: Mapping[int, int]
    #: Every task, sorted by (sub-topology, partition).
    tasks: tuple[TaskId, ...]

    def tasks_of(self, subtopology: int) -> tuple[TaskId, ...]:
        return tuple(TaskId(subtopology, p) for p in range(self.task_counts[subtopology]))

    def input_partitions(self, task: TaskId) -> tuple[tuple[str, int], ...]:
        """The (topic, partition) pairs a task reads: partition ``task.partition`` of each of
        its sub-topology's source topics that has one."""
        pairs = []
        for node_name in self.topology.subtopologies[task.subtopology].source_nodes:
            for topic in self.source_topics[node_name]:
                if task.partition < self.partitions[topic]:
                    pairs.append((topic, task.partition))
        return tuple(pairs)

    def changelog_partition(self, store: str, task: TaskId) -> tuple[str, int] | None:
        """Where a task's instance of ``store`` is logged (None for an unlogged store)."""
        spec = self.topology.stores[store]
        if spec.subtopology != task.subtopology:
            raise ValueError(f"store {store!r} belongs to sub-topology {spec.subtopology}, not task {task}")
        return None if spec.changelog_topic is None else (spec.changelog_topic, task.partition)

    def changelog_partitions(self, task: TaskId) -> tuple[tuple[str, int], ...]:
        """Where each logged store of ``task`` is logged (empty: a stateless task, or one
        whose stores are all unlogged)."""
        stores = self.topology.stores
        return tuple(
            (topic, task.partition) for name in self.topology.subtopologies[task.subtopology].stores if (topic := stores[name].changelog_topic) is not None
        )

    @property
    def stateful_subtopologies(self) -> frozenset[int]:
        """Sub-topologies whose tasks have logged state (restoring them takes time; replicas help)."""
        return frozenset(s.subtopology for s in self.topology.stores.values() if s.changelog_topic is not None)

    def topics_to_create(self) -> tuple[TopicToCreate, ...]:
        """The internal topics with their partition counts and configs, sorted by name."""
        return tuple(
            TopicToCreate(name=t.name, partitions=self.partitions[t.name], config=dict(t.config), role=t.role) for t in self.topology.internal_topics.values()
        )


def resolve(topology: Topology, partitions_by_topic: Mapping[str, int]) -> ResolvedTopology:
    """Tasks and internal partition counts, given the cluster's topics and partition counts.

    ``partitions_by_topic`` may include this app's internal topics from an earlier run; they
    must then already have the partition count the rules give.
    """
    for topic, count in partitions_by_topic.items():
        if not isinstance(count, int) or count < 1:
            raise ValueError(f"topic {topic!r}: partition count must be a positive int, got {count!r}")
    internal = topology.internal_topics
    source_topics = _source_topics(topology, partitions_by_topic)
    counts: dict[str, int] = {t: partitions_by_topic[t] for ts in source_topics.values() for t in ts if t not in internal}
    task_counts: dict[int, int] = {}

    for sub_id in subtopology_order(topology.subtopologies, internal):
        sub = topology.subtopologies[sub_id]
        for group in topology.copartition_groups:
            if group.source_nodes[0] in sub.source_nodes:
                _copartition(topology, group.source_nodes, group.required_by, source_topics, counts)
        known = [counts[t] for n in sub.source_nodes for t in source_topics[n] if t in counts]
        if not known:
            raise TopologyError(f"sub-topology {sub_id} has no input with a known partition count", nodes=sub.source_nodes)
        task_counts[sub_id] = max(known)
        for topic in internal.values():
            if topic.role is TopicRole.REPARTITION and topic.subtopology == sub_id and topic.name not in counts:
                counts[topic.name] = topic.partitions or task_counts[sub_id]
        # A repartition topic read by its own writer is sized only now; count it as an input too.
        task_counts[sub_id] = max(counts[t] for n in sub.source_nodes for t in source_topics[n])

    for topic in internal.values():
        if topic.role is TopicRole.CHANGELOG:
            counts[topic.name] = task_counts[topic.subtopology]
    _check_existing_internal_topics(internal, partitions_by_topic, counts)
    for topic in topology.sink_topics:
        if topic in partitions_by_topic:
            counts.setdefault(topic, partitions_by_topic[topic])
    for table in topology.global_tables.values():
        if table.topic not in partitions_by_topic:
            raise MissingSourceError(
                f"global table {table.name!r} reads {table.topic!r}, which the cluster does not have", nodes=[table.name], topics=[table.topic]
            )
        counts[table.topic] = partitions_by_topic[table.topic]

    tasks = tuple(TaskId(sub_id, p) for sub_id in sorted(task_counts) for p in range(task_counts[sub_id]))
    return ResolvedTopology(
        topology=topology,
        partitions=dict(sorted(counts.items())),
        source_topics=source_topics,
        task_counts=dict(sorted(task_counts.items())),
        tasks=tasks,
    )


def _source_topics(topology: Topology, partitions_by_topic: Mapping[str, int]) -> dict[str, tuple[str, ...]]:
    """Concrete topics per source node; patterns never match this app's internal topics."""
    candidates = [t for t in partitions_by_topic if t not in topology.internal_topics]
    result: dict[str, tuple[str, ...]] = {}
    claimed: dict[str, str] = {}
    for node in topology.nodes.values():
        if not isinstance(node, SourceNode | TableSourceNode):
            continue
        if isinstance(node, SourceNode) and node.internal:
            result[node.name] = node.topics
            continue
        if isinstance(node, SourceNode) and node.pattern is not None:
            topics = matching_topics(node.pattern, node.name, candidates)
            if not topics:
                raise MissingSourceError(f"source {node.name!r}: pattern {node.pattern!r} matches no topic", nodes=[node.name])
        else:
            missing = [t for t in node.topics if t not in partitions_by_topic]
            if missing:
                raise MissingSourceError(
                    f"source {node.name!r} reads {missing}, which the cluster does not have",
                    nodes=[node.name],
                    topics=missing,
                )
            topics = node.topics
        for topic in topics:
            if topic in claimed:
                raise InvalidPatternError(
                    f"topic {topic!r} would feed both {claimed[topic]!r} and {node.name!r}",
                    nodes=[claimed[topic], node.name],
                    topics=[topic],
                )
            claimed[topic] = node.name
        result[node.name] = topics
    return result


def _copartition(
    topology: Topology,
    source_nodes: tuple[str, ...],
    joins: tuple[str, ...],
    source_topics: Mapping[str, tuple[str, ...]],
    counts: dict[str, int],
) -> None:
    internal = topology.internal_topics
    topics = [t for n in source_nodes for t in source_topics[n]]
    external = {t: counts[t] for t in topics if t not in internal}
    if len(set(external.values())) > 1:
        listing = ", ".join(f"{t!r} ({n} partitions)" for t, n in external.items())
        raise CopartitionError(
            f"join {', '.join(map(repr, joins))} needs co-partitioned inputs, but {listing} differ; sources {list(source_nodes)}",
            nodes=[*joins, *source_nodes],
            topics=list(external),
        )
    fixed = {t: internal[t].partitions for t in topics if t in internal and internal[t].partitions}
    if external:
        target = next(iter(external.values()))
    elif fixed:
        target = next(iter(fixed.values()))
    else:
        target = max((counts[t] for t in topics if t in counts), default=0)
    for topic, partitions in fixed.items():
        if partitions != target:
            raise CopartitionError(
                f"join {', '.join(map(repr, joins))} needs co-partitioned inputs, but repartition topic "
                f"{topic!r} is fixed at {partitions} partitions and its partners have {target}",
                nodes=[*joins, *source_nodes],
                topics=[topic, *external],
            )
    if target:
        for topic in topics:
            if topic in internal:
                counts[topic] = target


def _check_existing_internal_topics(internal: Mapping[str, InternalTopic], existing: Mapping[str, int], counts: Mapping[str, int]) -> None:
    for name in internal:
        if name in existing and existing[name] != counts[name]:
            raise TopologyError(
                f"internal topic {name!r} exists with {existing[name]} partitions, but the "
                f"topology needs {counts[name]}; delete it (app reset) or keep the input sizes",
                topics=[name],
            )
