"""A global table on real processes (embedded broker, coordinator, two workers): a worker
joining a running group restores the whole global topic — 20,000 rows over three partitions —
before it takes any task, so not one of its lookups misses a row that was there, and it
answers interactive queries on the global table itself."""

from __future__ import annotations

import re
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka import KafkaProducer
from worker_support import Cluster, Workers, fleet_of, wait_for

from pystreams import serdes
from pystreams.app import load_app
from pystreams.broker import free_port
from pystreams.cluster import ClusterMetadata, TopicSpec
from pystreams.commands.dev import LatestValueReader

pytestmark = [pytest.mark.integration, pytest.mark.slow]

APP_PATH = Path(__file__).resolve().parent / "apps" / "global_enrich.py"
CUSTOMERS = 20_000
MISSING = 999_999


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    running = Cluster(tmp_path)
    try:
        with ClusterMetadata(running.bootstrap) as metadata:
            metadata.ensure_topics([TopicSpec("ge-orders", 4), TopicSpec("ge-customers", 3)])
        producer = KafkaProducer(bootstrap_servers=running.bootstrap, linger_ms=20)
        for n in range(CUSTOMERS):
            producer.send("ge-customers", key=f"c{n}".encode(), value=serdes.Int().serialize(n % 1000))
        producer.flush()
        producer.close()
        yield running
    finally:
        running.stop()


@pytest.fixture
def workers(cluster: Cluster, tmp_path: Path) -> Iterator[Workers]:
    yield from fleet_of(Workers(cluster.bootstrap, cluster.coordinator_address, tmp_path, APP_PATH))


class Orders:
    """Orders naming existing customers, sent at a steady pace from a thread."""

    def __init__(self, bootstrap: str, count: int) -> None:
        self.expected: dict[str, int] = {}
        self._producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
        self._count = count
        self.sent = 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        for n in range(self._count):
            customer = (n * 7919) % CUSTOMERS
            self.expected[f"o{n}"] = n * 1_000_000 + customer % 1000
            self._producer.send("ge-orders", key=f"o{n}".encode(), value=serdes.Json().serialize({"n": n, "c": f"c{customer}"}))
            self.sent += 1
            if n % 20 == 19:
                self._producer.flush()
                time.sleep(0.02)
        self._producer.flush()
        self._producer.close()

    def join(self) -> None:
        self._thread.join(120)
        assert not self._thread.is_alive(), "the producer did not finish"


def test_a_joining_worker_restores_the_whole_global_table_before_its_first_lookup(cluster: Cluster, workers: Workers) -> None:
    first_endpoint, second_endpoint = (f"127.0.0.1:{free_port()}" for _ in range(2))
    metrics_port = free_port()
    workers.start("--user-endpoint", first_endpoint)
    wait_for(lambda: "started tasks" in workers.log(0), 60, "the first worker to start tasks\n" + workers.log_tails())
    enriched = LatestValueReader(cluster.bootstrap, "ge-enriched")
    try:
        orders = Orders(cluster.bootstrap, 3000)
        wait_for(lambda: orders.sent >= 500 and enriched.read_more(0.2), 60, "results while orders flow\n" + workers.log_tails())
        workers.start("--user-endpoint", second_endpoint, "--http-port", str(metrics_port))
        wait_for(lambda: "started tasks" in workers.log(1), 60, "the second worker to start tasks\n" + workers.log_tails())
        orders.join()
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and enriched.latest != orders.expected:
            enriched.read_more(0.3)
        assert enriched.latest == orders.expected, workers.log_tails()
        assert not [key for key, value in enriched.latest.items() if value % 1_000_000 == MISSING]

        log = workers.log(1)
        restored = re.search(r"global tables ge-customers restored \((\d+) records\)", log)
        assert restored is not None and int(restored.group(1)) == CUSTOMERS, log
        assert log.index("global tables ge-customers restored") < log.index("started tasks"), log

        # The joining worker answers for the global table itself, whole: any key, any partition.
        app = load_app(str(APP_PATH))
        for n in (0, 7, 12_345, CUSTOMERS - 1):
            assert app.query("ge-customers", f"c{n}", endpoints=[second_endpoint], timeout_s=10) == n % 1000
        assert app.query("ge-customers", "nobody", endpoints=[second_endpoint], timeout_s=10) is None
        assert len(app.query_prefix("ge-customers", "c1999", endpoints=[second_endpoint], timeout_s=10)) == 11

        # Its metrics: every row applied, and (the topic quiet) no lag.
        def metric(name: str) -> float | None:
            body = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).read().decode()
            found = re.search(rf'^{name}{{table="ge-customers"}} (\S+)$', body, re.M)
            return float(found.group(1)) if found else None

        assert metric("pystreams_global_table_records_total") == CUSTOMERS
        assert metric("pystreams_global_table_lag_records") == 0
    finally:
        enriched.close()
