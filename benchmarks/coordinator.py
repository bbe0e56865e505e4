"""Coordinator benchmark: heartbeats and offset commits over TCP, and loading a big log.

* **heartbeats** — ``pystreams coordinator --log memory`` in its own process; N simulated
  members (one TCP connection each, 5 per group) join, then heartbeat in a closed loop (each
  member sends its next heartbeat as soon as the last is answered). Steady-state heartbeats
  change nothing, so they generate no records. Reported for 1 and 4 shards and a few
  concurrency levels: heartbeats/s and p50/p99 latency; ``best`` is the highest sustained rate.
* **security** — the same heartbeat loop (4 shards) on a TLS listener and on SASL_SSL
  (SCRAM-SHA-512; each connection authenticates once, then heartbeats), next to plaintext:
  what encryption costs per heartbeat.
* **offset commits** — the same closed loop with OffsetCommit (member epoch fenced), which
  *does* append a record each: memory log vs the Kafka log on the embedded broker (one
  transaction per batch of requests — group commit), 4 shards. Over TCP the Python load
  generator saturates a core first, so the same commits are also sent in process
  (``Coordinator.handle``, no sockets): what the shards and the log writer sustain.
* **load** — a log of 10,000 groups (2 members each, converged, 2 committed offsets) replayed
  by a coordinator with 1 and 4 shards, from the memory log and from the Kafka log.

The load generator pre-encodes its requests and reads only the error code of each answer, so
the coordinator, not the generator, is what is measured; each TCP run also reports the
coordinator process's CPU per request answered (``coordinator_cpu_us_per_request``, from
``/proc``), the figure that bounds one process once it saturates a core. Prints one JSON document.

    python benchmarks/coordinator.py [--duration S] [--groups N] [--skip-kafka]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import struct
import subprocess
import sys
import time
import uuid

from pystreams.assignors.api import TopicMetadata

from pystreams.coordinator import records as r
from pystreams.coordinator.config import CoordinatorConfig
from pystreams.coordinator.runtime import Coordinator, StaticTopics, group_shard
from pystreams.coordinator.shard import GroupCoordinatorShard
from pystreams.protocol import messages as m

MEMBERS_PER_GROUP = 5
CONCURRENCY = (64, 256)
HB = m.ConsumerGroupHeartbeatRequest
CONFIG = CoordinatorConfig(session_timeout_ms=60_000, heartbeat_interval_ms=5_000)


# --- coordinator processes ---------------------------------------------------------------------


class CoordinatorProcess:
    def __init__(self, *args: str) -> None:
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pystreams.commands.coordinator",
                "--listen",
                "127.0.0.1:0",
                "--session-timeout-ms",
                "60000",
                "--log-level",
                "WARNING",
                *args,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.address: tuple[str, int] | None = None
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.startswith("coordinator: "):
                host, _, port = line.split(": ", 1)[1].strip().rpartition(":")
                self.address = (host, int(port))
            if line.startswith("coordinator ready"):
                return
        raise RuntimeError("the coordinator did not start")

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


# --- the load generator ------------------------------------------------------------------------


def frame(request, version: int, correlation_id: int = 1) -> bytes:
    request.API_VERSION = version
    request.with_header(correlation_id=correlation_id, client_id="bench")
    return bytes(request.encode(header=True, framed=True))


async def roundtrip(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, data: bytes) -> bytes:
    writer.write(data)
    size = struct.unpack(">i", await reader.readexactly(4))[0]
    return await reader.readexactly(size)


def decode(response_class, body: bytes, version: int):
    # Response header v1 for flexible versions: correlation id + empty tagged fields.
    return response_class.decode(body[5:], version=version)


class SimulatedMember:
    def __init__(self, group_id: str, security=None) -> None:
        self.group_id = group_id
        self.member_id = ""
        self.epoch = 0
        self.security = security

    async def connect(self, address: tuple[str, int]) -> None:
        from pystreams.client.driver import KafkaConnection

        if self.security is None:
            self.reader, self.writer = await asyncio.open_connection(*address)
            return
        # Authenticate through the real client handshake, then speak raw frames on its streams.
        connection = await KafkaConnection.open(address, "bench", 10, self.security)
        connection._reader_task.cancel()
        self.reader, self.writer = connection._reader, connection._writer

    async def join(self) -> None:
        request = HB(
            group_id=self.group_id, member_id="", member_epoch=0, rebalance_timeout_ms=30_000, subscribed_topic_names=["bench-topic"], topic_partitions=[]
        )
        response = decode(m.ConsumerGroupHeartbeatResponse, await roundtrip(self.reader, self.writer, frame(request, 0)), 0)
        assert response.error_code == 0, response
        self.member_id, self.epoch = response.member_id, response.member_epoch

    async def settle(self) -> None:
        """Heartbeat until the epoch stops moving (everyone in the group has joined)."""
        while True:
            request = HB(group_id=self.group_id, member_id=self.member_id, member_epoch=self.epoch, rebalance_timeout_ms=-1, topic_partitions=[])
            response = decode(m.ConsumerGroupHeartbeatResponse, await roundtrip(self.reader, self.writer, frame(request, 0)), 0)
            assert response.error_code == 0, response
            if response.member_epoch == self.epoch:
                return
            self.epoch = response.member_epoch

    def heartbeat_frame(self) -> bytes:
        return frame(HB(group_id=self.group_id, member_id=self.member_id, member_epoch=self.epoch, rebalance_timeout_ms=-1), 0)

    def commit_frame(self) -> bytes:
        Commit = m.OffsetCommitRequest
        return frame(
            Commit(
                group_id=self.group_id,
                generation_id_or_member_epoch=self.epoch,
                member_id=self.member_id,
                topics=[
                    Commit.OffsetCommitRequestTopic(
                        name="bench-topic",
                        partitions=[
                            Commit.OffsetCommitRequestTopic.OffsetCommitRequestPartition(
                                partition_index=0, committed_offset=12345, committed_leader_epoch=-1, committed_metadata=""
                            )
                        ],
                    )
                ],
            ),
            9,
        )

    def close(self) -> None:
        self.writer.close()


class _ClosedLoop(asyncio.Protocol):
    """One member's closed loop on its connection: the answer is read and the next request
    written from ``data_received``, with no task, stream or await in between. On a machine the
    coordinators share with the load, each microsecond the generator spends per request is one
    the coordinators under test do not get."""

    def __init__(self, data: bytes, error_offset: int, window: tuple[float, float], stats: dict, done: asyncio.Future) -> None:
        self.data, self.error_offset, self.window, self.stats, self.done = data, error_offset, window, stats, done
        self.buffer = bytearray()
        self.sent = 0.0
        self.transport: asyncio.Transport | None = None

    def start(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self._send()

    def _send(self) -> None:
        assert self.transport is not None
        self.sent = time.perf_counter()
        if self.sent >= self.window[1]:
            if not self.done.done():
                self.done.set_result(None)
            return
        self.transport.write(self.data)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if len(self.buffer) < 4:
            return
        size = int.from_bytes(self.buffer[:4], "big")
        if len(self.buffer) < 4 + size:
            return
        body = bytes(self.buffer[4 : 4 + size])
        del self.buffer[: 4 + size]
        answered = time.perf_counter()
        self.stats["answered"] += 1
        if self.sent >= self.window[0]:
            self.stats["latencies"].append(answered - self.sent)
            if struct.unpack_from(">h", body, self.error_offset)[0] != 0:
                self.stats["errors"] += 1
        self._send()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_exception(ConnectionError(f"the coordinator closed a connection mid-loop: {exc!r}"))


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU a process has used (Linux ``/proc``; None elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def closed_loop(
    members: list[SimulatedMember], frames: list[bytes], error_offset: int, duration_s: float, warmup_s: float, coordinator_pid: int | None = None
) -> dict:
    """Each member sends its frame again as soon as it is answered (the members' connections
    are taken over for it: close them afterwards). With ``coordinator_pid``, also the
    coordinator's CPU per request (µs): what bounds it once it saturates a core."""
    loop = asyncio.get_running_loop()
    stats: dict = {"latencies": [], "errors": 0, "answered": 0}
    cpu_before = None if coordinator_pid is None else cpu_seconds(coordinator_pid)
    start = time.perf_counter()
    window = (start + warmup_s, start + warmup_s + duration_s)
    finished = []
    for member, data in zip(members, frames):
        done = loop.create_future()
        protocol = _ClosedLoop(data, error_offset, window, stats, done)
        transport = member.writer.transport
        transport.set_protocol(protocol)
        protocol.start(transport)  # type: ignore[arg-type]
        finished.append(done)
    await asyncio.gather(*finished)
    cpu_after = None if coordinator_pid is None else cpu_seconds(coordinator_pid)
    latencies = sorted(stats["latencies"])
    result = {
        "concurrency": len(members),
        "per_second": round(len(latencies) / duration_s),
        "p50_ms": round(statistics.median(latencies) * 1000, 3),
        "p99_ms": round(latencies[int(len(latencies) * 0.99) - 1] * 1000, 3),
        "errors": stats["errors"],
    }
    if cpu_before is not None and cpu_after is not None and stats["answered"]:
        result["coordinator_cpu_us_per_request"] = round((cpu_after - cpu_before) / stats["answered"] * 1e6, 1)
    return result


async def prepared_members(address: tuple[str, int], count: int, prefix: str, security=None) -> list[SimulatedMember]:
    members = [SimulatedMember(f"{prefix}-{i // MEMBERS_PER_GROUP}", security) for i in range(count)]
    await asyncio.gather(*(member.connect(address) for member in members))
    # Together: a join naming a topic the coordinator has not seen waits for a metadata refresh
    # (250 ms), so 256 joins one by one would outlast the first members' sessions. Each join
    # bumps its group's epoch; settle() then heartbeats each member to the final one.
    await asyncio.gather(*(member.join() for member in members))
    for member in members:
        await member.settle()
    return members


# Offsets of the ErrorCode in the response body (after the response header).
HEARTBEAT_ERROR_AT = 5 + 4  # header v1 (correlation id, tags) + ThrottleTimeMs
COMMIT_ERROR_AT = 5 + 4 + 1 + 1 + len("bench-topic") + 1 + 4  # header, throttle, topics, name, partitions, index


async def bench_heartbeats(shards: int, duration_s: float, listener_args: tuple[str, ...] = (), security=None) -> dict:
    coordinator = CoordinatorProcess("--log", "memory", "--shards", str(shards), *listener_args)
    try:
        runs = []
        for concurrency in CONCURRENCY:
            members = await prepared_members(coordinator.address, concurrency, f"hb-{concurrency}", security)
            try:
                frames = [member.heartbeat_frame() for member in members]
                runs.append(await closed_loop(members, frames, HEARTBEAT_ERROR_AT, duration_s, 0.5, coordinator.process.pid))
            finally:
                for member in members:
                    member.close()
        best = max(runs, key=lambda run: run["per_second"])
        return {"shards": shards, "runs": runs, "best_per_second": best["per_second"], "best_p50_ms": best["p50_ms"], "best_p99_ms": best["p99_ms"]}
    finally:
        coordinator.stop()


async def bench_commits(log_args: list[str], duration_s: float) -> dict:
    coordinator = CoordinatorProcess(*log_args, "--shards", "4")
    try:
        members = await prepared_members(coordinator.address, CONCURRENCY[0], "commit")
        try:
            return await closed_loop(members, [member.commit_frame() for member in members], COMMIT_ERROR_AT, duration_s, 0.5, coordinator.process.pid)
        finally:
            for member in members:
                member.close()
    finally:
        coordinator.stop()


async def bench_commits_in_process(record_log, committers: int, commits: int) -> dict:
    """OffsetCommit handled by a Coordinator in this process (``Coordinator.handle``, no TCP):
    what the shards and the log sustain once the load generator is not the limit (over TCP
    one Python generator process saturates a core at about 3k commits/s)."""
    from kafka.protocol.api_header import RequestHeader

    # The topic exists: a join that names an unknown topic waits for a metadata refresh.
    topics = {"bench-topic": TopicMetadata(uuid.UUID(int=1), "bench-topic", 8)}
    coordinator = Coordinator(record_log, config=CONFIG, topic_source=StaticTopics(topics))
    await coordinator.start()
    try:
        await coordinator.wait_until_loaded()
        join_header = RequestHeader(request_api_key=HB.API_KEY, request_api_version=0, correlation_id=1, client_id="bench")
        Commit = m.OffsetCommitRequest
        Topic = Commit.OffsetCommitRequestTopic
        commit_header = RequestHeader(request_api_key=Commit.API_KEY, request_api_version=9, correlation_id=1, client_id="bench")
        members = []
        for index in range(committers):
            join = HB(
                group_id=f"commit-{index // MEMBERS_PER_GROUP}",
                member_id="",
                member_epoch=0,
                rebalance_timeout_ms=30_000,
                subscribed_topic_names=["bench-topic"],
                topic_partitions=[],
            )
            join.API_VERSION = 0
            joined = await coordinator.handle(join_header, join)
            assert joined.error_code == 0, joined
            members.append((join.group_id, joined.member_id, joined.member_epoch))
        for index, (group_id, member_id, epoch) in enumerate(members):
            while True:  # heartbeat until the epoch stops moving (everyone in the group has joined)
                beat = HB(group_id=group_id, member_id=member_id, member_epoch=epoch, rebalance_timeout_ms=-1, topic_partitions=[])
                beat.API_VERSION = 0
                answer = await coordinator.handle(join_header, beat)
                assert answer.error_code == 0, answer
                if answer.member_epoch == epoch:
                    break
                epoch = answer.member_epoch
            members[index] = (group_id, member_id, epoch)
        latencies: list[float] = []
        errors = 0

        async def commit_in_a_loop(group_id: str, member_id: str, epoch: int, count: int) -> None:
            nonlocal errors
            for offset in range(count):
                request = Commit(
                    group_id=group_id,
                    generation_id_or_member_epoch=epoch,
                    member_id=member_id,
                    topics=[Topic(name="bench-topic", partitions=[Topic.OffsetCommitRequestPartition(partition_index=0, committed_offset=offset)])],
                )
                request.API_VERSION = 9
                started = time.perf_counter()
                response = await coordinator.handle(commit_header, request)
                latencies.append(time.perf_counter() - started)
                errors += response.topics[0].partitions[0].error_code != 0

        started = time.perf_counter()
        await asyncio.gather(*(commit_in_a_loop(*member, commits // committers) for member in members))
        elapsed = time.perf_counter() - started
    finally:
        await coordinator.close()
    latencies.sort()
    return {
        "committers": committers,
        "per_second": round(len(latencies) / elapsed),
        "p50_ms": round(latencies[len(latencies) // 2] * 1000, 3),
        "p99_ms": round(latencies[int(len(latencies) * 0.99)] * 1000, 3),
        "errors": errors,
    }


async def bench_security(duration_s: float) -> dict:
    """Plaintext, TLS and SASL_SSL listeners under the same heartbeat loop (4 shards)."""
    import tempfile

    import trustme

    from pystreams.protocol.sasl import CredentialStore
    from pystreams.protocol.security import ClientSecurity

    with tempfile.TemporaryDirectory() as directory:
        ca = trustme.CA()
        ca.cert_pem.write_to_path(f"{directory}/ca.pem")
        ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(f"{directory}/server.pem")
        with open(f"{directory}/credentials.json", "w") as file:
            file.write(CredentialStore().with_user("bench", "bench-secret").dumps())
        tls = ("--ssl-certfile", f"{directory}/server.pem")
        return {
            "PLAINTEXT": await bench_heartbeats(4, duration_s),
            "SSL": await bench_heartbeats(4, duration_s, ("--listen", "SSL://127.0.0.1:0", *tls), ClientSecurity("SSL", ssl_cafile=f"{directory}/ca.pem")),
            "SASL_SSL": await bench_heartbeats(
                4,
                duration_s,
                ("--listen", "SASL_SSL://127.0.0.1:0", *tls, "--sasl-credentials-file", f"{directory}/credentials.json"),
                ClientSecurity(
                    "SASL_SSL",
                    ssl_cafile=f"{directory}/ca.pem",
                    sasl_mechanism="SCRAM-SHA-512",
                    sasl_plain_username="bench",
                    sasl_plain_password="bench-secret",
                ),
            ),
        }


# --- loading -----------------------------------------------------------------------------------


def generate_group_records(groups: int) -> list[r.Record]:
    """Records of ``groups`` converged groups: 2 members, a target, 2 committed offsets each."""
    topic = TopicMetadata(uuid.UUID(int=7), "orders", 8)
    shard = GroupCoordinatorShard(CONFIG)
    shard.update_topics({"orders": topic}, 0)
    out: list[r.Record] = []
    Commit = m.OffsetCommitRequest
    for g in range(groups):
        group_id = f"load-{g}"
        members = []
        for _ in range(2):
            result = shard.handle(
                HB(group_id=group_id, member_id="", member_epoch=0, rebalance_timeout_ms=30_000, subscribed_topic_names=["orders"], topic_partitions=[]), 0
            )
            out += result.records
            members.append(result.response)
        for response in members:  # converge: report what was handed out
            result = shard.handle(
                HB(
                    group_id=group_id,
                    member_id=response.member_id,
                    member_epoch=response.member_epoch,
                    rebalance_timeout_ms=-1,
                    topic_partitions=response.assignment.assigned_topic_partitions if response.assignment else [],
                ),
                0,
            )
            out += result.records
        first = shard.groups[group_id].members[members[0].member_id]
        result = shard.handle(
            Commit(
                group_id=group_id,
                generation_id_or_member_epoch=first.member_epoch,
                member_id=first.member_id,
                topics=[
                    Commit.OffsetCommitRequestTopic(
                        name="orders",
                        partitions=[
                            Commit.OffsetCommitRequestTopic.OffsetCommitRequestPartition(
                                partition_index=p, committed_offset=1000 + p, committed_leader_epoch=-1, committed_metadata=""
                            )
                            for p in (0, 1)
                        ],
                    )
                ],
            ),
            0,
        )
        out += result.records
    return out


async def fill(record_log, records: list[r.Record], shards: int, chunk: int = 2000) -> None:
    by_shard: dict[int, list[r.Record]] = {}
    for record in records:
        by_shard.setdefault(group_shard(record.group_id, shards), []).append(record)
    for shard_id, shard_records in by_shard.items():
        handle = await record_log.claim(shard_id)
        try:
            for start in range(0, len(shard_records), chunk):
                await handle.append(shard_records[start : start + chunk])
        finally:
            await handle.close()


async def time_load(record_log, groups: int) -> dict:
    topics = StaticTopics({"orders": TopicMetadata(uuid.UUID(int=7), "orders", 8)})
    coordinator = Coordinator(record_log, config=CONFIG, topic_source=topics)
    started = time.perf_counter()
    await coordinator.start()
    await coordinator.wait_until_loaded()
    seconds = time.perf_counter() - started
    loaded = sum(len(runner.shard.groups) for runner in coordinator.runners)
    await coordinator.close()
    assert loaded == groups, (loaded, groups)
    loads = coordinator.metrics.load_times
    return {
        "seconds": round(seconds, 3),
        "groups": loaded,
        "partition_load_time_max_ms": round(loads.max_ms, 1),
        "partition_load_time_avg_ms": round(loads.avg_ms, 1),
    }


async def bench_load(groups: int, bootstrap: str | None) -> dict:
    from pystreams.coordinator.log import KafkaLog, MemoryLog

    started = time.perf_counter()
    records = generate_group_records(groups)
    result: dict = {"groups": groups, "records": len(records), "generate_seconds": round(time.perf_counter() - started, 2)}
    for shards in (1, 4):
        memory = MemoryLog(shards)
        await fill(memory, records, shards)
        result[f"memory_{shards}_shards"] = await time_load(memory, groups)
    if bootstrap:
        topic = f"__pystreams_groups_bench_{uuid.uuid4().hex[:8]}"
        writer = KafkaLog(bootstrap, 4, topic=topic)
        started = time.perf_counter()
        await fill(writer, records, 4)
        result["kafka_write_seconds"] = round(time.perf_counter() - started, 2)
        result["kafka_4_shards"] = await time_load(KafkaLog(bootstrap, 4, topic=topic), groups)
    return result


# --- main --------------------------------------------------------------------------------------


async def main_async(args: argparse.Namespace) -> dict:
    from pystreams.broker import EmbeddedBroker

    results: dict = {
        "benchmark": "coordinator",
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "members_per_group": MEMBERS_PER_GROUP,
        "duration_s": args.duration,
        "note": "closed loop over TCP on loopback; load generator and coordinator share the machine",
    }
    results["heartbeats"] = {f"{shards}_shards": await bench_heartbeats(shards, args.duration) for shards in (1, 4)}
    results["heartbeats_4_shards_by_listener"] = await bench_security(args.duration)
    broker = None if args.skip_kafka else EmbeddedBroker().start()
    try:
        commits = {"memory_log": await bench_commits(["--log", "memory"], args.duration)}
        if broker is not None:
            commits["kafka_log"] = await bench_commits(
                ["--log", "kafka", "--bootstrap-servers", broker.bootstrap_servers, "--log-topic", f"__pystreams_groups_bench_{uuid.uuid4().hex[:8]}"],
                args.duration,
            )
        results["offset_commits_4_shards"] = commits
        from pystreams.coordinator.log import KafkaLog, MemoryLog

        in_process: dict = {}
        for committers in CONCURRENCY:
            in_process[f"memory_log_{committers}"] = await bench_commits_in_process(MemoryLog(4), committers, 40_000)
            if broker is not None:
                topic = f"__pystreams_groups_bench_{uuid.uuid4().hex[:8]}"
                in_process[f"kafka_log_{committers}"] = await bench_commits_in_process(KafkaLog(broker.bootstrap_servers, 4, topic=topic), committers, 40_000)
        results["offset_commits_4_shards_in_process"] = in_process
        results["load"] = await bench_load(args.groups, broker.bootstrap_servers if broker else None)
    finally:
        if broker is not None:
            broker.stop()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=4.0, help="seconds measured per closed-loop run")
    parser.add_argument("--groups", type=int, default=10_000, help="groups in the log for the load benchmark")
    parser.add_argument("--skip-kafka", action="store_true", help="memory log only (no embedded broker)")
    args = parser.parse_args()
    started = time.perf_counter()
    results = asyncio.run(main_async(args))
    results["total_seconds"] = round(time.perf_counter() - started, 1)
    json.dump(results, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
