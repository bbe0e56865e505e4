"""Start-to-exact word count, pystreams against Quix Streams, on the same embedded broker.

The same job for both: count the words of 100k lines already on ``text-lines`` (4 partitions)
and write each word's running count to an output topic. One fresh broker per run, lines
produced before anything starts; then one process is launched — a ``pystreams worker
examples/wordcount.py`` (the coordinator already running with its defaults, as the broker is),
or a Quix Streams ``Application`` doing the same count — and timed from its launch until:

* ``startup_s``: the first output record (interpreter, imports, group join, first fetch);
* ``start_to_exact_s``: the output topic, read as a table (the latest value per word), holds
  exactly the final counts.

Both run with their production defaults (at-least-once; pystreams commits every second, Quix
every 5 s). Prints JSON with each system's runs and medians and ``ratio`` = Quix's median
start-to-exact over pystreams'. The machine's other load makes single runs noisy: use several.

    .venv/bin/pip install -e '.[bench]'     # Quix Streams, for this benchmark only
    .venv/bin/python benchmarks/vs_quix.py [--runs 3] [--lines 100000]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from coordinator_process import start_coordinator, wordcount_worker
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from pystreams.broker import EmbeddedBroker, free_port
from pystreams.cluster import ClusterMetadata, TopicSpec

PARTITIONS = 4
VOCABULARY = [f"word{n}" for n in range(1000)]
WORDS_PER_LINE = 8
#: Quix derives its repartition topics' retention from the input topic's ``retention.ms``, which
#: the embedded broker (Tansu) does not report unless the topic was created with it.
INPUT_CONFIGS = {"retention.ms": "-1", "retention.bytes": "-1"}
TIMEOUT_S = float(os.environ.get("VS_QUIX_TIMEOUT_S", "600"))


def make_lines(count: int) -> list[str]:
    rng = random.Random(25)
    return [" ".join(rng.choices(VOCABULARY, k=WORDS_PER_LINE)) for _ in range(count)]


def produce(bootstrap: str, lines: list[str]) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, batch_size=256 * 1024)
    for number, line in enumerate(lines):
        producer.send("text-lines", key=str(number).encode(), value=line.encode())
    producer.flush()
    producer.close()


def quix_app(bootstrap: str, state_dir: str) -> None:
    """The Quix Streams word count (run in its own process: ``vs_quix.py --quix BOOTSTRAP DIR``)."""
    from quixstreams import Application, State

    app = Application(
        broker_address=bootstrap,
        consumer_group="quix-wordcount",
        auto_offset_reset="earliest",
        state_dir=state_dir,
        loglevel=os.environ.get("VS_QUIX_LOGLEVEL", "INFO"),
    )
    lines = app.topic("text-lines", key_deserializer="str", value_deserializer="str")
    output = app.topic("quix-word-counts", key_serializer="str", value_serializer="json")

    def count(word: str, state: State) -> int:
        total = state.get("count", 0) + 1
        state.set("count", total)
        return total

    words = app.dataframe(lines).apply(lambda line: line.lower().split(), expand=True)
    counts = words.group_by(lambda word: word, name="word").apply(count, stateful=True)
    counts.to_topic(output)
    app.run()


def launch(system: str, bootstrap: str, coordinator: str, workdir: Path) -> subprocess.Popen[bytes]:
    if system == "pystreams":
        command = wordcount_worker(bootstrap, coordinator, workdir / "state")
    else:
        command = [sys.executable, __file__, "--quix", bootstrap, str(workdir / "state")]
    with (workdir / f"{system}.log").open("wb") as log:
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)


def log_tail(workdir: Path, system: str, lines: int = 40) -> str:
    return "\n".join((workdir / f"{system}.log").read_text(errors="replace").splitlines()[-lines:])


def decode_count(system: str, value: bytes) -> int:
    return struct.unpack(">q", value)[0] if system == "pystreams" else int(json.loads(value))


def one_run(system: str, lines: list[str], expected: dict[str, int], workdir: Path) -> dict[str, float]:
    broker = EmbeddedBroker(port=None)
    broker.start()
    coordinator = process = None
    output_topic = "word-counts" if system == "pystreams" else "quix-word-counts"
    try:
        with ClusterMetadata(broker.bootstrap_servers) as cluster:
            cluster.ensure_topics([TopicSpec("text-lines", PARTITIONS, configs=INPUT_CONFIGS), TopicSpec(output_topic, PARTITIONS)])
        produce(broker.bootstrap_servers, lines)
        port = free_port()
        if system == "pystreams":
            coordinator = start_coordinator(broker.bootstrap_servers, port)
        consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap_servers, group_id=None, auto_offset_reset="earliest")
        consumer.assign([TopicPartition(output_topic, p) for p in range(PARTITIONS)])
        table: dict[str, int] = {}
        first_output = None
        started = time.monotonic()
        process = launch(system, broker.bootstrap_servers, f"127.0.0.1:{port}", workdir)
        while time.monotonic() - started < TIMEOUT_S:
            batches = consumer.poll(timeout_ms=100)
            for records in batches.values():
                for record in records:
                    table[record.key.decode()] = decode_count(system, record.value)
            if batches and first_output is None:
                first_output = time.monotonic() - started
            if table == expected:
                return {"startup_s": first_output or float("nan"), "start_to_exact_s": time.monotonic() - started}
            if process.poll() is not None:
                raise RuntimeError(f"{system} exited with {process.returncode}:\n{log_tail(workdir, system)}")
        raise RuntimeError(f"{system}: no exact counts within {TIMEOUT_S} s ({len(table)} of {len(expected)} words seen):\n{log_tail(workdir, system)}")
    finally:
        for running in (process, coordinator):
            if running is not None:
                running.kill()
                running.wait()
        broker.stop()


def summary(runs: list[dict[str, float]]) -> dict[str, object]:
    return {
        "runs": [{key: round(value, 2) for key, value in run.items()} for run in runs],
        "median_startup_s": round(statistics.median(run["startup_s"] for run in runs), 2),
        "median_start_to_exact_s": round(statistics.median(run["start_to_exact_s"] for run in runs), 2),
    }


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--quix":
        quix_app(sys.argv[2], sys.argv[3])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--lines", type=int, default=100_000)
    parser.add_argument("--systems", default="pystreams,quix", help="comma-separated: pystreams, quix")
    args = parser.parse_args()
    lines = make_lines(args.lines)
    expected = dict(collections.Counter(word for line in lines for word in line.split()))
    systems = args.systems.split(",")
    results: dict[str, object] = {"lines": args.lines, "partitions": PARTITIONS}
    medians = {}
    for system in systems:
        runs = []
        for _ in range(args.runs):
            with tempfile.TemporaryDirectory() as workdir:
                runs.append(one_run(system, lines, expected, Path(workdir)))
        results[system] = summary(runs)
        medians[system] = statistics.median(run["start_to_exact_s"] for run in runs)
    if {"pystreams", "quix"} <= medians.keys():
        results["ratio_quix_over_pystreams"] = round(medians["quix"] / medians["pystreams"], 2)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
