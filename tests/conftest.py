"""Fixtures shared by the whole suite: Kafka brokers to test against and unique topic names.

* ``kafka_bootstrap`` — the embedded broker (Tansu, memory storage), one for the session.
* ``docker_kafka_bootstrap`` — Apache Kafka in Docker via testcontainers, one for the session;
  skipped when no Docker engine answers. Tests using it get the ``docker`` marker.
* ``any_kafka`` — runs a test once per available broker: ``embedded`` always, ``docker`` when
  a Docker engine answers (skipped otherwise). It gives a :class:`KafkaUnderTest`, which says
  which broker it is so a test can allow for the embedded broker's documented quirks.
* ``unique_topic`` — a factory of topic names no other test uses.

No broker process outlives the session: an autouse fixture stops every embedded broker the
test process started, even ones a test forgot.
"""

from __future__ import annotations

import functools
import itertools
import os
import re
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from pystreams.broker import EmbeddedBroker, responds_to_kafka, stop_all_brokers

#: Apache Kafka image for the Docker-backed tests (override with this environment variable).
DOCKER_KAFKA_IMAGE = os.environ.get("PYSTREAMS_TEST_KAFKA_IMAGE", "apache/kafka:4.0.0")
DOCKER_KAFKA_STARTUP_TIMEOUT = 120.0


@dataclass(frozen=True)
class KafkaUnderTest:
    """A broker a test runs against: ``kind`` is ``"embedded"`` or ``"docker"``."""

    kind: str
    bootstrap_servers: str

    @property
    def is_embedded(self) -> bool:
        """True on the embedded broker: end offsets, compaction, CreatePartitions... differ."""
        return self.kind == "embedded"


# -- process hygiene ----------------------------------------------------------------------------


@pytest.fixture(scope="session", autouse=True)
def _no_broker_survives_the_session() -> Iterator[None]:
    yield
    stop_all_brokers()


# -- the embedded broker ------------------------------------------------------------------------


@pytest.fixture(scope="session")
def embedded_broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker() as broker:
        yield broker


@pytest.fixture(scope="session")
def kafka_bootstrap(embedded_broker: EmbeddedBroker) -> str:
    """``host:port`` of the session's embedded broker."""
    return embedded_broker.bootstrap_servers


# -- Apache Kafka in Docker ---------------------------------------------------------------------


@functools.cache
def docker_unavailable_reason() -> str | None:
    """None when a Docker engine answers a ping within 2 s, else why not (asked once)."""
    try:
        import docker

        client = docker.from_env(timeout=2)
        try:
            client.ping()
        finally:
            client.close()
    except Exception as error:  # no client library, no socket, daemon down, timeout...
        return f"no Docker engine answers ({type(error).__name__}: {error})".splitlines()[0]
    return None


def _start_docker_kafka() -> tuple[object, str]:
    """Start a single-node KRaft Apache Kafka; return (container, bootstrap servers).

    The client listener must advertise the host-side address, known only once the container
    runs, so the container waits for a start script that we write after start-up (the same
    trick as testcontainers' own Kafka module, which only supports Confluent images).
    """
    from testcontainers.core.container import DockerContainer

    client_port = 9093  # advertised to clients as the host's mapped port
    start_script = "/tmp/pystreams-start.sh"
    container = (
        DockerContainer(DOCKER_KAFKA_IMAGE)
        .with_exposed_ports(client_port)
        .with_env("CLUSTER_ID", "cHlzdHJlYW1zLXRlc3QtMQ")
        .with_env("KAFKA_NODE_ID", "1")
        .with_env("KAFKA_PROCESS_ROLES", "broker,controller")
        .with_env("KAFKA_CONTROLLER_QUORUM_VOTERS", "1@localhost:9094")
        .with_env("KAFKA_CONTROLLER_LISTENER_NAMES", "CONTROLLER")
        .with_env("KAFKA_INTER_BROKER_LISTENER_NAME", "BROKER")
        .with_env(
            "KAFKA_LISTENERS",
            f"CLIENT://0.0.0.0:{client_port},BROKER://0.0.0.0:9092,CONTROLLER://0.0.0.0:9094",
        )
        .with_env(
            "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP",
            "CLIENT:PLAINTEXT,BROKER:PLAINTEXT,CONTROLLER:PLAINTEXT",
        )
        .with_env("KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR", "1")
        .with_env("KAFKA_OFFSETS_TOPIC_NUM_PARTITIONS", "1")
        .with_env("KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR", "1")
        .with_env("KAFKA_TRANSACTION_STATE_LOG_MIN_ISR", "1")
        .with_env("KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS", "0")
        .with_command(["sh", "-c", f"while [ ! -f {start_script} ]; do sleep 0.1; done; exec sh {start_script}"])
    )
    container.start()
    try:
        host = container.get_container_host_ip()
        port = int(container.get_exposed_port(client_port))
        script = f"export KAFKA_ADVERTISED_LISTENERS=CLIENT://{host}:{port},BROKER://localhost:9092\nexec /etc/kafka/docker/run\n"
        _put_file(container, start_script, script.encode())
        deadline = time.monotonic() + DOCKER_KAFKA_STARTUP_TIMEOUT
        while not _docker_kafka_serves(f"{host}:{port}", host, port):
            if time.monotonic() >= deadline:
                stdout, stderr = container.get_logs()  # type: ignore[attr-defined]
                tail = (stdout + stderr).decode(errors="replace").splitlines()[-20:]
                raise RuntimeError(f"{DOCKER_KAFKA_IMAGE} did not serve within {DOCKER_KAFKA_STARTUP_TIMEOUT:g} s:\n" + "\n".join(tail))
            time.sleep(0.5)
    except BaseException:
        container.stop()
        raise
    return container, f"{host}:{port}"


def _put_file(container: object, path: str, content: bytes) -> None:
    import io
    import tarfile

    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        info = tarfile.TarInfo(name=path.lstrip("/"))
        info.size = len(content)
        info.mode = 0o755
        info.mtime = int(time.time())
        tar.addfile(info, io.BytesIO(content))
    container.get_wrapped_container().put_archive("/", archive.getvalue())  # type: ignore[attr-defined]


def _docker_kafka_serves(bootstrap: str, host: str, port: int) -> bool:
    """ApiVersions answers, and the metadata lists a broker (KRaft start-up has finished)."""
    if not responds_to_kafka(host, port, timeout=2.0):
        return False
    from kafka.admin import KafkaAdminClient

    try:
        admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5000)
    except Exception:
        return False
    try:
        return bool(admin.describe_cluster().get("brokers"))
    except Exception:
        return False
    finally:
        admin.close()


@pytest.fixture(scope="session")
def docker_kafka_bootstrap() -> Iterator[str]:
    """``host:port`` of an Apache Kafka container; skips the test when Docker is unavailable."""
    reason = docker_unavailable_reason()
    if reason is not None:
        pytest.skip(f"Apache Kafka in Docker: {reason}")
    container, bootstrap = _start_docker_kafka()
    try:
        yield bootstrap
    finally:
        container.stop()  # type: ignore[attr-defined]


# -- every available broker ---------------------------------------------------------------------


@pytest.fixture(
    scope="session",
    params=["embedded", pytest.param("docker", marks=pytest.mark.docker)],
)
def any_kafka(request: pytest.FixtureRequest) -> KafkaUnderTest:
    """Each available broker in turn; the ``docker`` case skips without a Docker engine."""
    if request.param == "embedded":
        return KafkaUnderTest("embedded", request.getfixturevalue("kafka_bootstrap"))
    return KafkaUnderTest("docker", request.getfixturevalue("docker_kafka_bootstrap"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # A test that asks for the Docker broker directly needs Docker, so say so with the marker
    # (``-m "not docker"`` then deselects it like the ``any_kafka[docker]`` cases).
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if "docker_kafka_bootstrap" in fixtures:
            item.add_marker(pytest.mark.docker)
        # ``make test`` runs two pytest-xdist workers (``--dist loadgroup``): the Spark tests
        # share one worker, so one JVM runs at a time and the Spark session starts once; the
        # other worker runs the rest meanwhile.
        if "spark" in fixtures or item.path.name.startswith("test_spark_"):
            item.add_marker(pytest.mark.xdist_group("spark"))


# -- topic names --------------------------------------------------------------------------------

_topic_counter = itertools.count()
_NOT_IN_TOPIC_NAMES = re.compile(r"[^a-zA-Z0-9._-]+")


@pytest.fixture
def unique_topic(request: pytest.FixtureRequest) -> Callable[[str], str]:
    """A factory: ``unique_topic("orders")`` -> a legal topic name no other call returns.

    Names carry the test's name so a broker's topic list tells which test made what.
    """
    test_name = _NOT_IN_TOPIC_NAMES.sub("-", request.node.name).strip("-.")[:80]

    def make(label: str = "topic") -> str:
        label = _NOT_IN_TOPIC_NAMES.sub("-", label)[:40]
        return f"{test_name}.{label}.{next(_topic_counter)}-{uuid.uuid4().hex[:8]}"

    return make


# -- Spark --------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local Spark session (≈ 5 s to start) shared by every Spark test module."""
    pytest.importorskip("pyspark")
    from pystreams.spark.session import local_session

    session = local_session("local[2]", "pystreams-tests")
    yield session
    session.stop()
