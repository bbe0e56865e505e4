"""Worker throughput: records/s of one TaskEngine on the embedded broker, next to a plain
kafka-python loop that consumes, produces and commits the same records.

* ``plain_loop``: manual-assign consumer → producer (same batching settings as the engine) →
  offset commit every second; the ceiling any Python worker on kafka-python can reach here;
* ``stateless_map``: an app ``map_values`` → sink, every task in one engine;
* ``wordcount``: ``examples/wordcount.py``-style flat_map → repartition → aggregate → sink;
  reported per input line and per word (each word is an entry through the repartition topic,
  which the engine writes packed: one Kafka record per partition and poll batch).

Timing starts when the engine (or loop) starts consuming input that is already in the topic and
ends when every record is processed and committed. Prints one JSON document.

    python benchmarks/throughput.py [--records N]
"""
from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.structs import OffsetAndMetadata

from pystreams import serdes
from pystreams.app import App
from pystreams.broker import EmbeddedBroker
from pystreams.cluster import ClusterMetadata, TopicSpec
from pystreams.worker import EngineConfig, TaskEngine, resolve_against_cluster
from pystreams.worker.kafka_io import DEFAULT_PRODUCER_CONFIG

PARTITIONS = 2
VOCABULARY = [f"word{i}" for i in range(5000)]


def fill(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, **DEFAULT_PRODUCER_CONFIG)
    for i, value in enumerate(values):
        producer.send(topic, key=str(i).encode(), value=value)
    producer.flush()
    producer.close()


def plain_loop(bootstrap: str, source: str, sink: str, total: int) -> tuple[float, int]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id="plain-loop", enable_auto_commit=False,
                             auto_offset_reset="earliest", max_poll_records=10_000)
    producer = KafkaProducer(bootstrap_servers=bootstrap, **DEFAULT_PRODUCER_CONFIG)
    partitions = [TopicPartition(source, p) for p in range(PARTITIONS)]
    consumer.assign(partitions)
    consumer.seek_to_beginning(*partitions)
    started = last_commit = time.perf_counter()
    done = 0
    positions: dict[TopicPartition, int] = {}
    commit_errors = 0

    def commit() -> None:
        nonlocal commit_errors
        producer.flush()
        try:
            consumer.commit({tp: OffsetAndMetadata(o, "", -1) for tp, o in positions.items()})
        except Exception:  # the broker may refuse commits from a group with no members
            commit_errors += 1

    while done < total:
        for tp, records in consumer.poll(timeout_ms=100).items():
            for record in records:
                producer.send(sink, key=record.key, value=record.value.upper())
            positions[tp] = records[-1].offset + 1
            done += len(records)
        if time.perf_counter() - last_commit >= 1.0:
            commit()
            last_commit = time.perf_counter()
    commit()
    elapsed = time.perf_counter() - started
    consumer.close()
    producer.close()
    return elapsed, commit_errors


def run_engine(bootstrap: str, app: App, state_dir: Path, expected_records: int) -> float:
    resolved = resolve_against_cluster(app.topology(), bootstrap)
    committed: dict = {}
    engine = TaskEngine(resolved, EngineConfig(bootstrap, state_dir, commit_interval_ms=1000),
                        committed_offsets=lambda ps: {}, commit_offsets=committed.update)
    engine.start()
    engine.add_tasks(resolved.tasks)
    started = time.perf_counter()
    engine.run(until=lambda: engine.records_processed >= expected_records, timeout_s=600)
    elapsed = time.perf_counter() - started
    assert engine.records_processed >= expected_records, "engine did not finish"
    engine.close()
    return elapsed


def restore_rate(bootstrap: str, state_dir: Path, keys: int) -> dict:
    """Changelog restore records/s: a store of ``keys`` distinct keys (nothing folds), built by
    one engine, then rebuilt from its changelog by a fresh engine on a wiped state dir."""
    fill_keyed(bootstrap, "kv", keys)
    app = App("bench-restore")
    source = app.topic("kv", key=serdes.Text(), value=serdes.Bytes())

    @app.aggregate(source, store="latest", initial=b"", value=serdes.Bytes())
    def latest(current, key, value):
        return value

    run_engine(bootstrap, app, state_dir / "build", keys)
    resolved = resolve_against_cluster(app.topology(), bootstrap)
    engine = TaskEngine(resolved, EngineConfig(bootstrap, state_dir / "rebuild"),
                        committed_offsets=lambda ps: {}, commit_offsets=lambda offsets: None)
    engine.start()
    started = time.perf_counter()
    restored = engine.add_tasks(resolved.tasks)
    elapsed = time.perf_counter() - started
    engine.lose_tasks(resolved.tasks)
    engine.close()
    records = sum(n for per_store in restored.values() for n in per_store.values())
    return {"records": records, "seconds": round(elapsed, 3), "records_per_s": round(records / elapsed)}


def fill_keyed(bootstrap: str, topic: str, keys: int) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, batch_size=262_144)
    value = b"v" * 100
    for i in range(keys):
        producer.send(topic, key=f"key-{i:08d}".encode(), value=value)
    producer.flush()
    producer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=200_000)
    args = parser.parse_args()
    total = args.records
    rng = random.Random(7)
    results: dict = {
        "python": sys.version.split()[0],
        "machine": platform.machine(),
        "records": total,
        "partitions": PARTITIONS,
    }
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory() as tmp:
        bootstrap = broker.bootstrap_servers
        with ClusterMetadata(bootstrap) as cluster:
            cluster.ensure_topics([TopicSpec(t, PARTITIONS) for t in ("in", "out-plain", "out-map", "lines", "counts", "kv")])
        payloads = [bytes(rng.choice(b"abcdefghij") for _ in range(100)) for _ in range(1000)]
        fill(bootstrap, "in", [payloads[i % 1000] for i in range(total)])

        elapsed, commit_errors = plain_loop(bootstrap, "in", "out-plain", total)
        results["plain_loop"] = {
            "seconds": round(elapsed, 3),
            "records_per_s": round(total / elapsed),
            "failed_commits": commit_errors,
        }

        stateless = App("bench-map")
        source = stateless.topic("in", value=serdes.Bytes())
        stateless.map_values(source, value=serdes.Bytes())(lambda key, value: value.upper()).to("out-map")
        elapsed = run_engine(bootstrap, stateless, Path(tmp) / "map", total)
        results["stateless_map"] = {"seconds": round(elapsed, 3), "records_per_s": round(total / elapsed)}

        words_per_line = 5
        lines = total // words_per_line
        fill(bootstrap, "lines", [" ".join(rng.choices(VOCABULARY, k=words_per_line)).encode() for _ in range(lines)])
        wordcount = App("bench-wordcount")
        text = wordcount.topic("lines", value=serdes.Text())

        @wordcount.flat_map(text)
        def words(key, line):
            for word in line.split():
                yield word, 1

        @wordcount.aggregate(words, store="counts", initial=0)
        def counts(total, key, value):
            return total + value

        counts.to("counts")
        elapsed = run_engine(bootstrap, wordcount, Path(tmp) / "wordcount", lines + lines * words_per_line)
        results["wordcount"] = {
            "seconds": round(elapsed, 3),
            "lines_per_s": round(lines / elapsed),
            "words_per_s": round(lines * words_per_line / elapsed),
            "distinct_words": len(VOCABULARY),
        }
        results["changelog_restore"] = restore_rate(bootstrap, Path(tmp) / "restore", total)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
