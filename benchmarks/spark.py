"""Word count on Spark ``local[2]`` (our Python Kafka source) next to one TaskEngine.

Both runtimes run ``examples/wordcount.py`` over the same input lines, each on its own
embedded broker (the example's topic names are fixed). Spark runs as a backfill
(``availableNow``) from a fresh checkpoint; the TaskEngine runs until every line and word is
processed and committed. Rates are input lines per second and words per second (each word is
one record through the aggregation). Session start-up is reported separately and is not part
of the Spark rate; Spark is timed twice in one session (first and second query), then twice
compiled to one query per sub-topology (the chained plan that apps with table operators get).
Prints one JSON document.

    python benchmarks/spark.py [--lines N] [--partitions P]
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

from kafka import KafkaProducer

from pystreams.app import load_app
from pystreams.broker import EmbeddedBroker
from pystreams.cluster import ClusterMetadata, TopicSpec
from pystreams.worker import EngineConfig, TaskEngine, resolve_against_cluster

WORDCOUNT = Path(__file__).resolve().parent.parent / "examples" / "wordcount.py"
VOCABULARY = [f"word{i}" for i in range(5000)]


def make_lines(count: int, seed: int = 7) -> list[bytes]:
    rng = random.Random(seed)
    return [" ".join(rng.choices(VOCABULARY, k=8)).encode() for _ in range(count)]


def prepare(bootstrap: str, lines: list[bytes], partitions: int) -> None:
    with ClusterMetadata(bootstrap) as cluster:
        cluster.ensure_topics([TopicSpec("text-lines", partitions), TopicSpec("word-counts", partitions)])
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, batch_size=262_144)
    for i, line in enumerate(lines):
        producer.send("text-lines", key=str(i).encode(), value=line)
    producer.flush()
    producer.close()


def run_task_engine(bootstrap: str, state_dir: Path, expected_records: int) -> float:
    resolved = resolve_against_cluster(load_app(str(WORDCOUNT)).topology(), bootstrap)
    engine = TaskEngine(resolved, EngineConfig(bootstrap, state_dir, commit_interval_ms=1000))
    engine.start()
    try:
        engine.add_tasks(resolved.tasks)
        started = time.perf_counter()
        engine.run(until=lambda: engine.records_processed >= expected_records, timeout_s=900)
        elapsed = time.perf_counter() - started
        if engine.records_processed < expected_records:
            raise RuntimeError("the TaskEngine did not finish")
        return elapsed
    finally:
        engine.close()


def run_spark(spark: object, bootstrap: str, checkpoint: Path, *, per_subtopology: bool = False) -> float:
    from pystreams.spark import to_spark

    app = load_app(str(WORDCOUNT))
    job = to_spark(app, spark, bootstrap_servers=bootstrap, checkpoint=str(checkpoint), per_subtopology=per_subtopology)
    started = time.perf_counter()
    job.start(available_now=True)
    job.await_termination()  # raises if a query failed
    return time.perf_counter() - started


def rates(lines: int, words: int, seconds: float) -> dict[str, float]:
    return {
        "seconds": round(seconds, 3),
        "lines_per_s": round(lines / seconds),
        "words_per_s": round(words / seconds),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=20_000)
    parser.add_argument("--partitions", type=int, default=2)
    args = parser.parse_args()

    from pystreams.spark.session import timed_local_session

    lines = make_lines(args.lines)
    words = sum(len(line.split()) for line in lines)
    results: dict[str, object] = {
        "benchmark": "wordcount: Spark local[2] (Python Kafka source) vs one TaskEngine",
        "python": sys.version.split()[0],
        "machine": platform.machine(),
        "input_lines": args.lines,
        "input_words": words,
        "partitions": args.partitions,
    }
    with tempfile.TemporaryDirectory() as scratch, EmbeddedBroker() as spark_broker, EmbeddedBroker() as worker_broker:
        for broker in (spark_broker, worker_broker):
            prepare(broker.bootstrap_servers, lines, args.partitions)

        spark, startup_s = timed_local_session("local[2]", "pystreams-benchmark")
        results["spark_session_startup_s"] = round(startup_s, 3)
        try:
            import pyspark

            results["pyspark"] = pyspark.__version__
            # The first query in a session also pays for Python worker start-up and code
            # generation; the second (fresh checkpoint, same input) shows the steady rate.
            for run in ("first_query", "second_query"):
                checkpoint = Path(scratch) / f"checkpoint-{run}"
                results[f"spark_local2_python_source_{run}"] = rates(args.lines, words, run_spark(spark, spark_broker.bootstrap_servers, checkpoint))
            # The same app as one query per sub-topology (the plan of apps with table operators):
            # the worker's task graph per task, chained through the repartition topic. Its
            # first run in a session also pays for its operator's start-up.
            for run in ("first_query", "second_query"):
                checkpoint = Path(scratch) / f"checkpoint-chained-{run}"
                seconds = run_spark(spark, spark_broker.bootstrap_servers, checkpoint, per_subtopology=True)
                results[f"spark_local2_per_subtopology_{run}"] = rates(args.lines, words, seconds)
        finally:
            spark.stop()
        results["task_engine"] = rates(args.lines, words, run_task_engine(worker_broker.bootstrap_servers, Path(scratch) / "state", args.lines + words))
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
