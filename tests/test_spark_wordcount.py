"""The Spark runtime against the embedded broker: the word count example gives the same final
table as the worker's TaskEngine, survives a stop mid-stream and a restart from its checkpoint,
and apps Spark cannot run fail at compile time naming the node.

Example topic names are fixed, so each test starts its own broker (they start in milliseconds);
the Spark session (≈ 5 s to start) is shared by every Spark test module (``spark`` fixture).
"""

from __future__ import annotations

import collections
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaProducer
from spark_parity import SPARK_TIMEOUT_S, decoded, read_final_table, run_on_workers

from pystreams import serdes
from pystreams.app import load_app
from pystreams.broker import EmbeddedBroker
from pystreams.cluster import ClusterMetadata, TopicSpec
from pystreams.spark import compile_topology

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
WAIT_S = 60.0

pytestmark = pytest.mark.integration

CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "The dog barks",
    "a fox a dog a cat",
    "   spaced    out   words  ",
    "the end",
] * 20


def expected_counts(lines: Iterable[str]) -> dict[str, int]:
    return dict(collections.Counter(word for line in lines for word in line.lower().split()))


@pytest.fixture
def broker() -> Iterator[str]:
    with EmbeddedBroker() as embedded:
        yield embedded.bootstrap_servers


def prepare_wordcount_topics(bootstrap: str) -> None:
    with ClusterMetadata(bootstrap) as cluster:
        cluster.ensure_topics([TopicSpec("text-lines", 3), TopicSpec("word-counts", 3)])


def produce_lines(bootstrap: str, lines: Iterable[str], prefix: str = "") -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    try:
        for i, line in enumerate(lines):
            producer.send("text-lines", key=f"{prefix}{i}".encode(), value=line.encode())
        producer.flush()
    finally:
        producer.close()


def read_table(bootstrap: str, topic: str = "word-counts") -> dict[str, int]:
    return decoded(read_final_table(bootstrap, topic), serdes.Text(), serdes.Int())


def run_task_engine(bootstrap: str, state_dir: Path, lines_and_words: int) -> None:
    app = load_app(str(EXAMPLES / "wordcount.py"))
    engine = run_on_workers(app, bootstrap, state_dir, until_processed=lines_and_words, timeout_s=WAIT_S)
    try:
        assert engine.records_processed == lines_and_words
    finally:
        engine.close()


def wordcount_job(spark: Any, bootstrap: str, checkpoint: Path) -> Any:
    from pystreams.spark import to_spark

    app = load_app(str(EXAMPLES / "wordcount.py"))
    return to_spark(app, spark, bootstrap_servers=bootstrap, checkpoint=str(checkpoint))


def test_wordcount_on_spark_matches_the_task_engine(spark: Any, tmp_path: Path) -> None:
    words = sum(expected_counts(CORPUS).values())
    with EmbeddedBroker() as workers_broker, EmbeddedBroker() as spark_broker:
        for bootstrap in (workers_broker.bootstrap_servers, spark_broker.bootstrap_servers):
            prepare_wordcount_topics(bootstrap)
            produce_lines(bootstrap, CORPUS)

        run_task_engine(workers_broker.bootstrap_servers, tmp_path / "state", len(CORPUS) + words)
        workers_table = read_table(workers_broker.bootstrap_servers)

        job = wordcount_job(spark, spark_broker.bootstrap_servers, tmp_path / "checkpoint")
        job.start(available_now=True)
        assert job.await_termination(SPARK_TIMEOUT_S)
        spark_table = read_table(spark_broker.bootstrap_servers)

    assert workers_table == expected_counts(CORPUS)
    assert spark_table == workers_table


def test_stop_mid_stream_and_restart_from_the_checkpoint(spark: Any, broker: str, tmp_path: Path) -> None:
    prepare_wordcount_topics(broker)
    checkpoint = tmp_path / "checkpoint"
    first, second, third = CORPUS[:40], CORPUS[40:70], CORPUS[70:] + ["zebra fox"]
    produce_lines(broker, first, "a")

    job = wordcount_job(spark, broker, checkpoint)
    (query,) = [writer.trigger(processingTime="200 milliseconds").start() for writer in job.writers.values()]
    try:
        deadline = time.monotonic() + WAIT_S
        while read_table(broker) != expected_counts(first):
            assert query.exception() is None, query.exception()
            assert time.monotonic() < deadline, "the first lines were never counted"
            time.sleep(0.3)
        produce_lines(broker, second, "b")  # arrives while the query runs...
        time.sleep(0.5)
    finally:
        query.stop()  # ...and the stop may land in the middle of it
    produce_lines(broker, third, "c")  # written while no query runs

    restarted = wordcount_job(spark, broker, checkpoint)
    restarted.start(available_now=True)
    assert restarted.await_termination(SPARK_TIMEOUT_S)
    assert read_table(broker) == expected_counts(first + second + third)

    # A second backfill from the same checkpoint finds nothing new: the table is unchanged.
    again = wordcount_job(spark, broker, checkpoint)
    again.start(available_now=True)
    assert again.await_termination(SPARK_TIMEOUT_S)
    assert read_table(broker) == expected_counts(first + second + third)


def test_every_example_compiles() -> None:
    for example in sorted(EXAMPLES.glob("*.py")):
        topology = load_app(str(example)).topology()
        plan = compile_topology(topology, topics_matching=lambda pattern: ["clicks.eu", "clicks.us"])
        written = {sink.topic for sink in plan.sinks} | {topic for query in plan.chained for topic in query.writes}
        assert written - set(topology.internal_topics) == set(topology.sink_topics), example.name


WINDOWED_APP = """
import pystreams as ps
from pystreams.app import HoppingWindow, TumblingWindow

app = ps.App("views")
views = app.topic("page-views", value=ps.serdes.Json())


@app.group_by(views)
def by_page(key, view):
    return view["page"]


per_minute = app.count(by_page, store="views-per-minute", window=TumblingWindow(size=60_000, grace=10_000))
per_minute.to("views-per-minute")


@app.aggregate(by_page, store="bytes-5m", initial=0, window=HoppingWindow(size=300_000, advance=60_000, grace=10_000))
def bytes_5m(total, page, view):
    return total + view["bytes"]


bytes_5m.to("bytes-5m")
"""


def read_windowed_table(bootstrap: str, topic: str) -> dict[tuple[str, int, int], int]:
    table = decoded(read_final_table(bootstrap, topic), serdes.WindowedKey(serdes.Text()), serdes.Int())
    return {(windowed.key, windowed.start_ms, windowed.end_ms): count for windowed, count in table.items()}


def test_tumbling_and_hopping_aggregations_match_the_task_engine(spark: Any, tmp_path: Path) -> None:
    import json

    from pystreams.spark import to_spark

    app_file = tmp_path / "views_app.py"
    app_file.write_text(WINDOWED_APP)
    base = 1_700_000_000_000 - 1_700_000_000_000 % 60_000
    # Slightly out of order, but never later than the grace period (both runtimes keep all).
    offsets_s = [0, 5, 61, 58, 125, 130, 300, 299, 301, 420, 415, 600]
    events = [
        (f"p{i % 3}", {"page": f"page{i % 4}", "bytes": 100 + i}, base + seconds * 1000)
        for i, seconds in enumerate(seconds for seconds in offsets_s for _ in range(3))
    ]
    tables = {}
    with EmbeddedBroker() as workers_broker, EmbeddedBroker() as spark_broker:
        for bootstrap in (workers_broker.bootstrap_servers, spark_broker.bootstrap_servers):
            with ClusterMetadata(bootstrap) as cluster:
                cluster.ensure_topics([TopicSpec("page-views", 2), TopicSpec("views-per-minute", 2), TopicSpec("bytes-5m", 2)])
            producer = KafkaProducer(bootstrap_servers=bootstrap)
            for key, value, timestamp in events:
                producer.send("page-views", key=key.encode(), value=json.dumps(value).encode(), timestamp_ms=timestamp)
            producer.flush()
            producer.close()

        bootstrap = workers_broker.bootstrap_servers
        # Each event is processed twice: from page-views, then from the repartition topic.
        run_on_workers(load_app(str(app_file)), bootstrap, tmp_path / "state", until_processed=2 * len(events)).close()
        tables["workers"] = {t: read_windowed_table(bootstrap, t) for t in ("views-per-minute", "bytes-5m")}

        bootstrap = spark_broker.bootstrap_servers
        job = to_spark(load_app(str(app_file)), spark, bootstrap_servers=bootstrap, checkpoint=str(tmp_path / "cp"))
        assert len(job.start(available_now=True)) == 2  # one query per sink
        assert job.await_termination(SPARK_TIMEOUT_S)
        tables["spark"] = {t: read_windowed_table(bootstrap, t) for t in ("views-per-minute", "bytes-5m")}

    assert sum(tables["workers"]["views-per-minute"].values()) == len(events)
    assert tables["spark"] == tables["workers"]


@pytest.mark.slow  # > 30 s: a fresh Spark session in a subprocess
def test_cli_once_backfills_and_exits(broker: str, tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    pytest.importorskip("pyspark")
    prepare_wordcount_topics(broker)
    produce_lines(broker, CORPUS[:25])
    env = {**os.environ, "PYSTREAMS_BOOTSTRAP_SERVERS": broker, "PYSTREAMS_SPARK_ONCE": "1"}
    command = [sys.executable, "-m", "pystreams", "spark", str(EXAMPLES / "wordcount.py"), "--checkpoint", str(tmp_path / "cp")]
    finished = subprocess.run(command, env=env, capture_output=True, text=True, timeout=180)
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert "Python data source" in finished.stderr  # the source choice is logged
    assert read_table(broker) == expected_counts(CORPUS[:25])


CHAINED_AGGREGATIONS_APP = """
import pystreams as ps

app = ps.App("chained")
events = app.topic("events", value=ps.serdes.Text())


@app.group_by(events)
def by_value(key, value):
    return value


per_value = app.count(by_value, store="per-value")


@app.group_by(app.to_stream(per_value))
def by_count(value, count):
    return str(count)


app.count(by_count, store="values-per-count", name="values-per-count").to("values-per-count")
"""


NO_OUTPUT_APP = """
import pystreams as ps

app = ps.App("no-output")
app.topic("events", value=ps.serdes.Text()).filter(lambda key, value: True, name="kept")
"""


def test_cli_reports_what_spark_cannot_run_without_starting_spark(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from pystreams.cli import main

    app_file = tmp_path / "no_output_app.py"
    app_file.write_text(NO_OUTPUT_APP)
    assert main(["spark", str(app_file)]) == 1
    assert "topology 'no-output' writes no topic" in capsys.readouterr().err


def test_an_aggregation_of_an_aggregation_runs_as_a_query_per_sub_topology(tmp_path: Path) -> None:
    app_file = tmp_path / "chained_app.py"
    app_file.write_text(CHAINED_AGGREGATIONS_APP)
    topology = load_app(str(app_file)).topology()
    plan = compile_topology(topology)
    written = [query.writes for query in plan.chained]
    assert written == [("chained-by_value-repartition",), ("chained-by_count-repartition",), ("values-per-count",)]  # writers first
    assert plan.warnings and "at-least-once" in plan.warnings[0]
