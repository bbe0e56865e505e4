"""Bad records on Spark: the app's error policies, applied where Spark's Python workers run the
kernels, with the worker's rules (``pystreams.topology.kernels.failure_policy``).

``fail`` raises ``RecordProcessingError`` naming topic, partition, offset and node, which fails
the query (``pystreams spark`` prints that line); ``log-and-continue`` logs and skips the
record; ``dead-letter`` also writes it to the dead-letter topic with the worker's headers, from
a producer this Python worker opens on first use and flushes before its operator returns.

A dead letter holds the bytes the failing step read: a source record's own bytes for a
failure while deserializing or in a stateless step, the row a stateful step was given
(serialized by the step before it) for a failure inside it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pystreams.topology.ir import ErrorPolicies, ErrorPolicy
from pystreams.topology.kernels import ErrorKind, RecordFailure, dead_letter_headers, failure_policy

#: One dead-letter producer per Python worker process and cluster, opened on first use.
_PRODUCERS: dict[str, Any] = {}


@dataclass(frozen=True)
class RecordErrors:
    """What Spark's operators do with a record that fails: the policies, where dead letters go,
    and the source topics by index (rows name their topic by its index)."""

    policies: ErrorPolicies = field(default_factory=ErrorPolicies)
    bootstrap_servers: str = ""
    topics: tuple[str, ...] = ()
    #: The source node reading each of ``topics``.
    source_nodes: tuple[str, ...] = ()

    def failed(
        self,
        kind: ErrorKind,
        error: BaseException,
        *,
        task: str,
        node: str | None,
        topic: str | None = None,
        partition: int | None = None,
        offset: int | None = None,
        key: bytes | None = None,
        value: bytes | None = None,
    ) -> None:
        """Apply the policy to one failed record (raises under ``fail``)."""
        failure = RecordFailure(kind, task, topic, partition, offset, node, f"{type(error).__name__}: {error}")
        policy = failure_policy(self.policies, failure, error)
        if policy is ErrorPolicy.DEAD_LETTER and topic is not None:
            assert self.policies.dead_letter_topic is not None
            self._producer().send(self.policies.dead_letter_topic, key=key, value=value, headers=dead_letter_headers(failure))

    def flush(self) -> None:
        """Every dead letter of this operator call is written before Spark takes its output."""
        producer = _PRODUCERS.get(self.bootstrap_servers)
        if producer is not None:
            producer.flush()

    def _producer(self) -> Any:
        producer = _PRODUCERS.get(self.bootstrap_servers)
        if producer is None:
            from kafka import KafkaProducer

            producer = _PRODUCERS[self.bootstrap_servers] = KafkaProducer(
                bootstrap_servers=self.bootstrap_servers,
                client_id="pystreams-spark-dead-letters",
                acks="all",
            )
        return producer
