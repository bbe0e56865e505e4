"""Every example app on Spark ``local[2]`` writes the same final tables (latest value bytes per
key bytes, tombstones delete) as the worker's TaskEngine for the same input topics.

Both runtimes run phase by phase where the order of two inputs matters (a table update
between orders), as a live deployment would see them; on Spark each phase is a backfill from
the same checkpoint, so state carries across micro-batches. Late and out-of-order input on
several partitions is ``test_spark_lateness.py``'s.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaProducer
from spark_parity import decoded, read_final_table, run_on_spark, run_on_workers
from test_spark_wordcount import EXAMPLES

from pystreams import serdes
from pystreams.app import load_app
from pystreams.broker import EmbeddedBroker
from pystreams.cluster import ClusterMetadata, TopicSpec

pytestmark = pytest.mark.integration

BASE_MS = 1_700_000_000_000 - 1_700_000_000_000 % 3_600_000
MINUTE = 60_000

#: (topic, partition or None for the default partitioner, key, value bytes or None, timestamp)
Record = tuple[str, int | None, bytes, bytes | None, int]


def produce(bootstrap: str, records: Iterable[Record]) -> int:
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    count = 0
    try:
        for topic, partition, key, value, timestamp in records:
            producer.send(topic, key=key, value=value, partition=partition, timestamp_ms=timestamp)
            count += 1
        producer.flush()
    finally:
        producer.close()
    return count


def create_topics(bootstrap: str, topics: dict[str, int]) -> None:
    with ClusterMetadata(bootstrap) as cluster:
        cluster.ensure_topics([TopicSpec(name, partitions) for name, partitions in topics.items()])


def final_tables(bootstrap: str, topics: Iterable[str]) -> dict[str, dict[bytes | None, bytes]]:
    return {topic: read_final_table(bootstrap, topic) for topic in topics}


def run_both(
    spark: Any,
    tmp_path: Path,
    example: str,
    topics: dict[str, int],
    phases: list[tuple[list[Record], int]],
    outputs: list[str],
    spark_backfills_after: set[int] | None = None,
) -> dict[str, dict[str, dict[bytes | None, bytes]]]:
    """Produce each phase, letting the workers process it (``records processed`` after the
    phase) before the next; Spark backfills after each phase (or those whose index is in
    ``spark_backfills_after``). The final tables by runtime."""
    app_path = str(EXAMPLES / example)
    tables = {}
    with EmbeddedBroker() as workers_broker, EmbeddedBroker() as spark_broker:
        for bootstrap in (workers_broker.bootstrap_servers, spark_broker.bootstrap_servers):
            create_topics(bootstrap, topics)
        engine = None
        try:
            for records, processed_after in phases:
                produce(workers_broker.bootstrap_servers, records)
                engine = run_on_workers(
                    load_app(app_path) if engine is None else None,
                    workers_broker.bootstrap_servers,
                    tmp_path / "state",
                    until_processed=processed_after,
                    engine=engine,
                )
        finally:
            if engine is not None:
                engine.close()
        tables["workers"] = final_tables(workers_broker.bootstrap_servers, outputs)

        # One backfill per phase from the same checkpoint: operator state carries across batches.
        for index, (records, _) in enumerate(phases):
            produce(spark_broker.bootstrap_servers, records)
            if spark_backfills_after is not None and index not in spark_backfills_after and index < len(phases) - 1:
                continue
            run_on_spark(load_app(app_path), spark, spark_broker.bootstrap_servers, tmp_path / "checkpoint")
        tables["spark"] = final_tables(spark_broker.bootstrap_servers, outputs)
    return tables


# -- clicks_windowed: tumbling, hopping and session windows over a pattern source ---------------


def click_records() -> list[Record]:
    records = []
    for k in range(60):
        user = f"u{k % 5}"
        if user == "u4" and 20 <= k < 45:
            continue  # u4 pauses for 45 minutes: two sessions
        ts = BASE_MS + k * 90_000
        click = {"user": user, "url": f"/page{k % 7}", "ts": ts}
        # Both topics feed one task; the worker would merge them by timestamp only within a
        # poll, so they are produced one after the other (and processed phase by phase).
        topic = "clicks.us" if k < 20 else "clicks.eu"
        records.append((topic, 0, f"c{k}".encode(), json.dumps(click).encode(), ts))
    return records


def test_clicks_windowed_on_spark_matches_the_workers(spark: Any, tmp_path: Path) -> None:
    clicks = click_records()
    outputs = ["clicks-per-minute", "url-views-5m", "user-sessions"]
    topics = {"clicks.eu": 1, "clicks.us": 1, **{topic: 2 for topic in outputs}}
    # Each click: read once from its topic, then once from each of the two repartition topics.
    us = [click for click in clicks if click[0] == "clicks.us"]
    eu = [click for click in clicks if click[0] == "clicks.eu"]
    phases = [(us, 3 * len(us)), (eu, 3 * len(clicks))]
    tables = run_both(spark, tmp_path, "clicks_windowed.py", topics, phases, outputs)

    windowed_text = serdes.WindowedKey(serdes.Text())
    per_minute = decoded(tables["workers"]["clicks-per-minute"], windowed_text, serdes.Int())
    assert sum(per_minute.values()) == len(clicks)
    session_type = load_app(str(EXAMPLES / "clicks_windowed.py")).topology().nodes["user_sessions"].value_serde
    sessions = decoded(tables["workers"]["user-sessions"], windowed_text, session_type)
    u4_sessions = sorted((w.start_ms, w.end_ms, s.pages) for w, s in sessions.items() if w.key == "u4")
    assert [pages for _, _, pages in u4_sessions] == [4, 3]  # the pause split u4's clicks in two
    assert len(sessions) == 6  # one session per other user: extended (merged) click by click
    for table in outputs:
        assert tables["spark"][table] == tables["workers"][table], table


# -- orders_enrich_join: stream-table join behind a repartition, windowed stream-stream join ----


def test_orders_enrich_join_on_spark_matches_the_workers(spark: Any, tmp_path: Path) -> None:
    topology = load_app(str(EXAMPLES / "orders_enrich_join.py")).topology()
    order_serde, payment_serde = topology.nodes["orders"].value_serde, topology.nodes["payments"].value_serde
    customer_serde = topology.nodes["customers"].value_serde
    order_type, payment_type = order_serde.struct_type, payment_serde.struct_type
    customer_type = customer_serde.struct_type

    def customer(number: int, tier: str, ts: int) -> Record:
        value = customer_serde.serialize(customer_type(f"c{number}", f"Customer {number}", tier))
        return ("customers", None, f"c{number}".encode(), value, ts)

    def orders_and_payments(first: int, count: int, start_ms: int) -> list[Record]:
        records = []
        for i in range(first, first + count):
            customer_number = i % 5  # c4 does not exist: an inner join drops its orders
            partition = customer_number % 2  # an order and its payments share a partition
            order_ts = start_ms + (i - first) * MINUTE
            order = order_serde.serialize(order_type(f"o{i}", f"c{customer_number}", 1000 + i))
            records.append(("orders", partition, f"o{i}".encode(), order, order_ts))
            offsets = {0: [5], 1: [20], 2: [1, 2], 3: [-1]}[i % 4]  # minutes after the order
            for n, minutes in enumerate(offsets):
                payment = payment_serde.serialize(payment_type(f"o{i}", 100 * (i + 1) + n))
                records.append(("payments", partition, f"o{i}".encode(), payment, order_ts + minutes * MINUTE))
        return sorted(records, key=lambda record: record[4])

    customers = [customer(n, "basic", BASE_MS + n) for n in range(4)]
    early = orders_and_payments(0, 8, BASE_MS + MINUTE)
    updates = [customer(1, "gold", BASE_MS + 45 * MINUTE), ("customers", None, b"c2", None, BASE_MS + 45 * MINUTE + 1)]
    late = orders_and_payments(8, 8, BASE_MS + 50 * MINUTE)

    def processed(records: list[Record]) -> int:  # orders are read again from the repartition topic
        return sum(2 if record[0] == "orders" else 1 for record in records)

    phases, total = [], 0
    for records in (customers, early, updates, late):
        total += processed(records)
        phases.append((records, total))
    outputs = ["orders-enriched", "orders-paid"]
    topics = {"orders": 2, "payments": 2, "customers": 2, **{topic: 2 for topic in outputs}}
    # Spark: two backfills (customers and early orders; the update and late orders), ordered
    # within each by event time, so the update still lands between the orders.
    tables = run_both(spark, tmp_path, "orders_enrich_join.py", topics, phases, outputs, spark_backfills_after={1})

    enriched_type = topology.nodes["enriched"].value_serde
    enriched = decoded(tables["workers"]["orders-enriched"], serdes.Text(), enriched_type)
    assert sorted(enriched) == ["c0", "c1", "c2", "c3"]  # no c4: the inner join drops its orders
    assert enriched["c1"].tier == "gold" and enriched["c1"].order.order_id == "o11"  # after the update
    assert enriched["c2"].order.order_id == "o7"  # c2 was deleted before o12: no join after that
    paid = decoded(tables["workers"]["orders-paid"], serdes.Text(), topology.nodes["paid"].value_serde)
    # Paid 5 minutes after (i % 4 == 0) or twice within the window (i % 4 == 2, the last wins);
    # 20 minutes after and before the order are out of the window.
    assert sorted(paid, key=lambda order_id: int(order_id[1:])) == [f"o{i}" for i in range(16) if i % 4 in (0, 2)]
    assert paid["o2"].paid_cents == 301
    for table in outputs:
        assert tables["spark"][table] == tables["workers"][table], table


# -- dedupe_processor: a Processor with a key-value store and punctuations ---------------------


def test_dedupe_processor_on_spark_matches_the_workers(spark: Any, tmp_path: Path) -> None:
    events: list[Record] = []
    for i in range(40):
        ts = BASE_MS + i * MINUTE
        events.append(("events", None, f"e{i}".encode(), json.dumps({"id": i, "n": 1}).encode(), ts))
    # Seen 10 minutes ago: dropped. Seen over an hour ago: forwarded again.
    events.append(("events", None, b"e30", json.dumps({"id": 30, "n": 2}).encode(), BASE_MS + 40 * MINUTE))
    events.append(("events", None, b"e3", json.dumps({"id": 3, "n": 3}).encode(), BASE_MS + 70 * MINUTE))
    topics = {"events": 2, "events-unique": 2}
    tables = run_both(spark, tmp_path, "dedupe_processor.py", topics, [(events, len(events))], ["events-unique"])

    unique = decoded(tables["workers"]["events-unique"], serdes.Text(), serdes.Json())
    assert len(unique) == 40
    assert unique["e30"]["n"] == 1 and unique["e3"]["n"] == 3
    assert tables["spark"]["events-unique"] == tables["workers"]["events-unique"]


# -- shipping_labels: a foreign-key join and a global table ------------------------------------


def test_shipping_labels_on_spark_end_with_the_test_drivers_tables(spark: Any, tmp_path: Path) -> None:
    """Chained queries on Spark against the worker's tasks in the test driver: customers
    move, an order changes customer and another is deleted between two backfills."""
    from pystreams.testing import TopologyTestDriver

    app_path = str(EXAMPLES / "shipping_labels.py")
    topology = load_app(app_path).topology()
    order_serde, address_serde = topology.nodes["orders"].value_serde, topology.nodes["customers"].value_serde
    order_type, address_type = order_serde.struct_type, address_serde.struct_type
    text = serdes.Text()

    def order(number: int, customer: int | None, ts: int) -> Record:
        value = None if customer is None else order_serde.serialize(order_type(f"c{customer}", f"item-{number}"))
        return ("orders", None, f"o{number}".encode(), value, ts)

    def address(customer: int, city: str, ts: int) -> Record:
        return ("customers", None, f"c{customer}".encode(), address_serde.serialize(address_type(f"{customer} Main St", city)), ts)

    first = [
        *(
            ("carriers", None, city.encode(), text.serialize(carrier), BASE_MS + i)
            for i, (city, carrier) in enumerate([("Oslo", "Posten"), ("Lima", "Serpost")])
        ),
        *(address(c, city, BASE_MS + MINUTE + c) for c, city in enumerate(["Oslo", "Lima", "Pune"])),
        *(order(n, n % 4, BASE_MS + 2 * MINUTE + n) for n in range(10)),  # c3 is not known: a left join
    ]
    second = [address(1, "Oslo", BASE_MS + 10 * MINUTE), order(2, 0, BASE_MS + 11 * MINUTE), order(4, None, BASE_MS + 12 * MINUTE)]
    outputs = ["order-shipping", "order-dispatch"]
    with EmbeddedBroker() as broker:
        bootstrap = broker.bootstrap_servers
        create_topics(bootstrap, {"orders": 3, "customers": 2, "carriers": 1, **{topic: 2 for topic in outputs}})
        for records in (first, second):
            produce(bootstrap, records)
            job = run_on_spark(load_app(app_path), spark, bootstrap, tmp_path / "checkpoint")
            assert job.rounds == 2  # the labels come back with the responses
        spark_tables = final_tables(bootstrap, outputs)

    with TopologyTestDriver(load_app(app_path), partitions={"orders": 3, "customers": 2}) as driver:
        for topic, _, key, value, timestamp in first + second:
            driver.pipe_input(topic, key, value, timestamp)
        driver_tables = {topic: driver.output_topic(topic, key=serdes.Bytes(), value=serdes.Bytes()).read_table() for topic in outputs}

    labels = decoded(driver_tables["order-shipping"], text, topology.nodes["label"].value_serde)
    assert labels["o1"].city == "Oslo" and labels["o2"].city == "Oslo" and labels["o3"].ship_to == "address pending"
    assert "o4" not in labels  # deleted
    assert spark_tables == driver_tables
