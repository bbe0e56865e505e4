"""Run one app on both runtimes and read what each wrote, to check they agree.

Test-only helper of the Spark tests. The *final table* of a topic is the latest value
bytes per key bytes (a tombstone removes the key), which is what a consumer of a compacted
topic ends up with, whichever runtime produced it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

DEFAULT_TIMEOUT_S = 60.0
#: A hang guard, not a speed limit: a backfill shares two cores with the other xdist worker, and
#: one took longer than a minute in CI.
SPARK_TIMEOUT_S = 300.0


def read_final_table(bootstrap_servers: str, topic: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> dict[bytes | None, bytes]:
    """Latest value per key of ``topic``, read to its end (found by fetching: the embedded
    broker's end offsets can stop short)."""
    table: dict[bytes | None, bytes] = {}
    for _, key, value in read_log(bootstrap_servers, topic, timeout_s):
        if value is None:
            table.pop(key, None)
        else:
            table[key] = value
    return table


def read_log(bootstrap_servers: str, topic: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> list[tuple[int, bytes | None, bytes | None]]:
    """Every record of ``topic`` as (partition, key, value), each partition in offset order,
    read to its end: for outputs whose every record counts (one final result per window)."""
    from kafka import KafkaConsumer, TopicPartition

    from pystreams.log_ends import true_end_offsets

    consumer = KafkaConsumer(bootstrap_servers=bootstrap_servers, group_id=None, enable_auto_commit=False)
    try:
        partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        if not partitions:
            raise LookupError(f"topic {topic!r} does not exist")
        ends = true_end_offsets(consumer, partitions, timeout_s=60)
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        log: list[tuple[int, bytes | None, bytes | None]] = []
        deadline = time.monotonic() + timeout_s
        while any(consumer.position(p) < ends[p] for p in partitions):
            if time.monotonic() > deadline:
                raise TimeoutError(f"could not read {topic} to its end")
            for partition, records in sorted(consumer.poll(timeout_ms=200).items()):
                log.extend((partition.partition, record.key, record.value) for record in records)
        return log
    finally:
        consumer.close()


def decoded(table: dict[bytes | None, bytes], key_serde: Any, value_serde: Any) -> dict[Any, Any]:
    """A final table with its keys and values deserialized (for readable assertions)."""
    return {key_serde.deserialize(k): value_serde.deserialize(v) for k, v in table.items()}


def run_on_workers(
    app: Any,
    bootstrap_servers: str,
    state_dir: Path,
    *,
    until_processed: int,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    engine: Any = None,
) -> Any:
    """Run ``app`` on a worker ``TaskEngine`` owning every task until it has processed
    ``until_processed`` records (repartitioned records count again). Pass the returned engine
    back as ``engine`` to continue after producing more input; ``close`` it when done."""
    from pystreams.worker import EngineConfig, TaskEngine, resolve_against_cluster

    if engine is None:
        topology = app.topology() if hasattr(app, "topology") else app
        resolved = resolve_against_cluster(topology, bootstrap_servers)
        engine = TaskEngine(resolved, EngineConfig(bootstrap_servers, state_dir, commit_interval_ms=200))
        engine.start()
        try:
            engine.add_tasks(resolved.tasks)
        except BaseException:
            engine.close()
            raise
    try:
        engine.run(until=lambda: engine.records_processed >= until_processed, timeout_s=timeout_s)
    except BaseException:
        engine.close()
        raise
    if engine.records_processed < until_processed:
        engine.close()
        raise TimeoutError(f"the workers processed {engine.records_processed} of {until_processed} records")
    return engine


def run_on_spark(app: Any, spark: Any, bootstrap_servers: str, checkpoint: Path, *, timeout_s: float = SPARK_TIMEOUT_S) -> Any:
    """Compile ``app`` and run it as a backfill (available-now) to the end of its input."""
    from pystreams.spark import to_spark

    job = to_spark(app, spark, bootstrap_servers=bootstrap_servers, checkpoint=str(checkpoint))
    job.start(available_now=True)
    if not job.await_termination(timeout_s):
        job.stop()
        raise TimeoutError("the Spark backfill did not finish")
    failure = job.exception()
    if failure is not None:
        raise RuntimeError(f"a Spark query failed: {failure}")
    return job
