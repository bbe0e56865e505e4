"""The Spark compiler without Spark: constructs that run as one query per sub-topology (chained
through internal topics), what it rejects (naming the node and the reason), the plan each kind
of step gets in one query per sink (per key, or per task where stream time matters), the warnings, the
Kafka source choice and the options each source gets, and the task stores Spark state holds."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from pystreams.topology.ir import StoreKind

from pystreams import serdes
from pystreams.app import App, Processor, TumblingWindow, kv_store, window_store
from pystreams.spark import SparkCompileError, compile_topology
from pystreams.spark.compiler import KeyedPlan, TaskPlan, UnionPlan, choose_source_format, source_options
from pystreams.spark.state import (
    SparkSessionStore,
    SparkWindowStore,
    TaskClocks,
    decode_task_clocks,
    encode_task_clocks,
)

# -- constructs that cannot compile ---------------------------------------------------------------


class Remember(Processor):
    def init(self, context: Any) -> None:
        super().init(context)
        self.store = context.store("recent")

    def process(self, key: Any, value: Any) -> None:
        self.context.forward(key, value)


def test_a_processor_with_a_window_store_runs_as_its_sub_topology_per_task() -> None:
    app = App("windowed-processor")
    events = app.topic("events", value=serdes.Text())
    stores = [window_store("recent", size=timedelta(minutes=1))]
    app.processor(events, stores=stores, key_changing=False, name="remember")(Remember).to("out")
    plan = compile_topology(app.topology())
    assert not plan.sinks  # not one query per sink: one per sub-topology
    (query,) = plan.chained
    assert (query.topics, query.writes) == (("events",), ("out",))
    assert [(store.name, store.kind) for store in query.step.stores] == [("recent", StoreKind.WINDOW)]
    assert plan.source_topics == ("events",) and not plan.feedback_topics


def test_a_processor_behind_a_repartition_reads_the_repartition_topic_the_first_query_writes() -> None:
    app = App("rekeyed-processor")
    events = app.topic("events", value=serdes.Text())

    @app.select_key(events)
    def by_value(key: Any, value: str) -> str:
        return value

    app.processor(by_value, stores=[kv_store("recent")], name="remember")(Remember).to("out")
    topology = app.topology()
    plan = compile_topology(topology)
    (repartition,) = topology.repartition_topics
    first, second = plan.chained
    assert (first.topics, first.writes) == (("events",), (repartition,))
    assert (second.topics, second.writes) == ((repartition,), ("out",))
    assert plan.source_topics == ("events",) and not plan.feedback_topics


def test_a_join_with_a_computed_table_runs_in_its_sub_topology_with_the_tables_store() -> None:
    app = App("join-counts")
    events = app.topic("events", value=serdes.Text())
    counts = app.count(events, store="counts")

    @app.join(events, counts, value=serdes.Text())
    def with_count(key: Any, value: str, count: int) -> str:
        return f"{value}:{count}"

    with_count.to("out")
    (query,) = compile_topology(app.topology()).chained
    assert "with_count" in {node.name for node in query.step.nodes}
    assert [store.name for store in query.step.stores] == ["counts"]


def test_a_foreign_key_join_runs_its_sides_in_rounds_while_responses_come_back() -> None:
    app = App("fk")
    orders = app.table("orders", value=serdes.Json())
    customers = app.table("customers", value=serdes.Text())
    orders.join(customers, lambda key, order, city: city, foreign_key=lambda key, order: order["customer"], value=serdes.Text(), name="placed").to_stream().to(
        "out"
    )
    topology = app.topology()
    plan = compile_topology(topology)
    left, right = plan.chained
    assert "orders" in left.topics and "customers" in right.topics
    subscriptions = next(t for t in left.writes if t in topology.repartition_topics)
    (responses,) = plan.feedback_topics
    assert subscriptions in right.topics and responses in right.writes and responses in left.topics
    assert set(plan.source_topics) == {"orders", "customers"}


def test_a_global_table_reaches_every_task_of_the_query_joining_it() -> None:
    app = App("global")
    cities = app.global_table("cities", value=serdes.Text())
    app.topic("events", value=serdes.Text()).join(cities, lambda key, value, city: city, foreign_key=lambda key, value: value, name="city").to("out")
    plan = compile_topology(app.topology())
    (query,) = plan.chained
    assert query.step.global_sources == (("cities", "cities"),) and query.topics == ("events", "cities")
    assert "cities" in {store.name for store in query.step.stores}
    assert set(plan.source_topics) == {"events", "cities"}


def test_a_versioned_table_keeps_its_history_in_its_sub_topologys_query() -> None:
    app = App("versioned")
    prices = app.table("prices", value=serdes.Int(), versioned=timedelta(minutes=5), name="prices")
    app.topic("orders", value=serdes.Int()).join(prices, lambda key, n, price: n * price, name="priced").to("out")
    (query,) = compile_topology(app.topology()).chained
    (store,) = query.step.stores
    assert store.history_ms == 5 * 60_000


def test_what_no_plan_runs_is_refused_before_spark_starts() -> None:
    app = App("nothing-out")
    app.topic("events", value=serdes.Text()).filter(lambda key, value: True, name="kept")
    with pytest.raises(SparkCompileError, match="writes no topic"):
        compile_topology(app.topology())
    app = App("patterns")
    app.topic(pattern="clicks\\..*", value=serdes.Text(), name="clicks").to("out")
    with pytest.raises(SparkCompileError, match="node 'clicks' .*needs the cluster's topic list"):
        compile_topology(app.topology())
    with pytest.raises(SparkCompileError, match="node 'clicks' .*no topic matches"):
        compile_topology(app.topology(), topics_matching=lambda pattern: [])


# -- the Kafka source: the connector when its jar is there, else ours ------------------------------


class FakeSpark:
    """Just enough of a SparkSession for ``choose_source_format``."""

    def __init__(self, connector_on_classpath: bool) -> None:
        self.connector_on_classpath = connector_on_classpath
        self.registered: list[type] = []
        self.dataSource = self
        self._jvm = self

    def register(self, source: type) -> None:
        self.registered.append(source)

    # spark._jvm.java.lang.Thread.currentThread().getContextClassLoader().loadClass(name)
    @property
    def java(self) -> Any:
        return self

    lang = java
    Thread = java

    def currentThread(self) -> Any:
        return self

    def getContextClassLoader(self) -> Any:
        return self

    def loadClass(self, name: str) -> None:
        if not self.connector_on_classpath:
            raise RuntimeError(f"ClassNotFoundException: {name}")
        assert name == "org.apache.spark.sql.kafka010.KafkaSourceProvider"


def test_the_builtin_connector_is_chosen_when_its_jar_is_on_the_classpath(caplog: pytest.LogCaptureFixture) -> None:
    pytest.importorskip("pyspark")
    with_jar, without_jar = FakeSpark(True), FakeSpark(False)
    with caplog.at_level("INFO", logger="pystreams.spark.compiler"):
        assert choose_source_format(with_jar) == "kafka"
        assert choose_source_format(without_jar) == "pystreams_kafka"
    assert with_jar.registered == []
    assert [source.name() for source in without_jar.registered] == ["pystreams_kafka"]
    assert "built-in connector" in caplog.text and "Python data source" in caplog.text


def test_each_source_gets_the_options_it_reads() -> None:
    assert source_options("kafka", "host:9092", ("a", "b")) == {
        "kafka.bootstrap.servers": "host:9092",
        "subscribe": "a,b",
        "startingOffsets": "earliest",
        "failOnDataLoss": "true",
    }
    assert source_options("pystreams_kafka", "host:9092", ("a", "b"), fail_on_data_loss=False) == {
        "bootstrap.servers": "host:9092",
        "topics": "a,b",
        "failOnDataLoss": "false",
    }


# -- the plan: per key where no stream time matters, per task where it does ------------------------


def _windowed_app(rekeyed: bool) -> App:
    app = App("windowed")
    clicks = app.topic("clicks", value=serdes.Text())
    counted = clicks.group_by(lambda key, page: page, name="by_page") if rekeyed else clicks
    app.count(counted, store="per-minute", window=TumblingWindow(size=60_000, grace=10_000)).to("counts")
    app.count(counted, store="totals").to("totals")
    return app


def test_windowed_steps_run_per_task_and_plain_aggregations_per_key() -> None:
    plan = compile_topology(_windowed_app(rekeyed=False).topology())
    bases = {sink.topic: sink.input.base for sink in plan.sinks}
    assert isinstance(bases["counts"], TaskPlan) and isinstance(bases["totals"], KeyedPlan)
    assert plan.warnings == () and plan.repartition_topics_of_tasks == ()


def test_a_windowed_step_behind_a_repartition_warns_naming_the_node_and_topic(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("WARNING", logger="pystreams.spark.compiler"):
        plan = compile_topology(_windowed_app(rekeyed=True).topology())
    (warning,) = plan.warnings
    assert "node 'per-minute'" in warning and "'windowed-by_page-repartition'" in warning
    assert warning in caplog.text
    assert plan.repartition_topics_of_tasks == ("windowed-by_page-repartition",)


def test_steps_after_a_merge_run_on_each_of_its_inputs() -> None:
    app = App("merged")
    a = app.topic("a", value=serdes.Text())
    b = app.topic("b", value=serdes.Text())
    a.merge(b, name="both").map_values(lambda key, value: value.upper(), value=serdes.Text(), name="loud").to("out")
    (sink,) = compile_topology(app.topology()).sinks
    assert isinstance(sink.input.base, UnionPlan)
    assert [[step.name for step in flow.steps] for flow in sink.input.base.inputs] == [["loud"], ["loud"]]


# -- task stores in Spark state --------------------------------------------------------------------


class Backend(dict):
    def put(self, key: bytes, value: bytes) -> None:
        self[key] = value

    def delete(self, key: bytes) -> None:
        self.pop(key, None)


def test_a_window_store_in_spark_state_expires_as_rocksdb_does_and_folds_changes() -> None:
    backend = Backend()
    store = SparkWindowStore("w", backend, retention_ms=100, observed_stream_time=None)
    assert store.put(b"k", 1000, b"a") and store.put(b"k", 1050, b"b") and store.put(b"k", 1000, b"c")
    assert store.get(b"k", 1000) == b"c" and list(store.fetch(b"k", 0, 2000)) == [(1000, b"c"), (1050, b"b")]
    assert not store.put(b"k", 950, b"late")  # 1050 - 100 + 1 = 951 is the oldest time kept
    assert store.flush() == [(b"k", 1050, b"b"), (b"k", 1000, b"c")]  # one change per window, last write last
    again = SparkWindowStore("w", backend, retention_ms=100, observed_stream_time=store.observed_stream_time)
    assert list(again.fetch(b"k", 0, 2000)) == [(1000, b"c"), (1050, b"b")]
    assert again.put(b"j", 1200, b"x")  # moves the store's time: 1000 and 1050 expire
    assert again.get(b"k", 1000) is None and list(again.fetch(b"k", 0, 2000)) == []
    again.flush()
    again.expire_untouched()
    assert set(backend) == {b"j"}


def test_a_session_store_in_spark_state_finds_sessions_by_end_then_start() -> None:
    store = SparkSessionStore("s", Backend(), retention_ms=100, observed_stream_time=None)
    for start, end, value in ((10, 20, b"a"), (0, 30, b"b"), (25, 25, b"c")):
        assert store.put(b"k", start, end, value)
    found = store.find_sessions(b"k", 15, 26)
    assert [(s.start, s.end, s.value) for s in found] == [(10, 20, b"a"), (25, 25, b"c"), (0, 30, b"b")]
    assert store.remove(b"k", 10, 20)
    assert store.flush()[-1] == (b"k", 10, 20, None)
    short = SparkSessionStore("s", Backend(), retention_ms=10, observed_stream_time=30)
    assert not short.put(b"k", 0, 5, b"old")  # ends before 30 - 10 + 1: expired, as in RocksDB
    assert short.put(b"k", 21, 21, b"kept") and short.find_sessions(b"k", 0, 100)[0].value == b"kept"


def test_task_clocks_survive_their_encoding() -> None:
    state = TaskClocks(stream_time=5, node_clocks={"n": 7}, store_times={"s": None}, swept_to={"s": 1}, due={"m": 9})
    assert decode_task_clocks(encode_task_clocks(state)) == state
    assert decode_task_clocks(encode_task_clocks(TaskClocks())) == TaskClocks()


def test_any_app_can_run_as_one_query_per_sub_topology_on_request() -> None:
    app = App("wordcount")
    lines = app.topic("lines", value=serdes.Text())
    words = lines.flat_map_values(lambda key, line: line.split(), name="words")
    app.count(words.select_key(lambda key, word: word, key=serdes.Text(), name="by-word"), store="counts").to("counts")
    topology = app.topology()
    assert compile_topology(topology).sinks and not compile_topology(topology).chained
    split, count = compile_topology(topology, per_subtopology=True).chained
    assert (split.topics, count.writes) == (("lines",), ("counts",)) and split.writes == count.topics
