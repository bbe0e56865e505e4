"""The per-kind rules both runtimes share (``pystreams.topology.kernels``), on plain values."""

from __future__ import annotations

from typing import Any

import pytest
from pystreams.topology.ir import JoinHow, JoinSide, Punctuation, PunctuationType, TaskId
from pystreams.topology.kernels import (
    Aggregator,
    NodeProcessorContext,
    ScheduledPunctuation,
    TaskPosition,
    branch_kernel,
    close_time,
    emits_unmatched,
    initial_factory,
    join_lookup_bounds,
    join_pair,
    joined_timestamp,
    merge_into_session,
    next_punctuation_due,
    open_windows,
    session_lookup_bounds,
)
from pystreams.topology.windows import HoppingWindow, JoinWindow, TimeWindow, TumblingWindow

# -- a fresh initial value per key -----------------------------------------------------------------


def test_a_mutable_initial_value_is_copied_for_every_new_key() -> None:
    template = {"items": [], "seen": set()}
    new_initial = initial_factory(template)
    first, second = new_initial(), new_initial()
    first["items"].append("a")
    first["seen"].add("a")
    assert second == {"items": [], "seen": set()}  # nothing of the first key leaks
    assert template == {"items": [], "seen": set()}  # and the declared value stays as declared
    assert first is not template and first["items"] is not template["items"]


def test_a_callable_initial_is_an_initializer_called_per_key() -> None:
    calls = []

    def initializer() -> list[str]:
        calls.append(1)
        return []

    new_initial = initial_factory(initializer)
    assert new_initial() == [] and new_initial() is not new_initial()
    assert len(calls) == 3


def test_immutable_initial_values_are_shared_as_they_are() -> None:
    for value in (0, 1.5, "", b"", True, None):
        assert initial_factory(value)() is value


def test_an_aggregators_first_record_starts_from_a_fresh_initial_and_a_reduce_from_the_value() -> None:
    def append(items: list[Any], key: str, value: Any) -> list[Any]:
        items.append((key, value))
        return items

    aggregate = Aggregator(append, initial_factory([]))
    assert aggregate.first("a", 1) == [("a", 1)]
    assert aggregate.first("b", 2) == [("b", 2)]  # the worker once handed b a's list
    assert Aggregator(append, None).first("a", 7) == 7


# -- windows and grace ------------------------------------------------------------------------------


def test_a_window_closes_once_stream_time_passes_its_end_plus_grace() -> None:
    window = TumblingWindow(size=60_000, grace=10_000)
    # Stream time 130 s: windows ending at or before 120 s are closed.
    closes = close_time(130_000, window.grace_ms)
    assert open_windows(window, 119_999, closes) == ([], [TimeWindow(60_000, 120_000)])
    assert open_windows(window, 120_000, closes) == ([TimeWindow(120_000, 180_000)], [])
    assert open_windows(window, 119_999, closes - 1) == ([TimeWindow(60_000, 120_000)], [])


def test_hopping_windows_of_one_record_can_be_partly_closed() -> None:
    window = HoppingWindow(size=30, advance=10, grace=5)
    still_open, closed = open_windows(window, 25, close_time(45, window.grace_ms))
    assert closed == [TimeWindow(0, 30), TimeWindow(10, 40)]
    assert still_open == [TimeWindow(20, 50)]


def test_session_lookup_covers_the_gap_on_both_sides() -> None:
    assert session_lookup_bounds(100, 10) == (90, 110)


def test_a_record_bridging_two_sessions_merges_them_in_end_order_then_aggregates() -> None:
    merged = merge_into_session(
        [(0, 10, "a"), (20, 30, "b")],
        "k",
        "c",
        15,
        close_time=0,
        aggregate=lambda total, key, value: total + value,
        merge=lambda key, left, right: left + right,
        new_initial=lambda: "",
    )
    assert merged == (0, 30, "abc")
    # A reduce starts from the oldest session instead of an initial value.
    reduced = merge_into_session(
        [(0, 10, "a")],
        "k",
        "c",
        12,
        close_time=0,
        aggregate=lambda total, key, value: total + value,
        merge=lambda key, left, right: left + right,
        new_initial=None,
    )
    assert reduced == (0, 12, "ac")
    assert merge_into_session([], "k", "c", 5, close_time=0, aggregate=None, merge=None, new_initial=None) == (5, 5, "c")


def test_a_late_session_is_dropped_and_an_initial_of_none_is_still_aggregated() -> None:
    def count(total: Any, key: Any, value: Any) -> int:
        return (total or 0) + 1

    assert (
        merge_into_session(
            [(0, 10, 1)], "k", "x", 12, close_time=13, aggregate=count, merge=lambda key, left, right: (left or 0) + right, new_initial=lambda: None
        )
        is None
    )
    # An initializer may return None: the record is aggregated into it, not taken as is.
    assert merge_into_session([], "k", "x", 5, close_time=0, aggregate=count, merge=None, new_initial=lambda: None) == (5, 5, 1)


# -- joins ------------------------------------------------------------------------------------------


def test_join_window_bounds_mirror_for_the_right_side() -> None:
    window = JoinWindow(before=5, after=20)
    assert join_lookup_bounds(window, JoinSide.LEFT, 100) == (95, 120)
    assert join_lookup_bounds(window, JoinSide.RIGHT, 100) == (80, 105)


@pytest.mark.parametrize(
    ("how", "side", "emitted"),
    [
        (JoinHow.INNER, JoinSide.LEFT, False),
        (JoinHow.INNER, JoinSide.RIGHT, False),
        (JoinHow.LEFT, JoinSide.LEFT, True),
        (JoinHow.LEFT, JoinSide.RIGHT, False),
        (JoinHow.OUTER, JoinSide.LEFT, True),
        (JoinHow.OUTER, JoinSide.RIGHT, True),
    ],
)
def test_which_unmatched_records_a_join_emits(how: JoinHow, side: JoinSide, emitted: bool) -> None:
    assert emits_unmatched(how, side) is emitted


def test_a_join_result_has_the_later_timestamp_and_left_value_first() -> None:
    assert joined_timestamp(10, 30) == 30 and joined_timestamp(30, 10) == 30
    assert join_pair(JoinSide.LEFT, "mine", "theirs") == ("mine", "theirs")
    assert join_pair(JoinSide.RIGHT, "mine", "theirs") == ("theirs", "mine")


# -- stateless steps ------------------------------------------------------------------------------


def test_a_branch_routes_by_label_drops_on_none_and_names_the_branches_on_a_bad_label() -> None:
    seen: list[tuple[str, Any]] = []

    def route(label: str) -> Any:
        return lambda key, value, timestamp: seen.append((label, value))

    routes = {label: route(label) for label in ("big", "small")}
    branch = branch_kernel(lambda key, value: None if value == 0 else "big" if value > 9 else "small", routes)
    for value in (12, 3, 0):
        branch("k", value, 1)
    assert seen == [("big", 12), ("small", 3)]
    with pytest.raises(ValueError, match=r"returned 'huge', not one of \['big', 'small'\]"):
        branch_kernel(lambda key, value: "huge", routes)("k", 1, 1)


# -- punctuations and the processor context -------------------------------------------------------


def test_punctuations_keep_kafka_streams_schedule_skipping_missed_intervals() -> None:
    # PunctuationSchedule.next: the schedule's grid is kept (a stream-time schedule starts at 0,
    # so it is aligned to the epoch); a late punctuation skips the intervals it missed.
    assert next_punctuation_due(None, 1000, 100) == 1100
    assert next_punctuation_due(None, 1050, 100) == 1100  # not 1150: the grid is 0, 100, 200, ...
    assert next_punctuation_due(1100, 1100, 100) == 1200
    assert next_punctuation_due(1100, 1550, 100) == 1600  # 1200..1500 missed, skipped: not 1650
    assert next_punctuation_due(6_000, 9_500, 1_000) == 10_000  # a wall-clock grid from its start


def test_a_punctuation_sees_no_current_record_and_its_own_time() -> None:
    position = TaskPosition("app", TaskId(0, 3))
    position.topic, position.partition, position.offset = "events", 3, 41
    context = NodeProcessorContext(position, {}, ())
    context.timestamp = 5
    seen = []

    def method(now: int) -> None:
        seen.append((now, context.timestamp, context.topic, context.partition, context.offset, context.task_id))

    wall = ScheduledPunctuation(Punctuation("tick", 100, PunctuationType.WALL_CLOCK_TIME), method, context, "node")
    assert not wall.wall_clock_due(1000)  # the first check only schedules
    assert wall.next_due == 1100 and not wall.wall_clock_due(1099) and wall.wall_clock_due(1100)
    wall.fire(1100)
    assert seen == [(1100, 1100, None, None, None, TaskId(0, 3))]
    assert (position.topic, position.partition, position.offset) == ("events", 3, 41)
    stream = ScheduledPunctuation(Punctuation("tick", 100, PunctuationType.STREAM_TIME), method, context, "node")
    assert stream.due(0)  # a stream-time punctuation fires at the first opportunity


def test_a_processor_may_only_use_the_stores_it_declared() -> None:
    context = NodeProcessorContext(TaskPosition("app", TaskId(0, 0)), {"mine": "store", "other": "x"}, ("mine",))
    assert context.store("mine") == "store"
    with pytest.raises(KeyError, match="store 'other' is not declared by this processor"):
        context.store("other")
    forwarded = []
    context.emit = lambda key, value, timestamp: forwarded.append((key, value, timestamp))
    context.timestamp = 7
    context.forward("k", "v")
    context.forward("k", "w", timestamp=9)
    assert forwarded == [("k", "v", 7), ("k", "w", 9)]
