"""Emit-final with real processes under exactly-once: a windowed count whose workers are
SIGKILLed mid-stream and replaced (on the same state directory, and on a wiped one) writes
every closed window's final count exactly once, and right, as ``read_committed`` readers see
it — the final results and the stream time that says which are out commit together."""

from __future__ import annotations

import collections
import random
import shutil
import signal
import struct
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KafkaTopicPartition
from pystreams.topology.kernels import partition_for_key
from pystreams.topology.windows import Windowed
from worker_support import Cluster, Workers, wait_for

from pystreams import serdes
from pystreams.commands.dev import ensure_input_topics
from pystreams.worker.committed_consumer import CommittedConsumer

pytestmark = pytest.mark.integration

EXACTLY_ONCE = ("--processing-guarantee", "exactly_once_v2", "--commit-interval-ms", "100")
PARTITIONS = 4
USERS = [f"user-{n}" for n in range(10)]
WINDOW_MS = 200
GRACE_MS = 100  # with grace, a restarted clock taken from the window store alone would lag: a real test of the kept stream time
STEP_MS = 5  # event time between two input records
RECORDS = 3_000
_LONG = struct.Struct(">q")

APP_TEMPLATE = """
import pystreams as ps

app = ps.App({app_id!r})
clicks = app.topic({source!r}, value=ps.serdes.Text())
app.count(clicks, store="clicks-per-window", window=ps.TumblingWindow(size={window}, grace={grace}), emit="final").to({sink!r})
"""


class EmitFinalApp:
    def __init__(self, tmp_path: Path) -> None:
        run = uuid.uuid4().hex[:8]
        self.app_id, self.source, self.sink = f"emit-final-{run}", f"clicks-{run}", f"final-counts-{run}"
        self.path = tmp_path / "emit_final_app.py"
        self.path.write_text(APP_TEMPLATE.format(app_id=self.app_id, source=self.source, sink=self.sink, window=WINDOW_MS, grace=GRACE_MS))


def planned_input() -> list[tuple[str, int]]:
    """(user, event time): increasing times, random users; then, per partition, one record far
    ahead so that every window of the data closes."""
    rng = random.Random(23)
    records = [(rng.choice(USERS), 1_000 + i * STEP_MS) for i in range(RECORDS)]
    closing_time = records[-1][1] + 10 * WINDOW_MS
    closers = {}
    for n in range(1_000):
        key = f"closer-{n}"
        closers.setdefault(partition_for_key(key.encode(), PARTITIONS), key)
        if len(closers) == PARTITIONS:
            break
    return records + [(key, closing_time) for key in closers.values()]


def expected_finals(records: list[tuple[str, int]]) -> dict[Windowed, int]:
    """Kafka Streams' answer: per partition (task), every window whose end + grace its stream
    time reached, with every record (times increase per partition: none is late)."""
    stream_time: dict[int, int] = collections.defaultdict(int)
    counts: collections.Counter[Windowed] = collections.Counter()
    for user, timestamp in records:
        partition = partition_for_key(user.encode(), PARTITIONS)
        stream_time[partition] = max(stream_time[partition], timestamp)
        start = timestamp - timestamp % WINDOW_MS
        counts[Windowed(user, start, start + WINDOW_MS)] += 1
    return {w: n for w, n in counts.items() if w.end_ms + GRACE_MS <= stream_time[partition_for_key(w.key.encode(), PARTITIONS)]}


class Feed:
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
    """Every final result written, ``read_committed`` behind the transaction filter."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self._consumer = CommittedConsumer(
            KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, auto_offset_reset="earliest", isolation_level="read_committed")
        )
        self._consumer.assign([KafkaTopicPartition(topic, p) for p in range(PARTITIONS)])
        self._consumer.seek_to_beginning()
        self._key = serdes.WindowedKey(serdes.Text())
        self.finals: list[tuple[Windowed, int]] = []

    def read_more(self, timeout_s: float) -> None:
        for records in self._consumer.poll(timeout_ms=int(timeout_s * 1000)).values():
            for record in records:
                self.finals.append((self._key.deserialize(record.key), _LONG.unpack(record.value)[0]))

    def close(self) -> None:
        self._consumer.close()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    running = Cluster(tmp_path, log="kafka")
    try:
        yield running
    finally:
        running.stop()


@pytest.mark.slow
def test_each_closed_windows_final_count_appears_once_and_right_through_worker_kills(cluster: Cluster, tmp_path: Path) -> None:
    app = EmitFinalApp(tmp_path)
    ensure_input_topics(cluster.bootstrap, [app.source, app.sink], partitions=PARTITIONS)
    records = planned_input()
    expected = expected_finals(records)
    workers = Workers(cluster.bootstrap, cluster.coordinator_address, tmp_path, app.path)
    reader = FinalsReader(cluster.bootstrap, app.sink)
    try:
        state_dir_of = [0, 1]  # each worker's state directory number
        for _ in range(2):
            workers.start(*EXACTLY_ONCE)
        wait_for(lambda: all("started tasks" in workers.log(i) for i in range(2)), 60, "both workers to start tasks")
        feed = Feed(cluster.bootstrap, app.source, records)
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
        assert not repeated, f"final results repeated: {dict(list(repeated.items())[:10])}\n" + workers.log_tails()
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
