"""The worker's operational surface: /healthz, /readyz and /metrics (``--http-port``), restore
and replica progress in metrics and logs, and the settings around them.

Unit tests drive the routes and the collector with stand-in stream threads; the integration
test runs real ``pystreams worker`` processes against the embedded broker and a coordinator."""

from __future__ import annotations

import asyncio
import logging
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from pystreams.state import RestoreProgress, TopicPartition
from pystreams.topology.ir import TaskId
from worker_support import Cluster, wait_for

from pystreams.broker import free_port
from pystreams.commands.worker import _client_tags_from_env
from pystreams.worker.engine import EngineCounters
from pystreams.worker.http import HttpSite, OperationsRoutes
from pystreams.worker.metrics import THREAD_STATES, WorkerMetrics
from pystreams.worker.process import WorkerSettings, leaves_for_good
from pystreams.worker.progress import LagSnapshot, ReplicaProgressLog, RestoreTracker

ROOT = Path(__file__).resolve().parent.parent
DEMO_APP = ROOT / "deploy" / "base" / "app.py"


# -- stand-ins -------------------------------------------------------------------------------------


@dataclass
class FakeEngine:
    counters: EngineCounters = field(default_factory=EngineCounters)
    records_produced: int = 0
    standby_tasks: dict = field(default_factory=dict)
    transactions_committed: int = 0
    transactions_aborted: int = 0
    aborted_records_dropped: int = 0
    #: The process's global tables (none here).
    global_tables: Any = None


@dataclass
class FakeThread:
    name: str
    engine: FakeEngine = field(default_factory=FakeEngine)
    records_processed: int = 0
    lags: LagSnapshot = field(default_factory=LagSnapshot)
    restores: RestoreTracker = field(default_factory=RestoreTracker)
    restoring: frozenset = frozenset()
    state: str = "running"
    running_tasks: frozenset = frozenset()
    ready: bool = True


def _serve(threads, state_dir: Path, *, started=lambda: True):
    """Run the operations routes on a loop in this thread; returns (get, close)."""
    loop = asyncio.new_event_loop()
    metrics = WorkerMetrics()
    routes = OperationsRoutes(threads, metrics, started=started)
    metrics.watch(threads, state_dir, "app", routes.ready)
    site = HttpSite("127.0.0.1", 0, routes.routes())
    loop.run_until_complete(site.start())

    async def fetch(path: str) -> tuple[int, str]:
        reader, writer = await asyncio.open_connection("127.0.0.1", site.port)
        writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        raw = await reader.read()
        writer.close()
        head, _, body = raw.partition(b"\r\n\r\n")
        return int(head.split()[1]), body.decode()

    def get(path: str) -> tuple[int, str]:
        return loop.run_until_complete(fetch(path))

    def close() -> None:
        loop.run_until_complete(site.stop())
        loop.close()

    return get, close, metrics


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value for family in text_string_to_metric_families(text) for sample in family.samples}


# -- probes ------------------------------------------------------------------------------------------


def test_readyz_and_healthz_follow_the_stream_threads(tmp_path: Path) -> None:
    threads = [FakeThread("stream-thread-0"), FakeThread("stream-thread-1")]
    started = {"done": False}
    get, close, _ = _serve(threads, tmp_path, started=lambda: started["done"])
    try:
        assert get("/readyz") == (503, "starting: joining the group\n")
        started["done"] = True
        assert get("/readyz") == (200, "ready\n")
        threads[1].ready, threads[1].state = False, "restoring"
        assert get("/readyz") == (503, "not ready (stream-thread-1: restoring)\n")
        assert get("/healthz") == (200, "ok\n")  # restoring is alive
        threads[1].state = "dead"
        status, body = get("/healthz")
        assert status == 503 and "stream-thread-1" in body
        assert get("/nothing")[0] == 404
    finally:
        close()


def test_metrics_expose_what_the_threads_hold(tmp_path: Path) -> None:
    thread = FakeThread("stream-thread-0")
    thread.engine.counters = EngineCounters(
        polls=9, records_consumed=120, process_seconds=0.5, standby_records=33, task_migrations=2, tasks_revived=3, dropped_records={"null-key": 6, "late": 2}
    )
    thread.engine.records_produced = 77
    thread.engine.transactions_committed, thread.engine.transactions_aborted = 41, 4
    thread.engine.aborted_records_dropped = 17
    thread.engine.standby_tasks = {TaskId(0, 2): object()}
    thread.records_processed = 125
    thread.running_tasks = frozenset({TaskId(0, 0), TaskId(0, 1)})
    thread.lags = LagSnapshot(active={TaskId(0, 0): 5, TaskId(0, 1): 0}, replicas={TaskId(0, 2): 40, TaskId(0, 3): 1}, warmups=frozenset({TaskId(0, 3)}))
    thread.restoring = frozenset({TaskId(0, 4)})
    changelog = TopicPartition("app-counts-changelog", 4)
    thread.restores(RestoreProgress("0_4", "counts", changelog, 0, 0, 1000, False))
    thread.restores(RestoreProgress("0_4", "counts", changelog, 250, 250, 1000, False))
    thread.state = "restoring"
    (tmp_path / "app" / "0_0" / "counts").mkdir(parents=True)
    (tmp_path / "app" / "0_0" / "counts" / "000001.sst").write_bytes(b"x" * 1234)
    (tmp_path / "app" / "0_0" / ".checkpoint").write_bytes(b"y" * 10)
    thread.ready = False
    get, close, metrics = _serve([thread], tmp_path)
    try:
        metrics.commit_latency.labels("stream-thread-0").observe(0.02)
        status, body = get("/metrics")
    finally:
        close()
    assert status == 200
    s = _samples(body)
    t = (("thread", "stream-thread-0"),)
    assert s[("pystreams_records_consumed_total", t)] == 120
    assert s[("pystreams_records_processed_total", t)] == 125
    assert s[("pystreams_records_produced_total", t)] == 77
    assert s[("pystreams_process_latency_seconds_count", t)] == 125
    assert s[("pystreams_process_latency_seconds_sum", t)] == 0.5
    assert s[("pystreams_standby_records_total", t)] == 33
    assert s[("pystreams_task_lag_records", (("task", "0_0"), *t))] == 5
    assert s[("pystreams_standby_lag_records", (("kind", "standby"), ("task", "0_2"), *t))] == 40
    assert s[("pystreams_standby_lag_records", (("kind", "warmup"), ("task", "0_3"), *t))] == 1
    assert s[("pystreams_restore_records_total", t)] == 250
    assert s[("pystreams_restore_remaining_records", (("store", "counts"), ("task", "0_4"), *t))] == 750
    assert s[("pystreams_restoring_tasks", t)] == 1
    assert s[("pystreams_active_tasks", t)] == 2
    assert s[("pystreams_standby_tasks", t)] == 1
    for state in THREAD_STATES:
        assert s[("pystreams_stream_thread_state", (("state", state), *t))] == (1.0 if state == "restoring" else 0.0)
    assert s[("pystreams_state_bytes", (("task", "0_0"),))] == 1244
    assert s[("pystreams_state_volume_free_bytes", ())] > 0
    assert s[("pystreams_worker_ready", ())] == 0
    assert s[("pystreams_commit_latency_seconds_count", t)] == 1
    assert s[("pystreams_transactions_committed_total", t)] == 41
    assert s[("pystreams_transactions_aborted_total", t)] == 4
    assert s[("pystreams_task_migrations_total", t)] == 2
    assert s[("pystreams_tasks_revived_total", t)] == 3
    assert s[("pystreams_aborted_records_dropped_total", t)] == 17
    assert s[("pystreams_dropped_records_total", (("reason", "null-key"), *t))] == 6
    assert s[("pystreams_dropped_records_total", (("reason", "late"), *t))] == 2
    assert ("process_cpu_seconds_total", ()) in s


# -- progress ---------------------------------------------------------------------------------------


def test_restore_tracker_counts_each_record_once_and_forgets_finished_stores(caplog) -> None:
    tracker = RestoreTracker()
    a, b = TopicPartition("c", 0), TopicPartition("c", 1)
    with caplog.at_level(logging.INFO, logger="pystreams.state.restore"):
        tracker(RestoreProgress("0_0", "s", a, 0, 100, 300, False))
        tracker(RestoreProgress("0_0", "s", a, 120, 220, 300, False))
        tracker(RestoreProgress("0_1", "s", b, 0, None, 50, False))
        assert tracker.records_restored == 120
        assert dict(tracker.remaining()) == {("0_0", "s"): 80, ("0_1", "s"): 50}
        tracker(RestoreProgress("0_0", "s", a, 200, 300, 300, True))
        assert tracker.records_restored == 200
        assert dict(tracker.remaining()) == {("0_1", "s"): 50}
        # A later restore of the same store counts from zero again.
        tracker(RestoreProgress("0_0", "s", a, 0, 300, 310, False))
        tracker(RestoreProgress("0_0", "s", a, 10, 310, 310, True))
        assert tracker.records_restored == 210
    assert "restoring c-0 from offset 100 to 300" in caplog.text
    assert "restored 200 records from c-0" in caplog.text


def test_replica_progress_is_logged_when_it_starts_moves_and_catches_up(caplog) -> None:
    now = [0.0]
    progress = ReplicaProgressLog("stream-thread-0", clock=lambda: now[0])
    standby, warmup = TaskId(0, 1), TaskId(0, 2)
    with caplog.at_level(logging.INFO, logger="pystreams.worker.progress"):
        progress.observe({standby: 1000, warmup: 0}, frozenset({warmup}), 0)
        now[0] = 5.0
        progress.observe({standby: 600, warmup: 0}, frozenset({warmup}), 400)  # too soon to log again
        now[0] = 10.0
        progress.observe({standby: 200, warmup: 0}, frozenset({warmup}), 800)
        now[0] = 11.0
        progress.observe({standby: 0, warmup: 0}, frozenset({warmup}), 1000)
        progress.observe({standby: 0}, frozenset(), 1000)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "stream-thread-0: standby 0_1 catching up: 1000 records behind its changelogs",
        "stream-thread-0: standby 0_1 catching up: 200 records behind (was 1000; 80 records/s; 800 applied to replicas so far)",
        "stream-thread-0: standby 0_1 caught up with its changelogs",
    ]


# -- settings ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ('pystreams.io/leave-group="true"\nother="x"\n', True),
        ('kubectl.kubernetes.io/restartedAt="2026-01-01T00:00:00Z"\npystreams.io/leave-group="TRUE"\n', True),
        ('pystreams.io/leave-group="false"\n', False),
        ('other="pystreams.io/leave-group=true"\n', False),
        ("", False),
    ],
)
def test_pod_annotations_decide_a_permanent_leave(tmp_path: Path, content: str, expected: bool) -> None:
    path = tmp_path / "annotations"
    path.write_text(content)
    assert leaves_for_good(str(path)) is expected


def test_unreadable_annotations_mean_a_temporary_leave(tmp_path: Path, caplog) -> None:
    assert leaves_for_good(None) is False
    assert leaves_for_good(str(tmp_path / "missing")) is False
    assert "cannot read pod annotations" in caplog.text


def test_client_tags_from_the_environment_skip_empty_values(capsys) -> None:
    assert _client_tags_from_env("zone=,rack=r1") == {"rack": "r1"}
    assert "client tag 'zone' has no value" in capsys.readouterr().err
    assert _client_tags_from_env("") == {}
    with pytest.raises(ValueError, match="PYSTREAMS_CLIENT_TAGS"):
        _client_tags_from_env("zone")


def test_http_port_must_differ_from_the_user_endpoint() -> None:
    with pytest.raises(ValueError, match="must differ"):
        WorkerSettings(app="a.py", bootstrap_servers="b", coordinator="c", user_endpoint="h:9400", http_port=9400)
    WorkerSettings(app="a.py", bootstrap_servers="b", coordinator="c", user_endpoint="h:7070", http_port=9400)


# -- a real worker ----------------------------------------------------------------------------------


def _get(port: int, path: str) -> tuple[int | None, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
    except OSError as error:
        return None, str(error)


def _value(body: str, name: str) -> float:
    return sum(s.value for f in text_string_to_metric_families(body) for s in f.samples if s.name == name)


@pytest.mark.integration
def test_a_worker_reports_readiness_throughput_and_restores(tmp_path: Path) -> None:
    from kafka import KafkaProducer

    from pystreams.commands.dev import ensure_input_topics

    cluster = Cluster(tmp_path)
    processes: list[subprocess.Popen[bytes]] = []

    def start(name: str, state: Path) -> tuple[subprocess.Popen[bytes], int, Path]:
        port = free_port()
        log = tmp_path / f"{name}.log"
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pystreams",
                "worker",
                str(DEMO_APP),
                "--bootstrap-servers",
                cluster.bootstrap,
                "--coordinator",
                cluster.coordinator_address,
                "--state-dir",
                str(state),
                "--http-port",
                str(port),
                "--http-host",
                "127.0.0.1",
                "--commit-interval-ms",
                "200",
            ],
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
        )
        processes.append(process)
        return process, port, log

    try:
        ensure_input_topics(cluster.bootstrap, ["events", "event-counts"], partitions=2)
        first, port, log = start("first", tmp_path / "state-first")
        wait_for(lambda: _get(port, "/healthz")[0] == 200, 20, "the first worker's HTTP endpoint")
        wait_for(lambda: _get(port, "/readyz")[0] == 200, 30, "the first worker to be ready")
        # Ready means "what the assignment gives me runs": wait for the assignment with the tasks
        # (the first one may be computed before the coordinator's metadata has the new topics).
        wait_for(lambda: _value(_get(port, "/metrics")[1], "pystreams_active_tasks") == 2, 30, "both tasks to run")
        assert _get(port, "/readyz")[0] == 200
        producer = KafkaProducer(bootstrap_servers=cluster.bootstrap)
        for n in range(500):
            producer.send("events", key=f"k{n % 25}".encode(), value=b"x")
        producer.flush()
        producer.close()
        wait_for(lambda: _value(_get(port, "/metrics")[1], "pystreams_records_consumed_total") == 500, 30, "the first worker to consume the 500 records")
        body = _get(port, "/metrics")[1]
        assert _value(body, "pystreams_records_processed_total") == 500
        assert _value(body, "pystreams_worker_ready") == 1
        assert _value(body, "pystreams_active_tasks") == 2
        assert _value(body, "pystreams_state_bytes") > 0
        first.send_signal(signal.SIGTERM)
        assert first.wait(30) == 0
        # A worker on an empty state directory restores every changelog record, and says so.
        second, port, log = start("second", tmp_path / "state-second")
        wait_for(lambda: _get(port, "/readyz")[0] == 200, 60, "the second worker to restore and be ready")
        body = _get(port, "/metrics")[1]
        restored = _value(body, "pystreams_restore_records_total")
        assert restored > 0
        text = log.read_text()
        assert restored == sum(int(n) for n in re.findall(r"\(restored (\d+) records\)", text))
        assert re.search(r"task 0_\d store counts: restoring pystreams-demo-counts-changelog-\d from offset None", text)
        assert _value(body, "pystreams_restoring_tasks") == 0
        assert _value(body, "pystreams_rebalance_duration_seconds_count") >= 1
        second.send_signal(signal.SIGTERM)
        assert second.wait(30) == 0
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
        cluster.stop()
