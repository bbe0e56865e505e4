"""The poll batch shrinks when records are expensive and grows back when they are cheap."""

from __future__ import annotations

import pytest

from pystreams.worker.batch_size import AdaptiveBatchSize


def test_cheap_records_keep_the_maximum() -> None:
    sizer = AdaptiveBatchSize(maximum=10_000, target_ms=100)
    assert sizer.limit == 10_000  # nothing measured yet
    sizer.observe(10_000, 50.0)  # 5 µs per record
    assert sizer.limit == 10_000


def test_expensive_records_shrink_the_batch_to_the_target_duration() -> None:
    sizer = AdaptiveBatchSize(maximum=10_000, target_ms=100)
    sizer.observe(500, 500.0)  # 1 ms per record
    assert sizer.limit == 100
    sizer.observe(100, 10_000.0)  # 100 ms per record: never below the minimum
    assert sizer.limit == AdaptiveBatchSize(maximum=10_000).minimum


def test_the_batch_grows_back_when_records_get_cheap_again() -> None:
    sizer = AdaptiveBatchSize(maximum=10_000, target_ms=100)
    sizer.observe(100, 100.0)
    assert sizer.limit == 100
    limits = []
    for _ in range(30):
        sizer.observe(sizer.limit, sizer.limit * 0.005)  # 5 µs per record
        limits.append(sizer.limit)
    assert limits == sorted(limits) and limits[-1] == 10_000


def test_empty_polls_change_nothing() -> None:
    sizer = AdaptiveBatchSize(maximum=1_000, target_ms=100)
    sizer.observe(10, 100.0)
    before = sizer.limit
    sizer.observe(0, 5_000.0)
    assert sizer.limit == before


@pytest.mark.parametrize("kwargs", [{"maximum": 5, "minimum": 10}, {"maximum": 0, "minimum": 0}, {"maximum": 10, "target_ms": 0}])
def test_bad_settings_are_refused(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        AdaptiveBatchSize(**kwargs)
