"""Table joins on real processes: the embedded broker, the coordinator and two workers, one
SIGKILLed mid-stream. The table–table join's and the foreign-key join's output topics end as
the offline joins of the final tables (an at-least-once restart may repeat results, never
lose or invent one): the killed worker's tasks, their stores and the foreign-key join's
subscriptions move to the survivor, rebuilt from the changelogs."""

from __future__ import annotations

import random
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaProducer
from worker_support import Cluster, Workers, fleet_of, wait_for

from pystreams import serdes
from pystreams.cluster import ClusterMetadata, TopicSpec
from pystreams.commands.dev import LatestValueReader

pytestmark = [pytest.mark.integration, pytest.mark.slow]

APP = Path(__file__).resolve().parent / "apps" / "table_joins.py"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    running = Cluster(tmp_path)
    try:
        with ClusterMetadata(running.bootstrap) as metadata:
            metadata.ensure_topics([TopicSpec("tj-left", 3), TopicSpec("tj-right", 3), TopicSpec("tj-orders", 2), TopicSpec("tj-customers", 3)])
        yield running
    finally:
        running.stop()


@pytest.fixture
def workers(cluster: Cluster, tmp_path: Path) -> Iterator[Workers]:
    yield from fleet_of(Workers(cluster.bootstrap, cluster.coordinator_address, tmp_path, APP))


class Updates:
    """Random upserts and deletes of the four tables, sent at a steady pace from a thread, with
    the final tables kept for the offline joins."""

    def __init__(self, bootstrap: str, rounds: int) -> None:
        self.tables: dict[str, dict[str, Any]] = {"tj-left": {}, "tj-right": {}, "tj-orders": {}, "tj-customers": {}}
        self._producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
        self._rng = random.Random(5)
        self._rounds = rounds
        self.sent = 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _one(self) -> tuple[str, str, bytes | None]:
        rng = self._rng
        topic = rng.choice(list(self.tables))
        key = {"tj-left": "k", "tj-right": "k", "tj-orders": "o", "tj-customers": "c"}[topic] + str(rng.randrange(15))
        if rng.random() < 0.2:
            self.tables[topic].pop(key, None)
            return topic, key, None
        if topic == "tj-orders":
            value: Any = {"n": rng.randrange(1000), "c": f"c{rng.randrange(15)}"}
            self.tables[topic][key] = value
            return topic, key, serdes.Json().serialize(value)
        number = rng.randrange(1, 500)
        self.tables[topic][key] = number
        return topic, key, serdes.Int().serialize(number)

    def _run(self) -> None:
        for _ in range(self._rounds):
            for _ in range(20):
                topic, key, value = self._one()
                self._producer.send(topic, key=key.encode(), value=value)
                self.sent += 1
            self._producer.flush()
            time.sleep(0.05)
        self._producer.close()

    def join(self) -> None:
        self._thread.join(120)
        assert not self._thread.is_alive(), "the producer did not finish"

    def joined(self) -> dict[str, int]:
        left, right = self.tables["tj-left"], self.tables["tj-right"]
        return {k: left.get(k, 0) * 1000 + right.get(k, 0) for k in {*left, *right}}

    def fk_joined(self) -> dict[str, int]:
        customers = self.tables["tj-customers"]
        return {k: order["n"] * 1000 + customers.get(order["c"], 999) for k, order in self.tables["tj-orders"].items()}


def test_table_and_foreign_key_joins_end_exact_through_a_sigkilled_worker(cluster: Cluster, workers: Workers) -> None:
    workers.start()
    workers.start()
    wait_for(lambda: all("started tasks" in workers.log(i) for i in range(2)), 30, "both workers to start tasks\n" + workers.log_tails())
    joined, fk = LatestValueReader(cluster.bootstrap, "tj-joined"), LatestValueReader(cluster.bootstrap, "tj-fk")
    try:
        updates = Updates(cluster.bootstrap, rounds=120)
        wait_for(lambda: updates.sent >= 600 and joined.read_more(0.2) and fk.read_more(0.2), 60, "results while updates flow\n" + workers.log_tails())
        workers.processes[0].send_signal(signal.SIGKILL)
        assert workers.processes[0].wait(10) == -signal.SIGKILL
        updates.join()
        expected_joined, expected_fk = updates.joined(), updates.fk_joined()
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and (joined.latest != expected_joined or fk.latest != expected_fk):
            joined.read_more(0.3)
            fk.read_more(0.3)
        assert joined.latest == expected_joined, workers.log_tails()
        assert fk.latest == expected_fk, workers.log_tails()
        assert "started tasks" in workers.log(1)
    finally:
        joined.close()
        fk.close()
