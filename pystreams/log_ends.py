"""Where a partition's log really starts and ends, whatever the broker's ListOffsets says.

The embedded broker answers ListOffsets LATEST with the last *batch's* base offset + 1 rather
than the high watermark, and may answer EARLIEST with -1 for a log without records (see
docs/broker-quirks.md). Both runtimes need the true values: the worker to know when a changelog
restore is complete, the Spark source to know where a batch ends. One rule, here.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any


def true_end_offsets(consumer: Any, partitions: Sequence[Any], *, timeout_s: float) -> dict[Any, int]:
    """The next offset to be written per partition (``consumer``: a kafka-python consumer it may
    assign and seek), found by fetching the last batch: the high watermark of the fetch response
    (a poll may hand over only part of a large batch, so its last record is not enough). On
    Apache Kafka the fetch returns nothing new and the reported end stands. Raises TimeoutError
    when a partition's last batch cannot be fetched within ``timeout_s``."""
    reported = consumer.end_offsets(list(partitions))
    beginnings = first_offsets(consumer, partitions)
    ends = dict(reported)
    probe = [p for p in partitions if reported[p] > beginnings[p]]
    if not probe:
        return ends
    consumer.assign(probe)
    for p in probe:
        consumer.seek(p, reported[p] - 1)
    waiting = set(probe)
    deadline = time.monotonic() + timeout_s
    while waiting:
        if time.monotonic() >= deadline:
            raise TimeoutError(f"could not fetch the last batch of {', '.join(f'{p.topic}-{p.partition}' for p in sorted(waiting))}")
        for p, records in consumer.poll(timeout_ms=200).items():
            if records:
                ends[p] = max(ends[p], records[-1].offset + 1, consumer.highwater(p) or 0)
                waiting.discard(p)
        # A partition whose last records were deleted or compacted away returns nothing: its
        # position still moves past the gap.
        for p in list(waiting):
            if consumer.position(p) >= reported[p]:
                ends[p] = max(ends[p], consumer.position(p))
                waiting.discard(p)
    return ends


def first_offsets(consumer: Any, partitions: Sequence[Any]) -> dict[Any, int]:
    """``beginning_offsets``, except that a partition the broker names no first offset for is
    empty and starts at 0: the embedded broker may answer -1 for a log with no records yet,
    which kafka-python leaves out of its answer (a KeyError). Apache Kafka always names one."""
    try:
        return dict(consumer.beginning_offsets(list(partitions)))
    except KeyError:
        found = {}
        for partition in partitions:
            try:
                found.update(consumer.beginning_offsets([partition]))
            except KeyError:
                found[partition] = 0
        return found
