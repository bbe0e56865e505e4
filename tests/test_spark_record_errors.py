"""Bad records on Spark follow the app's error policies with the worker's rules: ``fail`` stops
with the very failure a worker reports (task, topic-partition@offset, node, reason), the other
policies skip what a worker skips, and dead letters carry the worker's headers.

Spark's operators run without Spark (``spark_emulation``); the worker side is the test driver
(the worker's tasks). ``test_spark_command.py`` runs the same through ``pystreams spark``.
"""

from __future__ import annotations

import dataclasses
import struct
import time
from typing import Any

import pytest
from kafka import KafkaConsumer
from pystreams.topology.ir import ErrorPolicies
from pystreams.topology.resolve import resolve
from spark_emulation import InputRecord, SparkEmulator

from pystreams import serdes
from pystreams.app import App, Processor, TumblingWindow
from pystreams.cluster import ClusterMetadata, TopicSpec
from pystreams.spark import compile_topology
from pystreams.testing import TopologyTestDriver
from pystreams.worker.errors import RecordProcessingError

S = 1000
BASE_MS = 1_700_000_040_000
INT = struct.Struct(">q")


class NoThrees(Processor):
    def process(self, key: Any, n: int) -> None:
        if n == 3:
            raise ValueError("no threes here")
        self.context.forward(key, n * 100)


def bad_records_app(**policies: Any) -> App:
    """Every kind of step fails on its own number: the stateless map on 13, the aggregation
    on 5 (both reading ``in``), the windowed one on 7 (``win``), the processor on 3 (``proc``);
    a value that is not 8 bytes does not deserialize. One source per stateful step: a record
    failing in one branch of a fan-out is not processed further by the other branches on a
    worker (as in Kafka Streams), while Spark runs each sink's branch as its own query."""
    app = App("bad-records", **policies)
    numbers = app.topic("in", value=serdes.Int())

    def checked(key: str, n: int) -> int:
        if n == 13:
            raise ValueError("13 is unlucky")
        return n

    def add(total: int, key: str, n: int) -> int:
        if n == 5:
            raise ValueError("no fives")
        return total + n

    def add_in_window(total: int, key: str, n: int) -> int:
        if n == 7:
            raise ValueError("no sevens in windows")
        return total + n

    safe = numbers.map_values(checked, value=serdes.Int(), name="checked")
    safe.aggregate(add, initial=0, store="sums", name="sums").to("sums")
    app.topic("win", value=serdes.Int()).aggregate(add_in_window, initial=0, store="per-minute", name="per_minute", window=TumblingWindow(size=60 * S)).to(
        "per-minute"
    )
    procs = app.topic("proc", value=serdes.Int())
    app.processor(procs, key_changing=False, value=serdes.Int(), name="no_threes")(NoThrees).to("hundreds")
    return app


TOPICS = {"in": 2, "win": 2, "proc": 2}


def record(partition: int, key: str, value: int | bytes, n: int, topic: str = "in") -> InputRecord:
    raw = value if isinstance(value, bytes) else INT.pack(value)
    return InputRecord(topic, partition, key.encode(), raw, BASE_MS + n * S)


def emulator(app: App, bootstrap: str = "") -> SparkEmulator:
    topology = app.topology()
    plan = compile_topology(topology)
    return SparkEmulator(plan, dict(resolve(topology, TOPICS).partitions), bootstrap_servers=bootstrap)


def pipe_all(driver: TopologyTestDriver, records: list[InputRecord]) -> None:
    for r in records:
        topic = driver.input_topic(r.topic, key=serdes.Bytes(), value=serdes.Bytes())
        topic.pipe_input(r.key, r.value, timestamp=r.timestamp, partition=r.partition)


@pytest.mark.parametrize(
    "bad",
    [
        record(1, "a", b"xx", 0),  # deserialization, at the source
        record(1, "a", 13, 0),  # the stateless step
        record(1, "a", 5, 0),  # the aggregation (per key on Spark)
        record(1, "a", 7, 0, "win"),  # the windowed aggregation (per task on Spark)
        record(1, "a", 3, 0, "proc"),  # the processor (per task, from raw source rows)
    ],
    ids=["deserialization", "stateless", "aggregation", "window", "processor"],
)
def test_fail_stops_spark_with_the_failure_a_worker_reports(bad: InputRecord) -> None:
    good = record(1, "b", 1, 0, bad.topic)
    with pytest.raises(RecordProcessingError) as on_spark:
        emulator(bad_records_app()).run_batch([good, bad])
    with TopologyTestDriver(bad_records_app(), partitions=TOPICS) as driver, pytest.raises(RecordProcessingError) as on_worker:
        pipe_all(driver, [good, bad])
    assert str(on_spark.value) == str(on_worker.value)
    assert f"on {bad.topic}-1@1 in node " in str(on_spark.value)  # topic-partition@offset and the node


def table(rows: list[tuple[bytes | None, bytes | None, int]]) -> dict[bytes | None, bytes | None]:
    return {key: value for key, value, _ in rows}


RECORDS = [
    record(0, "a", 1, 0),
    record(0, "b", 13, 1),
    record(0, "a", 5, 2),
    record(1, "c", b"xx", 3),
    record(1, "c", 2, 6),
    record(0, "a", 4, 7),
    record(0, "a", 1, 0, "win"),
    record(0, "a", 7, 1, "win"),
    record(1, "c", b"xx", 2, "win"),
    record(1, "c", 4, 3, "win"),
    record(0, "a", 3, 0, "proc"),
    record(0, "a", 4, 1, "proc"),
    record(1, "c", b"x", 2, "proc"),
    record(1, "c", 3, 3, "proc"),
]


def test_log_and_continue_skips_on_spark_what_a_worker_skips() -> None:
    policies = {"deserialization_errors": "log-and-continue", "processing_errors": "log-and-continue"}
    out = emulator(bad_records_app(**policies)).run_batch(RECORDS)
    with TopologyTestDriver(bad_records_app(**policies), partitions=TOPICS) as driver:
        # A Spark micro-batch applies each partition in order, partitions merged by timestamp.
        pipe_all(driver, sorted(RECORDS, key=lambda r: r.timestamp))
        for topic in ("sums", "per-minute"):
            worker = driver.output_topic(topic, key=serdes.Bytes(), value=serdes.Bytes()).read_table()
            assert table(out[topic]) == worker, topic
        hundreds = driver.output_topic("hundreds", key=serdes.Bytes(), value=serdes.Bytes()).read_records()
        assert sorted((r.key, r.value) for r in hundreds) == sorted((k, v) for k, v, _ in out["hundreds"])
    assert table(out["sums"])[b"a"] == INT.pack(1 + 4)  # 5 failed in the aggregation
    assert sorted(value for _, value, _ in out["hundreds"]) == [INT.pack(400)]


def test_dead_letters_from_spark_carry_the_workers_headers(kafka_bootstrap: str, unique_topic: Any) -> None:
    dead_letters = unique_topic("dlq")
    with ClusterMetadata(kafka_bootstrap) as cluster:
        cluster.ensure_topics([TopicSpec(dead_letters, 1)])
    policies = {"deserialization_errors": "dead-letter", "processing_errors": "dead-letter", "dead_letter_topic": dead_letters}
    inputs = [record(0, "a", 1, 0), record(0, "b", 13, 1), record(1, "c", b"xx", 2)]
    emulator(bad_records_app(**policies), kafka_bootstrap).run_batch(inputs)
    consumer = KafkaConsumer(dead_letters, bootstrap_servers=kafka_bootstrap, group_id=None, auto_offset_reset="earliest")
    letters: list[Any] = []
    deadline = time.monotonic() + 20
    try:
        while len(letters) < 2 and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=200).values():
                letters.extend(batch)
    finally:
        consumer.close()
    on_spark = {(r.key, r.value, tuple(r.headers)) for r in letters}
    with TopologyTestDriver(bad_records_app(**policies), partitions=TOPICS) as driver:
        pipe_all(driver, inputs)
        on_worker = {(r.key, r.value, tuple(r.headers)) for r in driver.output_topic(dead_letters, key=serdes.Bytes(), value=serdes.Bytes()).read_records()}
    assert on_spark == on_worker
    assert {(key, dict(headers)["pystreams.error.node"]) for key, _, headers in on_spark} == {(b"b", b"checked"), (b"c", b"in")}


def test_a_sources_own_deserialization_policy_wins_over_the_apps_and_the_command_lines() -> None:
    app = App("per-source", deserialization_errors="fail")
    strict = app.topic("strict", value=serdes.Int())
    lenient = app.topic("lenient", value=serdes.Int(), deserialization_errors="log-and-continue")
    strict.merge(lenient, name="both").to("out")
    topology = app.topology()
    assert topology.errors.deserialization_policy("lenient").value == "log-and-continue"
    # What `--deserialization-errors dead-letter` does: the app-wide policy changes, not the source's.
    overridden = topology.errors.overridden(deserialization="dead-letter", dead_letter_topic="dlq")
    assert overridden == ErrorPolicies("dead-letter", "fail", "dlq", {"lenient": "log-and-continue"})
    with TopologyTestDriver(app) as driver:
        driver.input_topic("lenient", value=serdes.Bytes()).pipe_input("k", b"bad", timestamp=0)
        with pytest.raises(RecordProcessingError, match="deserialization error on strict-0@0 in node 'strict'"):
            driver.input_topic("strict", value=serdes.Bytes()).pipe_input("k", b"bad", timestamp=0)
    plan = compile_topology(dataclasses.replace(topology, errors=overridden))
    assert plan.topology.errors.deserialization_policy("lenient").value == "log-and-continue"


# -- what `pystreams spark` says when a query stops ------------------------------------------------

#: The text of a StreamingQueryException Spark 4.3 raised for a bad record (abridged): our
#: message sits between Python frames and Spark's SQLSTATE and query description.
_FAILED_QUERY_TEXT = """[STREAM_FAILED] Query [id = e91d] terminated with exception: [FOREACH_BATCH_USER_FUNCTION_ERROR]
Traceback (most recent call last):
  File "/x/pystreams/spark/operators.py", line 88, in fail
    raise RecordProcessingError(failure) from error
pystreams.topology.kernels.RecordProcessingError: task 0_0: deserialization error on events-0@2 in node 'events': SerdeError: bad JSON
 SQLSTATE: 39000 SQLSTATE: XXKST
=== Streaming Query ===
Identifier: pystreams-json_counts-counts-to-event-counts
"""


def test_a_failed_query_is_said_in_one_line_naming_the_record_and_the_way_to_skip_it() -> None:
    from pystreams.commands.spark import query_failure

    said = query_failure(_FAILED_QUERY_TEXT)
    assert said is not None and "\n" not in said
    assert said.startswith("task 0_0: deserialization error on events-0@2 in node 'events': SerdeError: bad JSON (")
    assert "--deserialization-errors log-and-continue" in said
    # A failure of anything else is not ours to summarise: the caller prints it whole.
    assert query_failure("[STREAM_FAILED] java.lang.OutOfMemoryError: Java heap space") is None


def test_a_data_loss_found_mid_query_is_said_whole() -> None:
    from pystreams.commands.spark import query_failure
    from pystreams.spark.source_offsets import DataLoss, DataLossError

    error = DataLossError([DataLoss("lines", 0, "the recorded position 7 is beyond the end of the log (3)", 3)], "this query's checkpoint")
    said = query_failure(f'Traceback:\n  File "x"\npystreams.spark.source_offsets.DataLossError: {error}\n\tat py4j.X')
    assert said == str(error)
