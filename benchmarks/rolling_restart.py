"""A rolling restart of three static word-count workers (``--instance-id``, production defaults:
the coordinator as it starts without options), with a line of six words (97 distinct) fed every 20 ms; each worker in
turn is stopped with SIGTERM (it commits and leaves with epoch -2, keeping its tasks) and
started again on its state directory, once the previous one runs its tasks again. Prints JSON:

* ``longest_output_pause_s``: per roll, the longest gap between two output records while it
  ran (the issue's figure), and the median over the rolls; ``longest_partition_pause_s`` the
  same within one output partition (the worst one): the words a restarting worker counts stop
  for that long, while the other workers' outputs keep the overall stream going;
* ``restarts``: per restart, where the time went, in seconds from the moment before it: the
  stop (SIGTERM → revoked and committed → left → process gone), then the start (interpreter,
  imports, app loaded, topology resolved against the cluster, internal topics ensured, topic
  names, engine clients, joined, tasks added, first records processed) — medians over every
  restart, and ``offline_s``, SIGTERM to the new process's first records.

    .venv/bin/python benchmarks/rolling_restart.py [--rolls 3] [--bytecode cached|none]

Workers run under ``worker_phases.py`` (``pystreams worker`` with its phases timed); the
machine's other load makes single figures noisy, hence the medians over several rolls.
``--bytecode cached`` (the default) compiles pystreams' modules first, as the Docker image
does when it is built and as any install that may write ``__pycache__`` does on its first
run; ``none`` makes every worker compile every module at every start (what a checkout run
with ``PYTHONDONTWRITEBYTECODE`` and no compiled files does).
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from coordinator_process import start_coordinator
from kafka import KafkaConsumer, KafkaProducer
from rebalance_speed import Fleet, tear_down, wait_for
from worker_phases import parse_phases

from pystreams.broker import EmbeddedBroker, free_port
from pystreams.cluster import ClusterMetadata, TopicSpec

WORKERS = 3
PHASES = str(Path(__file__).with_name("worker_phases.py"))
#: The start phases in the order a worker goes through them.
START_PHASES = (
    "interpreter",
    "imports",
    "load_app",
    "resolve_topology",
    "ensure_topics",
    "topic_names",
    "engine_clients",
    "joined",
    "tasks_added",
    "first_records",
)
STOP_PHASES = ("revoked", "left", "threads_stopped", "exit")


def steps(phases: dict[str, float], names: tuple[str, ...], since: float) -> dict[str, float]:
    """Seconds each phase took after the one before it (the first: after ``since``)."""
    out: dict[str, float] = {}
    previous = since
    for name in names:
        if name in phases:
            out[name] = phases[name] - previous
            previous = phases[name]
    return out


def longest_gap(times: list[float]) -> float:
    return max((b - a for a, b in zip(times, times[1:], strict=False)), default=float("nan"))


def restart(fleet: Fleet, index: int) -> dict[str, float]:
    """Stop worker ``index`` and start it again; its stop and start phases (seconds)."""
    process, old_log = fleet.processes.pop(index), fleet.logs[index]
    stopping = time.time()
    process.send_signal(signal.SIGTERM)
    process.wait(60)
    stopped = time.time()
    starting = time.time()
    fleet.start(index)
    new_log = fleet.logs[index]
    wait_for(lambda: "first_records" in parse_phases(new_log.read_text(errors="replace")), 60, f"worker {index} to process records")
    old, new = parse_phases(old_log.read_text(errors="replace")), parse_phases(new_log.read_text(errors="replace"))
    stop_steps = steps(old, STOP_PHASES, stopping)
    return {
        **{f"stop.{name}": s for name, s in stop_steps.items()},
        "stop_s": stopped - stopping,
        **{f"start.{name}": s for name, s in steps(new, START_PHASES, starting).items()},
        "start_to_first_records_s": new["first_records"] - starting,
        "offline_s": new["first_records"] - stopping,
    }


def prepare_bytecode(mode: str, workdir: Path) -> None:
    """Compiled modules as production has them (``cached``), or none at all (``none``)."""
    import pystreams.assignors
    import pystreams.state
    import pystreams.topology

    if mode == "cached":
        for package in (pystreams, pystreams.assignors, pystreams.state, pystreams.topology):
            for directory in package.__path__:
                compileall.compile_dir(directory, quiet=1)
    else:  # the workers inherit these: compiled files are looked for where there are none
        os.environ["PYTHONPYCACHEPREFIX"] = str(workdir / "no-pycache")
        os.environ["PYTHONDONTWRITEBYTECODE"] = "1"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rolls", type=int, default=3)
    parser.add_argument("--bytecode", choices=("cached", "none"), default="cached")
    args = parser.parse_args()
    broker = EmbeddedBroker(port=None)
    broker.start()
    port = free_port()
    coordinator = None
    stop = threading.Event()
    arrivals: list[tuple[int, float]] = []  # (output partition, when a record of it arrived)
    with tempfile.TemporaryDirectory() as tmp:
        fleet = Fleet(broker.bootstrap_servers, f"127.0.0.1:{port}", Path(tmp), launcher=[sys.executable, PHASES])
        try:
            with ClusterMetadata(broker.bootstrap_servers) as cluster:
                cluster.ensure_topics([TopicSpec("text-lines", 6), TopicSpec("word-counts", 6)])
            coordinator = start_coordinator(broker.bootstrap_servers, port)
            prepare_bytecode(args.bytecode, Path(tmp))  # the workers' start is measured, not the coordinator's

            def feed() -> None:
                producer = KafkaProducer(bootstrap_servers=broker.bootstrap_servers)
                number = 0
                while not stop.wait(0.02):
                    # Words varied enough to reach every partition: each restarted worker has records.
                    words = " ".join(f"w{(number * 7 + i) % 97}" for i in range(6))
                    producer.send("text-lines", key=str(number).encode(), value=words.encode())
                    number += 1
                producer.close()

            def read() -> None:
                consumer = KafkaConsumer("word-counts", bootstrap_servers=broker.bootstrap_servers, group_id=None, auto_offset_reset="latest")
                while not stop.is_set():
                    for partition, records in consumer.poll(timeout_ms=50).items():
                        now = time.monotonic()
                        arrivals.extend((partition.partition, now) for _ in records)
                consumer.close()

            for thread in (threading.Thread(target=feed, daemon=True), threading.Thread(target=read, daemon=True)):
                thread.start()
            for index in range(WORKERS):
                fleet.start(index)
            time.sleep(5.0)  # every member stable, the last acknowledgements in
            pauses, partition_pauses, restarts = [], [], []
            for _ in range(args.rolls):
                started = time.monotonic()
                restarts.extend(restart(fleet, index) for index in range(WORKERS))
                time.sleep(2.0)
                during = [(p, t) for p, t in arrivals if t >= started]
                pauses.append(longest_gap([t for _, t in during]))
                partition_pauses.append(max(longest_gap([t for p, t in during if p == partition]) for partition in {p for p, _ in during}))
            keys = list(dict.fromkeys(key for r in restarts for key in r))
            print(
                json.dumps(
                    {
                        "coordinator": "defaults",
                        "bytecode": args.bytecode,
                        "rolls": args.rolls,
                        "longest_output_pause_s": {"per_roll": [round(p, 2) for p in pauses], "median": round(statistics.median(pauses), 2)},
                        "longest_partition_pause_s": {
                            "per_roll": [round(p, 2) for p in partition_pauses],
                            "median": round(statistics.median(partition_pauses), 2),
                        },
                        "restarts": len(restarts),
                        "median_s": {key: round(statistics.median(r[key] for r in restarts if key in r), 3) for key in keys},
                    },
                    indent=2,
                )
            )
        finally:
            tear_down(stop, fleet, coordinator, broker)


if __name__ == "__main__":
    main()
