"""Heartbeats over TCP against a cluster of 1, 2 and 3 coordinator processes (``--cluster`` on the
Kafka log of the embedded broker, 4 shards), and how long a shard move takes.

* **heartbeats** — simulated members (5 per group, one TCP connection each) find their group's
  coordinator with FindCoordinator, join, then heartbeat in a closed loop, as in
  ``benchmarks/coordinator.py``. The load comes from ``--loaders`` processes of their own so that
  one Python load generator does not cap what two coordinators serve. Reported per cluster size:
  heartbeats/s, p50/p99, and the ratio to one node. On a 2-core machine the loaders and the
  nodes share the cores: the ratio says how much a second (or third) process adds *here*, not
  on a fleet.
* **move** — a node stopped with SIGTERM (it releases its shards and leaves the group): seconds
  until FindCoordinator on the survivor names it for every shard; then a node SIGKILLed: seconds
  from the kill until the survivor serves every shard, with the brokers' session timeout
  (``--cluster-session-timeout-ms``) printed beside it.
* **fail-over at scale** — ``--groups`` groups of 5 simulated members each (over TCP, many
  requests in flight on one connection per node), one committed offset per group; the node
  owning the most groups is SIGKILLed. Then: seconds until every one of its groups answers a
  heartbeat of its first member, with the member id and epoch it had, on the survivor; how many
  members were fenced instead (target 0); how many committed offsets were lost (must be 0).

Prints one JSON document.

    python benchmarks/coordinator_cluster.py [--duration S] [--concurrency N] [--loaders P] [--groups G] [--nodes 1,2,3] [--heartbeats-only]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from typing import Any

from coordinator import HEARTBEAT_ERROR_AT, MEMBERS_PER_GROUP, SimulatedMember, closed_loop, cpu_seconds

from pystreams.broker import EmbeddedBroker, free_port
from pystreams.client.driver import KafkaConnection
from pystreams.coordinator.runtime import group_shard
from pystreams.protocol import messages as m

SHARDS = 4
SESSION_TIMEOUT_MS = 4_000


class Node:
    def __init__(self, bootstrap: str, topic: str, node_id: int, *, member_session_ms: int = 60_000) -> None:
        self.node_id, self.port = node_id, free_port()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "pystreams", "coordinator", "--log", "kafka", "--bootstrap-servers", bootstrap, "--log-topic", topic]
            + ["--shards", str(SHARDS), "--cluster", "--node-id", str(node_id), "--listen", f"127.0.0.1:{self.port}"]
            + ["--session-timeout-ms", str(member_session_ms), "--cluster-session-timeout-ms", str(SESSION_TIMEOUT_MS), "--log-level", "WARNING"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def stop(self, signum: int = signal.SIGKILL) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signum)
            self.process.wait(30)


def probe_groups() -> list[str]:
    return [next(f"probe-{i}" for i in range(1000) if group_shard(f"probe-{i}", SHARDS) == shard) for shard in range(SHARDS)]


async def owners(port: int, groups: list[str]) -> list[int]:
    """The node id FindCoordinator on ``port`` names for each group (-1: none now)."""
    try:
        connection = await KafkaConnection.open(("127.0.0.1", port), "bench", 5.0, None)
    except OSError:
        return []
    try:
        found = await connection.send(m.FindCoordinatorRequest(key_type=0, coordinator_keys=groups), 4, 5.0)
    finally:
        connection.close()
    return [c.node_id if c.error_code == 0 else -1 for c in found.coordinators]


async def loading(port: int, groups: list[str]) -> bool:
    """Whether a node still loads one of ``groups``' shards (ConsumerGroupDescribe says so)."""
    connection = await KafkaConnection.open(("127.0.0.1", port), "bench", 5.0, None)
    try:
        described = await connection.send(m.ConsumerGroupDescribeRequest(group_ids=groups), 0, 5.0)
    finally:
        connection.close()
    return any(group.error_code == 14 for group in described.groups)  # COORDINATOR_LOAD_IN_PROGRESS


async def settled(nodes: list[Node], timeout_s: float = 120) -> float:
    """Seconds until every node names an owner among ``nodes`` for every shard, all the same,
    and each owner has loaded its shards."""
    started, groups, ids = time.monotonic(), probe_groups(), {n.node_id for n in nodes}
    while time.monotonic() - started < timeout_s:
        answers = [await owners(node.port, groups) for node in nodes]
        if all(a == answers[0] for a in answers) and len(answers[0]) == SHARDS and set(answers[0]) == ids:
            mine = {node.port: [g for g, owner in zip(groups, answers[0], strict=True) if owner == node.node_id] for node in nodes}
            if not any([await loading(port, owned) for port, owned in mine.items()]):
                return time.monotonic() - started
        await asyncio.sleep(0.05)
    raise RuntimeError(f"the cluster did not settle on nodes {sorted(ids)}")


def load(args: tuple[dict[int, int], int, str, float, multiprocessing.Queue, Any]) -> None:
    """One load generator process: its members, routed to their groups' nodes, in a closed loop.
    Every loader starts its loop at the barrier, so that their rates add up over one window."""
    ports, count, prefix, duration_s, results, barrier = args

    async def run() -> dict:
        members = [SimulatedMember(f"{prefix}-{i // MEMBERS_PER_GROUP}") for i in range(count)]
        any_port = next(iter(ports.values()))
        routes = {}
        for member in members:
            if member.group_id not in routes:
                [owner] = await owners(any_port, [member.group_id])
                routes[member.group_id] = ports[owner]
        await asyncio.gather(*(member.connect(("127.0.0.1", routes[member.group_id])) for member in members))
        for member in members:
            await member.join()
        for member in members:
            await member.settle()
        await asyncio.to_thread(barrier.wait, 300)
        try:
            return await closed_loop(members, [member.heartbeat_frame() for member in members], HEARTBEAT_ERROR_AT, duration_s, 1.0)
        finally:
            for member in members:
                member.close()

    results.put(asyncio.run(run()))


async def bench_heartbeats(bootstrap: str, node_count: int, concurrency: int, loaders: int, duration_s: float) -> dict:
    topic = f"__pystreams_groups_cluster_{uuid.uuid4().hex[:8]}"
    nodes = [Node(bootstrap, topic, node_id) for node_id in range(1, node_count + 1)]
    try:
        await settled(nodes)
        ports = {node.node_id: node.port for node in nodes}
        results: multiprocessing.Queue = multiprocessing.Queue()
        context = multiprocessing.get_context("fork")
        barrier = context.Barrier(loaders + 1)  # the loaders and this process
        processes = [
            context.Process(target=load, args=((ports, concurrency // loaders, f"hb-{node_count}-{i}", duration_s, results, barrier),)) for i in range(loaders)
        ]
        for process in processes:
            process.start()
        await asyncio.to_thread(barrier.wait, 300)
        cpu_before = [cpu_seconds(node.process.pid) for node in nodes]
        started = time.monotonic()
        runs = [await asyncio.to_thread(results.get, timeout=300) for _ in processes]
        elapsed = time.monotonic() - started
        cpu_after = [cpu_seconds(node.process.pid) for node in nodes]
        for process in processes:
            process.join()
        result = {
            "nodes": node_count,
            "concurrency": concurrency,
            "per_second": sum(run["per_second"] for run in runs),
            "p50_ms": round(statistics.median(run["p50_ms"] for run in runs), 3),
            "p99_ms": max(run["p99_ms"] for run in runs),
            "errors": sum(run["errors"] for run in runs),
        }
        if None not in cpu_before and None not in cpu_after:
            # Cores each node kept busy over the loaders' window (warm-up included): a node near
            # 1.0 is saturated; nodes well below it share the machine's cores with the load.
            result["node_cpu_cores"] = [round((after - before) / elapsed, 2) for before, after in zip(cpu_before, cpu_after)]  # type: ignore[operator]
        return result
    finally:
        for node in nodes:
            node.stop()


async def stable(nodes: list[Node]) -> None:
    """Settled, and still settled after a quiet spell longer than a rebalance round, so that a
    move measured next does not also wait out a round still under way (a joining node gets its
    shards in a second round; the embedded broker holds each JoinGroup 2 s)."""
    await settled(nodes)
    await asyncio.sleep(3.0)
    await settled(nodes)


async def bench_moves(bootstrap: str) -> dict:
    topic = f"__pystreams_groups_cluster_{uuid.uuid4().hex[:8]}"
    nodes = [Node(bootstrap, topic, 1), Node(bootstrap, topic, 2)]
    try:
        await stable(nodes)
        nodes[0].stop(signal.SIGTERM)
        graceful = await settled(nodes[1:])
        nodes[0] = Node(bootstrap, topic, 1)
        spread_again = await settled(nodes)
        await stable(nodes)
        nodes[1].stop(signal.SIGKILL)
        killed = await settled(nodes[:1])
        return {
            "graceful_stop_to_survivor_serving_every_shard_s": round(graceful, 2),
            "restarted_node_to_shards_spread_again_s": round(spread_again, 2),
            "sigkill_to_survivor_serving_every_shard_s": round(killed, 2),
            "cluster_session_timeout_ms": SESSION_TIMEOUT_MS,
        }
    finally:
        for node in nodes:
            node.stop()


HB = m.ConsumerGroupHeartbeatRequest
FENCING = {25, 110}  # UNKNOWN_MEMBER_ID, FENCED_MEMBER_EPOCH


async def bench_failover(bootstrap: str, group_count: int) -> dict:
    from pystreams.cluster import ClusterMetadata, TopicSpec

    with ClusterMetadata(bootstrap) as cluster:  # a topic the coordinators know: joins wait for no metadata
        cluster.ensure_topics([TopicSpec("t", 1)])
    topic = f"__pystreams_groups_cluster_{uuid.uuid4().hex[:8]}"
    # The simulated members heartbeat only when measured: their sessions must outlast the set-up
    # (a member whose session expired would be counted as fenced).
    nodes = [Node(bootstrap, topic, node_id, member_session_ms=900_000) for node_id in (1, 2)]
    connections: dict[int, KafkaConnection] = {}
    try:
        await settled(nodes)
        for node in nodes:
            connections[node.node_id] = await KafkaConnection.open(("127.0.0.1", node.port), "bench", 30.0, None)
        groups = [f"failover-{i}" for i in range(group_count)]
        found = await connections[1].send(m.FindCoordinatorRequest(key_type=0, coordinator_keys=groups), 4, 30.0)
        owner = {c.key: c.node_id for c in found.coordinators}
        members: dict[str, list[tuple[str, int]]] = {}
        gate = asyncio.Semaphore(200)

        async def join_group(group: str) -> None:
            async with gate:
                connection, joined = connections[owner[group]], []
                for _ in range(MEMBERS_PER_GROUP):
                    request = HB(group_id=group, member_id="", member_epoch=0, rebalance_timeout_ms=30_000, subscribed_topic_names=["t"], topic_partitions=[])
                    response = await connection.send(request, 0, 30.0)
                    assert response.error_code == 0, response
                    joined.append((response.member_id, response.member_epoch))
                # One more heartbeat each: the epoch each member holds now.
                for index, (member_id, epoch) in enumerate(joined):
                    response = await connection.send(HB(group_id=group, member_id=member_id, member_epoch=epoch, topic_partitions=[]), 0, 30.0)
                    assert response.error_code == 0, response
                    joined[index] = (member_id, response.member_epoch)
                member_id, epoch = joined[0]
                commit = m.OffsetCommitRequest(
                    group_id=group,
                    generation_id_or_member_epoch=epoch,
                    member_id=member_id,
                    topics=[
                        m.OffsetCommitRequest.OffsetCommitRequestTopic(
                            name="t",
                            partitions=[
                                m.OffsetCommitRequest.OffsetCommitRequestTopic.OffsetCommitRequestPartition(
                                    partition_index=0, committed_offset=1000 + len(group), committed_leader_epoch=-1, committed_metadata=""
                                )
                            ],
                        )
                    ],
                )
                committed = await connection.send(commit, 9, 30.0)
                assert committed.topics[0].partitions[0].error_code == 0, committed
                members[group] = joined

        started = time.monotonic()
        await asyncio.gather(*(join_group(group) for group in groups))
        setup_s = time.monotonic() - started
        counts = {node.node_id: sum(1 for g in groups if owner[g] == node.node_id) for node in nodes}
        victim = max(counts, key=lambda node_id: counts[node_id])
        survivor = next(node for node in nodes if node.node_id != victim)
        moved = [g for g in groups if owner[g] == victim]
        connections.pop(victim).close()
        killed_at = time.monotonic()
        next(node for node in nodes if node.node_id == victim).stop(signal.SIGKILL)
        pending, fenced, served_at = set(moved), 0, {}
        connection = connections[survivor.node_id]
        while pending and time.monotonic() - killed_at < 120:
            batch = sorted(pending)
            found = await connection.send(m.FindCoordinatorRequest(key_type=0, coordinator_keys=batch), 4, 30.0)
            here = [c.key for c in found.coordinators if c.error_code == 0 and c.node_id == survivor.node_id]

            async def beat(group: str) -> None:
                nonlocal fenced
                member_id, epoch = members[group][0]
                async with gate:
                    response = await connection.send(HB(group_id=group, member_id=member_id, member_epoch=epoch, topic_partitions=[]), 0, 30.0)
                if response.error_code == 0 or response.error_code in FENCING:
                    fenced += response.error_code in FENCING
                    served_at[group] = time.monotonic() - killed_at
                    pending.discard(group)

            await asyncio.gather(*(beat(group) for group in here))
            if pending:
                await asyncio.sleep(0.05)
        fetch = m.OffsetFetchRequest(
            groups=[
                m.OffsetFetchRequest.OffsetFetchRequestGroup(
                    group_id=g, topics=[m.OffsetFetchRequest.OffsetFetchRequestGroup.OffsetFetchRequestTopics(name="t", partition_indexes=[0])]
                )
                for g in moved
            ],
            require_stable=False,
        )
        fetched = await connection.send(fetch, 8, 30.0)
        lost = sum(1 for g in fetched.groups if g.topics[0].partitions[0].committed_offset != 1000 + len(g.group_id))
        return {
            "groups": group_count,
            "members": group_count * MEMBERS_PER_GROUP,
            "setup_s": round(setup_s, 1),
            "groups_on_killed_node": len(moved),
            "kill_to_every_group_served_s": round(max(served_at.values(), default=float("nan")), 2),
            "kill_to_first_group_served_s": round(min(served_at.values(), default=float("nan")), 2),
            "cluster_session_timeout_ms": SESSION_TIMEOUT_MS,
            "groups_not_served_within_120_s": len(pending),
            "members_fenced": fenced,
            "offsets_lost": lost,
        }
    finally:
        for connection in connections.values():
            connection.close()
        for node in nodes:
            node.stop()


async def main_async(args: argparse.Namespace) -> dict:
    broker = EmbeddedBroker().start()
    try:
        runs = [await bench_heartbeats(broker.bootstrap_servers, n, args.concurrency, args.loaders, args.duration) for n in args.nodes]
        result: dict = {"benchmark": "coordinator_cluster", "cpus": os.cpu_count(), "shards": SHARDS, "heartbeats": runs}
        one = next((run["per_second"] for run in runs if run["nodes"] == 1), None)
        for run in runs:
            if one and run["nodes"] > 1:
                result[f"ratio_{run['nodes']}_nodes_over_1"] = round(run["per_second"] / one, 2)
        if not args.heartbeats_only:
            result["moves"] = await bench_moves(broker.bootstrap_servers)
            result["failover"] = await bench_failover(broker.bootstrap_servers, args.groups)
        return result
    finally:
        broker.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=5.0, help="seconds measured per closed-loop run")
    parser.add_argument("--concurrency", type=int, default=200, help="simulated members in all (5 per group)")
    parser.add_argument("--loaders", type=int, default=2, help="load generator processes")
    parser.add_argument("--groups", type=int, default=1000, help="groups in the fail-over run (5 members each)")
    parser.add_argument(
        "--nodes", type=lambda text: [int(n) for n in text.split(",")], default=[1, 2, 3], help="cluster sizes to time heartbeats on (default 1,2,3)"
    )
    parser.add_argument("--heartbeats-only", action="store_true", help="skip the shard moves and the fail-over")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(main_async(args)), indent=2))


if __name__ == "__main__":
    main()
