"""Windowed aggregation throughput: records/s of one TaskEngine (every task, at_least_once,
1 s commits) on the embedded broker, per window kind, on the same keyed input.

* ``tumbling``: count per key and 1-minute window (one window per record);
* ``hopping``: count per key, 1-minute windows advancing by 10 s (six windows per record);
* ``sliding``: count per key, 1-minute sliding window (a record reads the key's windows of
  two minutes back and writes its left window, updates those covering it, and may create a
  right window);
* ``session``: count per key, 30 s inactivity gap;
* ``cogroup_tumbling``: the tumbling count as a cogroup of two topics (half the records each).

Input: keyed records (1,000 keys), timestamps moving forward ~1 s per 100 records with 5%
out of order within the grace. Timing starts when the engine starts consuming input already in
the topics and ends when every record is processed. Prints one JSON document.

    python benchmarks/windows.py [--records N]
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

from pystreams import serdes
from pystreams.app import App, HoppingWindow, SessionWindow, SlidingWindow, TumblingWindow
from pystreams.broker import EmbeddedBroker
from pystreams.cluster import ClusterMetadata, TopicSpec
from pystreams.worker import EngineConfig, TaskEngine, resolve_against_cluster
from pystreams.worker.kafka_io import DEFAULT_PRODUCER_CONFIG

PARTITIONS = 2
KEYS = 1000
MINUTE = 60_000
BASE_MS = 1_700_000_040_000


def fill(bootstrap: str, topics: list[str], total: int, rng: random.Random) -> None:
    """``total`` keyed records over ``topics`` (round robin)."""
    producer = KafkaProducer(bootstrap_servers=bootstrap, **DEFAULT_PRODUCER_CONFIG)
    for i in range(total):
        timestamp = BASE_MS + i * 10
        if rng.random() < 0.05:
            timestamp -= rng.randint(1_000, 9_000)  # out of order, within the 10 s grace
        producer.send(topics[i % len(topics)], key=f"user{rng.randrange(KEYS)}".encode(), value=b"x", timestamp_ms=timestamp)
    producer.flush()
    producer.close()


def windowed_app(kind: str) -> App:
    app = App(f"bench-{kind}")
    clicks = app.topic(f"{kind}-clicks", value=serdes.Bytes())
    grace = 10_000
    if kind == "cogroup_tumbling":
        views = app.topic(f"{kind}-views", value=serdes.Bytes())
        table = (
            clicks.cogroup(lambda n, key, value: n + 1)
            .cogroup(views, lambda n, key, value: n + 1)
            .aggregate(initial=0, store="counts", window=TumblingWindow(size=MINUTE, grace=grace))
        )
    else:
        window = {
            "tumbling": TumblingWindow(size=MINUTE, grace=grace),
            "hopping": HoppingWindow(size=MINUTE, advance=10_000, grace=grace),
            "sliding": SlidingWindow(difference=MINUTE, grace=grace),
            "session": SessionWindow(gap=30_000, grace=grace),
        }[kind]
        table = clicks.count(store="counts", window=window)
    table.to(f"{kind}-counts")
    return app


def run(bootstrap: str, app: App, state_dir: Path, total: int) -> float:
    resolved = resolve_against_cluster(app.topology(), bootstrap)
    engine = TaskEngine(
        resolved,
        EngineConfig(bootstrap, state_dir, commit_interval_ms=1000),
        committed_offsets=lambda partitions: {},
        commit_offsets=lambda offsets: None,
    )
    engine.start()
    engine.add_tasks(resolved.tasks)
    started = time.perf_counter()
    engine.run(until=lambda: engine.records_processed >= total, timeout_s=900)
    elapsed = time.perf_counter() - started
    assert engine.records_processed >= total, "engine did not finish"
    engine.close()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--only", nargs="*", default=["tumbling", "hopping", "sliding", "session", "cogroup_tumbling"])
    args = parser.parse_args()
    total = args.records
    results: dict = {"python": sys.version.split()[0], "machine": platform.machine(), "records": total, "partitions": PARTITIONS, "keys": KEYS}
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory() as tmp:
        bootstrap = broker.bootstrap_servers
        for kind in args.only:
            # Topics of its own per kind: each app reads only its input, from the beginning.
            topics = [f"{kind}-clicks", f"{kind}-views"] if kind == "cogroup_tumbling" else [f"{kind}-clicks"]
            with ClusterMetadata(bootstrap) as cluster:
                cluster.ensure_topics([TopicSpec(t, PARTITIONS) for t in (*topics, f"{kind}-counts")])
            fill(bootstrap, topics, total, random.Random(7))
            elapsed = run(bootstrap, windowed_app(kind), Path(tmp) / kind, total)
            results[kind] = {"seconds": round(elapsed, 3), "records_per_s": round(total / elapsed)}
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
