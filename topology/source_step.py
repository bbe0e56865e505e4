"""One source record entering a task, written once for every runtime.

The step a task runs per input record: deserialize key and value, take the record's event
time (``source_timestamp``: an extractor's answer, a negative one skips the record), advance
the task's stream time, emit into the node graph, hand a failure to the runtime's error
policy, then run the stream-time punctuations that came due. The worker's tasks (and through
them the test driver) and Spark's task operator build it with ``source_step``; what differs
between them — how a failure is reported or dead-lettered, what firing a punctuation also
does — comes in as callbacks. No I/O here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .kernels import Emit, ErrorKind, NodeFailure, ScheduledPunctuation, TaskPosition, advance_stream_time, source_timestamp

#: Runs one record: ``step(raw_key, raw_value, raw_timestamp, record)``; ``record`` is the
#: runtime's own handle on it, passed back to ``SourceFailed`` untouched.
SourceStep = Callable[[Any, Any, int, Any], None]
#: The runtime's error policy for a record: ``(kind, node, error, record, raw_key, raw_value,
#: raw_timestamp)``; it may raise (the ``fail`` policy), which stops the step.
SourceFailed = Callable[[ErrorKind, str | None, BaseException, Any, Any, Any, int], None]


def source_step(
    node: str | None,
    deserialize_key: Callable[[Any], Any],
    deserialize_value: Callable[[Any], Any],
    timestamp_extractor: Callable[[Any, Any, int], int] | None,
    emit: Emit,
    position: TaskPosition,
    *,
    failed: SourceFailed,
    stream_punctuations: Sequence[ScheduledPunctuation],
    fire: Callable[[ScheduledPunctuation, int], None],
) -> SourceStep:
    """The step of source ``node`` of the task at ``position``. A record that cannot be
    deserialized (or whose extractor raises) is a ``DESERIALIZATION`` failure and moves no
    stream time; a record the graph fails on is a ``PROCESSING`` failure and still counts for
    stream time and punctuations, as in Kafka Streams."""

    def step(raw_key: Any, raw_value: Any, raw_timestamp: int, record: Any) -> None:
        try:
            key = deserialize_key(raw_key)
            value = deserialize_value(raw_value)
            timestamp = source_timestamp(timestamp_extractor, key, value, raw_timestamp, node=node, position=position)
        except Exception as error:
            failed(ErrorKind.DESERIALIZATION, node, error, record, raw_key, raw_value, raw_timestamp)
            return
        if timestamp is None:
            return
        position.stream_time = advance_stream_time(position.stream_time, timestamp)
        position.timestamp = timestamp
        try:
            emit(key, value, timestamp)
        except NodeFailure as failure:
            failed(ErrorKind.PROCESSING, failure.node, failure.error, record, raw_key, raw_value, raw_timestamp)
        if stream_punctuations:
            now = position.stream_time
            for scheduled in stream_punctuations:
                if scheduled.due(now):
                    fire(scheduled, now)

    return step
