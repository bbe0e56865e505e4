"""``pystreams spark`` as a user runs it (real processes on the embedded broker): a checkpoint
left from another broker is not silently resumed, and a bad record stops the query with one
line naming topic, partition and offset.

Each ``pystreams spark`` run starts its own JVM (≈ 20 s here); checks that need no Spark run
before one starts, so the refusals take a moment.
"""

from __future__ import annotations

import collections
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaProducer
from spark_parity import read_final_table

from pystreams.broker import EmbeddedBroker
from pystreams.cluster import ClusterMetadata, TopicSpec

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
WORDCOUNT = ROOT / "examples" / "wordcount.py"
LINES = ["the cat sat", "the dog sat", "a cat and a dog"]
EXPECTED = collections.Counter(word for line in LINES for word in line.split())


def spark_run(*args: str, cwd: Path, timeout_s: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pystreams", "spark", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout_s)


def wordcount_broker(lines: list[str]) -> EmbeddedBroker:
    broker = EmbeddedBroker(port=None)
    broker.start()
    with ClusterMetadata(broker.bootstrap_servers) as cluster:
        cluster.ensure_topics([TopicSpec("text-lines", 2), TopicSpec("word-counts", 2)])
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap_servers)
    for number, line in enumerate(lines):
        producer.send("text-lines", key=str(number).encode(), value=line.encode())
    producer.flush()
    producer.close()
    return broker


def counts(bootstrap: str) -> dict[str, int]:
    return {key.decode(): struct.unpack(">q", value)[0] for key, value in read_final_table(bootstrap, "word-counts").items() if key is not None}


@pytest.fixture
def brokers() -> Iterator[list[EmbeddedBroker]]:
    started: list[EmbeddedBroker] = []
    yield started
    for broker in started:
        broker.stop()


def test_a_checkpoint_left_from_another_broker_is_refused_not_silently_resumed(tmp_path: Path, brokers: Any) -> None:
    first = wordcount_broker(LINES)
    brokers.append(first)
    done = spark_run(str(WORDCOUNT), "--once", "--bootstrap-servers", first.bootstrap_servers, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert counts(first.bootstrap_servers) == EXPECTED
    assert (tmp_path / ".pystreams-spark" / "wordcount").is_dir()  # the default checkpoint, left behind

    # A fresh broker with the same input: the same offsets, other logs. Resuming would process
    # nothing (or, with more input, add to the old run's counts).
    second = wordcount_broker(LINES)
    brokers.append(second)
    refused = spark_run(str(WORDCOUNT), "--once", "--bootstrap-servers", second.bootstrap_servers, cwd=tmp_path)
    assert refused.returncode == 1
    assert "the Kafka offsets in checkpoint .pystreams-spark/wordcount" in refused.stderr
    assert "text-lines: the topic was recreated" in refused.stderr
    assert "--fail-on-data-loss false" in refused.stderr and "Traceback" not in refused.stderr
    assert "Spark" not in refused.stderr.split("error:")[0]  # refused before any Spark session started

    # Spark's failOnDataLoss=false: a warning, the new topic read from its beginning, the
    # checkpoint's state kept (so the counts add to the first run's).
    going_on = spark_run(str(WORDCOUNT), "--once", "--bootstrap-servers", second.bootstrap_servers, "--fail-on-data-loss", "false", cwd=tmp_path)
    assert going_on.returncode == 0, going_on.stderr[-3000:]
    assert "possible data loss" in going_on.stderr and "text-lines: the topic was recreated" in going_on.stderr
    assert counts(second.bootstrap_servers) == {word: 2 * n for word, n in EXPECTED.items()}


def test_a_bad_record_stops_the_query_with_one_line_naming_it(tmp_path: Path, brokers: Any) -> None:
    broker = EmbeddedBroker(port=None)
    broker.start()
    brokers.append(broker)
    app = tmp_path / "json_counts.py"
    app.write_text(
        "from pystreams import serdes\nfrom pystreams.app import App\n"
        "app = App('json_counts')\n"
        "app.topic('events', value=serdes.Json()).count(store='counts').to('event-counts')\n"
    )
    with ClusterMetadata(broker.bootstrap_servers) as cluster:
        cluster.ensure_topics([TopicSpec("events", 1), TopicSpec("event-counts", 1)])
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap_servers)
    for value in (b'{"n": 1}', b'{"n": 2}', b"not json", b'{"n": 3}'):
        producer.send("events", key=b"ann", value=value)
    producer.close()
    failed = spark_run(str(app), "--once", "--bootstrap-servers", broker.bootstrap_servers, cwd=tmp_path)
    assert failed.returncode == 1, failed.stderr[-3000:]
    (said,) = [line for line in failed.stderr.splitlines() if line.startswith("pystreams spark: query failed:")]
    assert said.startswith("pystreams spark: query failed: task 0_0: deserialization error on events-0@2 in node 'events'")
    assert "--deserialization-errors log-and-continue" in said
    assert "JVM stacktrace" not in failed.stderr and "Traceback" not in failed.stderr
