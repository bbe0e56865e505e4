"""Time to first output of a standalone worker (the README's "Running the pieces by hand"):
broker, coordinator and one ``pystreams worker examples/wordcount.py`` as processes; one line
produced once the worker announced itself; seconds from starting the worker to the first
record in ``word-counts``. Prints JSON, one entry per coordinator setting:

    .venv/bin/python benchmarks/first_output.py [--runs 2]

``defaults`` is the coordinator as it starts without options (5 s heartbeats and metadata
refresh, Kafka's production values); ``local`` the README's local settings.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from coordinator_process import start_coordinator, wordcount_worker
from kafka import KafkaConsumer, KafkaProducer

from pystreams.broker import EmbeddedBroker, free_port
from pystreams.cluster import ClusterMetadata, TopicSpec

SETTINGS = {
    "defaults": [],
    "local": ["--heartbeat-interval-ms", "500", "--min-heartbeat-interval-ms", "500", "--metadata-refresh-ms", "500"],
}


def one_run(coordinator_args: list[str], workdir: Path) -> float:
    broker = EmbeddedBroker(port=None)
    broker.start()
    port = free_port()
    coordinator = worker = None
    try:
        with ClusterMetadata(broker.bootstrap_servers) as cluster:
            cluster.ensure_topics([TopicSpec("text-lines", 4), TopicSpec("word-counts", 4)])
        coordinator = start_coordinator(broker.bootstrap_servers, port, *coordinator_args)
        consumer = KafkaConsumer("word-counts", bootstrap_servers=broker.bootstrap_servers, group_id=None, auto_offset_reset="earliest")
        started = time.monotonic()
        worker = subprocess.Popen(
            wordcount_worker(broker.bootstrap_servers, f"127.0.0.1:{port}", workdir / f"state-{port}"),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        producer = KafkaProducer(bootstrap_servers=broker.bootstrap_servers)
        producer.send("text-lines", key=b"1", value=b"the first output")
        producer.flush()
        producer.close()
        while time.monotonic() - started < 120:
            if any(consumer.poll(timeout_ms=100).values()):
                return time.monotonic() - started
        raise RuntimeError("no output within 120 s")
    finally:
        for process in (worker, coordinator):
            if process is not None:
                process.kill()
                process.wait()
        broker.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as workdir:
        for name, coordinator_args in SETTINGS.items():
            seconds = [one_run(coordinator_args, Path(workdir)) for _ in range(args.runs)]
            results[name] = {
                "coordinator_args": coordinator_args,
                "first_output_s": [round(s, 2) for s in seconds],
                "median_s": round(statistics.median(seconds), 2),
            }
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
