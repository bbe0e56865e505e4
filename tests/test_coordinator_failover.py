"""Coordinator fail-over with real processes: ``python -m pystreams.commands.coordinator --log
kafka`` against the embedded broker, members speaking the Kafka protocol over TCP.

The members are the real :class:`~pystreams.client.member.ConsumerGroupMember` state machine driven by a
small asyncio loop written for these tests (one connection per member, requests built from
``pystreams.protocol.messages``). The coordinator is killed with SIGKILL while a member is in
the middle of revoking; a new process on the same log must have the same groups, and the
members must carry on with their ids, epochs and partitions — no rejoin (epoch 0), no
FENCED_MEMBER_EPOCH or UNKNOWN_MEMBER_ID — until the reconciliation completes.

Every wait is bounded; every process is killed in teardown; nothing asserts on speed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import kafka.errors as Errors
import msgspec
import pytest
from kafka.admin import KafkaAdminClient
from kafka.protocol.parser import KafkaProtocol
from kafka.structs import TopicPartition

from pystreams.broker import free_port, responds_to_kafka
from pystreams.client.member import (
    ConsumerGroupMember,
    MemberConfig,
    MemberState,
    PartitionsLost,
    RevokePartitions,
)
from pystreams.cluster import ClusterMetadata, TopicSpec
from pystreams.commands.coordinator import LISTEN_LINE_PREFIX, READY_LINE
from pystreams.protocol import messages as m
from tests.aio import run_within, within

pytestmark = pytest.mark.integration

GUARD_S = 30.0
HEARTBEAT_INTERVAL_MS = 200
PARTITIONS = 6
FENCING_ERRORS = {Errors.FencedMemberEpochError.errno, Errors.UnknownMemberIdError.errno}


def monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


# --- coordinator processes ---------------------------------------------------------------------


class CoordinatorProcess:
    """``python -m pystreams.commands.<command> ARGS`` with its output collected line by line."""

    def __init__(self, *args: str, module: str = "pystreams.commands.coordinator") -> None:
        self._stderr = tempfile.NamedTemporaryFile(prefix="pystreams-coordinator-", suffix=".log", delete=False)
        self.process = subprocess.Popen(
            [sys.executable, "-m", module, *args],
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            start_new_session=True,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.output: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def wait_for_line(self, predicate: Callable[[str], bool], timeout: float = GUARD_S) -> str:
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no expected line within {timeout} s; output {self.output}; log:\n{self.log_tail()}")
            try:
                line = self.lines.get(timeout=remaining)
            except queue.Empty:
                continue
            if line is None:
                raise AssertionError(f"process exited ({self.process.wait()}) without the expected line; output {self.output}; log:\n{self.log_tail()}")
            self.output.append(line)
            if predicate(line):
                return line

    def address(self) -> tuple[str, int]:
        line = self.wait_for_line(lambda text: text.startswith(LISTEN_LINE_PREFIX))
        host, _, port = line.removeprefix(LISTEN_LINE_PREFIX).rpartition(":")
        return host, int(port)

    def wait_ready(self) -> None:
        self.wait_for_line(lambda text: text.startswith(READY_LINE))

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(Path(self._stderr.name).read_text(errors="replace").splitlines()[-lines:])

    def kill(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(GUARD_S)

    def cleanup(self) -> None:
        self.kill()
        self._stderr.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._stderr.name)


@pytest.fixture
def processes() -> Iterator[Callable[..., CoordinatorProcess]]:
    started: list[CoordinatorProcess] = []

    def start(*args: str, module: str = "pystreams.commands.coordinator") -> CoordinatorProcess:
        process = CoordinatorProcess(*args, module=module)
        started.append(process)
        return process

    yield start
    for process in started:
        process.cleanup()


def coordinator_args(bootstrap: str, log_topic: str, port: int, shards: int = 2) -> list[str]:
    return [
        "--bootstrap-servers",
        bootstrap,
        "--log",
        "kafka",
        "--log-topic",
        log_topic,
        "--listen",
        f"127.0.0.1:{port}",
        "--shards",
        str(shards),
        "--session-timeout-ms",
        "30000",
        "--heartbeat-interval-ms",
        str(HEARTBEAT_INTERVAL_MS),
        "--metadata-refresh-ms",
        "500",
        "--log-level",
        "INFO",
    ]


# --- a minimal asyncio member driver (tests only) ----------------------------------------------


class Connection:
    """One Kafka-protocol connection: a request at a time, answered in order."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, client_id: str) -> None:
        self.reader, self.writer = reader, writer
        self.protocol = KafkaProtocol(client_id=client_id)

    @classmethod
    async def open(cls, address: tuple[str, int], client_id: str) -> Connection:
        reader, writer = await within(asyncio.open_connection(*address), 5)
        return cls(reader, writer, client_id)

    async def call(self, request, version: int):
        request.API_VERSION = version
        self.protocol.send_request(request)
        self.writer.write(self.protocol.send_bytes())
        await self.writer.drain()
        size = await within(self.reader.readexactly(4), 5)
        body = await within(self.reader.readexactly(struct.unpack(">i", size)[0]), 5)
        [(_, response)] = self.protocol.receive_bytes(size + body)
        return response

    def close(self) -> None:
        self.writer.close()


class WireMember:
    """Drives one ConsumerGroupMember over TCP. Revocations are completed at once unless held."""

    def __init__(self, name: str, group_id: str, topic: str, address: tuple[str, int]) -> None:
        self.name = name
        self.address = address
        self.member = ConsumerGroupMember(MemberConfig(group_id=group_id, client_id=name, rebalance_timeout_ms=60_000, server_assignor="uniform"))
        self.member.subscribe(topics=[topic])
        self.connection: Connection | None = None
        self.sent: list = []  # every request, in order
        self.error_codes: list[int] = []
        self.lost: list[PartitionsLost] = []
        self.hold_revocations = False
        self.held: list[RevokePartitions] = []
        self.paused = False
        self.idle = asyncio.Event()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self.connection is not None:
            self.connection.close()

    async def pause(self) -> None:
        """Stop sending; return once no request is in flight."""
        self.paused = True
        self.idle.clear()
        await within(self.idle.wait(), GUARD_S)

    def resume(self) -> None:
        self.paused = False

    def release_revocations(self) -> None:
        self.hold_revocations = False
        for event in self.held:
            self.member.revocation_done(monotonic_ms(), event.revocation_id)
        self.held.clear()

    async def call(self, request, version: int):
        if self.connection is None:
            self.connection = await Connection.open(self.address, self.name)
        try:
            return await self.connection.call(request, version)
        except BaseException:
            self.connection.close()
            self.connection = None
            raise

    async def _run(self) -> None:
        while True:
            if self.paused:
                self.idle.set()
                await asyncio.sleep(0.01)
                continue
            for request in self.member.poll(monotonic_ms()):
                self.sent.append(request)
                try:
                    response = await self.call(request, 0)
                except (OSError, EOFError, asyncio.IncompleteReadError, TimeoutError):
                    self.member.on_request_failed(request, monotonic_ms())
                    continue
                self.error_codes.append(response.error_code)
                self.member.on_response(request, response, monotonic_ms())
            for event in self.member.take_events():
                if isinstance(event, PartitionsLost):
                    self.lost.append(event)
                elif isinstance(event, RevokePartitions):
                    if self.hold_revocations:
                        self.held.append(event)
                    else:
                        self.member.revocation_done(monotonic_ms(), event.revocation_id)
            deadline = self.member.next_deadline()
            wait_ms = 20 if deadline is None else min(max(deadline - monotonic_ms(), 0), 20)
            await asyncio.sleep(wait_ms / 1000)

    @property
    def owned(self) -> set:
        return set(self.member.owned_partitions)


async def eventually(condition: Callable[[], bool], what: str, timeout: float = GUARD_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for: {what}")
        await asyncio.sleep(0.02)


async def describe_group(address: tuple[str, int], group_id: str):
    connection = await Connection.open(address, "describer")
    try:
        response = await connection.call(m.ConsumerGroupDescribeRequest(group_ids=[group_id], include_authorized_operations=False), 0)
    finally:
        connection.close()
    [group] = response.groups
    return group


async def commit_offsets(member: WireMember, topic: str, offsets: dict[int, int]) -> list[int]:
    Commit = m.OffsetCommitRequest
    request = Commit(
        group_id=member.member.config.group_id,
        generation_id_or_member_epoch=member.member.member_epoch,
        member_id=member.member.member_id,
        topics=[
            Commit.OffsetCommitRequestTopic(
                name=topic,
                partitions=[
                    Commit.OffsetCommitRequestTopic.OffsetCommitRequestPartition(
                        partition_index=p, committed_offset=o, committed_leader_epoch=-1, committed_metadata=""
                    )
                    for p, o in offsets.items()
                ],
            )
        ],
    )
    connection = await Connection.open(member.address, member.name + "-committer")
    try:
        response = await connection.call(request, 9)
    finally:
        connection.close()
    return [p.error_code for t in response.topics for p in t.partitions]


def stable_with(members: list[WireMember], per_member: int) -> bool:
    owned = [member.owned for member in members]
    return (
        all(member.member.state is MemberState.STABLE for member in members)
        and all(len(o) == per_member for o in owned)
        and len(set().union(*owned)) == per_member * len(members)
    )


# --- the tests ---------------------------------------------------------------------------------


def test_sigkill_mid_reconciliation_then_a_new_coordinator_continues_where_it_stopped(
    kafka_bootstrap: str,
    unique_topic: Callable[[str], str],
    processes: Callable[..., CoordinatorProcess],
) -> None:
    data_topic, log_topic, group = unique_topic("data"), unique_topic("groups-log"), unique_topic("group")
    with ClusterMetadata(kafka_bootstrap) as cluster:
        cluster.ensure_topics([TopicSpec(data_topic, PARTITIONS)])
    port = free_port()

    async def scenario() -> None:
        first = processes(*coordinator_args(kafka_bootstrap, log_topic, port))
        address = first.address()
        first.wait_ready()
        m1, m2, m3 = (WireMember(name, group, data_topic, address) for name in ("m1", "m2", "m3"))
        members = [m1, m2, m3]
        try:
            for member in (m1, m2):
                member.start()
            await eventually(lambda: stable_with([m1, m2], 3), "two members stable with 3 partitions each")
            assert all(code == 0 for code in await commit_offsets(m1, data_topic, {0: 100, 1: 101}))

            # A third member joins; m1 must give up a partition but holds on to it (revoking).
            m1.hold_revocations = True
            m3.start()
            await eventually(lambda: bool(m1.held), "m1 asked to revoke")
            await eventually(lambda: m2.member.state is MemberState.STABLE and len(m2.owned) == 2, "m2 revoked")
            await eventually(lambda: len(m3.owned) == 1, "m3 got the partition m2 released (m1's is still held)")
            for member in members:
                await member.pause()
            before = await describe_group(address, group)
            assert before.error_code == 0 and before.group_state == "Reconciling"
            by_id = {member.member_id: member for member in before.members}
            holder = by_id[m1.member.member_id]
            held = {(t.topic_id, p) for t in holder.assignment.topic_partitions for p in t.partitions}
            target = {(t.topic_id, p) for t in holder.target_assignment.topic_partitions for p in t.partitions}
            assert len(held) == 3 and len(target) == 2 and target < held, "m1 is mid-revocation"
            ids_before = {member.name: member.member.member_id for member in members}
            epochs_before = {member.name: member.member.member_epoch for member in members}
            owned_before = {member.name: member.owned for member in members}
            sent_before = {member.name: len(member.sent) for member in members}

            first.kill()  # SIGKILL: no goodbye, whatever was in flight stays in flight
            assert first.process.returncode == -signal.SIGKILL

            second = processes(*coordinator_args(kafka_bootstrap, log_topic, port))
            assert second.address() == address
            second.wait_ready()
            after = await describe_group(address, group)
            assert after == before

            for member in members:
                member.resume()
            # Nobody noticed anything but a dropped connection: same ids, same epochs, same partitions.
            await asyncio.sleep(3 * HEARTBEAT_INTERVAL_MS / 1000)
            assert {member.name: member.member.member_id for member in members} == ids_before
            assert {member.name: member.member.member_epoch for member in members} == epochs_before
            assert {member.name: member.owned for member in members} == owned_before

            m1.release_revocations()
            await eventually(lambda: stable_with(members, 2), "the reconciliation completes on the new coordinator")
            final = await describe_group(address, group)
            assert final.group_state == "Stable"
            assert {member.member_epoch for member in final.members} == {final.assignment_epoch}
            assert final.group_epoch == before.group_epoch  # no member left or joined: no new epoch

            for member in members:
                after_failover = member.sent[sent_before[member.name] :]
                assert after_failover, f"{member.name} sent nothing to the new coordinator"
                assert all(request.member_epoch != 0 for request in after_failover if isinstance(request, m.ConsumerGroupHeartbeatRequest)), (
                    f"{member.name} rejoined"
                )
                assert not FENCING_ERRORS & set(member.error_codes), f"{member.name} was fenced: {member.error_codes}"
                assert not member.lost
                assert member.member.member_id == ids_before[member.name]
        finally:
            for member in members:
                await member.stop()

        # Standard admin tooling, bootstrapped at the coordinator: the group and the offsets
        # committed before the crash.
        admin = KafkaAdminClient(bootstrap_servers=f"{address[0]}:{address[1]}", request_timeout_ms=10_000)
        try:
            listed = await asyncio.to_thread(admin.list_groups)
            assert group in {entry["group_id"] if isinstance(entry, dict) else entry[0] for entry in listed}
            offsets = await asyncio.to_thread(admin.list_group_offsets, group)
            assert {tp: meta.offset for tp, meta in offsets[group].items()} == {TopicPartition(data_topic, 0): 100, TopicPartition(data_topic, 1): 101}
        finally:
            admin.close()

    run_within(scenario(), GUARD_S * 4)


def test_acknowledged_commits_survive_a_sigkill_under_load(
    kafka_bootstrap: str,
    unique_topic: Callable[[str], str],
    processes: Callable[..., CoordinatorProcess],
) -> None:
    """Kill while members heartbeat and commit continuously: every commit the old coordinator
    acknowledged is there after the restart, and the members continue without rejoining."""
    data_topic, log_topic, group = unique_topic("data"), unique_topic("groups-log"), unique_topic("group")
    with ClusterMetadata(kafka_bootstrap) as cluster:
        cluster.ensure_topics([TopicSpec(data_topic, PARTITIONS)])
    port = free_port()

    async def scenario() -> None:
        first = processes(*coordinator_args(kafka_bootstrap, log_topic, port, shards=3))
        address = first.address()
        first.wait_ready()
        members = [WireMember(f"m{i}", group, data_topic, address) for i in range(2)]
        acknowledged = {"offset": -1}
        stop = asyncio.Event()

        async def commit_forever() -> None:
            offset = 0
            while not stop.is_set():
                offset += 1
                try:
                    codes = await commit_offsets(members[0], data_topic, {0: offset})
                except (OSError, EOFError, asyncio.IncompleteReadError, TimeoutError):
                    await asyncio.sleep(0.05)
                    continue
                if codes == [0]:
                    acknowledged["offset"] = offset
                else:
                    await asyncio.sleep(0.05)  # stale epoch during a rebalance, or loading

        try:
            for member in members:
                member.start()
            await eventually(lambda: stable_with(members, 3), "two members stable")
            ids = [member.member.member_id for member in members]
            committer = asyncio.create_task(commit_forever())
            await eventually(lambda: acknowledged["offset"] >= 20, "commits flowing")
            first.kill()
            last_acknowledged = acknowledged["offset"]

            second = processes(*coordinator_args(kafka_bootstrap, log_topic, port, shards=3))
            second.address()
            second.wait_ready()
            await eventually(lambda: acknowledged["offset"] > last_acknowledged + 5, "commits flowing again")
            stop.set()
            await committer

            Fetch = m.OffsetFetchRequest
            connection = await Connection.open(address, "checker")
            try:
                fetched = await connection.call(
                    Fetch(groups=[Fetch.OffsetFetchRequestGroup(group_id=group, member_id=None, member_epoch=-1, topics=None)], require_stable=False), 9
                )
            finally:
                connection.close()
            [(name, committed)] = [(t.name, p.committed_offset) for t in fetched.groups[0].topics for p in t.partitions]
            assert name == data_topic and committed >= acknowledged["offset"] > last_acknowledged

            assert stable_with(members, 3)
            assert [member.member.member_id for member in members] == ids
            for member in members:
                assert all(request.member_epoch != 0 for request in member.sent[1:] if isinstance(request, m.ConsumerGroupHeartbeatRequest)), (
                    f"{member.name} rejoined"
                )
                assert not FENCING_ERRORS & set(member.error_codes)
                assert not member.lost
        finally:
            stop.set()
            for member in members:
                await member.stop()

    run_within(scenario(), GUARD_S * 4)


def test_a_log_topic_with_another_partition_count_is_refused_with_a_clear_error(
    kafka_bootstrap: str,
    unique_topic: Callable[[str], str],
    processes: Callable[..., CoordinatorProcess],
) -> None:
    log_topic = unique_topic("groups-log")
    with ClusterMetadata(kafka_bootstrap) as cluster:
        cluster.ensure_topics([TopicSpec(log_topic, 2, configs={"cleanup.policy": "compact"})])
    process = processes(*coordinator_args(kafka_bootstrap, log_topic, 0, shards=3))
    assert process.process.wait(GUARD_S) == 1
    log = process.log_tail()
    assert "2 partitions, expected 3" in log and "can never change" in log


def test_sigterm_stops_the_coordinator_cleanly(
    kafka_bootstrap: str,
    unique_topic: Callable[[str], str],
    processes: Callable[..., CoordinatorProcess],
) -> None:
    process = processes(*coordinator_args(kafka_bootstrap, unique_topic("groups-log"), 0))
    host, port = process.address()
    process.wait_ready()
    assert responds_to_kafka(host, port)
    process.process.send_signal(signal.SIGTERM)
    assert process.process.wait(GUARD_S) == 0
    assert not responds_to_kafka(host, port, timeout=0.5)
    # Operators grep for ERROR: a clean start and stop logs none (kafka-python's clients, closed
    # with a metadata refresh in flight, logged "ERROR kafka.cluster: Metadata refresh: failed").
    log = process.log_tail(lines=100_000)
    assert [line for line in log.splitlines() if " ERROR " in line] == [], log


def test_dev_runs_a_broker_and_a_coordinator_and_stops_both_on_ctrl_c(processes: Callable[..., CoordinatorProcess]) -> None:
    broker_port = free_port()
    dev = processes("--broker-port", str(broker_port), "--listen", "127.0.0.1:0", "--shards", "1", module="pystreams.commands.dev")
    broker_line = dev.wait_for_line(lambda line: line.startswith("broker: "))
    assert broker_line == f"broker: 127.0.0.1:{broker_port}"
    host, port = dev.address()
    dev.wait_ready()
    assert responds_to_kafka("127.0.0.1", broker_port) and responds_to_kafka(host, port)
    # The coordinator keeps its log on the broker it started.
    with ClusterMetadata(f"127.0.0.1:{broker_port}") as cluster:
        assert cluster.fetch_topics(["__pystreams_groups"])["__pystreams_groups"].num_partitions == 1
    os.killpg(dev.process.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
    assert dev.process.wait(GUARD_S) == 0
    assert not responds_to_kafka(host, port, timeout=0.5)
    assert not responds_to_kafka("127.0.0.1", broker_port, timeout=0.5)


# --- the Kafka record log on its own -------------------------------------------------------------


def _records(group: str, count: int) -> list:
    from pystreams.coordinator import records as r

    out = [r.GroupMetadata(group, r.GroupMetadataValue(epoch)) for epoch in range(1, count + 1)]
    out.append(r.GroupConfig(group, None))  # a tombstone survives the round trip
    return out


def test_kafka_log_reads_back_appends_in_order_and_a_new_claim_fences_the_old_writer(
    kafka_bootstrap: str,
    unique_topic: Callable[[str], str],
) -> None:
    from pystreams.coordinator.log import KafkaLog, LogFencedError

    topic = unique_topic("groups-log")

    async def scenario() -> None:
        first_log, second_log = KafkaLog(kafka_bootstrap, 2, topic=topic), KafkaLog(kafka_bootstrap, 2, topic=topic)
        old = await first_log.claim(1)
        try:
            batches = [_records("a", 3), _records("b", 1), _records("c", 5)]
            for batch in batches:
                await old.append(batch)
            new = await second_log.claim(1)
            try:
                read = [record async for chunk in new.read() for record in chunk]
                assert read == [record for batch in batches for record in batch]
                with pytest.raises(LogFencedError):
                    await old.append(_records("zombie", 1))
                await new.append(_records("d", 1))
                again = await second_log.claim(1)
                try:
                    assert [record async for chunk in again.read() for record in chunk][-2:] == _records("d", 1)
                finally:
                    await again.close()
                other = await second_log.claim(0)
                try:
                    assert [record async for chunk in other.read() for record in chunk] == []  # an empty partition ends too
                finally:
                    await other.close()
            finally:
                await new.close()
        finally:
            await old.close()

    run_within(scenario(), GUARD_S * 2)


def test_kafka_log_drops_an_append_its_writer_died_in_the_middle_of(
    kafka_bootstrap: str,
    unique_topic: Callable[[str], str],
) -> None:
    """A writer that sent part of an append and died (its transaction never committed) leaves
    nothing behind once the partition is claimed again: on Apache Kafka read_committed hides the
    aborted records; on the embedded broker, which shows them, the append frame does."""
    from kafka import KafkaProducer

    from pystreams.coordinator import records as r
    from pystreams.coordinator.log import _FRAME, FRAME_HEADER, KafkaLog

    topic = unique_topic("groups-log")
    record_log = KafkaLog(kafka_bootstrap, 1, topic=topic)

    async def scenario() -> None:
        writer = await record_log.claim(0)
        await writer.append(_records("kept", 2))
        await writer.close()
        # A coordinator that dies after sending 2 of the 3 records of an append.
        dying = KafkaProducer(bootstrap_servers=kafka_bootstrap, transactional_id=record_log.transactional_id(0))
        try:
            await asyncio.to_thread(dying.init_transactions)
            dying.begin_transaction()
            append_id = b"x" * 16
            for index, record in enumerate(_records("lost", 2)[:2]):
                key, value = r.encode(record)
                dying.send(topic, key=key, value=value, partition=0, headers=[(FRAME_HEADER, _FRAME.pack(append_id, index, 3))])
            await asyncio.to_thread(dying.flush)
            successor = await record_log.claim(0)  # fences the dying writer, aborts its transaction
            try:
                read = [record async for chunk in successor.read() for record in chunk]
                assert read == _records("kept", 2)
                await successor.append(_records("next", 1))
                read = [record async for chunk in successor.read() for record in chunk]
                assert read == _records("kept", 2) + _records("next", 1)
            finally:
                await successor.close()
        finally:
            await asyncio.to_thread(dying.close, 1)

    run_within(scenario(), GUARD_S * 2)


def test_kafka_log_follower_reads_whole_appends_and_a_claim_resumes_where_it_stopped(
    kafka_bootstrap: str,
    unique_topic: Callable[[str], str],
) -> None:
    """A hot standby's reader: it sees committed appends of a partition it does not own, never
    the unfinished append of a writer that died (shown by the embedded broker once aborted), and
    a later claim reads on from its position: each record exactly once, the dead append never."""
    from kafka import KafkaProducer

    from pystreams.coordinator import records as r
    from pystreams.coordinator.log import _FRAME, FRAME_HEADER, KafkaLog

    topic = unique_topic("groups-log")
    record_log = KafkaLog(kafka_bootstrap, 1, topic=topic)

    async def followed(follower, count: int) -> list:
        seen: list = []
        async with asyncio.timeout(GUARD_S):
            while len(seen) < count:
                seen += await follower.poll()
        return seen

    async def scenario() -> None:
        first = await record_log.claim(0)
        await first.append(_records("a", 3))
        await first.close()
        dying = KafkaProducer(bootstrap_servers=kafka_bootstrap, transactional_id=record_log.transactional_id(0))
        follower = record_log.follow(0)
        try:
            await asyncio.to_thread(dying.init_transactions)
            dying.begin_transaction()
            for index, record in enumerate(_records("lost", 3)[:2]):  # 2 of an append of 3, never committed
                key, value = r.encode(record)
                dying.send(topic, key=key, value=value, partition=0, headers=[(FRAME_HEADER, _FRAME.pack(b"y" * 16, index, 3))])
            await asyncio.to_thread(dying.flush)
            assert await followed(follower, 3) == _records("a", 3)
            second = await record_log.claim(0)  # aborts the dying append: Tansu now shows its 2 records
            try:
                for _ in range(5):
                    assert await follower.poll() == []  # held as unfinished, never replayed
                await second.append(_records("b", 2))
                position = follower.position()
                third = await record_log.claim(0)  # the standby's node takes the shard over
                try:
                    tail = [record async for chunk in third.read(position) for record in chunk]
                    assert tail == _records("b", 2)
                    whole = [record async for chunk in third.read() for record in chunk]
                    assert whole == _records("a", 3) + _records("b", 2)
                finally:
                    await third.close()
            finally:
                await second.close()
        finally:
            await follower.close()
            await asyncio.to_thread(dying.close, 1)

    run_within(scenario(), GUARD_S * 2)


def test_a_poison_record_in_the_log_quarantines_its_group_and_repair_releases_it(
    kafka_bootstrap: str,
    unique_topic: Callable[[str], str],
    processes: Callable[..., CoordinatorProcess],
) -> None:
    """An older version wrote a member record with a null topic name: the coordinator still
    loads and serves the other groups, and ``--repair --skip-unreadable`` releases the group."""
    from kafka import KafkaProducer

    from pystreams.coordinator import records as r
    from pystreams.coordinator.runtime import group_shard
    from pystreams.protocol.client import KafkaProtocolClient

    log_topic = unique_topic("pystreams-groups")
    shards = 2
    sick, healthy = "sick-group", next(f"healthy-{i}" for i in range(100) if group_shard(f"healthy-{i}", shards) == group_shard("sick-group", shards))
    first = processes(*coordinator_args(kafka_bootstrap, log_topic, free_port(), shards))
    address = first.address()
    first.wait_ready()

    def first_heartbeat(group: str) -> m.ConsumerGroupHeartbeatResponse:
        with KafkaProtocolClient(*address) as client:
            return client.send(
                m.ConsumerGroupHeartbeatRequest(
                    group_id=group,
                    member_id="",
                    member_epoch=0,
                    rebalance_timeout_ms=5_000,
                    subscribed_topic_names=["t"],
                    topic_partitions=[],
                )
            )

    assert first_heartbeat(healthy).error_code == 0
    first.kill()
    key, _ = r.encode(r.MemberMetadata(sick, "ghost", None))
    poison = msgspec.msgpack.encode({"group_epoch": 1, "client_id": "c", "client_host": "h", "rebalance_timeout_ms": 1, "subscribed_topic_names": [None]})
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap)
    producer.send(log_topic, key=key, value=poison, partition=group_shard(sick, shards)).get(10)
    producer.close()

    second = processes(*coordinator_args(kafka_bootstrap, log_topic, free_port(), shards))
    address = second.address()
    second.wait_ready()  # every shard loads: the poison does not brick one
    refused = first_heartbeat(sick)
    assert refused.error_code == Errors.CoordinatorNotAvailableError.errno and "cannot be replayed" in refused.error_message
    assert first_heartbeat(healthy).error_code == 0
    assert "quarantined" in second.log_tail(200)

    repair = processes("--bootstrap-servers", kafka_bootstrap, "--log-topic", log_topic, "--shards", str(shards), "--repair")
    repair.wait_for_line(lambda line: "cannot be replayed" in line)
    listed = repair.wait_for_line(lambda line: "sick-group" in line)
    assert "subscribed_topic_names" in listed
    assert repair.process.wait(GUARD_S) == 1
    fix = processes("--bootstrap-servers", kafka_bootstrap, "--log-topic", log_topic, "--shards", str(shards), "--repair", "--skip-unreadable")
    fix.wait_for_line(lambda line: line.startswith("tombstoned 1 key"))
    assert fix.process.wait(GUARD_S) == 0

    second.kill()
    third = processes(*coordinator_args(kafka_bootstrap, log_topic, free_port(), shards))
    address = third.address()
    third.wait_ready()
    assert first_heartbeat(sick).error_code == 0


def test_reloads_after_failed_appends_leave_no_threads_behind(
    kafka_bootstrap: str,
    unique_topic: Callable[[str], str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every failed append reloads the shard from the Kafka log (claim, replay); the writers and
    readers of earlier claims must be released, or a stream of failures would pile up threads."""
    import threading

    from kafka.protocol.api_header import RequestHeader

    from pystreams.coordinator.log import KafkaLog
    from pystreams.coordinator.log_writer import TransactionalWriter, WriterError
    from pystreams.coordinator.runtime import Coordinator, StaticTopics

    failures = {"left": 6}
    original = TransactionalWriter.append

    async def sometimes_failing(self, entries):
        if failures["left"] > 0:
            failures["left"] -= 1
            raise WriterError("the broker refused the batch")
        return await original(self, entries)

    monkeypatch.setattr(TransactionalWriter, "append", sometimes_failing)

    async def scenario() -> tuple[int, int, int, int]:
        coordinator = Coordinator(KafkaLog(kafka_bootstrap, 1, topic=unique_topic("groups-log")), topic_source=StaticTopics({}))
        coordinator.runners[0]._backoff_s = (0.05, 0.2)
        await coordinator.start()
        await coordinator.wait_until_loaded()
        baseline, baseline_tasks = threading.active_count(), len(asyncio.all_tasks())
        heartbeat = m.ConsumerGroupHeartbeatRequest
        request_header = RequestHeader(request_api_key=heartbeat.API_KEY, request_api_version=0, correlation_id=1, client_id="t")
        answers = []
        deadline = time.monotonic() + GUARD_S
        while time.monotonic() < deadline:
            request = heartbeat(
                group_id="reloading", member_id="", member_epoch=0, rebalance_timeout_ms=5_000, subscribed_topic_names=["t"], topic_partitions=[]
            )
            request.API_VERSION = 0
            response = await coordinator.handle(request_header, request)
            answers.append(response.error_code)
            if response.error_code == 0:
                break
            await asyncio.sleep(0.02)
        reloads = coordinator.runners[0].reload_count
        await asyncio.sleep(1.0)  # closers of released writers finish
        after, tasks = threading.active_count(), len(asyncio.all_tasks())
        await coordinator.close()
        return reloads, after - baseline, tasks - baseline_tasks, answers[-1]

    reloads, extra_threads, extra_tasks, last = run_within(scenario(), GUARD_S * 3)
    assert reloads == 6 and last == 0
    assert extra_threads <= 2, f"{extra_threads} threads more after {reloads} reloads"
    # Each claim's writer holds a connection (a reader task): released writers close theirs.
    assert extra_tasks <= 2, f"{extra_tasks} tasks more after {reloads} reloads"
