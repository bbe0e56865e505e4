"""Topic metadata from the Kafka cluster, and creation of the topics pystreams owns.

The coordinator needs names, partition counts and *topic ids* (the KIP-848 protocol keys
partitions by topic id, so a re-created topic is a different topic). Workers and the
coordinator's record log need topics created idempotently (changelogs, repartition topics,
``__pystreams_groups``).

Everything here blocks on the network (kafka-python's admin client); asyncio callers run it in
a thread executor. One :class:`ClusterMetadata` serialises its calls, so it can be shared by
threads.

Topic ids: a broker that supports KIP-516 returns a topic id in Metadata v10+. Apache Kafka
does; the embedded broker (Tansu 0.6) does too: a random, time-ordered (version 7) UUID per
topic, and a new one when a topic is deleted and created again. Should a broker report no id
(null or all zeros), :func:`fallback_topic_id` derives one from the name (see its caveat).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self

from pystreams.assignors.api import TopicMetadata

__all__ = [
    "ClusterMetadata",
    "NIL_TOPIC_ID",
    "TopicMismatchError",
    "TopicSpec",
    "fallback_topic_id",
]

log = logging.getLogger(__name__)

#: What Kafka sends for "no topic id" (Uuid.ZERO_UUID).
NIL_TOPIC_ID = uuid.UUID(int=0)

#: Namespace of :func:`fallback_topic_id`; fixed forever so every process derives the same ids.
FALLBACK_TOPIC_ID_NAMESPACE = uuid.UUID("4c0ad2b5-2a4e-5b6c-9a53-7079737472c1")

# Kafka error codes handled by name below.
_TOPIC_ALREADY_EXISTS = 36
_UNKNOWN_TOPIC_OR_PARTITION = 3


def fallback_topic_id(topic_name: str) -> uuid.UUID:
    """A stable id for a topic whose broker reports none: ``uuid5(namespace, name)``.

    FALLBACK ONLY. The id depends on the name alone, so a topic deleted and created again
    under the same name keeps its id and the coordinator cannot notice the re-creation
    (members keep partitions of the old incarnation; offsets are not reset). Only used when
    the broker returns a null or all-zero topic id.
    """
    return uuid.uuid5(FALLBACK_TOPIC_ID_NAMESPACE, topic_name)


class TopicMismatchError(RuntimeError):
    """A topic exists but does not match the spec pystreams needs (e.g. partition count)."""


@dataclass(frozen=True)
class TopicSpec:
    """A topic pystreams wants to exist.

    ``replication_factor=-1`` lets the broker use its default (Kafka >= 2.4).
    ``configs`` are topic configs by Kafka name, e.g. ``{"cleanup.policy": "compact"}``.
    """

    name: str
    num_partitions: int
    replication_factor: int = -1
    configs: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.num_partitions < 1:
            raise ValueError(f"topic {self.name!r}: num_partitions must be >= 1")


def _parse_topic_id(raw: Any) -> uuid.UUID | None:
    """The topic id of a metadata entry, or None when the broker sent none."""
    if raw is None:
        return None
    topic_id = raw if isinstance(raw, uuid.UUID) else uuid.UUID(str(raw))
    return None if topic_id == NIL_TOPIC_ID else topic_id


class ClusterMetadata:
    """Reads topic metadata from, and creates topics in, one Kafka cluster.

    The admin connection opens on first use; :meth:`close` (or ``with``) releases it.
    ``admin_config`` is passed to :class:`kafka.admin.KafkaAdminClient` (security settings…).
    """

    def __init__(
        self,
        bootstrap_servers: str | Sequence[str],
        *,
        client_id: str = "pystreams-cluster",
        request_timeout_ms: int = 30_000,
        **admin_config: Any,
    ) -> None:
        self._admin_config: dict[str, Any] = {
            "bootstrap_servers": bootstrap_servers,
            "client_id": client_id,
            "request_timeout_ms": request_timeout_ms,
            **admin_config,
        }
        self._admin: Any = None
        self._lock = threading.RLock()
        self._warned_fallback: set[str] = set()

    # -- connection ---------------------------------------------------------------------------

    def _client(self) -> Any:
        if self._admin is None:
            from kafka.admin import KafkaAdminClient

            self._admin = KafkaAdminClient(**self._admin_config)
        return self._admin

    def close(self) -> None:
        with self._lock:
            if self._admin is not None:
                self._admin.close()
                self._admin = None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    # -- reading ------------------------------------------------------------------------------

    def cluster_id(self) -> str | None:
        """The cluster's id (DescribeCluster), which tells one cluster from another."""
        with self._lock:
            return self._client().describe_cluster().get("cluster_id")

    def fetch_topics(self, names: Iterable[str] | None = None, *, include_internal: bool = False) -> dict[str, TopicMetadata]:
        """Topics by name: all of them (``names=None``) or those of ``names`` that exist.

        Topics the broker reports with an error (unknown, being deleted...) are left out.
        Internal topics (``__consumer_offsets``, ``__transaction_state``) only with
        ``include_internal``.
        """
        requested = None if names is None else sorted(set(names))
        if requested == []:
            return {}
        with self._lock:
            entries = self._client().describe_topics(requested)
        topics: dict[str, TopicMetadata] = {}
        for entry in entries:
            name = entry["name"]
            if entry["error_code"] != 0:
                if entry["error_code"] != _UNKNOWN_TOPIC_OR_PARTITION:
                    log.debug("topic %r skipped: metadata error %s", name, entry["error_code"])
                continue
            if entry.get("is_internal") and not include_internal:
                continue
            topics[name] = TopicMetadata(
                topic_id=self._topic_id_of(name, entry.get("topic_id")),
                name=name,
                num_partitions=len(entry["partitions"]),
            )
        return topics

    def _topic_id_of(self, name: str, raw_topic_id: Any) -> uuid.UUID:
        topic_id = _parse_topic_id(raw_topic_id)
        if topic_id is not None:
            return topic_id
        if name not in self._warned_fallback:
            self._warned_fallback.add(name)
            log.warning(
                "the broker reports no topic id for %r; using a name-derived fallback id, so re-creating this topic will not be detected",
                name,
            )
        return fallback_topic_id(name)

    # -- writing ------------------------------------------------------------------------------

    def ensure_topics(self, specs: Iterable[TopicSpec], *, timeout_ms: int = 10_000) -> dict[str, TopicMetadata]:
        """Create the topics of ``specs`` that do not exist; return metadata for all of them.

        Idempotent, and safe when several processes race to create the same topic. An existing
        topic must have the spec's partition count (:class:`TopicMismatchError` otherwise);
        its configs are not compared, since brokers differ in what DescribeConfigs reports.
        """
        from kafka.errors import KafkaTimeoutError

        wanted = {spec.name: spec for spec in specs}
        if not wanted:
            return {}
        deadline = time.monotonic() + timeout_ms / 1000
        with self._lock:
            while True:
                topics = self.fetch_topics(wanted)
                missing = [name for name in wanted if name not in topics]
                if not missing:
                    break
                self._create_topics([wanted[name] for name in missing], timeout_ms)
                # Apache Kafka answers TOPIC_ALREADY_EXISTS for a topic still being deleted,
                # so a topic we "created" may not appear: wait a little, then try again.
                remaining_ms = int((deadline - time.monotonic()) * 1000)
                try:
                    self._client().wait_for_topics(missing, timeout_ms=max(min(remaining_ms, 2000), 1))
                except KafkaTimeoutError:
                    if time.monotonic() >= deadline:
                        raise KafkaTimeoutError(f"topics not ready within {timeout_ms} ms: {sorted(missing)}") from None
        for name, spec in wanted.items():
            if topics[name].num_partitions != spec.num_partitions:
                raise TopicMismatchError(f"topic {name!r} exists with {topics[name].num_partitions} partitions, expected {spec.num_partitions}")
        return topics

    def _create_topics(self, specs: Sequence[TopicSpec], timeout_ms: int) -> None:
        from kafka.errors import for_code

        response = self._client().create_topics(
            {
                spec.name: {
                    "num_partitions": spec.num_partitions,
                    "replication_factor": spec.replication_factor,
                    "configs": dict(spec.configs),
                }
                for spec in specs
            },
            timeout_ms=timeout_ms,
            raise_errors=False,
        )
        for result in response["topics"]:
            # Another process creating it first is as good as creating it ourselves.
            if result["error_code"] not in (0, _TOPIC_ALREADY_EXISTS):
                error = for_code(result["error_code"])
                raise error(f"cannot create topic {result['name']!r}: {result.get('error_message')}")

    def delete_topics(self, names: Iterable[str], *, timeout_ms: int = 10_000) -> None:
        """Delete topics; names that do not exist are ignored. Returns once they are gone."""
        from kafka.errors import KafkaTimeoutError, for_code

        names = sorted(set(names))
        if not names:
            return
        with self._lock:
            response = self._client().delete_topics(names, timeout_ms=timeout_ms, raise_errors=False)
            for result in response["topics"]:
                if result["error_code"] not in (0, _UNKNOWN_TOPIC_OR_PARTITION):
                    error = for_code(result["error_code"])
                    raise error(f"cannot delete topic {result['name']!r}: {result.get('error_message')}")
            # Deletion is asynchronous on Apache Kafka; wait until metadata no longer shows them.
            deadline = time.monotonic() + timeout_ms / 1000
            while remaining := set(self.fetch_topics(names, include_internal=True)):
                if time.monotonic() >= deadline:
                    raise KafkaTimeoutError(f"topics still present after deletion: {sorted(remaining)}")
                time.sleep(0.05)
