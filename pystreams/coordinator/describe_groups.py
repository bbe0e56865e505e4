"""DescribeGroups (the classic API), for classic groups and for KIP-848 consumer groups.

A classic group is described as Kafka does: its state, protocol type, and when Stable the
selected protocol and each member's metadata for it; every member's assignment bytes.

Standard admin tooling (``kafka-consumer-groups.sh --describe``, kafka-python's
``KafkaAdminClient.describe_groups``) still speaks DescribeGroups. Kafka answers it for a
consumer group with the group's state, protocol type ``consumer``, the assignor as protocol
data, and for every member a ``ConsumerProtocolSubscription`` (its topics) as member metadata
and a ``ConsumerProtocolAssignment`` (its partitions, by topic name) as member assignment — the
shapes a classic consumer group would carry, so tools decode them without knowing KIP-848.

A group that does not exist is "Dead" with no members; from v6 on (KIP-1043) it also carries
GROUP_ID_NOT_FOUND, before v6 no error.
"""

from __future__ import annotations

from uuid import UUID

import kafka.errors as Errors
from kafka.protocol.consumer.metadata import (
    ConsumerProtocolAssignment,
    ConsumerProtocolSubscription,
    ConsumerProtocolType,
)

from pystreams.coordinator.classic_group import ClassicGroup, ClassicGroupState
from pystreams.coordinator.consumer import ConsumerGroupManager
from pystreams.coordinator.consumer_group import CONSUMER, ConsumerGroup, ConsumerMember, GroupState
from pystreams.coordinator.context import ShardContext
from pystreams.coordinator.errors import RequestError
from pystreams.coordinator.subscriptions import InvalidRegex, matching_topics
from pystreams.partitions import PartitionSet
from pystreams.protocol import messages as m

#: The versions Kafka's ConsumerProtocol writes today; clients read any version up to theirs.
SUBSCRIPTION_VERSION = 3
ASSIGNMENT_VERSION = 3
#: DescribeGroups v6 is the first to report GROUP_ID_NOT_FOUND (KIP-1043).
NOT_FOUND_ERROR_VERSION = 6


class DescribeGroupsHandler:
    def __init__(self, ctx: ShardContext, consumer: ConsumerGroupManager) -> None:
        self.ctx = ctx
        self.consumer = consumer

    def describe_groups(self, request, now_ms: int):
        Response = m.DescribeGroupsResponse
        version = request.API_VERSION
        if version is None:  # built in-process rather than decoded: answer as the newest version
            version = NOT_FOUND_ERROR_VERSION
        described = []
        for group_id in request.groups or []:
            try:
                group = self.ctx.groups.get(group_id)
            except RequestError as exc:
                described.append(_failed_group(group_id, exc))
                continue
            if isinstance(group, ClassicGroup):
                described.append(_classic_group(group))
                continue
            if group is None or group.group_type != CONSUMER:
                described.append(_dead_group(group_id, version))
                continue
            _, assignor = self.consumer.select_assignor(group)
            names = self._topic_names(group)
            members = [
                Response.DescribedGroup.DescribedGroupMember(
                    member_id=member.member_id,
                    group_instance_id=member.instance_id,
                    client_id=member.client_id,
                    client_host=member.client_host,
                    member_metadata=_subscription(group, member),
                    member_assignment=_assignment(member.assigned, names),
                )
                for member in sorted(group.members.values(), key=lambda member: member.member_id)
            ]
            described.append(
                Response.DescribedGroup(
                    error_code=0,
                    error_message=None,
                    group_id=group_id,
                    group_state=group.state.value,
                    protocol_type=ConsumerProtocolType,
                    protocol_data=assignor,
                    members=members,
                )
            )
        return Response(throttle_time_ms=0, groups=described)

    def _topic_names(self, group: ConsumerGroup) -> dict[UUID, str]:
        # The group's own metadata first; the cluster image covers a topic the group has not
        # recorded yet (a member may hold a partition of it while the group catches up).
        names = {topic.topic_id: name for name, topic in self.ctx.topics.items()}
        names.update(group.topic_names_by_id())
        return names


def _classic_group(group: ClassicGroup):
    """Kafka's describe of a classic group: protocol data and member metadata only when Stable."""
    Group = m.DescribeGroupsResponse.DescribedGroup
    stable = group.state is ClassicGroupState.STABLE
    members = [
        Group.DescribedGroupMember(
            member_id=member.member_id,
            group_instance_id=member.instance_id,
            client_id=member.client_id,
            client_host=member.client_host,
            member_metadata=member.metadata(group.protocol_name) if stable else b"",
            member_assignment=member.assignment,
        )
        for member in group.members.values()
    ]
    return Group(
        error_code=0,
        group_id=group.group_id,
        group_state=group.state.value,
        protocol_type=group.protocol_type or "",
        protocol_data=(group.protocol_name or "") if stable else "",
        members=members,
    )


def _failed_group(group_id: str, error: RequestError):
    return m.DescribeGroupsResponse.DescribedGroup(
        error_code=error.code,
        error_message=error.message,
        group_id=group_id,
        group_state="",
        protocol_type="",
        protocol_data="",
        members=[],
    )


def _dead_group(group_id: str, version: int):
    Group = m.DescribeGroupsResponse.DescribedGroup
    if version >= NOT_FOUND_ERROR_VERSION:
        return Group(
            error_code=Errors.GroupIdNotFoundError.errno,
            error_message=f"Group {group_id} not found.",
            group_id=group_id,
            group_state=GroupState.DEAD.value,
            protocol_type="",
            protocol_data="",
            members=[],
        )
    return Group(error_code=0, group_id=group_id, group_state=GroupState.DEAD.value, protocol_type="", protocol_data="", members=[])


def _subscription(group: ConsumerGroup, member: ConsumerMember) -> bytes:
    """The member's topics: its names, and for a regex the subscribed topics it matches."""
    topics = set(member.subscribed_topic_names)
    if member.subscribed_topic_regex:
        try:
            topics.update(matching_topics(member.subscribed_topic_regex, group.subscribed_topics))
        except InvalidRegex:  # refused at heartbeat time; never fail a describe over it
            pass
    subscription = ConsumerProtocolSubscription(
        version=SUBSCRIPTION_VERSION,
        topics=sorted(topics),
        user_data=None,
        owned_partitions=[],
        generation_id=member.member_epoch,
        rack_id=member.rack_id,
    )
    return bytes(subscription.encode())


def _assignment(partitions: PartitionSet, names: dict[UUID, str]) -> bytes:
    by_topic = sorted((names.get(topic_id, str(topic_id)), sorted(indexes)) for topic_id, indexes in partitions.by_topic.items())
    assignment = ConsumerProtocolAssignment(
        version=ASSIGNMENT_VERSION,
        assigned_partitions=[ConsumerProtocolAssignment.TopicPartition(topic=topic, partitions=indexes) for topic, indexes in by_topic],
        user_data=None,
    )
    return bytes(assignment.encode())
