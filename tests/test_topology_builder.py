"""Building the IR: sub-topologies, repartition topics, stores, co-partitioning, validation."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from pystreams.topology.builder import build
from pystreams.topology.errors import (
    CopartitionError,
    InvalidNameError,
    InvalidPatternError,
    MissingSourceError,
    StoreError,
    TopologyError,
)
from pystreams.topology.ir import FilterNode, ProcessorNode, PunctuationType, StoreKind, TopicRole

from pystreams import serdes
from pystreams.app import App, JoinWindow, Processor, kv_store, load_app

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def example(name: str):
    return load_app(str(EXAMPLES / f"{name}.py")).topology()


def test_wordcount_splits_at_the_words_repartition_topic():
    topology = example("wordcount")
    assert topology.app_id == "wordcount"
    first, second = topology.subtopologies
    assert first.nodes == ("text-lines", "words", "words-repartition-sink")
    assert second.nodes == ("words-repartition-source", "counts", "counts-to-word-counts")
    assert first.source_topics == ("text-lines",) and first.sink_topics == ("wordcount-words-repartition",)
    assert second.source_topics == ("wordcount-words-repartition",) and second.sink_topics == ("word-counts",)
    assert second.stores == ("counts",) and first.stores == ()
    assert topology.external_source_topics == ("text-lines",) and topology.sink_topics == ("word-counts",)

    repartition = topology.internal_topics["wordcount-words-repartition"]
    assert (repartition.role, repartition.subtopology, repartition.reader_subtopology) == (TopicRole.REPARTITION, 0, 1)
    assert repartition.config["cleanup.policy"] == "delete"
    changelog = topology.internal_topics["wordcount-counts-changelog"]
    assert changelog.role is TopicRole.CHANGELOG and changelog.config == {"cleanup.policy": "compact"}
    assert changelog.subtopology == 1 and changelog.store == "counts"

    store = topology.stores["counts"]
    assert (store.kind, store.owner, store.subtopology) == (StoreKind.KEY_VALUE, "counts", 1)
    assert store.changelog_topic == "wordcount-counts-changelog"
    assert (store.key_serde, store.value_serde) == (serdes.Text(), serdes.Int())

    words = topology.node("words")
    assert words.children == ("words-repartition-sink",) and words.subtopology == 0
    counts = topology.node("counts")
    assert counts.parents == ("words-repartition-source",) and counts.children == ("counts-to-word-counts",)
    sink = topology.node("counts-to-word-counts")
    assert sink.topic == "word-counts" and sink.value_serde == serdes.Int() and sink.key_serde == serdes.Text()
    # the repartition topic carries the key-changed records with the words node's serdes
    assert topology.node("words-repartition-sink").value_serde == words.value_serde
    assert topology.copartition_groups == ()


def test_clicks_example_has_three_windowed_stores_behind_two_repartitions():
    topology = example("clicks_windowed")
    assert len(topology.subtopologies) == 3
    assert topology.subtopologies[0].source_patterns == (r"clicks\.[a-z]+",)
    assert set(topology.repartition_topics) == {"clicks-by_user-repartition", "clicks-by_url-repartition"}
    kinds = {name: store.kind for name, store in topology.stores.items()}
    assert kinds == {
        "clicks-per-minute": StoreKind.WINDOW,
        "url-views-5m": StoreKind.WINDOW,
        "user_sessions": StoreKind.SESSION,
    }
    assert topology.stores["clicks-per-minute"].subtopology == topology.stores["user_sessions"].subtopology == 1
    assert topology.stores["url-views-5m"].subtopology == 2
    config = topology.internal_topics["clicks-clicks-per-minute-changelog"].config
    # window retention (60 s + 10 s grace) plus Kafka's extra day
    assert config == {"cleanup.policy": "compact,delete", "retention.ms": str(70_000 + 86_400_000)}
    assert topology.node("clicks").timestamp_extractor is not None


def test_orders_example_joins_are_copartitioned():
    topology = example("orders_enrich_join")
    assert len(topology.subtopologies) == 2
    groups = {group.required_by: group for group in topology.copartition_groups}
    assert set(groups) == {("paid",), ("enriched",)}
    assert groups[("paid",)].topics == ("orders", "payments")
    assert set(groups[("enriched",)].topics) == {"customers", "orders-orders_by_customer-repartition"}
    # the table joins the sub-topology of the stream that looks it up
    assert topology.node("customers").subtopology == topology.node("enriched").subtopology == 1
    assert topology.stores["customers"].readers == ("enriched",)
    assert topology.stores["paid-left-store"].readers == ("paid-right",)


def test_dedupe_example_is_one_subtopology_with_a_processor_store():
    topology = example("dedupe_processor")
    (only,) = topology.subtopologies
    node = topology.node("Dedupe")
    assert isinstance(node, ProcessorNode) and node.stores == ("seen-ids",)
    assert {(p.method, p.type) for p in node.punctuations} == {
        ("forget_old_ids", PunctuationType.STREAM_TIME),
        ("report", PunctuationType.WALL_CLOCK_TIME),
    }
    assert topology.repartition_topics == ()
    assert topology.changelog_topics == ("dedupe-seen-ids-changelog",)


def _wordish(app: App):
    lines = app.topic("lines", value=serdes.Text())
    return lines.flat_map(lambda k, line: [(w, 1) for w in line.split()], name="words")


def test_value_only_steps_need_no_repartition():
    app = App("a")
    source = app.topic("in")
    source.map_values(lambda k, v: v, name="clean").map(lambda k, v: (k, v), key_changing=False, name="same").count(store="n")
    topology = app.topology()
    assert len(topology.subtopologies) == 1 and topology.repartition_topics == ()


def test_the_repartition_is_named_after_the_node_feeding_the_stateful_step():
    app = App("a")
    words = _wordish(app)
    long_words = words.filter(lambda k, v: len(k) > 3, name="long")
    long_words.count(store="n")
    topology = app.topology()
    assert topology.repartition_topics == ("a-long-repartition",)
    assert topology.node("long").subtopology == 0


def test_consumers_of_one_rekeyed_stream_share_its_repartition_topic():
    app = App("a")
    words = _wordish(app)
    words.count(store="n")
    words.reduce(lambda acc, k, v: acc + v, name="total")
    topology = app.topology()
    assert topology.repartition_topics == ("a-words-repartition",)
    assert topology.node("words-repartition-source").children == ("n", "total")


def test_explicit_repartition_fixes_partitions():
    app = App("a")
    words = _wordish(app)
    words.repartition(name="by-word", partitions=6).count(store="n")
    topology = app.topology()
    topic = topology.internal_topics["a-by-word-repartition"]
    assert topic.partitions == 6 and topology.repartition_topics == ("a-by-word-repartition",)
    assert topology.node("by-word-repartition-source").subtopology == 1


def test_keyed_processors_get_a_repartition_but_stateless_ones_do_not():
    class Noop(Processor):
        def process(self, key, value):
            self.context.forward(key, value)

    app = App("a")
    words = _wordish(app)
    words.process(Noop, name="stateless")
    words.process(Noop, name="stateful", stores=[kv_store("s")])
    topology = app.topology()
    assert topology.node("stateless").parents == ("words",)
    assert topology.node("stateful").parents == ("words-repartition-source",)


def test_a_store_used_by_two_subtopologies_is_rejected_naming_the_nodes():
    class Peeker(Processor):
        def process(self, key, value):
            pass

    app = App("a")
    _wordish(app).count(store="counts")
    # 'counts' lives behind the words repartition; 'peeker' reads another topic entirely.
    app.processor(app.topic("other"), stores=["counts"], name="peeker")(Peeker)
    with pytest.raises(StoreError, match=r"store 'counts' is used by two sub-topologies.*'counts'.*'peeker'") as error:
        app.topology()
    assert set(error.value.nodes) == {"counts", "peeker"}


def test_a_processor_may_read_a_store_of_its_own_subtopology():
    class Reader(Processor):
        def process(self, key, value):
            pass

    app = App("a")
    source = app.topic("in")
    counts = source.count(store="counts")
    app.processor(counts.to_stream(), stores=["counts"], name="reader")(Reader)
    assert app.topology().stores["counts"].readers == ("reader",)


def test_unknown_store_is_rejected():
    class Reader(Processor):
        def process(self, key, value):
            pass

    app = App("a")
    app.processor(app.topic("in"), stores=["nowhere"], name="reader")(Reader)
    with pytest.raises(StoreError, match="'reader' uses store 'nowhere', which no node declares"):
        app.topology()


def test_missing_sources_are_rejected_naming_the_nodes():
    app = App("a")
    source = app.topic("in")
    source.to("out")
    nodes = list(app._nodes.values())
    orphan = FilterNode(
        name="orphan",
        key_serde=serdes.Text(),
        value_serde=serdes.Text(),
        parents=("ghost",),
        fn=lambda k, v: True,
    )
    with pytest.raises(MissingSourceError, match="'orphan' reads from 'ghost', which is not declared") as error:
        build("a", [*nodes, orphan], [])
    assert error.value.nodes == ("orphan", "ghost")
    with pytest.raises(MissingSourceError, match="has no input"):
        build("a", [*nodes, replace(orphan, parents=())], [])
    with pytest.raises(MissingSourceError, match="no source"):
        build("a", [], [])
    orders = App("b")
    orders.join(orders.topic("orders"), orders.table("customers"), name="j")(lambda k, left, right: left)
    without_table = [n for n in orders._nodes.values() if n.name != "customers"]
    with pytest.raises(MissingSourceError, match="join 'j' reads table 'customers', which is not declared"):
        build("b", without_table, [])


def test_pattern_overlapping_a_named_source_is_rejected():
    app = App("a")
    app.topic("clicks.eu", name="eu")
    app.topic(pattern=r"clicks\..*", name="all-clicks")
    with pytest.raises(InvalidPatternError, match=r"'all-clicks'.*matches \['clicks.eu'\].*\['eu'\]"):
        app.topology()


def test_writing_to_an_internal_topic_is_rejected():
    app = App("a")
    _wordish(app).count(store="counts").to("a-counts-changelog")
    with pytest.raises(InvalidNameError, match="internal topic"):
        app.topology()


def test_fixed_repartition_counts_in_one_join_must_agree():
    app = App("a")
    left = app.topic("l").map(lambda k, v: (v, k), name="lk").repartition(partitions=2)
    right = app.topic("r").map(lambda k, v: (v, k), name="rk").repartition(partitions=3)
    app.join(left, right, window=JoinWindow(1000), name="j")(lambda k, a, b: a)
    with pytest.raises(CopartitionError, match="'j' needs co-partitioned inputs") as error:
        app.topology()
    assert set(error.value.topics) == {"a-lk-repartition", "a-rk-repartition"}


def test_stream_stream_join_repartitions_rekeyed_sides_into_one_subtopology():
    app = App("a")
    clicks = app.topic("clicks").map(lambda k, v: (v["user"], v), name="clicks_by_user")
    views = app.topic("views")
    app.join(clicks, views, window=JoinWindow(60_000), name="matched")(lambda k, c, v: (c, v)).to("matched")
    topology = app.topology()
    join_sub = topology.node("matched").subtopology
    assert topology.node("matched-left").parents == ("clicks_by_user-repartition-source",)
    assert topology.node("views").subtopology == join_sub
    (group,) = topology.copartition_groups
    assert set(group.topics) == {"a-clicks_by_user-repartition", "views"} and group.required_by == ("matched",)


def test_declarations_out_of_order_are_rejected():
    app = App("a")
    source = app.topic("in")
    source.filter(lambda k, v: True, name="f")
    nodes = list(app._nodes.values())
    with pytest.raises(TopologyError, match="declared after it"):
        build("a", list(reversed(nodes)), [])
