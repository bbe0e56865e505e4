"""Wall-clock punctuations of a Processor become processing-time timers of
``transformWithStateInPandas``: in a streaming query they fire without new records, reading
the processor's store, and again in a streaming run after a backfill. (That a backfill of an
app with them still ends is covered by the dedupe example in ``test_spark_examples``.)"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaProducer
from spark_parity import SPARK_TIMEOUT_S, decoded, read_final_table
from test_spark_wordcount import WAIT_S

from pystreams import serdes
from pystreams.app import load_app
from pystreams.broker import EmbeddedBroker
from pystreams.cluster import ClusterMetadata, TopicSpec

pytestmark = pytest.mark.integration

TICKING_APP = """
from datetime import timedelta

from pystreams import serdes
from pystreams.app import App, Processor, PunctuationType, kv_store, punctuate

app = App("ticking")
events = app.topic("events", value=serdes.Text())


class CountAndTick(Processor):
    def init(self, context):
        super().init(context)
        self.counts = context.store("counts")

    def process(self, key, value):
        self.counts.put(key, (self.counts.get(key) or 0) + 1)
        self.context.forward(key, value)

    @punctuate(every=timedelta(milliseconds=300), on=PunctuationType.WALL_CLOCK_TIME)
    def tick(self, now_ms):
        remembered = sum(count for _, count in self.counts.items())
        self.context.forward(f"tick-{self.context.task_id}", str(remembered))


app.processor(events, stores=[kv_store("counts", value=serdes.Int())], key_changing=False)(CountAndTick).to("out")
"""


def test_wall_clock_punctuations_fire_as_processing_time_timers(spark: Any, tmp_path: Path) -> None:
    app_file = tmp_path / "ticking_app.py"
    app_file.write_text(TICKING_APP)
    with EmbeddedBroker() as broker:
        bootstrap = broker.bootstrap_servers
        with ClusterMetadata(bootstrap) as cluster:
            cluster.ensure_topics([TopicSpec("events", 1), TopicSpec("out", 1)])
        send(bootstrap, 5)

        from pystreams.spark import to_spark

        def job():
            return to_spark(load_app(str(app_file)), spark, bootstrap_servers=bootstrap, checkpoint=str(tmp_path / "cp"))

        def stream_until_tick(seen: str) -> dict:
            (query,) = [writer.trigger(processingTime="200 milliseconds").start() for writer in job().writers.values()]
            try:
                deadline = time.monotonic() + WAIT_S
                while True:
                    assert query.exception() is None, query.exception()
                    table = decoded(read_final_table(bootstrap, "out"), serdes.Text(), serdes.Json())
                    if table.get("tick-0_0") == seen:
                        return table
                    assert time.monotonic() < deadline, f"no wall-clock punctuation saw {seen} records: {table}"
                    time.sleep(0.5)
            finally:
                query.stop()

        # Fired after the records (the first check only schedules it): it saw all five.
        table = stream_until_tick("5")
        assert table["k0"] == "x"
        # A backfill on the same checkpoint fires no wall-clock punctuation, and a streaming
        # run after it schedules them again.
        send(bootstrap, 2)
        backfill = job()
        backfill.start(available_now=True)
        assert backfill.await_termination(SPARK_TIMEOUT_S)
        assert decoded(read_final_table(bootstrap, "out"), serdes.Text(), serdes.Json())["tick-0_0"] == "5"
        send(bootstrap, 1)
        stream_until_tick("8")


def send(bootstrap: str, records: int) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap)
    for i in range(records):
        producer.send("events", key=f"k{i % 2}".encode(), value=b"x")
    producer.flush()
    producer.close()
