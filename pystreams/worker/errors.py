"""What happens when a record cannot be deserialized or processed.

The policies and their rules (Kafka Streams' handlers: ``fail``, ``log-and-continue``,
``dead-letter``; the failure's description; the dead letter's headers) are written once in
``pystreams.topology.kernels``, which the Spark runtime uses too; they are re-exported here.
Every error names topic, partition, offset and the reason.
"""

from __future__ import annotations

from pystreams.topology.ir import ErrorPolicies, ErrorPolicy
from pystreams.topology.kernels import (
    DEAD_LETTER_HEADER_PREFIX,
    ErrorKind,
    RecordFailure,
    RecordProcessingError,
    dead_letter_headers,
    failure_policy,
    skip_hint,
)

__all__ = [
    "DEAD_LETTER_HEADER_PREFIX",
    "ErrorKind",
    "ErrorPolicies",
    "ErrorPolicy",
    "MissingDeadLetterTopic",
    "ProduceError",
    "RecordFailure",
    "RecordProcessingError",
    "dead_letter_headers",
    "failure_policy",
    "skip_hint",
]


class ProduceError(RuntimeError):
    """A record could not be written (sink, repartition topic, changelog or dead letters)."""


class MissingDeadLetterTopic(RuntimeError):
    """The dead-letter topic does not exist (workers do not create it, as Kafka Streams
    does not: its partitions and retention are the operator's choice)."""

    def __init__(self, topic: str) -> None:
        super().__init__(f"dead-letter topic {topic!r} does not exist")
        self.topic = topic
