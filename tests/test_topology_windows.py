"""Window assignment: the windows a timestamp falls in."""

from __future__ import annotations

from datetime import timedelta

from hypothesis import given
from hypothesis import strategies as st
from pystreams.topology.windows import HoppingWindow, TimeWindow, TumblingWindow, to_millis


def test_durations_accept_timedelta_and_millis():
    assert to_millis(timedelta(minutes=1, milliseconds=5), "x") == 60_005
    assert to_millis(250, "x") == 250


def test_tumbling_window_examples():
    window = TumblingWindow(size=timedelta(minutes=1))
    assert window.windows_for(0) == (TimeWindow(0, 60_000),)
    assert window.windows_for(59_999) == (TimeWindow(0, 60_000),)
    assert window.windows_for(60_000) == (TimeWindow(60_000, 120_000),)


def test_hopping_window_examples():
    window = HoppingWindow(size=10, advance=5)
    assert window.windows_for(12) == (TimeWindow(5, 15), TimeWindow(10, 20))
    assert window.windows_for(3) == (TimeWindow(0, 10),)  # no window starts before epoch 0


def test_hopping_windows_start_on_the_advance_grid_when_the_size_is_not_a_multiple():
    # Kafka Streams' TimeWindows: window starts are multiples of the advance, whatever the size.
    window = HoppingWindow(size=10, advance=3)
    assert window.windows_for(10) == (TimeWindow(3, 13), TimeWindow(6, 16), TimeWindow(9, 19))
    assert window.windows_for(2) == (TimeWindow(0, 10),)
    assert window.windows_for(12) == (TimeWindow(3, 13), TimeWindow(6, 16), TimeWindow(9, 19), TimeWindow(12, 22))


@given(st.integers(min_value=1, max_value=10_000), st.integers(min_value=0, max_value=10**12))
def test_tumbling_windows_cover_each_timestamp_once(size, timestamp):
    (window,) = TumblingWindow(size).windows_for(timestamp)
    assert window.start_ms <= timestamp < window.end_ms
    assert window.start_ms % size == 0 and window.end_ms - window.start_ms == size


@given(
    st.integers(min_value=1, max_value=1000),
    st.integers(min_value=1, max_value=20),
    st.integers(min_value=0, max_value=999),
    st.integers(min_value=0, max_value=10**9),
)
def test_hopping_windows_are_exactly_those_containing_the_timestamp(advance, hops, extra, timestamp):
    # Sizes that are not a multiple of the advance too (extra < advance).
    window = HoppingWindow(size=advance * hops + extra % advance, advance=advance)
    windows = window.windows_for(timestamp)
    assert all(w.start_ms <= timestamp < w.end_ms and w.start_ms % advance == 0 for w in windows)
    expected = [s for s in range(max(0, timestamp - window.size_ms + 1), timestamp + 1) if s % advance == 0]
    assert [w.start_ms for w in windows] == expected
