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


def to_millis(duration: Duration, what: str, *, allow_zero: bool = True, check_range: bool = True) -> int:
    """A duration as whole milliseconds; ``what`` names it in the error message.
    ``check_range=False`` only converts: window specs leave the range to ``window_problems``,
    checked where the window is declared on a node, so the error can name the node."""
    if isinstance(duration, bool):
        raise TypeError(f"{what} must be a timedelta or milliseconds, not a bool")
    if isinstance(duration, timedelta):
        millis = duration // timedelta(milliseconds=1)
    elif isinstance(duration, int):
        millis = duration
    else:
        raise TypeError(f"{what} must be a timedelta or int milliseconds, not {type(duration).__name__}")
    if check_range and (millis < 0 or (millis == 0 and not allow_zero)):
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
    last record (inclusive), as in Kafka Streams; a sliding window's ``end_ms`` is inclusive
    too (``start + difference``).
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
        object.__setattr__(self, "size_ms", to_millis(size, "tumbling window size", check_range=False))
        object.__setattr__(self, "grace_ms", to_millis(grace, "grace period", check_range=False))

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
        object.__setattr__(self, "size_ms", to_millis(size, "hopping window size", check_range=False))
        object.__setattr__(self, "advance_ms", to_millis(advance, "hopping window advance", check_range=False))
        object.__setattr__(self, "grace_ms", to_millis(grace, "grace period", check_range=False))

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
        object.__setattr__(self, "gap_ms", to_millis(gap, "session inactivity gap", check_range=False))
        object.__setattr__(self, "grace_ms", to_millis(grace, "grace period", check_range=False))

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
class SlidingWindow:
    """Kafka Streams' ``SlidingWindows`` (KIP-450): windows of a fixed length that follow the
    records rather than the clock. Both ends are inclusive: ``[start, start + difference]``.

    For each record at ``t`` there is its *left* window ``[t - difference, t]`` (ending at the
    record) and, when a later record of the key lies within ``difference``, its *right*
    window ``[t + 1, t + 1 + difference]`` (starting just after it); the record also counts
    in every existing window covering ``t``. So every distinct set of records that fit within
    ``difference`` of each other is one window, and no window is empty. A record at ``t <
    difference`` would open a window starting before 0: it goes into ``[0, difference]``
    instead (Kafka Streams does the same). Windows close as the others do: once ``end +
    grace`` is at or before stream time.
    """

    difference_ms: int
    grace_ms: int

    def __init__(self, difference: Duration, grace: Duration = 0) -> None:
        object.__setattr__(self, "difference_ms", to_millis(difference, "sliding window time difference", check_range=False))
        object.__setattr__(self, "grace_ms", to_millis(grace, "grace period", check_range=False))

    @property
    def size_ms(self) -> int:
        """A window's end minus its start (its end is inclusive)."""
        return self.difference_ms

    @property
    def retention_ms(self) -> int:
        """How long the store keeps a window behind its newest one: every window a record that
        is not late may still read. Such a record is at most ``grace + difference`` behind
        stream time and reads windows starting up to ``2 * difference`` before it (the
        window holding its predecessor); the newest window may start just after stream time
        (``+ 2``: that start, and the store's exclusive horizon)."""
        return 3 * self.difference_ms + self.grace_ms + 2


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
            before_ms = after_ms = to_millis(within, "join window within", check_range=False)
        elif before is not None and after is not None:
            before_ms = to_millis(before, "join window before", check_range=False)
            after_ms = to_millis(after, "join window after", check_range=False)
        else:
            raise ValueError("a join window needs within= or both before= and after=")
        object.__setattr__(self, "before_ms", before_ms)
        object.__setattr__(self, "after_ms", after_ms)
        object.__setattr__(self, "grace_ms", to_millis(grace, "grace period", check_range=False))

    @property
    def retention_ms(self) -> int:
        """Each side's store must keep records this long to meet all partners."""
        return self.before_ms + self.after_ms + self.grace_ms


#: Windows an aggregation can use.
AggregationWindow = TumblingWindow | HoppingWindow | SlidingWindow | SessionWindow
#: Any window spec the IR may carry.
Window = TumblingWindow | HoppingWindow | SlidingWindow | SessionWindow | JoinWindow


def window_problems(window: Window) -> list[str]:
    """What makes a window spec unusable (empty when it is fine). The constructors only
    convert durations; a declaration checks the range here, so that its error names the node
    (Kafka Streams refuses these when the windows are built)."""
    problems: list[str] = []

    def positive(value: int, what: str) -> None:
        if value <= 0:
            problems.append(f"{what} must be > 0 ms, got {value}")

    def not_negative(value: int, what: str) -> None:
        if value < 0:
            problems.append(f"{what} must be >= 0 ms, got {value}")

    match window:
        case TumblingWindow():
            positive(window.size_ms, "tumbling window size")
        case HoppingWindow():
            positive(window.size_ms, "hopping window size")
            positive(window.advance_ms, "hopping window advance")
            if 0 < window.size_ms < window.advance_ms:
                # Records between windows would silently belong to none.
                problems.append(f"hopping window advance ({window.advance_ms} ms) must not exceed its size ({window.size_ms} ms)")
        case SlidingWindow():
            positive(window.difference_ms, "sliding window time difference")
        case SessionWindow():
            positive(window.gap_ms, "session inactivity gap")
        case JoinWindow():
            not_negative(window.before_ms, "join window before")
            not_negative(window.after_ms, "join window after")
    not_negative(window.grace_ms, "grace period")
    return problems


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
