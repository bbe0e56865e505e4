"""Per-kind semantics of joins: stream–table (inner, left) and windowed stream–stream (inner,
left, outer), on the worker's kernels through the test driver."""

from __future__ import annotations

from typing import Any

import pytest

from pystreams import serdes
from pystreams.app import App, JoinWindow
from pystreams.testing import TopologyTestDriver

M = 60_000


def stream_table_app(how: str) -> App:
    app = App(f"stream-table-{how}")
    orders = app.topic("orders", value=serdes.Text())
    customers = app.table("customers", value=serdes.Text())
    orders.join(customers, lambda key, order, name: f"{order} for {name}", how=how, value=serdes.Text(), name="enriched").to("out")
    return app


@pytest.mark.parametrize(
    ("how", "expected"),
    [
        ("inner", [("c1", "o1 for Ada", 10), ("c1", "o3 for Eve", 30)]),
        (
            "left",
            [
                ("c1", "o1 for Ada", 10),
                ("c2", "o2 for None", 20),
                ("c1", "o3 for Eve", 30),
                ("c1", "o4 for None", 50),
            ],
        ),
    ],
)
def test_a_stream_table_join_looks_up_the_latest_table_value(how: str, expected: list[Any]) -> None:
    with TopologyTestDriver(stream_table_app(how)) as driver:
        orders, customers = driver.input_topic("orders"), driver.input_topic("customers")
        customers.pipe_input("c1", "Ada", timestamp=0)
        orders.pipe_input("c1", "o1", timestamp=10)
        orders.pipe_input("c2", "o2", timestamp=20)  # no such customer
        customers.pipe_input("c1", "Eve", timestamp=25)  # an update triggers nothing by itself
        orders.pipe_input("c1", "o3", timestamp=30)
        orders.pipe_input(None, "o-null", timestamp=35)  # a null key joins nothing
        customers.pipe_input("c1", None, timestamp=40)  # deleted
        orders.pipe_input("c1", "o4", timestamp=50)
        records = driver.output_topic("out").read_records()
    assert [(r.key, r.value, r.timestamp) for r in records] == expected


def stream_stream_app(how: str, window: JoinWindow) -> App:
    app = App(f"stream-stream-{how}")
    left = app.topic("left", value=serdes.Text())
    right = app.topic("right", value=serdes.Text())
    left.join(right, lambda key, lv, rv: f"{lv}+{rv}", window=window, how=how, value=serdes.Text(), name="joined").to("out")
    return app


def joined(how: str, window: JoinWindow, records: list[tuple[str, str, int]]) -> list[tuple[str, int]]:
    with TopologyTestDriver(stream_stream_app(how, window)) as driver:
        topics = {"left": driver.input_topic("left"), "right": driver.input_topic("right")}
        for topic, value, timestamp in records:
            topics[topic].pipe_input("k", value, timestamp=timestamp)
        return [(r.value, r.timestamp) for r in driver.output_topic("out").read_records()]


def test_an_inner_stream_stream_join_pairs_records_within_the_window_and_takes_the_later_time() -> None:
    window = JoinWindow(before=0, after=15 * M)  # a right record up to 15 minutes after the left
    assert joined(
        "inner",
        window,
        [
            ("left", "L1", 100 * M),
            ("right", "early", 99 * M),  # before L1: outside
            ("right", "R1", 110 * M),
            ("right", "R2", 115 * M),  # exactly at the edge: inside
            ("right", "R3", 116 * M),  # outside
            ("left", "L2", 101 * M),  # meets R1, R2 and R3 (within 15 minutes of 101), oldest first
        ],
    ) == [("L1+R1", 110 * M), ("L1+R2", 115 * M), ("L2+R1", 110 * M), ("L2+R2", 115 * M), ("L2+R3", 116 * M)]


def test_a_left_join_emits_an_unmatched_left_record_at_once_and_the_match_later() -> None:
    window = JoinWindow(within=5 * M)
    assert joined(
        "left",
        window,
        [
            ("left", "L1", 10 * M),
            ("right", "R1", 12 * M),
            ("right", "R-alone", 30 * M),  # the right side of a left join only emits when matched
        ],
    ) == [("L1+None", 10 * M), ("L1+R1", 12 * M)]


def test_an_outer_join_emits_unmatched_records_of_both_sides() -> None:
    window = JoinWindow(within=5 * M, grace=30 * M)  # grace: the stores still hold R1 when L2 comes
    assert joined("outer", window, [("right", "R1", 10 * M), ("left", "L1", 30 * M), ("left", "L2", 12 * M)]) == [
        ("None+R1", 10 * M),
        ("L1+None", 30 * M),
        ("L2+R1", 12 * M),
    ]


def test_a_record_older_than_the_join_stores_retention_is_dropped() -> None:
    window = JoinWindow(within=5 * M, grace=0)  # stores keep before + after + grace = 10 minutes
    assert joined(
        "left",
        window,
        [
            ("left", "L1", 100 * M),
            ("right", "R1", 100 * M),
            ("left", "old", 80 * M),  # 20 minutes behind this side's newest record: too late, dropped
        ],
    ) == [("L1+None", 100 * M), ("L1+R1", 100 * M)]
