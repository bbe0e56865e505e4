"""kafka-python plumbing of the engine, against the real broker."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from kafka import KafkaProducer

from pystreams.cluster import ClusterMetadata, TopicSpec
from pystreams.worker.kafka_io import make_producer

pytestmark = pytest.mark.integration


def _send_a_then_b_then_a(producer: KafkaProducer, bootstrap: str, a: str, b: str) -> None:
    """Sends to ``a`` that are still lingering when ``b`` (new to the producer) is written."""
    producer.send(a, b"first").get(10)
    with ClusterMetadata(bootstrap) as cluster:
        cluster.ensure_topics([TopicSpec(b, 1)])
    lingering = producer.send(a, b"second")
    producer.send(b, b"other")  # waits for metadata of b: a refresh naming only what is tracked
    lingering.get(8)


def test_a_producer_keeps_writing_a_topic_after_another_topic_appears(kafka_bootstrap: str, unique_topic: Callable[[str], str]) -> None:
    """The worker's producer tracks every topic it writes from the start; otherwise a topic
    known only from the broker's bootstrap answer can be dropped from its metadata by the
    refresh for a new topic, and its sends wait for a leader until they expire."""
    a, b = unique_topic("written-first"), unique_topic("appears-later")
    with ClusterMetadata(kafka_bootstrap) as cluster:
        cluster.ensure_topics([TopicSpec(a, 1)])
    producer = make_producer(kafka_bootstrap, "kafka-io-test", {"max_block_ms": 5_000, "linger_ms": 1_000}, [a])
    try:
        _send_a_then_b_then_a(producer, kafka_bootstrap, a, b)
    finally:
        producer.close()


def test_a_restore_reads_to_the_true_end_of_a_changelog_whose_last_batch_is_larger_than_a_poll(kafka_bootstrap: str, unique_topic) -> None:
    """The embedded broker reports the last batch's base offset + 1 as a log's end, and a poll
    may hand over only part of that batch: taking the position after one poll as the end stopped
    a restore short (a store missing its newest records)."""
    from kafka import KafkaConsumer
    from pystreams.state import TopicPartition

    from pystreams.worker.kafka_io import ChangelogRestorer

    topic = unique_topic("changelog")
    with ClusterMetadata(kafka_bootstrap) as cluster:
        cluster.ensure_topics([TopicSpec(topic, 1)])
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, linger_ms=1_000, batch_size=1 << 20)
    for n in range(1_200):  # one batch, as a task's flush writes its changelog
        producer.send(topic, key=b"%d" % n, value=b"v", partition=0)
    producer.flush()
    producer.close()
    consumer = KafkaConsumer(bootstrap_servers=kafka_bootstrap, group_id=None, max_poll_records=100)
    try:
        restorer = ChangelogRestorer(consumer, fetch_timeout_s=30)
        assert restorer.true_end_offset(TopicPartition(topic, 0)) == 1_200
        read = sum(len(batch) for batch in restorer.read(TopicPartition(topic, 0), None, 1_200))
        assert read == 1_200
    finally:
        consumer.close()
