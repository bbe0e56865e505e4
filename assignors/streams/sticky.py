"""``StickyTaskAssignor``: the client-side assignor of a Streams group (name ``"streams"``).

It assigns *tasks*, not partitions. The group's subscribed partitions are mapped to tasks
through the resolved topology (a task = a sub-topology on one partition number; it reads that
partition number of every source topic of its sub-topology), and a task's partitions always go
to one member together, which is what co-partitioned joins need.

``assign`` decodes each member's metadata at the version the member sent (-1 for classic members,
whose subscription userData it is: see ``metadata``), groups members
(stream threads) into processes by process id, and hands the tasks to ``placement.place_tasks``:
sticky and balanced actives that run only where their state is caught up, standby replicas
(``HaConfig.num_standby_replicas``, rack-aware) and warm-up replicas where an active should move
to. A task is *stateful* when its sub-topology has a store with a changelog; a task's current
owner is the member whose *target* holds most of its partitions. Each member's assignment
metadata is written at the highest version that member understands, so a rolling upgrade from
v1 keeps working; a classic member's at -1, the one version a classic member reads. ``partitions_by_host`` lists every endpoint's active partitions and
``standby_partitions_by_host`` its standbys' (v2 only).

Errors (the whole group gets the same one):

* members that disagree on the topology hash: INCONSISTENT_TOPOLOGY as the group-level error
  (the coordinator keeps the current target and reports the error to every member);
* undecodable member metadata: ASSIGNMENT_ERROR, likewise;
* a member whose reason is SHUTDOWN: every member keeps its current partitions and its
  assignment metadata carries SHUTDOWN, so every worker of the app stops.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from uuid import UUID

from pystreams.assignors.api import (
    AssignmentSpec,
    AssignorMetadata,
    GroupAssignment,
    MemberAssignment,
    MemberSpec,
)
from pystreams.topology.ir import TaskId
from pystreams.topology.resolve import ResolvedTopology

from .metadata import (
    CLASSIC_METADATA_VERSION,
    LOWEST_READABLE_VERSION,
    MAXIMUM_METADATA_VERSION,
    MEMBER_METADATA_VERSION,
    MINIMUM_METADATA_VERSION,
    AssignmentError,
    AssignmentMetadataWriter,
    ClassicStreamsMemberMetadata,
    MemberReason,
    MetadataDecodeError,
    StreamsAssignmentMetadata,
    StreamsMemberMetadata,
    decode_assignment_metadata,
    decode_member_metadata,
    encode_member_metadata,
    task_lags_from,
)
from .placement import HaConfig, MemberTasks, ProcessSpec, place_tasks

log = logging.getLogger(__name__)

ASSIGNOR_NAME = "streams"

TopicIdPartition = tuple[UUID, int]


class StickyTaskAssignor:
    """See the module docstring. One instance per member (stream thread)."""

    name = ASSIGNOR_NAME
    minimum_version = LOWEST_READABLE_VERSION
    maximum_version = MAXIMUM_METADATA_VERSION
    #: Under the classic protocol a Streams group rebalances cooperatively: only moving tasks
    #: are revoked (KIP-429), as Kafka Streams' own classic assignor does.
    supported_protocols = ("cooperative",)

    def __init__(
        self,
        resolved: ResolvedTopology,
        *,
        process_id: UUID,
        user_endpoint: str = "",
        client_tags: Mapping[str, str] | None = None,
        on_assignment: Callable[[int, StreamsAssignmentMetadata | None, int], None] | None = None,
        ha: HaConfig = HaConfig(),
    ) -> None:
        self.resolved = resolved
        self.ha = ha
        self.process_id = process_id
        self.user_endpoint = user_endpoint
        self.client_tags = dict(client_tags or {})
        self._on_assignment = on_assignment
        # metadata() runs on the asyncio thread; lags and reasons may be set from the engine's.
        self._lock = threading.Lock()
        self._reason = MemberReason.NONE
        self._task_lags: dict[str, int] = {}
        self.latest_error: int = AssignmentError.NONE
        self.latest_assignment: StreamsAssignmentMetadata | None = None

    # -- what this member advertises ----------------------------------------------------------

    @property
    def topology_hash(self) -> UUID:
        return self.resolved.topology.hash

    def set_reason(self, reason: MemberReason) -> None:
        """Ask for a new assignment (sent with the next heartbeat; cleared by the next one)."""
        with self._lock:
            self._reason = reason

    def set_task_lags(self, lags: Mapping[TaskId, int]) -> None:
        with self._lock:
            self._task_lags = task_lags_from(lags)

    def report(self, lags: Mapping[TaskId, int], reason: MemberReason) -> None:
        """Fresh lags together with the reason that makes them worth a reassignment: the KIP
        sends TaskLag only with a non-zero reason, so both change in one step."""
        with self._lock:
            self._task_lags = task_lags_from(lags)
            self._reason = reason

    def member_metadata(self) -> StreamsMemberMetadata:
        with self._lock:
            lags = dict(self._task_lags)
        return StreamsMemberMetadata(
            process_id=self.process_id,
            user_endpoint=self.user_endpoint,
            client_tags=dict(sorted(self.client_tags.items())),
            topology_hash=self.topology_hash,
            task_lags=lags,
        )

    def metadata(self) -> AssignorMetadata:
        with self._lock:
            reason = self._reason
        return AssignorMetadata(
            reason=int(reason),
            version=MEMBER_METADATA_VERSION,
            data=encode_member_metadata(self.member_metadata()),
            minimum_version=LOWEST_READABLE_VERSION,
            maximum_version=MAXIMUM_METADATA_VERSION,
        )

    def classic_metadata(self) -> bytes:
        """What a classic member advertises (its subscription userData, read back at -1): the
        same metadata, with the reason the classic protocol has no field for."""
        with self._lock:
            reason = self._reason
        meta = self.member_metadata()
        return encode_member_metadata(
            ClassicStreamsMemberMetadata(
                process_id=meta.process_id,
                user_endpoint=meta.user_endpoint,
                client_tags=meta.client_tags,
                topology_hash=meta.topology_hash,
                task_lags=meta.task_lags,
                reason=int(reason),
            )
        )

    def on_assignment(self, error: int, assignment: MemberAssignment, group_epoch: int) -> None:
        """``error`` given to the callback is the group-level error, or else the one the
        member's assignment metadata carries (how SHUTDOWN reaches every member)."""
        decoded: StreamsAssignmentMetadata | None = None
        if assignment.metadata:
            try:
                decoded = decode_assignment_metadata(assignment.metadata_version, assignment.metadata)
            except MetadataDecodeError:
                log.warning("undecodable assignment metadata at epoch %d", group_epoch, exc_info=True)
        if not error and decoded is not None:
            error = decoded.error
        with self._lock:
            self.latest_error = error
            self.latest_assignment = decoded
            # A new assignment answered whatever the reason asked for.
            if self._reason is not MemberReason.SHUTDOWN:
                self._reason = MemberReason.NONE
        if error == AssignmentError.INCONSISTENT_TOPOLOGY:
            log.error("the group's members run different topologies (assignment error %d)", error)
        elif error == AssignmentError.SHUTDOWN:
            log.warning("a member asked the application to shut down (assignment error %d)", error)
        if self._on_assignment is not None:
            self._on_assignment(error, decoded, group_epoch)

    # -- the assignment -----------------------------------------------------------------------

    def assign(self, spec: AssignmentSpec) -> GroupAssignment:
        member_ids = sorted(spec.members)
        try:
            metadata = {mid: _member_metadata(spec.members[mid]) for mid in member_ids}
        except MetadataDecodeError as error:
            log.error("cannot assign: %s", error)
            return _keep_targets(spec, AssignmentError.ASSIGNMENT_ERROR)
        hashes = {meta.topology_hash for meta in metadata.values()}
        if len(hashes) > 1:
            log.error("members disagree on the topology hash: %s", sorted(map(str, hashes)))
            return _keep_targets(spec, AssignmentError.INCONSISTENT_TOPOLOGY)
        if not member_ids:
            return GroupAssignment(members={})

        partitions_of_task = self.task_partitions(spec)
        owner_of = _current_owners(spec, partitions_of_task)
        versions = {mid: _assignment_version(spec.members[mid]) for mid in member_ids}
        shutdown_by = [mid for mid in member_ids if _reason(spec.members[mid], metadata[mid]) == MemberReason.SHUTDOWN]
        if shutdown_by:
            log.warning("members %s asked the application to shut down", shutdown_by)
            return _shutdown(spec, owner_of, versions)

        stateful_subtopologies = self.resolved.stateful_subtopologies
        placement = place_tasks(
            partitions_of_task,
            {task for task in partitions_of_task if task.subtopology in stateful_subtopologies},
            _processes(metadata, partitions_of_task),
            owner_of,
            self.ha,
        )

        names = {topic_id: topic.name for topic_id, topic in spec.topics.items()}
        writer = AssignmentMetadataWriter(
            _partitions_by_host(metadata, placement, partitions_of_task, names, lambda tasks: tasks.active),
            _partitions_by_host(metadata, placement, partitions_of_task, names, lambda tasks: tasks.standby),
        )
        members: dict[str, MemberAssignment] = {}
        for mid in member_ids:
            tasks = placement[mid]
            by_topic: dict[UUID, set[int]] = {}
            for task in tasks.active:
                for topic_id, partition in partitions_of_task[task]:
                    by_topic.setdefault(topic_id, set()).add(partition)
            members[mid] = MemberAssignment(
                partitions={t: frozenset(ps) for t, ps in sorted(by_topic.items())},
                metadata_version=versions[mid],
                metadata=writer.encode(versions[mid], tasks.active, tasks.standby, tasks.warmup),
            )
        return GroupAssignment(members=members)

    def task_partitions(self, spec: AssignmentSpec) -> dict[TaskId, tuple[TopicIdPartition, ...]]:
        """Each task of the topology with its input partitions that the spec's topics have;
        tasks with none (topics not subscribed or not there yet) are left out."""
        ids_by_name = {topic.name: topic for topic in spec.topics.values()}
        subscribed = frozenset().union(*(m.subscribed_topic_ids for m in spec.members.values()))
        result: dict[TaskId, tuple[TopicIdPartition, ...]] = {}
        for task in self.resolved.tasks:
            pairs = []
            for name, partition in self.resolved.input_partitions(task):
                topic = ids_by_name.get(name)
                if topic is not None and topic.topic_id in subscribed and partition < topic.num_partitions:
                    pairs.append((topic.topic_id, partition))
            if pairs:
                result[task] = tuple(sorted(pairs))
        return result


def _member_metadata(member: MemberSpec) -> StreamsMemberMetadata:
    if member.metadata is None or not member.metadata.data:
        raise MetadataDecodeError("a member advertised no Streams metadata")
    return decode_member_metadata(member.metadata.version, member.metadata.data)


def _reason(member: MemberSpec, metadata: StreamsMemberMetadata) -> int:
    """A KIP-848 member's reason travels in its own field, a classic member's in its metadata."""
    if isinstance(metadata, ClassicStreamsMemberMetadata):
        return metadata.reason
    return member.metadata.reason if member.metadata is not None else MemberReason.NONE


def _assignment_version(member: MemberSpec) -> int:
    """The highest assignment metadata version both this code and the member understand."""
    meta = member.metadata
    assert meta is not None  # _member_metadata refused members without metadata
    if meta.version == CLASSIC_METADATA_VERSION:
        return CLASSIC_METADATA_VERSION  # a classic member reads nothing else
    highest = meta.maximum_version or meta.version  # a member that sent no range speaks its version
    return max(MINIMUM_METADATA_VERSION, min(highest, MAXIMUM_METADATA_VERSION))


def _keep_targets(spec: AssignmentSpec, error: AssignmentError) -> GroupAssignment:
    """The group-level error makes the coordinator keep the current target; the members'
    entries say the same thing, for readers of the result."""
    writer = AssignmentMetadataWriter({}, {})
    members = {}
    for mid, member in sorted(spec.members.items()):
        version = _assignment_version(member) if member.metadata is not None else MINIMUM_METADATA_VERSION
        members[mid] = MemberAssignment(partitions=member.target_partitions, metadata_version=version, metadata=writer.encode(version, error=int(error)))
    return GroupAssignment(members=members, error=int(error))


def _shutdown(spec: AssignmentSpec, owner_of: Mapping[TaskId, str], versions: Mapping[str, int]) -> GroupAssignment:
    """Every member keeps what it has (nothing moves while the app stops) and is told SHUTDOWN
    in its assignment metadata; the assignment itself installs, so every member hears it."""
    held: dict[str, list[TaskId]] = {mid: [] for mid in spec.members}
    for task, mid in owner_of.items():
        held[mid].append(task)
    writer = AssignmentMetadataWriter({}, {})
    return GroupAssignment(
        members={
            mid: MemberAssignment(
                partitions=member.target_partitions,
                metadata_version=versions[mid],
                metadata=writer.encode(versions[mid], held[mid], error=AssignmentError.SHUTDOWN),
            )
            for mid, member in sorted(spec.members.items())
        }
    )


def _processes(metadata: Mapping[str, StreamsMemberMetadata], partitions_of_task: Mapping[TaskId, object]) -> list[ProcessSpec]:
    """Members grouped by process id; a process's lag for a task is its members' lowest."""
    by_process: dict[UUID, list[str]] = {}
    for mid in sorted(metadata):
        by_process.setdefault(metadata[mid].process_id, []).append(mid)
    processes = []
    for process_id, member_ids in sorted(by_process.items()):
        lags: dict[TaskId, int] = {}
        for mid in member_ids:
            for text, lag in metadata[mid].task_lags.items():
                try:
                    task = TaskId.parse(text)
                except ValueError:
                    continue  # not a task id: ignore rather than fail the group
                if task in partitions_of_task:
                    lags[task] = min(lag, lags.get(task, lag))
        processes.append(
            ProcessSpec(
                process_id=str(process_id),
                member_ids=tuple(member_ids),
                client_tags=metadata[member_ids[0]].client_tags,
                task_lags=lags,
            )
        )
    return processes


def _partitions_by_host(
    metadata: Mapping[str, StreamsMemberMetadata],
    placement: Mapping[str, MemberTasks],
    partitions_of_task: Mapping[TaskId, tuple[TopicIdPartition, ...]],
    names: Mapping[UUID, str],
    which: Callable[[MemberTasks], list[TaskId]],
) -> dict[str, list[tuple[str, int]]]:
    hosts: dict[str, list[tuple[str, int]]] = {}
    for mid in sorted(metadata):
        endpoint = metadata[mid].user_endpoint
        if endpoint:
            pairs = hosts.setdefault(endpoint, [])
            pairs.extend((names[t], p) for task in which(placement[mid]) for t, p in partitions_of_task[task])
    return hosts


def _current_owners(spec: AssignmentSpec, partitions_of_task: Mapping[TaskId, tuple[TopicIdPartition, ...]]) -> dict[TaskId, str]:
    """Task -> the member whose target holds most of its partitions (ties: lowest member id)."""
    holder: dict[TopicIdPartition, str] = {}
    for mid in sorted(spec.members, reverse=True):  # the lowest id wins a (malformed) shared partition
        for topic_id, partitions in spec.members[mid].target_partitions.items():
            for partition in partitions:
                holder[(topic_id, partition)] = mid
    owners: dict[TaskId, str] = {}
    for task, pairs in partitions_of_task.items():
        held: dict[str, int] = {}
        for pair in pairs:
            mid = holder.get(pair)
            if mid is not None:
                held[mid] = held.get(mid, 0) + 1
        if held:
            owners[task] = min(held, key=lambda m: (-held[m], m))
    return owners
