"""Table joins on one worker: records/s of one TaskEngine on the embedded broker.

* ``table_table_join``: two tables of ``--keys`` keys each (2 partitions), every input record
  an update of one side; an inner join kept in a store (``store=``) and written to a topic;
* ``foreign_key_join``: orders (``--records`` updates over ``--keys`` orders) naming one of
  ``--keys // 10`` customers, joined with the customers table (``foreign_key=``), kept in a
  store; each order update goes through the registration and response topics (three
  sub-topology hops), customer updates fan out to their subscribers;
* ``wordcount`` (the same app as ``throughput.py``) on the same machine in the same run, for
  comparison.

Timing starts when the engine starts on input already in the topics and ends when every input
record and every internal record is processed. Prints one JSON document.

    python benchmarks/tables.py [--records N] [--keys K]
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from kafka import KafkaProducer

from pystreams import serdes
from pystreams.app import App
from pystreams.broker import EmbeddedBroker
from pystreams.cluster import ClusterMetadata, TopicSpec
from pystreams.worker import EngineConfig, TaskEngine, resolve_against_cluster
from pystreams.worker.kafka_io import DEFAULT_PRODUCER_CONFIG

sys.path.insert(0, str(Path(__file__).resolve().parent))
from throughput import VOCABULARY, wordcount_app

PARTITIONS = 2


def produce(bootstrap: str, topic: str, records: list[tuple[bytes, bytes | None]]) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, **DEFAULT_PRODUCER_CONFIG)
    for key, value in records:
        producer.send(topic, key=key, value=value)
    producer.flush()
    producer.close()


def timed(bootstrap: str, app: App, state_dir: Path, inputs: int, done: Callable[[TaskEngine], bool] | None = None) -> float:
    """Seconds until the engine has processed its ``inputs`` input records and, when given,
    ``done(engine)`` holds (what the internal topics still carry has arrived)."""
    resolved = resolve_against_cluster(app.topology(), bootstrap)
    engine = TaskEngine(resolved, EngineConfig(bootstrap, state_dir, commit_interval_ms=1000), committed_offsets=lambda ps: {}, commit_offsets=lambda o: None)
    engine.start()
    engine.add_tasks(resolved.tasks)
    started = time.perf_counter()
    engine.run(until=lambda: engine.records_processed >= inputs, timeout_s=900)
    assert engine.records_processed >= inputs, "the engine did not read its input"
    if done is not None:
        checked = [time.perf_counter()]

        def finished() -> bool:
            if time.perf_counter() - checked[0] < 0.2:
                return False
            checked[0] = time.perf_counter()
            return done(engine)

        engine.run(until=finished, timeout_s=900)
        assert done(engine), "the engine did not finish"
    elapsed = time.perf_counter() - started
    engine.close()
    return elapsed


def table_table_join(bootstrap: str, tmp: Path, records: int, keys: int, rng: random.Random) -> dict:
    with ClusterMetadata(bootstrap) as cluster:
        cluster.ensure_topics([TopicSpec(t, PARTITIONS) for t in ("tt-left", "tt-right", "tt-out")])
    for topic in ("tt-left", "tt-right"):
        produce(bootstrap, topic, [(f"k{rng.randrange(keys)}".encode(), serdes.Int().serialize(i)) for i in range(records // 2)])
    app = App("bench-table-join")
    left = app.table("tt-left", value=serdes.Int())
    right = app.table("tt-right", value=serdes.Int())
    left.join(right, lambda key, a, b: a + b, value=serdes.Int(), store="sums").to_stream().to("tt-out")
    elapsed = timed(bootstrap, app, tmp / "table-join", records)
    return {"input_records": records, "keys": keys, "seconds": round(elapsed, 3), "records_per_s": round(records / elapsed)}


def foreign_key_join(bootstrap: str, tmp: Path, records: int, keys: int, rng: random.Random) -> dict:
    customers = max(1, keys // 10)
    with ClusterMetadata(bootstrap) as cluster:
        cluster.ensure_topics([TopicSpec(t, PARTITIONS) for t in ("fk-orders", "fk-customers")])
    produce(bootstrap, "fk-customers", [(f"c{c}".encode(), f"city{c}".encode()) for c in range(customers)])
    json_serde = serdes.Json()
    updates = [(f"o{rng.randrange(keys)}", {"customer": f"c{rng.randrange(customers)}", "n": i}) for i in range(records)]
    produce(bootstrap, "fk-orders", [(key.encode(), json_serde.serialize(order)) for key, order in updates])
    final = dict(updates)
    expected = {key: f"city{order['customer'][1:]}" for key, order in final.items()}
    app = App("bench-fk-join")
    orders = app.table("fk-orders", value=serdes.Json())
    table = app.table("fk-customers", value=serdes.Text())
    orders.join(table, lambda key, order, city: city, foreign_key=lambda key, order: order["customer"], value=serdes.Text(), store="shipping")
    # Done when every order's answer has come back: the joined table is the offline join.
    elapsed = timed(bootstrap, app, tmp / "fk-join", records + customers, lambda engine: engine.store_contents("shipping") == expected)
    return {
        "order_updates": records,
        "orders": len(final),
        "customers": customers,
        "seconds": round(elapsed, 3),
        "order_updates_per_s": round(records / elapsed),
    }


def wordcount(bootstrap: str, tmp: Path, records: int, rng: random.Random) -> dict:
    words_per_line = 5
    lines = records // words_per_line
    with ClusterMetadata(bootstrap) as cluster:
        cluster.ensure_topics([TopicSpec(t, PARTITIONS) for t in ("wc-lines", "wc-counts")])
    produce(bootstrap, "wc-lines", [(str(i).encode(), " ".join(rng.choices(VOCABULARY, k=words_per_line)).encode()) for i in range(lines)])
    elapsed = timed(bootstrap, wordcount_app("bench-tables-wordcount", "wc-lines", "wc-counts"), tmp / "wordcount", lines + lines * words_per_line)
    return {"lines": lines, "seconds": round(elapsed, 3), "lines_per_s": round(lines / elapsed)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--keys", type=int, default=10_000)
    args = parser.parse_args()
    rng = random.Random(7)
    results: dict = {"python": sys.version.split()[0], "machine": platform.machine(), "partitions": PARTITIONS}
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory() as tmp:
        bootstrap = broker.bootstrap_servers
        results["table_table_join"] = table_table_join(bootstrap, Path(tmp), args.records, args.keys, rng)
        results["foreign_key_join"] = foreign_key_join(bootstrap, Path(tmp), args.records, args.keys, rng)
        results["wordcount"] = wordcount(bootstrap, Path(tmp), args.records, rng)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
