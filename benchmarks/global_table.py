"""The restore rate of a global table on one worker, and a stream–global join's throughput.

* ``restore``: ``--records`` rows (``--keys`` distinct keys, 100-byte JSON values) over three
  partitions of a global table's topic, restored from scratch into RocksDB by
  ``GlobalTables.restore`` — what a worker does before it takes any task;
* ``restore_resume``: the same state directory reopened after ``--tail`` more rows: the
  checkpoint makes the restart read only those;
* ``raw_read``: a plain kafka-python consumer reading the same partitions to their end and
  doing nothing else (the I/O floor the restore is compared with);
* ``stream_global_join``: ``--orders`` orders (2 partitions) left-joined with the table by a
  foreign key, timed from the engine's first poll to the last output record.

Prints one JSON document.

    python benchmarks/global_table.py [--records N] [--keys K] [--tail T] [--orders M]
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KafkaTopicPartition

from pystreams import serdes
from pystreams.app import App
from pystreams.broker import EmbeddedBroker
from pystreams.cluster import ClusterMetadata, TopicSpec
from pystreams.worker import EngineConfig, TaskEngine, resolve_against_cluster
from pystreams.worker.global_tables import GlobalTables
from pystreams.worker.kafka_io import DEFAULT_PRODUCER_CONFIG

GLOBAL_PARTITIONS = 3


def produce(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]]) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, **DEFAULT_PRODUCER_CONFIG)
    for key, value in records:
        producer.send(topic, key=key, value=value)
    producer.flush()
    producer.close()


def customer_rows(start: int, count: int, keys: int) -> list[tuple[bytes, bytes]]:
    return [(f"c{n % keys}".encode(), serdes.Json().serialize({"n": n, "city": f"city-{n % 977}", "pad": "x" * 60})) for n in range(start, start + count)]


def enrich_app() -> App:
    app = App("bench-global")
    customers = app.global_table("bench-customers")
    orders = app.topic("bench-orders")
    orders.join(
        customers,
        lambda key, order, customer: customer["city"] if customer else None,
        foreign_key=lambda key, order: order["c"],
        how="left",
        value=serdes.Text(),
    ).to("bench-enriched")
    return app


def timed_restore(bootstrap: str, app: App, state_dir: Path) -> tuple[float, int]:
    resolved = resolve_against_cluster(app.topology(), bootstrap)
    tables = GlobalTables.open(resolved, EngineConfig(bootstrap, state_dir), "bench-global")
    try:
        started = time.perf_counter()
        restored = tables.restore()
        return time.perf_counter() - started, restored
    finally:
        tables.close()


def raw_read(bootstrap: str, topic: str) -> tuple[float, int]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, max_poll_records=10_000)
    partitions = [KafkaTopicPartition(topic, p) for p in range(GLOBAL_PARTITIONS)]
    consumer.assign(partitions)
    ends = consumer.end_offsets(partitions)
    consumer.seek_to_beginning(*partitions)
    started = time.perf_counter()
    read = 0
    while any(consumer.position(p) < ends[p] for p in partitions):
        read += sum(len(batch) for batch in consumer.poll(timeout_ms=200).values())
    elapsed = time.perf_counter() - started
    consumer.close()
    return elapsed, read


def timed_join(bootstrap: str, app: App, state_dir: Path, orders: int) -> float:
    resolved = resolve_against_cluster(app.topology(), bootstrap)
    engine = TaskEngine(resolved, EngineConfig(bootstrap, state_dir, commit_interval_ms=1000), committed_offsets=lambda ps: {}, commit_offsets=lambda o: None)
    engine.start()  # restores the global table first: not timed here
    try:
        engine.add_tasks(resolved.tasks)
        started = time.perf_counter()
        while engine.records_processed < orders:
            engine.poll()
        engine.commit()
        return time.perf_counter() - started
    finally:
        engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--tail", type=int, default=10_000)
    parser.add_argument("--orders", type=int, default=100_000)
    args = parser.parse_args()
    broker = EmbeddedBroker(port=None)
    broker.start()
    try:
        bootstrap = broker.bootstrap_servers
        with ClusterMetadata(bootstrap) as cluster:
            cluster.ensure_topics([TopicSpec("bench-customers", GLOBAL_PARTITIONS), TopicSpec("bench-orders", 2), TopicSpec("bench-enriched", 2)])
        produce(bootstrap, "bench-customers", customer_rows(0, args.records, args.keys))
        app = enrich_app()
        with tempfile.TemporaryDirectory() as tmp:
            state_dir = Path(tmp) / "state"
            raw_s, raw_records = raw_read(bootstrap, "bench-customers")
            restore_s, restored = timed_restore(bootstrap, app, state_dir)
            produce(bootstrap, "bench-customers", customer_rows(args.records, args.tail, args.keys))
            resume_s, resumed = timed_restore(bootstrap, app, state_dir)
            produce(
                bootstrap,
                "bench-orders",
                [(f"o{n}".encode(), serdes.Json().serialize({"n": n, "c": f"c{(n * 7919) % args.keys}"})) for n in range(args.orders)],
            )
            join_s = timed_join(bootstrap, app, Path(tmp) / "join-state", args.orders)
        print(
            json.dumps(
                {
                    "benchmark": "global_table",
                    "machine": {"python": platform.python_version(), "cpus": __import__("os").cpu_count()},
                    "restore": {"records": restored, "seconds": round(restore_s, 3), "records_per_s": round(restored / restore_s)},
                    "restore_resume": {"records": resumed, "seconds": round(resume_s, 3)},
                    "raw_read": {"records": raw_records, "seconds": round(raw_s, 3), "records_per_s": round(raw_records / raw_s)},
                    "restore_vs_raw_read": round(restore_s / raw_s, 2),
                    "stream_global_join": {"orders": args.orders, "seconds": round(join_s, 3), "records_per_s": round(args.orders / join_s)},
                },
                indent=2,
            )
        )
    finally:
        broker.stop()


if __name__ == "__main__":
    main()
