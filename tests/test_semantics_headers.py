"""Record headers on the test driver, as Kafka Streams keeps them: a record's headers go with
everything derived from it through stateless steps, joins, a repartition and a processor
(which may read and replace them) to the sink; a table's update carries the headers of the
record that last wrote its row (Kafka Streams' cache keeps them with the row), and a
punctuation's forwards carry none. The packed repartition format keeps each entry's headers
(format 2)."""

from __future__ import annotations

from typing import Any

import pytest

from pystreams import App, Processor, punctuate, serdes
from pystreams.testing import TopologyTestDriver
from pystreams.worker.packing import PACKED_FORMAT_VERSION, PACKED_WITH_HEADERS_VERSION, RepartitionBuffers, packed_version, unpack
from pystreams.worker.packing import UnpackedRecord as Record

TRACE = (("trace-id", b"t-1"), ("tenant", b"acme"))


def read(driver: TopologyTestDriver, topic: str) -> list[tuple[Any, Any, tuple[tuple[str, bytes], ...]]]:
    return [(r.key, r.value, r.headers) for r in driver.output_topic(topic).read_records()]


def test_headers_follow_a_record_through_stateless_steps_a_repartition_and_a_join_to_the_sink() -> None:
    app = App("headers")
    orders = app.topic("orders", value=serdes.Json())
    customers = app.table("customers", value=serdes.Text())
    rekeyed = orders.filter(lambda key, order: order["total"] > 0).select_key(lambda key, order: order["customer"])
    joined = rekeyed.join(customers, lambda customer, order, city: f"{order['id']}->{city}", value=serdes.Text(), how="left")
    joined.map_values(lambda key, text: text.upper(), value=serdes.Text()).to("shipped")
    customers.to_stream().to("customer-updates")
    with TopologyTestDriver(app) as driver:
        driver.input_topic("customers").pipe_input("c1", "oslo", timestamp=1)
        orders_topic = driver.input_topic("orders")
        driver.pipe_input("orders", b"o1", serdes.Json().serialize({"id": "o1", "customer": "c1", "total": 5}), 2, headers=TRACE)
        orders_topic.pipe_input("o2", {"id": "o2", "customer": "c1", "total": 7}, timestamp=3)  # no headers
        assert read(driver, "shipped") == [("c1", "O1->OSLO", TRACE), ("c1", "O2->OSLO", ())]
        # The table's update carries its own record's headers: it had none.
        assert read(driver, "customer-updates") == [("c1", "oslo", ())]


def test_a_tables_update_carries_the_headers_of_the_record_that_last_wrote_its_row() -> None:
    app = App("table-headers")
    words = app.topic("words", value=serdes.Text())
    split = words.flat_map_values(lambda key, line: line.split(), value=serdes.Text())
    counts = app.count(split.group_by_key(), store="counts")
    counts.to("counts")  # the table's bytes straight to the sink
    counts.to_stream().map_values(lambda word, n: n * 10, value=serdes.Int()).to("tens")  # through a step
    prices = app.table("prices", value=serdes.Int())
    prices.to_stream().to("price-updates")
    first, second = (("trace-id", b"t-1"),), (("trace-id", b"t-2"),)
    with TopologyTestDriver(app) as driver:
        driver.pipe_input("words", b"w", b"a a", 1, headers=first)  # folded in one commit: one update
        driver.pipe_input("words", b"w", b"a", 2)  # the row's last writer had no headers
        driver.pipe_input("words", b"w", b"a", 3, headers=second)
        for topic, factor in (("counts", 1), ("tens", 10)):
            assert read(driver, topic) == [("w", 2 * factor, first), ("w", 3 * factor, ()), ("w", 4 * factor, second)], topic
        driver.pipe_input("prices", b"tea", serdes.Int().serialize(3), 4, headers=second)
        driver.pipe_input("prices", b"tea", None, 5, headers=first)  # a delete goes with the deleting record's
        assert read(driver, "price-updates") == [("tea", 3, second), ("tea", None, first)]


class Stamp(Processor):
    """Reads the record's headers, adds one, and forwards a second record with its own."""

    def process(self, key: Any, value: Any) -> None:
        seen = dict(self.context.headers)
        self.context.headers = [*self.context.headers, ("stamped", b"yes")]
        self.context.forward(key, f"{value}:{seen.get('trace-id', b'-').decode()}")
        self.context.forward(key, "audit", headers=[("audit", b"1")])
        self.context.forward(key, "after")  # the replaced headers again, not the audit ones

    @punctuate(every=10, on="stream-time")
    def tick(self, timestamp: int) -> None:
        self.context.forward("tick", str(timestamp))


def test_a_processor_reads_replaces_and_overrides_headers_and_punctuations_forward_none() -> None:
    app = App("processor-headers")
    app.topic("in", value=serdes.Text()).process(Stamp, value=serdes.Text()).to("out")
    with TopologyTestDriver(app) as driver:
        driver.pipe_input("in", b"k", b"v", 5, headers=[("trace-id", b"t-9")])
        stamped = (("trace-id", b"t-9"), ("stamped", b"yes"))
        # The stream-time punctuation runs after the record (at stream time 5): no headers.
        assert read(driver, "out") == [("k", "v:t-9", stamped), ("k", "audit", (("audit", b"1"),)), ("k", "after", stamped), ("tick", "5", ())]


def test_headers_must_be_name_bytes_pairs() -> None:
    class Bad(Processor):
        def process(self, key: Any, value: Any) -> None:
            self.context.headers = [("name", "not bytes")]

    app = App("bad-headers", processing_errors="fail")
    app.topic("in").process(Bad).to("out")
    with TopologyTestDriver(app) as driver, pytest.raises(Exception, match=r"\(str name, bytes value\) pairs"):
        driver.input_topic("in").pipe_input("k", "v")


def test_a_packed_repartition_record_keeps_each_entrys_headers_and_plain_buffers_keep_format_1() -> None:
    buffers = RepartitionBuffers({"plain": 1, "traced": 1})
    buffers.sink("plain")(b"k", b"v", 1, ())
    traced = buffers.sink("traced")
    traced(b"a", b"1", 1, (*TRACE, ("empty", None)))  # a header's value may be null, as in Kafka
    traced(b"b", b"2", 2, ())
    drained = {topic: (value, headers) for topic, _, value, headers in buffers.drain()}
    plain_value, plain_headers = drained["plain"]
    assert packed_version(plain_headers) == PACKED_FORMAT_VERSION
    assert unpack(Record("plain", 0, 0, 0, None, plain_value, tuple(plain_headers))) == [(b"k", b"v", 1)]
    traced_value, traced_headers = drained["traced"]
    assert packed_version(traced_headers) == PACKED_WITH_HEADERS_VERSION
    entries = unpack(Record("traced", 0, 0, 0, None, traced_value, tuple(traced_headers)))
    assert [(e[0], e[1], e[2], [tuple(h) for h in e[3]]) for e in entries] == [(b"a", b"1", 1, [*TRACE, ("empty", None)]), (b"b", b"2", 2, [])]
