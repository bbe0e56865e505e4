"""Shared by the worker-process tests: a broker and coordinator per test, and a fleet of
``pystreams worker`` processes with their logs; and the windowed-click scenario of the
one-result-per-window tests (emit-final, suppress): workers SIGKILLed and replaced mid-stream
under exactly-once while a ``read_committed`` reader collects every final result."""

from __future__ import annotations

import collections
import os
import random
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KafkaTopicPartition
from pystreams.topology.kernels import partition_for_key
from pystreams.topology.windows import Windowed

from pystreams import serdes
from pystreams.broker import EmbeddedBroker, free_port
from pystreams.commands.dev import ensure_input_topics
from pystreams.worker.committed_consumer import CommittedConsumer

COMMIT_INTERVAL_MS = 200
#: ``tests/apps/ha_keys.py``'s input topic.
HA_KEYS_INPUT = "ha-keys-in"


class Cluster:
    """A fresh embedded broker and a coordinator process (short session timeouts). With
    ``log="kafka"`` the coordinator keeps its records on the broker, so it can be killed and
    started again (``kill_coordinator``, ``start_coordinator``) without losing a group."""

    #: Heartbeats every 300 ms, sessions of 3 s: group changes take moments in tests.
    FAST_GROUP_ARGS = ("--heartbeat-interval-ms", "300", "--session-timeout-ms", "3000", "--metadata-refresh-ms", "500")

    def __init__(self, tmp_path: Path, *, log: str = "memory", bootstrap: str | None = None, group_args: Sequence[str] = FAST_GROUP_ARGS) -> None:
        # ``bootstrap``: an existing Kafka cluster (Apache Kafka in Docker) instead of a fresh
        # embedded broker; the test then owns nothing of it but its own topics.
        self.group_args = tuple(group_args)
        self.broker: EmbeddedBroker | None = None
        if bootstrap is None:
            self.broker = EmbeddedBroker(port=None)
            self.broker.start()
            bootstrap = self.broker.bootstrap_servers
        self.port = free_port()
        self.log_kind = log
        self._log = (tmp_path / "coordinator.log").open("ab")
        self.bootstrap = bootstrap
        self.coordinator_address = f"127.0.0.1:{self.port}"
        self.coordinator: subprocess.Popen[bytes] | None = None
        try:
            self.start_coordinator()
        except BaseException:
            self.stop()
            raise

    def start_coordinator(self) -> None:
        self.coordinator = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pystreams",
                "coordinator",
                "--log",
                self.log_kind,
                "--bootstrap-servers",
                self.bootstrap,
                "--listen",
                f"127.0.0.1:{self.port}",
                *self.group_args,
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        wait_for(lambda: listening(self.port), 20, "the coordinator to listen")

    def kill_coordinator(self) -> None:
        assert self.coordinator is not None
        self.coordinator.kill()
        self.coordinator.wait(10)
        wait_for(lambda: not listening(self.port), 10, "the coordinator's port to close")

    def stop(self) -> None:
        if self.coordinator is not None and self.coordinator.poll() is None:
            self.coordinator.terminate()
            try:
                self.coordinator.wait(10)
            except subprocess.TimeoutExpired:
                self.coordinator.kill()
        self._log.close()
        if self.broker is not None:
            self.broker.stop()


def listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def wait_for(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


class Workers:
    def __init__(self, bootstrap: str, coordinator: str, tmp_path: Path, app: Path) -> None:
        self.bootstrap, self.coordinator, self.tmp_path, self.app = bootstrap, coordinator, tmp_path, app
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(self, *extra_args: str, state_of: int | None = None, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        """Start a worker (logging to ``worker-<index>.log``); ``state_of`` reuses the state
        directory of an earlier worker, as a restarted one would; ``env`` adds variables."""
        index = len(self.processes)
        log = (self.tmp_path / f"worker-{index}.log").open("wb")
        state = index if state_of is None else state_of
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pystreams",
                "worker",
                str(self.app),
                "--bootstrap-servers",
                self.bootstrap,
                "--coordinator",
                self.coordinator,
                "--state-dir",
                str(self.tmp_path / f"state-{state}"),
                "--commit-interval-ms",
                str(COMMIT_INTERVAL_MS),
                *extra_args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=None if env is None else {**os.environ, **env},
        )
        log.close()
        self.processes.append(process)
        return process

    def log_tails(self, lines: int = 25) -> str:
        """The end of every worker's log, for failure messages."""
        return "\n".join(f"--- worker {i} ---\n" + "\n".join(self.log(i).splitlines()[-lines:]) for i in range(len(self.processes)))

    def log(self, index: int) -> str:
        return (self.tmp_path / f"worker-{index}.log").read_text(errors="replace")

    def stop_all(self, indexes: Sequence[int] | None = None) -> list[int]:
        chosen = [self.processes[i] for i in (range(len(self.processes)) if indexes is None else indexes)]
        for process in chosen:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        codes = []
        for process in chosen:
            try:
                codes.append(process.wait(20))
            except subprocess.TimeoutExpired:
                process.kill()
                codes.append(process.wait())
        return codes


def counts_until(reader: Any, done: Callable[[dict[str, int]], bool], timeout_s: float) -> dict[str, int]:
    """Read ``reader`` (a ``LatestValueReader``) until ``done(counts)`` or the timeout; the last counts."""
    deadline = time.monotonic() + timeout_s
    counts: dict[str, int] = {}
    while time.monotonic() < deadline:
        counts = reader.read_more(0.3)
        if done(counts):
            return counts
    return counts


def fleet_of(workers: Workers) -> Iterator[Workers]:
    """For fixtures: yields the fleet, stops whatever still runs afterwards."""
    try:
        yield workers
    finally:
        workers.stop_all()


class Trickle:
    """Feeds lines to ``topic`` a few at a time from a thread, so input flows throughout."""

    def __init__(self, bootstrap: str, lines: list[str], *, topic: str = "text-lines", per_batch: int = 20, pause_s: float = 0.1) -> None:
        from pystreams.commands.dev import produce_lines

        self._produce = produce_lines
        self._bootstrap, self._topic, self._lines = bootstrap, topic, lines
        self._per_batch, self._pause_s = per_batch, pause_s
        self.sent = 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while self.sent < len(self._lines):
            batch = self._lines[self.sent : self.sent + self._per_batch]
            self._produce(self._bootstrap, self._topic, batch)
            self.sent += len(batch)
            time.sleep(self._pause_s)

    def join(self) -> None:
        self._thread.join(180)
        assert self.sent == len(self._lines)


class CommandTicker:
    """Keeps writing one small command per partition of ``tests/apps/ha_keys.py``'s input every
    50 ms, recording nothing: its progress topic tells which task processed what and when (the
    commands' versions start above ``FIRST_VERSION``)."""

    FIRST_VERSION = 1_000

    def __init__(self, bootstrap: str, partitions: int) -> None:
        from kafka import KafkaProducer

        self._producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
        self._partitions = partitions
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.sent = 0

    def _run(self) -> None:
        version = self.FIRST_VERSION
        while not self._stop.wait(0.05):
            version += 1
            for partition in range(self._partitions):
                self._producer.send(HA_KEYS_INPUT, key=b"tick", value=f"{partition * 1_000_000} 1 {version}".encode(), partition=partition)
                self.sent += 1

    def __enter__(self) -> CommandTicker:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()
        self._producer.flush()
        self._producer.close()


# --------------------------------------------------------------------------- windowed clicks

EXACTLY_ONCE = ("--processing-guarantee", "exactly_once_v2", "--commit-interval-ms", "100")
CLICK_PARTITIONS = 4
CLICK_USERS = [f"user-{n}" for n in range(10)]
#: The apps under test count clicks per tumbling window of this size and grace.
CLICK_WINDOW_MS = 200
CLICK_GRACE_MS = 100  # with grace, a restarted clock taken from the window store alone would lag: a real test of the kept stream time
CLICK_STEP_MS = 5  # event time between two input records
CLICK_RECORDS = 3_000
_LONG = struct.Struct(">q")


def planned_clicks() -> list[tuple[str, int]]:
    """(user, event time): increasing times, random users; then, per partition, one record far
    ahead so that every window of the data closes."""
    rng = random.Random(23)
    records = [(rng.choice(CLICK_USERS), 1_000 + i * CLICK_STEP_MS) for i in range(CLICK_RECORDS)]
    closing_time = records[-1][1] + 10 * CLICK_WINDOW_MS
    closers = {}
    for n in range(1_000):
        key = f"closer-{n}"
        closers.setdefault(partition_for_key(key.encode(), CLICK_PARTITIONS), key)
        if len(closers) == CLICK_PARTITIONS:
            break
    return records + [(key, closing_time) for key in closers.values()]


def expected_final_counts(records: list[tuple[str, int]]) -> dict[Windowed, int]:
    """Kafka Streams' answer: per partition (task), every window whose end + grace its stream
    time reached, with every record (times increase per partition: none is late)."""
    stream_time: dict[int, int] = collections.defaultdict(int)
    counts: collections.Counter[Windowed] = collections.Counter()
    for user, timestamp in records:
        partition = partition_for_key(user.encode(), CLICK_PARTITIONS)
        stream_time[partition] = max(stream_time[partition], timestamp)
        start = timestamp - timestamp % CLICK_WINDOW_MS
        counts[Windowed(user, start, start + CLICK_WINDOW_MS)] += 1
    return {w: n for w, n in counts.items() if w.end_ms + CLICK_GRACE_MS <= stream_time[partition_for_key(w.key.encode(), CLICK_PARTITIONS)]}


class ClickFeed:
    """Produces the planned records in order (each partition's times increase) from a thread,
    a few at a time, so input flows while workers die."""

    def __init__(self, bootstrap: str, topic: str, records: list[tuple[str, int]], per_batch: int = 25) -> None:
        self._producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
        self._topic, self._records, self._per_batch = topic, records, per_batch
        self.sent = 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while self.sent < len(self._records):
            for user, timestamp in self._records[self.sent : self.sent + self._per_batch]:
                self._producer.send(self._topic, key=user.encode(), value=b"click", timestamp_ms=timestamp)
            self._producer.flush()
            self.sent = min(len(self._records), self.sent + self._per_batch)
            time.sleep(0.2)

    def join(self) -> None:
        self._thread.join(180)
        self._producer.close()
        assert self.sent == len(self._records)


class FinalsReader:
    """Every windowed count written, ``read_committed`` behind the transaction filter."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self._consumer = CommittedConsumer(
            KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, auto_offset_reset="earliest", isolation_level="read_committed")
        )
        self._consumer.assign([KafkaTopicPartition(topic, p) for p in range(CLICK_PARTITIONS)])
        self._consumer.seek_to_beginning()
        self._key = serdes.WindowedKey(serdes.Text())
        self.finals: list[tuple[Windowed, int]] = []

    def read_more(self, timeout_s: float) -> None:
        for records in self._consumer.poll(timeout_ms=int(timeout_s * 1000)).values():
            for record in records:
                self.finals.append((self._key.deserialize(record.key), _LONG.unpack(record.value)[0]))

    def close(self) -> None:
        self._consumer.close()


def check_each_closed_windows_count_appears_once_through_kills(cluster: Cluster, tmp_path: Path, app: Path, source: str, sink: str) -> None:
    """Runs ``app`` (a count per ``CLICK_WINDOW_MS`` window, ``CLICK_GRACE_MS`` grace, one result
    per window from ``source`` to ``sink``) on two exactly-once workers while the planned clicks
    flow in; kills a worker four times, replacing it on its state directory, on its wiped state
    directory, and on a new one; then asserts every closed window's count appears exactly once
    in ``sink``, right, and no other window's."""
    ensure_input_topics(cluster.bootstrap, [source, sink], partitions=CLICK_PARTITIONS)
    records = planned_clicks()
    expected = expected_final_counts(records)
    workers = Workers(cluster.bootstrap, cluster.coordinator_address, tmp_path, app)
    reader = FinalsReader(cluster.bootstrap, sink)
    try:
        state_dir_of = [0, 1]  # each worker's state directory number
        for _ in range(2):
            workers.start(*EXACTLY_ONCE)
        wait_for(lambda: all("started tasks" in workers.log(i) for i in range(2)), 60, "both workers to start tasks")
        feed = ClickFeed(cluster.bootstrap, source, records)
        wait_for(lambda: (reader.read_more(0.3), bool(reader.finals))[1], 60, "the first final counts")
        for round_number in range(4):
            time.sleep(2.0)
            victim = random.Random(round_number).choice([i for i, p in enumerate(workers.processes) if p.poll() is None])
            workers.processes[victim].send_signal(signal.SIGKILL)
            workers.processes[victim].wait(10)
            if round_number == 1:  # the same pod, its volume wiped: state comes from the changelogs
                shutil.rmtree(tmp_path / f"state-{state_dir_of[victim]}", ignore_errors=True)
            if round_number == 3:  # a new machine, with an empty state directory of its own
                state_dir_of.append(len(workers.processes))
                workers.start(*EXACTLY_ONCE)
            else:  # a restarted pod on its state directory
                state_dir_of.append(state_dir_of[victim])
                workers.start(*EXACTLY_ONCE, state_of=state_dir_of[victim])
            reader.read_more(0.1)
        feed.join()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(reader.finals) < len(expected):
            reader.read_more(0.5)
        reader.read_more(2.0)  # anything repeated after the last expected final would show now
        windows = [windowed for windowed, _ in reader.finals]
        repeated = {w: n for w, n in collections.Counter(windows).items() if n > 1}
        repeats = {w: [n for windowed, n in reader.finals if windowed == w] for w in list(repeated)[:10]}
        assert not repeated, (
            f"final results repeated (their counts, in order; expected): {[(w, n, expected.get(w)) for w, n in repeats.items()]}\n" + workers.log_tails()
        )
        got = dict(reader.finals)
        missing = sorted(set(expected) - set(got), key=lambda w: (w.start_ms, w.key))
        assert not missing, f"{len(missing)} closed windows have no final result, e.g. {missing[:5]}\n" + workers.log_tails()
        wrong = {w: (got[w], expected[w]) for w in expected if got[w] != expected[w]}
        assert not wrong, f"wrong final counts (got, expected): {dict(list(wrong.items())[:10])}"
        assert set(got) == set(expected), f"finals for windows that never closed: {sorted(set(got) - set(expected), key=str)[:5]}"
    finally:
        reader.close()
        workers.stop_all()
    logs = "".join(workers.log(i) for i in range(len(workers.processes)))
    assert "fencing" in logs, "no takeover had to fence a killed owner: the scenario did not test takeovers"
    assert "Traceback" not in logs, workers.log_tails(80)
