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
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka import KafkaConsumer, KafkaProducer
from worker_support import Cluster, Workers, fleet_of, wait_for

from pystreams.broker import EmbeddedBroker, free_port
from pystreams.commands.dev import ensure_input_topics

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "tests" / "apps" / "json_events.py"
PARTITIONS = 4
#: Long enough that a takeover before it cannot be the session expiring.
SESSION_TIMEOUT_MS = 60_000


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    running = Cluster(tmp_path, group_args=("--heartbeat-interval-ms", "300", "--session-timeout-ms", str(SESSION_TIMEOUT_MS), "--metadata-refresh-ms", "500"))
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
        self._consumer = KafkaConsumer("event-counts", bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="earliest")
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


def dead_letters(bootstrap: str, topic: str, expected: int, timeout_s: float = 20) -> list:
    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="earliest")
    found: list = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(found) < expected and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=200).values():
                found.extend(records)
    finally:
        consumer.close()
    return found


@pytest.mark.parametrize("policy", ["fail", "log-and-continue", "dead-letter"])
def test_a_value_that_is_not_json_does_what_the_deserialization_policy_says(cluster: Cluster, workers: Workers, policy: str) -> None:
    from pystreams.cluster import ClusterMetadata, TopicSpec

    extra = ["--deserialization-errors", policy]
    if policy == "dead-letter":
        with ClusterMetadata(cluster.bootstrap) as admin:
            admin.ensure_topics([TopicSpec("events-dlq", 1)])
        extra += ["--dead-letter-topic", "events-dlq"]
    counts = Counts(cluster.bootstrap)
    try:
        worker = workers.start(*extra)
        wait_for(lambda: "started tasks" in workers.log(0), 30, "the worker to start its tasks")
        send(cluster.bootstrap, [(1, "ann", b'{"n": 1}'), (1, "bad", b"not json {"), (1, "cid", b'{"n": 1}')])
        if policy == "fail":
            assert worker.wait(30) == 1
            log = workers.log(0)
            # It names the record (topic-partition@offset) and the option that skips such records.
            assert "deserialization error on events-1@1 in node 'events'" in log, log
            assert "--deserialization-errors log-and-continue" in log
            assert "Traceback" not in log  # the failure says it all
            # ann's event was processed before it; nothing of that poll was committed.
            assert re.search(r"^worker: stopped after processing 1 records; ", log, re.MULTILINE), log
            return
        # Skipped: the records after it are counted, and the worker goes on.
        wait_for(lambda: {"ann", "cid"} <= set(counts.read()), 30, "the good records to be counted")
        assert "bad" not in counts.read() and worker.poll() is None
        log = workers.log(0)
        assert "deserialization error on events-1@1 in node 'events'" in log and f"(skipped: {policy})" in log
    finally:
        counts.close()
    assert workers.stop_all() == [0]
    assert re.search(r"^worker: stopped after processing 3 records \(1 skipped by the error policies\)$", workers.log(0), re.MULTILINE), workers.log(0)
    if policy == "dead-letter":
        (letter,) = dead_letters(cluster.bootstrap, "events-dlq", 1)
        headers = dict(letter.headers)
        assert (letter.key, letter.value) == (b"bad", b"not json {")  # the original bytes
        assert headers["pystreams.error.kind"] == b"deserialization"
        assert (headers["pystreams.error.topic"], headers["pystreams.error.partition"], headers["pystreams.error.offset"]) == (b"events", b"1", b"1")
        assert b"bad JSON" in headers["pystreams.error.reason"]


def test_processing_errors_are_skipped_by_their_own_policy_while_deserialization_errors_still_fail(cluster: Cluster, workers: Workers) -> None:
    counts = Counts(cluster.bootstrap)
    try:
        worker = workers.start("--processing-errors", "log-and-continue", env={"JSON_EVENTS_POISON": "bob"})
        wait_for(lambda: "started tasks" in workers.log(0), 30, "the worker to start its tasks")
        send(cluster.bootstrap, [(2, "bob", b'{"n": 1}'), (2, "ann", b'{"n": 1}')])
        wait_for(lambda: "ann" in counts.read(), 30, "ann's event to be counted")
        assert "bob" not in counts.read()
        assert "processing error on events-2@0 in node 'checked': ValueError: poisoned user 'bob'" in workers.log(0)
        send(cluster.bootstrap, [(2, "bad", b"{{")])
        assert worker.wait(30) == 1  # deserialization errors keep the app's policy: fail
    finally:
        counts.close()
    assert "deserialization error on events-2@2" in workers.log(0)


# -- a wrong --coordinator address ------------------------------------------------------------------


@pytest.mark.parametrize("given", ["nothing-listens", "a-kafka-broker"])
def test_a_worker_given_a_wrong_coordinator_address_says_what_is_there_and_gives_up(tmp_path: Path, given: str) -> None:
    broker = EmbeddedBroker(port=None)
    broker.start()
    try:
        ensure_input_topics(broker.bootstrap_servers, ["events"], partitions=1)
        address = f"127.0.0.1:{free_port()}" if given == "nothing-listens" else broker.bootstrap_servers
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pystreams",
                "worker",
                str(APP),
                "--bootstrap-servers",
                broker.bootstrap_servers,
                "--coordinator",
                address,
                "--state-dir",
                str(tmp_path / "state"),
                "--coordinator-connect-timeout-ms",
                "3000",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=90,
        )
    finally:
        broker.stop()
    output = done.stdout
    assert done.returncode == 1, output
    said = (
        f"nothing listens at {address} — is the coordinator running?"
        if given == "nothing-listens"
        else f"{address} is a Kafka broker, not a pystreams coordinator"
    )
    levels = [line.split()[2] for line in output.splitlines() if said in line and line[:2] == "20"]
    if given == "nothing-listens":
        assert levels[0] == "INFO" and "WARNING" in levels, output  # a coordinator may just be starting
    else:
        assert levels[0] == "WARNING", output  # retrying will not make a broker a coordinator
    last_said = [line for line in output.splitlines() if line.startswith("worker: ")][-1]
    assert last_said.startswith(f"worker: stream-thread-0: no coordinator reached within 3 s, giving up: {said}"), output
    assert "Traceback" not in output
