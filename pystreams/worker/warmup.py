"""When a Streams member asks for a new assignment because of its warm-up replicas (sans-IO).

KIP-848's Streams reasons: a member whose warm-up replica has caught up to within
``acceptable.recovery.lag`` says WarmUpReady (with fresh lags, so the assignor can promote it);
one whose warm-up keeps falling behind says WarmUpFailed (the assignor may place it elsewhere).
Reasons are rate-limited: after one is sent the assignor answers with a new assignment, and
asking again before ``min_interval_ms`` would only make the group rebalance in a loop.

A *standby* that catches up says WarmUpReady too, once per standby assignment: the assignor
gives no warm-up where a standby already restores the state and moves an active there once that
standby is caught up (Kafka Streams' probing rebalance), so without it a worker that joined
after another took every task would keep only standbys for good. A standby already caught up
when it was assigned again says nothing: the assignor saw its lag then.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from pystreams.assignors.streams import MemberReason
from pystreams.topology.ir import TaskId


@dataclass
class _Progress:
    best_lag: int
    stalled_checks: int = 0
    failed: bool = False


@dataclass
class WarmUpTracker:
    acceptable_recovery_lag: int
    #: Lag checks in a row without a new best lag before a warm-up counts as failing.
    patience_checks: int = 30
    min_interval_ms: int = 5_000
    _warmups: frozenset[TaskId] = frozenset()
    _progress: dict[TaskId, _Progress] = field(default_factory=dict)
    _last_reason_ms: int | None = None
    #: Standbys not caught up yet (each says WarmUpReady once when it is).
    _standbys_catching_up: set[TaskId] = field(default_factory=set)
    _standbys: frozenset[TaskId] = frozenset()

    def __post_init__(self) -> None:
        if self.acceptable_recovery_lag < 0:
            raise ValueError("acceptable_recovery_lag must not be negative")
        if self.patience_checks < 1:
            raise ValueError("patience_checks must be at least 1")

    @property
    def warmups(self) -> frozenset[TaskId]:
        return self._warmups

    def assigned(self, warmups: Iterable[TaskId], standbys: Iterable[TaskId] = ()) -> None:
        """A new assignment: these are the member's warm-up and standby replicas now."""
        self._warmups = frozenset(warmups)
        self._progress = {t: p for t, p in self._progress.items() if t in self._warmups}
        standby_set = frozenset(standbys) - self._warmups
        # New standbys are watched until they catch up; kept ones keep their state of watch.
        self._standbys_catching_up = {t for t in self._standbys_catching_up if t in standby_set} | (standby_set - self._standbys)
        self._standbys = standby_set

    @property
    def watching(self) -> bool:
        """Whether any replica may still send a reason (warm-ups, or standbys catching up)."""
        return bool(self._warmups or self._standbys_catching_up)

    def observe(self, lags: Mapping[TaskId, int], now_ms: int) -> MemberReason:
        """Feed the warm-ups' current lags; returns the reason to send (NONE: nothing)."""
        ready = False
        failing: list[_Progress] = []
        caught_up = {t for t in self._standbys_catching_up if (lag := lags.get(t)) is not None and lag <= self.acceptable_recovery_lag}
        for task in sorted(self._warmups):
            lag = lags.get(task)
            if lag is None:
                continue
            if lag <= self.acceptable_recovery_lag:
                ready = True
            progress = self._progress.get(task)
            if progress is None or lag < progress.best_lag:
                self._progress[task] = _Progress(best_lag=lag)
                continue
            progress.stalled_checks += 1
            if lag > self.acceptable_recovery_lag and progress.stalled_checks >= self.patience_checks and not progress.failed:
                failing.append(progress)
        if not (ready or failing or caught_up):
            return MemberReason.NONE
        if self._last_reason_ms is not None and now_ms - self._last_reason_ms < self.min_interval_ms:
            return MemberReason.NONE
        self._last_reason_ms = now_ms
        if ready or caught_up:
            self._standbys_catching_up -= caught_up
            return MemberReason.WARM_UP_READY
        for progress in failing:
            progress.failed = True  # said once per warm-up assignment
        return MemberReason.WARM_UP_FAILED
