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
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pystreams.broker import EmbeddedBroker, free_port
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
COMMIT_INTERVAL_MS = 200


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(bootstrap servers, coordinator address): a fresh broker and coordinator."""
    broker = EmbeddedBroker(port=None)
    broker.start()
    port = free_port()
    log = (tmp_path / "coordinator.log").open("wb")
    coordinator = subprocess.Popen(
        [sys.executable, "-m", "pystreams", "coordinator", "--log", "memory",
         "--bootstrap-servers", broker.bootstrap_servers, "--listen", f"127.0.0.1:{port}",
         "--heartbeat-interval-ms", "300", "--session-timeout-ms", "3000", "--metadata-refresh-ms", "500"],
        stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        _wait(lambda: _listening(port), 20, "the coordinator to listen")
        ensure_input_topics(broker.bootstrap_servers, ["text-lines"], partitions=4)
        yield broker.bootstrap_servers, f"127.0.0.1:{port}"
    finally:
        coordinator.terminate()
        try:
            coordinator.wait(10)
        except subprocess.TimeoutExpired:
            coordinator.kill()
        log.close()
        broker.stop()


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def _wait(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


class Workers:
    def __init__(self, bootstrap: str, coordinator: str, tmp_path: Path) -> None:
        self.bootstrap, self.coordinator, self.tmp_path = bootstrap, coordinator, tmp_path
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(self) -> subprocess.Popen[bytes]:
        index = len(self.processes)
        log = (self.tmp_path / f"worker-{index}.log").open("wb")
        process = subprocess.Popen(
            [sys.executable, "-m", "pystreams", "worker", str(APP), "--bootstrap-servers", self.bootstrap,
             "--coordinator", self.coordinator, "--state-dir", str(self.tmp_path / f"state-{index}"),
             "--commit-interval-ms", str(COMMIT_INTERVAL_MS)],
            stdout=log, stderr=subprocess.STDOUT,
        )
        log.close()
        self.processes.append(process)
        return process

    def log_tails(self, lines: int = 25) -> str:
        """The end of every worker's log, for failure messages."""
        return "\n".join(
            f"--- worker {i} ---\n" + "\n".join(self.log(i).splitlines()[-lines:]) for i in range(len(self.processes))
        )

    def log(self, index: int) -> str:
        return (self.tmp_path / f"worker-{index}.log").read_text(errors="replace")

    def stop_all(self) -> list[int]:
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        codes = []
        for process in self.processes:
            try:
                codes.append(process.wait(20))
            except subprocess.TimeoutExpired:
                process.kill()
                codes.append(process.wait())
        return codes


@pytest.fixture
def workers(cluster: tuple[str, str], tmp_path: Path) -> Iterator[Workers]:
    fleet = Workers(*cluster, tmp_path)
    try:
        yield fleet
    finally:
        fleet.stop_all()


def _counts_until(reader: LatestValueReader, done: Callable[[dict[str, int]], bool], timeout_s: float) -> dict[str, int]:
    deadline = time.monotonic() + timeout_s
    counts: dict[str, int] = {}
    while time.monotonic() < deadline:
        counts = reader.read_more(0.3)
        if done(counts):
            return counts
    return counts


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
        counts = _counts_until(reader, lambda c: c == expected_first, 25)
        assert counts == dict(expected_first), "two workers did not count the first half exactly\n" + workers.log_tails()
        # Scale out mid-stream, then stop one of the first two gracefully (commit + leave -1).
        workers.start()
        produce_lines(bootstrap, "text-lines", CORPUS[half:])
        # The third worker must hold tasks before the stop, or this tests no scale-out.
        _wait(lambda: "started tasks" in workers.log(2), 25, "the third worker to start tasks")
        workers.processes[0].send_signal(signal.SIGTERM)
        assert workers.processes[0].wait(20) == 0
        counts = _counts_until(reader, lambda c: c == expected, 25)
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
        _counts_until(reader, lambda c: sum(c.values()) > 0, 25)
        workers.processes[1].send_signal(signal.SIGKILL)
        assert workers.processes[1].wait(10) == -signal.SIGKILL
        produce_lines(bootstrap, "text-lines", CORPUS[half:])
        counts = _counts_until(reader, lambda c: all(c.get(w, 0) >= n for w, n in expected.items()), 30)
    finally:
        reader.close()
    short = {w: (counts.get(w, 0), n) for w, n in expected.items() if counts.get(w, 0) < n}
    assert not short, f"words counted fewer times than they occur: {short}"
    assert set(counts) == set(expected)
    excess = sum(counts.values()) - sum(expected.values())
    assert 0 <= excess <= first_half_words
    assert workers.stop_all()[0] == 0


def test_pystreams_dev_counts_the_corpus_end_to_end() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "pystreams", "dev", str(APP), "--broker-port", "0", "--listen", "127.0.0.1:0",
         "--timeout-s", "40"],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert CHECK_OK_PREFIX in result.stdout
    assert "worker 0: exited with status 0" in result.stdout
    assert "worker 1: exited with status 0" in result.stdout
