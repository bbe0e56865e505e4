"""The coordinator runtime in one process, on the memory log: durability before answers, shards
that do not wait for each other, routing and merging across shards, consistency after a failed
append, backpressure, loading, restart on a shared log, timers, topic metadata and metrics.

Waits are bounded (GUARD_S) only so that a broken runtime fails instead of hanging; nothing
asserts on speed.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import uuid
from collections.abc import Awaitable, Callable

import kafka.errors as Errors
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.api_header import RequestHeader
from pystreams.assignors.api import TopicMetadata

from pystreams.coordinator import records as r
from pystreams.coordinator.config import CoordinatorConfig
from pystreams.coordinator.log import LogError, MemoryLog
from pystreams.coordinator.metrics import MetricsHttpServer, coordinator_registry
from pystreams.coordinator.runtime import (
    Coordinator,
    ShardState,
    StaticTopics,
    group_shard,
    java_string_hash,
)
from pystreams.coordinator.shard import GroupCoordinatorShard
from pystreams.protocol import messages as m
from pystreams.protocol.consumer_protocol import Subscription, encode_subscription
from tests.aio import run_within, within

GUARD_S = 10.0

FAST = CoordinatorConfig(
    session_timeout_ms=10_000,
    min_session_timeout_ms=100,
    max_session_timeout_ms=60_000,
    heartbeat_interval_ms=100,
    min_heartbeat_interval_ms=10,
    max_heartbeat_interval_ms=1_000,
)
FOO = TopicMetadata(uuid.UUID(int=1), "foo", 6)

HB = m.ConsumerGroupHeartbeatRequest
VERSIONS = {
    m.ConsumerGroupHeartbeatRequest: 0,
    m.ConsumerGroupDescribeRequest: 0,
    m.ListGroupsRequest: 5,
    m.OffsetCommitRequest: 9,
    m.OffsetFetchRequest: 9,
    m.DescribeConfigsRequest: 4,
    m.IncrementalAlterConfigsRequest: 1,
    m.JoinGroupRequest: 9,
}


def async_test(test: Callable[..., Awaitable[None]]) -> Callable[..., None]:
    @functools.wraps(test)
    def run(*args: object, **kwargs: object) -> None:
        run_within(test(*args, **kwargs), GUARD_S * 3)

    return run


async def call(coordinator: Coordinator, request, version: int | None = None):
    version = VERSIONS[type(request)] if version is None else version
    request.API_VERSION = version
    header = RequestHeader(request_api_key=request.API_KEY, request_api_version=version, correlation_id=1, client_id="test-client")
    return await within(coordinator.handle(header, request), GUARD_S)


def join(group_id: str, topics=("foo",), member_id: str = "") -> HB:
    return HB(group_id=group_id, member_id=member_id, member_epoch=0, rebalance_timeout_ms=5_000, subscribed_topic_names=list(topics), topic_partitions=[])


def heartbeat(group_id: str, member_id: str, epoch: int) -> HB:
    return HB(group_id=group_id, member_id=member_id, member_epoch=epoch, rebalance_timeout_ms=-1)


def describe(*group_ids: str) -> m.ConsumerGroupDescribeRequest:
    return m.ConsumerGroupDescribeRequest(group_ids=list(group_ids), include_authorized_operations=False)


def groups_on_distinct_shards(shards: int, count: int = 2) -> list[str]:
    found: dict[int, str] = {}
    for i in range(10_000):
        group_id = f"group-{i}"
        found.setdefault(group_shard(group_id, shards), group_id)
        if len(found) == count:
            return list(found.values())
    raise AssertionError("not enough shards hit")


def groups_on_shard(shard: int, shards: int, count: int) -> list[str]:
    return [g for g in (f"group-{i}" for i in range(10_000)) if group_shard(g, shards) == shard][:count]


def replayed_snapshot(log: MemoryLog, partition: int) -> dict:
    shard = GroupCoordinatorShard(FAST)
    for record in log.records(partition):
        shard.replay(record)
    return shard.snapshot()


async def settle(times: int = 20) -> None:
    for _ in range(times):
        await asyncio.sleep(0)


class Gate:
    """A before_append hook that holds appends of chosen partitions until opened."""

    def __init__(self, partitions: set[int]) -> None:
        self.partitions = partitions
        self.opened = asyncio.Event()
        self.entered = asyncio.Event()

    async def __call__(self, partition: int, records) -> None:
        if partition in self.partitions:
            self.entered.set()
            await self.opened.wait()


def coordinator_on(log: MemoryLog, **options) -> Coordinator:
    options.setdefault("config", FAST)
    options.setdefault("topic_source", StaticTopics({"foo": FOO}))
    return Coordinator(log, **options)


# --- routing ------------------------------------------------------------------------------------


def test_group_routing_is_kafkas_partition_for() -> None:
    # Values of java.lang.String#hashCode.
    assert java_string_hash("") == 0
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("polygenelubricants") == -(2**31)  # Integer.MIN_VALUE
    assert java_string_hash("\U0001f600") == 31 * 0xD83D + 0xDE00  # a surrogate pair: two code units
    assert group_shard("polygenelubricants", 7) == 0  # Utils.abs(MIN_VALUE) is 0
    assert group_shard("hello", 50) == 99162322 % 50
    negative = java_string_hash("my-group-1")
    assert group_shard("my-group-1", 50) == abs(negative) % 50
    # Past the cached length the answer is computed each time, and is the same rule.
    long_id = "g" * 5_000 + "hello"
    assert group_shard(long_id, 50) == abs(java_string_hash(long_id)) % 50 == group_shard(long_id, 50)


@settings(max_examples=200)
@given(st.text(max_size=300), st.integers(1, 64))
def test_group_routing_is_the_same_rule_cached_or_not(group_id: str, shards: int) -> None:
    from pystreams.coordinator.runtime import _group_shard

    assert group_shard(group_id, shards) == group_shard(group_id, shards) == _group_shard(group_id, shards)


# --- durability and independence --------------------------------------------------------------


@async_test
async def test_a_response_is_sent_only_after_its_records_are_in_the_log() -> None:
    gate = Gate({0})
    log = MemoryLog(1, before_append=gate)
    async with coordinator_on(log) as coordinator:
        await coordinator.wait_until_loaded()
        pending = asyncio.create_task(call(coordinator, join("g")))
        await within(gate.entered.wait(), GUARD_S)
        await settle()
        assert not pending.done(), "answered before the records were durable"
        assert log.size(0) == 0
        gate.opened.set()
        response = await pending
        assert response.error_code == 0 and response.member_id
        keys = [record.key() for record in log.records(0)]
        assert r.MemberMetadataKey("g", response.member_id) in keys
        assert r.GroupMetadataKey("g") in keys


@async_test
async def test_a_slow_shard_does_not_stall_another_shards_requests() -> None:
    slow_group, fast_group = groups_on_distinct_shards(4)
    gate = Gate({group_shard(slow_group, 4)})
    log = MemoryLog(4, before_append=gate)
    async with coordinator_on(log) as coordinator:
        await coordinator.wait_until_loaded()
        slow = asyncio.create_task(call(coordinator, join(slow_group)))
        await within(gate.entered.wait(), GUARD_S)
        fast = await call(coordinator, join(fast_group))
        assert fast.error_code == 0
        assert not slow.done()
        gate.opened.set()
        assert (await slow).error_code == 0


@async_test
async def test_many_groups_across_shards_concurrently_split_and_merged_in_order() -> None:
    shards, group_count = 4, 120
    log = MemoryLog(shards)
    group_ids = [f"app-{i}" for i in range(group_count)]
    async with coordinator_on(log) as coordinator:
        await coordinator.wait_until_loaded()
        joined = await asyncio.gather(*(call(coordinator, join(g)) for g in group_ids))
        assert all(response.error_code == 0 for response in joined)
        members = {g: (response.member_id, response.member_epoch) for g, response in zip(group_ids, joined)}
        assert len({member_id for member_id, _ in members.values()}) == group_count

        # Every group's records are on its own shard's partition, and only there.
        for g in group_ids:
            for partition in range(shards):
                present = r.GroupMetadataKey(g) in [record.key() for record in log.records(partition)]
                assert present == (partition == group_shard(g, shards)), (g, partition)
        assert len({group_shard(g, shards) for g in group_ids}) == shards

        # One describe naming every group (shuffled) comes back merged in request order.
        order = list(reversed(group_ids)) + ["no-such-group"]
        described = await call(coordinator, describe(*order))
        assert [group.group_id for group in described.groups] == order
        assert all(group.error_code == 0 for group in described.groups[:-1])
        assert described.groups[-1].error_code == Errors.GroupIdNotFoundError.errno
        for group in described.groups[:-1]:
            assert [member.member_id for member in group.members] == [members[group.group_id][0]]

        listed = await call(coordinator, m.ListGroupsRequest(states_filter=[], types_filter=[]))
        assert listed.error_code == 0
        assert sorted(group.group_id for group in listed.groups) == sorted(group_ids)

        # Offsets committed with the member epoch, fetched for many groups at once (v8+ groups).
        Commit = m.OffsetCommitRequest
        commits = await asyncio.gather(
            *(
                call(
                    coordinator,
                    Commit(
                        group_id=g,
                        generation_id_or_member_epoch=members[g][1],
                        member_id=members[g][0],
                        topics=[
                            Commit.OffsetCommitRequestTopic(
                                name="foo",
                                partitions=[
                                    Commit.OffsetCommitRequestTopic.OffsetCommitRequestPartition(
                                        partition_index=0, committed_offset=1000 + i, committed_leader_epoch=-1, committed_metadata=""
                                    )
                                ],
                            )
                        ],
                    ),
                )
                for i, g in enumerate(group_ids)
            )
        )
        assert all(p.error_code == 0 for c in commits for t in c.topics for p in t.partitions)
        Fetch = m.OffsetFetchRequest
        fetched = await call(
            coordinator,
            Fetch(
                groups=[
                    Fetch.OffsetFetchRequestGroup(
                        group_id=g,
                        member_id=None,
                        member_epoch=-1,
                        topics=[Fetch.OffsetFetchRequestGroup.OffsetFetchRequestTopics(name="foo", partition_indexes=[0])],
                    )
                    for g in order[:-1]
                ],
                require_stable=False,
            ),
        )
        assert [group.group_id for group in fetched.groups] == order[:-1]
        for group in fetched.groups:
            assert group.error_code == 0
            assert group.topics[0].partitions[0].committed_offset == 1000 + group_ids.index(group.group_id)

        # Group configs: resources for groups on different shards, answered in request order.
        Alter = m.IncrementalAlterConfigsRequest
        targets = groups_on_distinct_shards(shards, 3)
        altered = await call(
            coordinator,
            Alter(
                validate_only=False,
                resources=[
                    Alter.AlterConfigsResource(
                        resource_type=16,
                        resource_name=g,
                        configs=[
                            Alter.AlterConfigsResource.AlterableConfig(name="group.consumer.heartbeat.interval.ms", config_operation=0, value=str(200 + i))
                        ],
                    )
                    for i, g in enumerate(targets)
                ],
            ),
        )
        assert [(a.resource_name, a.error_code) for a in altered.responses] == [(g, 0) for g in targets]
        Describe = m.DescribeConfigsRequest
        configs = await call(
            coordinator,
            Describe(
                include_synonyms=False,
                include_documentation=False,
                resources=[
                    Describe.DescribeConfigsResource(resource_type=16, resource_name=g, configuration_keys=["group.consumer.heartbeat.interval.ms"])
                    for g in targets
                ],
            ),
        )
        assert [(res.resource_name, res.configs[0].value) for res in configs.results] == [(g, str(200 + i)) for i, g in enumerate(targets)]


# --- failures ------------------------------------------------------------------------------------


class FailingAppends:
    """Fails the next ``count`` appends to ``partition``."""

    def __init__(self) -> None:
        self.failures: dict[int, int] = {}

    def fail_next(self, partition: int, count: int = 1) -> None:
        self.failures[partition] = count

    async def __call__(self, partition: int, records) -> None:
        if self.failures.get(partition, 0) > 0:
            self.failures[partition] -= 1
            raise LogError("injected append failure")


@async_test
async def test_a_failed_append_answers_an_error_and_the_shard_reloads_to_what_the_log_says() -> None:
    faults = FailingAppends()
    log = MemoryLog(2, before_append=faults)
    group = "consistent"
    shard = group_shard(group, 2)
    async with coordinator_on(log) as coordinator:
        await coordinator.wait_until_loaded()
        first = await call(coordinator, join(group))
        assert first.error_code == 0
        before = await call(coordinator, describe(group))
        durable = replayed_snapshot(log, shard)

        faults.fail_next(shard)
        second = await call(coordinator, join(group))
        assert second.error_code == Errors.CoordinatorNotAvailableError.errno
        runner = coordinator.runners[shard]
        await within(runner.loaded.wait(), GUARD_S)
        assert runner.load_count == 2

        # The shard forgot the half-done join: its state is exactly the log's.
        assert runner.shard.snapshot() == durable == replayed_snapshot(log, shard)
        after = await call(coordinator, describe(group))
        assert after.groups[0].group_epoch == before.groups[0].group_epoch
        assert [mb.member_id for mb in after.groups[0].members] == [first.member_id]

        # Both members carry on: the first keeps its id and epoch, the second joins afresh.
        assert (await call(coordinator, heartbeat(group, first.member_id, first.member_epoch))).error_code == 0
        again = await call(coordinator, join(group))
        assert again.error_code == 0
        assert replayed_snapshot(log, shard) == runner.shard.snapshot()
        # The other shard never noticed.
        assert coordinator.runners[1 - shard].load_count == 1


@async_test
async def test_a_handler_that_raises_gets_an_error_its_changes_roll_back_and_the_shard_stays_up() -> None:
    log = MemoryLog(1)
    broken = {"on": False}

    def factory() -> GroupCoordinatorShard:
        shard = GroupCoordinatorShard(FAST)
        original = shard.consumer.consumer_group_heartbeat

        def heartbeat_handler(request, now_ms):
            response = original(request, now_ms)  # emits (and replays) its records...
            if broken["on"]:
                raise RuntimeError("bug after emitting")  # ...which are then lost
            return response

        shard._handlers[HB.API_KEY] = heartbeat_handler
        return shard

    async with coordinator_on(log, shard_factory=factory) as coordinator:
        await coordinator.wait_until_loaded()
        assert (await call(coordinator, join("g"))).error_code == 0
        broken["on"] = True
        failed = await call(coordinator, join("g"))
        assert failed.error_code == Errors.UnknownError.errno
        broken["on"] = False
        runner = coordinator.runners[0]
        assert runner.state is ShardState.ACTIVE and runner.load_count == 1  # no reload
        assert runner.shard.snapshot() == replayed_snapshot(log, 0)  # the second join left nothing
        assert len(runner.shard.groups["g"].members) == 1
        assert runner.shard.handler_failures == 1
        assert (await call(coordinator, join("g"))).error_code == 0  # and it serves on


@async_test
async def test_a_full_queue_makes_callers_wait() -> None:
    gate = Gate({0})
    log = MemoryLog(1, before_append=gate)
    async with coordinator_on(log, queue_size=2, max_batch=1) as coordinator:
        await coordinator.wait_until_loaded()
        runner = coordinator.runners[0]
        first = asyncio.create_task(call(coordinator, join("g0")))
        await within(gate.entered.wait(), GUARD_S)  # the runner is stuck appending
        waiting = [asyncio.create_task(call(coordinator, join(f"g{i}"))) for i in range(1, 7)]
        await settle()
        assert runner.queue_size == 2  # never more than the bound...
        assert not any(task.done() for task in waiting)  # ...the other callers wait
        assert "kafka_server_group_coordinator_metrics_event_queue_size 2" in coordinator.render_metrics()
        gate.opened.set()
        responses = await asyncio.gather(first, *waiting)
        assert all(response.error_code == 0 for response in responses)
        assert runner.queue_size == 0


class SlowClaims(MemoryLog):
    """Claims of some partitions wait for ``release``: those shards stay loading."""

    def __init__(self, partitions: int, slow: set[int]) -> None:
        super().__init__(partitions)
        self.slow = slow
        self.release = asyncio.Event()

    async def claim(self, partition: int):
        if partition in self.slow:
            await self.release.wait()
        return await super().claim(partition)


@async_test
async def test_a_loading_shard_answers_load_in_progress_and_split_requests_say_so_per_group() -> None:
    loading_group, ready_group = groups_on_distinct_shards(2)
    log = SlowClaims(2, {group_shard(loading_group, 2)})
    async with coordinator_on(log) as coordinator:
        ready_runner = coordinator.runners[group_shard(ready_group, 2)]
        await within(ready_runner.loaded.wait(), GUARD_S)
        assert (await call(coordinator, join(loading_group))).error_code == Errors.CoordinatorLoadInProgressError.errno
        assert (await call(coordinator, join(ready_group))).error_code == 0
        # Classic members would take LOAD_IN_PROGRESS from these two as fatal: Kafka answers a
        # SyncGroup REBALANCE_IN_PROGRESS (rejoin) and a Heartbeat NONE while a group loads.
        sync = m.SyncGroupRequest(
            version=5, group_id=loading_group, generation_id=1, member_id="m", protocol_type="consumer", protocol_name="range", assignments=[]
        )
        assert (await call(coordinator, sync, 5)).error_code == Errors.RebalanceInProgressError.errno
        beat = m.HeartbeatRequest(version=4, group_id=loading_group, generation_id=1, member_id="m")
        assert (await call(coordinator, beat, 4)).error_code == 0
        described = await call(coordinator, describe(loading_group, ready_group))
        assert [(g.group_id, g.error_code) for g in described.groups] == [(loading_group, Errors.CoordinatorLoadInProgressError.errno), (ready_group, 0)]
        listed = await call(coordinator, m.ListGroupsRequest(states_filter=[], types_filter=[]))
        assert listed.error_code == Errors.CoordinatorLoadInProgressError.errno
        assert [g.group_id for g in listed.groups] == [ready_group]
        assert not coordinator.is_ready()
        log.release.set()
        await coordinator.wait_until_loaded()
        assert coordinator.is_ready()
        assert (await call(coordinator, join(loading_group))).error_code == 0


@async_test
async def test_shards_wait_for_topic_metadata_before_they_load() -> None:
    allowed = threading.Event()

    class BlockedTopics:
        def fetch_topics(self):
            allowed.wait(GUARD_S)
            return {"foo": FOO}

    async with coordinator_on(MemoryLog(1), topic_source=BlockedTopics()) as coordinator:
        try:
            await settle()
            assert coordinator.runners[0].state is ShardState.LOADING
            response = await call(coordinator, join("g"))
            assert response.error_code == Errors.CoordinatorLoadInProgressError.errno
        finally:
            allowed.set()
        await coordinator.wait_until_loaded()
        response = await call(coordinator, join("g"))
        assert response.error_code == 0


# --- restart on a shared log ---------------------------------------------------------------------


@async_test
async def test_a_second_coordinator_on_the_same_log_has_the_same_state_and_fences_the_first() -> None:
    log = MemoryLog(3)
    first = coordinator_on(log)
    await first.start()
    await first.wait_until_loaded()
    group_ids = groups_on_distinct_shards(3, 3)
    members = {}
    for g in group_ids:
        a = await call(first, join(g))
        b = await call(first, join(g))
        members[g] = (a, b)
    before = await call(first, describe(*group_ids))
    snapshots = [runner.shard.snapshot() for runner in first.runners]

    second = coordinator_on(log)
    await second.start()
    await second.wait_until_loaded()
    after = await call(second, describe(*group_ids))
    assert after == before
    assert [runner.shard.snapshot() for runner in second.runners] == snapshots

    # The first coordinator no longer owns the partitions: its next write is refused for good.
    g = group_ids[0]
    fenced = await call(first, join(g))
    assert fenced.error_code == Errors.NotCoordinatorError.errno
    assert first.runners[group_shard(g, 3)].state is ShardState.FAILED
    assert (await call(first, describe(g))).groups[0].error_code == Errors.NotCoordinatorError.errno
    # FindCoordinator must not send clients back to it: the fenced shard's groups are not
    # served here, the others (not fenced yet: nothing was written) still are.
    reason = first.unavailable_reason(g)
    assert reason is not None and f"shard {group_shard(g, 3)}" in reason and "fenced" in reason.lower()
    assert [first.unavailable_reason(other) for other in group_ids[1:]] == [None, None]
    assert not first.is_ready()
    # The second one serves the members with the ids and epochs they had.
    a, _ = members[g]
    assert (await call(second, heartbeat(g, a.member_id, a.member_epoch))).error_code == 0
    await first.close()
    await second.close()


# --- timers, topics, metrics ---------------------------------------------------------------------


@async_test
async def test_session_timers_fire_without_any_request() -> None:
    config = CoordinatorConfig(
        session_timeout_ms=200,
        min_session_timeout_ms=100,
        max_session_timeout_ms=60_000,
        heartbeat_interval_ms=50,
        min_heartbeat_interval_ms=10,
        max_heartbeat_interval_ms=1_000,
    )
    log = MemoryLog(1)
    async with coordinator_on(log, config=config) as coordinator:
        await coordinator.wait_until_loaded()
        member = await call(coordinator, join("g"))
        assert member.error_code == 0
        async with asyncio.timeout(GUARD_S):
            while coordinator.runners[0].shard.groups["g"].members:
                await asyncio.sleep(0.05)
        # The expiry went through the log like any change.
        assert r.MemberMetadata("g", member.member_id, None) in log.records(0)
        assert replayed_snapshot(log, 0) == coordinator.runners[0].shard.snapshot()


@async_test
async def test_a_heartbeat_naming_an_unknown_topic_triggers_a_metadata_refresh() -> None:
    source = StaticTopics({})
    bar = TopicMetadata(uuid.UUID(int=2), "bar", 3)
    log = MemoryLog(1)
    # Periodic refresh far away: only the on-demand path can find the new topic in time.
    async with coordinator_on(log, topic_source=source, metadata_refresh_ms=600_000, metadata_min_interval_ms=20) as coordinator:
        await coordinator.wait_until_loaded()
        member = await call(coordinator, join("g", topics=["bar"]))
        assert member.error_code == 0 and not member.assignment.assigned_topic_partitions
        source.topics["bar"] = bar  # the topic is created after the member subscribed
        async with asyncio.timeout(GUARD_S):
            while True:
                response = await call(
                    coordinator,
                    HB(
                        group_id="g",
                        member_id=member.member_id,
                        member_epoch=member.member_epoch,
                        rebalance_timeout_ms=5_000,
                        subscribed_topic_names=["bar"],
                        topic_partitions=[],
                    ),
                )
                assert response.error_code == 0
                if response.assignment and response.assignment.assigned_topic_partitions:
                    break
                member = response if response.member_epoch else member
                await asyncio.sleep(0.02)
        assert sorted(response.assignment.assigned_topic_partitions[0].partitions) == [0, 1, 2]
        assert "bar" in coordinator.topics


@async_test
async def test_a_heartbeat_subscribing_to_a_topic_created_just_before_gets_its_partitions_at_once() -> None:
    # A worker creates its internal topics, then joins: the first target already covers them
    # (no second rebalance once the periodic refresh finds them).
    source = StaticTopics({})
    log = MemoryLog(1)
    async with coordinator_on(log, topic_source=source, metadata_refresh_ms=600_000, metadata_min_interval_ms=20) as coordinator:
        await coordinator.wait_until_loaded()
        source.topics["bar"] = TopicMetadata(uuid.UUID(int=2), "bar", 3)  # created after the last fetch
        member = await call(coordinator, join("g", topics=["bar"]))
        assert member.error_code == 0
        assert [sorted(t.partitions) for t in member.assignment.assigned_topic_partitions] == [[0, 1, 2]]


async def http_get(port: int, path: str) -> tuple[int, str]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n".encode())
    await writer.drain()
    raw = await within(reader.read(), GUARD_S)
    writer.close()
    head, _, body = raw.decode().partition("\r\n\r\n")
    return int(head.split()[1]), body


OWN = "pystreams_coordinator_"


def sample(text: str, name: str, prefix: str = "kafka_server_group_coordinator_metrics_") -> float:
    for line in text.splitlines():
        if line.startswith(prefix + name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in metrics")


@async_test
async def test_metrics_are_served_in_prometheus_text_format() -> None:
    log = MemoryLog(2)
    async with coordinator_on(log) as coordinator:
        metrics = MetricsHttpServer("127.0.0.1", 0, coordinator_registry(coordinator, refusals=lambda: {"max_connections": 3}), coordinator.is_ready)
        await metrics.start()
        try:
            await coordinator.wait_until_loaded()
            assert (await http_get(metrics.port, "/ready"))[0] == 200
            stable = await call(coordinator, join("stable-group"))
            await call(coordinator, heartbeat("stable-group", stable.member_id, stable.member_epoch))
            reconciling = await call(coordinator, join("busy-group"))
            await call(coordinator, join("busy-group"))  # a second member: the first must revoke
            status, text = await http_get(metrics.port, "/metrics")
            assert status == 200
            assert sample(text, 'group_count{protocol="consumer"}') == 2
            assert sample(text, 'consumer_group_count{state="stable"}') == 1
            assert sample(text, 'consumer_group_count{state="reconciling"}') == 1
            assert sample(text, 'partition_count{state="active"}') == 2
            assert sample(text, "consumer_group_rebalance_count") >= 3  # three target assignments
            assert sample(text, "consumer_group_rebalance_rate") > 0
            assert sample(text, "partition_load_time_max") >= sample(text, "partition_load_time_avg") >= 0
            assert 0 <= sample(text, "thread_idle_ratio_min") <= sample(text, "thread_idle_ratio_avg") <= 1
            assert sample(text, "event_queue_size") == 0
            assert reconciling.error_code == 0
            assert sample(text, 'refusals_total{reason="max_connections"}', OWN) == 3
            assert sample(text, "handler_failures_total", OWN) == 0
            assert sample(text, "quarantined_groups", OWN) == 0
            # Requests by API: three joins and one heartbeat are four ConsumerGroupHeartbeats.
            assert sample(text, 'requests_total{api="ConsumerGroupHeartbeat"}', OWN) == 4
            assert (await http_get(metrics.port, "/healthz"))[0] == 200
            assert (await http_get(metrics.port, "/nope"))[0] == 404
        finally:
            await metrics.close()


@async_test
async def test_a_classic_join_waits_for_the_join_phase_and_is_answered_after_its_record() -> None:
    """JoinGroup is a long poll: the runtime keeps the caller waiting under its request id and
    answers when a later event (the initial rebalance delay) completes the join phase."""
    config = msgspec.structs.replace(FAST, initial_rebalance_delay_ms=200)
    log = MemoryLog(1)
    async with coordinator_on(log, config=config) as coordinator:
        await coordinator.wait_until_loaded()
        subscription = encode_subscription(Subscription(("foo",)))

        def join_request(member_id: str):
            return m.JoinGroupRequest(
                group_id="classic",
                session_timeout_ms=10_000,
                rebalance_timeout_ms=10_000,
                member_id=member_id,
                group_instance_id=None,
                protocol_type="consumer",
                reason=None,
                protocols=[m.JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=subscription)],
            )

        first = await call(coordinator, join_request(""))
        assert first.error_code == Errors.MemberIdRequiredError.errno and first.member_id
        started = asyncio.get_running_loop().time()
        answer = await call(coordinator, join_request(first.member_id))
        waited = asyncio.get_running_loop().time() - started
        assert answer.error_code == 0 and answer.generation_id == 1 and answer.leader == first.member_id
        assert [member.member_id for member in answer.members] == [first.member_id]
        assert waited >= 0.15  # held for the initial rebalance delay, not answered at once
        stored = [record for record in log.records(0) if isinstance(record, r.ClassicGroupMetadata)]
        assert stored and stored[-1].value.generation == 0  # the group exists; its generation 1 is not stored before the leader syncs
        text = coordinator.render_metrics()
        assert sample(text, 'classic_group_count{state="CompletingRebalance"}') == 1
        assert sample(text, 'group_count{protocol="classic"}') == 1
        # A KIP-848 member upgrades the group: counted as a conversion.
        upgraded = await call(coordinator, HB(group_id="classic", member_id="", member_epoch=0, rebalance_timeout_ms=5_000, subscribed_topic_names=["foo"]))
        assert upgraded.error_code == 0
        text = coordinator.render_metrics()
        assert sample(text, 'group_conversions_total{direction="upgrade"}') == 1
        assert sample(text, "consumer_group_classic_members") == 1


@async_test
async def test_close_answers_new_requests_not_coordinator() -> None:
    coordinator = coordinator_on(MemoryLog(1))
    await coordinator.start()
    await coordinator.wait_until_loaded()
    assert (await call(coordinator, join("g"))).error_code == 0
    await coordinator.close()
    assert (await call(coordinator, join("g"))).error_code == Errors.NotCoordinatorError.errno
    assert coordinator.runners[0].state is ShardState.CLOSED


@pytest.mark.parametrize("shards", [1, 3])
def test_a_new_coordinator_on_the_same_memory_log_replays_offsets_and_configs(shards: int) -> None:
    async def scenario() -> None:
        log = MemoryLog(shards)
        async with coordinator_on(log) as first:
            await first.wait_until_loaded()
            member = await call(first, join("g"))
            Commit = m.OffsetCommitRequest
            await call(
                first,
                Commit(
                    group_id="g",
                    generation_id_or_member_epoch=member.member_epoch,
                    member_id=member.member_id,
                    topics=[
                        Commit.OffsetCommitRequestTopic(
                            name="foo",
                            partitions=[
                                Commit.OffsetCommitRequestTopic.OffsetCommitRequestPartition(
                                    partition_index=3, committed_offset=42, committed_leader_epoch=-1, committed_metadata=""
                                )
                            ],
                        )
                    ],
                ),
            )
        async with coordinator_on(log) as second:
            await second.wait_until_loaded()
            Fetch = m.OffsetFetchRequest
            fetched = await call(
                second, Fetch(groups=[Fetch.OffsetFetchRequestGroup(group_id="g", member_id=None, member_epoch=-1, topics=None)], require_stable=False)
            )
            assert [(t.name, p.partition_index, p.committed_offset) for t in fetched.groups[0].topics for p in t.partitions] == [("foo", 3, 42)]

    run_within(scenario(), GUARD_S * 3)


# --- the command's options -----------------------------------------------------------------------


def test_every_coordinator_option_can_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    from pystreams.commands import coordinator as command

    monkeypatch.setenv("PYSTREAMS_BOOTSTRAP_SERVERS", "kafka-1:9092,kafka-2:9092")
    monkeypatch.setenv("PYSTREAMS_LISTEN", "0.0.0.0:19093")
    monkeypatch.setenv("PYSTREAMS_ADVERTISED_LISTENER", "coordinator-0.coordinators:19093")
    monkeypatch.setenv("PYSTREAMS_SHARDS", "6")
    monkeypatch.setenv("PYSTREAMS_LOG", "kafka")
    monkeypatch.setenv("PYSTREAMS_METRICS_PORT", "9404")
    monkeypatch.setenv("PYSTREAMS_SESSION_TIMEOUT_MS", "6000")
    monkeypatch.setenv("PYSTREAMS_HEARTBEAT_INTERVAL_MS", "500")
    parser = argparse.ArgumentParser()
    command.configure(parser)
    settings = command.settings_from_args(parser.parse_args([]))
    assert settings.bootstrap_servers == "kafka-1:9092,kafka-2:9092"
    assert settings.listen == ("0.0.0.0", 19093)
    assert settings.advertised == ("coordinator-0.coordinators", 19093)
    assert (settings.shards, settings.log, settings.metrics_port) == (6, "kafka", 9404)
    # Values below the KIP's default bounds widen the bounds rather than being refused.
    assert (settings.config.session_timeout_ms, settings.config.min_session_timeout_ms) == (6000, 6000)
    assert (settings.config.heartbeat_interval_ms, settings.config.min_heartbeat_interval_ms) == (500, 500)
    # The command line wins over the environment.
    override = command.settings_from_args(parser.parse_args(["--shards", "2", "--log", "memory"]))
    assert (override.shards, override.log) == (2, "memory")
    # Classic groups and the migration between group types.
    assert (settings.config.migration_policy, settings.config.initial_rebalance_delay_ms) == ("bidirectional", 3000)
    classic = command.settings_from_args(
        parser.parse_args(
            ["--migration-policy", "UPGRADE", "--group-initial-rebalance-delay-ms", "0", "--group-min-session-timeout-ms", "1000", "--group-max-size", "50"]
        )
    )
    assert (classic.config.migration_policy, classic.config.initial_rebalance_delay_ms) == ("upgrade", 0)
    assert (classic.config.classic_min_session_timeout_ms, classic.config.classic_max_group_size) == (1000, 50)
    with pytest.raises(SystemExit):
        parser.parse_args(["--migration-policy", "sideways"])
    # A node of a coordinator cluster.
    assert (settings.cluster, settings.node_id) == (False, 0)
    monkeypatch.setenv("PYSTREAMS_CLUSTER", "true")
    monkeypatch.setenv("PYSTREAMS_NODE_ID", "2")
    monkeypatch.setenv("PYSTREAMS_CLUSTER_SESSION_TIMEOUT_MS", "6000")
    parser = argparse.ArgumentParser()
    command.configure(parser)
    node = command.settings_from_args(parser.parse_args([]))
    assert (node.cluster, node.node_id, node.cluster_session_timeout_ms, node.hot_standby) == (True, 2, 6000, True)
    assert command.settings_from_args(parser.parse_args(["--no-hot-standby"])).hot_standby is False
    monkeypatch.setenv("PYSTREAMS_NO_HOT_STANDBY", "yes")
    parser = argparse.ArgumentParser()
    command.configure(parser)
    assert command.settings_from_args(parser.parse_args([])).hot_standby is False
    monkeypatch.delenv("PYSTREAMS_NO_HOT_STANDBY")
    parser = argparse.ArgumentParser()
    command.configure(parser)
    with pytest.raises(ValueError, match="--cluster .* needs --log kafka"):
        command.settings_from_args(parser.parse_args(["--log", "memory"]))
    monkeypatch.setenv("PYSTREAMS_CLUSTER", "off")
    parser = argparse.ArgumentParser()
    command.configure(parser)
    assert command.settings_from_args(parser.parse_args([])).cluster is False
    monkeypatch.setenv("PYSTREAMS_CLUSTER", "maybe")
    parser = argparse.ArgumentParser()
    command.configure(parser)
    with pytest.raises(ValueError, match="PYSTREAMS_CLUSTER.* must be true or false"):
        command.settings_from_args(parser.parse_args([]))


def test_the_kafka_log_needs_bootstrap_servers(monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    from pystreams.commands import coordinator as command

    monkeypatch.delenv("PYSTREAMS_BOOTSTRAP_SERVERS", raising=False)
    monkeypatch.delenv("PYSTREAMS_LOG", raising=False)
    parser = argparse.ArgumentParser()
    command.configure(parser)
    with pytest.raises(ValueError, match="--bootstrap-servers"):
        command.settings_from_args(parser.parse_args(["--log", "kafka"]))
    assert command.run(parser.parse_args([])) == 2


# --- the Kafka log's append frames (pure) --------------------------------------------------------


def test_append_frames_drop_what_a_dying_writer_left_but_keep_what_compaction_thinned() -> None:
    from pystreams.coordinator.log import _FRAME, FRAME_HEADER, _AppendAssembler

    def framed(append: bytes, index: int, count: int, group: str):
        key, value = r.encode(r.GroupMetadata(group, r.GroupMetadataValue(index)))
        return key, value, [(FRAME_HEADER, _FRAME.pack(append * 16, index, count))]

    def read(entries, end_offset):
        """entries: (offset, key, value, headers); returns the group ids applied, in order."""
        assembler = _AppendAssembler(0)
        out = []
        for offset, key, value, headers in entries:
            out += assembler.add(offset, key, value, headers)
        out += assembler.finish(end_offset)
        return [(record.group_id, record.value.epoch) for record in out]

    # Two whole appends, each followed by its commit marker.
    whole = [(0, *framed(b"a", 0, 2, "a")), (1, *framed(b"a", 1, 2, "a")), (3, *framed(b"b", 0, 1, "b"))]
    assert read(whole, 5) == [("a", 0), ("a", 1), ("b", 0)]
    # A writer died after 2 of 3 records: only its abort marker follows (offset 4), then the next
    # writer's append at 5; or nothing but the marker before the end.
    died = [(0, *framed(b"a", 0, 1, "a")), (2, *framed(b"x", 0, 3, "x")), (3, *framed(b"x", 1, 3, "x"))]
    assert read(died + [(5, *framed(b"c", 0, 1, "c"))], 7) == [("a", 0), ("c", 0)]
    assert read(died, 5) == [("a", 0)]
    # Compaction removed the tail (offset 4) of append x: the gap says records existed; keep it.
    assert read(died + [(6, *framed(b"c", 0, 1, "c"))], 8) == [("a", 0), ("x", 0), ("x", 1), ("c", 0)]
    # Compaction removed the head or the middle: not a prefix, so not a dying writer; keep it.
    head_gone = [(3, *framed(b"x", 1, 3, "x")), (4, *framed(b"x", 2, 3, "x")), (6, *framed(b"c", 0, 1, "c"))]
    assert read(head_gone, 8) == [("x", 1), ("x", 2), ("c", 0)]
    middle_gone = [(2, *framed(b"x", 0, 3, "x")), (4, *framed(b"x", 2, 3, "x")), (6, *framed(b"c", 0, 1, "c"))]
    assert read(middle_gone, 8) == [("x", 0), ("x", 2), ("c", 0)]
    # Records without a frame are taken as they are.
    key, value = r.encode(r.GroupMetadata("plain", r.GroupMetadataValue(9)))
    assert read([(0, key, value, [])], 1) == [("plain", 9)]


@async_test
async def test_close_does_not_wait_for_a_shard_that_cannot_load() -> None:
    log = SlowClaims(2, {0})  # shard 0 never gets its partition
    coordinator = coordinator_on(log)
    await coordinator.start()
    await within(coordinator.runners[1].loaded.wait(), GUARD_S)
    await within(coordinator.close(), GUARD_S)
    assert [runner.state for runner in coordinator.runners] == [ShardState.CLOSED, ShardState.CLOSED]
    [stuck] = groups_on_shard(0, 2, 1)
    assert (await call(coordinator, join(stuck))).error_code == Errors.NotCoordinatorError.errno


# --- records that cannot be read ---------------------------------------------------------------


def poison_member_record(group_id: str) -> tuple[bytes, bytes]:
    """A member-metadata record as an older buggy version wrote it: a null topic name."""
    key, _ = r.encode(r.MemberMetadata(group_id, "ghost", None))
    value = msgspec.msgpack.encode({"group_epoch": 1, "client_id": "c", "client_host": "h", "rebalance_timeout_ms": 5000, "subscribed_topic_names": [None]})
    return key, value


@async_test
async def test_an_unreadable_record_quarantines_its_group_and_every_other_group_is_served() -> None:
    log = MemoryLog(1)
    sick, healthy = groups_on_shard(0, 1, 2)
    async with coordinator_on(log) as coordinator:
        await coordinator.wait_until_loaded()
        for group in (sick, healthy):
            assert (await call(coordinator, join(group))).error_code == 0
    key, value = poison_member_record(sick)
    log.append_raw(0, key, value)
    poisoned_at = log.size(0) - 1

    async with coordinator_on(log) as coordinator:
        await coordinator.wait_until_loaded()  # the shard loads: it is not bricked
        shard = coordinator.runners[0].shard
        assert list(shard.quarantined) == [sick]
        assert shard.quarantined[sick].unreadable[0].offset == poisoned_at
        refused = await call(coordinator, join(sick))
        assert refused.error_code == Errors.CoordinatorNotAvailableError.errno
        assert f"log offset {poisoned_at}" in refused.error_message and "subscribed_topic_names" in refused.error_message
        assert (await call(coordinator, join(healthy))).error_code == 0
        listed = await call(coordinator, m.ListGroupsRequest(states_filter=[], types_filter=[]))
        assert [g.group_id for g in listed.groups] == [healthy]

    log.append_raw(0, key, None)  # what `pystreams coordinator repair` writes: the key's tombstone
    async with coordinator_on(log) as coordinator:
        await coordinator.wait_until_loaded()
        assert not coordinator.runners[0].shard.quarantined
        assert (await call(coordinator, join(sick))).error_code == 0
