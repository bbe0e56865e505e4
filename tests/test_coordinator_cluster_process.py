"""A cluster of coordinator processes (``pystreams coordinator --cluster``) under a word-count
fleet, on the embedded broker: the shards spread over the nodes through the brokers' group
membership, every node names the same owner, and the count stays exact while the node owning
the app's group stops gracefully, comes back, and another one is SIGKILLed — no worker is
fenced, none restarts, nothing is counted twice. With two nodes the input comes in quarters
checked between the moves; with three (as ``deploy/``'s prod overlay runs) it never stops
flowing while they happen."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from worker_support import Workers, counts_until, fleet_of, listening, wait_for

from pystreams.broker import EmbeddedBroker, free_port
from pystreams.client.driver import KafkaConnection
from pystreams.commands.dev import LatestValueReader, count_words, ensure_input_topics, produce_lines
from pystreams.coordinator.runtime import group_shard
from pystreams.protocol import messages as m

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "examples" / "wordcount.py"
CORPUS = (ROOT / "examples" / "data" / "corpus.txt").read_text(encoding="utf-8").splitlines()
GROUP = "wordcount"
SHARDS = 4
NODE_ARGS = ("--heartbeat-interval-ms", "300", "--session-timeout-ms", "6000", "--metadata-refresh-ms", "500", "--cluster-session-timeout-ms", "4000")


class CoordinatorCluster:
    def __init__(self, bootstrap: str, tmp_path: Path, nodes: int = 2) -> None:
        self.bootstrap, self.tmp_path = bootstrap, tmp_path
        self.ports = {node: free_port() for node in range(1, nodes + 1)}
        self.processes: dict[int, subprocess.Popen[bytes]] = {}

    def start(self, node: int) -> None:
        with (self.tmp_path / f"coordinator-{node}.log").open("ab") as log:
            self.processes[node] = subprocess.Popen(
                [sys.executable, "-m", "pystreams", "coordinator", "--log", "kafka", "--bootstrap-servers", self.bootstrap]
                + ["--shards", str(SHARDS), "--cluster", "--node-id", str(node), "--listen", f"127.0.0.1:{self.ports[node]}", *NODE_ARGS],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        wait_for(lambda: listening(self.ports[node]), 20, f"coordinator {node} to listen")

    @property
    def addresses(self) -> str:
        return ",".join(f"127.0.0.1:{port}" for port in self.ports.values())

    def owners(self, node: int) -> tuple[list[int], list[int]]:
        """What ``node`` answers: the node id owning each shard (-1: none now) and the nodes Metadata lists."""
        groups = [next(f"g{i}" for i in range(1000) if group_shard(f"g{i}", SHARDS) == shard) for shard in range(SHARDS)]

        async def ask() -> tuple[list[int], list[int]]:
            connection = await KafkaConnection.open(("127.0.0.1", self.ports[node]), "test", 5.0, None)
            try:
                found = await connection.send(m.FindCoordinatorRequest(key_type=0, coordinator_keys=groups), 4, 5.0)
                metadata = await connection.send(m.MetadataRequest(topics=[]), 12, 5.0)
            finally:
                connection.close()
            return [c.node_id if c.error_code == 0 else -1 for c in found.coordinators], sorted(b.node_id for b in metadata.brokers)

        try:
            return asyncio.run(ask())
        except (OSError, TimeoutError):
            return [], []

    def settled(self, nodes: list[int]) -> bool:
        """Every shard has an owner among ``nodes``, each of them owns some, and all agree."""
        answers = [self.owners(node) for node in nodes]
        first = answers[0][0]
        return all(a == answers[0] for a in answers) and len(first) == SHARDS and set(first) == set(nodes) and answers[0][1] == nodes

    def wait_ready(self) -> None:
        for node in self.ports:
            # A node says it is ready once the group gave it shards and it loaded them.
            wait_for(lambda node=node: "coordinator ready" in self.log(node), 60, f"coordinator {node} to be ready")
            log = self.log(node)
            assert log.index("shard map") < log.index("coordinator ready") and "loaded" in log[: log.index("coordinator ready")]
        wait_for(lambda: self.settled(sorted(self.ports)), 60, "the coordinators to share the shards")

    def owner_of_group(self, node: int) -> int:
        return self.owners(node)[0][group_shard(GROUP, SHARDS)]

    def log(self, node: int) -> str:
        return (self.tmp_path / f"coordinator-{node}.log").read_text(errors="replace")

    def stop(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
                process.wait()


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[str, CoordinatorCluster, Workers]]:
    broker = EmbeddedBroker(port=None)
    broker.start()
    cluster = CoordinatorCluster(broker.bootstrap_servers, tmp_path)
    try:
        ensure_input_topics(broker.bootstrap_servers, ["text-lines"], partitions=4)
        cluster.start(1)
        cluster.start(2)
        yield from ((broker.bootstrap_servers, cluster, w) for w in fleet_of(Workers(broker.bootstrap_servers, cluster.addresses, tmp_path, APP)))
    finally:
        cluster.stop()
        broker.stop()


def tool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pystreams", *args], capture_output=True, text=True, timeout=60)


def test_a_word_count_stays_exact_while_its_coordinator_node_stops_returns_and_the_other_is_killed(
    fleet: tuple[str, CoordinatorCluster, Workers],
) -> None:
    bootstrap, cluster, workers = fleet
    cluster.wait_ready()
    quarters = [CORPUS[i * len(CORPUS) // 4 : (i + 1) * len(CORPUS) // 4] for i in range(4)]
    workers.start()
    workers.start()
    reader = LatestValueReader(bootstrap, "word-counts")

    def feed_and_check(upto: int, what: str) -> None:
        produce_lines(bootstrap, "text-lines", quarters[upto])
        expected = dict(count_words([line for quarter in quarters[: upto + 1] for line in quarter]))
        counts = counts_until(reader, lambda c: c == expected, 60)
        assert counts == expected, f"{what}: " + str({w: (counts.get(w), n) for w, n in expected.items() if counts.get(w) != n}) + workers.log_tails()

    try:
        feed_and_check(0, "two workers, two coordinators")
        # The admin tools pointed at the node that does not own the group reach the one that does.
        owner = cluster.owner_of_group(1)
        elsewhere = f"127.0.0.1:{cluster.ports[2 if owner == 1 else 1]}"
        described = tool("groups", "--describe", GROUP, "--json", "--coordinator", elsewhere)
        assert described.returncode == 0, described.stderr
        assert json.loads(described.stdout)["group_id"] == GROUP and len(json.loads(described.stdout)["members"]) == 2
        listed = tool("groups", "--list", "--json", "--coordinator", elsewhere)
        assert listed.returncode == 0 and GROUP in [g["group_id"] for g in json.loads(listed.stdout)], listed.stderr
        configs = tool("configs", "--group", GROUP, "--describe", "--coordinator", elsewhere)
        assert configs.returncode == 0 and "consumer.session.timeout.ms" in configs.stdout, configs.stderr
        # The node serving the app's group stops gracefully: it hands its shards over and leaves.
        owner = cluster.owner_of_group(1)
        other = 2 if owner == 1 else 1
        cluster.processes[owner].send_signal(signal.SIGTERM)
        assert cluster.processes[owner].wait(30) == 0
        wait_for(lambda: cluster.settled([other]), 30, "the remaining coordinator to serve every shard")
        feed_and_check(1, "after a graceful stop of the group's coordinator")
        # It comes back: the shards spread over both again, one at a time.
        cluster.start(owner)
        wait_for(lambda: cluster.settled([1, 2]), 60, "the shards to spread again")
        feed_and_check(2, "after the coordinator came back")
        # Now the other node dies without a word: its shards move once the brokers notice.
        victim = cluster.owner_of_group(owner)
        cluster.processes[victim].send_signal(signal.SIGKILL)
        cluster.processes[victim].wait(10)
        survivor = 2 if victim == 1 else 1
        wait_for(lambda: cluster.settled([survivor]), 60, "the survivor to take over every shard")
        feed_and_check(3, "after the group's coordinator was killed")
    finally:
        reader.close()
    logs = "".join(workers.log(i) for i in range(2))
    assert "lost tasks" not in logs and "fenced" not in logs.lower(), workers.log_tails()
    assert workers.stop_all() == [0, 0]
    assert "taken over" not in cluster.log(survivor)  # the survivor was never fenced itself


class Feeder:
    """Sends corpus lines to ``text-lines`` in small batches until stopped, remembering every
    line the broker acknowledged (what the final count must be made of)."""

    def __init__(self, bootstrap: str) -> None:
        self.bootstrap = bootstrap
        self.sent: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="feeder", daemon=True)
        self.error: BaseException | None = None

    def _run(self) -> None:
        from kafka import KafkaProducer

        producer = KafkaProducer(bootstrap_servers=self.bootstrap, linger_ms=5, acks="all")
        try:
            number = 0
            while not self._stop.is_set():
                batch = [CORPUS[(number + i) % len(CORPUS)] for i in range(10)]
                for i, line in enumerate(batch):
                    producer.send("text-lines", key=str(number + i).encode(), value=line.encode("utf-8"))
                producer.flush(30)
                self.sent.extend(batch)
                number += len(batch)
                self._stop.wait(0.05)
        except BaseException as error:  # reported by stop(): the test must not pass on a dead feeder
            self.error = error
        finally:
            producer.close()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> list[str]:
        self._stop.set()
        self._thread.join(60)
        assert self.error is None, f"the feeder failed: {self.error!r}"
        return list(self.sent)


class OutputWatch:
    """Reads the counts on a thread of its own and records how long the output went without
    moving while input kept coming: a coordinator node's move must not stall processing."""

    def __init__(self, bootstrap: str) -> None:
        self.reader = LatestValueReader(bootstrap, "word-counts")
        self.longest_stall_s = 0.0
        self._last_progress: float | None = None
        self._total = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="output-watch", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            total = sum(self.reader.read_more(0.1).values())
            now = time.monotonic()
            if total != self._total:
                if self._last_progress is not None:
                    self.longest_stall_s = max(self.longest_stall_s, now - self._last_progress)
                self._total, self._last_progress = total, now

    @property
    def moving(self) -> bool:
        return self._total > 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


@pytest.fixture
def fleet_of_three(tmp_path: Path) -> Iterator[tuple[str, CoordinatorCluster, Workers]]:
    broker = EmbeddedBroker(port=None)
    broker.start()
    cluster = CoordinatorCluster(broker.bootstrap_servers, tmp_path, nodes=3)
    try:
        ensure_input_topics(broker.bootstrap_servers, ["text-lines"], partitions=4)
        for node in (1, 2, 3):
            cluster.start(node)
        yield from ((broker.bootstrap_servers, cluster, w) for w in fleet_of(Workers(broker.bootstrap_servers, cluster.addresses, tmp_path, APP)))
    finally:
        cluster.stop()
        broker.stop()


def test_three_coordinators_keep_a_word_count_exact_while_input_flows_through_a_graceful_restart_and_a_kill(
    fleet_of_three: tuple[str, CoordinatorCluster, Workers],
) -> None:
    bootstrap, cluster, workers = fleet_of_three
    cluster.wait_ready()
    workers.start()
    workers.start()
    feeder, watch = Feeder(bootstrap), OutputWatch(bootstrap)
    feeder.start()
    watch.start()
    try:
        wait_for(lambda: watch.moving, 60, "the first counts")
        # The node serving the app's group restarts gracefully while lines keep coming: it hands
        # its shards to the other two, and takes some back once it has returned.
        restarted = cluster.owner_of_group(1)
        cluster.processes[restarted].send_signal(signal.SIGTERM)
        assert cluster.processes[restarted].wait(30) == 0
        wait_for(lambda: cluster.settled(sorted(set(cluster.ports) - {restarted})), 30, "the other two to serve every shard")
        cluster.start(restarted)
        wait_for(lambda: cluster.settled([1, 2, 3]), 60, "the shards to spread over three again")
        # Then whichever node serves the group now dies without a word.
        victim = cluster.owner_of_group(restarted)
        cluster.processes[victim].send_signal(signal.SIGKILL)
        cluster.processes[victim].wait(10)
        survivors = sorted(set(cluster.ports) - {victim})
        wait_for(lambda: cluster.settled(survivors), 60, "the survivors to take over every shard")
        time.sleep(1.0)  # input keeps flowing on the two survivors
    finally:
        sent = feeder.stop()
        watch.stop()
        watch.reader.close()
    expected = dict(count_words(sent))
    reader = LatestValueReader(bootstrap, "word-counts")
    try:
        counts = counts_until(reader, lambda c: c == expected, 90)
    finally:
        reader.close()
    assert counts == expected, str({w: (counts.get(w), n) for w, n in expected.items() if counts.get(w) != n}) + workers.log_tails()
    print(f"\n{len(sent)} lines fed during the moves; longest pause of the output: {watch.longest_stall_s:.2f} s")
    logs = "".join(workers.log(i) for i in range(2))
    assert "lost tasks" not in logs and "fenced" not in logs.lower(), workers.log_tails()
    assert workers.stop_all() == [0, 0]
    for node in survivors:
        assert "taken over" not in cluster.log(node)  # neither survivor was ever fenced itself
