"""Classic members against the real coordinator (in process, over TCP), migrating beside a
KIP-848 member: a consumer built only from kafka-python's pieces (its protocol classes at the
versions its consumer sends, its ConsumerProtocol encoding, its range or cooperative-sticky
assignor) and pystreams' classic member share a classic group; a KIP-848 member joins (the
group converts to a consumer group and both classic members reconcile through their own
JoinGroup/SyncGroup/Heartbeat) and leaves again (the group converts back). No partition is
ever owned by two members at once; everything is owned when the group settles."""

from __future__ import annotations

import asyncio
import contextlib

import kafka.errors as Errors
import pytest
from kafka.coordinator.assignors.cooperative_sticky import CooperativeStickyAssignor
from kafka.coordinator.assignors.range import RangePartitionAssignor
from kafka.protocol.consumer.metadata import ConsumerProtocolAssignment, ConsumerProtocolSubscription
from test_client_driver import ALL_FOO, FOO, GUARD_S, Harness, Ownership, async_test, eventually, make_driver

from pystreams.client.classic import ClassicMemberConfig
from pystreams.client.driver import KafkaConnection, MemberDriver
from pystreams.client.events import MemberState
from pystreams.client.topics import StaticTopics
from pystreams.coordinator.log import MemoryLog
from pystreams.partitions import TopicIdPartition
from pystreams.protocol import messages as m
from tests.aio import within

GROUP = "g"
NONE = 0
MEMBER_ID_REQUIRED = Errors.MemberIdRequiredError.errno
REBALANCE_IN_PROGRESS = Errors.RebalanceInProgressError.errno
RESET = {Errors.UnknownMemberIdError.errno, Errors.IllegalGenerationError.errno}


class Cluster:
    """What kafka-python's assignors read of its ClusterMetadata."""

    def partitions_for_topic(self, topic: str):
        return set(range(FOO.num_partitions)) if topic == FOO.name else None

    def topics(self, exclude_internal_topics: bool = True):
        return {FOO.name}


class KafkaPythonConsumer:
    """A classic consumer assembled from kafka-python's pieces only (see the module docstring);
    it follows Kafka's consumer rules for what it owns: eager releases everything before every
    rejoin, cooperative releases what the new assignment took away and rejoins."""

    def __init__(self, harness: Harness, ownership: Ownership, name: str, assignor: object) -> None:
        self.harness, self.ownership, self.name, self.assignor = harness, ownership, name, assignor
        self.cooperative = assignor.name == "cooperative-sticky"  # type: ignore[attr-defined]
        self.owned: set[int] = set()
        self.member_id = ""
        self.generation = -1
        self.joins = 0
        ownership.events[name] = []

    def _acquire(self, partitions: set[int]) -> None:
        for p in partitions:
            partition = TopicIdPartition(FOO.topic_id, p)
            if partition in self.ownership.owner:
                self.ownership.violations.append(f"{partition} assigned to {self.name} while {self.ownership.owner[partition]} owns it")
            self.ownership.owner[partition] = self.name
        self.owned |= partitions

    def _release(self, partitions: set[int]) -> None:
        for p in partitions:
            partition = TopicIdPartition(FOO.topic_id, p)
            if self.ownership.owner.get(partition) == self.name:
                del self.ownership.owner[partition]
        self.owned -= partitions

    async def run(self, stop: asyncio.Event) -> None:
        connection = await KafkaConnection.open(("127.0.0.1", self.harness.port), self.name, 10)
        try:
            while not stop.is_set():
                await self._rebalance(connection, stop)
            self._release(set(self.owned))
            if self.member_id:
                await connection.send(
                    m.LeaveGroupRequest(
                        group_id=GROUP, members=[m.LeaveGroupRequest.MemberIdentity(member_id=self.member_id, group_instance_id=None, reason="done")]
                    ),
                    5,
                    10,
                )
        finally:
            connection.close()

    async def _rebalance(self, connection: KafkaConnection, stop: asyncio.Event) -> None:
        if not self.cooperative:
            self._release(set(self.owned))  # eager: everything goes before the join
        metadata = self.assignor.metadata({FOO.name})  # type: ignore[attr-defined]
        self.joins += 1
        join = await connection.send(
            m.JoinGroupRequest(
                group_id=GROUP,
                session_timeout_ms=10_000,
                rebalance_timeout_ms=10_000,
                member_id=self.member_id,
                group_instance_id=None,
                protocol_type="consumer",
                protocols=[m.JoinGroupRequest.JoinGroupRequestProtocol(name=self.assignor.name, metadata=metadata.encode())],  # type: ignore[attr-defined]
            ),
            7,
            20,
        )  # kafka-python's consumer speaks JoinGroup v7
        if join.error_code == MEMBER_ID_REQUIRED:
            self.member_id = join.member_id
            return
        if join.error_code != NONE:
            await self._on_error(join.error_code)
            return
        self.generation = join.generation_id
        assignments = []
        if join.leader == join.member_id:
            members = []
            for entry in join.members:
                entry.metadata = ConsumerProtocolSubscription.decode(bytes(entry.metadata))
                members.append(entry)
            assigned = self.assignor.assign(Cluster(), members)  # type: ignore[attr-defined]
            assignments = [m.SyncGroupRequest.SyncGroupRequestAssignment(member_id=mid, assignment=a.encode()) for mid, a in assigned.items()]
        sync = await connection.send(
            m.SyncGroupRequest(
                group_id=GROUP,
                generation_id=self.generation,
                member_id=self.member_id,
                group_instance_id=None,
                protocol_type="consumer",
                protocol_name=join.protocol_name,
                assignments=assignments,
            ),
            5,
            20,
        )
        if sync.error_code != NONE:
            await self._on_error(sync.error_code)
            return
        assignment = ConsumerProtocolAssignment.decode(bytes(sync.assignment))
        new = {tp.partition for tp in assignment.partitions()}
        revoked = self.owned - new
        self._release(revoked)
        self._acquire(new - self.owned)
        if hasattr(self.assignor, "member_assignment"):
            self.assignor.on_assignment(assignment, self.generation)  # type: ignore[attr-defined]
        if revoked and self.cooperative:
            return  # KIP-429: rejoin so that the next rebalance hands them on
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await within(stop.wait(), 0.1)
            heartbeat = await connection.send(
                m.HeartbeatRequest(group_id=GROUP, generation_id=self.generation, member_id=self.member_id, group_instance_id=None), 4, 10
            )
            if heartbeat.error_code == REBALANCE_IN_PROGRESS:
                return
            if heartbeat.error_code != NONE:
                await self._on_error(heartbeat.error_code)
                return

    async def _on_error(self, code: int) -> None:
        if code in RESET:
            self._release(set(self.owned))  # lost
            self.generation = -1
            if code == Errors.UnknownMemberIdError.errno:
                self.member_id = ""
        elif code != REBALANCE_IN_PROGRESS:
            await asyncio.sleep(0.1)


def settled(ownership: Ownership, names: list[str], drivers: list[MemberDriver]) -> bool:
    return set(ownership.owner) == ALL_FOO and all(ownership.owned_by(name) for name in names) and all(d.member.state is MemberState.STABLE for d in drivers)


async def group_type(harness: Harness) -> tuple[str, dict[str, int]]:
    """(group type, member id -> MemberType) as a client sees them: ConsumerGroupDescribe, else
    DescribeGroups for a classic group."""
    connection = await KafkaConnection.open(("127.0.0.1", harness.port), "describe", 10)
    try:
        [group] = (
            await connection.send(
                m.ConsumerGroupDescribeRequest(group_ids=[GROUP], include_authorized_operations=False),
                max(v for v in (0, 1) if _supports(m.ConsumerGroupDescribeRequest, v)),
                10,
            )
        ).groups
        if group.error_code == NONE:
            return "consumer", {member.member_id: getattr(member, "member_type", -1) for member in group.members}
        [classic] = (await connection.send(m.DescribeGroupsRequest(groups=[GROUP], include_authorized_operations=False), 5, 10)).groups
        return ("classic" if classic.group_state not in ("Dead", "") else "none"), {}
    finally:
        connection.close()


def _supports(message, version: int) -> bool:
    from pystreams.protocol.registry import api_spec

    spec = api_spec(message.API_KEY)
    return spec is not None and spec.supports(version)


@pytest.mark.parametrize(
    "protocol,kafka_python_assignor",
    [
        ("range", lambda: RangePartitionAssignor),
        ("cooperative-sticky", CooperativeStickyAssignor),
    ],
)
@async_test
async def test_classic_members_migrate_beside_a_kip848_member_and_back(protocol, kafka_python_assignor) -> None:
    harness = Harness(MemoryLog(1))
    await harness.start()
    ownership = Ownership()
    stop_raw = asyncio.Event()
    raw = KafkaPythonConsumer(harness, ownership, "kafka-python", kafka_python_assignor())
    holder: list[MemberDriver] = []
    ours = MemberDriver(
        ClassicMemberConfig(
            group_id=GROUP, client_id="ours", assignors=(protocol,), session_timeout_ms=10_000, heartbeat_interval_ms=100, rebalance_timeout_ms=10_000
        ),
        harness.bootstrap,
        topics=StaticTopics([FOO]),
        on_event=ownership.handler("ours", lambda: holder[0]),
        request_timeout_ms=2_000,
        reconnect_backoff_ms=20,
        reconnect_backoff_max_ms=200,
    )
    holder.append(ours)
    raw_task = asyncio.create_task(raw.run(stop_raw))
    newcomer = None
    try:
        ours.subscribe(topics=[FOO.name])
        await ours.start()
        await eventually(lambda: settled(ownership, ["kafka-python", "ours"], [ours]), "a classic group of two")
        assert (await group_type(harness))[0] == "classic"

        # A KIP-848 member joins: the group converts and the classic members reconcile.
        newcomer = make_driver(harness, ownership, "kip848")
        await newcomer.start()
        await eventually(
            lambda: settled(ownership, ["kafka-python", "ours", "kip848"], [ours, newcomer]), "three members sharing the partitions", timeout=GUARD_S * 2
        )
        kind, member_types = await group_type(harness)
        assert kind == "consumer"
        assert sorted(member_types.values()) == [0, 0, 1]  # two classic members, one consumer
        assert ours.member.member_epoch >= 1 and not ours.member.is_leader

        # It leaves: back to a classic group of two.
        await newcomer.leave()
        await eventually(lambda: settled(ownership, ["kafka-python", "ours"], [ours]), "a classic group of two again", timeout=GUARD_S * 2)
        assert (await group_type(harness))[0] == "classic"
        assert ownership.violations == []
    finally:
        stop_raw.set()
        with contextlib.suppress(Exception):
            await within(raw_task, GUARD_S)
        if newcomer is not None:
            await newcomer.close(timeout_s=2)
        await ours.close(timeout_s=2)
        await harness.stop()
    assert ownership.violations == []
