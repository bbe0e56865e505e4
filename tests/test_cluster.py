"""Topic metadata and topic creation against every available broker."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from pystreams.assignors.api import TopicMetadata

from pystreams.cluster import (
    NIL_TOPIC_ID,
    ClusterMetadata,
    TopicMismatchError,
    TopicSpec,
    fallback_topic_id,
)


@pytest.fixture
def cluster(any_kafka) -> Iterator[ClusterMetadata]:
    with ClusterMetadata(any_kafka.bootstrap_servers) as metadata:
        yield metadata


# -- against real brokers -----------------------------------------------------------------------


@pytest.mark.integration
def test_fetch_topics_sees_a_created_topic(cluster: ClusterMetadata, unique_topic: Callable[..., str]) -> None:
    name = unique_topic("orders")
    assert name not in cluster.fetch_topics()
    cluster.ensure_topics([TopicSpec(name, num_partitions=3)])

    topic = cluster.fetch_topics()[name]
    assert isinstance(topic, TopicMetadata)
    assert topic.name == name
    assert topic.num_partitions == 3
    assert isinstance(topic.topic_id, uuid.UUID)
    assert topic.topic_id != NIL_TOPIC_ID
    # The id is the broker's own, not our name-derived fallback.
    assert topic.topic_id != fallback_topic_id(name)
    assert cluster.fetch_topics([name]) == {name: topic}


@pytest.mark.integration
def test_topics_get_distinct_ids(cluster: ClusterMetadata, unique_topic: Callable[..., str]) -> None:
    names = [unique_topic("a"), unique_topic("b"), unique_topic("c")]
    topics = cluster.ensure_topics([TopicSpec(name, num_partitions=1) for name in names])
    assert sorted(topics) == sorted(names)
    assert len({topic.topic_id for topic in topics.values()}) == 3


@pytest.mark.integration
def test_fetching_named_topics_leaves_out_missing_ones_without_creating_them(cluster: ClusterMetadata, unique_topic: Callable[..., str]) -> None:
    present, absent = unique_topic("present"), unique_topic("absent")
    cluster.ensure_topics([TopicSpec(present, num_partitions=2)])
    assert set(cluster.fetch_topics([present, absent])) == {present}
    assert cluster.fetch_topics([absent]) == {}
    assert absent not in cluster.fetch_topics(), "a metadata lookup must not auto-create topics"
    assert cluster.fetch_topics([]) == {}


@pytest.mark.integration
def test_ensure_topics_is_idempotent(cluster: ClusterMetadata, unique_topic: Callable[..., str]) -> None:
    changelog = TopicSpec(unique_topic("store-changelog"), num_partitions=4, configs={"cleanup.policy": "compact"})
    plain = TopicSpec(unique_topic("repartition"), num_partitions=2)

    first = cluster.ensure_topics([changelog])
    assert first[changelog.name].num_partitions == 4

    # Again, and together with a new topic: the existing one is left as it was.
    second = cluster.ensure_topics([changelog, plain])
    assert second[changelog.name] == first[changelog.name]
    assert second[plain.name].num_partitions == 2
    assert cluster.ensure_topics([changelog, plain]) == second
    assert cluster.ensure_topics([]) == {}


@pytest.mark.integration
def test_ensure_topics_rejects_an_existing_topic_with_other_partitions(cluster: ClusterMetadata, unique_topic: Callable[..., str]) -> None:
    name = unique_topic("records")
    cluster.ensure_topics([TopicSpec(name, num_partitions=3)])
    with pytest.raises(TopicMismatchError, match="3 partitions, expected 5"):
        cluster.ensure_topics([TopicSpec(name, num_partitions=5)])
    assert cluster.fetch_topics([name])[name].num_partitions == 3


@pytest.mark.integration
def test_concurrent_ensure_topics_agree(any_kafka, unique_topic: Callable[..., str]) -> None:
    # Two processes (here: clients) racing to create the same topic both succeed.
    spec = TopicSpec(unique_topic("raced"), num_partitions=2)
    results: list[dict[str, TopicMetadata]] = []
    errors: list[BaseException] = []

    def create() -> None:
        try:
            with ClusterMetadata(any_kafka.bootstrap_servers) as own_client:
                results.append(own_client.ensure_topics([spec]))
        except BaseException as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=create) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    assert len(results) == 2
    assert results[0] == results[1]


@pytest.mark.integration
def test_a_recreated_topic_has_a_new_id(any_kafka, cluster: ClusterMetadata, unique_topic: Callable[..., str]) -> None:
    name = unique_topic("recreated")
    original = cluster.ensure_topics([TopicSpec(name, num_partitions=2)])[name]

    cluster.delete_topics([name])
    assert name not in cluster.fetch_topics()

    recreated = cluster.ensure_topics([TopicSpec(name, num_partitions=3)])[name]
    assert recreated.num_partitions == 3
    # Both brokers give a fresh id (the embedded one a new version-7 UUID), which is how the
    # coordinator tells a re-created topic from the old one.
    assert recreated.topic_id != original.topic_id
    assert recreated.topic_id != NIL_TOPIC_ID
    if any_kafka.is_embedded:
        assert original.topic_id.version == recreated.topic_id.version == 7


@pytest.mark.integration
def test_delete_topics_ignores_unknown_names(cluster: ClusterMetadata, unique_topic: Callable[..., str]) -> None:
    kept, deleted = unique_topic("kept"), unique_topic("deleted")
    cluster.ensure_topics([TopicSpec(kept, 1), TopicSpec(deleted, 1)])
    cluster.delete_topics([deleted, unique_topic("never-existed")])
    remaining = cluster.fetch_topics()
    assert kept in remaining and deleted not in remaining


# -- the fallback for brokers without topic ids (no broker needed) -------------------------------


class _AdminReportingTopics:
    """Stands in for kafka-python's admin client: answers describe_topics with fixed entries."""

    def __init__(self, entries: list[dict[str, Any]]) -> None:
        self.entries = entries

    def describe_topics(self, topics: list[str] | None = None) -> list[dict[str, Any]]:
        return [e for e in self.entries if topics is None or e["name"] in topics]

    def close(self) -> None:
        pass


def _entry(name: str, topic_id: Any, partitions: int, **extra: Any) -> dict[str, Any]:
    return {
        "error_code": 0,
        "name": name,
        "topic_id": topic_id,
        "is_internal": False,
        "partitions": [{"partition_index": i, "error_code": 0} for i in range(partitions)],
        **extra,
    }


def _metadata_over(entries: list[dict[str, Any]]) -> ClusterMetadata:
    metadata = ClusterMetadata("unused:9092")
    metadata._admin = _AdminReportingTopics(entries)  # no connection is ever opened
    return metadata


def test_fallback_topic_id_is_stable_and_depends_on_the_name_only() -> None:
    assert fallback_topic_id("orders") == fallback_topic_id("orders")
    assert fallback_topic_id("orders") != fallback_topic_id("payments")
    assert fallback_topic_id("orders").version == 5
    assert fallback_topic_id("orders") != NIL_TOPIC_ID


def test_missing_or_zero_topic_ids_fall_back_and_real_ids_are_kept(
    caplog: pytest.LogCaptureFixture,
) -> None:
    real_id = uuid.uuid4()
    metadata = _metadata_over(
        [
            _entry("null-id", None, 2),
            _entry("zero-id", str(NIL_TOPIC_ID), 1),
            _entry("real-id", str(real_id), 3),
            _entry("uuid-object", real_id, 1),
        ]
    )
    with caplog.at_level("WARNING", logger="pystreams.cluster"):
        topics = metadata.fetch_topics()
    assert topics["null-id"] == TopicMetadata(fallback_topic_id("null-id"), "null-id", 2)
    assert topics["zero-id"].topic_id == fallback_topic_id("zero-id")
    assert topics["real-id"] == TopicMetadata(real_id, "real-id", 3)
    assert topics["uuid-object"].topic_id == real_id
    assert "re-creating this topic will not be detected" in caplog.text

    caplog.clear()
    with caplog.at_level("WARNING", logger="pystreams.cluster"):
        metadata.fetch_topics()
    assert caplog.text == "", "the fallback warning is given once per topic"


def test_topics_with_errors_and_internal_topics_are_left_out_unless_asked() -> None:
    metadata = _metadata_over(
        [
            _entry("ok", str(uuid.uuid4()), 1),
            _entry("unknown", None, 0, error_code=3),
            _entry("leaderless", str(uuid.uuid4()), 1, error_code=5),
            _entry("__consumer_offsets", str(uuid.uuid4()), 50, is_internal=True),
        ]
    )
    assert set(metadata.fetch_topics()) == {"ok"}
    assert set(metadata.fetch_topics(include_internal=True)) == {"ok", "__consumer_offsets"}
    assert metadata.fetch_topics(include_internal=True)["__consumer_offsets"].num_partitions == 50


def test_topic_spec_needs_partitions() -> None:
    with pytest.raises(ValueError, match="num_partitions"):
        TopicSpec("nothing", num_partitions=0)
