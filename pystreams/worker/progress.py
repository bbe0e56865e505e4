"""Progress of long work a worker does — restores, standby and warm-up catch-up — kept for
metrics and written to the log, so an operator sees a slow restore move instead of a silent pod.

Everything here is fed on the engine thread (restore progress as batches are applied; lags once
per lag check) and read from the metrics collector on another thread: each read is of one
attribute or of a dict that is replaced, never mutated, after it was published.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from pystreams.state import RestoreProgress, RestoreProgressLogger
from pystreams.topology.ir import TaskId

log = logging.getLogger(__name__)

#: A replica still catching up is logged at most this often.
REPLICA_LOG_INTERVAL_S = 10.0


@dataclass(frozen=True)
class LagSnapshot:
    """Lags as of one lag check: active tasks' input lag, replicas' changelog lag."""

    active: Mapping[TaskId, int] = field(default_factory=dict)
    replicas: Mapping[TaskId, int] = field(default_factory=dict)
    warmups: frozenset[TaskId] = frozenset()


class RestoreTracker:
    """The ``on_restore_progress`` listener of an engine: counts restored records, knows what
    each store still has to read, and logs the restore (start, every 100,000 records, end)."""

    def __init__(self, logger: Callable[[RestoreProgress], None] | None = None) -> None:
        self.records_restored = 0
        self._log = logger or RestoreProgressLogger()
        self._applied: dict[tuple[str, str], int] = {}
        self._remaining: dict[tuple[str, str], int] = {}

    def __call__(self, progress: RestoreProgress) -> None:
        ident = (progress.task_id, progress.store_name)
        # ``restored_records`` counts from this restore's start: add what is new since last time.
        self.records_restored += progress.restored_records - self._applied.get(ident, 0)
        remaining = dict(self._remaining)
        if progress.done:
            self._applied.pop(ident, None)
            remaining.pop(ident, None)
        else:
            self._applied[ident] = progress.restored_records
            remaining[ident] = progress.lag
        self._remaining = remaining
        self._log(progress)

    def remaining(self) -> Mapping[tuple[str, str], int]:
        """(task, store) -> records still to restore, for the stores restoring now."""
        return self._remaining


class ReplicaProgressLog:
    """Logs standby and warm-up replicas catching up: the first lag seen, then at most every
    REPLICA_LOG_INTERVAL_S while a replica's lag changes, and once when it reaches zero."""

    def __init__(self, name: str, clock: Callable[[], float] = time.monotonic) -> None:
        self._name = name
        self._clock = clock
        self._last: dict[TaskId, tuple[float, int]] = {}  # task -> (logged at, lag then)

    def observe(self, lags: Mapping[TaskId, int], warmups: frozenset[TaskId], applied_total: int) -> None:
        now = self._clock()
        for task in [t for t in self._last if t not in lags]:
            del self._last[task]
        for task, lag in sorted(lags.items()):
            kind = "warm-up" if task in warmups else "standby"
            previous = self._last.get(task)
            if previous is None:
                if lag > 0:
                    log.info("%s: %s %s catching up: %d records behind its changelogs", self._name, kind, task, lag)
                self._last[task] = (now, lag)
                continue
            logged_at, logged_lag = previous
            if lag == 0 and logged_lag > 0:
                log.info("%s: %s %s caught up with its changelogs", self._name, kind, task)
                self._last[task] = (now, 0)
            elif lag != logged_lag and lag > 0 and now - logged_at >= REPLICA_LOG_INTERVAL_S:
                rate = max(0, logged_lag - lag) / (now - logged_at)
                log.info(
                    "%s: %s %s catching up: %d records behind (was %d; %.0f records/s; %d applied to replicas so far)",
                    self._name,
                    kind,
                    task,
                    lag,
                    logged_lag,
                    rate,
                    applied_total,
                )
                self._last[task] = (now, lag)
