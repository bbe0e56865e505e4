"""Takeover after a worker's *processing failure*: how long from the moment one worker's engine
fails (the ``fail`` error policy) until another worker has processed the records it left.

Real processes: the embedded broker, a coordinator process (its default 5 s heartbeat and 45 s
session unless told otherwise), two ``pystreams worker`` processes running
``tests/apps/json_events.py``. Worker A's environment poisons users ``bob-*``: its processing of
their events raises. Once both workers share the tasks, one bob-N event goes to partition N
of ``events``; A fails on the first it meets and exits. The takeover ends when ``event-counts``
shows all of bob's events counted (B processed what A could not).

    python benchmarks/failure_takeover.py [--heartbeat-interval-ms 5000] [--session-timeout-ms 45000]

Prints JSON: seconds from A's failure to its exit and to the takeover, and A's exit line.
"""

from __future__ import annotations

import argparse
import json
import re
import struct
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from kafka import KafkaConsumer, KafkaProducer

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the worker-process harness the tests use

from worker_support import Cluster, Workers, wait_for  # noqa: E402

from pystreams.commands.dev import ensure_input_topics  # noqa: E402

APP_PATH = ROOT / "tests" / "apps" / "json_events.py"
PARTITIONS = 4
FAILED = re.compile(r"^(\S+ \S+) ERROR .*engine failed", re.MULTILINE)
EXIT_LINE = re.compile(r"^worker: stopped after .*$", re.MULTILINE)


def _log_time(text: str) -> float:
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def _send(bootstrap: str, records: list[tuple[int, str, bytes]]) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    try:
        for partition, key, value in records:
            producer.send("events", key=key.encode(), value=value, partition=partition)
        producer.flush()
    finally:
        producer.close()


def _counted(consumer: KafkaConsumer, prefix: str, latest: dict[str, int]) -> int:
    """How many users named PREFIX-N have a count (one event each was sent)."""
    for records in consumer.poll(timeout_ms=200).values():
        for record in records:
            latest[record.key.decode()] = struct.unpack(">q", record.value)[0]
    return sum(1 for user in latest if user.startswith(prefix + "-"))


def measure(heartbeat_ms: int, session_ms: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="pystreams-takeover-") as directory:
        tmp = Path(directory)
        group_args = ("--heartbeat-interval-ms", str(heartbeat_ms), "--session-timeout-ms", str(session_ms), "--metadata-refresh-ms", "1000")
        cluster = Cluster(tmp, group_args=group_args)
        workers = Workers(cluster.bootstrap, cluster.coordinator_address, tmp, APP_PATH)
        try:
            ensure_input_topics(cluster.bootstrap, ["events"], partitions=PARTITIONS)
            poisoned = workers.start(env={"JSON_EVENTS_POISON": "bob"})
            wait_for(lambda: "started tasks" in workers.log(0), 60, "worker A to start its tasks")
            workers.start()
            wait_for(lambda: "started tasks" in workers.log(1), 120, "worker B to take a share of the tasks")
            _send(cluster.bootstrap, [(p, f"ann-{p}", b'{"n": 1}') for p in range(PARTITIONS)])
            consumer = KafkaConsumer("event-counts", bootstrap_servers=cluster.bootstrap, group_id=None, auto_offset_reset="earliest")
            latest: dict[str, int] = {}
            wait_for(lambda: _counted(consumer, "ann", latest) == PARTITIONS, 60, "the warm-up events to be counted")
            _send(cluster.bootstrap, [(p, f"bob-{p}", b'{"n": 1}') for p in range(PARTITIONS)])
            poisoned.wait(300)
            log_a = workers.log(0)
            failed_at = _log_time(FAILED.search(log_a).group(1))  # type: ignore[union-attr]
            exited_at = time.time()
            wait_for(lambda: _counted(consumer, "bob", latest) == PARTITIONS, 300, "bob's events to be counted")
            taken_over_at = time.time()
            consumer.close()
            exit_line = EXIT_LINE.search(log_a)
            return {
                "heartbeat_interval_ms": heartbeat_ms,
                "session_timeout_ms": session_ms,
                "failure_to_exit_s": round(exited_at - failed_at, 2),
                "failure_to_takeover_s": round(taken_over_at - failed_at, 2),
                "exit_status": poisoned.returncode,
                "exit_line": exit_line.group(0) if exit_line else None,
            }
        finally:
            workers.stop_all()
            cluster.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heartbeat-interval-ms", type=int, default=5000)
    parser.add_argument("--session-timeout-ms", type=int, default=45000)
    args = parser.parse_args()
    print(json.dumps(measure(args.heartbeat_interval_ms, args.session_timeout_ms), indent=2))


if __name__ == "__main__":
    main()
