"""Window specifications for windowed aggregations and joins, and the window key type.

All times are epoch milliseconds (ints), on *event time*: the timestamp a source's extractor
assigns to each record. A window accepts records until stream time passes its end plus the
grace period; later records are dropped as late. Users may pass ``datetime.timedelta`` or an
int of milliseconds anywhere a duration is expected.

The specs are plain frozen values: both runtimes read them, and their fields go into the
topology hash, so they hold no callables.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

Duration = int | timedelta


def to_millis(duration: Duration, what: str, *, allow_zero: bool = True) -> int:
    """A duration as whole milliseconds; ``what`` names it in the error message."""
    if isinstance(duration, bool):
        raise TypeError(f"{what} must be a timedelta or milliseconds, not a bool")
    if isinstance(duration, timedelta):
        millis = duration // timedelta(milliseconds=1)
    elif isinstance(duration, int):
        millis = duration
    else:
        raise TypeError(f"{what} must be a timedelta or int milliseconds, not {type(duration).__name__}")
    if millis < 0 or (millis == 0 and not allow_zero):
        raise ValueError(f"{what} must be {'>= 0' if allow_zero else '> 0'} ms, got {millis}")
    return millis


@dataclass(frozen=True, slots=True)
class TimeWindow:
    """One concrete window: ``start_ms`` inclusive, ``end_ms`` exclusive."""

    start_ms: int
    end_ms: int


@dataclass(frozen=True, slots=True)
class Windowed:
    """The key of a windowed aggregation's output: the grouping key and its window.

    Session windows use the same type; their ``end_ms`` is the timestamp of the session's
    last record (inclusive), as in Kafka Streams.
    """

    key: Any
    start_ms: int
    end_ms: int


@dataclass(frozen=True, slots=True, init=False)
class TumblingWindow:
    """Fixed-size, non-overlapping windows aligned to the epoch: ``[k*size, (k+1)*size)``."""

    size_ms: int
    grace_ms: int

    def __init__(self, size: Duration, grace: Duration = 0) -> None:
        object.__setattr__(self, "size_ms", to_millis(size, "tumbling window size", allow_zero=False))
        object.__setattr__(self, "grace_ms", to_millis(grace, "grace period"))

    @property
    def advance_ms(self) -> int:
        return self.size_ms

    @property
    def retention_ms(self) -> int:
        """How long a window store must keep a window: until it closes."""
        return self.size_ms + self.grace_ms

    def windows_for(self, timestamp_ms: int) -> tuple[TimeWindow, ...]:
        start = timestamp_ms - timestamp_ms % self.size_ms
        return (TimeWindow(start, start + self.size_ms),)


@dataclass(frozen=True, slots=True, init=False)
class HoppingWindow:
    """Fixed-size windows that start every ``advance``; a record falls in ``size/advance`` of them."""

    size_ms: int
    advance_ms: int
    grace_ms: int

    def __init__(self, size: Duration, advance: Duration, grace: Duration = 0) -> None:
        size_ms = to_millis(size, "hopping window size", allow_zero=False)
        advance_ms = to_millis(advance, "hopping window advance", allow_zero=False)
        if advance_ms > size_ms:
            # Records between windows would silently belong to none.
            raise ValueError(f"hopping window advance ({advance_ms} ms) must not exceed its size ({size_ms} ms)")
        object.__setattr__(self, "size_ms", size_ms)
        object.__setattr__(self, "advance_ms", advance_ms)
        object.__setattr__(self, "grace_ms", to_millis(grace, "grace period"))

    @property
    def retention_ms(self) -> int:
        return self.size_ms + self.grace_ms

    def windows_for(self, timestamp_ms: int) -> tuple[TimeWindow, ...]:
        """Every window containing the timestamp, oldest first (none start before epoch 0).

        Window starts are multiples of the advance (Kafka Streams' grid), also when the size
        is not a multiple of it: the first is the lowest multiple above ``timestamp - size``."""
        advance = self.advance_ms
        last_start = timestamp_ms - timestamp_ms % advance
        earliest = max(0, timestamp_ms - self.size_ms + 1)
        first_start = -(-earliest // advance) * advance
        return tuple(TimeWindow(start, start + self.size_ms) for start in range(first_start, last_start + 1, self.advance_ms))


@dataclass(frozen=True, slots=True, init=False)
class SessionWindow:
    """Per-key sessions: records closer than ``gap`` in event time share a session.

    Sessions merge when a record bridges two of them, which is why aggregations over
    session windows need a merger.
    """

    gap_ms: int
    grace_ms: int

    def __init__(self, gap: Duration, grace: Duration = 0) -> None:
        object.__setattr__(self, "gap_ms", to_millis(gap, "session inactivity gap", allow_zero=False))
        object.__setattr__(self, "grace_ms", to_millis(grace, "grace period"))

    @property
    def retention_ms(self) -> int:
        """How long the session store keeps a session behind stream time: every session a
        record that is not late may still merge with. Such a record is at most ``grace + gap``
        behind stream time and reaches one more ``gap`` back, so sessions ending at
        ``stream time - grace - 2*gap`` must still be there (``+ 1``: the store's horizon is
        exclusive). Kafka Streams' RocksDB store keeps them too (its segments expire coarsely);
        an exact ``gap + grace`` would expire a session a record still bridges to."""
        return 2 * self.gap_ms + self.grace_ms + 1


@dataclass(frozen=True, slots=True, init=False)
class JoinWindow:
    """Stream–stream join window: a left record at ``t`` joins right records in
    ``[t - before, t + after]``. ``within=`` sets both sides at once."""

    before_ms: int
    after_ms: int
    grace_ms: int

    def __init__(
        self,
        within: Duration | None = None,
        *,
        before: Duration | None = None,
        after: Duration | None = None,
        grace: Duration = 0,
    ) -> None:
        if within is not None and (before is not None or after is not None):
            raise ValueError("give a join window either within= or before=/after=, not both")
        if within is not None:
            before_ms, after_ms = to_millis(within, "join window before"), to_millis(within, "join window after")
        elif before is not None and after is not None:
            before_ms, after_ms = to_millis(before, "join window before"), to_millis(after, "join window after")
        else:
            raise ValueError("a join window needs within= or both before= and after=")
        object.__setattr__(self, "before_ms", before_ms)
        object.__setattr__(self, "after_ms", after_ms)
        object.__setattr__(self, "grace_ms", to_millis(grace, "grace period"))

    @property
    def retention_ms(self) -> int:
        """Each side's store must keep records this long to meet all partners."""
        return self.before_ms + self.after_ms + self.grace_ms


#: Windows an aggregation can use.
AggregationWindow = TumblingWindow | HoppingWindow | SessionWindow
#: Any window spec the IR may carry.
Window = TumblingWindow | HoppingWindow | SessionWindow | JoinWindow


def window_fields(window: Window) -> dict[str, Any]:
    """A window spec as plain data (kind plus millisecond fields), for hashing and display."""
    fields: dict[str, Any] = {"kind": type(window).__name__}
    for name in type(window).__slots__:
        fields[name] = getattr(window, name)
    return fields


def describe_window(window: Window) -> str:
    """A short human label, e.g. ``tumbling size=60000ms grace=10000ms``."""
    label = type(window).__name__.removesuffix("Window").lower()
    parts = " ".join(f"{name.removesuffix('_ms')}={getattr(window, name)}ms" for name in type(window).__slots__)
    return f"{label} {parts}"
