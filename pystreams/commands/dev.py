"""``pystreams dev [APP.py]``: the embedded Kafka broker and a coordinator together, for local
work — and, given an app, worker processes running it.

Starts the broker (Tansu, memory storage: everything is gone when it stops), then a coordinator
whose record log is a topic of that broker, prints both addresses, and stops both cleanly on
Ctrl-C or SIGTERM. A port already taken (``--broker-port``, default 9092; ``--coordinator-port``,
default 9093) is said in one line before anything starts, with how to choose another. Everything a local run needs is started inside :func:`_serve_dev`, one
component after another in a single ``AsyncExitStack``.

With an app (``pystreams dev examples/wordcount.py``) it also starts ``--workers`` worker
processes (``pystreams worker``, two by default) and creates the app's missing input topics.
If the app reads ``text-lines`` and writes ``word-counts`` (the word-count shape), it feeds the
corpus (``--corpus``, default ``data/corpus.txt`` next to the app), shows progress and the live
top counts read from ``word-counts``, and once every word is counted compares the final table
(latest value per key) with a direct Python count of the corpus, prints that check and exits.
In app mode the coordinator's heartbeat interval and metadata refresh default to 1 s (instead
of 5 s) unless given, so that the workers' first rebalances take moments.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import os
import signal
import struct
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

from pystreams.commands import coordinator as coordinator_command
from pystreams.commands import options
from pystreams.commands.logs import configure_logging

HELP = "start the embedded Kafka broker and a coordinator together for local development"

BROKER_PORT_ENV = "PYSTREAMS_BROKER_PORT"
COORDINATOR_PORT_ENV = "PYSTREAMS_COORDINATOR_PORT"
DEFAULT_BROKER_PORT = 9092

#: The line that announces the broker; the coordinator's lines follow coordinator_command's.
BROKER_LINE_PREFIX = "broker: "
#: The line the word-count check ends with (tests look for it).
CHECK_OK_PREFIX = "check: OK"
CHECK_FAILED_PREFIX = "check: FAILED"

WORDCOUNT_INPUT = "text-lines"
WORDCOUNT_OUTPUT = "word-counts"
#: Partitions of input topics ``dev`` creates: enough for two workers to share tasks.
DEV_INPUT_PARTITIONS = 4
DEV_FAST_HEARTBEAT_MS = 1000
DEV_FAST_METADATA_REFRESH_MS = 1000
_LONG = struct.Struct(">q")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("app", nargs="?", default=None, help="optional app (path/to/app.py) to run in worker processes")
    parser.add_argument(
        "--broker-port",
        type=options.port,
        default=os.environ.get(BROKER_PORT_ENV, str(DEFAULT_BROKER_PORT)),
        help=f"port of the embedded broker; 0 picks a free port (default: {DEFAULT_BROKER_PORT}, env {BROKER_PORT_ENV})",
    )
    parser.add_argument("--workers", type=options.positive_int, default=2, help="worker processes to run the app in (default: 2)")
    parser.add_argument("--corpus", default=None, help="text fed to text-lines for a word-count app (default: data/corpus.txt next to the app)")
    parser.add_argument("--timeout-s", type=float, default=300.0, help="give up waiting for the corpus to be fully counted after this long (default: 300)")
    parser.add_argument(
        "--coordinator-port",
        type=options.port,
        default=os.environ.get(COORDINATOR_PORT_ENV) or None,
        help=f"port of the coordinator on the --listen host (shorthand for --listen HOST:PORT); 0 picks a free port "
        f"(default: {coordinator_command.DEFAULT_LISTEN.rpartition(':')[2]}, env {COORDINATOR_PORT_ENV})",
    )
    coordinator_command.add_coordinator_options(parser, cluster=False)


def run(args: argparse.Namespace) -> int:
    from pystreams.broker import BrokerStartError, EmbeddedBroker

    configure_logging(args.log_level)
    if args.app is not None:
        _speed_up_defaults_for_apps(args)
    try:
        taken = taken_ports(args)
    except ValueError as error:
        print(f"pystreams dev: {error}", file=sys.stderr)
        return 2
    if taken:
        for line in taken:  # before anything starts: nothing to stop, nothing else to say
            print(f"pystreams dev: {line}", file=sys.stderr)
        return 1
    broker = EmbeddedBroker(port=args.broker_port or None)
    try:
        try:
            broker.start()
        except BrokerStartError as error:
            print(f"pystreams dev: {error}", file=sys.stderr)
            return 1
        print(f"{BROKER_LINE_PREFIX}{broker.bootstrap_servers}", flush=True)
        try:
            settings = coordinator_command.settings_from_args(args, bootstrap_servers=broker.bootstrap_servers, log="kafka")
        except ValueError as error:
            print(f"pystreams dev: {error}", file=sys.stderr)
            return 2
        try:
            return asyncio.run(_serve_dev(settings, args))
        except KeyboardInterrupt:
            return 130
    finally:
        print("stopping the broker", flush=True)
        broker.stop()


def taken_ports(args: argparse.Namespace) -> list[str]:
    """What stands in the way of the broker's and the coordinator's ports, one line each saying
    which port and how to choose another (``--coordinator-port`` is folded into ``--listen``)."""
    from pystreams.broker import LOOPBACK, port_is_free
    from pystreams.protocol.security import Listener

    listener = Listener.parse(args.listen)
    if args.coordinator_port is not None:
        listener = Listener(listener.protocol, listener.host, args.coordinator_port)
        args.listen = str(listener)
    lines = []
    if args.broker_port and not port_is_free(LOOPBACK, args.broker_port):
        lines.append(
            f"port {args.broker_port} on {LOOPBACK}, the broker's, is taken (another `pystreams dev`, or a "
            "Kafka broker?); choose another with --broker-port PORT, or --broker-port 0 for a free one"
        )
    if listener.port and not port_is_free(listener.host, listener.port):
        lines.append(
            f"port {listener.port} on {listener.host}, the coordinator's, is taken (another `pystreams dev` or "
            "`pystreams coordinator`?); choose another with --coordinator-port PORT, or --coordinator-port 0 "
            "for a free one"
        )
    return lines


def _speed_up_defaults_for_apps(args: argparse.Namespace) -> None:
    if "PYSTREAMS_HEARTBEAT_INTERVAL_MS" not in os.environ and str(args.heartbeat_interval_ms) == "5000":
        args.heartbeat_interval_ms = DEV_FAST_HEARTBEAT_MS
        if args.min_heartbeat_interval_ms is None:
            args.min_heartbeat_interval_ms = DEV_FAST_HEARTBEAT_MS
    if "PYSTREAMS_METADATA_REFRESH_MS" not in os.environ and str(args.metadata_refresh_ms) == "5000":
        args.metadata_refresh_ms = DEV_FAST_METADATA_REFRESH_MS


async def _serve_dev(settings: coordinator_command.CoordinatorSettings, args: argparse.Namespace | None = None) -> int:
    from pystreams.coordinator.log import LogError

    stop = asyncio.Event()
    coordinator_command._install_stop_signals(stop)
    try:
        async with contextlib.AsyncExitStack() as components:
            running = await components.enter_async_context(coordinator_command.running_coordinator(settings))
            print(f"{coordinator_command.LISTEN_LINE_PREFIX}{running.address}")
            if running.metrics_url:
                print(f"{coordinator_command.METRICS_LINE_PREFIX}{running.metrics_url}")
            sys.stdout.flush()
            if not await coordinator_command.wait_loaded_or_stopped(running, stop):
                return 0
            if args is None or args.app is None:
                print(
                    f"{coordinator_command.READY_LINE}; clients bootstrap at {running.address} "
                    f"(the group coordinator), data lives at {settings.bootstrap_servers}; Ctrl-C stops both",
                    flush=True,
                )
                await stop.wait()
                print("stopping the coordinator", flush=True)
                return 0
            assert settings.bootstrap_servers
            status = await _run_app(args, settings.bootstrap_servers, running.address, stop, components)
            print("stopping the coordinator", flush=True)
            return status
    except (LogError, RuntimeError, OSError) as error:
        print(f"pystreams dev: {error}", file=sys.stderr)
        return 1


# --- app mode ----------------------------------------------------------------------------------


async def _run_app(args: argparse.Namespace, bootstrap: str, coordinator: str, stop: asyncio.Event, components: contextlib.AsyncExitStack) -> int:
    from pystreams.app_loader import load_app

    loop = asyncio.get_running_loop()
    app_path = Path(args.app)
    topology = load_app(str(app_path)).topology()
    created = await loop.run_in_executor(None, ensure_input_topics, bootstrap, [*topology.external_source_topics, *topology.global_topics])
    for name in created:
        print(f"created topic {name!r} ({DEV_INPUT_PARTITIONS} partitions)", flush=True)
    is_wordcount = WORDCOUNT_INPUT in topology.external_source_topics and WORDCOUNT_OUTPUT in topology.sink_topics

    workdir = Path(tempfile.mkdtemp(prefix=f"pystreams-dev-{topology.app_id}-"))
    workers = await components.enter_async_context(_worker_processes(args, bootstrap, coordinator, workdir))
    print(f"{coordinator_command.READY_LINE}; {len(workers)} workers run {topology.app_id!r} (logs in {workdir}); Ctrl-C stops everything", flush=True)
    if not is_wordcount:
        await stop.wait()
        return 0

    corpus_path = Path(args.corpus) if args.corpus else app_path.resolve().parent / "data" / "corpus.txt"
    lines = corpus_path.read_text(encoding="utf-8").splitlines()
    expected = count_words(lines)
    sent = await loop.run_in_executor(None, produce_lines, bootstrap, WORDCOUNT_INPUT, lines)
    print(f"fed {sent} lines ({sum(expected.values())} words, {len(expected)} distinct) from {corpus_path} to {WORDCOUNT_INPUT!r}", flush=True)
    return await _watch_counts(bootstrap, expected, stop, workers, timeout_s=args.timeout_s)


@contextlib.asynccontextmanager
async def _worker_processes(args: argparse.Namespace, bootstrap: str, coordinator: str, workdir: Path):
    processes: list[asyncio.subprocess.Process] = []
    try:
        for index in range(args.workers):
            log_file = (workdir / f"worker-{index}.log").open("wb")
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "pystreams",
                "worker",
                str(args.app),
                "--bootstrap-servers",
                bootstrap,
                "--coordinator",
                coordinator,
                "--state-dir",
                str(workdir / f"state-{index}"),
                stdout=log_file,
                stderr=asyncio.subprocess.STDOUT,
            )
            log_file.close()  # the child has its own descriptor
            processes.append(process)
            print(f"worker {index}: pid {process.pid}", flush=True)
        yield processes
    finally:
        for process in processes:
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
        for index, process in enumerate(processes):
            try:
                async with asyncio.timeout(30):
                    status = await process.wait()
            except TimeoutError:
                process.kill()
                status = await process.wait()
            print(f"worker {index}: exited with status {status}", flush=True)


async def _watch_counts(
    bootstrap: str, expected: Mapping[str, int], stop: asyncio.Event, workers: list[asyncio.subprocess.Process], *, timeout_s: float
) -> int:
    loop = asyncio.get_running_loop()
    reader = LatestValueReader(bootstrap, WORDCOUNT_OUTPUT)
    total = sum(expected.values())
    deadline = time.monotonic() + timeout_s
    last_report = 0.0
    try:
        while True:
            counts = await loop.run_in_executor(None, reader.read_more, 0.5)
            counted = sum(counts.get(word, 0) for word in expected)
            done = dict(counts) == dict(expected)
            now = time.monotonic()
            if done or now - last_report >= 1.0:
                last_report = now
                top = ", ".join(f"{w}={c}" for w, c in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:5])
                print(f"progress: {counted}/{total} words counted ({100 * counted // max(total, 1)}%); top: {top}", flush=True)
            if done:
                print(
                    f"{CHECK_OK_PREFIX}: the final counts of {WORDCOUNT_OUTPUT!r} equal a direct Python count of the corpus "
                    f"({len(expected)} distinct words, {total} words)",
                    flush=True,
                )
                return 0
            if stop.is_set():
                print("interrupted before the corpus was fully counted", flush=True)
                return 130
            failed = [p.pid for p in workers if p.returncode is not None]
            if now >= deadline or len(failed) == len(workers):
                wrong = sorted(w for w in set(expected) | set(counts) if counts.get(w) != expected.get(w))
                sample = ", ".join(f"{w}: {counts.get(w)} != {expected.get(w)}" for w in wrong[:5])
                print(f"{CHECK_FAILED_PREFIX}: {len(wrong)} words differ from a direct count of the corpus ({sample})", flush=True)
                return 1
    finally:
        await loop.run_in_executor(None, reader.close)


# --- helpers shared with tests -----------------------------------------------------------------


def count_words(lines: Iterable[str]) -> collections.Counter[str]:
    """What examples/wordcount.py computes: lower-cased, split on whitespace."""
    counts: collections.Counter[str] = collections.Counter()
    for line in lines:
        counts.update(line.lower().split())
    return counts


def ensure_input_topics(bootstrap: str, names: Iterable[str], partitions: int = DEV_INPUT_PARTITIONS) -> list[str]:
    """Create the topics of ``names`` that do not exist; returns those created."""
    from pystreams.cluster import ClusterMetadata, TopicSpec

    with ClusterMetadata(bootstrap) as cluster:
        missing = sorted(set(names) - set(cluster.fetch_topics(names)))
        if missing:
            cluster.ensure_topics([TopicSpec(name, partitions) for name in missing])
    return missing


def produce_lines(bootstrap: str, topic: str, lines: Iterable[str]) -> int:
    """Send each line as a value (key = its line number, which spreads them over partitions)."""
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, acks="all")
    sent = 0
    try:
        for number, line in enumerate(lines):
            producer.send(topic, key=str(number).encode(), value=line.encode("utf-8"))
            sent += 1
        producer.flush()
    finally:
        producer.close()
    return sent


class LatestValueReader:
    """Reads a topic of (UTF-8 key, 8-byte big-endian count) from the beginning, keeping the
    latest value per key — the table a KTable's output topic represents. It reads
    ``read_committed`` behind the transaction filter, so an exactly-once app's aborted writes
    never show (the embedded broker hands them to plain ``read_committed`` readers)."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        from kafka import KafkaConsumer, TopicPartition

        from pystreams.worker.committed_consumer import CommittedConsumer

        self.topic = topic
        self._consumer = CommittedConsumer(
            KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, auto_offset_reset="earliest", group_id=None, isolation_level="read_committed")
        )
        self._assigned = False
        self._topic_partition = TopicPartition
        self.latest: dict[str, int] = {}

    def read_more(self, timeout_s: float) -> dict[str, int]:
        if not self._assigned:
            partitions = self._consumer.partitions_for_topic(self.topic)
            if not partitions:
                time.sleep(timeout_s)
                return dict(self.latest)
            self._consumer.assign([self._topic_partition(self.topic, p) for p in sorted(partitions)])
            self._consumer.seek_to_beginning()
            self._assigned = True
        deadline = time.monotonic() + timeout_s
        while True:
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if remaining_ms <= 0:
                break
            for records in self._consumer.poll(timeout_ms=remaining_ms).values():
                for record in records:
                    if record.key is None:
                        continue
                    word = record.key.decode("utf-8")
                    if record.value is None:
                        self.latest.pop(word, None)
                    else:
                        self.latest[word] = _LONG.unpack(record.value)[0]
        return dict(self.latest)

    def close(self) -> None:
        self._consumer.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pystreams dev", description=HELP)
    configure(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
