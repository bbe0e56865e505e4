"""Apps with several stateful steps on real Spark: one query per sub-topology, chained through
the app's internal topics (a table's group_by, a foreign-key join's subscriptions and
responses), run as a backfill in rounds, with a global table every task holds. Their final
tables are the test driver's — the worker's tasks on the same input.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaProducer
from spark_parity import decoded, read_final_table, run_on_spark

from pystreams import serdes
from pystreams.app import App, load_app
from pystreams.broker import EmbeddedBroker
from pystreams.cluster import ClusterMetadata, TopicSpec
from pystreams.testing import TopologyTestDriver

pytestmark = pytest.mark.integration

TEXT, JSON, INT = serdes.Text(), serdes.Json(), serdes.Int()
OUTPUTS = {"order-cities": TEXT, "customer-totals": INT, "totals-cities": TEXT, "customers-per-city": INT, "payment-tiers": TEXT}

CUSTOMERS = [("c0", "Oslo"), ("c1", "Lima"), ("c2", "Oslo"), ("c3", "Pune"), ("c1", "Oslo"), ("c4", "Lima")]
ORDERS: list[tuple[str, dict[str, Any] | None]] = [
    *((f"o{i}", {"customer": f"c{i % 5}", "amount": 10 + i}) for i in range(12)),
    ("o3", {"customer": "c0", "amount": 7}),  # moves to another customer
    ("o5", None),  # deleted
    ("o9", {"customer": "c9", "amount": 1}),  # a customer nobody knows (a left join keeps it)
]


TIERS = [("c0", "gold"), ("c1", "silver"), ("c2", "gold"), ("c1", "bronze")]
BASE_MS = 1_700_000_000_000
#: (topic, key bytes, value bytes, timestamp): the global table's topic first (a worker
#: restores it before its tasks start; Spark applies it first in a micro-batch), the
#: customers, then the orders.
INPUT = [
    *(("tiers", TEXT.serialize(key), TEXT.serialize(tier), BASE_MS - 10_000 + i) for i, (key, tier) in enumerate(TIERS)),
    *(("customers", TEXT.serialize(key), TEXT.serialize(city), BASE_MS + i * 1000) for i, (key, city) in enumerate(CUSTOMERS)),
    *(("orders", TEXT.serialize(key), JSON.serialize(order), BASE_MS + 60_000 + i * 1000) for i, (key, order) in enumerate(ORDERS)),
    *(("payments", TEXT.serialize(f"p{i}"), JSON.serialize({"customer": f"c{i % 4}", "amount": i}), BASE_MS + 90_000 + i) for i in range(6)),
]

#: The app, as a file: Spark's Python workers import its functions from the shipped module.
APP = """
from pystreams import serdes
from pystreams.app import App, load_app

TEXT, JSON, INT = serdes.Text(), serdes.Json(), serdes.Int()
app = App("chained-tables")
orders = app.table("orders", value=JSON)
customers = app.table("customers", value=TEXT)


def add(total, customer, amount):
    return total + amount


def subtract(total, customer, amount):
    return total - amount


orders.join(
    customers,
    lambda order_id, order, city: f"{order['amount']}@{city}",
    foreign_key=lambda order_id, order: order["customer"],
    how="left",
    value=TEXT,
    store="order-cities",
    name="order-cities",
).to_stream().to("order-cities")
by_customer = orders.group_by(lambda order_id, order: (order["customer"], order["amount"]), value=INT, name="by-customer")
totals = by_customer.aggregate(0, add, subtract, value=INT, store="customer-totals")
totals.to_stream().to("customer-totals")
totals.join(customers, lambda customer, total, city: f"{total}@{city}", how="left", value=TEXT, name="totals-cities").to_stream().to("totals-cities")
customers.group_by(lambda customer, city: (city, customer), value=TEXT, name="by-city").count(store="per-city").to_stream().to("customers-per-city")
tiers = app.global_table("tiers", value=TEXT)
app.topic("payments", value=JSON).join(
    tiers,
    lambda payment_id, payment, tier: f"{payment['amount']}:{tier}",
    foreign_key=lambda payment_id, payment: payment["customer"],
    how="left",
    value=TEXT,
    name="payment-tiers",
).to("payment-tiers")
"""


def tables_app(directory: Path) -> App:
    app_file = directory / "chained_tables.py"
    app_file.write_text(APP)
    return load_app(str(app_file))


def expected_tables(app: App) -> dict[str, dict[Any, Any]]:
    """The test driver's final tables for the input."""
    with TopologyTestDriver(app, partitions={"orders": 3, "customers": 2}) as driver:
        for topic, key, value, timestamp in INPUT:
            driver.pipe_input(topic, key, value, timestamp)
        tables = {}
        for topic in OUTPUTS:
            table: dict[Any, Any] = {}
            for record in driver.output_topic(topic).read_records():
                if record.value is None:
                    table.pop(record.key, None)
                else:
                    table[record.key] = record.value
            tables[topic] = table
    return tables


def test_tables_joins_and_regroupings_on_spark_end_with_the_drivers_tables(spark: Any, tmp_path: Path) -> None:
    from pystreams.spark import compile_topology

    app = tables_app(tmp_path)
    plan = compile_topology(app.topology())
    assert len(plan.chained) >= 3 and plan.feedback_topics  # the foreign-key join's responses
    with EmbeddedBroker() as broker:
        bootstrap = broker.bootstrap_servers
        with ClusterMetadata(bootstrap) as cluster:
            cluster.ensure_topics(
                [
                    TopicSpec("orders", 3),
                    TopicSpec("customers", 2),
                    TopicSpec("tiers", 2),
                    TopicSpec("payments", 2),
                    *(TopicSpec(topic, 2) for topic in OUTPUTS),
                ]
            )
        producer = KafkaProducer(bootstrap_servers=bootstrap)
        for topic, key, value, timestamp in INPUT:
            producer.send(topic, key=key, value=value, timestamp_ms=timestamp)
        producer.flush()
        producer.close()

        job = run_on_spark(app, spark, bootstrap, tmp_path / "checkpoint")
        assert job.rounds >= 2  # a round for the responses after the one that subscribed
        spark_tables = {topic: decoded(read_final_table(bootstrap, topic), TEXT, value) for topic, value in OUTPUTS.items()}

    expected = expected_tables(tables_app(tmp_path))
    assert expected["order-cities"]["o3"] == "7@Oslo" and "o5" not in expected["order-cities"]
    assert expected["order-cities"]["o9"] == "1@None"
    assert expected["payment-tiers"] == {"p0": "0:gold", "p1": "1:bronze", "p2": "2:gold", "p3": "3:None", "p4": "4:gold", "p5": "5:bronze"}
    assert spark_tables == expected


#: Two queries chained through a table's group_by repartition topic.
REGROUP_APP = """
from pystreams import serdes
from pystreams.app import App

app = App("regroup-streaming")
prices = app.table("prices", value=serdes.Int())
by_parity = prices.group_by(lambda key, price: ("even" if price % 2 == 0 else "odd", price), value=serdes.Int(), name="by-parity")
by_parity.aggregate(0, lambda total, key, n: total + n, lambda total, key, n: total - n, value=serdes.Int(), store="sums").to_stream().to("sums")
"""


def test_chained_queries_stream_together_until_stopped(spark: Any, tmp_path: Path) -> None:
    """Not a backfill: both queries run at once, the second reading what the first writes
    while it runs, and the sums follow updates produced after the job started."""
    from pystreams.spark import to_spark

    app_file = tmp_path / "regroup.py"
    app_file.write_text(REGROUP_APP)
    with EmbeddedBroker() as broker:
        bootstrap = broker.bootstrap_servers
        with ClusterMetadata(bootstrap) as cluster:
            cluster.ensure_topics([TopicSpec("prices", 2), TopicSpec("sums", 2)])
        job = to_spark(load_app(str(app_file)), spark, bootstrap_servers=bootstrap, checkpoint=str(tmp_path / "checkpoint"))
        assert len(job.start()) == 2
        try:
            producer = KafkaProducer(bootstrap_servers=bootstrap)
            # p0..p5 = 0..5, then p1 becomes 11 and p2 is deleted: even 0+4 = 4, odd 11+3+5 = 19.
            for key, value in [*((f"p{i}", i) for i in range(6)), ("p1", 11), ("p2", None)]:
                producer.send("prices", key=TEXT.serialize(key), value=INT.serialize(value))
                producer.flush()
            producer.close()
            deadline = time.monotonic() + 120
            sums: dict[Any, Any] = {}
            while time.monotonic() < deadline and sums != {"even": 4, "odd": 19}:
                assert job.exception() is None
                time.sleep(2)
                sums = decoded(read_final_table(bootstrap, "sums"), TEXT, INT)
        finally:
            job.stop()
    assert sums == {"even": 4, "odd": 19}
