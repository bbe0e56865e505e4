"""The member driver running a classic member: the IO rules that are the driver's (the JoinGroup
long poll's timeout, refreshing the topic resolver before the member reads a response, offsets
with generation, member id and instance id, waiting out a rebalance before committing again).

The peer is a scripted one-member classic group on pystreams' own Kafka-protocol server: what
is tested is the driver's side of the wire, which does not depend on how a coordinator reaches
its answers. The classic group's real coordinator is exercised in
``test_classic_with_coordinator.py``.
"""

from __future__ import annotations

import asyncio
import uuid

import kafka.errors as Errors
from kafka.protocol.api_header import RequestHeader
from kafka.protocol.api_message import ApiMessage
from pystreams.assignors.api import TopicMetadata
from test_client_driver import async_test, eventually

from pystreams.client.classic import ClassicMemberConfig
from pystreams.client.driver import MemberDriver
from pystreams.client.events import LeftGroup, MemberEvent, MemberState, PartitionsAssigned, RevokePartitions
from pystreams.client.topics import StaticTopics
from pystreams.partitions import PartitionSet, TopicIdPartition
from pystreams.protocol import messages as m
from pystreams.protocol.server import KafkaProtocolServer

LATE = TopicMetadata(uuid.UUID(int=0x1A7E), "late", 2)
REBALANCE_IN_PROGRESS = Errors.RebalanceInProgressError.errno


class RefreshingTopics(StaticTopics):
    """Knows nothing until refreshed: like a worker's metadata before a topic it never saw."""

    def __init__(self) -> None:
        super().__init__()
        self.refreshes = 0

    def refresh(self) -> None:
        self.refreshes += 1
        self.add(LATE)


class ScriptedGroup:
    """A one-member classic group answered by hand; records every request with its version."""

    def __init__(self, join_delay_s: float) -> None:
        self.join_delay_s = join_delay_s
        self.seen: list[tuple[str, int, ApiMessage]] = []
        self.commit_errors = [REBALANCE_IN_PROGRESS]  # the first commit meets a rebalance

    async def handle(self, header: RequestHeader, request: ApiMessage) -> ApiMessage:
        self.seen.append((type(request).__name__, header.request_api_version, request))
        if isinstance(request, m.JoinGroupRequest):
            if not request.member_id:
                return m.JoinGroupResponse(
                    error_code=Errors.MemberIdRequiredError.errno, generation_id=-1, protocol_name=None, leader="", member_id="m-1", members=[]
                )
            await asyncio.sleep(self.join_delay_s)  # the rebalance takes its time
            [protocol] = request.protocols
            return m.JoinGroupResponse(
                error_code=0,
                generation_id=3,
                protocol_type="consumer",
                protocol_name=protocol.name,
                leader="m-1",
                member_id="m-1",
                members=[m.JoinGroupResponse.JoinGroupResponseMember(member_id="m-1", group_instance_id=request.group_instance_id, metadata=protocol.metadata)],
            )
        if isinstance(request, m.SyncGroupRequest):
            [mine] = request.assignments
            return m.SyncGroupResponse(error_code=0, protocol_type="consumer", protocol_name=request.protocol_name, assignment=mine.assignment)
        if isinstance(request, m.HeartbeatRequest):
            return m.HeartbeatResponse(error_code=0)
        if isinstance(request, m.OffsetCommitRequest):
            code = self.commit_errors.pop(0) if self.commit_errors else 0
            topic = m.OffsetCommitResponse.OffsetCommitResponseTopic
            return m.OffsetCommitResponse(
                topics=[
                    topic(
                        name=t.name, partitions=[topic.OffsetCommitResponsePartition(partition_index=p.partition_index, error_code=code) for p in t.partitions]
                    )
                    for t in request.topics
                ]
            )
        if isinstance(request, m.LeaveGroupRequest):
            return m.LeaveGroupResponse(error_code=0, members=[])
        raise AssertionError(f"unexpected {request}")

    def of(self, kind: type) -> list[tuple[int, ApiMessage]]:
        return [(version, request) for name, version, request in self.seen if name == kind.__name__]


@async_test
async def test_a_classic_member_joins_through_the_driver_commits_with_its_generation_and_leaves_as_static() -> None:
    group = ScriptedGroup(join_delay_s=0.6)
    server = KafkaProtocolServer("127.0.0.1", 0, group.handle)
    await server.start()
    resolver = RefreshingTopics()
    events: list[MemberEvent] = []

    async def on_event(event: MemberEvent) -> None:
        events.append(event)

    driver = MemberDriver(
        ClassicMemberConfig(
            group_id="g", instance_id="i-1", rebalance_timeout_ms=1_000, session_timeout_ms=6_000, heartbeat_interval_ms=100, assignors=("range",)
        ),
        f"127.0.0.1:{server.port}",
        topics=resolver,
        on_event=on_event,
        request_timeout_ms=300,  # shorter than the JoinGroup's wait: the driver must allow for it
    )
    try:
        driver.subscribe(topics=["late"])
        await driver.start()
        await eventually(lambda: driver.member.state is MemberState.STABLE and events, "the member to be stable")
        everything = PartitionSet.from_pairs(TopicIdPartition(LATE.topic_id, p) for p in range(LATE.num_partitions))
        assert events == [PartitionsAssigned(everything, 3)]
        # The long poll was waited for, not timed out and retried.
        joins = group.of(m.JoinGroupRequest)
        assert [request.member_id for _, request in joins] == ["", "m-1"]
        assert {version for version, _ in joins} == {9}
        assert {version for version, _ in group.of(m.SyncGroupRequest)} == {5}
        # The leader's answer named a topic the resolver did not know: refreshed before reading it.
        assert resolver.refreshes == 1

        result = await driver.commit_offsets({("late", 0): 5})
        assert result.retry_after_heartbeat and not result.ok and result.member_epoch == 3
        await driver.next_heartbeat()  # a rebalance to wait out: resolves once stable again
        assert (await driver.commit_offsets({("late", 0): 5})).ok
        commits = [request for _, request in group.of(m.OffsetCommitRequest)]
        assert {(c.generation_id_or_member_epoch, c.member_id, c.group_instance_id) for c in commits} == {(3, "m-1", "i-1")}
        assert group.of(m.HeartbeatRequest) and {v for v, _ in group.of(m.HeartbeatRequest)} == {4}

        await driver.close()
        assert isinstance(events[-2], RevokePartitions) and events[-1] == LeftGroup(-2)
        assert group.of(m.LeaveGroupRequest) == []  # a static member keeps its session
    finally:
        await driver.stop()
        await server.close()
