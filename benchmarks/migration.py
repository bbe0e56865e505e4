"""Online migration of a Streams fleet: a rolling upgrade of N classic workers to the consumer
(KIP-848) protocol, next to a stop-the-world restart of the same fleet.

Real processes (the embedded broker, a coordinator process, ``pystreams worker`` processes with
static instance ids and their own state directories) running ``tests/apps/ha_keys.py``: every
task first fills its store, then a ticker sends each partition a command every 50 ms and the
app writes, per command, which task processed it and when. From that:

* ``rolling``: each worker in turn is stopped (SIGTERM) and restarted with
  ``--group-protocol consumer``, the next one once every task processes again (a rollout waits
  for readiness); reported are the total time (first stop to the last restarted worker's tasks
  processing again), the longest processing pause of the tasks of the workers
  that were *not* being restarted (the point of an online, cooperative migration: they never
  stop), and the longest pause of the restarted workers' own tasks;
* ``stop_the_world``: every worker is stopped, then all are started with
  ``--group-protocol consumer``; every task pauses for the whole restart.

    python benchmarks/migration.py [--workers 3] [--partitions 6] [--keys-per-task 20000]
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import sys
import tempfile
import time
from pathlib import Path

from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KafkaTopicPartition

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the worker-process harness the tests use

from worker_support import Cluster, Trickle, Workers, wait_for  # noqa: E402

from pystreams.cluster import ClusterMetadata, TopicSpec  # noqa: E402

APP_PATH = ROOT / "tests" / "apps" / "ha_keys.py"
INPUT, PROGRESS = "ha-keys-in", "ha-keys-progress"
CLASSIC = ("--group-protocol", "classic", "--session-timeout-ms", "6000", "--heartbeat-interval-ms", "500")
CONSUMER = ("--group-protocol", "consumer")
STARTED = re.compile(r"started tasks (.+) \(restored")
REVOKED = re.compile(r"revoked tasks (.+) \(committed\)")


class Ticks:
    """Reads the progress topic: task -> the wall-clock times (ms) it processed ticks."""

    def __init__(self, bootstrap: str) -> None:
        self._consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="earliest")
        self._consumer.assign([KafkaTopicPartition(PROGRESS, 0)])
        self.times: dict[str, list[int]] = {}

    def read(self, timeout_ms: int = 200) -> bool:
        batch = self._consumer.poll(timeout_ms)
        for records in batch.values():
            for record in records:
                task, _count, version, processed_at = record.value.decode().split(",")
                if int(version) > Trickle.FIRST_VERSION:
                    self.times.setdefault(task, []).append(int(processed_at))
        return bool(batch)

    def steady(self, tasks: int, within_ms: int = 500) -> bool:
        """Every task processes ticks as they come (the fill's backlog is behind it)."""
        self.read()
        latest = [values[-1] for values in self.times.values()]
        return len(latest) == tasks and min(latest) >= now_ms() - within_ms

    def drain(self) -> dict[str, list[int]]:
        idle = 0
        while idle < 3:
            idle = 0 if self.read(500) else idle + 1
        return {task: sorted(values) for task, values in self.times.items()}

    def close(self) -> None:
        self._consumer.close()


def longest_pause_ms(times: list[int], since_ms: int, until_ms: int) -> int:
    """The longest gap between consecutive processing times that overlaps [since, until]; a task
    that processed nothing before the window counts as paused from its start."""
    points = sorted([since_ms, *times]) if not any(t <= since_ms for t in times) else times
    longest = 0
    for before, after in zip(points, points[1:]):
        if after >= since_ms and before <= until_ms:
            longest = max(longest, after - before)
    if not any(t >= since_ms for t in points[1:]):  # never processed again
        return until_ms - max(t for t in points if t <= since_ms)
    return longest


def tasks_in(log: str, pattern: re.Pattern[str]) -> set[str]:
    return {task for match in pattern.finditer(log) for task in match.group(1).split(", ")}


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def measure(mode: str, workers_n: int, partitions: int, keys_per_task: int, workdir: Path | None) -> dict:
    with tempfile.TemporaryDirectory(prefix="pystreams-migration-") as tmp:
        logs = Path(tmp) if workdir is None else workdir / mode
        logs.mkdir(parents=True, exist_ok=True)
        cluster = Cluster(logs)
        workers = Workers(cluster.bootstrap, cluster.coordinator_address, logs, APP_PATH)
        try:
            with ClusterMetadata(cluster.bootstrap) as metadata:
                metadata.ensure_topics([TopicSpec(INPUT, partitions), TopicSpec(PROGRESS, 1)])
            current = {}
            for slot in range(workers_n):
                current[slot] = len(workers.processes)
                workers.start(*CLASSIC, "--instance-id", f"w{slot}")
            wait_for(
                lambda: len(set().union(*(tasks_in(workers.log(i), STARTED) for i in current.values()))) == partitions,
                120,
                "the classic fleet to run every task\n" + workers.log_tails(),
            )
            producer = KafkaProducer(bootstrap_servers=cluster.bootstrap, linger_ms=20)
            for partition in range(partitions):
                for first in range(0, keys_per_task, 1_000):
                    producer.send(INPUT, key=b"fill", value=f"{partition * 1_000_000 + first} 1000 1".encode(), partition=partition)
            producer.flush()
            producer.close()
            steps = []
            ticks = Ticks(cluster.bootstrap)
            with Trickle(cluster.bootstrap, partitions):
                wait_for(lambda: ticks.steady(partitions), 120, "every task to process ticks as they come")
                started_ms = now_ms()
                if mode == "rolling":
                    for slot in range(workers_n):
                        step_from = now_ms()
                        process = workers.processes[current[slot]]
                        process.send_signal(signal.SIGTERM)
                        process.wait(60)
                        moved = tasks_in(workers.log(current[slot]).split("worker: stopping", 1)[-1], REVOKED)
                        current[slot] = len(workers.processes)
                        workers.start(*CONSUMER, "--instance-id", f"w{slot}", state_of=slot)
                        wait_for(lambda s=slot: STARTED.search(workers.log(current[s])), 120, f"w{slot} to run its tasks again\n" + workers.log_tails())
                        # The step ends when its tasks process again (a rollout waits for readiness).
                        wait_for(lambda: ticks.steady(partitions), 120, "every task to process ticks again")
                        steps.append((step_from, now_ms(), moved))
                else:
                    for slot in range(workers_n):
                        workers.processes[current[slot]].send_signal(signal.SIGTERM)
                    for slot in range(workers_n):
                        workers.processes[current[slot]].wait(60)
                    for slot in range(workers_n):
                        current[slot] = len(workers.processes)
                        workers.start(*CONSUMER, "--instance-id", f"w{slot}", state_of=slot)
                    wait_for(
                        lambda: len(set().union(*(tasks_in(workers.log(i), STARTED) for i in current.values()))) == partitions,
                        120,
                        "the restarted fleet to run every task\n" + workers.log_tails(),
                    )
                    wait_for(lambda: ticks.steady(partitions), 120, "every task to process ticks again")
                    steps.append((started_ms, now_ms(), {f"0_{p}" for p in range(partitions)}))
                finished_ms = now_ms()
                time.sleep(2)
            times = ticks.drain()
            ticks.close()
            still = [longest_pause_ms(times.get(task, []), a, b) for a, b, moved in steps for task in times if task not in moved]
            moving = [longest_pause_ms(times.get(task, []), a, b) for a, b, moved in steps for task in moved]
            per_step = [
                {
                    "took_s": round((b - a) / 1000, 2),
                    "moved": sorted(moved),
                    "longest_pause_of_the_others_ms": max((longest_pause_ms(times.get(task, []), a, b) for task in times if task not in moved), default=None),
                }
                for a, b, moved in steps
            ]
            return {
                "mode": mode,
                "total_s": round((finished_ms - started_ms) / 1000, 2),
                "longest_pause_of_tasks_that_did_not_move_ms": max(still, default=None),
                "longest_pause_of_moved_tasks_ms": max(moving, default=None),
                "steps": per_step,
            }
        finally:
            workers.stop_all()
            cluster.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--keys-per-task", type=int, default=20_000, help="state each task restores when it moves")
    parser.add_argument("--workdir", type=Path, help="keep logs and state here instead of a temporary directory")
    args = parser.parse_args(argv)
    runs = [measure(mode, args.workers, args.partitions, args.keys_per_task, args.workdir) for mode in ("rolling", "stop_the_world")]
    json.dump(
        {"benchmark": "migration", "workers": args.workers, "partitions": args.partitions, "keys_per_task": args.keys_per_task, "runs": runs},
        sys.stdout,
        indent=2,
    )
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
