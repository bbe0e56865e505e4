"""``StickyTaskAssignor``: the client-side assignor of a Streams group (name ``"streams"``).

It assigns *tasks*, not partitions. The group's subscribed partitions are mapped to tasks
through the resolved topology (a task = a sub-topology on one partition number; it reads that
partition number of every source topic of its sub-topology), and a task's partitions always go
to one member together, which is what co-partitioned joins need.

Placement, deterministic for a given spec (sorted everywhere, ties broken by member id):

1. **Sticky.** A task's current owner is the member whose *target* holds the most of the task's
   partitions. Each member keeps up to its fair share of the tasks it owns: ``floor(T / M)``,
   and ``floor(T / M) + 1`` for as many members as ``T mod M`` allows (those owning the most
   first). An unchanged group therefore gets exactly its current assignment back.
2. **Balanced.** Every other task goes, in task order, to the member with the fewest tasks so
   far. Counts then differ by at most one.

Members that disagree on the topology hash get no new assignment: the group-level error is
INCONSISTENT_TOPOLOGY (the coordinator keeps the current target and reports the error to every
member in its assignment). Standby and warm-up placement is the next issue: the hooks
``_place_standbys`` and ``_place_warmups`` return nothing yet.
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
    MAXIMUM_METADATA_VERSION,
    METADATA_VERSION,
    MINIMUM_METADATA_VERSION,
    AssignmentError,
    MemberReason,
    MetadataDecodeError,
    StreamsAssignmentMetadata,
    StreamsMemberMetadata,
    decode_assignment_metadata,
    decode_member_metadata,
    encode_assignment_metadata,
    encode_member_metadata,
)

log = logging.getLogger(__name__)

ASSIGNOR_NAME = "streams"

TopicIdPartition = tuple[UUID, int]


class StickyTaskAssignor:
    """See the module docstring. One instance per member (stream thread)."""

    name = ASSIGNOR_NAME
    minimum_version = MINIMUM_METADATA_VERSION
    maximum_version = MAXIMUM_METADATA_VERSION

    def __init__(
        self,
        resolved: ResolvedTopology,
        *,
        process_id: UUID,
        user_endpoint: str = "",
        client_tags: Mapping[str, str] | None = None,
        on_assignment: Callable[[int, StreamsAssignmentMetadata | None, int], None] | None = None,
    ) -> None:
        self.resolved = resolved
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
            self._task_lags = {str(task): lag for task, lag in sorted(lags.items())}

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
            version=METADATA_VERSION,
            data=encode_member_metadata(self.member_metadata()),
            minimum_version=MINIMUM_METADATA_VERSION,
            maximum_version=MAXIMUM_METADATA_VERSION,
        )

    def on_assignment(self, error: int, assignment: MemberAssignment, group_epoch: int) -> None:
        decoded: StreamsAssignmentMetadata | None = None
        if assignment.metadata:
            try:
                decoded = decode_assignment_metadata(assignment.metadata_version, assignment.metadata)
            except MetadataDecodeError:
                log.warning("undecodable assignment metadata at epoch %d", group_epoch, exc_info=True)
        with self._lock:
            self.latest_error = error
            self.latest_assignment = decoded
            # A new assignment answered whatever the reason asked for.
            if self._reason is not MemberReason.SHUTDOWN:
                self._reason = MemberReason.NONE
        if error == AssignmentError.INCONSISTENT_TOPOLOGY:
            log.error("the group's members run different topologies (assignment error %d)", error)
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
        active = _balance_sticky(member_ids, sorted(partitions_of_task), owner_of)
        self._place_standbys(active, metadata)
        self._place_warmups(active, metadata)

        names = {topic_id: topic.name for topic_id, topic in spec.topics.items()}
        partitions_by_host: dict[str, list[tuple[str, int]]] = {}
        for mid in member_ids:
            endpoint = metadata[mid].user_endpoint
            if endpoint:
                held = partitions_by_host.setdefault(endpoint, [])
                held.extend((names[t], p) for task in active[mid] for t, p in partitions_of_task[task])
        partitions_by_host = {host: sorted(pairs) for host, pairs in sorted(partitions_by_host.items())}

        members: dict[str, MemberAssignment] = {}
        for mid in member_ids:
            by_topic: dict[UUID, set[int]] = {}
            for task in active[mid]:
                for topic_id, partition in partitions_of_task[task]:
                    by_topic.setdefault(topic_id, set()).add(partition)
            assignment_metadata = StreamsAssignmentMetadata(
                active_tasks=[str(task) for task in sorted(active[mid])],
                partitions_by_host=partitions_by_host,
            )
            members[mid] = MemberAssignment(
                partitions={t: frozenset(ps) for t, ps in sorted(by_topic.items())},
                metadata_version=METADATA_VERSION,
                metadata=encode_assignment_metadata(assignment_metadata),
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

    # -- hooks for the next issue (standby and warm-up replicas) ------------------------------

    def _place_standbys(self, active: Mapping[str, list[TaskId]], metadata: Mapping[str, StreamsMemberMetadata]) -> dict[str, list[TaskId]]:
        """num.standby.replicas placement (on other processes, by client tags): not yet."""
        return {}

    def _place_warmups(self, active: Mapping[str, list[TaskId]], metadata: Mapping[str, StreamsMemberMetadata]) -> dict[str, list[TaskId]]:
        """max.warmup.replicas / acceptable.recovery.lag placement from task lags: not yet."""
        return {}


def _member_metadata(member: MemberSpec) -> StreamsMemberMetadata:
    if member.metadata is None or not member.metadata.data:
        raise MetadataDecodeError("a member advertised no Streams metadata")
    return decode_member_metadata(member.metadata.version, member.metadata.data)


def _keep_targets(spec: AssignmentSpec, error: AssignmentError) -> GroupAssignment:
    """The group-level error makes the coordinator keep the current target; the members'
    entries say the same thing, for readers of the result."""
    failed = encode_assignment_metadata(StreamsAssignmentMetadata(error=int(error)))
    return GroupAssignment(
        members={
            mid: MemberAssignment(
                partitions=member.target_partitions, metadata_version=METADATA_VERSION, metadata=failed
            )
            for mid, member in sorted(spec.members.items())
        },
        error=int(error),
    )


def _current_owners(
    spec: AssignmentSpec, partitions_of_task: Mapping[TaskId, tuple[TopicIdPartition, ...]]
) -> dict[TaskId, str]:
    """Task -> the member whose target holds most of its partitions (ties: lowest member id)."""
    owners: dict[TaskId, str] = {}
    for task, pairs in partitions_of_task.items():
        best: tuple[int, str] | None = None
        for mid in sorted(spec.members):
            target = spec.members[mid].target_partitions
            held = sum(1 for topic_id, p in pairs if p in target.get(topic_id, ()))
            if held and (best is None or held > best[0]):
                best = (held, mid)
        if best is not None:
            owners[task] = best[1]
    return owners


def _balance_sticky(member_ids: list[str], tasks: list[TaskId], owner_of: Mapping[TaskId, str]) -> dict[str, list[TaskId]]:
    base, extra_slots = divmod(len(tasks), len(member_ids))
    owned: dict[str, list[TaskId]] = {mid: [] for mid in member_ids}
    for task in tasks:
        owner = owner_of.get(task)
        if owner in owned:
            owned[owner].append(task)
    assigned: dict[str, list[TaskId]] = {mid: owned[mid][:base] for mid in member_ids}
    # Members owning more than the base share keep one more while the spare slots last.
    for mid in sorted(member_ids, key=lambda m: (-len(owned[m]), m)):
        if extra_slots and len(owned[mid]) > base:
            assigned[mid].append(owned[mid][base])
            extra_slots -= 1
    placed = {task for kept in assigned.values() for task in kept}
    for task in tasks:
        if task in placed:
            continue
        fewest = min(member_ids, key=lambda m: (len(assigned[m]), m))
        assigned[fewest].append(task)
    return {mid: sorted(kept) for mid, kept in assigned.items()}
