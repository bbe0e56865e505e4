"""Committed offsets: OffsetCommit and OffsetFetch, and the offsets each group holds.

Offsets live here, beside the groups rather than inside them (as in Kafka's
OffsetMetadataManager), so they survive whatever happens to the group that committed them. The
group decides whether a commit or fetch is allowed (``validate_offset_commit``): a KIP-848
member commits with its member epoch (newer is FENCED, older STALE), admin tools with no member
and epoch -1 while the group has no members. Topics come by name or, from v10 as in Apache
Kafka, by topic id; an offset remembers the topic id it was committed for, so a re-created topic
does not inherit its predecessor's offsets.

Bounds on what a stranger can store: commit metadata is at most ``offset.metadata.max.bytes``
(OFFSET_METADATA_TOO_LARGE, as Kafka), topic names follow Kafka's rules, and the all-zero topic
id is no topic.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any
from uuid import UUID

import kafka.errors as Errors

from pystreams.coordinator import records as r
from pystreams.coordinator.consumer_group import ConsumerGroup
from pystreams.coordinator.context import ShardContext
from pystreams.coordinator.errors import RequestError
from pystreams.protocol import messages as m

NIL_UUID = UUID(int=0)
#: Kafka's topic name rules (org.apache.kafka.common.internals.Topic).
_LEGAL_TOPIC = re.compile(r"[a-zA-Z0-9._-]{1,249}")

Offsets = dict[tuple[str, int], r.OffsetCommitValue]


def _has_id(topic_id: UUID | None) -> bool:
    return topic_id is not None and topic_id != NIL_UUID


class OffsetManager:
    def __init__(self, ctx: ShardContext, create_group: Callable[[str, int], object]) -> None:
        self.ctx = ctx
        self._create_group = create_group
        #: group id -> (topic, partition) -> committed offset
        self.offsets: dict[str, Offsets] = {}

    # --- records ----------------------------------------------------------------------------

    def replay(self, record: r.OffsetCommit) -> None:
        key = (record.topic, record.partition)
        if record.value is None:
            held = self.offsets.get(record.group_id)
            if held is not None:
                held.pop(key, None)
                if not held:
                    del self.offsets[record.group_id]
        else:
            self.offsets.setdefault(record.group_id, {})[key] = record.value

    def pre_image(self, record: r.OffsetCommit) -> r.OffsetCommit:
        held = self.offsets.get(record.group_id, {}).get((record.topic, record.partition))
        return r.OffsetCommit(record.group_id, record.topic, record.partition, held)

    def of(self, group_id: str) -> Offsets:
        return self.offsets.get(group_id, {})

    def delete_all(self, group_id: str) -> None:
        """Tombstone every offset of a group that is being deleted."""
        for topic, partition in sorted(self.of(group_id)):
            self.ctx.emit(r.OffsetCommit(group_id, topic, partition, None))

    # --- OffsetCommit -----------------------------------------------------------------------

    def _topic_name(self, topic, version: int | None) -> tuple[str | None, UUID | None, int]:
        """(name, topic id, error code) of a request topic: by id from v10, by name before."""
        topic_id = getattr(topic, "topic_id", None)
        if topic.name and _has_id(topic_id):
            return None, None, Errors.InvalidRequestError.errno
        if _has_id(topic_id):
            for metadata in self.ctx.topics.values():
                if metadata.topic_id == topic_id:
                    return metadata.name, topic_id, 0
            return None, topic_id, Errors.UnknownTopicIdError.errno
        if version is not None and version >= 10:
            return None, None, Errors.UnknownTopicIdError.errno  # the all-zero id names no topic
        if not _LEGAL_TOPIC.fullmatch(topic.name or ""):
            return None, None, Errors.UnknownTopicOrPartitionError.errno  # no such topic can exist
        return topic.name, None, 0

    def offset_commit(self, request, now_ms: int):
        Response = m.OffsetCommitResponse
        Topic, Partition = Response.OffsetCommitResponseTopic, Response.OffsetCommitResponseTopic.OffsetCommitResponsePartition
        max_metadata = self.ctx.config.offset_metadata_max_bytes
        error = 0
        group = None
        try:
            if not request.group_id:
                raise RequestError(Errors.InvalidGroupIdError, "GroupId must be non-empty.")
            group = self.ctx.groups.get(request.group_id)
            if group is None:
                if request.generation_id_or_member_epoch >= 0 or request.member_id:
                    # Kafka's answer: a commit for a generation of a group that does not exist.
                    missing = Errors.GroupIdNotFoundError if (request.API_VERSION or 0) >= 9 else Errors.IllegalGenerationError
                    raise RequestError(missing, f"Group {request.group_id} does not exist; member {request.member_id!r} cannot commit.")
            else:
                group.validate_offset_commit(request.member_id, request.generation_id_or_member_epoch, getattr(request, "group_instance_id", None))
        except RequestError as exc:
            error = exc.code
        topics = []
        for topic in request.topics:
            name, topic_id, topic_error = self._topic_name(topic, request.API_VERSION)
            partitions = []
            for p in topic.partitions:
                code = error or topic_error
                if not code and p.committed_metadata is not None and len(p.committed_metadata.encode("utf-8", "surrogatepass")) > max_metadata:
                    code = Errors.OffsetMetadataTooLargeError.errno
                if not code:
                    if group is None:
                        group = self._create_group(request.group_id, now_ms)
                    assert name is not None, "_topic_name names every topic it reports no error for"
                    value = r.OffsetCommitValue(
                        offset=p.committed_offset,
                        commit_timestamp_ms=now_ms,
                        leader_epoch=p.committed_leader_epoch,
                        metadata=p.committed_metadata,
                        topic_id=topic_id,
                    )
                    self.ctx.emit(r.OffsetCommit(request.group_id, name, p.partition_index, value))
                partitions.append(Partition(partition_index=p.partition_index, error_code=code))
            topics.append(Topic(name=topic.name, topic_id=getattr(topic, "topic_id", None) or NIL_UUID, partitions=partitions))
        # A KIP-848 member behind its group's epoch has a rebalance step to take: it learns so
        # from this commit rather than at its next heartbeat (the tagged GroupEpoch field).
        group_epoch = group.group_epoch if isinstance(group, ConsumerGroup) else -1
        return Response(topics=topics, group_epoch=group_epoch)

    # --- OffsetFetch ------------------------------------------------------------------------

    def _fetch_group(self, group_id: str, member_id, member_epoch: int, topics, version: int | None):
        """(group error, [(request topic or None, name, topic id, [(partition, value|None, error)])])."""
        try:
            group = self.ctx.groups.get(group_id)
            if group is not None:
                group.validate_offset_fetch(member_id, member_epoch)
            elif member_id or member_epoch >= 0:
                raise RequestError(Errors.UnknownMemberIdError, f"Member {member_id} is unknown: the group does not exist.")
        except RequestError as exc:
            return exc.code, []
        stored_offsets = self.of(group_id)
        out: list[tuple[Any, str | None, UUID | None, list]] = []
        name: str | None  # by-id topics may name none
        topic_id: UUID | None
        value: r.OffsetCommitValue | None  # none committed, or committed for an earlier topic
        if topics is None:
            stored: dict[str, list] = {}
            for (name, partition), value in sorted(stored_offsets.items()):
                stored.setdefault(name, []).append((partition, value, 0))
            for name, parts in stored.items():
                topic_id = self.ctx.topics[name].topic_id if name in self.ctx.topics else NIL_UUID
                out.append((None, name, topic_id, parts))
            return 0, out
        for topic in topics:
            name, topic_id, error = self._topic_name(topic, version)
            parts = []
            for partition in topic.partition_indexes:
                value = None if error or name is None else stored_offsets.get((name, partition))
                if value is not None and topic_id is not None and value.topic_id is not None and value.topic_id != topic_id:
                    value = None  # committed for an earlier topic of the same name
                parts.append((partition, value, error))
            out.append((topic, name, topic_id, parts))
        return 0, out

    def offset_fetch(self, request, now_ms: int):
        Response = m.OffsetFetchResponse
        version = request.API_VERSION
        if version is None:  # built in-process rather than decoded: the layout tells
            version = 8 if request.groups else 7
        if version >= 8:
            Group = Response.OffsetFetchResponseGroup
            Topics, Partitions = Group.OffsetFetchResponseTopics, Group.OffsetFetchResponseTopics.OffsetFetchResponsePartitions
            groups = []
            for g in request.groups:
                error, topics = self._fetch_group(g.group_id, g.member_id, g.member_epoch, g.topics, request.API_VERSION)
                groups.append(
                    Group(
                        group_id=g.group_id,
                        error_code=error,
                        topics=[
                            Topics(
                                name=name if request_topic is None or request_topic.name else "",
                                topic_id=topic_id or NIL_UUID,
                                partitions=[_partition(Partitions, p, v, e) for p, v, e in parts],
                            )
                            for request_topic, name, topic_id, parts in topics
                        ],
                    )
                )
            return Response(groups=groups)
        Topic, Partition = Response.OffsetFetchResponseTopic, Response.OffsetFetchResponseTopic.OffsetFetchResponsePartition
        error, topics = self._fetch_group(request.group_id, None, -1, request.topics, request.API_VERSION)
        return Response(
            error_code=error,
            topics=[Topic(name=name, partitions=[_partition(Partition, p, v, e) for p, v, e in parts]) for _, name, _, parts in topics],
        )


def _partition(struct, partition: int, value: r.OffsetCommitValue | None, error: int):
    if value is None:
        return struct(partition_index=partition, committed_offset=-1, committed_leader_epoch=-1, metadata="", error_code=error)
    return struct(
        partition_index=partition,
        committed_offset=value.offset,
        committed_leader_epoch=value.leader_epoch,
        metadata=value.metadata if value.metadata is not None else "",
        error_code=error,
    )
