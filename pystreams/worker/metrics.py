"""The worker's metrics in Prometheus format (``prometheus_client``), served at ``/metrics``.

Nothing here runs per record. The engine keeps plain counters that it bumps once per poll or
commit (:class:`~pystreams.worker.engine.EngineCounters`); the stream thread refreshes lag
snapshots once per lag check (every ``lag_check_interval_ms``, on its engine thread) and pushes
restore progress as it comes; a custom collector reads all of that when Prometheus scrapes.
Only commit and rebalance durations are observed into histograms as they happen (about once a
second and once per rebalance).

Names follow Kafka Streams' metrics (``stream-thread-metrics``, ``stream-task-metrics``,
``stream-state-metrics``) as Prometheus names — counters end in ``_total`` and rates are
``rate()`` of them, durations are seconds:

=================================================  ==============================================
metric (labels)                                    Kafka Streams counterpart
=================================================  ==============================================
pystreams_records_consumed_total {thread}          poll-records / process-total (input side)
pystreams_records_processed_total {thread}         process-total (packed entries count each)
pystreams_records_produced_total {thread}          producer record-send-total
pystreams_process_latency_seconds {thread}         process-latency-avg (summary: sum / count)
pystreams_commit_latency_seconds {thread}          commit-latency-avg/-max (histogram)
pystreams_task_lag_records {thread,task}           records-lag of the task's input partitions
pystreams_restore_records_total {thread}           restore-total (rate() = restore-rate)
pystreams_restore_remaining_records {thread,...}   restore-remaining-records-total
pystreams_restoring_tasks {thread}                 tasks in RESTORING
pystreams_standby_records_total {thread}           update-total of standby tasks
pystreams_standby_lag_records {thread,task,kind}   standby/warm-up changelog lag
pystreams_rebalance_duration_seconds {thread}      rebalance-latency (histogram; _count = rebalances)
pystreams_stream_thread_state {thread,state}       stream thread state (1 for the current one)
pystreams_transactions_committed_total {thread}    exactly-once: commit-total of the thread's producer
pystreams_transactions_aborted_total {thread}      exactly-once: aborted transactions (tasks rebuilt)
pystreams_task_migrations_total {thread}           exactly-once: TaskMigrated (fenced; tasks dropped)
pystreams_tasks_revived_total {thread}             exactly-once: TaskCorrupted (rebuilt from changelogs)
pystreams_aborted_records_dropped_total {thread}   records of aborted transactions the fetch filter dropped
pystreams_dropped_records_total {thread,reason}    dropped-records-total: null-key, late, invalid-timestamp
pystreams_global_table_records_total {table}       a global table's records applied (restore and follow)
pystreams_global_table_lag_records {table}         records a global table is behind its topic's end
pystreams_state_bytes {task}                       RocksDB size: bytes on disk per task directory
                                                   (``global``: the global tables)
pystreams_state_volume_free_bytes / _size_bytes    the state directory's file system
pystreams_worker_ready                             what /readyz answers (1 ready, 0 not)
=================================================  ==============================================
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric, SummaryMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from .process import StreamThread

#: Prometheus' text format, version 0.0.4.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PREFIX = "pystreams_"

#: The states a stream thread reports, in Kafka Streams' spirit (StreamThread.State).
THREAD_STATES = ("starting", "rebalancing", "restoring", "running", "pending_shutdown", "dead")

#: Walking the state directory costs file-system calls: at most once per this many seconds.
STATE_SIZE_TTL_S = 10.0

_COMMIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_REBALANCE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class WorkerMetrics:
    """One registry per worker process (not the global one: tests run several workers in one
    process), holding the histograms the threads observe into and the collector of the rest."""

    def __init__(self) -> None:
        # No auto_describe: it would run the collector (and measure the state directory) at registration.
        self.registry = CollectorRegistry(auto_describe=False)
        self.commit_latency = Histogram(
            PREFIX + "commit_latency_seconds",
            "Time to commit a stream thread's tasks: flush stores and producer, commit offsets, checkpoint (exactly-once: the whole transaction)",
            ["thread"],
            buckets=_COMMIT_BUCKETS,
            registry=self.registry,
        )
        self.rebalance_duration = Histogram(
            PREFIX + "rebalance_duration_seconds",
            "From a membership change reaching a stream thread until its member is stable again with nothing pending; _count is the number of rebalances",
            ["thread"],
            buckets=_REBALANCE_BUCKETS,
            registry=self.registry,
        )
        ProcessCollector(registry=self.registry)

    def watch(self, threads: Sequence[StreamThread], state_dir: Path, app_id: str, ready: Callable[[], bool]) -> None:
        self.registry.register(_WorkerCollector(threads, _StateSizes(state_dir / app_id, state_dir), ready))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _StateSizes:
    """Bytes on disk per task directory, re-measured at most every STATE_SIZE_TTL_S (sooner
    when task directories come or go)."""

    def __init__(self, app_dir: Path, volume: Path) -> None:
        self._app_dir = app_dir
        self._volume = volume
        self._measured_at = -STATE_SIZE_TTL_S
        self._sizes: dict[str, int] = {}

    def per_task(self) -> dict[str, int]:
        now = time.monotonic()
        if now - self._measured_at >= STATE_SIZE_TTL_S or set(_task_directories(self._app_dir)) != self._sizes.keys():
            self._sizes = _directory_sizes(self._app_dir)
            self._measured_at = now
        return self._sizes

    def volume(self) -> tuple[int, int] | None:
        """(free, total) bytes of the state directory's file system."""
        try:
            usage = shutil.disk_usage(self._volume)
        except OSError:
            return None
        return usage.free, usage.total


def _task_directories(app_dir: Path) -> dict[str, str]:
    try:
        return {e.name: e.path for e in os.scandir(app_dir) if e.is_dir() and not e.name.startswith(".")}
    except OSError:
        return {}


def _directory_sizes(app_dir: Path) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for task, path in _task_directories(app_dir).items():
        total = 0
        for root, _, files in os.walk(path):
            for file in files:
                try:
                    total += os.stat(os.path.join(root, file)).st_size
                except OSError:
                    continue  # RocksDB removed it (compaction) while we walked
        sizes[task] = total
    return sizes


class _WorkerCollector(Collector):
    def __init__(self, threads: Sequence[StreamThread], state: _StateSizes, ready: Callable[[], bool]) -> None:
        self._threads = threads
        self._state = state
        self._ready = ready

    def collect(self) -> Iterator[Metric]:
        threads = list(self._threads)
        yield from self._throughput(threads)
        yield from self._lags(threads)
        yield from self._restores(threads)
        yield from self._states(threads)
        yield from self._transactions(threads)
        yield from self._global_tables(threads)
        yield from self._state_sizes()
        ready = GaugeMetricFamily(PREFIX + "worker_ready", "1 when every stream thread has its active tasks restored and running")
        ready.add_metric([], 1.0 if self._ready() else 0.0)
        yield ready

    @staticmethod
    def _throughput(threads: Iterable[StreamThread]) -> Iterator[Metric]:
        consumed = CounterMetricFamily(PREFIX + "records_consumed", "Input records handed to active tasks", labels=["thread"])
        processed = CounterMetricFamily(PREFIX + "records_processed", "Records run through the topology", labels=["thread"])
        produced = CounterMetricFamily(
            PREFIX + "records_produced", "Records the producer confirmed written (outputs, changelogs, packed repartition records)", labels=["thread"]
        )
        latency = SummaryMetricFamily(
            PREFIX + "process_latency_seconds", "Processing time per record: _sum is the time spent processing, _count the records processed", labels=["thread"]
        )
        standby = CounterMetricFamily(PREFIX + "standby_records", "Changelog records applied to standby and warm-up replicas", labels=["thread"])
        for thread in threads:
            counters = thread.engine.counters
            label = [thread.name]
            consumed.add_metric(label, counters.records_consumed)
            processed.add_metric(label, thread.records_processed)
            produced.add_metric(label, thread.engine.records_produced)
            latency.add_metric(label, count_value=thread.records_processed, sum_value=counters.process_seconds)
            standby.add_metric(label, counters.standby_records)
        yield from (consumed, processed, produced, latency, standby)

    @staticmethod
    def _lags(threads: Iterable[StreamThread]) -> Iterator[Metric]:
        task_lag = GaugeMetricFamily(
            PREFIX + "task_lag_records",
            "Records an active task is behind the end of its input partitions (as of the last lag check)",
            labels=["thread", "task"],
        )
        standby_lag = GaugeMetricFamily(
            PREFIX + "standby_lag_records",
            "Records a standby or warm-up replica is behind its changelogs (as of the last lag check)",
            labels=["thread", "task", "kind"],
        )
        for thread in threads:
            lags = thread.lags
            for task, lag in sorted(lags.active.items()):
                task_lag.add_metric([thread.name, str(task)], lag)
            for task, lag in sorted(lags.replicas.items()):
                kind = "warmup" if task in lags.warmups else "standby"
                standby_lag.add_metric([thread.name, str(task), kind], lag)
        yield from (task_lag, standby_lag)

    @staticmethod
    def _restores(threads: Iterable[StreamThread]) -> Iterator[Metric]:
        restored = CounterMetricFamily(PREFIX + "restore_records", "Changelog records restored into active tasks", labels=["thread"])
        remaining = GaugeMetricFamily(PREFIX + "restore_remaining_records", "Records a restoring store still has to read", labels=["thread", "task", "store"])
        restoring = GaugeMetricFamily(PREFIX + "restoring_tasks", "Active tasks restoring their state", labels=["thread"])
        for thread in threads:
            progress = thread.restores
            restored.add_metric([thread.name], progress.records_restored)
            for (task, store), left in sorted(progress.remaining().items()):
                remaining.add_metric([thread.name, task, store], left)
            restoring.add_metric([thread.name], len(thread.restoring))
        yield from (restored, remaining, restoring)

    @staticmethod
    def _states(threads: Iterable[StreamThread]) -> Iterator[Metric]:
        state = GaugeMetricFamily(PREFIX + "stream_thread_state", "1 for the stream thread's current state", labels=["thread", "state"])
        active = GaugeMetricFamily(PREFIX + "active_tasks", "Active tasks running", labels=["thread"])
        replicas = GaugeMetricFamily(PREFIX + "standby_tasks", "Standby and warm-up replicas open", labels=["thread"])
        for thread in threads:
            current = thread.state
            for name in THREAD_STATES:
                state.add_metric([thread.name, name], 1.0 if name == current else 0.0)
            active.add_metric([thread.name], len(thread.running_tasks))
            replicas.add_metric([thread.name], len(thread.engine.standby_tasks))
        yield from (state, active, replicas)

    @staticmethod
    def _transactions(threads: Iterable[StreamThread]) -> Iterator[Metric]:
        committed = CounterMetricFamily(
            PREFIX + "transactions_committed", "Exactly-once: transactions committed (one per commit of a stream thread)", labels=["thread"]
        )
        aborted = CounterMetricFamily(
            PREFIX + "transactions_aborted", "Exactly-once: transactions aborted; the tasks that wrote into them are rebuilt", labels=["thread"]
        )
        migrations = CounterMetricFamily(
            PREFIX + "task_migrations",
            "Exactly-once: times another owner took the thread's tasks over (fenced); they were dropped uncommitted",
            labels=["thread"],
        )
        revived = CounterMetricFamily(
            PREFIX + "tasks_revived", "Exactly-once: tasks rebuilt from their changelogs after an aborted transaction", labels=["thread"]
        )
        dropped = CounterMetricFamily(PREFIX + "aborted_records_dropped", "Records of aborted transactions the fetch-side filter dropped", labels=["thread"])
        skipped = CounterMetricFamily(
            PREFIX + "dropped_records", "Records the topology skipped: a null key, late for their window, an invalid timestamp", labels=["thread", "reason"]
        )
        for thread in threads:
            engine, label = thread.engine, [thread.name]
            committed.add_metric(label, engine.transactions_committed)
            aborted.add_metric(label, engine.transactions_aborted)
            migrations.add_metric(label, engine.counters.task_migrations)
            revived.add_metric(label, engine.counters.tasks_revived)
            dropped.add_metric(label, engine.aborted_records_dropped)
            for reason, count in sorted(engine.counters.dropped_records.items()):
                skipped.add_metric([thread.name, reason], count)
        yield from (committed, aborted, migrations, revived, dropped, skipped)

    @staticmethod
    def _global_tables(threads: Iterable[StreamThread]) -> Iterator[Metric]:
        # One set per process, which every stream thread's engine reads.
        tables = next((t.engine.global_tables for t in threads if t.engine.global_tables is not None), None)
        if tables is None:
            return
        applied = CounterMetricFamily(PREFIX + "global_table_records", "Records of a global table's topic applied (restored, then followed)", labels=["table"])
        lag = GaugeMetricFamily(
            PREFIX + "global_table_lag_records", "Records a global table is behind its topic's end (as of the last fetch)", labels=["table"]
        )
        lags = tables.lags()
        for name, store in sorted(tables.stores.items()):
            applied.add_metric([name], store.records_applied)
            lag.add_metric([name], lags.get(name, 0))
        yield from (applied, lag)

    def _state_sizes(self) -> Iterator[Metric]:
        sizes = GaugeMetricFamily(PREFIX + "state_bytes", "Bytes on disk of each task's state directory (RocksDB stores and checkpoint)", labels=["task"])
        for task, size in sorted(self._state.per_task().items()):
            sizes.add_metric([task], size)
        yield sizes
        volume = self._state.volume()
        if volume is not None:
            free, total = volume
            yield GaugeMetricFamily(PREFIX + "state_volume_free_bytes", "Free bytes on the state directory's file system", value=free)
            yield GaugeMetricFamily(PREFIX + "state_volume_size_bytes", "Size of the state directory's file system", value=total)
