"""The warm-up reasons a Streams member sends (sans-IO)."""

from __future__ import annotations

import pytest
from pystreams.assignors.streams import MemberReason
from pystreams.topology.ir import TaskId

from pystreams.worker.warmup import WarmUpTracker

A, B = TaskId(1, 0), TaskId(1, 1)


def test_ready_once_within_the_acceptable_lag_then_rate_limited() -> None:
    tracker = WarmUpTracker(acceptable_recovery_lag=100, min_interval_ms=1_000)
    tracker.assigned([A])
    assert tracker.observe({A: 5_000}, now_ms=0) is MemberReason.NONE
    assert tracker.observe({A: 101}, now_ms=100) is MemberReason.NONE
    assert tracker.observe({A: 100}, now_ms=200) is MemberReason.WARM_UP_READY
    assert tracker.observe({A: 50}, now_ms=900) is MemberReason.NONE  # asked 700 ms ago
    assert tracker.observe({A: 50}, now_ms=1_200) is MemberReason.WARM_UP_READY


def test_lags_of_tasks_that_are_not_warm_ups_are_ignored() -> None:
    tracker = WarmUpTracker(acceptable_recovery_lag=100)
    tracker.assigned([A])
    assert tracker.observe({B: 0}, now_ms=0) is MemberReason.NONE
    tracker.assigned([])
    assert tracker.observe({A: 0}, now_ms=10_000) is MemberReason.NONE


def test_a_warm_up_that_stops_catching_up_fails_once() -> None:
    tracker = WarmUpTracker(acceptable_recovery_lag=100, patience_checks=3, min_interval_ms=0)
    tracker.assigned([A])
    lags = [10_000, 9_000, 9_000, 9_500, 9_200]  # a new best, then three checks without one
    reasons = [tracker.observe({A: lag}, now_ms=i) for i, lag in enumerate(lags)]
    assert reasons == [MemberReason.NONE] * 4 + [MemberReason.WARM_UP_FAILED]
    assert tracker.observe({A: 9_900}, now_ms=10) is MemberReason.NONE  # said already
    tracker.assigned([A])  # a new assignment keeps the history of a warm-up that stays
    assert tracker.observe({A: 50}, now_ms=11) is MemberReason.WARM_UP_READY


def test_a_failure_found_while_rate_limited_is_sent_later() -> None:
    tracker = WarmUpTracker(acceptable_recovery_lag=100, patience_checks=1, min_interval_ms=1_000)
    tracker.assigned([A, B])
    assert tracker.observe({A: 50, B: 5_000}, now_ms=0) is MemberReason.WARM_UP_READY
    assert tracker.observe({B: 5_000}, now_ms=10) is MemberReason.NONE  # rate-limited
    tracker.assigned([B])
    assert tracker.observe({B: 5_000}, now_ms=1_500) is MemberReason.WARM_UP_FAILED


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="acceptable_recovery_lag"):
        WarmUpTracker(acceptable_recovery_lag=-1)
    with pytest.raises(ValueError, match="patience_checks"):
        WarmUpTracker(acceptable_recovery_lag=0, patience_checks=0)


def test_a_standby_that_catches_up_says_ready_once_per_standby_assignment() -> None:
    # The assignor moves an active to a process whose standby restores it once that standby is
    # caught up; nothing else would tell it (no warm-up where a standby restores).
    tracker = WarmUpTracker(acceptable_recovery_lag=100, min_interval_ms=0)
    tracker.assigned([], standbys=[A, B])
    assert tracker.watching
    assert tracker.observe({A: 5_000, B: 5_000}, now_ms=0) is MemberReason.NONE
    assert tracker.observe({A: 50, B: 5_000}, now_ms=1) is MemberReason.WARM_UP_READY
    assert tracker.observe({A: 0, B: 5_000}, now_ms=2) is MemberReason.NONE  # A said it already
    tracker.assigned([], standbys=[A, B])  # the same standbys again: A stays said
    assert tracker.observe({A: 0, B: 5_000}, now_ms=3) is MemberReason.NONE
    assert tracker.observe({A: 0, B: 10}, now_ms=4) is MemberReason.WARM_UP_READY
    assert not tracker.watching  # both caught up: no more rebalances from them
    assert tracker.observe({A: 0, B: 0}, now_ms=5) is MemberReason.NONE
