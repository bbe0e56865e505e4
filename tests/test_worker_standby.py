"""Standby replicas in the task engine, against the embedded broker: a replica follows the
active's changelog without processing input, reports its lag, and its promotion to active
restores only what it had not applied yet."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_worker_engine import OffsetStore, create_topics, produce, run_until

from pystreams import serdes
from pystreams.app import App, Processor, kv_store
from pystreams.cluster import TopicSpec
from pystreams.worker import EngineConfig, TaskEngine, resolve_against_cluster

pytestmark = pytest.mark.integration


def counting_app(app_id: str, source: str) -> App:
    app = App(app_id)
    events = app.topic(source, key=serdes.Text(), value=serdes.Text())
    app.count(events, store="counts")
    return app


def engine_for(resolved: Any, bootstrap: str, state_dir: Path, offsets: OffsetStore) -> TaskEngine:
    engine = TaskEngine(
        resolved,
        EngineConfig(bootstrap, state_dir, commit_interval_ms=100),
        committed_offsets=offsets.fetch,
        commit_offsets=offsets.commit,
    )
    engine.start()
    return engine


def poll_until(engine: TaskEngine, done: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        engine.poll(50)


def test_a_standby_follows_the_changelog_and_its_promotion_restores_only_the_rest(
    kafka_bootstrap: str, tmp_path: Path, unique_topic: Callable[[str], str]
) -> None:
    source = unique_topic("standby-events")
    create_topics(kafka_bootstrap, TopicSpec(source, 1))
    app = counting_app(unique_topic("standby_app"), source)
    resolved = resolve_against_cluster(app.topology(), kafka_bootstrap)
    (task,) = resolved.tasks
    offsets = OffsetStore()
    active = engine_for(resolved, kafka_bootstrap, tmp_path / "active", offsets)
    replica = engine_for(resolved, kafka_bootstrap, tmp_path / "replica", offsets)
    try:
        active.add_tasks([task])
        replica.set_standby_tasks([task])
        assert set(replica.standby_tasks) == {task} and not replica.tasks
        produce(kafka_bootstrap, source, [(f"k{i % 500}".encode(), b"x", None) for i in range(5_000)])
        run_until(active, lambda: active.records_processed >= 5_000, "the active to count")
        active.commit()  # flushes the cache: 500 keys reach the changelog
        poll_until(replica, lambda: replica.standby_tasks[task].records_applied >= 500, "the replica to apply")
        assert replica.records_processed == 0  # a replica processes no input
        replica.commit()  # checkpoints the replica
        assert replica.task_lags() == {task: 0}
        assert active.task_lags() == {task: 0}

        # More input the replica will not see before its promotion: 100 keys change.
        produce(kafka_bootstrap, source, [(f"k{i}".encode(), b"x", None) for i in range(100)])
        run_until(active, lambda: active.records_processed >= 5_100, "the second batch")
        handed_over = active.revoke_tasks([task])
        assert sum(handed_over.values()) == 5_100
        restored = replica.add_tasks([task])  # promotion: the replica closes, the active restores
        assert not replica.standby_tasks
        assert restored[task]["counts"] <= 100, restored  # only what the replica missed
        counts = replica.store_contents("counts")
        assert len(counts) == 500 and counts["k0"] == 11 and counts["k499"] == 10
    finally:
        active.close()
        replica.close()


def test_a_demoted_active_stays_as_a_replica_and_local_state_is_reported_as_lag(
    kafka_bootstrap: str, tmp_path: Path, unique_topic: Callable[[str], str]
) -> None:
    source = unique_topic("demote-events")
    create_topics(kafka_bootstrap, TopicSpec(source, 2))
    app = counting_app(unique_topic("demote_app"), source)
    resolved = resolve_against_cluster(app.topology(), kafka_bootstrap)
    offsets = OffsetStore()
    engine = engine_for(resolved, kafka_bootstrap, tmp_path / "w", offsets)
    first, second = resolved.tasks
    try:
        engine.add_tasks([first, second])
        produce(kafka_bootstrap, source, [(f"k{i}".encode(), b"x", None) for i in range(200)])
        run_until(engine, lambda: engine.records_processed >= 200, "the counts")
        engine.set_standby_tasks([first])  # wanted as a replica, but active here: not opened
        assert not engine.standby_tasks
        engine.revoke_tasks([first, second])
        assert set(engine.standby_tasks) == {first}  # demoted, kept warm
        lags = engine.task_lags()
        # The replica is caught up; the closed task's checkpoint is on disk and current too.
        assert lags == {first: 0, second: 0}
        engine.set_standby_tasks([])
        assert not engine.standby_tasks
    finally:
        engine.close()
    # Another process's writes make the on-disk state lag behind.
    other = engine_for(resolved, kafka_bootstrap, tmp_path / "other", offsets)
    try:
        other.add_tasks([first, second])
        produce(kafka_bootstrap, source, [(f"new{i}".encode(), b"x", None) for i in range(300)])
        run_until(other, lambda: other.records_processed >= 300, "the other owner")
        other.commit()
    finally:
        other.close()
    reopened = engine_for(resolved, kafka_bootstrap, tmp_path / "w", offsets)
    try:
        lags = reopened.task_lags()
        assert set(lags) == {first, second}
        assert sum(lags.values()) >= 250, lags  # ~300 new keys, the reported end may lag a batch
    finally:
        reopened.close()


def test_a_sibling_threads_replica_delays_a_promotion_until_it_closes(kafka_bootstrap: str, tmp_path: Path, unique_topic: Callable[[str], str]) -> None:
    """The stream threads of a process share one state directory; the assignor may give a
    task's active to one thread while another still has its replica open. The task is left
    out (no error), and starts from the replica's state once the replica closes."""
    source = unique_topic("sibling-events")
    create_topics(kafka_bootstrap, TopicSpec(source, 1))
    app = counting_app(unique_topic("sibling_app"), source)
    resolved = resolve_against_cluster(app.topology(), kafka_bootstrap)
    (task,) = resolved.tasks
    offsets = OffsetStore()
    active = engine_for(resolved, kafka_bootstrap, tmp_path / "active", offsets)
    holder = engine_for(resolved, kafka_bootstrap, tmp_path / "process", offsets)
    sibling = engine_for(resolved, kafka_bootstrap, tmp_path / "process", offsets)
    try:
        active.add_tasks([task])
        holder.set_standby_tasks([task])
        produce(kafka_bootstrap, source, [(f"k{i % 300}".encode(), b"x", None) for i in range(3_000)])
        run_until(active, lambda: active.records_processed >= 3_000, "the active to count")
        active.commit()
        poll_until(holder, lambda: holder.standby_tasks[task].records_applied >= 300, "the replica to apply")
        active.revoke_tasks([task])

        assert sibling.add_tasks([task]) == {}  # locked by the sibling's replica: not started
        assert not sibling.tasks and set(holder.standby_tasks) == {task}
        holder.set_standby_tasks([])  # the sibling hears the new assignment
        restored = sibling.add_tasks([task])
        assert set(sibling.tasks) == {task}
        assert restored[task]["counts"] == 0, restored  # the replica's state, nothing to restore
        assert len(sibling.store_contents("counts")) == 300
    finally:
        active.close()
        holder.close()
        sibling.close()


class RememberTwice(Processor):
    """Keeps each value in a logged store and in a scratch store without a changelog."""

    def init(self, context: Any) -> None:
        super().init(context)
        self.logged, self.scratch = context.store("logged"), context.store("scratch")

    def process(self, key: Any, value: Any) -> None:
        self.logged.put(key, value)
        self.scratch.put(key, value)


def test_a_replica_of_a_task_with_an_unlogged_store_follows_and_reports_its_lag(
    kafka_bootstrap: str, tmp_path: Path, unique_topic: Callable[[str], str]
) -> None:
    source = unique_topic("unlogged-events")
    create_topics(kafka_bootstrap, TopicSpec(source, 1))
    app = App(unique_topic("unlogged_app"))
    events = app.topic(source, key=serdes.Text(), value=serdes.Text())
    app.processor(
        events,
        stores=[
            kv_store("logged", key=serdes.Text(), value=serdes.Text()),
            kv_store("scratch", key=serdes.Text(), value=serdes.Text(), logging=False),
        ],
        key_changing=False,
    )(RememberTwice)
    resolved = resolve_against_cluster(app.topology(), kafka_bootstrap)
    (task,) = resolved.tasks
    offsets = OffsetStore()
    active = engine_for(resolved, kafka_bootstrap, tmp_path / "active", offsets)
    replica = engine_for(resolved, kafka_bootstrap, tmp_path / "replica", offsets)
    try:
        active.add_tasks([task])
        replica.set_standby_tasks([task])
        produce(kafka_bootstrap, source, [(f"k{i}".encode(), b"v", None) for i in range(50)])
        run_until(active, lambda: active.records_processed >= 50, "the active to process")
        active.commit()
        poll_until(replica, lambda: replica.standby_tasks[task].records_applied >= 50, "the replica to apply")
        assert replica.replica_lags() == {task: 0}  # only the logged store has a changelog to lag
        assert replica.task_lags() == {task: 0}
    finally:
        active.close()
        replica.close()
