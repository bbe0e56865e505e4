"""What happens when a record cannot be deserialized or processed.

Kafka Streams' handlers, by name: ``fail`` stops the engine (the caller must not commit; the
task restarts from its last commit), ``log-and-continue`` logs and skips the record, and
``dead-letter`` writes the record's original bytes to a topic, with headers saying where it
came from and why, then skips it. Every error names topic, partition, offset and the reason.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass


class ErrorPolicy(enum.StrEnum):
    FAIL = "fail"
    LOG_AND_CONTINUE = "log-and-continue"
    DEAD_LETTER = "dead-letter"


class ErrorKind(enum.StrEnum):
    DESERIALIZATION = "deserialization"
    PROCESSING = "processing"


@dataclass(frozen=True, slots=True)
class RecordFailure:
    """One failed record: where it was read from and why it failed."""

    kind: ErrorKind
    task_id: str
    topic: str | None
    partition: int | None
    offset: int | None
    node: str | None
    reason: str

    def describe(self) -> str:
        where = (
            f"{self.topic}-{self.partition}@{self.offset}"
            if self.topic is not None
            else "a record forwarded from a store flush"
        )
        node = f" in node {self.node!r}" if self.node else ""
        return f"task {self.task_id}: {self.kind} error on {where}{node}: {self.reason}"


class RecordProcessingError(RuntimeError):
    """Raised under the ``fail`` policy; carries the failure."""

    def __init__(self, failure: RecordFailure) -> None:
        super().__init__(failure.describe())
        self.failure = failure


class ProduceError(RuntimeError):
    """A record could not be written (sink, repartition topic, changelog or dead letters)."""


def skip_hint(kind: ErrorKind) -> str:
    """How to have records that fail this way skipped rather than stop the worker."""
    option = "deserialization" if kind is ErrorKind.DESERIALIZATION else "processing"
    return (f"to skip such records: --{option}-errors log-and-continue, or dead-letter with --dead-letter-topic; "
            f"App({option}_errors=...) in code")
