"""Table steps on the worker's task engine against the embedded broker: a materialized outer
table–table join and a grouped table's reduce end as the offline answer over the final tables,
and a wiped state directory rebuilds both (and each row's group, which the next update
subtracts) from the changelogs."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
from test_worker_engine import OffsetStore, create_topics, produce

from pystreams import serdes
from pystreams.app import App
from pystreams.cluster import TopicSpec
from pystreams.worker import EngineConfig, TaskEngine, resolve_against_cluster

pytestmark = pytest.mark.integration

WAIT_S = 30.0


def tables_app(left_topic: str, right_topic: str) -> App:
    app = App("tables-on-workers")
    left = app.table(left_topic, value=serdes.Int(), name="left")
    right = app.table(right_topic, value=serdes.Int(), name="right")
    left.join(right, lambda key, a, b: (a or 0) * 1000 + (b or 0), how="outer", value=serdes.Int(), store="joined", name="joined")

    def subtract(total: int, key: str, value: int) -> int | None:
        return None if total == value else total - value

    left.group_by(lambda key, value: ("even" if value % 2 == 0 else "odd", value), value=serdes.Int()).reduce(
        lambda total, key, value: total + value, subtract, store="by-parity", name="by-parity"
    )
    return app


def expected(left: dict[str, int], right: dict[str, int]) -> tuple[dict[str, int], dict[str, int]]:
    joined = {k: left.get(k, 0) * 1000 + right.get(k, 0) for k in {*left, *right}}
    parity: dict[str, int] = {}
    for value in left.values():
        group = "even" if value % 2 == 0 else "odd"
        parity[group] = parity.get(group, 0) + value
    return joined, parity


def updates(rng: random.Random, final: dict[str, int], count: int) -> list[tuple[bytes, bytes | None, None]]:
    """Random upserts and deletes over ten keys; ``final`` follows them."""
    records = []
    for _ in range(count):
        key = f"k{rng.randrange(10)}"
        if rng.random() < 0.25:
            final.pop(key, None)
            records.append((key.encode(), None, None))
        else:
            value = rng.randrange(1, 50)
            final[key] = value
            records.append((key.encode(), serdes.Int().serialize(value), None))
    return records


def run(app: App, bootstrap: str, state_dir: Path, offsets: OffsetStore, done: Any) -> TaskEngine:
    resolved = resolve_against_cluster(app.topology(), bootstrap)
    engine = TaskEngine(resolved, EngineConfig(bootstrap, state_dir, commit_interval_ms=200), committed_offsets=offsets.fetch, commit_offsets=offsets.commit)
    engine.start()
    engine.add_tasks(resolved.tasks)
    engine.run(until=lambda: done(engine), timeout_s=WAIT_S)
    return engine


def test_table_join_and_grouped_reduce_end_exact_and_rebuild_from_their_changelogs(kafka_bootstrap: str, tmp_path: Path, unique_topic) -> None:
    left_topic, right_topic = unique_topic("left"), unique_topic("right")
    create_topics(kafka_bootstrap, TopicSpec(left_topic, 2), TopicSpec(right_topic, 2))
    app = tables_app(left_topic, right_topic)
    rng = random.Random(7)
    left: dict[str, int] = {}
    right: dict[str, int] = {}
    produce(kafka_bootstrap, left_topic, updates(rng, left, 60))
    produce(kafka_bootstrap, right_topic, updates(rng, right, 60))
    offsets = OffsetStore()

    def caught_up(engine: TaskEngine) -> bool:
        joined, parity = expected(left, right)
        return engine.store_contents("joined") == joined and engine.store_contents("by-parity") == parity

    engine = run(app, kafka_bootstrap, tmp_path / "state", offsets, caught_up)
    try:
        joined, parity = expected(left, right)
        assert engine.store_contents("joined") == joined
        assert engine.store_contents("by-parity") == parity
    finally:
        engine.close()

    # A wiped state directory: every store, the rows' groups included, comes back from its
    # changelog; updates after that move rows out of the groups they were restored into.
    produce(kafka_bootstrap, left_topic, updates(rng, left, 40))
    produce(kafka_bootstrap, right_topic, updates(rng, right, 40))
    engine = run(app, kafka_bootstrap, tmp_path / "wiped", offsets, caught_up)
    try:
        joined, parity = expected(left, right)
        assert engine.store_contents("joined") == joined
        assert engine.store_contents("by-parity") == parity
    finally:
        engine.close()


def fk_app(orders_topic: str, customers_topic: str, app_id: str = "fk-on-workers") -> App:
    app = App(app_id)  # its own internal topics per test: the broker lives for the session
    orders = app.table(orders_topic, value=serdes.Json(), name="orders")
    customers = app.table(customers_topic, value=serdes.Int(), name="customers")
    orders.join(
        customers,
        lambda key, order, zone: f"{order['n']}:{zone}",
        foreign_key=lambda key, order: order["c"],
        how="left",
        value=serdes.Text(),
        store="enriched",
        name="enriched",
    )
    return app


def test_a_foreign_key_join_across_differently_partitioned_tables_ends_exact_and_rebuilds(kafka_bootstrap: str, tmp_path: Path, unique_topic) -> None:
    """Orders on 2 partitions name customers on 3: no co-partitioning, answers routed back by
    order key; a wiped state directory restores the subscriptions and each order's foreign
    key, and later moves between customers come out right."""
    orders_topic, customers_topic = unique_topic("orders"), unique_topic("customers")
    create_topics(kafka_bootstrap, TopicSpec(orders_topic, 2), TopicSpec(customers_topic, 3))
    app = fk_app(orders_topic, customers_topic)
    rng = random.Random(11)
    orders: dict[str, dict[str, Any]] = {}
    customers: dict[str, int] = {}

    def order_updates(count: int) -> list[tuple[bytes, bytes | None, None]]:
        records = []
        for n in range(count):
            key = f"o{rng.randrange(12)}"
            if rng.random() < 0.2:
                orders.pop(key, None)
                records.append((key.encode(), None, None))
            else:
                orders[key] = {"n": n, "c": f"k{rng.randrange(10)}"}
                records.append((key.encode(), serdes.Json().serialize(orders[key]), None))
        return records

    def joined() -> dict[str, str]:
        return {key: f"{order['n']}:{customers.get(order['c'])}" for key, order in orders.items()}

    produce(kafka_bootstrap, orders_topic, order_updates(50))
    produce(kafka_bootstrap, customers_topic, updates(rng, customers, 40))
    offsets = OffsetStore()
    engine = run(app, kafka_bootstrap, tmp_path / "state", offsets, lambda engine: engine.store_contents("enriched") == joined())
    try:
        assert engine.store_contents("enriched") == joined()
    finally:
        engine.close()
    produce(kafka_bootstrap, orders_topic, order_updates(30))
    produce(kafka_bootstrap, customers_topic, updates(rng, customers, 20))
    engine = run(app, kafka_bootstrap, tmp_path / "wiped", offsets, lambda engine: engine.store_contents("enriched") == joined())
    try:
        assert engine.store_contents("enriched") == joined()
    finally:
        engine.close()


def test_a_foreign_key_join_under_exactly_once_ends_exact(kafka_bootstrap: str, tmp_path: Path, unique_topic) -> None:
    """The registration and response topics are written inside the stream thread's
    transactions, and read read_committed behind the transaction filter, like every repartition
    topic: the join still ends as the offline join."""
    from pystreams.guarantee import ProcessingGuarantee

    orders_topic, customers_topic = unique_topic("orders"), unique_topic("customers")
    create_topics(kafka_bootstrap, TopicSpec(orders_topic, 2), TopicSpec(customers_topic, 3))
    app = fk_app(orders_topic, customers_topic, "fk-exactly-once")
    rng = random.Random(3)
    orders = {f"o{rng.randrange(10)}": {"n": n, "c": f"k{rng.randrange(5)}"} for n in range(60)}
    customers = {f"k{i}": i * 10 for i in range(4)}  # k4 has no row: "None" for its orders
    produce(kafka_bootstrap, orders_topic, [(key.encode(), serdes.Json().serialize(order), None) for key, order in orders.items()])
    produce(kafka_bootstrap, customers_topic, [(key.encode(), serdes.Int().serialize(zone), None) for key, zone in customers.items()])
    expected = {key: f"{order['n']}:{customers.get(order['c'])}" for key, order in orders.items()}
    resolved = resolve_against_cluster(app.topology(), kafka_bootstrap)
    offsets = OffsetStore()
    config = EngineConfig(kafka_bootstrap, tmp_path / "state", commit_interval_ms=200, processing_guarantee=ProcessingGuarantee.EXACTLY_ONCE_V2)
    engine = TaskEngine(resolved, config, committed_offsets=offsets.fetch, commit_offsets=offsets.commit)
    engine.start()
    try:
        engine.add_tasks(resolved.tasks)
        engine.run(until=lambda: engine.store_contents("enriched") == expected, timeout_s=WAIT_S)
        assert engine.store_contents("enriched") == expected
        assert engine.transactions_committed > 0
    finally:
        engine.close()
