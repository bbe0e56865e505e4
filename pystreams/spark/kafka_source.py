"""A Spark Python data source that reads Kafka topics with kafka-python.

Used when Spark's own Kafka connector is not on the classpath (see ``builtin_kafka_available``).
Offsets are ``source_offsets.SourceOffsets``: the next offset per partition, with the cluster
id and topic ids they belong to. Spark stores them in the query's checkpoint, so a restarted
query resumes exactly where the last committed batch ended — once they are checked against the
cluster's logs as they are now (``failOnDataLoss``, as Spark's own Kafka source names it). One
Spark input partition reads one Kafka partition's offset range, so records of a partition stay
in order.

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

from pystreams.log_ends import first_offsets, true_end_offsets

from .source_offsets import (
    FAIL_ON_DATA_LOSS,
    LogView,
    SourceOffsets,
    partition_key,
    resume_positions,
    split_partition_key,
)

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


def log_view(cluster: Any, consumer: Any, partitions: Sequence[Any], ends: Mapping[str, int] | None = None) -> LogView:
    """The logs of ``partitions`` now (``cluster``: a ``ClusterMetadata``): the cluster id,
    topic ids, first offsets and, unless given, true end offsets."""
    topics = sorted({p.topic for p in partitions})
    metadata = cluster.fetch_topics(topics)
    starts = {partition_key(p.topic, p.partition): o for p, o in first_offsets(consumer, partitions).items()}
    if ends is None:
        ends = {partition_key(p.topic, p.partition): o for p, o in true_end_offsets(consumer, partitions, timeout_s=FETCH_TIMEOUT_S).items()}
    return LogView(cluster.cluster_id(), {name: str(meta.topic_id) for name, meta in metadata.items()}, starts, dict(ends))


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: Mapping[str, str]) -> None:
        self.bootstrap_servers = options["bootstrap.servers"]
        self.topics = tuple(t for t in options["topics"].split(",") if t)
        self.fail_on_data_loss = options.get(FAIL_ON_DATA_LOSS, "true").strip().lower() != "false"
        self._frozen_end: dict[str, int] | None = None
        self._metadata: Any = None
        self._cluster: Any = None

    def __getstate__(self) -> dict[str, Any]:
        # The reader is shipped to executors; its driver-side clients stay behind.
        state = dict(self.__dict__)
        state["_metadata"] = state["_cluster"] = None
        return state

    def _driver_consumer(self) -> Any:
        if self._metadata is None:
            self._metadata = _consumer(self.bootstrap_servers)
        return self._metadata

    def _view(self, ends: Mapping[str, int] | None = None) -> LogView:
        if self._cluster is None:
            from pystreams.cluster import ClusterMetadata

            self._cluster = ClusterMetadata(self.bootstrap_servers, client_id="pystreams-spark-source-metadata")
        return log_view(self._cluster, self._driver_consumer(), self._partitions(), ends)

    def _resume_positions(self, start: Mapping[str, Any], view: LogView) -> dict[str, int]:
        """Where the read after ``start`` begins: ``DataLossError`` when its log is not the
        cluster's any more, unless failOnDataLoss is off (then a warning, and Spark's way on)."""
        return resume_positions(SourceOffsets.from_json(start), view, fail_on_data_loss=self.fail_on_data_loss, where="this query's checkpoint")

    def _partitions(self) -> list[Any]:
        from kafka import TopicPartition

        consumer = self._driver_consumer()
        found: list[TopicPartition] = []
        for topic in self.topics:
            numbers = consumer.partitions_for_topic(topic)
            if not numbers:
                raise ValueError(f"source topic {topic!r} does not exist on {self.bootstrap_servers}")
            found.extend(TopicPartition(topic, n) for n in sorted(numbers))
        return found

    def _current_end(self) -> dict[str, int]:
        consumer = self._driver_consumer()
        ends = true_end_offsets(consumer, self._partitions(), timeout_s=FETCH_TIMEOUT_S)
        return {partition_key(p.topic, p.partition): offset for p, offset in ends.items()}

    def initialOffset(self) -> dict:
        view = self._view(ends={})
        return SourceOffsets(view.starts, view.cluster_id, view.topic_ids).to_json()

    def prepareForTriggerAvailableNow(self) -> None:
        # A backfill ends at the offsets seen now, even while producers keep writing.
        self._frozen_end = self._current_end()
        log.info("availableNow: reading up to %s", self._frozen_end)

    def latestOffset(self, start: dict, limit: Any = None) -> dict:
        view = self._view(self._frozen_end)
        if self.fail_on_data_loss:
            self._resume_positions(start, view)  # a checkpoint of another log fails before anything is read
        return SourceOffsets(view.ends, view.cluster_id, view.topic_ids).to_json()

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        last = SourceOffsets.from_json(end)
        view = self._view(last.positions)
        # Judged by the ids seen when this batch's end was taken.
        view = LogView(last.cluster_id or view.cluster_id, {**view.topic_ids, **last.topic_ids}, view.starts, view.ends)
        resume = self._resume_positions(start, view)
        ranges = []
        for key, end_offset in sorted(last.positions.items()):
            start_offset = resume.get(key, view.starts.get(key, 0))  # a partition new since ``start``: its beginning
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
                        f"could not read {partition.topic}[{partition.partition}] offsets {position}..{partition.end} within {FETCH_TIMEOUT_S:g} s"
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
        if self._cluster is not None:
            self._cluster.close()
            self._cluster = None


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
