"""Worker processes (``pystreams worker``) against the embedded broker and a real coordinator:
the word count of a known corpus is exact through scale-out and a graceful stop, at least
complete after a SIGKILL, and ``pystreams dev examples/wordcount.py`` checks itself end to end.

Each test has its own broker and coordinator: the app id (= group id) and topic names are the
example's, so sharing them between tests would mix their data.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from worker_support import Cluster, Workers, counts_until, fleet_of, wait_for

from pystreams.commands.dev import (
    CHECK_OK_PREFIX,
    LatestValueReader,
    count_words,
    ensure_input_topics,
    produce_lines,
)

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "examples" / "wordcount.py"
CORPUS = (ROOT / "examples" / "data" / "corpus.txt").read_text(encoding="utf-8").splitlines()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(bootstrap servers, coordinator address): a fresh broker and coordinator."""
    running = Cluster(tmp_path)
    try:
        ensure_input_topics(running.bootstrap, ["text-lines"], partitions=4)
        yield running.bootstrap, running.coordinator_address
    finally:
        running.stop()


@pytest.fixture
def workers(cluster: tuple[str, str], tmp_path: Path) -> Iterator[Workers]:
    yield from fleet_of(Workers(*cluster, tmp_path, APP))


def test_scale_out_and_graceful_stop_count_exactly(cluster: tuple[str, str], workers: Workers) -> None:
    bootstrap, _ = cluster
    half = len(CORPUS) // 2
    expected_first = count_words(CORPUS[:half])
    expected = count_words(CORPUS)
    workers.start()
    workers.start()
    produce_lines(bootstrap, "text-lines", CORPUS[:half])
    reader = LatestValueReader(bootstrap, "word-counts")
    try:
        # Two workers count the first half exactly.
        counts = counts_until(reader, lambda c: c == expected_first, 25)
        assert counts == dict(expected_first), "two workers did not count the first half exactly\n" + workers.log_tails()
        # Scale out mid-stream, then stop one of the first two gracefully (commit + leave -1).
        workers.start()
        produce_lines(bootstrap, "text-lines", CORPUS[half:])
        # The third worker must hold tasks before the stop, or this tests no scale-out.
        wait_for(lambda: "started tasks" in workers.log(2), 25, "the third worker to start tasks")
        workers.processes[0].send_signal(signal.SIGTERM)
        assert workers.processes[0].wait(20) == 0
        counts = counts_until(reader, lambda c: c == expected, 25)
        assert counts == dict(expected), {w: (counts.get(w), n) for w, n in expected.items() if counts.get(w) != n}
    finally:
        reader.close()
    assert "left the group (epoch -1)" in workers.log(0)
    assert workers.stop_all() == [0, 0, 0]


def test_sigkill_reprocesses_at_most_the_uncommitted_records(cluster: tuple[str, str], workers: Workers) -> None:
    """At-least-once: a SIGKILL-ed worker's tasks move on after the session timeout and the new
    owner reprocesses from the last commit, so counts may exceed the truth but never fall short;
    the excess is bounded by the records the killed worker could have left uncommitted (all of
    the first half, as a generous bound: it committed every 200 ms)."""
    bootstrap, _ = cluster
    half = len(CORPUS) // 2
    expected = count_words(CORPUS)
    first_half_words = sum(count_words(CORPUS[:half]).values())
    workers.start()
    workers.start()
    produce_lines(bootstrap, "text-lines", CORPUS[:half])
    reader = LatestValueReader(bootstrap, "word-counts")
    try:
        counts_until(reader, lambda c: sum(c.values()) > 0, 25)
        workers.processes[1].send_signal(signal.SIGKILL)
        assert workers.processes[1].wait(10) == -signal.SIGKILL
        produce_lines(bootstrap, "text-lines", CORPUS[half:])
        counts = counts_until(reader, lambda c: all(c.get(w, 0) >= n for w, n in expected.items()), 30)
    finally:
        reader.close()
    short = {w: (counts.get(w, 0), n) for w, n in expected.items() if counts.get(w, 0) < n}
    assert not short, f"words counted fewer times than they occur: {short}"
    assert set(counts) == set(expected)
    excess = sum(counts.values()) - sum(expected.values())
    assert 0 <= excess <= first_half_words
    assert workers.stop_all()[0] == 0


@pytest.mark.parametrize("role", ["broker", "coordinator"])
def test_pystreams_dev_with_a_port_taken_says_which_and_how_to_choose_another_and_starts_nothing(role: str) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = holder.getsockname()[1]
        ports = {"broker": ["--broker-port", str(taken), "--coordinator-port", "0"], "coordinator": ["--broker-port", "0", "--coordinator-port", str(taken)]}[
            role
        ]
        result = subprocess.run([sys.executable, "-m", "pystreams", "dev", *ports], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 1
    assert result.stdout == ""  # no broker was started, so none is stopped
    assert result.stderr.splitlines() == [
        f"pystreams dev: port {taken} on 127.0.0.1, the {role}'s, is taken ("
        + ("another `pystreams dev`, or a Kafka broker?" if role == "broker" else "another `pystreams dev` or `pystreams coordinator`?")
        + f"); choose another with --{role}-port PORT, or --{role}-port 0 for a free one"
    ]


def test_pystreams_dev_counts_the_corpus_end_to_end() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "pystreams", "dev", str(APP), "--broker-port", "0", "--listen", "127.0.0.1:0", "--timeout-s", "40"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert CHECK_OK_PREFIX in result.stdout
    assert "worker 0: exited with status 0" in result.stdout
    assert "worker 1: exited with status 0" in result.stdout


WINDOWED_APP = """
from datetime import timedelta
from pystreams import serdes
from pystreams.app import App, TumblingWindow
app = App("windowed_partitions")
visits = app.topic("visits", key=serdes.Text(), value=serdes.Text())
visits.count(store="per-minute", window=TumblingWindow(size=timedelta(minutes=1))).to("visits-per-minute")
"""


def test_a_workers_windowed_results_are_partitioned_by_the_user_key(tmp_path: Path) -> None:
    from kafka import KafkaConsumer, KafkaProducer
    from pystreams.topology.kernels import partition_for_key

    from pystreams.serdes import Text, WindowedKey

    (tmp_path / "windowed.py").write_text(WINDOWED_APP)
    users = [f"user-{n}" for n in range(20)]
    running = Cluster(tmp_path)
    try:
        ensure_input_topics(running.bootstrap, ["visits"], partitions=2)
        ensure_input_topics(running.bootstrap, ["visits-per-minute"], partitions=4)
        producer = KafkaProducer(bootstrap_servers=running.bootstrap)
        for minute in range(3):
            for user in users:
                producer.send("visits", key=user.encode(), value=b"/", timestamp_ms=1_700_000_040_000 + minute * 60_000)
        producer.close()
        for workers in fleet_of(Workers(running.bootstrap, running.coordinator_address, tmp_path, tmp_path / "windowed.py")):
            workers.start()
            consumer = KafkaConsumer("visits-per-minute", bootstrap_servers=running.bootstrap, group_id=None, auto_offset_reset="earliest")
            placed: dict[str, set[int]] = {}
            windows: set[tuple[str, int]] = set()
            deadline = time.monotonic() + 60
            while len(windows) < 3 * len(users) and time.monotonic() < deadline:
                for records in consumer.poll(timeout_ms=300).values():
                    for record in records:
                        windowed = WindowedKey(Text()).deserialize(record.key)
                        placed.setdefault(windowed.key, set()).add(record.partition)
                        windows.add((windowed.key, windowed.start_ms))
            consumer.close()
            assert len(windows) == 3 * len(users), workers.log_tails()
    finally:
        running.stop()
    # Every window of a user in the partition of the user key alone (WindowedStreamPartitioner).
    assert placed == {user: {partition_for_key(user.encode(), 4)} for user in users}


def test_with_production_heartbeats_a_joining_worker_runs_tasks_without_waiting_for_an_interval(tmp_path: Path) -> None:
    # The coordinator's defaults: 5 s heartbeats, 45 s sessions. Every step of the rebalance
    # waited for a heartbeat: the stable worker heard of the joiner only at its next one, so the
    # joiner ran its first task 6-11 s after it started. Now the stable worker learns from its
    # next commit (each second) and each later step takes a round trip. The bound is generous:
    # the figure lives in benchmarks/, not here.
    cluster = Cluster(tmp_path, group_args=())
    fleet = Workers(cluster.bootstrap, cluster.coordinator_address, tmp_path, APP)
    try:
        ensure_input_topics(cluster.bootstrap, ["text-lines"], partitions=4)
        fleet.start()
        wait_for(lambda: "started tasks" in fleet.log(0), 30, "the first worker to start its tasks")
        # A running group: lines keep coming, so the first worker keeps committing.
        stop_feeding = threading.Event()
        feeder = threading.Thread(target=_feed_lines, args=(cluster.bootstrap, stop_feeding), daemon=True)
        feeder.start()
        time.sleep(0.5)  # past the first worker's own first heartbeats: it is stable
        started = time.monotonic()
        fleet.start()
        try:
            wait_for(lambda: "started tasks" in fleet.log(1), 30, "the joining worker to start tasks")
        finally:
            stop_feeding.set()
            feeder.join(5)
        took = time.monotonic() - started
        assert took < 4.0, f"the joiner's first task took {took:.1f} s\n" + fleet.log_tails()
        assert fleet.stop_all() == [0, 0]
    finally:
        for process in fleet.processes:
            if process.poll() is None:
                process.kill()
        cluster.stop()


def _feed_lines(bootstrap: str, stop: threading.Event) -> None:
    """A line every 50 ms until ``stop`` (at most 60 s)."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap)
    try:
        for number in range(1_200):
            if stop.wait(0.05):
                break
            producer.send("text-lines", key=str(number).encode(), value=CORPUS[number % len(CORPUS)].encode("utf-8"))
    finally:
        producer.close()
