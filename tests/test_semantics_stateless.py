"""Per-kind semantics of the stateless steps, run on the worker's kernels by the test driver."""

from __future__ import annotations

from typing import Any

import pytest

from pystreams import serdes
from pystreams.app import App
from pystreams.testing import TopologyTestDriver
from pystreams.worker import RecordProcessingError


def run(app: App, records: list[tuple[Any, Any, int]], *outputs: str) -> dict[str, list[tuple[Any, Any, int]]]:
    """Pipe ``records`` into the app's only input topic ``in``; every output's records."""
    with TopologyTestDriver(app) as driver:
        source = driver.input_topic("in")
        for key, value, timestamp in records:
            source.pipe_input(key, value, timestamp=timestamp)
        return {topic: [(r.key, r.value, r.timestamp) for r in driver.output_topic(topic).read_records()] for topic in outputs}


def test_map_map_values_and_select_key_transform_each_record_and_keep_its_timestamp() -> None:
    app = App("steps")
    numbers = app.topic("in", value=serdes.Json(type=int))
    numbers.map(lambda key, n: (f"{key}!", n * 10), name="mapped").to("mapped")
    numbers.map_values(lambda key, n: f"{key}={n}", value=serdes.Text(), name="described").to("described")
    numbers.select_key(lambda key, n: n % 2, key=serdes.Int(), name="parity").to("parity")
    out = run(app, [("a", 1, 5), ("b", 2, 3)], "mapped", "described", "parity")
    assert out["mapped"] == [("a!", 10, 5), ("b!", 20, 3)]
    assert out["described"] == [("a", "a=1", 5), ("b", "b=2", 3)]
    assert out["parity"] == [(1, 1, 5), (0, 2, 3)]


def test_flat_maps_emit_zero_or_more_records_in_order() -> None:
    app = App("flat")
    lines = app.topic("in", value=serdes.Text())

    @app.flat_map(lines, value=serdes.Int())
    def words(key: Any, line: str) -> Any:
        for word in line.split():
            yield word, len(word)

    words.to("words")
    lines.flat_map_values(lambda key, line: line.split(","), value=serdes.Text(), name="parts").to("parts")
    out = run(app, [("k", "ab c", 1), ("k", "", 2), ("j", "x,y", 3)], "words", "parts")
    assert out["words"] == [("ab", 2, 1), ("c", 1, 1), ("x,y", 3, 3)]
    assert out["parts"] == [("k", "ab c", 1), ("k", "", 2), ("j", "x", 3), ("j", "y", 3)]


def test_filter_keeps_matching_records_and_peek_sees_every_record_passing() -> None:
    seen = []
    app = App("filter")
    numbers = app.topic("in", value=serdes.Json(type=int))
    evens = numbers.filter(lambda key, n: n % 2 == 0, name="evens")
    evens.peek(lambda key, n: seen.append((key, n)), name="watch").to("evens")
    out = run(app, [("a", 1, 1), ("b", 2, 2), ("c", 4, 3)], "evens")
    assert out["evens"] == [("b", 2, 2), ("c", 4, 3)]
    assert seen == [("b", 2), ("c", 4)]


def branching_app() -> App:
    app = App("branching")
    numbers = app.topic("in", value=serdes.Json(type=int))

    @app.branch(numbers, branches=["small", "big"])
    def by_size(key: Any, n: int) -> str | None:
        if n < 0:
            return None
        if n > 1000:
            return "huge"  # not a branch: an error
        return "big" if n >= 10 else "small"

    by_size.small.to("small")
    by_size.big.to("big")
    by_size.small.merge(by_size.big, name="all").to("all")
    return app


def test_branch_routes_each_record_to_one_branch_none_drops_and_merge_takes_both() -> None:
    out = run(branching_app(), [("a", 3, 1), ("b", 30, 2), ("c", -1, 3), ("d", 4, 4)], "small", "big", "all")
    assert out["small"] == [("a", 3, 1), ("d", 4, 4)]
    assert out["big"] == [("b", 30, 2)]
    assert out["all"] == [("a", 3, 1), ("b", 30, 2), ("d", 4, 4)]


def test_a_branch_label_that_is_no_branch_fails_naming_the_node() -> None:
    with pytest.raises(RecordProcessingError, match=r"in node 'by_size': ValueError: .*'huge', not one of"):
        run(branching_app(), [("a", 5000, 1)])


def test_a_timestamp_extractor_sets_event_time_for_everything_downstream() -> None:
    app = App("extracted")
    events = app.topic("in", value=serdes.Json(), timestamp=lambda key, event, record_ts: event["at"])
    events.map_values(lambda key, event: event["n"], value=serdes.Int(), name="n").to("out")
    assert run(app, [("a", {"at": 42, "n": 1}, 1)], "out")["out"] == [("a", 1, 42)]


@pytest.mark.parametrize(
    ("returned", "shown"),
    [("HI", "str 'HI'"), (("k", "v", "extra"), "tuple \\('k', 'v', 'extra'\\)"), ({"k": "v"}, "dict")],
)
def test_a_map_that_returns_no_key_value_pair_fails_naming_the_node(returned: Any, shown: str) -> None:
    # "HI" used to unpack silently as key "H", value "I".
    app = App("bad-map")
    app.topic("in", value=serdes.Text()).map(lambda key, value: returned, name="shout").to("out")
    with pytest.raises(RecordProcessingError, match=rf"in node 'shout': TypeError: map must return a \(key, value\) tuple, got {shown}"):
        run(app, [("k", "hi", 1)], "out")


def test_a_flat_map_item_that_is_no_key_value_pair_fails_naming_the_node() -> None:
    app = App("bad-flat-map")
    app.topic("in", value=serdes.Text()).flat_map(lambda key, value: [(key, value), value], name="twice").to("out")
    with pytest.raises(RecordProcessingError, match=r"in node 'twice': TypeError: flat_map must return \(key, value\) tuples, got str 'hi'"):
        run(app, [("k", "hi", 1)], "out")
