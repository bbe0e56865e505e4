"""The decorator API: what each declaration records, and the mistakes it refuses early."""

from __future__ import annotations

import textwrap
from datetime import timedelta

import pytest
from pystreams.topology.errors import (
    InvalidNameError,
    InvalidPatternError,
    MissingSourceError,
    StoreError,
    TopologyError,
)
from pystreams.topology.ir import (
    FlatMapNode,
    JoinHow,
    JoinSide,
    MergeNode,
    ProcessorNode,
    StoreKind,
    StreamStreamJoinNode,
    StreamTableJoinNode,
    ToStreamNode,
    changes_key,
)

from pystreams import serdes
from pystreams.app import (
    App,
    AppLoadError,
    Branches,
    HoppingWindow,
    JoinWindow,
    Processor,
    PunctuationType,
    SessionWindow,
    Stream,
    Table,
    TumblingWindow,
    kv_store,
    load_app,
    punctuate,
    window_store,
)


@pytest.fixture
def app():
    return App("test-app")


def test_decorators_name_nodes_after_functions_and_return_handles(app):
    lines = app.topic("lines", value=serdes.Text())

    @app.flat_map(lines)
    def words(key, line):
        yield from ((w, 1) for w in line.split())

    @app.aggregate(words, store="counts", initial=0)
    def counts(total, key, value):
        return total + value

    assert isinstance(words, Stream) and words.name == "words"
    assert isinstance(counts, Table) and counts.store == "counts"
    assert isinstance(words.node, FlatMapNode) and words.node.key_changing
    assert words.node.parents == ("lines",)
    assert counts.node.fn(3, "k", 2) == 5  # the user's function is held by reference
    assert list(words.node.fn(None, "a b")) == [("a", 1), ("b", 1)]


def test_serde_defaults_and_inference(app):
    lines = app.topic("lines", value=serdes.Text())
    words = lines.flat_map(lambda k, line: [(w, 1) for w in line.split()], name="words")
    counted = app.count(words, store="word-count")
    summed = words.aggregate(lambda acc, k, v: acc + v, initial=0, name="summed")
    texts = words.aggregate(lambda acc, k, v: acc + str(v), initial="", name="texts")
    listed = words.aggregate(lambda acc, k, v: [*acc, v], initial=list, name="listed")
    assert (lines.node.key_serde, lines.node.value_serde) == (serdes.Text(), serdes.Text())
    assert (words.node.key_serde, words.node.value_serde) == (serdes.Text(), serdes.Json())
    assert counted.node.value_serde == serdes.Int()
    assert summed.node.value_serde == serdes.Int()
    assert texts.node.value_serde == serdes.Text()
    assert listed.node.value_serde == serdes.Json()
    assert app.count(words, store="per-minute", window=TumblingWindow(60_000)).node.key_serde == serdes.WindowedKey(serdes.Text())


def test_app_default_serdes_can_be_changed():
    app = App("raw", key_serde=serdes.Bytes(), value_serde=serdes.Bytes())
    source = app.topic("in")
    assert (source.node.key_serde, source.node.value_serde) == (serdes.Bytes(), serdes.Bytes())


def test_value_only_operations_keep_the_key_serde_and_do_not_change_keys(app):
    source = app.topic("in", key=serdes.Int())
    doubled = source.map_values(lambda k, v: v * 2, name="doubled")
    kept = source.filter(lambda k, v: True, name="kept")
    same_keys = source.map(lambda k, v: (k, v), name="same_keys", key_changing=False)
    assert doubled.node.key_serde == serdes.Int() and not changes_key(doubled.node)
    assert kept.node.value_serde == source.node.value_serde
    assert not same_keys.node.key_changing and same_keys.node.key_serde == serdes.Int()
    rekeyed = source.map(lambda k, v: (str(k), v), name="rekeyed")
    assert rekeyed.node.key_changing and rekeyed.node.key_serde == serdes.Text()


def test_lambdas_get_generated_unique_names(app):
    source = app.topic("in")
    first = source.filter(lambda k, v: True)
    second = source.filter(lambda k, v: False)
    assert (first.name, second.name) == ("in-filter", "in-filter-2")


def test_names_must_be_unique_and_legal(app):
    source = app.topic("in")

    @app.map_values(source)
    def clean(key, value):
        return value

    with pytest.raises(InvalidNameError, match="'clean' is already used"):

        @app.map_values(source)
        def clean(key, value):
            return value

    with pytest.raises(InvalidNameError, match="not usable"):
        source.filter(lambda k, v: True, name="has space")
    with pytest.raises(InvalidNameError, match="not usable"):
        App("bad/app")


def test_a_topic_has_one_source(app):
    app.topic("in")
    with pytest.raises(InvalidNameError, match="already read by source 'in'") as error:
        app.table("in", name="in-table")
    assert error.value.nodes == ("in", "in-table")


def test_pattern_sources_compile_with_re2(app):
    clicks = app.topic(pattern=r"clicks\.[a-z]+", name="clicks")
    assert clicks.node.pattern == r"clicks\.[a-z]+" and clicks.node.topics == ()
    with pytest.raises(InvalidPatternError, match=r"source 'broken': invalid RE2 pattern 'clicks\(': missing \)"):
        app.topic(pattern="clicks(", name="broken")
    # RE2 has no backreferences: a pattern Python's re accepts is still refused, clearly.
    with pytest.raises(InvalidPatternError, match="source 'backref'"):
        app.topic(pattern=r"(a)\1", name="backref")
    with pytest.raises(TopologyError, match="exactly one"):
        app.topic("t", pattern="t.*")


def test_handles_of_another_app_are_refused(app):
    other = App("other")
    foreign = other.topic("foreign")
    with pytest.raises(MissingSourceError, match="'foreign' belongs to app 'other'"):
        app.filter(foreign)(lambda k, v: True)


def test_tables_and_streams_are_not_interchangeable(app):
    table = app.table("customers")
    with pytest.raises(TopologyError, match="'customers' is a table; use .to_stream"):
        app.map(table)(lambda k, v: (k, v))
    updates = table.to_stream()
    assert isinstance(updates.node, ToStreamNode) and updates.node.parents == ("customers",)


def test_branch_gives_one_named_stream_per_label(app):
    orders = app.topic("orders")

    @app.branch(orders, branches=["big", "small"])
    def by_size(key, order):
        return "big" if order["amount"] > 100 else "small"

    assert isinstance(by_size, Branches) and set(by_size) == {"big", "small"}
    assert by_size.big.name == "by_size-big" and by_size["small"].node.label == "small"
    assert app._nodes["by_size"].branches == ("big", "small")
    with pytest.raises(AttributeError, match="no branch 'huge'"):
        _ = by_size.huge
    with pytest.raises(TopologyError, match="distinct"):
        app.branch(orders, branches=["a", "a"])


def test_merge_needs_two_distinct_streams(app):
    a, b = app.topic("a"), app.topic("b")
    merged = a.merge(b, name="both")
    assert merged.node.parents == ("a", "b") and isinstance(merged.node, MergeNode)
    with pytest.raises(TopologyError, match="at least two"):
        app.merge(a)
    with pytest.raises(TopologyError, match="given twice"):
        app.merge(a, a)


def test_windowed_aggregations_declare_window_and_session_stores(app):
    clicks = app.topic("clicks")
    per_minute = clicks.count(store="per-minute", window=TumblingWindow(timedelta(minutes=1), grace=timedelta(seconds=5)))
    hopping = clicks.count(store="hopping", window=HoppingWindow(300_000, advance=60_000))
    sessions = clicks.aggregate(
        lambda acc, k, v: acc + 1,
        initial=0,
        name="sessions",
        window=SessionWindow(gap=timedelta(minutes=30)),
        merge=lambda k, a, b: a + b,
    )
    stores = app._stores
    assert stores["per-minute"].kind is StoreKind.WINDOW and stores["per-minute"].retention_ms == 65_000
    assert stores["hopping"].window == HoppingWindow(300_000, 60_000)
    assert stores["sessions"].kind is StoreKind.SESSION
    assert per_minute.node.window.grace_ms == 5_000 and per_minute.windowed
    assert sessions.node.merger("k", 2, 3) == 5
    assert hopping.node.merger is None


def test_session_aggregates_need_a_merger_and_merge_needs_sessions(app):
    clicks = app.topic("clicks")
    with pytest.raises(TopologyError, match="'lonely' over session windows needs merge="):
        clicks.aggregate(lambda acc, k, v: acc, initial=0, name="lonely", window=SessionWindow(1000))
    with pytest.raises(TopologyError, match="only applies to session windows"):
        clicks.aggregate(lambda acc, k, v: acc, initial=0, name="odd", merge=lambda k, a, b: a)
    # count and reduce merge on their own
    assert clicks.count(store="c", window=SessionWindow(1000)).node.merger("k", 2, 5) == 7
    reduced = clicks.reduce(lambda acc, k, v: acc + v, name="r", window=SessionWindow(1000))
    assert reduced.node.merger("k", 2, 5) == 7


def test_stream_table_join_spec(app):
    orders = app.topic("orders")
    customers = app.table("customers")

    @app.join(orders, customers, how="left")
    def enriched(key, order, customer):
        return {"order": order, "customer": customer}

    node = enriched.node
    assert isinstance(node, StreamTableJoinNode) and node.parents == ("orders",)
    assert node.table == "customers" and node.table_store == "customers" and node.how is JoinHow.LEFT
    assert node.stores == ("customers",)
    with pytest.raises(TopologyError, match="inner or left"):
        app.join(orders, customers, how="outer", name="j2")(lambda k, left, right: left)
    with pytest.raises(TopologyError, match="takes no window"):
        app.join(orders, customers, window=JoinWindow(1000), name="j3")(lambda k, left, right: left)
    with pytest.raises(TopologyError, match="how must be one of"):
        app.join(orders, customers, how="sideways", name="j4")(lambda k, left, right: left)


def test_stream_stream_join_has_a_node_and_a_store_per_side(app):
    orders, payments = app.topic("orders"), app.topic("payments")
    paid = app.join(orders, payments, window=JoinWindow(within=timedelta(minutes=5)), how="outer")(lambda key, order, payment: (order, payment))
    assert paid.name == "orders-join"  # a lambda: named after its left input
    left, right = app._nodes["orders-join-left"], app._nodes["orders-join-right"]
    assert isinstance(paid.node, MergeNode) and paid.node.parents == (left.name, right.name)
    assert isinstance(left, StreamStreamJoinNode) and isinstance(right, StreamStreamJoinNode)
    assert left.side is JoinSide.LEFT and left.other == right.name
    assert (left.this_store, left.other_store) == ("orders-join-left-store", "orders-join-right-store")
    assert right.parents == ("payments",) and right.this_store == "orders-join-right-store"
    store = app._stores["orders-join-left-store"]
    assert store.retain_duplicates and store.retention_ms == 600_000 and store.owner == left.name
    with pytest.raises(TopologyError, match="needs window=JoinWindow"):
        app.join(orders, payments, name="unwindowed")(lambda k, left, right: left)


class Counter(Processor):
    def process(self, key, value):
        pass

    @punctuate(every=timedelta(seconds=10), on=PunctuationType.WALL_CLOCK_TIME)
    def flush(self, now):
        pass

    @punctuate(every=60_000)
    def expire(self, stream_time):
        pass


def test_processors_declare_stores_and_punctuations(app):
    source = app.topic("in")
    processed = source.process(Counter, stores=[kv_store("seen"), window_store("recent", size=1000, retention=5000)])
    node = processed.node
    assert isinstance(node, ProcessorNode) and node.fn is Counter and node.key_changing
    assert node.stores == ("seen", "recent")
    assert [(p.method, p.interval_ms, p.type) for p in node.punctuations] == [
        ("expire", 60_000, PunctuationType.STREAM_TIME),
        ("flush", 10_000, PunctuationType.WALL_CLOCK_TIME),
    ]
    assert app._stores["recent"].kind is StoreKind.WINDOW and app._stores["recent"].retention_ms == 5000
    assert app._stores["seen"].owner == "Counter"
    with pytest.raises(TypeError, match="Processor subclass"):
        app.processor(source, name="fn")(lambda k, v: None)
    with pytest.raises(StoreError, match="store 'seen' is declared by both 'Counter' and 'again'"):
        app.processor(source, stores=[kv_store("seen")], name="again")(Counter)


def test_sinks_inherit_serdes_unless_given(app):
    source = app.topic("in", value=serdes.Text())
    source.to("out")
    source.to("out-bytes", value=serdes.Bytes(), name="raw-out")
    assert app._nodes["in-to-out"].value_serde == serdes.Text()
    assert app._nodes["raw-out"].value_serde == serdes.Bytes() and app._nodes["raw-out"].topic == "out-bytes"


def test_window_arguments_are_validated(app):
    # Sizes and graces are refused where the window is declared, naming the node.
    stream = app.topic("in")
    with pytest.raises(TopologyError, match="count 'zero': tumbling window size must be > 0 ms, got 0") as error:
        app.count(stream, window=TumblingWindow(0), name="zero")
    assert error.value.nodes == ("zero",)
    with pytest.raises(TopologyError, match="count 'sparse': hopping window advance .* must not exceed"):
        app.count(stream, window=HoppingWindow(size=1000, advance=2000), name="sparse")
    with pytest.raises(TopologyError, match="aggregate 'no_gap': session inactivity gap must be > 0 ms, got 0; grace period must be >= 0 ms, got -5"):
        app.aggregate(stream, initial=0, window=SessionWindow(gap=0, grace=-5), merge=lambda k, a, b: a + b, name="no_gap")(lambda acc, k, v: acc)
    with pytest.raises(TopologyError, match="join 'pairs': join window before must be >= 0 ms"):
        app.join(stream, app.topic("other"), window=JoinWindow(before=-1, after=10), name="pairs")(lambda k, a, b: a)
    with pytest.raises(TypeError, match="timedelta or int"):
        SessionWindow(gap=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="either within= or before="):
        JoinWindow(1000, before=10)
    assert JoinWindow(before=timedelta(seconds=1), after=0).retention_ms == 1000


def test_load_app_from_a_file_and_attribute(tmp_path):
    path = tmp_path / "myapp.py"
    path.write_text(
        textwrap.dedent("""
        from pystreams.app import App
        first = App("first")
        first.topic("a").to("b")
        second = App("second")
        second.topic("c").to("d")
    """)
    )
    assert load_app(f"{path}:second").app_id == "second"
    with pytest.raises(LookupError, match="expected one pystreams App, found 2"):
        load_app(str(path))
    single = tmp_path / "single.py"
    single.write_text("from pystreams.app import App\nwhatever = App('only')\nwhatever.topic('x')\n")
    assert load_app(str(single)).app_id == "only"
    with pytest.raises(AppLoadError, match="no app file .*absent.py"):
        load_app(str(tmp_path / "absent.py"))


def test_an_app_that_does_not_load_says_where_and_why(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("from pystreams.app import App\napp = App('x')\nlines = app.topic('t'\n")
    with pytest.raises(AppLoadError) as syntax:
        load_app(str(broken))
    assert str(syntax.value).startswith(f"{broken} line 3: SyntaxError: '(' was never closed")
    assert "lines = app.topic('t'" in str(syntax.value)
    failing = tmp_path / "failing.py"
    failing.write_text("from pystreams.app import App\napp = App('x')\n\nlimit = int('ten')\n")
    with pytest.raises(AppLoadError, match=r"failing.py line 4: loading the app raised ValueError: invalid literal"):
        load_app(str(failing))
    with pytest.raises(AppLoadError, match="no app file or module 'no_such_app_module'"):
        load_app("no_such_app_module")


def test_async_functions_are_refused(app):
    source = app.topic("in")

    async def enrich(key, value):
        return value

    with pytest.raises(TypeError, match="'enrich' is async; pystreams functions are plain synchronous"):
        app.map_values(source)(enrich)

    class AsyncProcessor(Processor):
        async def process(self, key, value):
            pass

    with pytest.raises(TypeError, match="AsyncProcessor.process"):
        source.process(AsyncProcessor)
    with pytest.raises(TypeError, match="timestamp extractor"):
        app.topic("other", timestamp=enrich)


def test_group_by_groups_a_stream_for_an_aggregation_and_select_key_re_keys_it() -> None:
    """Kafka Streams' selectKey / groupBy / groupByKey: a grouped stream feeds an aggregation;
    used as a stream it still works, with a DeprecationWarning naming select_key."""
    import warnings

    from pystreams.app import GroupedStream, Stream

    app = App("grouping")
    events = app.topic("events", value=serdes.Text())
    by_value = events.group_by(lambda key, value: value, name="by-value")
    assert isinstance(by_value, GroupedStream)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        by_value.count(store="per-value")  # what it is for: no warning
        events.group_by_key().count(store="per-key")
        rekeyed = events.select_key(lambda key, value: value, name="rekeyed")
        assert type(rekeyed) is Stream
        rekeyed.filter(lambda key, value: True).to("kept")
    with pytest.warns(DeprecationWarning, match="filter on the grouped stream 'by-value'.*select_key"):
        by_value.filter(lambda key, value: True, name="old-style").to("old-style")
    with pytest.warns(DeprecationWarning, match="to on the grouped stream 'by-value'"):
        by_value.to("re-keyed")
    topology = app.topology()
    assert topology.nodes["by-value"].kind == topology.nodes["rekeyed"].kind == "select-key"
