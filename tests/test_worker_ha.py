"""High availability with real worker processes (KIP-848 Streams): standby replicas take over a
killed worker's task restoring only what they had not applied; a new worker warms a task up
while its old owner keeps processing, and takes it over only after WarmUpReady; interactive
queries answer the same from every worker, before and after a move."""

from __future__ import annotations

import re
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KafkaTopicPartition
from worker_support import Cluster, CommandTicker, Workers, fleet_of, wait_for

from pystreams.app import load_app
from pystreams.broker import free_port
from pystreams.cluster import ClusterMetadata, TopicSpec
from pystreams.queries import QueryClient

pytestmark = [pytest.mark.integration, pytest.mark.slow]

APP_PATH = Path(__file__).resolve().parent / "apps" / "ha_keys.py"
APP = load_app(str(APP_PATH))
INPUT, PROGRESS = "ha-keys-in", "ha-keys-progress"
STARTED = re.compile(r"(\S+ \S+) INFO \S+: stream-thread-\d+: started tasks (.+) \(restored (\d+) records\)")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    running = Cluster(tmp_path)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def workers(cluster: Cluster, tmp_path: Path) -> Iterator[Workers]:
    yield from fleet_of(Workers(cluster.bootstrap, cluster.coordinator_address, tmp_path, APP_PATH))


def create_input(bootstrap: str, partitions: int) -> None:
    with ClusterMetadata(bootstrap) as cluster:
        cluster.ensure_topics([TopicSpec(INPUT, partitions)])


def fill(bootstrap: str, partition: int, first: int, keys: int, version: int, chunk: int = 1_000) -> int:
    """Commands making ``partition``'s task put keys first..first+keys-1 = version."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20)
    sent = 0
    try:
        for start in range(first, first + keys, chunk):
            producer.send(INPUT, key=b"fill", value=f"{start} {min(chunk, first + keys - start)} {version}".encode(), partition=partition)
            sent += 1
        producer.flush()
    finally:
        producer.close()
    return sent


def started_tasks(log: str) -> list[tuple[str, list[str], int]]:
    """(time, tasks, records restored) of each "started tasks" line."""
    return [(when, tasks.split(", "), int(restored)) for when, tasks, restored in STARTED.findall(log)]


def standby_has(endpoint: str, key: str, version: int) -> bool:
    """The worker at ``endpoint`` serves ``key`` = ``version`` from any replica (stale reads)."""
    key_serde, value_serde = _serdes()
    url = f"http://{endpoint}/v1/stores/keys/{key_serde.serialize(key).hex()}?stale=1"
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return value_serde.deserialize(response.read()) == version
    except OSError:  # 404 / 503 (HTTPError) or not listening yet
        return False


def test_a_killed_workers_standby_takes_over_restoring_a_small_fraction_of_a_million_keys(cluster: Cluster, workers: Workers) -> None:
    keys = 1_000_000
    create_input(cluster.bootstrap, 1)
    endpoints = [f"127.0.0.1:{free_port()}" for _ in range(2)]
    for endpoint in endpoints:
        workers.start("--num-standby-replicas", "1", "--user-endpoint", endpoint)
    wait_for(lambda: any(started_tasks(workers.log(i)) for i in range(2)), 30, "the active to start")
    active = next(i for i in range(2) if started_tasks(workers.log(i)))
    standby = 1 - active
    wait_for(lambda: "replicas 0_0" in workers.log(standby), 30, "the standby replica\n" + workers.log_tails())

    fill(cluster.bootstrap, 0, 0, keys, version=1)
    last_key = f"k{keys - 1}"
    wait_for(lambda: standby_has(endpoints[standby], last_key, 1), 180, "the standby to apply the last key\n" + workers.log_tails())
    # Every worker routes a query to the active, wherever it is asked.
    for endpoint in endpoints:
        assert QueryClient([endpoint]).get("keys", "k123456", *_serdes()) == 1
        assert APP.query("keys", last_key, endpoints=[endpoint]) == 1
    assert APP.query("keys", "no-such-key", endpoints=endpoints) is None

    workers.processes[active].send_signal(signal.SIGKILL)
    assert workers.processes[active].wait(10) == -signal.SIGKILL
    wait_for(lambda: started_tasks(workers.log(standby)), 60, "the standby to take over\n" + workers.log_tails())
    ((_, tasks, restored),) = started_tasks(workers.log(standby))
    assert tasks == ["0_0"]
    print(f"\nfail-over with a standby: restored {restored} of {keys} changelog records")
    assert restored <= keys // 20, f"the new active restored {restored} records: the standby was not used"

    # The new active serves queries and processes new input.
    assert APP.query("keys", "k999", endpoints=[endpoints[standby]]) == 1
    fill(cluster.bootstrap, 0, 0, 10, version=2)
    wait_for(lambda: APP.query("keys", "k9", endpoints=[endpoints[standby]]) == 2, 30, "the update after fail-over")
    assert APP.query("keys", "k10", endpoints=[endpoints[standby]]) == 1


def _serdes():
    spec = APP.topology().stores["keys"]
    return spec.key_serde, spec.value_serde


def processing_gaps_ms(bootstrap: str, since_ms: int) -> dict[str, int]:
    """Per task, the longest gap between processing times of consecutive trickled commands
    processed from ``since_ms`` on (earlier ones wait behind the fill's changelog flushes)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="earliest")
    try:
        partitions = [KafkaTopicPartition(PROGRESS, p) for p in sorted(consumer.partitions_for_topic(PROGRESS) or ())]
        consumer.assign(partitions)
        last: dict[str, int] = {}
        gaps: dict[str, int] = {}
        idle = 0
        while idle < 3:
            batch = consumer.poll(500)
            idle = 0 if batch else idle + 1
            for records in batch.values():
                for record in records:
                    task, _count, version, processed_at = record.value.decode().split(",")
                    if int(version) <= CommandTicker.FIRST_VERSION or int(processed_at) < since_ms:
                        continue
                    if task in last:
                        gaps[task] = max(gaps.get(task, 0), int(processed_at) - last[task])
                    last[task] = int(processed_at)
        return gaps
    finally:
        consumer.close()


def test_a_new_worker_warms_a_task_up_before_it_moves_and_the_others_never_stop(cluster: Cluster, workers: Workers) -> None:
    partitions, keys_per_task = 4, 50_000
    create_input(cluster.bootstrap, partitions)
    ha = ("--acceptable-recovery-lag", "2000", "--max-warmup-replicas", "1")
    workers.start(*ha)
    workers.start(*ha)
    # Both workers settled with the four tasks between them: the first one's share moving to the
    # second is not the move this test watches.
    wait_for(lambda: sorted(active_tasks(workers.log(i)) for i in range(2)) == [2, 2], 30, "two workers to share the four tasks\n" + workers.log_tails())
    for partition in range(partitions):
        fill(cluster.bootstrap, partition, partition * 1_000_000, keys_per_task, version=1)
    with CommandTicker(cluster.bootstrap, partitions):
        # A trickled command processed by every task means the fill before it is processed too
        # (a partition is processed in order): from here the changelogs only grow by the trickle,
        # so what is left to restore after WarmUpReady does not depend on how busy the machine is.
        with ProgressWatch(cluster.bootstrap) as progress:
            wait_for(lambda: len(progress.tasks_past_the_fill()) == partitions, 90, "the actives to process the fill\n" + workers.log_tails())
        # Processed is not yet in the changelog: that takes a commit (every second). Two of them
        # later the changelogs hold the whole fill, and only the trickle still grows them.
        time.sleep(2 * 1.0)
        joined_at_ms = time.time_ns() // 1_000_000
        logged_before_join = [len(workers.log(i)) for i in range(2)]
        workers.start(*ha)
        wait_for(lambda: started_tasks(workers.log(2)), 90, "the new worker to take a task\n" + workers.log_tails())
        time.sleep(2)
    new_log = workers.log(2)
    ((moved_at, moved, restored),) = started_tasks(new_log)
    # It warmed the task up first, said so, and then restored only the remainder.
    warmed = re.search(r"replicas (\S+) \(warm-ups (\S+)\)", new_log)
    assert warmed is not None and warmed.group(2) in moved, new_log
    assert "WARM_UP_READY" in new_log
    assert new_log.index("WARM_UP_READY") < new_log.index("started tasks")
    assert restored <= 2_000 + 5_000, f"restored {restored} records after the warm-up"
    # Only the moving task was ever revoked; every other task kept running on its owner.
    revoked = [tasks for i in range(2) for tasks in re.findall(r"revoked tasks (.+) \(committed\)", workers.log(i)[logged_before_join[i] :])]
    assert all(set(tasks.split(", ")) <= set(moved) for tasks in revoked), revoked
    gaps = processing_gaps_ms(cluster.bootstrap, joined_at_ms)
    print(f"\nlongest processing gap per task after the join (ms): {dict(sorted(gaps.items()))}; moved {moved}")
    assert set(gaps) == {f"0_{p}" for p in range(partitions)}, "every task kept processing after the join"
    assert workers.stop_all() == [0, 0, 0]


def active_tasks(log: str) -> int:
    """How many active tasks the worker ran after its latest rebalance (0 before the first)."""
    settled = re.findall(r"rebalance settled after \S+ s \((\d+) active tasks\)", log)
    return int(settled[-1]) if settled else 0


class ProgressWatch:
    """Reads the progress topic as it grows (it never stops growing while the trickle runs)."""

    def __init__(self, bootstrap: str) -> None:
        self._consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="earliest")
        self._consumer.assign([KafkaTopicPartition(PROGRESS, p) for p in sorted(self._consumer.partitions_for_topic(PROGRESS) or ())])
        self._past_the_fill: set[str] = set()

    def tasks_past_the_fill(self) -> set[str]:
        """The tasks that processed a trickled command (so everything written before it)."""
        for records in self._consumer.poll(200).values():
            for record in records:
                task, _count, version, _processed_at = record.value.decode().split(",")
                if int(version) > CommandTicker.FIRST_VERSION:
                    self._past_the_fill.add(task)
        return self._past_the_fill

    def __enter__(self) -> ProgressWatch:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._consumer.close()


def tasks_that_processed(bootstrap: str, version: int) -> set[str]:
    """The tasks whose progress records show a command of ``version`` processed."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="earliest", consumer_timeout_ms=1_000)
    try:
        consumer.assign([KafkaTopicPartition(PROGRESS, p) for p in sorted(consumer.partitions_for_topic(PROGRESS) or ())])
        tasks = set()
        for record in consumer:
            task, _count, seen, _processed_at = record.value.decode().split(",")
            if int(seen) == version:
                tasks.add(task)
        return tasks
    finally:
        consumer.close()


def test_with_two_stream_threads_every_task_of_a_killed_worker_resumes_on_the_survivor(cluster: Cluster, workers: Workers) -> None:
    """A process's stream threads share its state directory. After a fail-over a task may be
    promoted on one thread while its standby is still open on the other; it starts once that
    replica closes, not at some later rebalance."""
    partitions = 8
    everything = {f"0_{p}" for p in range(partitions)}
    create_input(cluster.bootstrap, partitions)
    for _ in range(2):
        workers.start("--threads", "2", "--num-standby-replicas", "1")
    wait_for(lambda: all("replicas 0_" in workers.log(i) for i in range(2)), 60, "both workers to hold replicas\n" + workers.log_tails())
    for partition in range(partitions):
        fill(cluster.bootstrap, partition, partition * 1_000, 1_000, version=1)
    wait_for(lambda: tasks_that_processed(cluster.bootstrap, 1) == everything, 60, "every task to process\n" + workers.log_tails())

    workers.processes[0].send_signal(signal.SIGKILL)
    assert workers.processes[0].wait(10) == -signal.SIGKILL
    for partition in range(partitions):
        fill(cluster.bootstrap, partition, partition * 1_000, 10, version=2)
    wait_for(lambda: tasks_that_processed(cluster.bootstrap, 2) == everything, 60, "every task to resume on the survivor\n" + workers.log_tails())
    assert workers.stop_all([1]) == [0]
