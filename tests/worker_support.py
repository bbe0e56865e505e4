"""Shared by the worker-process tests: a broker and coordinator per test, and a fleet of
``pystreams worker`` processes with their logs."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from pystreams.broker import EmbeddedBroker, free_port

COMMIT_INTERVAL_MS = 200
#: ``tests/apps/ha_keys.py``'s input topic.
HA_KEYS_INPUT = "ha-keys-in"


class Cluster:
    """A fresh embedded broker and a coordinator process (short session timeouts). With
    ``log="kafka"`` the coordinator keeps its records on the broker, so it can be killed and
    started again (``kill_coordinator``, ``start_coordinator``) without losing a group."""

    #: Heartbeats every 300 ms, sessions of 3 s: group changes take moments in tests.
    FAST_GROUP_ARGS = ("--heartbeat-interval-ms", "300", "--session-timeout-ms", "3000", "--metadata-refresh-ms", "500")

    def __init__(self, tmp_path: Path, *, log: str = "memory", bootstrap: str | None = None, group_args: Sequence[str] = FAST_GROUP_ARGS) -> None:
        # ``bootstrap``: an existing Kafka cluster (Apache Kafka in Docker) instead of a fresh
        # embedded broker; the test then owns nothing of it but its own topics.
        self.group_args = tuple(group_args)
        self.broker: EmbeddedBroker | None = None
        if bootstrap is None:
            self.broker = EmbeddedBroker(port=None)
            self.broker.start()
            bootstrap = self.broker.bootstrap_servers
        self.port = free_port()
        self.log_kind = log
        self._log = (tmp_path / "coordinator.log").open("ab")
        self.bootstrap = bootstrap
        self.coordinator_address = f"127.0.0.1:{self.port}"
        self.coordinator: subprocess.Popen[bytes] | None = None
        try:
            self.start_coordinator()
        except BaseException:
            self.stop()
            raise

    def start_coordinator(self) -> None:
        self.coordinator = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pystreams",
                "coordinator",
                "--log",
                self.log_kind,
                "--bootstrap-servers",
                self.bootstrap,
                "--listen",
                f"127.0.0.1:{self.port}",
                *self.group_args,
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        wait_for(lambda: listening(self.port), 20, "the coordinator to listen")

    def kill_coordinator(self) -> None:
        assert self.coordinator is not None
        self.coordinator.kill()
        self.coordinator.wait(10)
        wait_for(lambda: not listening(self.port), 10, "the coordinator's port to close")

    def stop(self) -> None:
        if self.coordinator is not None and self.coordinator.poll() is None:
            self.coordinator.terminate()
            try:
                self.coordinator.wait(10)
            except subprocess.TimeoutExpired:
                self.coordinator.kill()
        self._log.close()
        if self.broker is not None:
            self.broker.stop()


def listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def wait_for(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


class Workers:
    def __init__(self, bootstrap: str, coordinator: str, tmp_path: Path, app: Path) -> None:
        self.bootstrap, self.coordinator, self.tmp_path, self.app = bootstrap, coordinator, tmp_path, app
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(self, *extra_args: str, state_of: int | None = None, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        """Start a worker (logging to ``worker-<index>.log``); ``state_of`` reuses the state
        directory of an earlier worker, as a restarted one would; ``env`` adds variables."""
        index = len(self.processes)
        log = (self.tmp_path / f"worker-{index}.log").open("wb")
        state = index if state_of is None else state_of
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pystreams",
                "worker",
                str(self.app),
                "--bootstrap-servers",
                self.bootstrap,
                "--coordinator",
                self.coordinator,
                "--state-dir",
                str(self.tmp_path / f"state-{state}"),
                "--commit-interval-ms",
                str(COMMIT_INTERVAL_MS),
                *extra_args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=None if env is None else {**os.environ, **env},
        )
        log.close()
        self.processes.append(process)
        return process

    def log_tails(self, lines: int = 25) -> str:
        """The end of every worker's log, for failure messages."""
        return "\n".join(f"--- worker {i} ---\n" + "\n".join(self.log(i).splitlines()[-lines:]) for i in range(len(self.processes)))

    def log(self, index: int) -> str:
        return (self.tmp_path / f"worker-{index}.log").read_text(errors="replace")

    def stop_all(self, indexes: Sequence[int] | None = None) -> list[int]:
        chosen = [self.processes[i] for i in (range(len(self.processes)) if indexes is None else indexes)]
        for process in chosen:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        codes = []
        for process in chosen:
            try:
                codes.append(process.wait(20))
            except subprocess.TimeoutExpired:
                process.kill()
                codes.append(process.wait())
        return codes


def fleet_of(workers: Workers) -> Iterator[Workers]:
    """For fixtures: yields the fleet, stops whatever still runs afterwards."""
    try:
        yield workers
    finally:
        workers.stop_all()


class Trickle:
    """Feeds lines to ``topic`` a few at a time from a thread, so input flows throughout."""

    def __init__(self, bootstrap: str, lines: list[str], *, topic: str = "text-lines", per_batch: int = 20, pause_s: float = 0.1) -> None:
        from pystreams.commands.dev import produce_lines

        self._produce = produce_lines
        self._bootstrap, self._topic, self._lines = bootstrap, topic, lines
        self._per_batch, self._pause_s = per_batch, pause_s
        self.sent = 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while self.sent < len(self._lines):
            batch = self._lines[self.sent : self.sent + self._per_batch]
            self._produce(self._bootstrap, self._topic, batch)
            self.sent += len(batch)
            time.sleep(self._pause_s)

    def join(self) -> None:
        self._thread.join(180)
        assert self.sent == len(self._lines)


class CommandTicker:
    """Keeps writing one small command per partition of ``tests/apps/ha_keys.py``'s input every
    50 ms, recording nothing: its progress topic tells which task processed what and when (the
    commands' versions start above ``FIRST_VERSION``)."""

    FIRST_VERSION = 1_000

    def __init__(self, bootstrap: str, partitions: int) -> None:
        from kafka import KafkaProducer

        self._producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
        self._partitions = partitions
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.sent = 0

    def _run(self) -> None:
        version = self.FIRST_VERSION
        while not self._stop.wait(0.05):
            version += 1
            for partition in range(self._partitions):
                self._producer.send(HA_KEYS_INPUT, key=b"tick", value=f"{partition * 1_000_000} 1 {version}".encode(), partition=partition)
                self.sent += 1

    def __enter__(self) -> CommandTicker:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()
        self._producer.flush()
        self._producer.close()
