"""Worker processes meeting bad records and failing: real processes on the embedded broker
(``tests/apps/json_events.py``: JSON events keyed by user, counted per user).

A worker whose processing fails leaves its group at once, its tasks lost rather than revoked,
so another worker takes them over long before the session timeout would have; its exit line
says what it really processed. The error policies (``--deserialization-errors``,
``--processing-errors``, ``--dead-letter-topic``) decide what a bad record does.
"""
from __future__ import annotations

import re
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka import KafkaConsumer, KafkaProducer
from worker_support import Cluster, Workers, fleet_of, wait_for

from pystreams.commands.dev import ensure_input_topics

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "tests" / "apps" / "json_events.py"
PARTITIONS = 4
#: Long enough that a takeover before it cannot be the session expiring.
SESSION_TIMEOUT_MS = 60_000


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    running = Cluster(tmp_path, group_args=("--heartbeat-interval-ms", "300", "--session-timeout-ms",
                                            str(SESSION_TIMEOUT_MS), "--metadata-refresh-ms", "500"))
    try:
        ensure_input_topics(running.bootstrap, ["events"], partitions=PARTITIONS)
        yield running
    finally:
        running.stop()


@pytest.fixture
def workers(cluster: Cluster, tmp_path: Path) -> Iterator[Workers]:
    yield from fleet_of(Workers(cluster.bootstrap, cluster.coordinator_address, tmp_path, APP))


def send(bootstrap: str, records: list[tuple[int, str, bytes]]) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    try:
        for partition, key, value in records:
            producer.send("events", key=key.encode(), value=value, partition=partition)
        producer.flush()
    finally:
        producer.close()


class Counts:
    """The latest count per user in ``event-counts``."""

    def __init__(self, bootstrap: str) -> None:
        self._consumer = KafkaConsumer("event-counts", bootstrap_servers=bootstrap, group_id=None,
                                       auto_offset_reset="earliest")
        self.latest: dict[str, int] = {}

    def read(self) -> dict[str, int]:
        for records in self._consumer.poll(timeout_ms=200).values():
            for record in records:
                self.latest[record.key.decode()] = struct.unpack(">q", record.value)[0]
        return self.latest

    def users(self, prefix: str) -> set[str]:
        return {user for user in self.read() if user.startswith(prefix)}

    def close(self) -> None:
        self._consumer.close()


def test_a_worker_whose_processing_fails_leaves_at_once_and_another_takes_over(cluster: Cluster, workers: Workers) -> None:
    counts = Counts(cluster.bootstrap)
    try:
        # A closes its tasks slowly: nothing of its shutdown may wait for its failed engine.
        poisoned = workers.start(env={"JSON_EVENTS_POISON": "bob", "JSON_EVENTS_CLOSE_S": "3"})
        wait_for(lambda: "started tasks" in workers.log(0), 30, "worker A to start its tasks")
        send(cluster.bootstrap, [(p, f"ann-{p}", b'{"n": 1}') for p in range(PARTITIONS)])
        wait_for(lambda: len(counts.users("ann-")) == PARTITIONS, 30, "A to count every warm-up event")
        workers.start()
        wait_for(lambda: "started tasks" in workers.log(1), 30, "worker B to take a share of the tasks")
        send(cluster.bootstrap, [(p, f"bob-{p}", b'{"n": 1}') for p in range(PARTITIONS)])
        poisoned.wait(30)
        failed_at = time.monotonic()
        # B counts bob's events of A's partitions too: A's leave moved its tasks (a session
        # expiry could only have done so after SESSION_TIMEOUT_MS).
        wait_for(lambda: len(counts.users("bob-")) == PARTITIONS, 20, "B to take over A's tasks:\n" + workers.log_tails())
        assert time.monotonic() - failed_at < SESSION_TIMEOUT_MS / 1000
    finally:
        counts.close()
    log_a = workers.log(0)
    assert poisoned.returncode == 1
    assert "leaving the group timed out" not in log_a
    assert "poisoned user 'bob-" in log_a and "--processing-errors log-and-continue" in log_a
    assert "tasks are lost, not committed, and move to other workers at once" in log_a
    # A counted the four warm-up events alone, then failed on its first bob event.
    assert re.search(r"^worker: stopped after processing 4 records; ", log_a, re.MULTILINE), log_a
    assert re.search(r"stream-thread-0: lost tasks 0_\d.* \(error 0\)", log_a), log_a
