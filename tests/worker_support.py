"""Shared by the worker-process tests: a broker and coordinator per test, and a fleet of
``pystreams worker`` processes with their logs."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from pystreams.broker import EmbeddedBroker, free_port

COMMIT_INTERVAL_MS = 200


class Cluster:
    """A fresh embedded broker and a coordinator process (short session timeouts). With
    ``log="kafka"`` the coordinator keeps its records on the broker, so it can be killed and
    started again (``kill_coordinator``, ``start_coordinator``) without losing a group."""

    #: Heartbeats every 300 ms, sessions of 3 s: group changes take moments in tests.
    FAST_GROUP_ARGS = ("--heartbeat-interval-ms", "300", "--session-timeout-ms", "3000", "--metadata-refresh-ms", "500")

    def __init__(self, tmp_path: Path, *, log: str = "memory", group_args: Sequence[str] = FAST_GROUP_ARGS) -> None:
        self.group_args = tuple(group_args)
        self.broker = EmbeddedBroker(port=None)
        self.broker.start()
        self.port = free_port()
        self.log_kind = log
        self._log = (tmp_path / "coordinator.log").open("ab")
        self.bootstrap = self.broker.bootstrap_servers
        self.coordinator_address = f"127.0.0.1:{self.port}"
        self.coordinator: subprocess.Popen[bytes] | None = None
        try:
            self.start_coordinator()
        except BaseException:
            self.stop()
            raise

    def start_coordinator(self) -> None:
        self.coordinator = subprocess.Popen(
            [sys.executable, "-m", "pystreams", "coordinator", "--log", self.log_kind,
             "--bootstrap-servers", self.broker.bootstrap_servers, "--listen", f"127.0.0.1:{self.port}",
             *self.group_args],
            stdout=self._log, stderr=subprocess.STDOUT,
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

    def start(self, *extra_args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        index = len(self.processes)
        log = (self.tmp_path / f"worker-{index}.log").open("wb")
        process = subprocess.Popen(
            [sys.executable, "-m", "pystreams", "worker", str(self.app), "--bootstrap-servers", self.bootstrap,
             "--coordinator", self.coordinator, "--state-dir", str(self.tmp_path / f"state-{index}"),
             "--commit-interval-ms", str(COMMIT_INTERVAL_MS), *extra_args],
            stdout=log, stderr=subprocess.STDOUT, env=None if env is None else {**os.environ, **env},
        )
        log.close()
        self.processes.append(process)
        return process

    def log_tails(self, lines: int = 25) -> str:
        """The end of every worker's log, for failure messages."""
        return "\n".join(
            f"--- worker {i} ---\n" + "\n".join(self.log(i).splitlines()[-lines:]) for i in range(len(self.processes))
        )

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
