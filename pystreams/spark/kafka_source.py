"""A Spark Python data source that reads Kafka topics with kafka-python.

Used when Spark's own Kafka connector is not on the classpath (see ``builtin_kafka_available``).
Offsets are a dict ``{"topic:partition": next offset}``; Spark stores them in the query's
checkpoint, so a restarted query resumes exactly where the last committed batch ended. One
Spark input partition reads one Kafka partition's offset range, so records of a partition
stay in order.

Rows: ``key binary, value binary, topic string, partition int, offset long, timestamp long``
(timestamps are epoch milliseconds, as everywhere in pystreams).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

log = logging.getLogger(__name__)

FORMAT_NAME = "pystreams_kafka"
ROW_SCHEMA = "key binary, value binary, topic string, partition int, offset long, timestamp long"
FETCH_TIMEOUT_S = 60.0
KAFKA_CONNECTOR_CLASS = "org.apache.spark.sql.kafka010.KafkaSourceProvider"


def builtin_kafka_available(spark: Any) -> bool:
    """True when Spark's own Kafka connector (spark-sql-kafka) can be loaded by the JVM."""
    try:
        loader = spark._jvm.java.lang.Thread.currentThread().getContextClassLoader()
        loader.loadClass(KAFKA_CONNECTOR_CLASS)
        return True
    except Exception:
        return False


def partition_key(topic: str, partition: int) -> str:
    # Kafka topic names cannot contain ':' so the split is unambiguous.
    return f"{topic}:{partition}"


def split_partition_key(key: str) -> tuple[str, int]:
    topic, _, partition = key.rpartition(":")
    return topic, int(partition)


@dataclass(frozen=True)
class OffsetRange(InputPartition):
    topic: str
    partition: int
    start: int
    end: int


def _consumer(bootstrap_servers: str, **extra: Any) -> Any:
    from kafka import KafkaConsumer

    return KafkaConsumer(
        bootstrap_servers=bootstrap_servers,
        group_id=None,
        enable_auto_commit=False,
        client_id="pystreams-spark-source",
        max_poll_records=10_000,
        fetch_max_bytes=64 * 1024 * 1024,
        max_partition_fetch_bytes=16 * 1024 * 1024,
        **extra,
    )


def true_end_offsets(consumer: Any, partitions: Sequence[Any]) -> dict[Any, int]:
    """The next offset to be written per partition, found by fetching.

    Some brokers (the embedded one) answer ListOffsets LATEST with the last batch's base
    offset + 1; reading that last batch gives the real end. On Apache Kafka the fetch returns
    nothing new and the answer stands.
    """
    reported = consumer.end_offsets(list(partitions))
    beginnings = consumer.beginning_offsets(list(partitions))
    ends = dict(reported)
    probe = [p for p in partitions if reported[p] > beginnings[p]]
    if not probe:
        return ends
    consumer.assign(probe)
    for p in probe:
        consumer.seek(p, reported[p] - 1)
    waiting = set(probe)
    deadline = time.monotonic() + FETCH_TIMEOUT_S
    while waiting and time.monotonic() < deadline:
        for p, records in consumer.poll(timeout_ms=200).items():
            if records:
                ends[p] = max(ends[p], records[-1].offset + 1)
                waiting.discard(p)
        # A partition whose records were deleted or compacted away returns nothing: its
        # position still moves past the gap.
        for p in list(waiting):
            if consumer.position(p) >= reported[p]:
                waiting.discard(p)
    return ends


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: Mapping[str, str]) -> None:
        self.bootstrap_servers = options["bootstrap.servers"]
        self.topics = tuple(t for t in options["topics"].split(",") if t)
        self._frozen_end: dict[str, int] | None = None
        self._metadata: Any = None

    def __getstate__(self) -> dict[str, Any]:
        # The reader is shipped to executors; its driver-side consumer stays behind.
        state = dict(self.__dict__)
        state["_metadata"] = None
        return state

    def _driver_consumer(self) -> Any:
        if self._metadata is None:
            self._metadata = _consumer(self.bootstrap_servers)
        return self._metadata

    def _partitions(self) -> list[Any]:
        from kafka import TopicPartition

        consumer = self._driver_consumer()
        found = []
        for topic in self.topics:
            numbers = consumer.partitions_for_topic(topic)
            if not numbers:
                raise ValueError(f"source topic {topic!r} does not exist on {self.bootstrap_servers}")
            found.extend(TopicPartition(topic, n) for n in sorted(numbers))
        return found

    def _current_end(self) -> dict[str, int]:
        consumer = self._driver_consumer()
        ends = true_end_offsets(consumer, self._partitions())
        return {partition_key(p.topic, p.partition): offset for p, offset in ends.items()}

    def initialOffset(self) -> dict:
        consumer = self._driver_consumer()
        beginnings = consumer.beginning_offsets(self._partitions())
        return {partition_key(p.topic, p.partition): offset for p, offset in beginnings.items()}

    def prepareForTriggerAvailableNow(self) -> None:
        # A backfill ends at the offsets seen now, even while producers keep writing.
        self._frozen_end = self._current_end()
        log.info("availableNow: reading up to %s", self._frozen_end)

    def latestOffset(self, start: dict, limit: Any = None) -> dict:
        end = self._frozen_end if self._frozen_end is not None else self._current_end()
        # Never go backwards, and keep partitions that appeared after ``start``.
        return {key: max(offset, start.get(key, 0)) for key, offset in {**start, **end}.items()}

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        ranges = []
        for key, end_offset in sorted(end.items()):
            start_offset = start.get(key, 0)
            if end_offset > start_offset:
                topic, number = split_partition_key(key)
                ranges.append(OffsetRange(topic, number, start_offset, end_offset))
        return ranges

    def read(self, partition: InputPartition) -> Iterator[Any]:
        import pyarrow as pa
        from kafka import TopicPartition

        assert isinstance(partition, OffsetRange)
        consumer = _consumer(self.bootstrap_servers)
        try:
            tp = TopicPartition(partition.topic, partition.partition)
            consumer.assign([tp])
            consumer.seek(tp, partition.start)
            position = partition.start
            deadline = time.monotonic() + FETCH_TIMEOUT_S
            while position < partition.end:
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"could not read {partition.topic}[{partition.partition}] "
                        f"offsets {position}..{partition.end} within {FETCH_TIMEOUT_S:g} s"
                    )
                records = consumer.poll(timeout_ms=500).get(tp, [])
                wanted = [r for r in records if r.offset < partition.end]
                if wanted:
                    deadline = time.monotonic() + FETCH_TIMEOUT_S
                    yield pa.RecordBatch.from_pydict(
                        {
                            "key": [r.key for r in wanted],
                            "value": [r.value for r in wanted],
                            "topic": [partition.topic] * len(wanted),
                            "partition": pa.array([partition.partition] * len(wanted), pa.int32()),
                            "offset": pa.array([r.offset for r in wanted], pa.int64()),
                            "timestamp": pa.array([r.timestamp for r in wanted], pa.int64()),
                        },
                        schema=ARROW_SCHEMA,
                    )
                # Gaps (transaction markers, compaction) move the position without records.
                position = max(position, consumer.position(tp))
        finally:
            consumer.close()

    def commit(self, end: dict) -> None:
        pass  # Offsets live in Spark's checkpoint; nothing to tell the broker.

    def stop(self) -> None:
        if self._metadata is not None:
            self._metadata.close()
            self._metadata = None


def _arrow_schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [
            ("key", pa.binary()),
            ("value", pa.binary()),
            ("topic", pa.string()),
            ("partition", pa.int32()),
            ("offset", pa.int64()),
            ("timestamp", pa.int64()),
        ]
    )


ARROW_SCHEMA = _arrow_schema()


class KafkaDataSource(DataSource):
    """``spark.readStream.format("pystreams_kafka").option("bootstrap.servers", ...)
    .option("topics", "a,b").load()``"""

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self) -> str:
        return ROW_SCHEMA

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return KafkaStreamReader(self.options)
