"""Property: for the same random input, Spark's operators (run without Spark, batch by batch,
``spark_emulation``) write what the test driver (the worker's tasks) writes.

Inputs are random records on several partitions, with timestamps out of order and many
records late, cut into random micro-batches. The driver processes them one by one in the order
a Spark micro-batch applies them (``operators.ORDER_COLUMNS``: each partition in offset
order, partitions merged by timestamp). Tables are compared as final tables (latest value and
its timestamp per key; Spark emits per micro-batch, the driver per record), streams as
multisets of records with their timestamps.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pystreams.topology.ir import SinkNode
from pystreams.topology.resolve import resolve
from spark_emulation import InputRecord, SparkEmulator

from pystreams import serdes
from pystreams.app import (
    App,
    HoppingWindow,
    JoinWindow,
    Processor,
    PunctuationType,
    SessionWindow,
    SlidingWindow,
    TumblingWindow,
    kv_store,
    punctuate,
)
from pystreams.spark import compile_topology
from pystreams.testing import TopologyTestDriver
from pystreams.worker.packing import partition_for_key

KEYS = ("a", "b", "c", "d", "e")
BASE_MS = 1_700_000_040_000
S = 1000


@dataclass
class Case:
    """An app and how its inputs look: partitions per topic, the topics whose records a
    producer keys by the default partitioner (the others go anywhere), each topic's side for
    a join, and each output topic's kind."""

    app: App
    partitions: dict[str, int]
    keyed: set[str]
    outputs: dict[str, str]  # topic -> "table" | "stream"
    sides: dict[str, int] = field(default_factory=dict)
    #: Outputs that depend on where a table's update lands within a micro-batch (a global
    #: table's, applied first; a suppression's time limit): compared one record per batch only.
    batch_dependent: bool = False


def stateless_case() -> Case:
    app = App("stateless")
    numbers = app.topic("in", value=serdes.Int())
    small = numbers.filter(lambda key, n: n < 8, name="small")
    spread = small.flat_map_values(lambda key, n: [n] * (n % 3), value=serdes.Int(), name="spread")
    parity = spread.branch(lambda key, n: None if n == 0 else ("even" if n % 2 == 0 else "odd"), branches=["even", "odd"], name="parity")
    tagged = numbers.map(lambda key, n: (f"{key}{n}", n * 10), key=serdes.Text(), value=serdes.Int(), name="tagged")
    parity.even.merge(tagged, name="mixed").to("out")
    parity.odd.map_values(lambda key, n: -n, value=serdes.Int(), name="negated").to("odd")
    return Case(app, {"in": 2}, set(), {"out": "stream", "odd": "stream"})


def aggregations_case() -> Case:
    app = App("aggregations")
    numbers = app.topic("in", value=serdes.Int())

    @app.aggregate(numbers, initial=[], store="lists", value=serdes.Json())
    def lists(items: list[int], key: str, n: int) -> list[int]:
        items.append(n)  # in place: each key must get a fresh list
        return items

    lists.to("lists")
    numbers.reduce(lambda most, key, n: max(most, n), store="maxima", name="maxima").to("maxima")
    numbers.group_by(lambda key, n: n % 3, key=serdes.Int(), name="by_rest").count(store="per-rest").to("per-rest")
    return Case(app, {"in": 3}, {"in"}, {"lists": "table", "maxima": "table", "per-rest": "table"})


def windows_case() -> Case:
    app = App("windows")
    numbers = app.topic("in", value=serdes.Int())
    app.count(numbers, store="per-minute", window=TumblingWindow(size=60 * S, grace=10 * S)).to("per-minute")
    numbers.aggregate(
        lambda total, key, n: total + n, initial=0, store="sum-30s", name="sum_30s", window=HoppingWindow(size=30 * S, advance=10 * S, grace=5 * S)
    ).to("sum-30s")
    rekeyed = numbers.group_by(lambda key, n: f"r{n % 2}", name="by_parity")
    app.count(rekeyed, store="parity-per-minute", window=TumblingWindow(size=60 * S, grace=10 * S)).to("parity-pm")
    return Case(app, {"in": 3}, {"in"}, {"per-minute": "table", "sum-30s": "table", "parity-pm": "table"})


def sessions_case() -> Case:
    app = App("sessions")
    numbers = app.topic("in", value=serdes.Int())

    @app.aggregate(
        numbers, initial=list, store="runs", value=serdes.Json(), window=SessionWindow(gap=20 * S, grace=15 * S), merge=lambda key, older, newer: older + newer
    )
    def runs(items: list[int], key: str, n: int) -> list[int]:
        return [*items, n]

    runs.to("runs")
    rekeyed = numbers.group_by(lambda key, n: f"r{n % 2}", name="by_parity")
    app.count(rekeyed, store="visits", window=SessionWindow(gap=10 * S)).to("visits")
    return Case(app, {"in": 2}, {"in"}, {"runs": "table", "visits": "table"})


def emit_final_case() -> Case:
    """One result per closed window, as a stream: Spark must write each exactly as the driver."""
    app = App("emit-final")
    numbers = app.topic("in", value=serdes.Int())
    app.count(numbers, store="per-minute", window=TumblingWindow(size=60 * S, grace=10 * S), emit="final").to("per-minute")
    numbers.aggregate(
        lambda total, key, n: total + n,
        initial=0,
        store="sum-30s",
        name="sum_30s",
        window=HoppingWindow(size=30 * S, advance=10 * S, grace=5 * S),
        emit="final",
    ).to("sum-30s")
    app.count(numbers, store="visits", window=SessionWindow(gap=10 * S, grace=5 * S), emit="final").to("visits")
    return Case(app, {"in": 3}, {"in"}, {"per-minute": "stream", "sum-30s": "stream", "visits": "stream"})


def sliding_case() -> Case:
    app = App("sliding")
    numbers = app.topic("in", value=serdes.Int())

    @app.aggregate(numbers, initial=list, store="recent", value=serdes.Json(), window=SlidingWindow(difference=20 * S, grace=15 * S))
    def recent(items: list[int], key: str, n: int) -> list[int]:
        return [*items, n]

    recent.to("recent")
    rekeyed = numbers.group_by(lambda key, n: f"r{n % 2}", name="by_parity")
    app.count(rekeyed, store="parity-recent", window=SlidingWindow(difference=10 * S)).to("parity-recent")
    return Case(app, {"in": 2}, {"in"}, {"recent": "table", "parity-recent": "table"})


def cogroup_case() -> Case:
    # Two topics, each with its own aggregator, into one store: plain, windowed and sliding.
    app = App("cogroup")
    ones = app.topic("one", value=serdes.Int())
    twos = app.topic("two", value=serdes.Int())

    def add(total: int, key: str, n: int) -> int:
        return total + n

    def subtract_tens(total: int, key: str, n: int) -> int:
        return total - 10 * n

    ones.cogroup(add).cogroup(twos, subtract_tens).aggregate(initial=0, store="totals").to("totals")
    per_minute = app.cogroup()
    per_minute.cogroup(ones)(add)
    per_minute.cogroup(twos)(subtract_tens)
    per_minute.aggregate(initial=0, store="per-minute", window=TumblingWindow(size=60 * S, grace=10 * S)).to("per-minute")
    ones.cogroup(add).cogroup(twos, subtract_tens).aggregate(initial=0, store="recent", window=SlidingWindow(difference=20 * S, grace=5 * S)).to("recent")
    return Case(app, {"one": 2, "two": 2}, {"one", "two"}, {"totals": "table", "per-minute": "table", "recent": "table"}, {"one": 0, "two": 1})


def stream_table_case(how: str) -> Case:
    app = App(f"stream-table-{how}")
    orders = app.topic("orders", value=serdes.Int())
    prices = app.table("prices", value=serdes.Int())
    orders.join(prices, lambda key, n, price: n * (price if price is not None else -1), how=how, value=serdes.Int(), name="priced").to("out")
    return Case(app, {"orders": 2, "prices": 2}, {"orders", "prices"}, {"out": "stream"}, {"prices": 0, "orders": 1})


def table_views_case() -> Case:
    """Tables computed on read: a filter and a map_values of a topic's table, as update streams
    (a filtered-out update is a tombstone) and looked up by a stream–table join through both."""
    app = App("table-views")
    orders = app.topic("orders", value=serdes.Int())
    prices = app.table("prices", value=serdes.Int())
    cheap = prices.filter(lambda key, price: price < 6, name="cheap")
    doubled = cheap.map_values(lambda key, price: price * 2, value=serdes.Int(), name="doubled")
    doubled.to_stream().to("doubled")
    prices.filter_not(lambda key, price: price % 2 == 0, name="odd").to_stream().to("odd")
    orders.join(doubled, lambda key, n, price: n * (price if price is not None else -1), how="left", value=serdes.Int(), name="priced").to("out")
    return Case(app, {"orders": 2, "prices": 2}, {"orders", "prices"}, {"out": "stream", "doubled": "table", "odd": "table"}, {"prices": 0, "orders": 1})


def stream_stream_case(how: str) -> Case:
    app = App(f"stream-stream-{how}")
    left = app.topic("left", value=serdes.Int())
    right = app.topic("right", value=serdes.Int())
    left.join(
        right, lambda key, lv, rv: f"{lv}:{rv}", window=JoinWindow(before=20 * S, after=10 * S, grace=15 * S), how=how, value=serdes.Text(), name="pairs"
    ).to("out")
    return Case(app, {"left": 2, "right": 2}, {"left", "right"}, {"out": "stream"}, {"left": 0, "right": 1})


def table_table_case(how: str) -> Case:
    """A table–table join on the key, materialized, and its update stream."""
    app = App(f"table-table-{how}")
    left = app.table("left", value=serdes.Int())
    right = app.table("right", value=serdes.Int())
    joined = left.join(right, lambda key, lv, rv: f"{lv}:{rv}", how=how, value=serdes.Text(), store="joined", name="pairs")
    joined.to_stream().to("out")
    return Case(app, {"left": 2, "right": 2}, {"left", "right"}, {"out": "table"}, {"left": 0, "right": 1})


def grouped_table_case() -> Case:
    """A table regrouped by value parity (the repartition carries new and old values), summed
    with a subtractor, and a count of a stream–table join behind a re-key: chained queries."""
    app = App("grouped-table")
    prices = app.table("prices", value=serdes.Int())
    by_parity = prices.group_by(lambda key, price: ("even" if price % 2 == 0 else "odd", price), value=serdes.Int(), name="by-parity")
    by_parity.aggregate(0, lambda total, key, n: total + n, lambda total, key, n: total - n, value=serdes.Int(), store="sums").to_stream().to("sums")
    orders = app.topic("orders", value=serdes.Int())
    priced = orders.join(prices, lambda key, n, price: n * price, value=serdes.Int(), name="priced")
    priced.select_key(lambda key, total: str(total % 3), key=serdes.Text(), name="by-rest").group_by_key().count(store="per-rest").to_stream().to("per-rest")
    return Case(app, {"orders": 2, "prices": 2}, {"orders", "prices"}, {"sums": "table", "per-rest": "table"}, {"prices": 0, "orders": 1})


def foreign_key_case(how: str) -> Case:
    """Each left row names a right key (its value's last digit): the foreign-key join's
    subscription and response topics chain the queries both ways."""
    app = App(f"foreign-key-{how}")
    left = app.table("left", value=serdes.Int())
    right = app.table("right", value=serdes.Int())
    left.join(
        right, lambda key, lv, rv: f"{lv}->{rv}", foreign_key=lambda key, lv: KEYS[lv % len(KEYS)], how=how, value=serdes.Text(), store="fk", name="fk"
    ).to_stream().to("out")
    return Case(app, {"left": 2, "right": 3}, {"left", "right"}, {"out": "table"}, {"left": 0, "right": 1})


def materialized_views_case() -> Case:
    """A materialized filter (no tombstone for a key it never held) and map_values."""
    app = App("materialized-views")
    prices = app.table("prices", value=serdes.Int())
    cheap = prices.filter(lambda key, price: price < 6, store="cheap", name="cheap")
    cheap.map_values(lambda key, price: price * 2, value=serdes.Int(), store="doubled", name="doubled").to_stream().to("doubled")
    return Case(app, {"prices": 2}, {"prices"}, {"doubled": "table"})


def suppress_case() -> Case:
    """A windowed count held until its window closes (one final result per window), and a
    plain count held for a stream-time limit: the suppression buffers in Spark state."""
    from pystreams import until_time_limit, until_window_closes

    app = App("suppressed")
    numbers = app.topic("in", value=serdes.Int())
    windowed = app.count(numbers, store="per-minute", window=TumblingWindow(size=60 * S, grace=10 * S))
    windowed.suppress(until_window_closes(), name="held-windows").to("closed")
    app.count(numbers, store="totals").suppress(until_time_limit(20 * S), name="held-totals").to("totals")
    # A time limit counts from when the buffer took a key's update, which folding moves.
    return Case(app, {"in": 2}, {"in"}, {"closed": "stream", "totals": "table"}, batch_dependent=True)


def global_table_case(how: str) -> Case:
    """A stream joined with a global table by a key taken from its value, behind a count so
    that the app chains (a stateful step after the join)."""
    app = App(f"global-{how}")
    orders = app.topic("orders", value=serdes.Int())
    rates = app.global_table("rates", value=serdes.Int())
    joined = orders.join(
        rates,
        lambda key, n, rate: n * (rate if rate is not None else -1),
        foreign_key=lambda key, n: KEYS[n % len(KEYS)],
        how=how,
        value=serdes.Int(),
        name="converted",
    )
    joined.to("converted")
    app.count(joined, store="per-key").to("per-key")
    return Case(app, {"orders": 2, "rates": 1}, {"orders"}, {"converted": "stream", "per-key": "table"}, {"rates": 0, "orders": 1}, batch_dependent=True)


def versioned_case(grace: bool) -> Case:
    """A stream joined with a versioned table as of each record's time (out-of-order table
    updates included), with or without the join holding records for a grace period."""
    app = App(f"versioned-{'grace' if grace else 'plain'}")
    orders = app.topic("orders", value=serdes.Int())
    prices = app.table("prices", value=serdes.Int(), versioned=30 * S)
    options: dict[str, Any] = {"grace": 10 * S} if grace else {}
    orders.join(prices, lambda key, n, price: n * (price if price is not None else -1), how="left", value=serdes.Int(), name="priced", **options).to("out")
    prices.to_stream().to("price-updates")
    # Which version a record meets depends on where the table's update lands in the batch.
    return Case(
        app, {"orders": 2, "prices": 2}, {"orders", "prices"}, {"out": "stream", "price-updates": "stream"}, {"prices": 0, "orders": 1}, batch_dependent=True
    )


class Dedupe(Processor):
    """Forwards a key's value the first time (per 30 s of stream time); every 20 s of stream
    time it forgets old keys and forwards how many it remembers. State only in its store."""

    def init(self, context: Any) -> None:
        super().init(context)
        self.seen = context.store("seen")

    def process(self, key: Any, value: Any) -> None:
        first = self.seen.get(key)
        if first is None or self.context.timestamp - first > 30 * S:
            self.seen.put(key, self.context.timestamp)
            self.context.forward(key, value * 100 + self.context.offset % 7)

    @punctuate(every=timedelta(seconds=20), on=PunctuationType.STREAM_TIME)
    def forget(self, now: int) -> None:
        for key, first in list(self.seen.items()):
            if now - first > 60 * S:
                self.seen.delete(key)
        self.context.forward("remembered", sum(1 for _ in self.seen.items()))


def processor_case() -> Case:
    app = App("processor")
    numbers = app.topic("in", value=serdes.Int())
    odd = numbers.filter(lambda key, n: n % 2 == 1, name="odd")
    app.processor(odd, stores=[kv_store("seen", value=serdes.Int())], value=serdes.Int(), key_changing=False)(Dedupe).to("out")
    return Case(app, {"in": 2}, {"in"}, {"out": "stream"})


CASES: dict[str, Callable[[], Case]] = {
    "stateless": stateless_case,
    "aggregations": aggregations_case,
    "windows": windows_case,
    "emit-final": emit_final_case,
    "sessions": sessions_case,
    "sliding": sliding_case,
    "cogroup": cogroup_case,
    "stream-table-inner": lambda: stream_table_case("inner"),
    "stream-table-left": lambda: stream_table_case("left"),
    "table-views": table_views_case,
    "stream-stream-inner": lambda: stream_stream_case("inner"),
    "stream-stream-left": lambda: stream_stream_case("left"),
    "stream-stream-outer": lambda: stream_stream_case("outer"),
    "processor": processor_case,
    "table-table-inner": lambda: table_table_case("inner"),
    "table-table-left": lambda: table_table_case("left"),
    "table-table-outer": lambda: table_table_case("outer"),
    "grouped-table": grouped_table_case,
    "foreign-key-inner": lambda: foreign_key_case("inner"),
    "foreign-key-left": lambda: foreign_key_case("left"),
    "materialized-views": materialized_views_case,
    "suppress": suppress_case,
    "global-inner": lambda: global_table_case("inner"),
    "global-left": lambda: global_table_case("left"),
    "versioned": lambda: versioned_case(False),
    "versioned-grace": lambda: versioned_case(True),
}

# (topic number, key, value, partition draw, seconds from the previous record, new batch after?)
RAW_RECORDS = st.lists(
    st.tuples(
        st.integers(0, 1),
        st.sampled_from(KEYS),
        st.integers(0, 9),
        st.integers(0, 2),
        st.integers(-45, 25),
        st.booleans(),
    ),
    min_size=1,
    max_size=45,
)


def make_input(case: Case, raw: list[tuple[int, str, int, int, int, bool]]) -> list[list[InputRecord]]:
    """Records cut into micro-batches; a record's partition follows its key on keyed topics."""
    topics = sorted(case.partitions)
    key_serde, value_serde = serdes.Text(), serdes.Int()
    batches: list[list[InputRecord]] = [[]]
    seconds = 100
    for topic_number, key, value, partition_draw, step, cut in raw:
        topic = topics[topic_number % len(topics)]
        count = case.partitions[topic]
        key_bytes = key_serde.serialize(key)
        assert key_bytes is not None
        partition = partition_for_key(key_bytes, count) if topic in case.keyed else partition_draw % count
        seconds = max(0, seconds + step)
        record = InputRecord(topic, partition, key_bytes, value_serde.serialize(value), BASE_MS + seconds * S)
        batches[-1].append(record)
        if cut:
            batches.append([])
    return [batch for batch in batches if batch]


def in_spark_batch_order(batch: list[InputRecord], case: Case, source_topics: tuple[str, ...]) -> list[InputRecord]:
    """The batch as a Spark stateful step applies it (``ORDER_COLUMNS``)."""
    arrival: dict[tuple[str, int], int] = {}
    offsets: dict[tuple[str, int], int] = collections.Counter()
    keyed = []
    for record in batch:
        where = (record.topic, record.partition)
        arrival[where] = max(arrival.get(where, record.timestamp), record.timestamp)
        keyed.append(((arrival[where], case.sides.get(record.topic, 0), source_topics.index(record.topic), record.partition, offsets[where]), record))
        offsets[where] += 1
    return [record for _, record in sorted(keyed, key=lambda pair: pair[0])]


def decoded(rows: list[tuple[bytes | None, bytes | None, int]], key_serde: Any, value_serde: Any) -> list[Any]:
    return [(key_serde.deserialize(k), value_serde.deserialize(v), ts) for k, v, ts in rows]


def final_table(records: list[tuple[Any, Any, int]]) -> dict[Any, Any]:
    """Each key's latest value with its timestamp: both runtimes stamp a table's row alike
    (the largest timestamp folded into an aggregate, a session's end, ...), however often
    they emit it."""
    table: dict[Any, Any] = {}
    for key, value, timestamp in records:
        if value is None:
            table.pop(key, None)
        else:
            table[key] = (value, timestamp)
    return table


def final_values(records: list[tuple[Any, Any, int]]) -> dict[Any, Any]:
    """Each key's latest value."""
    return {key: value for key, (value, _) in final_table(records).items()}


def multiset(records: list[tuple[Any, Any, int]]) -> collections.Counter[Any]:
    return collections.Counter(repr(record) for record in records)


@pytest.mark.parametrize("name", sorted(CASES))
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(raw=RAW_RECORDS)
def test_spark_operators_write_what_the_test_driver_writes(name: str, raw: list[Any]) -> None:
    case = CASES[name]()
    topology = case.app.topology()
    plan = compile_topology(topology)
    batches = make_input(case, raw)
    emulator = SparkEmulator(plan, resolve(topology, case.partitions).partitions)
    sinks = {node.topic: node for node in topology.nodes.values() if isinstance(node, SinkNode) and node.topic in case.outputs}

    # A chained plan's tables forward once per micro-batch, folded per key, as a worker's cache
    # does per commit, and the driver's per record: a row's final timestamp may then come from
    # another update, and a group that only a folded-away update made never appears (Kafka
    # Streams' caching does the same). So a second emulator takes each record as a micro-batch
    # of its own — the driver's granularity — and must give exactly the driver's tables; the
    # batched one, the driver's values for the keys it has.
    one_by_one = SparkEmulator(plan, resolve(topology, case.partitions).partitions) if plan.chained else None
    spark_out: dict[str, list[Any]] = {topic: [] for topic in case.outputs}
    exact_out: dict[str, list[Any]] = {topic: [] for topic in case.outputs}

    def collect(into: dict[str, list[Any]], written: dict[str, list[Any]]) -> None:
        for topic, rows in written.items():
            if topic in into:
                into[topic].extend(decoded(rows, sinks[topic].key_serde, sinks[topic].value_serde))

    with TopologyTestDriver(case.app, partitions=case.partitions) as driver:
        for batch in batches:
            collect(spark_out, emulator.run_batch(batch))
            for record in in_spark_batch_order(batch, case, plan.source_topics):
                driver.pipe_input(record.topic, record.key, record.value, record.timestamp, partition=record.partition)
                if one_by_one is not None:
                    collect(exact_out, one_by_one.run_batch([record]))
        for topic, kind in case.outputs.items():
            driver_out = [(r.key, r.value, r.timestamp) for r in driver.output_topic(topic).read_records()]
            if case.batch_dependent:
                if kind == "table":
                    assert final_table(exact_out[topic]) == final_table(driver_out), topic
                else:
                    assert multiset(exact_out[topic]) == multiset(driver_out), topic
            elif kind == "table" and one_by_one is not None:
                assert final_table(exact_out[topic]) == final_table(driver_out), topic
                batched, expected = final_values(spark_out[topic]), final_values(driver_out)
                assert batched == {key: expected.get(key) for key in batched}, topic
            elif kind == "table":
                assert final_table(spark_out[topic]) == final_table(driver_out), topic
            else:
                assert multiset(spark_out[topic]) == multiset(driver_out), topic


def test_a_chain_of_materialized_tables_emits_each_key_once_per_micro_batch() -> None:
    """Tables flush at the end of a batch, as a worker's caches do at a commit: four updates of
    a key reach the end of a table, a materialized filter and a materialized map as one record,
    the last, with its timestamp."""
    case = materialized_views_case()
    topology = case.app.topology()
    emulator = SparkEmulator(compile_topology(topology), resolve(topology, case.partitions).partitions)
    key = serdes.Text().serialize("a")
    partition = partition_for_key(key, 2)
    batch = [InputRecord("prices", partition, key, serdes.Int().serialize(price), BASE_MS + i) for i, price in enumerate([1, 9, 3, 4])]
    written = emulator.run_batch(batch)["doubled"]
    assert [(serdes.Int().deserialize(value), ts) for _, value, ts in written] == [(8, BASE_MS + 3)]
