"""The Spark Kafka source's offsets know which logs they belong to: a checkpoint whose offsets
do not fit the cluster's logs (another cluster, a recreated topic, a position beyond a log's
end or before its start) is data loss, which fails (failOnDataLoss) or, when allowed, resumes
as Spark's own Kafka source would."""

from __future__ import annotations

import json
import logging

import pytest

from pystreams.spark.source_offsets import (
    DataLossError,
    LogView,
    SourceOffsets,
    checkpoint_offsets,
    find_data_loss,
    resume_positions,
)

OLD_ID, NEW_ID = "0192a1b0-0000-7000-8000-000000000001", "0192a1b0-0000-7000-8000-000000000002"


def view(**overrides: object) -> LogView:
    fields: dict[str, object] = {
        "cluster_id": "c1",
        "topic_ids": {"lines": OLD_ID},
        "starts": {"lines:0": 0, "lines:1": 0},
        "ends": {"lines:0": 10, "lines:1": 4},
    }
    return LogView(**{**fields, **overrides})  # type: ignore[arg-type]


RECORDED = SourceOffsets({"lines:0": 7, "lines:1": 4}, "c1", {"lines": OLD_ID})


def test_offsets_of_the_same_logs_resume_where_they_stopped() -> None:
    assert find_data_loss(RECORDED, view()) == []
    assert resume_positions(RECORDED, view(), fail_on_data_loss=True, where="x") == {"lines:0": 7, "lines:1": 4}


def test_a_recreated_topic_is_data_loss_even_when_the_offsets_fit() -> None:
    # A fresh broker holding the same input: same positions, another log.
    (loss,) = find_data_loss(RECORDED, view(topic_ids={"lines": NEW_ID}))
    assert (loss.topic, loss.partition) == ("lines", None)
    assert OLD_ID in loss.reason and NEW_ID in loss.reason
    with pytest.raises(DataLossError, match="lines: the topic was recreated") as raised:
        resume_positions(RECORDED, view(topic_ids={"lines": NEW_ID}), fail_on_data_loss=True, where="checkpoint ck")
    assert "--fail-on-data-loss false" in str(raised.value) and "--checkpoint" in str(raised.value)
    # Allowed to go on: a new topic, read from its beginning.
    resumed = resume_positions(RECORDED, view(topic_ids={"lines": NEW_ID}, starts={"lines:0": 2, "lines:1": 0}), fail_on_data_loss=False, where="x")
    assert resumed == {"lines:0": 2, "lines:1": 0}


def test_another_cluster_is_data_loss_for_every_topic() -> None:
    losses = find_data_loss(RECORDED, view(cluster_id="c2"))
    assert [(loss.topic, loss.partition) for loss in losses] == [("lines", None)]
    assert "'c1'" in losses[0].reason and "'c2'" in losses[0].reason


def test_a_position_beyond_the_end_resumes_at_the_end_as_spark_does(caplog: pytest.LogCaptureFixture) -> None:
    shorter = view(ends={"lines:0": 3, "lines:1": 4})
    (loss,) = find_data_loss(RECORDED, shorter)
    assert (loss.topic, loss.partition, loss.resume_at) == ("lines", 0, 3)
    assert "beyond the end of the log (3)" in loss.reason
    with caplog.at_level(logging.WARNING):
        assert resume_positions(RECORDED, shorter, fail_on_data_loss=False, where="x") == {"lines:0": 3, "lines:1": 4}
    assert "possible data loss" in caplog.text and "lines-0" in caplog.text


def test_a_position_before_the_start_resumes_at_the_start() -> None:
    trimmed = view(starts={"lines:0": 9, "lines:1": 0})
    (loss,) = find_data_loss(RECORDED, trimmed)
    assert (loss.partition, loss.resume_at) == (0, 9) and "records 7..8 were deleted unread" in loss.reason
    assert resume_positions(RECORDED, trimmed, fail_on_data_loss=False, where="x")["lines:0"] == 9


def test_a_deleted_partition_or_an_unknown_id_is_no_loss() -> None:
    assert find_data_loss(RECORDED, view(ends={"lines:0": 10}, starts={"lines:0": 0})) == []
    unlabelled = SourceOffsets({"lines:0": 7})  # written before ids were recorded
    assert find_data_loss(unlabelled, view(topic_ids={"lines": NEW_ID})) == []


def test_every_offset_format_a_checkpoint_may_hold_is_read() -> None:
    assert SourceOffsets.from_json(RECORDED.to_json()) == RECORDED
    assert SourceOffsets.from_json({"lines:0": 7}) == SourceOffsets({"lines:0": 7})  # before ids
    assert SourceOffsets.from_json({"lines": {"0": 7, "1": 2}}) == SourceOffsets({"lines:0": 7, "lines:1": 2})  # Spark's


def test_the_newest_offsets_of_each_query_are_read_from_the_checkpoint(tmp_path) -> None:
    for batch, position in ((0, 3), (1, 7)):
        offsets = tmp_path / "counts-to-word-counts" / "offsets"
        offsets.mkdir(parents=True, exist_ok=True)
        (offsets / str(batch)).write_text(
            "v1\n" + json.dumps({"batchWatermarkMs": 0}) + "\n" + json.dumps(SourceOffsets({"lines:0": position}, "c1", {"lines": OLD_ID}).to_json()) + "\n"
        )
    (tmp_path / "counts-to-word-counts" / "offsets" / ".1.crc").write_text("x")
    found = checkpoint_offsets(tmp_path)
    assert found == {"counts-to-word-counts (batch 1)": SourceOffsets({"lines:0": 7}, "c1", {"lines": OLD_ID})}
    assert checkpoint_offsets(tmp_path / "absent") == {}


def test_a_query_reading_two_sources_has_both_checked(tmp_path) -> None:
    offsets = tmp_path / "joined" / "offsets"
    offsets.mkdir(parents=True)
    left, right = SourceOffsets({"left:0": 4}, "c1"), SourceOffsets({"right:0": 9}, "c1")
    (offsets / "0").write_text("v1\n{}\n" + json.dumps(left.to_json()) + "\n" + json.dumps(right.to_json()) + "\n")
    assert checkpoint_offsets(tmp_path) == {"joined (batch 0, source 0)": left, "joined (batch 0, source 1)": right}


def test_a_partition_the_broker_names_no_first_offset_for_starts_at_zero() -> None:
    # The embedded broker may answer ListOffsets EARLIEST with -1 for a log with no records
    # yet; kafka-python then leaves it out and its beginning_offsets raises KeyError.
    from pystreams.log_ends import first_offsets

    class Consumer:
        def beginning_offsets(self, partitions: list[str]) -> dict[str, int]:
            answers = {"lines-0": 4, "lines-1": -1}
            found = {p: answers[p] for p in partitions if answers[p] != -1}
            return {p: found[p] for p in partitions}  # KeyError for the one left out, as kafka-python

    assert first_offsets(Consumer(), ["lines-0"]) == {"lines-0": 4}
    assert first_offsets(Consumer(), ["lines-0", "lines-1"]) == {"lines-0": 4, "lines-1": 0}


def test_the_true_end_of_a_log_whose_last_batch_is_larger_than_a_poll(kafka_bootstrap: str, unique_topic) -> None:
    # The embedded broker reports the last batch's base offset + 1 as the end; a poll may hand
    # over only part of that batch (max_poll_records), so the end is the fetch's high watermark.
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    from pystreams.cluster import ClusterMetadata, TopicSpec
    from pystreams.log_ends import true_end_offsets

    topic = unique_topic("true-end")
    with ClusterMetadata(kafka_bootstrap) as cluster:
        cluster.ensure_topics([TopicSpec(topic, 1)])
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap, linger_ms=1_000, batch_size=1 << 20)
    for n in range(1_200):  # one batch, as a worker's flush writes them
        producer.send(topic, value=b"%d" % n, partition=0)
    producer.flush()
    producer.close()
    consumer = KafkaConsumer(bootstrap_servers=kafka_bootstrap, group_id=None, max_poll_records=100)
    try:
        assert true_end_offsets(consumer, [TopicPartition(topic, 0)], timeout_s=30) == {TopicPartition(topic, 0): 1_200}
    finally:
        consumer.close()
