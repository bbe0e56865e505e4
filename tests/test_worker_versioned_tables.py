"""A versioned table on the worker's task engine against the embedded broker: orders join the
price each product had at the order's time, out-of-order price updates included, and a worker
starting on a wiped state directory restores every key's history from the changelog — later
orders, stamped in the past, still find the prices of their time."""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
from test_worker_engine import OffsetStore, create_topics, produce, read_all

from pystreams import App, serdes
from pystreams.cluster import TopicSpec
from pystreams.worker import EngineConfig, TaskEngine, resolve_against_cluster

pytestmark = pytest.mark.integration

WAIT_S = 30.0
HOUR = 3_600_000


def pricing_app(orders_topic: str, prices_topic: str, output_topic: str) -> App:
    app = App("versioned-on-workers")
    prices = app.table(prices_topic, value=serdes.Int(), versioned=HOUR, name="prices")
    orders = app.topic(orders_topic, value=serdes.Text())
    orders.join(prices, lambda product, order, price: f"{order}@{price}", how="left", value=serdes.Text()).to(output_topic)
    return app


def price_at(history: dict[str, list[tuple[int, int]]], product: str, timestamp: int) -> int | None:
    found = None
    for valid_from, price in sorted(history.get(product, [])):
        if valid_from <= timestamp:
            found = price
    return found


def test_orders_join_the_price_of_their_time_and_a_wiped_worker_restores_the_histories(kafka_bootstrap: str, tmp_path: Path, unique_topic) -> None:
    orders_topic, prices_topic, output_topic = unique_topic("orders"), unique_topic("prices"), unique_topic("priced")
    create_topics(kafka_bootstrap, TopicSpec(orders_topic, 2), TopicSpec(prices_topic, 2), TopicSpec(output_topic, 1))
    app = pricing_app(orders_topic, prices_topic, output_topic)
    rng = random.Random(4)
    base = 1_700_000_000_000
    history: dict[str, list[tuple[int, int]]] = {}
    updates = []
    for n in range(120):  # times shuffled: many updates arrive out of order
        product, timestamp = f"p{rng.randrange(6)}", base + rng.randrange(0, 30 * 60_000)
        history.setdefault(product, []).append((timestamp, n))
        updates.append((product.encode(), serdes.Int().serialize(n), timestamp))
    produce(kafka_bootstrap, prices_topic, updates)
    offsets = OffsetStore()
    resolved = resolve_against_cluster(app.topology(), kafka_bootstrap)

    def engine_in(state_dir: Path) -> TaskEngine:
        engine = TaskEngine(
            resolved, EngineConfig(kafka_bootstrap, state_dir, commit_interval_ms=200), committed_offsets=offsets.fetch, commit_offsets=offsets.commit
        )
        engine.start()
        engine.add_tasks(resolved.tasks)
        return engine

    def orders(first: int) -> tuple[list[tuple[bytes, bytes, int]], dict[str, str]]:
        records, expected = [], {}
        for n in range(first, first + 60):
            product, timestamp = f"p{rng.randrange(6)}", base + rng.randrange(0, 40 * 60_000)
            order = f"order{n}"
            records.append((product.encode(), serdes.Text().serialize(order), timestamp))
            expected[order] = f"{order}@{price_at(history, product, timestamp)}"
        return records, expected

    engine = engine_in(tmp_path / "state")
    try:
        deadline = time.monotonic() + WAIT_S
        while sum(len(dict(store.items())) for store in engine.stores("prices")) < len(history):
            assert time.monotonic() < deadline, "the price table did not load"
            engine.run(timeout_s=0.2)
        records, expected = orders(0)
        produce(kafka_bootstrap, orders_topic, records)
        assert _priced(engine, kafka_bootstrap, output_topic, expected) == sorted(expected.values())
    finally:
        engine.close()

    # A fresh state directory: the histories come back from the changelog, then orders with
    # timestamps in the past find the prices of their time again.
    engine = engine_in(tmp_path / "wiped")
    try:
        records, expected = orders(1000)
        produce(kafka_bootstrap, orders_topic, records)
        assert _priced(engine, kafka_bootstrap, output_topic, expected) == sorted(expected.values())
    finally:
        engine.close()


def _priced(engine: TaskEngine, bootstrap: str, topic: str, expected: dict[str, str]) -> list[str]:
    """The output values for the expected orders (the output is keyed by product)."""
    wanted = set(expected)
    deadline = time.monotonic() + WAIT_S
    while True:
        engine.run(timeout_s=0.5)
        values = sorted(v for r in read_all(bootstrap, topic) if (v := serdes.Text().deserialize(r.value)).split("@")[0] in wanted)
        if len(values) >= len(wanted) or time.monotonic() > deadline:
            return values
