"""Worker processes when things go wrong around them: a coordinator that is away for a while, a
static worker restarted right after a SIGKILL. Real processes on the embedded broker; the
coordinator keeps its records in Kafka so it can be killed and started again.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from worker_support import Cluster, Trickle, Workers, fleet_of, wait_for

from pystreams.commands.dev import LatestValueReader, count_words, ensure_input_topics, produce_lines

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "examples" / "wordcount.py"
CORPUS = (ROOT / "examples" / "data" / "corpus.txt").read_text(encoding="utf-8").splitlines()


#: Sessions of 8 s, not the usual 3: a worker restarted after a SIGKILL must join while its old
#: session still runs, and on a busy CI machine a Python process can take 3 s to get there.
GROUP_ARGS = ("--heartbeat-interval-ms", "300", "--session-timeout-ms", "8000", "--metadata-refresh-ms", "500")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    running = Cluster(tmp_path, log="kafka", group_args=GROUP_ARGS)
    try:
        ensure_input_topics(running.bootstrap, ["text-lines"], partitions=4)
        yield running
    finally:
        running.stop()


@pytest.fixture
def workers(cluster: Cluster, tmp_path: Path) -> Iterator[Workers]:
    yield from fleet_of(Workers(cluster.bootstrap, cluster.coordinator_address, tmp_path, APP))


def read_until(reader: LatestValueReader, expected: dict[str, int], timeout_s: float) -> dict[str, int]:
    deadline = time.monotonic() + timeout_s
    counts: dict[str, int] = {}
    while time.monotonic() < deadline and counts != expected:
        counts = reader.read_more(0.3)
    return counts


def test_workers_keep_processing_while_the_coordinator_is_away_and_commit_once_it_is_back(cluster: Cluster, workers: Workers) -> None:
    expected = dict(count_words(CORPUS))
    workers.start()
    workers.start()
    reader = LatestValueReader(cluster.bootstrap, "word-counts")
    try:
        wait_for(lambda: all("started tasks" in workers.log(i) for i in range(2)), 30, "both workers to start tasks")
        trickle = Trickle(cluster.bootstrap, CORPUS)
        wait_for(lambda: sum(reader.read_more(0.2).values()) > 0, 30, "the first counts")
        # Frozen (requests hang, as behind a dead pod's address) for less than a session...
        assert cluster.coordinator is not None
        cluster.coordinator.send_signal(signal.SIGSTOP)
        before = sum(reader.read_more(0.2).values())
        time.sleep(2.0)
        during_freeze = sum(reader.read_more(0.3).values())
        cluster.coordinator.send_signal(signal.SIGCONT)
        # ...then gone (connections refused) and started again from its log.
        cluster.kill_coordinator()
        after_freeze = sum(reader.read_more(0.2).values())
        time.sleep(3.0)
        during_outage = sum(reader.read_more(0.3).values())
        cluster.start_coordinator()
        trickle.join()
        counts = read_until(reader, expected, 60)
    finally:
        reader.close()
    assert during_freeze > before, "output stopped while the coordinator hung\n" + workers.log_tails()
    assert during_outage > after_freeze, "output stopped while the coordinator was down\n" + workers.log_tails()
    assert counts == expected, {w: (counts.get(w), n) for w, n in expected.items() if counts.get(w) != n}
    logs = workers.log(0) + workers.log(1)
    assert "Traceback" not in logs, workers.log_tails(60)
    assert "processing goes on and the next commit retries" in logs  # said as a warning, once
    assert workers.stop_all() == [0, 0]


def test_a_static_worker_restarted_after_sigkill_waits_for_its_old_session_and_takes_its_tasks_back(cluster: Cluster, workers: Workers) -> None:
    expected = dict(count_words(CORPUS))
    half = len(CORPUS) // 2
    workers.start("--instance-id", "counter-0")
    reader = LatestValueReader(cluster.bootstrap, "word-counts")
    try:
        wait_for(lambda: "started tasks" in workers.log(0), 30, "the worker to start tasks")
        produce_lines(cluster.bootstrap, "text-lines", CORPUS[:half])
        wait_for(lambda: sum(reader.read_more(0.2).values()) > 0, 30, "the first counts")
        workers.processes[0].send_signal(signal.SIGKILL)
        workers.processes[0].wait(10)
        # Restarted at once, on the same state directory, as a StatefulSet pod would be (the
        # later --state-dir wins over the one the harness gives each new process).
        again = workers.start("--instance-id", "counter-0", "--state-dir", str(workers.tmp_path / "state-0"))
        produce_lines(cluster.bootstrap, "text-lines", CORPUS[half:])
        wait_for(lambda: "started tasks" in workers.log(1), 30, "the restarted worker to take its tasks back")
        assert again.poll() is None, "the restarted worker exited\n" + workers.log_tails()
        counts = read_until(reader, expected, 40)
    finally:
        reader.close()
    assert "still held by this worker's previous incarnation" in workers.log(1)
    short = {w: (counts.get(w, 0), n) for w, n in expected.items() if counts.get(w, 0) < n}
    assert not short, f"words counted fewer times than they occur: {short}\n" + workers.log_tails()
    assert workers.stop_all([1]) == [0]
