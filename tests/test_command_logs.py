"""The long-running commands log no ERROR for what a clean start or stop does (operators grep
for ERROR); ``test_coordinator_failover`` checks a coordinator process's whole log."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import kafka.errors as Errors
import pytest
from kafka.cluster import ClusterMetadata

from pystreams.commands.logs import cancelled_by_close_is_debug


class _Recorder(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextlib.contextmanager
def filtered_log(name: str) -> Iterator[_Recorder]:
    """kafka-python's logger ``name`` at the commands' level, through the filter."""
    logger = logging.getLogger(name)
    recorder = _Recorder()
    recorder.addFilter(cancelled_by_close_is_debug)
    saved_level = logger.level
    logger.addHandler(recorder)
    logger.setLevel(logging.WARNING)
    try:
        yield recorder
    finally:
        logger.removeHandler(recorder)
        logger.setLevel(saved_level)


@pytest.fixture
def kafka_cluster_log() -> Iterator[_Recorder]:
    with filtered_log("kafka.cluster") as recorder:
        yield recorder


def refresh_failing_with(error: Exception) -> None:
    """kafka-python's own metadata refresh, its request failing with ``error`` (what a client's
    close does to a request in flight: ``Cancelled``)."""

    class Manager:
        def least_loaded_node(self) -> int:
            return 0

        def reset_backoff(self, what: str) -> None:
            pass

        async def send(self, request: Any, node_id: int) -> Any:
            raise error

    cluster = ClusterMetadata(bootstrap_servers="127.0.0.1:1")
    cluster._manager = Manager()
    with pytest.raises(type(error)):
        asyncio.run(cluster.refresh_metadata())


def test_a_metadata_refresh_cancelled_by_a_close_is_no_error(kafka_cluster_log: _Recorder) -> None:
    refresh_failing_with(Errors.Cancelled())
    assert [(r.levelname, r.getMessage()) for r in kafka_cluster_log.records] == []


def test_a_metadata_refresh_that_really_failed_is_still_an_error(kafka_cluster_log: _Recorder) -> None:
    refresh_failing_with(Errors.KafkaConnectionError("broker gone"))
    assert [(r.levelname, r.getMessage()) for r in kafka_cluster_log.records] == [("ERROR", "Metadata refresh: failed KafkaConnectionError: broker gone")]


class _Transport:
    """Stands in for kafka-python's transport as its read error's log record names it."""

    def __init__(self, closed: bool) -> None:
        self.closed = closed

    def is_closing(self) -> bool:
        return self.closed

    def __str__(self) -> str:
        return f"<KafkaTCPTransport [none]{' (closed)' if self.closed else ''}>"


def read_error(transport: _Transport) -> list[tuple[str, str]]:
    """kafka-python's own log call for a failed socket read, through the commands' filter."""
    with filtered_log("kafka.net.transport") as recorder:
        try:
            raise OSError(9, "Bad file descriptor")
        except OSError:
            logging.getLogger("kafka.net.transport").exception("%s: Error receiving network data closing socket", transport)
    return [(r.levelname, r.getMessage()) for r in recorder.records]


def test_a_read_racing_the_close_of_its_own_transport_is_no_error() -> None:
    assert read_error(_Transport(closed=True)) == []


def test_a_read_failing_on_an_open_transport_is_still_an_error() -> None:
    assert read_error(_Transport(closed=False)) == [("ERROR", "<KafkaTCPTransport [none]>: Error receiving network data closing socket")]
