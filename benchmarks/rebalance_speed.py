"""Rebalances with the coordinator's production defaults (5 s heartbeats, 45 s sessions), on real
processes: the embedded broker, a coordinator, and word-count workers (``examples/wordcount.py``)
with static instance ids, fed a line every 20 ms. Prints JSON:

* ``join_s``: from starting a worker to its first task, as the second and the third join a
  running group (the stable members hear of it from their next commit, then every step of the
  rebalance takes a round trip). Each joiner starts at a random moment within one commit
  interval (``--seed``): started right after the previous join, its join would land at the
  same point of the stable members' 1 s commit cycle in every run, and the figure would
  measure that phase (a 0.2 s slower start-up was seen to turn 1.3 s into 2.3 s, every run);
* ``heartbeats_per_s``: ConsumerGroupHeartbeats the coordinator received per second while the
  three workers were stable (the configured interval's load: 3 members / 5 s = 0.6);
* ``rolling_restart``: each worker in turn stopped with SIGTERM (a static member leaves with
  -2) and started again on its state directory; the longest pause between two output records
  during the roll, and the time each restarted worker took to its first task.

    .venv/bin/python benchmarks/rebalance_speed.py
"""

from __future__ import annotations

import argparse
import json
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from coordinator_process import start_coordinator
from kafka import KafkaConsumer, KafkaProducer

from pystreams.broker import EmbeddedBroker, free_port
from pystreams.cluster import ClusterMetadata, TopicSpec

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "examples" / "wordcount.py"
WORKERS = 3
STEADY_S = 15.0
#: The workers' commit interval (at-least-once default): the stable members hear of a join
#: at their next commit.
COMMIT_INTERVAL_S = 1.0


def wait_for(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.02)
    raise RuntimeError(f"timed out waiting for {what}")


def heartbeats_received(metrics_port: int) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
    match = re.search(r'^pystreams_coordinator_requests_total\{api="ConsumerGroupHeartbeat"\} (\S+)$', text, re.M)
    return float(match.group(1)) if match else 0.0


class Fleet:
    def __init__(self, bootstrap: str, coordinator: str, workdir: Path, launcher: list[str] | None = None) -> None:
        self.bootstrap, self.coordinator, self.workdir = bootstrap, coordinator, workdir
        #: How a worker starts: ``pystreams worker`` unless told (e.g. ``worker_phases.py``).
        self.launcher = launcher or [sys.executable, "-m", "pystreams", "worker"]
        self.processes: dict[int, subprocess.Popen[bytes]] = {}
        self.logs: dict[int, Path] = {}
        self.starts = 0

    def start(self, index: int) -> float:
        """Start worker ``index``; the seconds until it ran its first task."""
        self.starts += 1
        log = self.workdir / f"worker-{index}-{self.starts}.log"
        self.logs[index] = log
        started = time.monotonic()
        with log.open("wb") as out:
            self.processes[index] = subprocess.Popen(
                [
                    *self.launcher,
                    str(APP),
                    "--bootstrap-servers",
                    self.bootstrap,
                    "--coordinator",
                    self.coordinator,
                    "--instance-id",
                    f"worker-{index}",
                    "--state-dir",
                    str(self.workdir / f"state-{index}"),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        wait_for(lambda: "started tasks" in log.read_text(errors="replace"), 60, f"worker {index} to start tasks")
        return time.monotonic() - started

    def stop(self, index: int) -> None:
        process = self.processes.pop(index)
        process.send_signal(signal.SIGTERM)
        process.wait(30)

    def kill_all(self) -> None:
        for process in self.processes.values():
            process.kill()
            process.wait()


def tear_down(stop: threading.Event, fleet: Fleet, coordinator: subprocess.Popen[bytes] | None, broker: EmbeddedBroker) -> None:
    """Stop the feeding and reading threads, every process, then the broker."""
    stop.set()
    fleet.kill_all()
    if coordinator is not None:
        coordinator.kill()
        coordinator.wait()
    broker.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=None, help="of the joiners' start phases (default: a fresh one, printed)")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1_000_000)
    phases = random.Random(seed)
    broker = EmbeddedBroker(port=None)
    broker.start()
    port, metrics_port = free_port(), free_port()
    coordinator = None
    stop = threading.Event()
    arrivals: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        fleet = Fleet(broker.bootstrap_servers, f"127.0.0.1:{port}", Path(tmp))
        try:
            with ClusterMetadata(broker.bootstrap_servers) as cluster:
                cluster.ensure_topics([TopicSpec("text-lines", 6), TopicSpec("word-counts", 6)])
            coordinator = start_coordinator(broker.bootstrap_servers, port, "--metrics-port", str(metrics_port))

            def feed() -> None:
                producer = KafkaProducer(bootstrap_servers=broker.bootstrap_servers)
                number = 0
                while not stop.wait(0.02):
                    producer.send("text-lines", key=str(number).encode(), value=b"the cat sat on the mat")
                    number += 1
                producer.close()

            def read() -> None:
                consumer = KafkaConsumer("word-counts", bootstrap_servers=broker.bootstrap_servers, group_id=None, auto_offset_reset="latest")
                while not stop.is_set():
                    for records in consumer.poll(timeout_ms=50).values():
                        now = time.monotonic()
                        arrivals.extend(now for _ in records)
                consumer.close()

            threads = [threading.Thread(target=feed, daemon=True), threading.Thread(target=read, daemon=True)]
            for thread in threads:
                thread.start()
            first = fleet.start(0)
            time.sleep(1.0)
            joins = []
            for index in range(1, WORKERS):
                time.sleep(phases.uniform(0.0, COMMIT_INTERVAL_S))
                joins.append(round(fleet.start(index), 2))
            time.sleep(2.0)  # the last acknowledgements
            before, at = heartbeats_received(metrics_port), time.monotonic()
            time.sleep(STEADY_S)
            steady = (heartbeats_received(metrics_port) - before) / (time.monotonic() - at)
            roll_started = time.monotonic()
            restarts = []
            for index in range(WORKERS):
                fleet.stop(index)
                restarts.append(round(fleet.start(index), 2))
            time.sleep(2.0)
            roll_ended = time.monotonic()
            during = [t for t in arrivals if roll_started <= t <= roll_ended]
            gaps = [b - a for a, b in zip(during, during[1:], strict=False)]
            print(
                json.dumps(
                    {
                        "coordinator": "defaults (group.consumer.heartbeat.interval.ms 5000, rebalance interval 100 ms)",
                        "first_worker_first_task_s": round(first, 2),
                        "join_s": joins,
                        "join_phase_seed": seed,
                        "heartbeats_per_s": round(steady, 2),
                        "heartbeats_per_s_expected_from_interval": round(WORKERS / 5.0, 2),
                        "rolling_restart": {
                            "restart_to_first_task_s": restarts,
                            "longest_output_pause_s": round(max(gaps, default=float("nan")), 2),
                            "output_records": len(during),
                        },
                    },
                    indent=2,
                )
            )
        finally:
            tear_down(stop, fleet, coordinator, broker)


if __name__ == "__main__":
    main()
