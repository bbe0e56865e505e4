"""Fail-over of a 1,000,000-key store: time from SIGKILL of the active worker to the first
record processed by the survivor, with one standby replica and without.

Real processes (the embedded broker, a coordinator process with a 3 s session timeout, two
``pystreams worker`` processes) running ``tests/apps/ha_keys.py``, whose single task fills
its store ``keys`` from a few commands. Once the store holds every key (and, with a standby,
the standby has applied the last one) the active is killed and one probe command is sent;
the fail-over time ends when the survivor has processed it (a command sent before the kill
makes sure the fill's offsets were committed, so the survivor resumes after them). It includes noticing the death
(the session timeout) and whatever the survivor restores before it processes; the log line
"started tasks ... (restored N records)" gives N.

    python benchmarks/streams_failover.py [--keys 1000000]

Also run by ``benchmarks/streams_assignor.py`` (its ``failover`` section).
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KafkaTopicPartition

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the worker-process harness the tests use

from worker_support import Cluster, Workers, wait_for  # noqa: E402

from pystreams.broker import free_port  # noqa: E402
from pystreams.cluster import ClusterMetadata, TopicSpec  # noqa: E402

APP_PATH = ROOT / "tests" / "apps" / "ha_keys.py"
INPUT, PROGRESS = "ha-keys-in", "ha-keys-progress"
CHUNK = 1_000
STARTED = re.compile(r"started tasks 0_0 \(restored (\d+) records\)")


def _send(bootstrap: str, commands: list[str]) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20)
    try:
        for command in commands:
            producer.send(INPUT, key=b"bench", value=command.encode(), partition=0)
        producer.flush()
    finally:
        producer.close()


class Progress:
    """Reads ``ha-keys-progress``: how many commands of a version were processed, and when."""

    def __init__(self, bootstrap: str) -> None:
        self._consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, auto_offset_reset="earliest")
        self._consumer.assign([KafkaTopicPartition(PROGRESS, 0)])
        self.processed: dict[int, list[int]] = {}  # version -> processing times (ms)

    def read(self) -> None:
        for records in self._consumer.poll(200).values():
            for record in records:
                _task, _count, version, processed_at = record.value.decode().split(",")
                self.processed.setdefault(int(version), []).append(int(processed_at))

    def close(self) -> None:
        self._consumer.close()


def _has_key(endpoint: str, key: str) -> bool:
    """The worker at ``endpoint`` holds ``key`` in any replica (a stale read)."""
    from pystreams import serdes

    url = f"http://{endpoint}/v1/stores/keys/{serdes.Text().serialize(key).hex()}?stale=1"
    try:
        with urllib.request.urlopen(url, timeout=5):
            return True
    except OSError:
        return False


def measure(keys: int, standbys: int, workdir: Path | None = None) -> dict:
    with tempfile.TemporaryDirectory(prefix="pystreams-failover-") as tmp:
        logs = Path(tmp) if workdir is None else workdir / f"standbys-{standbys}"
        logs.mkdir(parents=True, exist_ok=True)
        cluster = Cluster(logs)
        workers = Workers(cluster.bootstrap, cluster.coordinator_address, logs, APP_PATH)
        progress = Progress(cluster.bootstrap)
        try:
            with ClusterMetadata(cluster.bootstrap) as metadata:
                metadata.ensure_topics([TopicSpec(INPUT, 1), TopicSpec(PROGRESS, 1)])
            endpoints = [f"127.0.0.1:{free_port()}" for _ in range(2)]
            for endpoint in endpoints:
                workers.start("--num-standby-replicas", str(standbys), "--user-endpoint", endpoint)
            wait_for(lambda: any(STARTED.search(workers.log(i)) for i in range(2)), 60, "the active to start")
            active = next(i for i in range(2) if STARTED.search(workers.log(i)))
            survivor = 1 - active

            fill_started = time.monotonic()
            commands = [f"{first} {min(CHUNK, keys - first)} 1" for first in range(0, keys, CHUNK)]
            _send(cluster.bootstrap, commands)

            def filled() -> bool:
                progress.read()
                return len(progress.processed.get(1, ())) >= len(commands)

            wait_for(filled, 600, "the fill to be processed")
            fill_s = time.monotonic() - fill_started
            if standbys:
                wait_for(lambda: _has_key(endpoints[survivor], f"k{keys - 1}"), 600, "the standby to catch up")
            # A barrier: the active commits between polls, so once a later command is processed
            # the fill's offsets are committed and the survivor does not process it again.
            _send(cluster.bootstrap, ["0 1 9"])

            def barrier_passed() -> bool:
                progress.read()
                return bool(progress.processed.get(9))

            wait_for(barrier_passed, 600, "the barrier command to be processed")

            workers.processes[active].send_signal(signal.SIGKILL)
            killed_at_ms = time.time_ns() // 1_000_000
            workers.processes[active].wait(10)
            _send(cluster.bootstrap, ["0 1 2"])

            def probed() -> bool:
                progress.read()
                return bool(progress.processed.get(2))

            wait_for(probed, 600, "the survivor to process the probe\n" + workers.log_tails())
            resumed_ms = progress.processed[2][0] - killed_at_ms
            started = STARTED.search(workers.log(survivor))
            workers.stop_all()
            processed = re.search(r"stopped after processing (\d+) records", workers.log(survivor))
            return {
                "num_standby_replicas": standbys,
                "fill_s": round(fill_s, 2),
                "failover_to_resumed_processing_ms": resumed_ms,
                "records_restored_by_new_active": int(started.group(1)) if started else None,
                # At-least-once: input after the last commit is processed again (the probe is 1).
                "input_records_processed_by_new_active": int(processed.group(1)) if processed else None,
            }
        finally:
            progress.close()
            workers.stop_all()
            cluster.stop()


def run(keys: int, workdir: Path | None = None, standbys: tuple[int, ...] = (1, 0)) -> dict:
    return {
        "keys": keys,
        "session_timeout_ms": 3_000,
        "runs": [measure(keys, n, workdir) for n in standbys],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--standbys", type=int, action="append", help="run only these (default: 1 and 0)")
    parser.add_argument("--workdir", type=Path, help="keep logs and state here instead of a temporary directory")
    args = parser.parse_args(argv)
    standbys = tuple(args.standbys) if args.standbys else (1, 0)
    json.dump({"benchmark": "streams_failover", **run(args.keys, args.workdir, standbys)}, sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
