"""How many records one poll hands the engine thread.

Everything else on that thread (commits, revocations in a rebalance, replica updates, queries)
waits while a poll's records are processed. kafka-python's ``max_poll_records`` is fixed, so a
batch of expensive records could hold the thread for many seconds (10,000 records of 1 ms
each: 10 s past the commit interval, and a revocation that long). This sizes each poll's
``max_records`` from the measured cost per record so a batch takes about ``target_ms``;
records not returned stay buffered in the consumer, so nothing is fetched twice.
Kafka Streams does the same with its adaptive number of process iterations per loop.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class AdaptiveBatchSize:
    maximum: int
    target_ms: float = 100.0
    minimum: int = 10
    #: Weight of the newest measurement in the moving average of the cost per record.
    smoothing: float = 0.3
    _ms_per_record: float | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.minimum <= self.maximum:
            raise ValueError(f"need 1 <= minimum ({self.minimum}) <= maximum ({self.maximum})")
        if self.target_ms <= 0:
            raise ValueError(f"target_ms must be positive, got {self.target_ms}")

    @property
    def limit(self) -> int:
        """``max_records`` for the next poll."""
        if not self._ms_per_record:
            return self.maximum
        return max(self.minimum, min(self.maximum, int(self.target_ms / self._ms_per_record)))

    def observe(self, records: int, elapsed_ms: float) -> None:
        """A poll's ``records`` took ``elapsed_ms`` to process (batches of 0 teach nothing)."""
        if records <= 0:
            return
        cost = max(elapsed_ms, 0.0) / records
        previous = self._ms_per_record
        self._ms_per_record = cost if previous is None else previous + self.smoothing * (cost - previous)
