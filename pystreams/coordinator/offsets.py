"""OffsetCommit and OffsetFetch for consumer groups, fenced by the member epoch (KIP-848).

A member commits with its member epoch: a newer epoch than the coordinator's is FENCED, an
older one STALE (retry after the next heartbeat). Admin tools commit with no member and epoch
-1, allowed only while the group has no members. Topics come by name or, from v10 as in
Apache Kafka, by topic id; an offset remembers the topic id it was committed for, so a
re-created topic does not inherit its predecessor's offsets.
"""
from __future__ import annotations

from uuid import UUID

import kafka.errors as Errors

from pystreams.coordinator import records as r
from pystreams.coordinator.consumer import RequestError
from pystreams.coordinator.consumer_group import ConsumerGroup
from pystreams.protocol import messages as m

NIL_UUID = UUID(int=0)


def _has_id(topic_id) -> bool:
    return topic_id is not None and topic_id != NIL_UUID


class OffsetHandlers:
    """Mixed into the shard. Expects ``groups``, ``topics``, ``emit``, ``create_group``."""

    def _validate_member(self, group: ConsumerGroup | None, member_id: str | None, member_epoch: int) -> None:
        if group is None:
            raise RequestError(Errors.UnknownMemberIdError, f"Member {member_id} is unknown: the group does not exist.")
        member = group.members.get(member_id or "")
        if member is None:
            raise RequestError(Errors.UnknownMemberIdError, f"Member {member_id!r} is not a member of group {group.group_id}.")
        if member_epoch > member.member_epoch:
            raise RequestError(Errors.FencedMemberEpochError, f"Member epoch {member_epoch} is newer than the coordinator's {member.member_epoch}.")
        if member_epoch < member.member_epoch:
            raise RequestError(Errors.StaleMemberEpochError, f"Member epoch {member_epoch} is stale; the member's epoch is {member.member_epoch}.")

    def _topic_name(self, topic) -> tuple[str | None, UUID | None, int]:
        """(name, topic id, error code) of a request topic given by name or by id."""
        if topic.name and _has_id(getattr(topic, "topic_id", None)):
            return None, None, Errors.InvalidRequestError.errno
        if _has_id(getattr(topic, "topic_id", None)):
            for metadata in self.topics.values():
                if metadata.topic_id == topic.topic_id:
                    return metadata.name, topic.topic_id, 0
            return None, topic.topic_id, Errors.UnknownTopicIdError.errno
        return topic.name, None, 0

    def offset_commit(self, request, now_ms: int):
        Response = m.OffsetCommitResponse
        Topic, Partition = Response.OffsetCommitResponseTopic, Response.OffsetCommitResponseTopic.OffsetCommitResponsePartition
        group = self.groups.get(request.group_id)
        error = 0
        try:
            if not request.group_id:
                raise RequestError(Errors.InvalidGroupIdError, "GroupId must be non-empty.")
            if group is not None and group.group_type != "consumer":
                raise RequestError(Errors.InconsistentGroupProtocolError, f"Group {request.group_id} is not a consumer group.")
            if request.generation_id_or_member_epoch < 0 and not request.member_id:
                if group is not None and group.members:
                    raise RequestError(Errors.UnknownMemberIdError, "Commits without a member are only accepted while the group has no members.")
            else:
                self._validate_member(group, request.member_id, request.generation_id_or_member_epoch)
        except RequestError as exc:
            error = exc.code
        topics = []
        for topic in request.topics:
            name, topic_id, topic_error = self._topic_name(topic)
            code = error or topic_error
            if not code and group is None:
                group = self.create_group(request.group_id, now_ms)
            for p in topic.partitions:
                if not code:
                    value = r.OffsetCommitValue(
                        offset=p.committed_offset,
                        commit_timestamp_ms=now_ms,
                        leader_epoch=p.committed_leader_epoch,
                        metadata=p.committed_metadata,
                        topic_id=topic_id,
                    )
                    self.emit(r.Record(r.OffsetCommitKey(request.group_id, name, p.partition_index), value))
            topics.append(
                Topic(name=topic.name, topic_id=getattr(topic, "topic_id", None) or NIL_UUID, partitions=[Partition(partition_index=p.partition_index, error_code=code) for p in topic.partitions])
            )
        return Response(topics=topics)

    def _fetch_group(self, group_id: str, member_id, member_epoch: int, topics):
        """(group error, [(request topic or None, name, topic id, [(partition, value|None, error)])])."""
        group = self.groups.get(group_id)
        if member_id or member_epoch >= 0:
            try:
                self._validate_member(group, member_id, member_epoch)
            except RequestError as exc:
                return exc.code, []
        out = []
        if topics is None:
            stored: dict[str, list] = {}
            for (name, partition), value in sorted((group.offsets if group else {}).items()):
                stored.setdefault(name, []).append((partition, value, 0))
            for name, parts in stored.items():
                topic_id = self.topics[name].topic_id if name in self.topics else NIL_UUID
                out.append((None, name, topic_id, parts))
            return 0, out
        for topic in topics:
            name, topic_id, error = self._topic_name(topic)
            parts = []
            for partition in topic.partition_indexes:
                value = group.offsets.get((name, partition)) if (group is not None and not error) else None
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
                error, topics = self._fetch_group(g.group_id, g.member_id, g.member_epoch, g.topics)
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
        error, topics = self._fetch_group(request.group_id, None, -1, request.topics)
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
