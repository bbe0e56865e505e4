"""The low-level Processor API: the contract between a PROCESSOR node and the runtime.

A processor is a class. The runtime creates one instance per task, calls ``init(context)``
once, ``process(key, value)`` per record and ``close()`` when the task goes away. Methods
marked with ``@punctuate`` are called with a timestamp as stream time or the wall clock passes
each interval; they are declared on the class, so the topology (and its hash) knows them
without running anything.

    class Dedupe(Processor):
        def init(self, context):
            super().init(context)
            self.seen = context.store("seen-ids")

        def process(self, key, value):
            if self.seen.get(key) is None:
                self.seen.put(key, self.context.timestamp)
                self.context.forward(key, value)

        @punctuate(every=timedelta(minutes=1), on=PunctuationType.STREAM_TIME)
        def expire(self, timestamp_ms):
            ...
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from .ir import Punctuation, PunctuationType, TaskId
from .windows import Duration, to_millis

_PUNCTUATION_ATTRIBUTE = "__pystreams_punctuation__"

F = TypeVar("F", bound=Callable[..., Any])


class ProcessorContext(Protocol):
    """What the runtime gives a processor. Record fields describe the record being processed."""

    @property
    def app_id(self) -> str: ...

    @property
    def task_id(self) -> TaskId: ...

    @property
    def topic(self) -> str | None: ...

    @property
    def partition(self) -> int | None: ...

    @property
    def offset(self) -> int | None: ...

    @property
    def timestamp(self) -> int:
        """The current record's timestamp (ms); inside a punctuation, the punctuation time."""
        ...

    @property
    def headers(self) -> tuple[tuple[str, bytes], ...]:
        """The current record's headers, (name, bytes) pairs; assign a new sequence to change
        what this processor's forwards carry (none inside a punctuation)."""
        ...

    @headers.setter
    def headers(self, headers: Any) -> None: ...

    def store(self, name: str) -> Any:
        """The task's instance of a store this processor declared (or was granted)."""
        ...

    def forward(self, key: Any, value: Any, *, timestamp: int | None = None, to: str | None = None, headers: Any = None) -> None:
        """Send a record to the node's children, or only to the child named ``to`` (Kafka
        Streams' ``To.child``); the timestamp defaults to the current one, the headers to the
        current record's (``headers=`` replaces them for this forward)."""
        ...


class Processor:
    """Base class for low-level processors. Override ``process``; the rest is optional."""

    context: ProcessorContext

    def init(self, context: ProcessorContext) -> None:
        self.context = context

    def process(self, key: Any, value: Any) -> None:
        raise NotImplementedError(f"{type(self).__name__} must implement process(key, value)")

    def close(self) -> None:
        pass


def punctuate(every: Duration, on: PunctuationType | str = PunctuationType.STREAM_TIME) -> Callable[[F], F]:
    """Mark a processor method ``method(self, timestamp_ms)`` to run every ``every``, on Kafka
    Streams' schedule (``StreamTask.schedule`` and ``PunctuationSchedule``):

    * ``STREAM_TIME``: the schedule starts at 0, so it is aligned to the epoch: the method runs
      at the task's first record, then each time the task's stream time (its highest record
      timestamp) reaches the next multiple of ``every``; it is checked after every record, and
      ``timestamp_ms`` is the stream time then (which may be past the multiple). No records,
      no punctuations.
    * ``WALL_CLOCK_TIME``: the schedule starts one interval after the task starts, and the
      method runs as the wall clock passes each point of that grid (``timestamp_ms``: the
      wall clock then).

    Either way, points missed during a gap (no records, a slow poll) are skipped, not replayed:
    the method runs once and the schedule continues on the same grid. Both runtimes keep this
    schedule; Spark's ``--once`` backfill runs no wall-clock punctuations."""
    interval_ms = to_millis(every, "punctuation interval", allow_zero=False)
    punctuation_type = PunctuationType(on)

    def mark(method: F) -> F:
        setattr(method, _PUNCTUATION_ATTRIBUTE, (interval_ms, punctuation_type))
        return method

    return mark


def punctuations_of(processor_class: type) -> tuple[Punctuation, ...]:
    """The ``@punctuate`` methods of a processor class (inherited ones too), by method name."""
    found = []
    for name, member in inspect.getmembers(processor_class, inspect.isfunction):
        mark = getattr(member, _PUNCTUATION_ATTRIBUTE, None)
        if mark is not None:
            interval_ms, punctuation_type = mark
            found.append(Punctuation(method=name, interval_ms=interval_ms, type=punctuation_type))
    return tuple(sorted(found, key=lambda p: p.method))
