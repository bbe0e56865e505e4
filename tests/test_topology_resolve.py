"""resolve(): tasks and internal partition counts from the cluster's topics."""

from __future__ import annotations

from pathlib import Path

import pytest
from pystreams.topology.errors import CopartitionError, InvalidPatternError, MissingSourceError, TopologyError
from pystreams.topology.ir import TaskId, TopicRole
from pystreams.topology.resolve import resolve

from pystreams.app import App, load_app

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def example(name: str):
    return load_app(str(EXAMPLES / f"{name}.py")).topology()


def test_wordcount_tasks_follow_the_source_partitions():
    resolved = resolve(example("wordcount"), {"text-lines": 3, "word-counts": 1})
    assert resolved.tasks == tuple(TaskId(s, p) for s in (0, 1) for p in range(3))
    assert [str(t) for t in resolved.tasks_of(1)] == ["1_0", "1_1", "1_2"]
    assert resolved.partitions == {
        "text-lines": 3,
        "word-counts": 1,
        "wordcount-counts-changelog": 3,
        "wordcount-words-repartition": 3,
    }
    assert resolved.input_partitions(TaskId(1, 2)) == (("wordcount-words-repartition", 2),)
    assert resolved.changelog_partition("counts", TaskId(1, 2)) == ("wordcount-counts-changelog", 2)
    created = {t.name: (t.partitions, t.config["cleanup.policy"], t.role) for t in resolved.topics_to_create()}
    assert created == {
        "wordcount-counts-changelog": (3, "compact", TopicRole.CHANGELOG),
        "wordcount-words-repartition": (3, "delete", TopicRole.REPARTITION),
    }


def test_copartition_mismatch_names_both_topics_and_the_join():
    with pytest.raises(CopartitionError) as error:
        resolve(example("orders_enrich_join"), {"orders": 3, "payments": 4, "customers": 3})
    message = str(error.value)
    assert "'orders' (3 partitions)" in message and "'payments' (4 partitions)" in message
    assert "join 'paid'" in message
    assert set(error.value.topics) == {"orders", "payments"}


def test_repartition_topics_take_the_count_of_their_copartitioned_table():
    resolved = resolve(example("orders_enrich_join"), {"orders": 2, "payments": 2, "customers": 5})
    assert resolved.partitions["orders-orders_by_customer-repartition"] == 5
    assert resolved.task_counts == {0: 2, 1: 5}
    assert resolved.partitions["orders-customers-changelog"] == 5
    assert resolved.partitions["orders-paid-left-store-changelog"] == 2


def test_internal_topics_take_the_largest_input_of_their_writer():
    app = App("m")
    merged = app.topic("small").merge(app.topic("big"), name="both")
    merged.map(lambda k, v: (v, k), name="flip").count(store="n")
    resolved = resolve(app.topology(), {"small": 2, "big": 7})
    assert resolved.partitions["m-flip-repartition"] == 7 and resolved.task_counts == {0: 7, 1: 7}
    # a task reads the partitions its inputs have: task 0_5 exists only in 'big'
    assert resolved.input_partitions(TaskId(0, 5)) == (("big", 5),)
    assert resolved.input_partitions(TaskId(0, 1)) == (("small", 1), ("big", 1))


def test_explicit_repartition_count_wins():
    app = App("x")
    app.topic("in").map(lambda k, v: (v, k), name="flip").repartition(partitions=12).count(store="n")
    resolved = resolve(app.topology(), {"in": 3})
    assert resolved.partitions["x-flip-repartition"] == 12
    assert resolved.task_counts == {0: 3, 1: 12} and resolved.partitions["x-n-changelog"] == 12


def test_missing_source_topic_is_named():
    with pytest.raises(MissingSourceError, match=r"source 'text-lines' reads \['text-lines'\]") as error:
        resolve(example("wordcount"), {"other": 1})
    assert error.value.nodes == ("text-lines",) and error.value.topics == ("text-lines",)


def test_patterns_expand_to_matching_topics_but_never_internal_ones():
    topology = example("clicks_windowed")
    cluster = {
        "clicks.eu": 2,
        "clicks.us": 4,
        "clicks.EU": 9,
        "views.eu": 8,
        "clicks-by_user-repartition": 4,
        "clicks-by_url-repartition": 4,
    }
    resolved = resolve(topology, cluster)
    assert resolved.source_topics["clicks"] == ("clicks.eu", "clicks.us")
    assert resolved.task_counts == {0: 4, 1: 4, 2: 4}
    assert resolved.input_partitions(TaskId(0, 3)) == (("clicks.us", 3),)
    with pytest.raises(MissingSourceError, match=r"pattern 'clicks\\\\\.\[a-z\]\+' matches no topic"):
        resolve(topology, {"views.eu": 8})


def test_one_topic_cannot_feed_two_patterns():
    app = App("p")
    app.topic(pattern="a.*", name="first").to("o1")
    app.topic(pattern=".*b", name="second").to("o2")
    with pytest.raises(InvalidPatternError, match="'ab' would feed both 'first' and 'second'"):
        resolve(app.topology(), {"ab": 1})


def test_existing_internal_topics_must_already_have_the_right_size():
    with pytest.raises(TopologyError, match="'wordcount-counts-changelog' exists with 2 partitions.*needs 3"):
        resolve(example("wordcount"), {"text-lines": 3, "wordcount-counts-changelog": 2})


def test_partition_counts_must_be_positive():
    with pytest.raises(ValueError, match="positive"):
        resolve(example("wordcount"), {"text-lines": 0})


def test_patterns_skip_this_apps_internal_topics():
    app = App("p")
    app.topic(pattern="p-.*", name="all-p").map(lambda k, v: (v, k), name="flip").count(store="n")
    topology = app.topology()
    cluster = {"p-input": 2, "p-flip-repartition": 2, "p-n-changelog": 2}
    assert resolve(topology, cluster).source_topics["all-p"] == ("p-input",)
