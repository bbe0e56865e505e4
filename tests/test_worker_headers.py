"""Record headers on the worker against the embedded broker: every output record carries the
headers of the input record it came from, through a real packed repartition (format 2) and
the producer, and records without headers stay without."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from kafka import KafkaProducer
from test_worker_engine import OffsetStore, create_topics, read_all

from pystreams import App, serdes
from pystreams.cluster import TopicSpec
from pystreams.worker import EngineConfig, TaskEngine, resolve_against_cluster

pytestmark = pytest.mark.integration

WAIT_S = 30.0


def test_headers_survive_a_packed_repartition_to_the_output(kafka_bootstrap: str, tmp_path: Path, unique_topic) -> None:
    source, output = unique_topic("in"), unique_topic("out")
    create_topics(kafka_bootstrap, TopicSpec(source, 2), TopicSpec(output, 1))
    app = App("headers-on-workers")
    app.topic(source, value=serdes.Text()).select_key(lambda key, value: value[-1]).repartition().map_values(
        lambda key, value: value.upper(), value=serdes.Text()
    ).to(output)
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap)
    for n in range(40):
        headers = [("n", str(n).encode()), ("source", b"test")] if n % 2 == 0 else None
        producer.send(source, key=f"k{n}".encode(), value=f"v{n}".encode(), headers=headers)
    producer.flush()
    producer.close()
    assert app.topology().repartition_topics  # the records go through a packed repartition topic
    resolved = resolve_against_cluster(app.topology(), kafka_bootstrap)
    offsets = OffsetStore()
    engine = TaskEngine(
        resolved, EngineConfig(kafka_bootstrap, tmp_path / "state", commit_interval_ms=200), committed_offsets=offsets.fetch, commit_offsets=offsets.commit
    )
    engine.start()
    try:
        engine.add_tasks(resolved.tasks)
        deadline = time.monotonic() + WAIT_S
        records: list = []
        while len(records) < 40 and time.monotonic() < deadline:
            engine.run(timeout_s=0.5)
            records = read_all(kafka_bootstrap, output)
    finally:
        engine.close()
    assert len(records) == 40
    for record in records:
        n = int(record.value.decode()[1:])
        expected = [("n", str(n).encode()), ("source", b"test")] if n % 2 == 0 else []
        assert list(record.headers or []) == expected, record
