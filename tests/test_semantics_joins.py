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
                (None, "o-null for None", 35),
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
        orders.pipe_input(None, "o-null", timestamp=35)  # a null key: skipped by an inner join, joined with None by a left one (KIP-962)
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


def test_a_left_join_holds_an_unmatched_left_record_until_its_window_closes_and_a_match_cancels_it() -> None:
    """Kafka Streams >= 3.1: no early ``L+None``; a record met by a partner in time is only
    ever joined, one that is not is emitted once, when its window (plus grace) has closed."""
    window = JoinWindow(within=5 * M)
    assert joined(
        "left",
        window,
        [
            ("left", "L1", 10 * M),
            ("right", "R1", 12 * M),  # meets L1: only L1+R1, ever
            ("left", "L2", 20 * M),
            ("right", "R-alone", 30 * M),  # the right side of a left join never emits alone
            ("left", "L3", 40 * M),  # stream time 40 > 20 + 5: L2's window has closed
        ],
    ) == [("L1+R1", 12 * M), ("L2+None", 20 * M)]


def test_an_outer_join_emits_unmatched_records_of_both_sides_once_their_windows_close() -> None:
    window = JoinWindow(within=5 * M, grace=30 * M)  # grace: the stores still hold R1 when L2 comes
    assert joined(
        "outer",
        window,
        [("right", "R1", 10 * M), ("left", "L1", 30 * M), ("left", "L2", 12 * M), ("left", "L3", 70 * M), ("right", "R9", 200 * M)],
    ) == [
        ("L2+R1", 12 * M),  # R1 met L2 within the grace: never emitted alone
        ("L1+None", 30 * M),  # closed at 70 > 30 + 5 + 30
        ("L3+None", 70 * M),  # closed at 200
    ]


def test_a_record_too_old_for_its_store_still_joins_and_an_unmatched_one_is_emitted_at_once() -> None:
    """Kafka Streams: the store does not keep a record older than its retention, but the join
    still pairs it with what the other side holds; unmatched, its window has closed already,
    so a left join emits it with None at once."""
    window = JoinWindow(within=5 * M, grace=0)  # stores keep before + after + grace = 10 minutes
    assert joined(
        "left",
        window,
        [
            ("left", "L1", 100 * M),
            ("right", "R1", 100 * M),
            ("left", "old", 80 * M),  # 20 minutes behind stream time: not kept, met by nothing
        ],
    ) == [("L1+R1", 100 * M), ("old+None", 80 * M)]


def _shown(value: Any) -> str:
    return "null" if value is None else str(value)


def _steps(how: str, window: JoinWindow, inputs: list[tuple[str, Any, str | None, int]]) -> list[list[tuple[Any, str, int]]]:
    app = App(f"stream-stream-steps-{how}")
    left = app.topic("left", key=serdes.Json(), value=serdes.Text())
    right = app.topic("right", key=serdes.Json(), value=serdes.Text())
    left.join(right, lambda key, lv, rv: f"{_shown(lv)}-{_shown(rv)}", window=window, how=how, value=serdes.Text(), name="joined").to("out")
    outputs = []
    with TopologyTestDriver(app) as driver:
        topics = {"L": driver.input_topic("left"), "R": driver.input_topic("right")}
        out = driver.output_topic("out")
        for side, key, value, timestamp in inputs:
            topics[side].pipe_input(key, value, timestamp=timestamp)
            outputs.append([(r.key, r.value, r.timestamp) for r in out.read_records()])
    return outputs


#: StreamStreamJoinIntegrationTest's inputWithoutOutOfOrderData (key 0; the last two keyless).
INTEGRATION_INPUT = [
    ("L", 0, None, 1), ("R", 0, None, 2), ("L", 0, "A", 3), ("R", 0, "a", 4), ("L", 0, "B", 5), ("R", 0, "b", 6),
    ("L", 0, None, 7), ("R", 0, None, 8), ("L", 0, "C", 9), ("R", 0, "c", 10), ("R", 0, None, 11), ("L", 0, None, 12),
    ("R", 0, None, 13), ("R", 0, "d", 14), ("L", 0, "D", 15), ("L", None, "E", 16), ("R", None, "e", 17),
]  # fmt: skip
_INNER_STEPS = [
    [], [], [], [(0, "A-a", 4)], [(0, "B-a", 5)], [(0, "A-b", 6), (0, "B-b", 6)], [], [],
    [(0, "C-a", 9), (0, "C-b", 9)], [(0, "A-c", 10), (0, "B-c", 10), (0, "C-c", 10)], [], [], [],
    [(0, "A-d", 14), (0, "B-d", 14), (0, "C-d", 14)], [(0, "D-a", 15), (0, "D-b", 15), (0, "D-c", 15), (0, "D-d", 15)],
]  # fmt: skip


@pytest.mark.parametrize(
    ("how", "keyless"),
    [("inner", [[], []]), ("left", [[(None, "E-null", 16)], []]), ("outer", [[(None, "E-null", 16)], [(None, "null-e", 17)]])],
)
def test_every_step_of_kafkas_stream_stream_join_integration_test(how: str, keyless: list[list[Any]]) -> None:
    """Window 10 s, grace 24 h: nothing closes, so left and outer joins emit only what inner
    does, and a keyless record of an emitting side is joined with None at once."""
    window = JoinWindow(within=10_000, grace=24 * 3_600_000)
    assert _steps(how, window, INTEGRATION_INPUT) == [*_INNER_STEPS, *keyless]


#: The DSL guide's "Semantics of stream-stream joins" (window 15 s, grace 5 s; times in s),
#: then its rows 40 to 100, where unmatched records come out as their windows close.
GUIDE_INPUT = [(side, 0, value, ts * 1000) for side, value, ts in [
    ("L", None, 1), ("R", None, 2), ("L", "A", 3), ("R", "a", 4), ("L", "B", 5), ("R", "b", 6), ("L", None, 7),
    ("R", None, 8), ("L", "C", 9), ("R", "c", 10), ("R", None, 11), ("L", None, 12), ("R", None, 13), ("R", "d", 14),
    ("L", "D", 15), ("L", "E", 40), ("L", "F", 60), ("R", "f", 80), ("L", "G", 100),
]]  # fmt: skip
_GUIDE_INNER = [
    [], [], [], ["A-a"], ["B-a"], ["A-b", "B-b"], [], [], ["C-a", "C-b"], ["A-c", "B-c", "C-c"], [], [], [],
    ["A-d", "B-d", "C-d"], ["D-a", "D-b", "D-c", "D-d"], [], [], [], [],
]  # fmt: skip


@pytest.mark.parametrize("how", ["inner", "left", "outer"])
def test_every_row_of_the_guides_stream_stream_join_table(how: str) -> None:
    """The guide's table closes a window one tick before Kafka Streams' KStreamKStreamJoin
    does (its rule keeps a left record at t open while stream time <= t + after + grace,
    and so does ours): with 1 ms less grace, that rule gives exactly the guide's rows; with
    the stated 5 s, each unmatched record comes out one row later."""
    late = {"inner": {}, "left": {16: ["E-null"], 17: ["F-null"]}, "outer": {16: ["E-null"], 17: ["F-null"], 18: ["null-f"]}}[how]
    guide = [[*row, *late.get(index, [])] for index, row in enumerate(_GUIDE_INNER)]
    exact = [[value for _, value, _ in step] for step in _steps(how, JoinWindow(within=15_000, grace=4_999), GUIDE_INPUT)]
    assert exact == guide
    stated = [[value for _, value, _ in step] for step in _steps(how, JoinWindow(within=15_000, grace=5_000), GUIDE_INPUT)]
    one_row_later = guide if how == "inner" else [*guide[:16], [], *guide[16:18]]
    assert stated == one_row_later


def test_expired_unmatched_records_come_out_in_time_order_before_the_record_that_closed_them() -> None:
    """KStreamKStreamLeftJoinTest's left-processor case: window 100 ms, no grace."""
    inputs = [("L", 0, "A0", 1), ("L", 1, "A1", 2), ("L", 0, "A0-0", 3), ("R", 1, "a1", 3), ("L", 2, "dummy", 401), ("R", 2, "dummy", 401)]
    assert _steps("left", JoinWindow(within=100, grace=0), inputs) == [
        [],
        [],
        [],
        [(1, "A1-a1", 3)],
        [(0, "A0-null", 1), (0, "A0-0-null", 3)],
        [(2, "dummy-dummy", 401)],
    ]


def test_a_joiner_failing_on_a_held_record_is_reported_once_and_the_others_still_come_out() -> None:
    """Under log-and-continue, a closed window's record whose joiner raises is skipped (one
    failure) and gone; the records held beside it, and the record that closed them, go on."""

    def joined_text(key: str, left: str | None, right: str | None) -> str:
        if left == "bad" and right is None:
            raise ValueError("no partner for bad")
        return f"{left}|{right}"

    app = App("held-failure")
    left = app.topic("left", value=serdes.Text())
    right = app.topic("right", value=serdes.Text())
    left.join(right, joined_text, window=JoinWindow(within=10), how="left", value=serdes.Text()).to("out")
    with TopologyTestDriver(app, processing_errors="log-and-continue") as driver:
        for key, value, timestamp in (("a", "ok1", 0), ("b", "bad", 1), ("c", "ok2", 2)):
            driver.input_topic("left").pipe_input(key, value, timestamp=timestamp)
        driver.input_topic("left").pipe_input("d", "later", timestamp=100)  # closes a, b and c
        driver.input_topic("right").pipe_input("d", "partner", timestamp=101)
        driver.input_topic("left").pipe_input("e", "again", timestamp=102)
        assert driver.output_topic("out").read_key_values() == [("a", "ok1|None"), ("c", "ok2|None"), ("d", "later|partner")]
        assert len(driver.failures) == 1
