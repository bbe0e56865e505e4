"""Global tables on the worker's task engine against the embedded broker: the whole topic, all
partitions, is restored before any task starts; updates reach lookups as the topic grows; a
restart restores only what the topic gained since the checkpoint; under exactly-once an
aborted transaction on the global topic never reaches a lookup."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from kafka import KafkaProducer
from test_worker_engine import OffsetStore, create_topics, latest_by_key, produce, read_all

from pystreams import App, serdes
from pystreams.cluster import TopicSpec
from pystreams.guarantee import ProcessingGuarantee
from pystreams.worker import EngineConfig, TaskEngine, resolve_against_cluster

pytestmark = pytest.mark.integration

WAIT_S = 30.0


def enrich_app(app_id: str, orders_topic: str, customers_topic: str, output_topic: str) -> App:
    app = App(app_id)
    orders = app.topic(orders_topic)
    customers = app.global_table(customers_topic, store="customers")
    orders.join(
        customers,
        lambda key, order, customer: f"{order['n']}@{customer['city'] if customer else None}",
        foreign_key=lambda key, order: order["customer"],
        how="left",
        value=serdes.Text(),
    ).to(output_topic)
    return app


def customer_records(cities: dict[str, str]) -> list[tuple[bytes, bytes, None]]:
    return [(key.encode(), serdes.Json().serialize({"city": city}), None) for key, city in cities.items()]


def order_records(orders: dict[str, tuple[int, str]]) -> list[tuple[bytes, bytes, None]]:
    return [(key.encode(), serdes.Json().serialize({"n": n, "customer": customer}), None) for key, (n, customer) in orders.items()]


def engine_for(app: App, bootstrap: str, state_dir: Path, offsets: OffsetStore, **config: object) -> TaskEngine:
    resolved = resolve_against_cluster(app.topology(), bootstrap)
    return TaskEngine(
        resolved, EngineConfig(bootstrap, state_dir, commit_interval_ms=200, **config), committed_offsets=offsets.fetch, commit_offsets=offsets.commit
    )  # type: ignore[arg-type]


def wait_for_output(bootstrap: str, topic: str, engine: TaskEngine, expected: dict[str, str]) -> dict[str, str]:
    deadline = time.monotonic() + WAIT_S
    while True:
        engine.run(timeout_s=0.5)
        found = latest_by_key(read_all(bootstrap, topic), serdes.Text(), serdes.Text())
        if all(found.get(key) == value for key, value in expected.items()) or time.monotonic() > deadline:
            return found


def test_the_whole_global_topic_is_restored_before_tasks_start_then_followed_and_resumed(kafka_bootstrap: str, tmp_path: Path, unique_topic) -> None:
    orders_topic, customers_topic, output_topic = unique_topic("orders"), unique_topic("customers"), unique_topic("enriched")
    create_topics(kafka_bootstrap, TopicSpec(orders_topic, 2), TopicSpec(customers_topic, 3), TopicSpec(output_topic, 1))
    cities = {f"c{n}": f"city-{n}" for n in range(300)}
    produce(kafka_bootstrap, customers_topic, customer_records(cities))
    app = enrich_app("global-on-workers", orders_topic, customers_topic, output_topic)
    offsets = OffsetStore()
    engine = engine_for(app, kafka_bootstrap, tmp_path / "state", offsets)
    engine.start()
    try:
        # Restored in start(), before any task exists: every row, from all three partitions.
        assert engine.global_tables is not None
        assert engine.global_tables.records_restored == 300
        assert engine.global_tables.stores["customers"].position(0) is not None
        orders = {f"o{n}": (n, f"c{n * 7 % 300}") for n in range(100)}
        produce(kafka_bootstrap, orders_topic, order_records(orders))
        engine.add_tasks(engine.resolved.tasks)
        expected = {key: f"{n}@city-{n * 7 % 300}" for key, (n, _) in orders.items()}
        assert wait_for_output(kafka_bootstrap, output_topic, engine, expected) == expected

        # Followed: a customer who moves (and one deleted) is seen by the next lookups.
        produce(kafka_bootstrap, customers_topic, [(b"c0", serdes.Json().serialize({"city": "moved"}), None), (b"c7", None, None)])
        deadline = time.monotonic() + WAIT_S
        while engine.global_tables.stores["customers"].get(b"c7") is not None and time.monotonic() < deadline:
            engine.run(timeout_s=0.2)
        produce(kafka_bootstrap, orders_topic, order_records({"o0": (1000, "c0"), "o1": (1001, "c7")}))
        assert {
            k: v for k, v in wait_for_output(kafka_bootstrap, output_topic, engine, {"o0": "1000@moved", "o1": "1001@None"}).items() if k in ("o0", "o1")
        } == {
            "o0": "1000@moved",
            "o1": "1001@None",
        }
    finally:
        engine.close()

    # While the worker is down the topic gains 20 rows: a restart restores those only.
    produce(kafka_bootstrap, customers_topic, customer_records({f"new{n}": "later" for n in range(20)}))
    engine = engine_for(app, kafka_bootstrap, tmp_path / "state", offsets)
    engine.start()
    try:
        assert engine.global_tables is not None
        assert engine.global_tables.records_restored == 20
        assert engine.global_tables.stores["customers"].get(b"new19") is not None
        assert engine.global_tables.stores["customers"].get(b"c7") is None
    finally:
        engine.close()


def test_under_exactly_once_an_aborted_global_update_never_reaches_a_lookup(kafka_bootstrap: str, tmp_path: Path, unique_topic) -> None:
    orders_topic, customers_topic, output_topic = unique_topic("orders"), unique_topic("customers"), unique_topic("enriched")
    create_topics(kafka_bootstrap, TopicSpec(orders_topic, 1), TopicSpec(customers_topic, 2), TopicSpec(output_topic, 1))
    produce(kafka_bootstrap, customers_topic, customer_records({"c1": "committed"}))
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, transactional_id=f"{customers_topic}-writer", enable_idempotence=True)
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(customers_topic, key=b"c1", value=serdes.Json().serialize({"city": "aborted"}))
        producer.flush()
        producer.abort_transaction()
    finally:
        producer.close()
    app = enrich_app("global-exactly-once", orders_topic, customers_topic, output_topic)
    engine = engine_for(app, kafka_bootstrap, tmp_path / "state", OffsetStore(), processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE_V2)
    engine.start()
    try:
        assert engine.global_tables is not None
        assert engine.global_tables.stores["customers"].get(b"c1") == serdes.Json().serialize({"city": "committed"})
        produce(kafka_bootstrap, orders_topic, order_records({"o1": (1, "c1")}))
        engine.add_tasks(engine.resolved.tasks)
        assert wait_for_output(kafka_bootstrap, output_topic, engine, {"o1": "1@committed"}) == {"o1": "1@committed"}
    finally:
        engine.close()
