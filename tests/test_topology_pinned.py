"""One topology with every node kind, pinned: its hash (which members compare, so a change
would look like a new topology to a running group), its text and Mermaid descriptions, and
the kind name each node shows. A refactoring of the IR must leave all of them byte-identical."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from pystreams.topology.describe import describe, to_mermaid

from pystreams import serdes
from pystreams.app import (
    App,
    JoinWindow,
    Processor,
    PunctuationType,
    SessionWindow,
    TumblingWindow,
    kv_store,
    load_app,
    punctuate,
    until_window_closes,
)

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


class Tagger(Processor):
    def process(self, key, value):
        self.context.forward(key, value)

    @punctuate(every=1000, on=PunctuationType.STREAM_TIME)
    def tick(self, now):
        pass


def every_kind():
    app = App("every-kind")
    clicks = app.topic("clicks", value=serdes.Json(), timestamp=lambda k, v, ts: ts)
    views = app.topic(pattern="views-.*", value=serdes.Json(), name="views")
    users = app.table("users", value=serdes.Json())
    rekeyed = clicks.map(lambda k, v: (v["user"], v), name="by-user")
    values = rekeyed.map_values(lambda k, v: v, name="values")
    many = values.flat_map(lambda k, v: [(k, v)], name="many")
    many_values = many.flat_map_values(lambda k, v: [v], name="many-values")
    kept = many_values.filter(lambda k, v: True, name="kept")
    seen = kept.peek(lambda k, v: None, name="seen")
    parts = seen.branch(lambda k, v: "a" if k else "b", branches=["a", "b"], name="split")
    merged = parts["a"].merge(parts["b"], name="merged")
    regrouped = merged.select_key(lambda k, v: k, name="regrouped").repartition(name="shuffled", partitions=4)
    regrouped.count(name="counts", window=TumblingWindow(60_000), emit="final").to_stream(name="count-stream").to("counts-out")
    totals = regrouped.aggregate(lambda acc, k, v: acc + 1, initial=0, name="totals", window=SessionWindow(5_000), merge=lambda k, a, b: a + b)
    totals.to_stream(name="total-stream").to("totals-out")
    windowed = regrouped.reduce(lambda a, b: a, name="latest", window=TumblingWindow(10_000))
    windowed.suppress(until_window_closes(max_records=100), name="final-latest").to_stream(name="latest-stream").to("latest-out")
    enriched = regrouped.join(users, lambda k, v, u: v, how="left", name="enriched")
    paired = enriched.join(regrouped, lambda k, a, b: a, window=JoinWindow(1_000), how="outer", name="paired")
    tagged = app.processor(paired, stores=[kv_store("tags")], key_changing=False, name="tagger")(Tagger)
    tagged.to("tagged-out")
    activity = app.cogroup()
    activity.cogroup(regrouped, lambda acc, k, v: acc + 1)
    activity.cogroup(views.group_by(lambda k, v: k, name="views-by-key"), lambda acc, k, v: acc + 2)
    activity.aggregate(initial=0, name="activity").to_stream(name="activity-stream").to("activity-out")
    groups = app.table("groups", value=serdes.Json())
    active = users.filter(lambda k, v: True, name="active-users").map_values(lambda k, v: v, name="user-names", store="user-names")
    memberships = active.join(groups, lambda k, u, g: g, how="left", name="memberships", store="memberships")
    memberships.group_by(lambda k, g: (g, k), name="by-group").count(name="group-sizes").to_stream(name="sizes-stream").to("sizes-out")
    users.join(groups, lambda k, u, g: g, foreign_key=lambda k, u: u["group"], how="left", name="user-groups").to_stream(name="user-groups-stream").to(
        "user-groups-out"
    )
    return app.topology()


def test_every_node_kind_is_in_the_pinned_topology():
    kinds = {node.kind for node in every_kind().nodes.values()}
    assert {str(kind) for kind in kinds} == {
        "source", "table-source", "sink", "map", "map-values", "flat-map", "flat-map-values", "filter", "peek",
        "select-key", "branch", "branch-output", "merge", "to-stream", "count", "aggregate", "reduce",
        "cogroup-aggregate", "cogroup", "stream-table-join", "stream-stream-join", "processor", "suppress",
        "table-filter", "table-map-values", "table-join-side", "table-join", "table-group-by", "table-aggregate",
        "fk-subscribe", "fk-subscriptions", "fk-foreign-update", "fk-join",
    }  # fmt: skip


@pytest.mark.parametrize(
    ("example", "pinned"),
    [
        ("clicks_windowed", "59947372-16f1-6253-c55c-b7c2d2f53ce7"),
        ("dedupe_processor", "6bdeb5b5-2b14-05f1-aa78-5756eba67691"),
        ("orders_enrich_join", "9408c6ea-953d-74aa-da58-6652e686bef6"),
        ("wordcount", "5718fa73-66fb-f2a7-bb7a-67333967b0f5"),
    ],
)
def test_example_hashes_are_pinned(example, pinned):
    assert str(load_app(str(EXAMPLES / f"{example}.py")).topology().hash) == pinned


def test_hash_and_descriptions_are_pinned():
    topology = every_kind()
    text = describe(topology) + to_mermaid(topology)
    assert (str(topology.hash), hashlib.sha256(text.encode()).hexdigest()) == (PINNED_HASH, PINNED_DESCRIPTION)


PINNED_HASH = "b4c696b5-6e99-94cf-f349-f7e827580c44"
PINNED_DESCRIPTION = "2afb59a043351553e5ae00ddec06f4d73fbc90217798f8985ed492abbd7269df"
