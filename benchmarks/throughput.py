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

``windowed_count``: a tumbling-window count (1 s windows, 1 s grace, 1,000 keys, event times 1 ms
apart, in order) with ``emit="update"`` (today's default: every change, folded per commit) and
``emit="final"`` (one result per window when it closes, KIP-825) on the same input: records/s
and the records each wrote (``--only-windows`` runs just this).

The stateless map and the word count also run under each processing guarantee on the same input:
``at_least_once`` (its default 1 s commit interval, and 100 ms), and ``exactly_once_v2`` (100 ms,
Kafka Streams' default there): records/s as above, plus end-to-end latency — input produced at
a steady rate with its creation time, output read ``read_committed`` (behind the transaction
filter) by another consumer, latency = arrival − the output record's timestamp (its input's
creation time), p50/p99 after a warm-up.

    python benchmarks/throughput.py [--records N] [--latency-seconds S] [--latency-rate R] [--only-windows]
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.structs import OffsetAndMetadata

from pystreams import serdes
from pystreams.app import App, TumblingWindow
from pystreams.broker import EmbeddedBroker
from pystreams.cluster import ClusterMetadata, TopicSpec
from pystreams.guarantee import ProcessingGuarantee
from pystreams.worker import EngineConfig, TaskEngine, resolve_against_cluster
from pystreams.worker.committed_consumer import CommittedConsumer
from pystreams.worker.kafka_io import DEFAULT_PRODUCER_CONFIG

#: (label, guarantee, commit interval ms) compared on the same input.
GUARANTEES = [
    ("at_least_once", ProcessingGuarantee.AT_LEAST_ONCE, 1000),
    ("at_least_once_100ms", ProcessingGuarantee.AT_LEAST_ONCE, 100),
    ("exactly_once_v2", ProcessingGuarantee.EXACTLY_ONCE_V2, 100),
]

PARTITIONS = 2
VOCABULARY = [f"word{i}" for i in range(5000)]


def fill(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, **DEFAULT_PRODUCER_CONFIG)
    for i, value in enumerate(values):
        producer.send(topic, key=str(i).encode(), value=value)
    producer.flush()
    producer.close()


def plain_loop(bootstrap: str, source: str, sink: str, total: int) -> tuple[float, int]:
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap, group_id="plain-loop", enable_auto_commit=False, auto_offset_reset="earliest", max_poll_records=10_000
    )
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


def make_engine(
    bootstrap: str, app: App, state_dir: Path, *, guarantee: ProcessingGuarantee = ProcessingGuarantee.AT_LEAST_ONCE, commit_interval_ms: int = 1000
) -> TaskEngine:
    resolved = resolve_against_cluster(app.topology(), bootstrap)
    committed: dict = {}
    return TaskEngine(
        resolved,
        EngineConfig(bootstrap, state_dir, commit_interval_ms=commit_interval_ms, processing_guarantee=guarantee),
        committed_offsets=lambda ps: {},
        commit_offsets=committed.update,
    )


def run_engine(
    bootstrap: str,
    app: App,
    state_dir: Path,
    expected_records: int,
    *,
    guarantee: ProcessingGuarantee = ProcessingGuarantee.AT_LEAST_ONCE,
    commit_interval_ms: int = 1000,
) -> float:
    resolved = resolve_against_cluster(app.topology(), bootstrap)
    engine = make_engine(bootstrap, app, state_dir, guarantee=guarantee, commit_interval_ms=commit_interval_ms)
    engine.start()
    engine.add_tasks(resolved.tasks)
    started = time.perf_counter()
    engine.run(until=lambda: engine.records_processed >= expected_records, timeout_s=600)
    elapsed = time.perf_counter() - started
    assert engine.records_processed >= expected_records, "engine did not finish"
    engine.close()
    return elapsed


def stateless_app(name: str, source: str, sink: str) -> App:
    app = App(name)
    stream = app.topic(source, value=serdes.Bytes())
    app.map_values(stream, value=serdes.Bytes())(lambda key, value: value.upper()).to(sink)
    return app


def wordcount_app(name: str, source: str, sink: str) -> App:
    app = App(name)
    text = app.topic(source, value=serdes.Text())

    @app.flat_map(text)
    def words(key, line):
        for word in line.split():
            yield word, 1

    @app.aggregate(words, store="counts", initial=0)
    def counts(total, key, value):
        return total + value

    counts.to(sink)
    return app


def windowed_count_app(name: str, source: str, sink: str, emit: str) -> App:
    app = App(name)
    clicks = app.topic(source, value=serdes.Bytes())
    app.count(clicks, store="per-second", window=TumblingWindow(size=1000, grace=1000), emit=emit).to(sink)
    return app


def windowed_counts_compared(bootstrap: str, tmp: Path, total: int, rng: random.Random) -> dict:
    """The same windowed count emitting on update and emitting final results."""
    keys = [f"user{i}".encode() for i in range(1000)]
    with ClusterMetadata(bootstrap) as cluster:
        cluster.ensure_topics([TopicSpec(t, PARTITIONS) for t in ("clicks", "per-second-update", "per-second-final")])
    producer = KafkaProducer(bootstrap_servers=bootstrap, **DEFAULT_PRODUCER_CONFIG)
    start_ms = 1_700_000_000_000
    for i in range(total):
        producer.send("clicks", key=rng.choice(keys), value=b"click", timestamp_ms=start_ms + i)
    producer.flush()
    producer.close()
    results = {}
    for emit in ("update", "final"):
        sink = f"per-second-{emit}"
        elapsed = run_engine(bootstrap, windowed_count_app(f"bench-windows-{emit}", "clicks", sink, emit), tmp / f"windows-{emit}", total)
        consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False)
        partitions = [TopicPartition(sink, p) for p in range(PARTITIONS)]
        written = sum(consumer.end_offsets(partitions).values())  # the embedded broker may say one batch short
        consumer.close()
        results[f"emit_{emit}"] = {"seconds": round(elapsed, 3), "records_per_s": round(total / elapsed), "output_records_about": written}
    return results


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else float("nan")


def end_to_end_latency(
    bootstrap: str,
    make_app: Callable[[str, str, str], App],
    payload: Callable[[random.Random], bytes],
    state_dir: Path,
    *,
    guarantee: ProcessingGuarantee,
    commit_interval_ms: int,
    rate: int,
    seconds: float,
    warmup_s: float = 2.0,
) -> dict:
    """Input at ``rate`` records/s for ``seconds``; output read read_committed; latencies in ms."""
    run = uuid.uuid4().hex[:8]
    source, sink = f"lat-in-{run}", f"lat-out-{run}"
    with ClusterMetadata(bootstrap) as cluster:
        cluster.ensure_topics([TopicSpec(source, PARTITIONS), TopicSpec(sink, PARTITIONS)])
    engine = make_engine(bootstrap, make_app(f"lat-{run}", source, sink), state_dir, guarantee=guarantee, commit_interval_ms=commit_interval_ms)
    engine.start()
    engine.add_tasks(engine.resolved.tasks)
    stop = threading.Event()
    latencies: list[float] = []
    started = time.time()

    def produce() -> None:
        producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
        rng = random.Random(3)
        sent, tick = 0, time.monotonic()
        while not stop.is_set():
            due = int((time.monotonic() - tick) * rate)
            for _ in range(due - sent):
                producer.send(source, key=str(sent).encode(), value=payload(rng), timestamp_ms=int(time.time() * 1000))
                sent += 1
            time.sleep(0.005)
        producer.flush()
        producer.close()

    def read() -> None:
        consumer = CommittedConsumer(
            KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, isolation_level="read_committed", auto_offset_reset="earliest", enable_auto_commit=False)
        )
        tps = [TopicPartition(sink, p) for p in range(PARTITIONS)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        while not stop.is_set():
            for records in consumer.poll(timeout_ms=100).values():
                now_ms = time.time() * 1000
                if now_ms / 1000 - started >= warmup_s:
                    latencies.extend(now_ms - r.timestamp for r in records)
        consumer.close()

    threads = [threading.Thread(target=produce), threading.Thread(target=read)]
    for thread in threads:
        thread.start()
    try:
        engine.run(until=lambda: time.time() - started >= seconds, timeout_s=seconds + 60)
        time.sleep(1.0)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        engine.close()
    return {
        "outputs_measured": len(latencies),
        "p50_ms": round(percentile(latencies, 0.50), 1),
        "p99_ms": round(percentile(latencies, 0.99), 1),
        "transactions": engine.transactions_committed,
    }


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
    engine = TaskEngine(resolved, EngineConfig(bootstrap, state_dir / "rebuild"), committed_offsets=lambda ps: {}, commit_offsets=lambda offsets: None)
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


def guarantees_compared(bootstrap: str, tmp: Path, total: int, args: argparse.Namespace, rng: random.Random) -> dict:
    """The stateless map and the word count under each guarantee, on the same input."""
    payloads = [bytes(rng.choice(b"abcdefghij") for _ in range(100)) for _ in range(1000)]
    words_per_line = 5
    lines = [" ".join(rng.choices(VOCABULARY, k=words_per_line)).encode() for _ in range(total // words_per_line)]
    with ClusterMetadata(bootstrap) as cluster:
        cluster.ensure_topics([TopicSpec("g-in", PARTITIONS), TopicSpec("g-lines", PARTITIONS)])
    fill(bootstrap, "g-in", [payloads[i % 1000] for i in range(total)])
    fill(bootstrap, "g-lines", lines)
    results: dict = {"stateless_map": {}, "wordcount": {}}
    for label, guarantee, interval in GUARANTEES:
        run = uuid.uuid4().hex[:6]
        app = stateless_app(f"g-map-{run}", "g-in", f"g-map-out-{run}")
        elapsed = run_engine(bootstrap, app, tmp / f"map-{run}", total, guarantee=guarantee, commit_interval_ms=interval)
        entry = {"commit_interval_ms": interval, "records_per_s": round(total / elapsed)}
        entry["latency"] = end_to_end_latency(
            bootstrap,
            stateless_app,
            lambda r: payloads[r.randrange(1000)],
            tmp / f"map-lat-{run}",
            guarantee=guarantee,
            commit_interval_ms=interval,
            rate=args.latency_rate,
            seconds=args.latency_seconds,
        )
        results["stateless_map"][label] = entry

        app = wordcount_app(f"g-wc-{run}", "g-lines", f"g-wc-out-{run}")
        expected = len(lines) * (1 + words_per_line)
        elapsed = run_engine(bootstrap, app, tmp / f"wc-{run}", expected, guarantee=guarantee, commit_interval_ms=interval)
        entry = {"commit_interval_ms": interval, "lines_per_s": round(len(lines) / elapsed), "words_per_s": round(len(lines) * words_per_line / elapsed)}
        entry["latency"] = end_to_end_latency(
            bootstrap,
            wordcount_app,
            lambda r: " ".join(r.choices(VOCABULARY, k=words_per_line)).encode(),
            tmp / f"wc-lat-{run}",
            guarantee=guarantee,
            commit_interval_ms=interval,
            rate=max(1, args.latency_rate // words_per_line),
            seconds=args.latency_seconds,
        )
        results["wordcount"][label] = entry
    for name, key in (("stateless_map", "records_per_s"), ("wordcount", "words_per_s")):
        eos = results[name]["exactly_once_v2"][key]
        for label in ("at_least_once", "at_least_once_100ms"):
            results[name][f"exactly_once_cost_vs_{label}"] = f"{100 * (1 - eos / results[name][label][key]):.1f}%"
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--latency-seconds", type=float, default=10.0)
    parser.add_argument("--latency-rate", type=int, default=5000, help="input records/s during the latency runs")
    parser.add_argument("--only-guarantees", action="store_true", help="skip the plain loop, the restore rate and the default runs")
    parser.add_argument("--only-windows", action="store_true", help="only the windowed count, emit on update vs emit final")
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
        results["windowed_count"] = windowed_counts_compared(bootstrap, Path(tmp), total, rng)
        if args.only_windows:
            print(json.dumps(results, indent=2))
            return
        results["guarantees"] = guarantees_compared(bootstrap, Path(tmp), total, args, rng)
        if args.only_guarantees:
            print(json.dumps(results, indent=2))
            return
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

        stateless = stateless_app("bench-map", "in", "out-map")
        elapsed = run_engine(bootstrap, stateless, Path(tmp) / "map", total)
        results["stateless_map"] = {"seconds": round(elapsed, 3), "records_per_s": round(total / elapsed)}

        words_per_line = 5
        lines = total // words_per_line
        fill(bootstrap, "lines", [" ".join(rng.choices(VOCABULARY, k=words_per_line)).encode() for _ in range(lines)])
        wordcount = wordcount_app("bench-wordcount", "lines", "counts")
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
