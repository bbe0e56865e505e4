"""The embedded broker launcher and the ``pystreams broker`` command, against real processes."""

from __future__ import annotations

import argparse
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import pystreams.broker as broker_module
from pystreams.broker import (
    BrokerStartError,
    EmbeddedBroker,
    free_port,
    responds_to_kafka,
    running_brokers,
)
from pystreams.cluster import ClusterMetadata, TopicSpec
from pystreams.commands import broker as broker_command

pytestmark = pytest.mark.integration


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def occupied_port() -> Iterator[int]:
    """A loopback port held by a listening socket that never speaks Kafka."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


# -- EmbeddedBroker ------------------------------------------------------------------------------


def test_broker_starts_answers_kafka_and_stops() -> None:
    broker = EmbeddedBroker().start()
    try:
        pid = broker.pid
        assert pid is not None and _process_exists(pid)
        assert broker.bootstrap_servers == f"127.0.0.1:{broker.port}"
        assert responds_to_kafka(broker.host, broker.port)
        assert broker in running_brokers()
        log_path = broker.log_path
        assert log_path is not None and "tansu" in log_path.read_text()
    finally:
        broker.stop()
    assert not broker.is_running()
    assert not _process_exists(pid)  # reaped, not a zombie
    assert not responds_to_kafka(broker.host, broker.port, timeout=0.5)
    assert broker not in running_brokers()
    assert not log_path.exists(), "the temporary log is removed on stop"
    broker.stop()  # idempotent


def test_stop_kills_a_broker_that_clients_are_connected_to() -> None:
    # Tansu's SIGTERM waits for connected clients; stop() must not leave it running anyway.
    from kafka import KafkaProducer

    with EmbeddedBroker() as broker:
        producer = KafkaProducer(bootstrap_servers=broker.bootstrap_servers)
        try:
            producer.send("connected", b"x").get(timeout=10)
            pid = broker.pid
            assert pid is not None
            broker.stop()
            assert not _process_exists(pid)
        finally:
            producer.close(timeout=1)


def test_context_manager_and_given_port_and_log_file(tmp_path: Path) -> None:
    port = free_port()
    log_file = tmp_path / "logs" / "broker.log"
    with EmbeddedBroker(port, log_path=log_file) as broker:
        assert broker.port == port
        assert responds_to_kafka("127.0.0.1", port)
    assert not broker.is_running()
    assert f"127.0.0.1:{port}" in log_file.read_text(), "a given log file is kept"


def test_a_given_port_in_use_is_a_clear_error(occupied_port: int) -> None:
    brokers_before = set(running_brokers())
    with pytest.raises(BrokerStartError, match=rf"127\.0\.0\.1:{occupied_port} is already in use"):
        EmbeddedBroker(occupied_port).start()
    assert set(running_brokers()) == brokers_before


def test_a_free_port_lost_to_another_process_is_replaced(occupied_port: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # Simulate the race: the "free" port is taken before the broker binds it.
    real_free_port = broker_module.free_port
    offered: list[int] = []

    def racy_free_port(host: str = "127.0.0.1") -> int:
        port = occupied_port if not offered else real_free_port(host)
        offered.append(port)
        return port

    monkeypatch.setattr(broker_module, "free_port", racy_free_port)
    with EmbeddedBroker() as broker:
        assert offered[0] == occupied_port
        assert broker.port != occupied_port
        assert broker.port == offered[-1]
        assert responds_to_kafka(broker.host, broker.port)


def test_start_failure_reports_the_binary_output(tmp_path: Path) -> None:
    fake_binary = tmp_path / "fake-broker"
    fake_binary.write_text("#!/bin/sh\necho 'simulated failure: no storage' >&2\nexit 3\n")
    fake_binary.chmod(0o755)
    brokers_before = set(running_brokers())
    with pytest.raises(BrokerStartError) as caught:
        EmbeddedBroker(binary=fake_binary, startup_timeout=5).start()
    message = str(caught.value)
    assert "status 3" in message
    assert "simulated failure: no storage" in message
    assert set(running_brokers()) == brokers_before


def test_start_gives_up_after_the_timeout(tmp_path: Path) -> None:
    # A "broker" that runs but never listens: start() must stop waiting and clean up.
    silent_binary = tmp_path / "silent-broker"
    silent_binary.write_text("#!/bin/sh\necho 'starting slowly'\nexec sleep 60\n")
    silent_binary.chmod(0o755)
    broker = EmbeddedBroker(binary=silent_binary, startup_timeout=1)
    with pytest.raises(BrokerStartError, match="did not answer Kafka requests") as caught:
        broker.start()
    assert "starting slowly" in str(caught.value)
    assert not broker.is_running()
    assert broker not in running_brokers()


# -- produce and consume on every available broker ---------------------------------------------


def test_produce_and_consume_round_trip(any_kafka, unique_topic: Callable[..., str]) -> None:
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    topic = unique_topic("records")
    with ClusterMetadata(any_kafka.bootstrap_servers) as cluster:
        cluster.ensure_topics([TopicSpec(topic, num_partitions=2)])

    sent = [(partition, f"key-{i}".encode(), (None if i == 4 else f"value-{i}".encode())) for i, partition in enumerate([0, 1, 0, 1, 0])]
    producer = KafkaProducer(bootstrap_servers=any_kafka.bootstrap_servers, acks="all")
    try:
        for partition, key, value in sent:
            producer.send(topic, key=key, value=value, partition=partition, headers=[("source", b"test")]).get(timeout=10)
    finally:
        producer.close(timeout=5)

    consumer = KafkaConsumer(
        bootstrap_servers=any_kafka.bootstrap_servers,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    try:
        consumer.assign([TopicPartition(topic, 0), TopicPartition(topic, 1)])
        received = []
        deadline = time.monotonic() + 20
        while len(received) < len(sent) and time.monotonic() < deadline:
            for batch in consumer.poll(timeout_ms=500).values():
                received.extend(batch)
    finally:
        consumer.close()

    by_partition = lambda rows: sorted(rows, key=lambda row: (row[0], row[1]))  # noqa: E731
    assert by_partition((r.partition, r.key, r.value) for r in received) == by_partition(sent)
    assert all(list(r.headers) == [("source", b"test")] for r in received)
    for partition in (0, 1):
        offsets = [r.offset for r in received if r.partition == partition]
        assert offsets == list(range(len(offsets))), "offsets start at 0 and have no gaps"


# -- the ``pystreams broker`` command --------------------------------------------------------


def _start_command(*arguments: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "pystreams.commands.broker", *arguments],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )


def _finish(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.kill()
    process.wait(timeout=10)
    if process.stderr is not None:
        process.stderr.close()


def _read_bootstrap_line(process: subprocess.Popen[str], timeout: float) -> str:
    """The address the command announces; fails with its stderr if it never does."""
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert process.stdout is not None
        with process.stdout:  # closed here, at end of output, so no other reader races it
            for line in process.stdout:
                lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + timeout
    while (remaining := deadline - time.monotonic()) > 0:
        try:
            line = lines.get(timeout=remaining)
        except queue.Empty:
            break
        if line is None:
            break
        if line.startswith(broker_command.BOOTSTRAP_LINE_PREFIX):
            return line.removeprefix(broker_command.BOOTSTRAP_LINE_PREFIX).strip()
    process.kill()
    process.wait(timeout=10)
    stderr = process.stderr.read() if process.stderr else ""
    pytest.fail(f"the broker command announced no address; stderr:\n{stderr}")


@pytest.mark.parametrize("stop_signal", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_broker_command_serves_and_stops_on_signal(stop_signal: signal.Signals) -> None:
    from kafka import KafkaProducer

    port = free_port()
    process = _start_command("--port", str(port))
    try:
        bootstrap = _read_bootstrap_line(process, timeout=30)
        assert bootstrap == f"127.0.0.1:{port}"
        producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all")
        try:
            metadata = producer.send("from-the-command", b"hello").get(timeout=10)
        finally:
            producer.close(timeout=5)
        assert metadata.topic == "from-the-command" and metadata.offset == 0

        process.send_signal(stop_signal)
        returncode = process.wait(timeout=15)
        stderr = process.stderr.read() if process.stderr else ""
        assert returncode == 0, stderr
        assert not responds_to_kafka("127.0.0.1", port, timeout=0.5), "the broker went with it"
    finally:
        _finish(process)


def test_broker_command_takes_its_port_from_the_environment() -> None:
    port = free_port()
    process = _start_command(env={broker_command.PORT_ENV: str(port)})
    try:
        assert _read_bootstrap_line(process, timeout=30) == f"127.0.0.1:{port}"
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=15) == 0
    finally:
        _finish(process)


def _parse(arguments: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="pystreams broker")
    broker_command.configure(parser)
    return parser.parse_args(arguments)


def test_broker_command_options_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(broker_command.PORT_ENV, raising=False)
    monkeypatch.delenv(broker_command.STARTUP_TIMEOUT_ENV, raising=False)
    assert _parse([]).port == broker_command.DEFAULT_PORT

    monkeypatch.setenv(broker_command.PORT_ENV, "19999")
    monkeypatch.setenv(broker_command.STARTUP_TIMEOUT_ENV, "2.5")
    assert _parse([]).port == 19999
    assert _parse([]).startup_timeout == 2.5
    assert _parse(["--port", "0"]).port == 0, "the option wins over the variable"

    monkeypatch.setenv(broker_command.PORT_ENV, "not-a-port")
    with pytest.raises(SystemExit):
        _parse([])
    with pytest.raises(SystemExit):
        _parse(["--port", "70000"])


def test_broker_command_reports_a_port_in_use(occupied_port: int, capsys: pytest.CaptureFixture[str]) -> None:
    assert broker_command.main(["--port", str(occupied_port)]) == 1
    assert f"127.0.0.1:{occupied_port} is already in use" in capsys.readouterr().err
