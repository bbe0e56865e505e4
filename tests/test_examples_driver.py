"""Every example app, unit-tested with the in-memory test driver (no broker): what the README
shows a user doing for their own app."""

from __future__ import annotations

import collections
import logging
from pathlib import Path

import pytest
from pystreams.topology.windows import Windowed

from pystreams import serdes
from pystreams.app import load_app
from pystreams.testing import TopologyTestDriver

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SECOND, MINUTE, HOUR = 1000, 60_000, 3_600_000


def test_wordcount_counts_every_word_and_emits_each_changed_count_once_per_line() -> None:
    corpus = (EXAMPLES / "data" / "corpus.txt").read_text().splitlines()[:200]
    with TopologyTestDriver(load_app(str(EXAMPLES / "wordcount.py"))) as driver:
        lines = driver.input_topic("text-lines")
        counts = driver.output_topic("word-counts")
        lines.pipe_input(None, "the cat and the hat", timestamp=1)
        # The table's cache folds the updates of one input record: "the" is emitted once, at 2.
        assert sorted(counts.read_key_values()) == [("and", 1), ("cat", 1), ("hat", 1), ("the", 2)]
        lines.pipe_values(corpus)
        expected = collections.Counter("the cat and the hat".split())
        expected.update(word for line in corpus for word in line.lower().split())
        # The corpus's words, each with its count over everything piped so far.
        corpus_words = {word for line in corpus for word in line.lower().split()}
        assert counts.read_table() == {word: expected[word] for word in corpus_words}
        assert driver.store_contents("counts") == dict(expected)


def click(user: str, url: str, ts: int) -> dict[str, object]:
    return {"user": user, "url": url, "ts": ts}


def test_clicks_windowed_counts_per_window_with_grace_and_merges_sessions() -> None:
    app = load_app(str(EXAMPLES / "clicks_windowed.py"))
    # The pattern source matches the topics the driver is told about.
    with TopologyTestDriver(app, partitions={"clicks.eu": 1, "clicks.us": 1}) as driver:
        eu, us = driver.input_topic("clicks.eu"), driver.input_topic("clicks.us")
        for url, seconds in (("/a", 0), ("/b", 30), ("/c", 65), ("/d", 55), ("/e", 80), ("/f", 50)):
            # 55 s is late but within the 10 s grace; 50 s comes after stream time 80 s: too late.
            eu.pipe_input(None, click("alice", url, seconds * SECOND))
        us.pipe_input(None, click("bob", "/a", 60 * SECOND))
        windowed_text = serdes.WindowedKey(serdes.Text())
        per_minute = driver.output_topic("clicks-per-minute", key=windowed_text).read_table()
        assert per_minute == {
            Windowed("alice", 0, MINUTE): 3,
            Windowed("alice", MINUTE, 2 * MINUTE): 2,
            Windowed("bob", MINUTE, 2 * MINUTE): 1,
        }
        assert driver.late_records_dropped == 1
        views = driver.output_topic("url-views-5m").read_table()
        assert views[Windowed("/a", 0, 5 * MINUTE)] == 2 and views[Windowed("/a", MINUTE, 6 * MINUTE)] == 1
        assert sum(count for window, count in views.items() if window.start_ms == 0) == 7
        sessions = driver.output_topic("user-sessions").read_table()
        live = {key: (s.pages, s.first_url, s.last_url) for key, s in sessions.items()}
        # Each new click extended alice's one session (the older bounds were deleted: tombstones).
        assert live == {
            Windowed("alice", 0, 80 * SECOND): (6, "/a", "/f"),
            Windowed("bob", 60 * SECOND, 60 * SECOND): (1, "/a", "/a"),
        }


def test_orders_are_enriched_by_the_customer_table_and_paid_within_the_join_window() -> None:
    app = load_app(str(EXAMPLES / "orders_enrich_join.py"))
    nodes = app.topology().nodes
    Order = nodes["orders"].value_serde.struct_type
    Customer = nodes["customers"].value_serde.struct_type
    Payment = nodes["payments"].value_serde.struct_type
    topics = {"orders": 2, "payments": 2, "customers": 2}
    with TopologyTestDriver(app, partitions=topics) as driver:
        customers = driver.input_topic("customers")
        orders = driver.input_topic("orders")
        payments = driver.input_topic("payments")
        customers.pipe_input("c1", Customer("c1", "Ada", "gold"), timestamp=0)
        customers.pipe_input("c2", Customer("c2", "Bob", "silver"), timestamp=0)
        placed = [Order("o1", "c1", 1000), Order("o2", "c2", 2000), Order("o3", "c9", 3000), Order("o4", "c1", 4000)]
        for order in placed:
            orders.pipe_input(order.order_id, order, timestamp=HOUR)
        for order_id, minutes in (("o1", 5), ("o2", 20), ("o3", 1), ("o4", -1)):
            payments.pipe_input(order_id, Payment(order_id, 1000), timestamp=HOUR + minutes * MINUTE)
        enriched = driver.output_topic("orders-enriched").read_key_values()
        assert [(key, e.order.order_id, e.customer_name) for key, e in enriched] == [
            ("c1", "o1", "Ada"),
            ("c2", "o2", "Bob"),  # o3's customer does not exist: the inner join drops it
            ("c1", "o4", "Ada"),
        ]
        paid = driver.output_topic("orders-paid").read_table()
        # Paid within 15 minutes after the order; 20 minutes after and before it do not join.
        assert sorted(paid) == ["o1", "o3"] and paid["o1"].order == placed[0]


def test_dedupe_forgets_ids_an_hour_old_and_reports_on_the_wall_clock(caplog: pytest.LogCaptureFixture) -> None:
    app = load_app(str(EXAMPLES / "dedupe_processor.py"))
    t0 = 1_700_000_000_000
    with TopologyTestDriver(app) as driver:
        events = driver.input_topic("events")
        unique = driver.output_topic("events-unique", value=serdes.Json())
        for n, (event_id, ts) in enumerate([("e1", t0), ("e2", t0 + SECOND), ("e1", t0 + 2 * SECOND), ("e1", t0 + 2 * HOUR), ("e3", t0 + 2 * HOUR)]):
            events.pipe_input(event_id, {"n": n}, timestamp=ts)
        assert [(r.key, r.value["n"], r.timestamp) for r in unique.read_records()] == [
            ("e1", 0, t0),
            ("e2", 1, t0 + SECOND),
            ("e1", 3, t0 + 2 * HOUR),  # first seen over an hour before: forwarded again
            ("e3", 4, t0 + 2 * HOUR),
        ]
        # The stream-time punctuation forgot e2 (seen more than an hour before stream time).
        assert driver.store_contents("seen-ids") == {"e1": t0 + 2 * HOUR, "e3": t0 + 2 * HOUR}
        with caplog.at_level(logging.INFO):
            driver.advance_wall_clock(29 * SECOND)
            assert "remembers" not in caplog.text
            driver.advance_wall_clock(1 * SECOND)  # 30 s after the start: the report is due
        assert "task 0_0 remembers 2 event ids" in caplog.text


def test_shipping_labels_follow_customers_moves_and_orders_changes() -> None:
    app = load_app(str(EXAMPLES / "shipping_labels.py"))
    nodes = app.topology().nodes
    Order = nodes["orders"].value_serde.struct_type
    Address = nodes["customers"].value_serde.struct_type
    with TopologyTestDriver(app) as driver:
        orders, customers = driver.input_topic("orders"), driver.input_topic("customers")
        labels = driver.output_topic("order-shipping")
        customers.pipe_input("ann", Address("1 Main St", "Oslo"), timestamp=1)
        orders.pipe_input("o1", Order("ann", "lamp"), timestamp=2)
        orders.pipe_input("o2", Order("bob", "desk"), timestamp=3)  # bob is not known yet
        assert {k: v.ship_to for k, v in labels.read_key_values()} == {"o1": "1 Main St, Oslo", "o2": "address pending"}
        customers.pipe_input("bob", Address("2 Side Rd", "Rome"), timestamp=4)
        customers.pipe_input("ann", Address("9 New Ave", "Bergen"), timestamp=5)  # ann moves
        orders.pipe_input("o1", Order("bob", "lamp"), timestamp=6)  # o1 now ships to bob
        orders.pipe_input("o2", None, timestamp=7)
        assert {k: (v.item, v.ship_to) for k, v in driver.store_contents("shipping-labels").items()} == {"o1": ("lamp", "2 Side Rd, Rome")}
        assert labels.read_key_values()[-1] == ("o2", None)


def test_shipping_dispatch_names_the_carrier_of_the_labels_city_from_the_global_table() -> None:
    app = load_app(str(EXAMPLES / "shipping_labels.py"))
    nodes = app.topology().nodes
    Order = nodes["orders"].value_serde.struct_type
    Address = nodes["customers"].value_serde.struct_type
    with TopologyTestDriver(app, partitions={"orders": 3, "customers": 2, "carriers": 2}) as driver:
        orders, customers, carriers = driver.input_topic("orders"), driver.input_topic("customers"), driver.input_topic("carriers")
        dispatches = driver.output_topic("order-dispatch")
        carriers.pipe_input("Oslo", "Posten")
        customers.pipe_input("ann", Address("1 Main St", "Oslo"), timestamp=1)
        customers.pipe_input("bob", Address("2 Side Rd", "Rome"), timestamp=2)
        orders.pipe_input("o1", Order("ann", "lamp"), timestamp=3)
        orders.pipe_input("o2", Order("bob", "desk"), timestamp=4)
        orders.pipe_input("o3", Order("cid", "rug"), timestamp=5)  # no address: no city to look up
        assert {k: v.carrier for k, v in dispatches.read_key_values()} == {"o1": "Posten", "o2": "unassigned"}
        carriers.pipe_input("Rome", "Poste Italiane")  # a global table update emits nothing by itself
        assert dispatches.read_key_values() == []
        orders.pipe_input("o2", Order("bob", "chair"), timestamp=6)
        assert [(k, v.carrier) for k, v in dispatches.read_key_values()] == [("o2", "Poste Italiane")]
        assert driver.null_keys_dropped == 1  # o3's label, whose city is None
