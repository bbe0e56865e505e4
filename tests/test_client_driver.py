"""The asyncio member driver against a real coordinator: an in-process ``Coordinator`` on a
``MemoryLog``, served over TCP by ``KafkaProtocolServer`` on 127.0.0.1.

Ownership is checked from the application's point of view, through the events: a partition is
owned from its ``PartitionsAssigned`` until its ``RevokePartitions``/``PartitionsLost``, and no
two drivers may own one at the same instant. Waits are bounded (GUARD_S) only so that a broken
driver fails instead of hanging; nothing asserts on speed.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import uuid
from collections.abc import Awaitable, Callable

import kafka.errors as Errors
import pytest
from kafka.protocol.api_header import RequestHeader
from kafka.protocol.api_message import ApiMessage
from pystreams.assignors.api import TopicMetadata
from test_coordinator_failover import processes  # noqa: F401  (fixture: coordinator processes, killed in teardown)

from pystreams.broker import free_port
from pystreams.client.driver import Backoff, CommitResult, MemberDriver, parse_bootstrap
from pystreams.client.member import (
    LeftGroup,
    MemberConfig,
    MemberEvent,
    MemberFailed,
    MemberState,
    PartitionsAssigned,
    PartitionsLost,
    RevokePartitions,
)
from pystreams.coordinator.config import CoordinatorConfig
from pystreams.coordinator.log import MemoryLog
from pystreams.coordinator.runtime import Coordinator, StaticTopics
from pystreams.partitions import TopicIdPartition
from pystreams.protocol import messages as m
from pystreams.protocol.server import BrokerAddress, KafkaProtocolServer
from tests.aio import run_within, within

GUARD_S = 15.0
FAST = CoordinatorConfig(
    session_timeout_ms=10_000,
    min_session_timeout_ms=100,
    max_session_timeout_ms=60_000,
    heartbeat_interval_ms=100,
    min_heartbeat_interval_ms=10,
    max_heartbeat_interval_ms=1_000,
)
FOO = TopicMetadata(uuid.UUID(int=1), "foo", 6)
ALL_FOO = frozenset(TopicIdPartition(FOO.topic_id, p) for p in range(FOO.num_partitions))


def async_test(test: Callable[..., Awaitable[None]]) -> Callable[..., None]:
    @functools.wraps(test)
    def run(*args: object, **kwargs: object) -> None:
        run_within(test(*args, **kwargs), GUARD_S * 3)

    return run


async def eventually(condition: Callable[[], bool], what: str, timeout: float = GUARD_S) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.02)


# --- the coordinator under test ------------------------------------------------------------------


class Server(KafkaProtocolServer):
    """Answers FindCoordinator with whatever ``coordinator_address`` says (default: itself)."""

    coordinator_address: BrokerAddress | None = None

    def coordinator_for(self, key: str, key_type: int) -> BrokerAddress | None:
        return self.coordinator_address or super().coordinator_for(key, key_type)


class Harness:
    """A coordinator on ``log`` behind a TCP server; records every heartbeat it receives and can
    pretend not to be the coordinator any more."""

    def __init__(self, log: MemoryLog) -> None:
        self.log = log
        self.coordinator: Coordinator | None = None
        self.server: Server | None = None
        self.heartbeats: list[tuple[str, int]] = []  # (member id, epoch), in arrival order
        self.not_coordinator = False
        self.find_coordinator_calls = 0

    async def start(self, port: int = 0) -> None:
        self.coordinator = Coordinator(self.log, config=FAST, topic_source=StaticTopics({"foo": FOO}))
        await self.coordinator.start()
        await self.coordinator.wait_until_loaded()
        self.server = Server("127.0.0.1", port, self.handle)
        await self.server.start()

    async def handle(self, header: RequestHeader, request: ApiMessage) -> ApiMessage:
        assert self.coordinator is not None
        if isinstance(request, m.ConsumerGroupHeartbeatRequest):
            self.heartbeats.append((request.member_id, request.member_epoch))
        if self.not_coordinator:
            raise Errors.NotCoordinatorError("this server no longer coordinates the group")
        return await self.coordinator.handle(header, request)

    @property
    def port(self) -> int:
        assert self.server is not None
        return self.server.port

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.close()
        if self.coordinator is not None:
            await self.coordinator.close()

    async def restart_on_same_port(self) -> None:
        """A new Coordinator instance on the same log, served on the same port."""
        port = self.port
        await self.stop()
        await self.start(port)


class Ownership:
    """Who owns what, as the applications see it through their events."""

    def __init__(self) -> None:
        self.owner: dict[TopicIdPartition, str] = {}
        self.violations: list[str] = []
        self.commits: list[CommitResult] = []
        self.events: dict[str, list[MemberEvent]] = {}

    def handler(self, name: str, driver: Callable[[], MemberDriver]) -> Callable[[MemberEvent], Awaitable[None]]:
        self.events[name] = []

        async def on_event(event: MemberEvent) -> None:
            self.events[name].append(event)
            if isinstance(event, PartitionsAssigned):
                for partition in event.partitions:
                    if partition in self.owner:
                        self.violations.append(f"{partition} assigned to {name} while {self.owner[partition]} owns it")
                    self.owner[partition] = name
            elif isinstance(event, RevokePartitions | PartitionsLost):
                for partition in event.partitions:
                    if self.owner.get(partition) == name:
                        del self.owner[partition]
                if isinstance(event, RevokePartitions):
                    # Commit before releasing, as a Streams task would.
                    offsets = {(p.topic_id, p.partition): 100 + p.partition for p in event.partitions}
                    self.commits.append(await driver().commit_offsets(offsets))

        return on_event

    def owned_by(self, name: str) -> set[TopicIdPartition]:
        return {p for p, owner in self.owner.items() if owner == name}


def make_driver(harness: Harness, ownership: Ownership, name: str, **config: object) -> MemberDriver:
    holder: list[MemberDriver] = []
    driver = MemberDriver(
        MemberConfig(group_id="g", client_id=name, server_assignor="uniform", rebalance_timeout_ms=10_000, **config),
        harness.bootstrap,
        on_event=ownership.handler(name, lambda: holder[0]),
        request_timeout_ms=2_000,
        reconnect_backoff_ms=20,
        reconnect_backoff_max_ms=200,
    )
    holder.append(driver)
    driver.subscribe(topics=["foo"])
    return driver


def balanced(drivers: dict[str, MemberDriver], ownership: Ownership) -> bool:
    sizes = sorted(len(ownership.owned_by(name)) for name in drivers)
    per_member = len(ALL_FOO) // len(drivers)
    return (
        set(ownership.owner) == ALL_FOO
        and sizes[0] >= per_member
        and sizes[-1] <= per_member + 1
        and all(d.member.state is MemberState.STABLE and not d.member.pending_partitions for d in drivers.values())
        and all(ownership.owned_by(name) == set(d.member.owned_partitions) for name, d in drivers.items())
    )


# --- tests -------------------------------------------------------------------------------------


def test_backoff_grows_caps_and_jitters_deterministically() -> None:
    backoff = Backoff(100, 1_000, jitter=0.2, random=lambda: 0.5)  # 0.5: no jitter
    assert [backoff.next_ms() for _ in range(6)] == [100, 200, 400, 800, 1_000, 1_000]
    backoff.reset()
    assert backoff.next_ms() == 100
    low = Backoff(100, 1_000, jitter=0.2, random=lambda: 0.0)
    high = Backoff(100, 1_000, jitter=0.2, random=lambda: 0.999999)
    assert low.next_ms() == 80 and high.next_ms() == 120
    assert [high.next_ms() for _ in range(5)][-1] == 1_000  # jitter never passes the cap
    assert parse_bootstrap("a:1, b:2") == [("a", 1), ("b", 2)]
    assert parse_bootstrap([("a", 1)]) == [("a", 1)]
    with pytest.raises(ValueError):
        parse_bootstrap("nohost")


@async_test
async def test_join_balance_rebalance_with_revoke_before_assign_then_leave() -> None:
    harness = Harness(MemoryLog(1))
    await harness.start()
    ownership = Ownership()
    drivers = {name: make_driver(harness, ownership, name) for name in ("a", "b", "c")}
    try:
        for driver in drivers.values():
            await driver.start()
        await eventually(lambda: balanced(drivers, ownership), "three drivers balanced")
        assert all(len(ownership.owned_by(name)) == 2 for name in drivers)

        drivers["d"] = make_driver(harness, ownership, "d")
        await drivers["d"].start()
        await eventually(lambda: balanced(drivers, ownership), "four drivers balanced")
        assert ownership.owned_by("d")
        # Partitions moved: something was revoked, committed first, and only then assigned.
        revoked = [e for name in "abc" for e in ownership.events[name] if isinstance(e, RevokePartitions)]
        assert revoked and ownership.commits and all(c.ok for c in ownership.commits)
        assert ownership.violations == []
        # The revoked partitions' offsets were committed by their previous owners.
        fetched = await drivers["d"].fetch_offsets((p.topic_id, p.partition) for e in revoked for p in e.partitions)
        assert fetched.ok
        assert fetched.offsets == {(p.topic_id, p.partition): 100 + p.partition for e in revoked for p in e.partitions}

        # "a" leaves cleanly: revoke (with commit) first, then the -1 heartbeat.
        leaving = drivers.pop("a")
        leaving_id = leaving.member.member_id
        await leaving.leave()
        assert ownership.owned_by("a") == set()
        assert isinstance(ownership.events["a"][-1], LeftGroup)
        assert ownership.events["a"][-1].member_epoch_sent == -1
        assert (leaving_id, -1) in harness.heartbeats
        await eventually(lambda: balanced(drivers, ownership), "three drivers balanced again")
        assert ownership.violations == []
        await leaving.close()
    finally:
        for driver in drivers.values():
            await driver.close(timeout_s=2)
        await harness.stop()
    assert ownership.violations == []


@async_test
async def test_offsets_by_name_and_id_and_stale_epoch_surfaces_to_the_caller() -> None:
    harness = Harness(MemoryLog(1))
    await harness.start()
    ownership = Ownership()
    driver = make_driver(harness, ownership, "solo")
    try:
        await driver.start()
        await eventually(lambda: balanced({"solo": driver}, ownership), "one driver owns all")
        epoch = driver.member.member_epoch
        result = await driver.commit_offsets({(FOO.topic_id, 0): 5, ("foo", 1): 7})
        assert result.ok and result.member_epoch == epoch, result
        fetched = await driver.fetch_offsets([(FOO.topic_id, 0), ("foo", 1), ("foo", 2)])
        assert fetched.offsets == {(FOO.topic_id, 0): 5, ("foo", 1): 7, ("foo", 2): -1}

        # An older epoch than the coordinator's: STALE, per partition, reported not raised.
        stale = await driver.commit_offsets({(FOO.topic_id, 0): 6}, member_epoch=epoch - 1)
        assert stale.stale_member_epoch and not stale.ok
        assert stale.failed == {(FOO.topic_id, 0): Errors.StaleMemberEpochError.errno}
        # The documented recovery: wait for the next heartbeat, commit again with its epoch.
        await driver.next_heartbeat()
        retried = await driver.commit_offsets({(FOO.topic_id, 0): 6})
        assert retried.ok
        assert (await driver.fetch_offsets([(FOO.topic_id, 0)])).offsets == {(FOO.topic_id, 0): 6}
        # A newer epoch is fenced.
        fenced = await driver.commit_offsets({(FOO.topic_id, 0): 9}, member_epoch=epoch + 100)
        assert fenced.failed == {(FOO.topic_id, 0): Errors.FencedMemberEpochError.errno}
    finally:
        await driver.close(timeout_s=2)
        await harness.stop()


@async_test
async def test_coordinator_restart_on_the_same_log_and_port_keeps_assignments() -> None:
    harness = Harness(MemoryLog(1))
    await harness.start()
    ownership = Ownership()
    drivers = {name: make_driver(harness, ownership, name) for name in ("a", "b", "c")}
    try:
        for driver in drivers.values():
            await driver.start()
        await eventually(lambda: balanced(drivers, ownership), "balanced")
        before = {name: (d.member.member_id, d.member.member_epoch, d.member.owned_partitions) for name, d in drivers.items()}
        member_ids = {member_id for member_id, _, _ in before.values()}
        joins_before = sum(1 for _, epoch in harness.heartbeats if epoch == 0)
        finds_before = {name: d.find_coordinator_count for name, d in drivers.items()}

        await harness.restart_on_same_port()
        # Every driver notices the lost connection, finds the coordinator again and heartbeats
        # the new instance with its id and epoch.
        mark = len(harness.heartbeats)
        await eventually(lambda: {mid for mid, _ in harness.heartbeats[mark:]} >= member_ids, "heartbeats to the new coordinator")
        await asyncio.sleep(0.5)  # several heartbeat intervals on the new instance
        assert all(d.find_coordinator_count > finds_before[name] for name, d in drivers.items())
        after = {name: (d.member.member_id, d.member.member_epoch, d.member.owned_partitions) for name, d in drivers.items()}
        assert after == before
        assert sum(1 for _, epoch in harness.heartbeats if epoch == 0) == joins_before  # no rejoin
        assert not any(isinstance(e, PartitionsLost) for events in ownership.events.values() for e in events)
        assert balanced(drivers, ownership) and ownership.violations == []
    finally:
        for driver in drivers.values():
            await driver.close(timeout_s=2)
        await harness.stop()


@async_test
async def test_not_coordinator_sends_the_driver_back_to_find_coordinator() -> None:
    log = MemoryLog(1)
    harness = Harness(log)
    await harness.start()
    ownership = Ownership()
    drivers = {name: make_driver(harness, ownership, name) for name in ("a", "b")}
    other: KafkaProtocolServer | None = None
    try:
        for driver in drivers.values():
            await driver.start()
        await eventually(lambda: balanced(drivers, ownership), "balanced")
        assert all(d.coordinator == ("127.0.0.1", harness.port) for d in drivers.values())
        finds_before = {name: d.find_coordinator_count for name, d in drivers.items()}
        joins_before = sum(1 for _, epoch in harness.heartbeats if epoch == 0)

        # The same coordinator is now reachable on another listener; the old one answers
        # NOT_COORDINATOR and the bootstrap's FindCoordinator points at the new one.
        assert harness.coordinator is not None and harness.server is not None
        other = KafkaProtocolServer("127.0.0.1", 0, harness.coordinator.handle)
        await other.start()
        harness.server.coordinator_address = other.address
        harness.not_coordinator = True

        await eventually(lambda: all(d.coordinator == ("127.0.0.1", other.port) for d in drivers.values()), "moved to the new address")
        assert all(d.find_coordinator_count > finds_before[name] for name, d in drivers.items())
        epochs = {name: d.member.member_epoch for name, d in drivers.items()}
        await asyncio.sleep(0.4)
        assert {name: d.member.member_epoch for name, d in drivers.items()} == epochs
        assert balanced(drivers, ownership) and ownership.violations == []
        assert sum(1 for _, epoch in harness.heartbeats if epoch == 0) == joins_before
    finally:
        for driver in drivers.values():
            await driver.close(timeout_s=2)
        if other is not None:
            await other.close()
        await harness.stop()


@async_test
async def test_unreachable_bootstrap_backs_off_then_connects() -> None:
    harness = Harness(MemoryLog(1))
    await harness.start()
    port = harness.port
    await harness.stop()  # nothing listens on the port for a while
    ownership = Ownership()
    driver = MemberDriver(
        MemberConfig(group_id="g", server_assignor="uniform"),
        f"127.0.0.1:{port}",
        on_event=ownership.handler("x", lambda: driver),
        request_timeout_ms=1_000,
        reconnect_backoff_ms=10,
        reconnect_backoff_max_ms=50,
        random=lambda: 0.5,
    )
    driver.subscribe(topics=["foo"])
    try:
        await driver.start()
        await asyncio.sleep(0.3)
        assert driver.coordinator is None and driver._backoff.attempts >= 3
        harness = Harness(MemoryLog(1))
        await harness.start(port)
        await eventually(lambda: balanced({"x": driver}, ownership), "connected and assigned")
        assert driver._backoff.attempts == 0  # reset by a successful heartbeat
    finally:
        await driver.close(timeout_s=2)
        await harness.stop()


async def given_up_at(bootstrap: str, connect_timeout_ms: int) -> MemberFailed:
    """Run a member toward ``bootstrap`` until its driver gives up; the MemberFailed it got."""
    driver = MemberDriver(
        MemberConfig(group_id="g", server_assignor="uniform"),
        bootstrap,
        request_timeout_ms=1_000,
        reconnect_backoff_ms=10,
        reconnect_backoff_max_ms=50,
        random=lambda: 0.5,
        connect_timeout_ms=connect_timeout_ms,
    )
    driver.subscribe(topics=["foo"])

    async def next_failure() -> MemberFailed:
        while True:
            event = await driver.events.get()
            if isinstance(event, MemberFailed):
                return event

    try:
        await driver.start()
        failed = await within(next_failure(), GUARD_S)
    finally:
        await driver.close(timeout_s=1)
    assert driver.gave_up == failed.message
    return failed


@async_test
async def test_nothing_listening_is_said_at_info_then_warning_and_given_up_after_the_connect_timeout(
    caplog: pytest.LogCaptureFixture,
) -> None:
    port = free_port()
    caplog.set_level(logging.INFO, logger="pystreams.client.driver")
    failed = await given_up_at(f"127.0.0.1:{port}", connect_timeout_ms=600)
    said = f"nothing listens at 127.0.0.1:{port} — is the coordinator running?"
    assert said in failed.message and "giving up" in failed.message
    levels = [r.levelno for r in caplog.records if said in r.getMessage()]
    # Escalates once failing lasted half the connect timeout; the end is the event's to say.
    assert levels[0] == logging.INFO and logging.WARNING in levels and logging.ERROR not in levels
    assert levels.count(logging.INFO) == 1  # the same reason is said once until it becomes a warning


@async_test
async def test_a_coordinator_named_by_find_coordinator_that_is_gone_is_the_one_said_to_be_unreachable() -> None:
    """A node of a cluster may name a node that just stopped (until the shards moved): the
    failure names that node, and who named it, not the node that answered."""
    dead = free_port()
    server = Server("127.0.0.1", 0, lambda header, request: asyncio.sleep(0))
    server.coordinator_address = BrokerAddress(7, "127.0.0.1", dead)
    await server.start()
    port = server.port
    try:
        failed = await given_up_at(f"127.0.0.1:{port}", connect_timeout_ms=400)
    finally:
        await server.close()
    assert f"nothing listens at 127.0.0.1:{dead}" in failed.message
    assert f"named by FindCoordinator at 127.0.0.1:{port}" in failed.message
    assert f"nothing listens at 127.0.0.1:{port}" not in failed.message


@async_test
async def test_a_kafka_broker_given_as_the_coordinator_is_named_as_one_at_once(
    kafka_bootstrap: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="pystreams.client.driver")
    failed = await given_up_at(kafka_bootstrap, connect_timeout_ms=400)
    said = f"{kafka_bootstrap} is a Kafka broker, not a pystreams coordinator"
    assert said in failed.message and "--coordinator" in failed.message
    first = next(r for r in caplog.records if said in r.getMessage())
    assert first.levelno == logging.WARNING  # retrying will not make a broker a coordinator


@async_test
async def test_a_member_that_once_reached_its_coordinator_keeps_retrying_past_the_connect_timeout() -> None:
    harness = Harness(MemoryLog(1))
    await harness.start()
    port = harness.port
    ownership = Ownership()
    driver = MemberDriver(
        MemberConfig(group_id="g", server_assignor="uniform"),
        harness.bootstrap,
        on_event=ownership.handler("x", lambda: driver),
        request_timeout_ms=1_000,
        reconnect_backoff_ms=10,
        reconnect_backoff_max_ms=50,
        connect_timeout_ms=300,
    )
    driver.subscribe(topics=["foo"])
    try:
        await driver.start()
        await eventually(lambda: balanced({"x": driver}, ownership), "joined")
        await harness.stop()  # the coordinator restarts: it is away for longer than the timeout
        await asyncio.sleep(1.0)
        assert driver.gave_up is None and not any(isinstance(e, MemberFailed) for e in ownership.events["x"])
        harness = Harness(MemoryLog(1))
        await harness.start(port)
        await eventually(lambda: driver.coordinator == ("127.0.0.1", port), "reconnected")
    finally:
        await driver.close(timeout_s=2)
        await harness.stop()


@async_test
async def test_events_queue_interface_and_static_leave() -> None:
    harness = Harness(MemoryLog(1))
    await harness.start()
    driver = MemberDriver(
        MemberConfig(group_id="g", server_assignor="uniform", instance_id="instance-1"),
        harness.bootstrap,
        request_timeout_ms=2_000,
    )
    driver.subscribe(topics=["foo"])
    try:
        await driver.start()
        async with asyncio.timeout(GUARD_S):
            event = await driver.events.get()
        assert isinstance(event, PartitionsAssigned) and event.partitions == ALL_FOO
        leave = asyncio.create_task(driver.leave())
        async with asyncio.timeout(GUARD_S):
            revoke = await driver.events.get()
        assert isinstance(revoke, RevokePartitions) and revoke.partitions == ALL_FOO
        assert not leave.done()  # waits for the application to release the partitions
        driver.revocation_done(revoke)
        await within(leave, GUARD_S)
        left = await driver.events.get()
        assert isinstance(left, LeftGroup) and left.member_epoch_sent == -2
        assert harness.heartbeats[-1][1] == -2
    finally:
        await driver.close(timeout_s=2)
        await harness.stop()


# --- against the real coordinator process, with its log on the embedded broker ------------------


@pytest.mark.integration
def test_drivers_against_the_coordinator_process_survive_a_sigkill(kafka_bootstrap: str, unique_topic, processes) -> None:
    from test_coordinator_failover import coordinator_args

    from pystreams.broker import free_port
    from pystreams.cluster import ClusterMetadata, TopicSpec

    data_topic, log_topic, group = unique_topic("data"), unique_topic("groups-log"), unique_topic("group")
    with ClusterMetadata(kafka_bootstrap) as cluster:
        cluster.ensure_topics([TopicSpec(data_topic, 4)])
    port = free_port()

    async def scenario() -> None:
        first = processes(*coordinator_args(kafka_bootstrap, log_topic, port))
        host, bound = first.address()
        first.wait_ready()
        ownership = Ownership()
        drivers: dict[str, MemberDriver] = {}
        for name in ("a", "b"):
            holder: list[MemberDriver] = []
            driver = MemberDriver(
                MemberConfig(group_id=group, client_id=name, server_assignor="uniform", rebalance_timeout_ms=30_000),
                f"{host}:{bound}",
                on_event=ownership.handler(name, lambda holder=holder: holder[0]),
                request_timeout_ms=5_000,
                reconnect_backoff_ms=50,
                reconnect_backoff_max_ms=500,
            )
            holder.append(driver)
            driver.subscribe(topics=[data_topic])
            drivers[name] = driver

        def settled() -> bool:
            return (
                len(ownership.owner) == 4
                and all(len(ownership.owned_by(name)) == 2 for name in drivers)
                and all(d.member.state is MemberState.STABLE and not d.member.pending_partitions for d in drivers.values())
            )

        try:
            for driver in drivers.values():
                await driver.start()
            await eventually(settled, "two drivers with two partitions each", timeout=30)
            assert (await drivers["a"].commit_offsets({(data_topic, 0): 11})).ok
            before = {name: (d.member.member_id, d.member.member_epoch, d.member.owned_partitions) for name, d in drivers.items()}

            first.kill()
            second = processes(*coordinator_args(kafka_bootstrap, log_topic, port))
            second.address()
            second.wait_ready()
            await eventually(lambda: all(d.coordinator is not None for d in drivers.values()), "reconnected", timeout=30)
            await drivers["a"].next_heartbeat(timeout_s=30)
            await drivers["b"].next_heartbeat(timeout_s=30)
            after = {name: (d.member.member_id, d.member.member_epoch, d.member.owned_partitions) for name, d in drivers.items()}
            assert after == before
            assert (await drivers["b"].fetch_offsets([(data_topic, 0)])).offsets == {(data_topic, 0): 11}
            assert not any(isinstance(e, PartitionsLost) for events in ownership.events.values() for e in events)
            assert ownership.violations == []
        finally:
            for driver in drivers.values():
                await driver.close(timeout_s=5)

    run_within(scenario(), 120)
