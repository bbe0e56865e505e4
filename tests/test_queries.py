"""Interactive queries end to end, without a broker: real ``QueryServer``s on loopback in front
of fake stream threads (a dict per task), asked through ``QueryClient``, ``App.query`` and the
``pystreams query`` command.

Covered: routing by the assignment's PartitionsByHost whichever worker is asked first, missing
keys (404 / ``KeyNotFound`` / ``None`` / exit 1), restoring and unhosted tasks (503 /
``NotAvailableYet`` / exit 3, and a retry that succeeds once restoring ends), stale reads from
standby replicas, bad requests (400 with a JSON reason, the server still serving afterwards)
and ``queryable_stores``.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import re
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from pystreams.assignors.streams import StreamsAssignmentMetadata
from pystreams.topology.ir import TaskId
from pystreams.topology.resolve import resolve

from pystreams.app import load_app
from pystreams.broker import free_port
from pystreams.cli import main as cli_main
from pystreams.queries import KeyNotFound, NotAvailableYet, QueryClient, QueryError
from pystreams.worker.packing import partition_for_key
from pystreams.worker.queries import QueryServer, queryable_stores

ROOT = Path(__file__).resolve().parent.parent
APP_PATH = Path(__file__).resolve().parent / "apps" / "ha_keys.py"
APP = load_app(str(APP_PATH))
TOPOLOGY = APP.topology()
INPUT_TOPIC = "ha-keys-in"
PARTITIONS = 4
STORE = "keys"
KEY_SERDE = TOPOLOGY.stores[STORE].key_serde
VALUE_SERDE = TOPOLOGY.stores[STORE].value_serde
RESOLVED = resolve(TOPOLOGY, {INPUT_TOPIC: PARTITIONS})
SUBTOPOLOGY = TOPOLOGY.stores[STORE].subtopology
TASKS = [TaskId(SUBTOPOLOGY, p) for p in range(PARTITIONS)]

# Worker "a" runs tasks 0 and 1 and replicates 2 and 3; worker "b" the other way round.
ACTIVE_TASKS = {"a": TASKS[:2], "b": TASKS[2:]}
STANDBY_TASKS = {"a": TASKS[2:], "b": TASKS[:2]}


def _keys_by_partition(prefix: str) -> dict[int, str]:
    """One text key per partition of the input topic (as Kafka's partitioner places them)."""
    found: dict[int, str] = {}
    index = 0
    while len(found) < PARTITIONS:
        key = f"{prefix}{index}"
        found.setdefault(partition_for_key(KEY_SERDE.serialize(key), PARTITIONS), key)
        index += 1
    return found


#: Keys with a value in their task's store, and keys without one.
PRESENT = _keys_by_partition("k")
MISSING = _keys_by_partition("absent-")


def active_value(partition: int) -> int:
    return 100 + partition


def standby_value(partition: int) -> int:
    """Standby replicas lag behind: they hold an older value, so a test can tell who answered."""
    return -(100 + partition)


# -- fake stream threads --------------------------------------------------------------------------


class FakeStreamThread:
    """What ``QueryServer`` uses of a ``StreamThread``: ``assignment``, ``restoring`` and
    ``read_store``, with the same rules as the real one (a restoring active task is not
    readable; standby replicas answer only when asked for stale reads)."""

    def __init__(
        self,
        assignment: StreamsAssignmentMetadata,
        active: dict[TaskId, dict[str, dict[bytes, bytes]]],
        standby: dict[TaskId, dict[str, dict[bytes, bytes]]],
    ) -> None:
        self.assignment = assignment
        self.active = active
        self.standby = standby
        self.restoring_tasks: set[TaskId] = set()
        #: When set: how many more times ``restoring`` is looked at before restoring ends.
        self.restoring_checks_left: int | None = None
        self.restoring_checks = 0
        #: (task, store, key, include_standby) of every read_store call.
        self.reads: list[tuple[TaskId, str, bytes, bool]] = []

    @property
    def restoring(self) -> frozenset[TaskId]:
        self.restoring_checks += 1
        if self.restoring_checks_left is not None:
            if self.restoring_checks_left <= 0:
                self.restoring_tasks.clear()
            self.restoring_checks_left -= 1
        return frozenset(self.restoring_tasks)

    async def read_store(self, task: TaskId, store: str, key: bytes, *, include_standby: bool) -> tuple[bool, bytes | None]:
        self.reads.append((task, store, key, include_standby))
        if task in self.active and task not in self.restoring_tasks:
            return True, self.active[task][store].get(key)
        if include_standby and task in self.standby:
            return True, self.standby[task][store].get(key)
        return False, None

    async def read_store_with(self, task: TaskId, store: str, read, *, include_standby: bool):
        # Scans only (the dicts stand in for key-value stores): key order, as a store gives it.
        self.reads.append((task, store, b"", include_standby))
        if task in self.active and task not in self.restoring_tasks:
            return True, read(SortedKeyValues(self.active[task][store]))
        if include_standby and task in self.standby:
            return True, read(SortedKeyValues(self.standby[task][store]))
        return False, None

    def tasks_read(self, *, include_standby: bool | None = None) -> set[TaskId]:
        return {task for task, _, _, stale in self.reads if include_standby is None or stale == include_standby}


class SortedKeyValues:
    """A dict read as a key-value store's range and prefix scans read."""

    def __init__(self, entries: dict[bytes, bytes]) -> None:
        self.entries = dict(sorted(entries.items()))

    def range(self, key_from: bytes | None, key_to: bytes | None) -> Iterator[tuple[bytes, bytes]]:
        return ((k, v) for k, v in self.entries.items() if (key_from is None or k >= key_from) and (key_to is None or k <= key_to))

    def prefix_scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        return ((k, v) for k, v in self.entries.items() if k.startswith(prefix))


def _store_contents(tasks: Iterable[TaskId], value_of: Callable[[int], int]) -> dict[TaskId, dict[str, dict[bytes, bytes]]]:
    return {task: {STORE: {KEY_SERDE.serialize(PRESENT[task.partition]): VALUE_SERDE.serialize(value_of(task.partition))}} for task in tasks}


# -- servers on an event loop in a background thread ------------------------------------------------


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    event_loop = asyncio.new_event_loop()
    runner = threading.Thread(target=event_loop.run_forever, name="query-servers", daemon=True)
    runner.start()
    yield event_loop
    event_loop.call_soon_threadsafe(event_loop.stop)
    runner.join(5)
    event_loop.close()


def _start_server(loop: asyncio.AbstractEventLoop, resolved, threads) -> QueryServer:
    for _ in range(5):  # a free port may be taken before we bind it
        server = QueryServer(resolved, threads, f"127.0.0.1:{free_port()}")
        try:
            asyncio.run_coroutine_threadsafe(server.start(), loop).result(5)
        except OSError:
            continue
        return server
    raise RuntimeError("no free port for a query server")


@dataclass
class Cluster:
    endpoints: dict[str, str]
    threads: dict[str, FakeStreamThread]

    def owner_of(self, partition: int) -> str:
        return next(name for name, tasks in ACTIVE_TASKS.items() if TASKS[partition] in tasks)

    def other_than(self, name: str) -> str:
        return next(other for other in self.endpoints if other != name)


@pytest.fixture
def cluster_factory(loop) -> Iterator[Callable[..., Cluster]]:
    """Two workers sharing one assignment; ``unhosted`` partitions are in no worker's
    PartitionsByHost (their task is moving)."""
    servers: list[QueryServer] = []

    def make(unhosted: Iterable[int] = ()) -> Cluster:
        for _ in range(5):  # a free port may be taken before we bind it
            try:
                return make_once(set(unhosted))
            except OSError:
                continue
        raise RuntimeError("no free ports for the query servers")

    def make_once(unhosted: set[int]) -> Cluster:
        ports = {name: free_port() for name in ACTIVE_TASKS}
        if len(set(ports.values())) < len(ports):
            raise OSError("the same free port twice")
        endpoints = {name: f"127.0.0.1:{port}" for name, port in ports.items()}

        def by_host(tasks: dict[str, list[TaskId]]) -> dict[str, list[tuple[str, int]]]:
            return {endpoints[name]: [(INPUT_TOPIC, t.partition) for t in owned if t.partition not in unhosted] for name, owned in tasks.items()}

        threads = {}
        for name in ACTIVE_TASKS:
            active = [t for t in ACTIVE_TASKS[name] if t.partition not in unhosted]
            assignment = StreamsAssignmentMetadata(
                active_tasks=tuple(active),
                standby_tasks=tuple(STANDBY_TASKS[name]),
                partitions_by_host=by_host(ACTIVE_TASKS),
                standby_partitions_by_host=by_host(STANDBY_TASKS),
            )
            threads[name] = FakeStreamThread(
                assignment,
                active=_store_contents(active, active_value),
                standby=_store_contents(STANDBY_TASKS[name], standby_value),
            )
        started: list[QueryServer] = []
        try:
            for name, endpoint in endpoints.items():
                server = QueryServer(RESOLVED, [threads[name]], endpoint)
                asyncio.run_coroutine_threadsafe(server.start(), loop).result(5)
                started.append(server)
        except OSError:
            for server in started:
                asyncio.run_coroutine_threadsafe(server.stop(), loop).result(5)
            raise
        servers.extend(started)
        return Cluster(endpoints=endpoints, threads=threads)

    yield make
    for server in servers:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(5)


@pytest.fixture
def cluster(cluster_factory) -> Cluster:
    return cluster_factory()


def raw_get(endpoint: str, target: str, method: str = "GET") -> tuple[int, str, bytes]:
    """(status, content type, body) of one request, whatever the status."""
    host, _, port = endpoint.rpartition(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=5)
    try:
        connection.request(method, target)
        response = connection.getresponse()
        return response.status, response.getheader("Content-Type", ""), response.read()
    finally:
        connection.close()


def key_hex(key: str) -> str:
    return KEY_SERDE.serialize(key).hex()


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    code = cli_main(["query", str(APP_PATH), *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# -- 1. routing, found and missing keys -------------------------------------------------------------


@pytest.mark.parametrize("asked", ["a", "b"])
def test_every_key_is_read_from_its_owner_whichever_worker_is_asked(cluster, asked):
    client = QueryClient([cluster.endpoints[asked]])
    for partition, key in PRESENT.items():
        assert client.get(STORE, key, KEY_SERDE, VALUE_SERDE) == active_value(partition)
    for name, thread in cluster.threads.items():
        # Each worker was asked only about its own active tasks, and never for stale reads.
        assert thread.tasks_read() == set(ACTIVE_TASKS[name])
        assert thread.tasks_read(include_standby=True) == set()


def test_get_bytes_returns_the_stores_serialized_value(cluster):
    partition = 3
    value = QueryClient([cluster.endpoints["a"]]).get_bytes(STORE, KEY_SERDE.serialize(PRESENT[partition]))
    assert value == VALUE_SERDE.serialize(active_value(partition))


def test_metadata_endpoint_serves_the_assignments_routing_table(cluster):
    metadata = QueryClient([cluster.endpoints["b"]]).metadata()
    assert metadata["endpoint"] == cluster.endpoints["b"]
    assert metadata["stores"] == {STORE: {"topic": INPUT_TOPIC, "partitions": PARTITIONS, "kind": "key-value", "subtopology": SUBTOPOLOGY}}
    assert metadata["active"] == {cluster.endpoints[name]: [[INPUT_TOPIC, t.partition] for t in tasks] for name, tasks in ACTIVE_TASKS.items()}
    assert metadata["standby"] == {cluster.endpoints[name]: [[INPUT_TOPIC, t.partition] for t in tasks] for name, tasks in STANDBY_TASKS.items()}


def test_client_skips_an_unreachable_endpoint_for_metadata(cluster):
    dead = f"127.0.0.1:{free_port()}"
    client = QueryClient([dead, cluster.endpoints["a"]], request_timeout_s=2)
    assert client.get(STORE, PRESENT[2], KEY_SERDE, VALUE_SERDE) == active_value(2)


def test_client_routes_with_a_worker_that_has_an_assignment_when_the_first_has_none(cluster, loop):
    unassigned = _start_server(loop, RESOLVED, [])  # a worker that just started
    try:
        client = QueryClient([unassigned.endpoint, cluster.endpoints["a"]], request_timeout_s=2)
        assert client.metadata()["active"], "the routing of the worker that has an assignment"
        assert client.get(STORE, PRESENT[3], KEY_SERDE, VALUE_SERDE, timeout_s=1) == active_value(3)
    finally:
        asyncio.run_coroutine_threadsafe(unassigned.stop(), loop).result(5)


def test_client_with_only_unreachable_endpoints_raises_query_error():
    client = QueryClient([f"127.0.0.1:{free_port()}"], request_timeout_s=2)
    with pytest.raises(QueryError, match="no worker answered"):
        client.get_bytes(STORE, b"k0", timeout_s=0.1)


def test_client_needs_an_endpoint():
    with pytest.raises(ValueError):
        QueryClient([])


@pytest.mark.parametrize("partition", range(PARTITIONS))
def test_missing_key_raises_key_not_found_from_its_owner(cluster, partition):
    key = MISSING[partition]
    with pytest.raises(KeyNotFound):
        QueryClient([cluster.endpoints["a"]]).get(STORE, key, KEY_SERDE, VALUE_SERDE, timeout_s=0.1)
    owner = cluster.threads[cluster.owner_of(partition)]
    assert owner.reads == [(TASKS[partition], STORE, KEY_SERDE.serialize(key), False)]


def test_missing_key_is_a_404_with_a_json_reason(cluster):
    owner = cluster.owner_of(1)
    status, content_type, body = raw_get(cluster.endpoints[owner], f"/v1/stores/{STORE}/{key_hex(MISSING[1])}")
    assert status == 404
    assert content_type == "application/json"
    assert STORE in json.loads(body)["error"]


def test_app_query_returns_the_value_or_none(cluster):
    endpoint = cluster.endpoints["b"]
    assert APP.query(STORE, PRESENT[0], endpoints=endpoint) == active_value(0)
    assert APP.query(STORE, PRESENT[3], endpoints=[endpoint]) == active_value(3)
    assert APP.query(STORE, MISSING[0], endpoints=endpoint) is None


def test_app_query_reads_endpoints_from_a_comma_separated_string_or_the_environment(cluster, monkeypatch):
    dead = f"127.0.0.1:{free_port()}"
    listing = f" {dead} , {cluster.endpoints['a']} ,"
    assert APP.query(STORE, PRESENT[1], endpoints=listing) == active_value(1)
    monkeypatch.setenv("PYSTREAMS_QUERY_ENDPOINTS", f"{cluster.endpoints['b']},")
    assert APP.query(STORE, PRESENT[2]) == active_value(2)


def test_app_query_refuses_a_store_the_app_does_not_have(cluster):
    with pytest.raises(QueryError, match="no-such-store"):
        APP.query("no-such-store", "k0", endpoints=cluster.endpoints["a"])


def test_cli_prints_the_value_and_exits_0(cluster, capsys):
    code, out, err = run_cli(capsys, STORE, PRESENT[2], "--endpoint", cluster.endpoints["a"])
    assert (code, out.strip(), err) == (0, str(active_value(2)), "")


def test_cli_takes_endpoints_from_the_environment(cluster, capsys, monkeypatch):
    monkeypatch.setenv("PYSTREAMS_QUERY_ENDPOINTS", cluster.endpoints["b"])
    code, out, _ = run_cli(capsys, STORE, PRESENT[0])
    assert (code, out.strip()) == (0, str(active_value(0)))


def test_cli_exits_1_for_a_missing_key(cluster, capsys):
    code, out, _ = run_cli(capsys, STORE, MISSING[3], "--endpoint", cluster.endpoints["b"])
    assert code == 1
    assert "no value" in out and MISSING[3] in out


def test_cli_exits_2_without_an_endpoint_or_for_an_unknown_store(cluster, capsys, monkeypatch):
    monkeypatch.delenv("PYSTREAMS_QUERY_ENDPOINTS", raising=False)
    code, _, err = run_cli(capsys, STORE, PRESENT[0])
    assert code == 2 and "--endpoint" in err
    code, _, err = run_cli(capsys, "no-such-store", PRESENT[0], "--endpoint", cluster.endpoints["a"])
    assert code == 2 and "no-such-store" in err


def test_empty_key_can_be_queried(cluster):
    """An empty key is a valid key (Text "" serializes to b""), so it must be queryable."""
    empty = KEY_SERDE.serialize("")
    partition = partition_for_key(empty, PARTITIONS)
    owner = cluster.threads[cluster.owner_of(partition)]
    owner.active[TASKS[partition]][STORE][empty] = VALUE_SERDE.serialize(42)
    assert QueryClient([cluster.endpoints["a"]]).get(STORE, "", KEY_SERDE, VALUE_SERDE, timeout_s=0.1) == 42


# -- 2. restoring and unhosted tasks ---------------------------------------------------------------


def test_restoring_task_answers_503_with_retry(cluster):
    owner = cluster.owner_of(2)
    cluster.threads[owner].restoring_tasks.add(TASKS[2])
    status, content_type, body = raw_get(cluster.endpoints[owner], f"/v1/stores/{STORE}/{key_hex(PRESENT[2])}")
    assert (status, content_type) == (503, "application/json")
    answer = json.loads(body)
    assert answer["retry"] is True
    assert "restoring" in answer["error"]
    assert cluster.threads[owner].reads == []  # a restoring store is not read at all


def test_client_retries_a_restoring_task_until_its_deadline(cluster):
    owner = cluster.owner_of(0)
    cluster.threads[owner].restoring_tasks.add(TASKS[0])
    client = QueryClient([cluster.endpoints["b"]])
    started = time.monotonic()
    with pytest.raises(NotAvailableYet, match="restoring"):
        client.get(STORE, PRESENT[0], KEY_SERDE, VALUE_SERDE, timeout_s=0.5)
    assert time.monotonic() - started >= 0.5
    assert cluster.threads[owner].restoring_checks >= 2  # asked again, not given up at once


def test_client_gets_the_value_once_restoring_ends(cluster):
    owner = cluster.owner_of(1)
    thread = cluster.threads[owner]
    thread.restoring_tasks.add(TASKS[1])
    thread.restoring_checks_left = 2  # two requests see the task restoring, the third does not
    value = QueryClient([cluster.endpoints["a"]]).get(STORE, PRESENT[1], KEY_SERDE, VALUE_SERDE, timeout_s=5)
    assert value == active_value(1)
    assert thread.restoring_checks == 3


def test_app_query_raises_not_available_yet_while_restoring(cluster):
    cluster.threads[cluster.owner_of(3)].restoring_tasks.add(TASKS[3])
    with pytest.raises(NotAvailableYet):
        APP.query(STORE, PRESENT[3], endpoints=cluster.endpoints["a"], timeout_s=0.2)


def test_cli_exits_3_with_a_clear_message_while_restoring(cluster, capsys):
    cluster.threads[cluster.owner_of(2)].restoring_tasks.add(TASKS[2])
    code, out, err = run_cli(capsys, STORE, PRESENT[2], "--endpoint", cluster.endpoints["a"], "--timeout-s", "0.2")
    assert code == 3
    assert out == ""
    assert "not available yet" in err and "restoring" in err and STORE in err


def test_task_not_hosted_here_answers_503(cluster):
    # Worker "a" does not run task 3 (worker "b" does): stale routing gets a retryable 503.
    status, _, body = raw_get(cluster.endpoints["a"], f"/v1/stores/{STORE}/{key_hex(PRESENT[3])}")
    assert status == 503
    answer = json.loads(body)
    assert answer["retry"] is True and "not hosted here" in answer["error"]


def test_task_hosted_nowhere_is_not_available_yet(cluster_factory, capsys):
    cluster = cluster_factory(unhosted=[1])
    with pytest.raises(NotAvailableYet, match="no worker hosts partition 1"):
        QueryClient([cluster.endpoints["a"]]).get(STORE, PRESENT[1], KEY_SERDE, VALUE_SERDE, timeout_s=0.2)
    code, _, err = run_cli(capsys, STORE, PRESENT[1], "--endpoint", cluster.endpoints["b"], "--timeout-s", "0")
    assert code == 3 and "not available yet" in err
    # The other partitions are still served.
    assert QueryClient([cluster.endpoints["a"]]).get(STORE, PRESENT[2], KEY_SERDE, VALUE_SERDE) == active_value(2)


# -- 3. stale reads from standby replicas ------------------------------------------------------------


def test_standby_answers_only_stale_reads(cluster):
    standby_host = cluster.other_than(cluster.owner_of(2))
    target = f"/v1/stores/{STORE}/{key_hex(PRESENT[2])}"
    status, _, _ = raw_get(cluster.endpoints[standby_host], target)
    assert status == 503
    for flag in ("1", "true"):
        status, content_type, body = raw_get(cluster.endpoints[standby_host], f"{target}?stale={flag}")
        assert (status, content_type) == (200, "application/octet-stream")
        assert VALUE_SERDE.deserialize(body) == standby_value(2)


def test_stale_query_falls_back_to_the_standby_while_the_active_restores(cluster):
    owner = cluster.owner_of(2)
    standby_host = cluster.other_than(owner)
    cluster.threads[owner].restoring_tasks.add(TASKS[2])
    client = QueryClient([cluster.endpoints[owner]])
    with pytest.raises(NotAvailableYet):
        client.get(STORE, PRESENT[2], KEY_SERDE, VALUE_SERDE, timeout_s=0.2)
    assert cluster.threads[standby_host].reads == []  # never asked without stale
    assert client.get(STORE, PRESENT[2], KEY_SERDE, VALUE_SERDE, timeout_s=0.2, stale=True) == standby_value(2)
    assert cluster.threads[standby_host].reads == [(TASKS[2], STORE, KEY_SERDE.serialize(PRESENT[2]), True)]


def test_stale_query_prefers_the_active_when_it_can_answer(cluster):
    assert APP.query(STORE, PRESENT[0], endpoints=cluster.endpoints["b"], stale=True) == active_value(0)


def test_app_query_and_cli_read_standbys_only_with_stale(cluster, capsys):
    owner = cluster.owner_of(1)
    cluster.threads[owner].restoring_tasks.add(TASKS[1])
    endpoint = cluster.endpoints[owner]
    with pytest.raises(NotAvailableYet):
        APP.query(STORE, PRESENT[1], endpoints=endpoint, timeout_s=0)
    assert APP.query(STORE, PRESENT[1], endpoints=endpoint, timeout_s=0, stale=True) == standby_value(1)
    code, out, _ = run_cli(capsys, STORE, PRESENT[1], "--endpoint", endpoint, "--stale", "--timeout-s", "0")
    assert (code, out.strip()) == (0, str(standby_value(1)))


# -- 4. bad requests ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "reason"),
    [
        (f"/v1/stores/{STORE}/zz", "hex"),
        (f"/v1/stores/{STORE}/abc", "hex"),  # odd length
        (f"/v1/stores/no-such-store/{'6b30'}", "no store named 'no-such-store'"),
        ("/v1/nothing-here", "unknown path"),
        (f"/v1/stores/{STORE}?from=zz", "from must be the serialized key's bytes in hex"),
        (f"/v1/stores/{STORE}?partitions=9", "partitions must lie in 0..3"),
        (f"/v1/stores/{STORE}/6b30/windows", "'keys' is a key-value store; ask it for one key"),
        (f"/v1/stores/{STORE}/6b30/extra", "unknown path"),
    ],
)
def test_bad_requests_get_400_with_a_json_reason_and_the_server_keeps_serving(cluster, target, reason):
    endpoint = cluster.endpoints["a"]
    status, content_type, body = raw_get(endpoint, target)
    assert (status, content_type) == (400, "application/json")
    assert reason in json.loads(body)["error"]
    assert cluster.threads["a"].reads == []
    status, _, body = raw_get(endpoint, f"/v1/stores/{STORE}/{key_hex(PRESENT[0])}")
    assert (status, VALUE_SERDE.deserialize(body)) == (200, active_value(0))


def test_non_get_requests_get_400(cluster):
    endpoint = cluster.endpoints["b"]
    status, _, body = raw_get(endpoint, "/v1/metadata", method="POST")
    assert status == 400 and "GET" in json.loads(body)["error"]
    assert raw_get(endpoint, "/v1/metadata")[0] == 200


def test_garbage_request_line_gets_400(cluster):
    host, _, port = cluster.endpoints["a"].rpartition(":")
    with socket.create_connection((host, int(port)), timeout=5) as connection:
        connection.sendall(b"HELLO\r\n\r\n")
        answer = b""
        while chunk := connection.recv(4096):
            answer += chunk
    # A request line that names no HTTP version is answered in HTTP/1.0 (aiohttp's choice).
    assert re.match(rb"HTTP/1\.[01] 400 ", answer), answer[:80]
    assert raw_get(cluster.endpoints["a"], "/v1/metadata")[0] == 200


def test_client_raises_query_error_for_a_store_that_is_not_queryable(cluster):
    with pytest.raises(QueryError, match="not queryable") as raised:
        QueryClient([cluster.endpoints["a"]]).get_bytes("no-such-store", b"k0", timeout_s=0.1)
    assert not isinstance(raised.value, NotAvailableYet)


def test_window_stores_answer_for_a_keys_windows_only(loop):
    topology = load_app(str(ROOT / "examples" / "clicks_windowed.py")).topology()
    resolved = resolve(topology, {"clicks.web": 2})
    window_store = next(name for name, spec in topology.stores.items() if spec.kind.value == "window")
    assert queryable_stores(resolved)[window_store]["kind"] == "window"
    server = _start_server(loop, resolved, [])
    try:
        status, _, body = raw_get(server.endpoint, f"/v1/stores/{window_store}/6b30")
        assert status == 400
        assert json.loads(body)["error"] == (
            f"store {window_store!r} is a window store; ask it for a key's windows (/v1/stores/STORE/KEYHEX/windows?from=MS&to=MS)"
        )
        status, _, body = raw_get(server.endpoint, f"/v1/stores/{window_store}/6b30/windows?from=x")
        assert status == 400 and "from must be a timestamp in epoch milliseconds" in json.loads(body)["error"]
        # A worker without an assignment yet serves empty routing, not an error.
        status, _, body = raw_get(server.endpoint, "/v1/metadata")
        assert status == 200
        assert json.loads(body)["active"] == {} and json.loads(body)["standby"] == {}
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(5)


def test_range_and_prefix_scans_gather_every_task_in_key_order(cluster):
    client = QueryClient([cluster.endpoints["a"]])
    everything = client.scan_bytes(STORE)
    expected = sorted((KEY_SERDE.serialize(PRESENT[p]), VALUE_SERDE.serialize(active_value(p))) for p in PRESENT)
    assert everything == expected  # from both workers, each asked once for its own tasks
    keys = [k for k, _ in expected]
    assert client.scan_bytes(STORE, key_from=keys[1], key_to=keys[2]) == expected[1:3]  # both ends inclusive
    assert client.scan_bytes(STORE, key_to=keys[0]) == expected[:1]
    assert client.scan_bytes(STORE, prefix=b"k") == expected and client.scan_bytes(STORE, prefix=b"x") == []


def test_a_scan_waits_for_a_restoring_task_then_answers(cluster):
    cluster.threads["b"].restoring_tasks.add(TASKS[2])
    with pytest.raises(NotAvailableYet, match="restoring"):
        QueryClient([cluster.endpoints["a"]]).scan_bytes(STORE, timeout_s=0.3)
    cluster.threads["b"].restoring_checks_left = 2
    assert len(QueryClient([cluster.endpoints["a"]]).scan_bytes(STORE, timeout_s=5)) == PARTITIONS


def test_query_server_needs_host_and_port():
    for endpoint in ("127.0.0.1", "127.0.0.1:http", ":8080"):
        with pytest.raises(ValueError):
            QueryServer(RESOLVED, [], endpoint)


# -- 5. queryable stores ---------------------------------------------------------------------------------


@pytest.mark.parametrize("partitions", [1, PARTITIONS, 7])
def test_queryable_stores_names_the_topic_and_partition_count_that_place_keys(partitions):
    resolved = resolve(TOPOLOGY, {INPUT_TOPIC: partitions})
    assert queryable_stores(resolved) == {STORE: {"topic": INPUT_TOPIC, "partitions": partitions, "kind": "key-value", "subtopology": SUBTOPOLOGY}}


def test_cli_exits_2_for_a_key_its_store_cannot_hold_before_asking_any_worker(tmp_path, capsys):
    app_file = tmp_path / "int_keys.py"
    app_file.write_text(
        "from pystreams import serdes\n"
        "from pystreams.app import App\n"
        "app = App('int_keys')\n"
        "events = app.topic('events', key=serdes.Int(), value=serdes.Text())\n"
        "app.count(events, store='counts')\n"
    )
    unreachable = f"127.0.0.1:{free_port()}"
    code = cli_main(["query", str(app_file), "counts", "not-a-number", "--endpoint", unreachable])
    err = capsys.readouterr().err
    assert code == 2 and "does not fit the store's key serde" in err, err


def test_get_refuses_a_none_key_with_the_reason_before_asking_any_worker():
    unreachable = f"127.0.0.1:{free_port()}"
    with pytest.raises(ValueError, match="needs a key, not None"):
        QueryClient([unreachable], request_timeout_s=0.5).get(STORE, None, KEY_SERDE, VALUE_SERDE)


def test_the_query_client_does_not_load_the_worker_engine() -> None:
    # Imports point down: the HTTP query client takes the partitioner from topology/.
    import subprocess
    import sys

    code = "import sys, pystreams.queries; print(sorted(m for m in sys.modules if m.startswith('pystreams.worker')))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "[]"


@pytest.mark.parametrize("ask", ["query_windows", "query_sessions"])
def test_window_and_session_queries_refuse_a_none_key_before_asking_any_worker(ask: str) -> None:
    stores_app = load_app(str(Path(__file__).resolve().parent / "apps" / "query_stores.py"))
    store = {"query_windows": "per-minute", "query_sessions": "sessions"}[ask]
    with pytest.raises(ValueError, match=f"store '{store}': an interactive query needs a key, not None"):
        getattr(stores_app, ask)(store, None, endpoints=f"127.0.0.1:{free_port()}", timeout_s=0)


def test_declaring_an_app_does_not_load_the_query_client() -> None:
    # app.query* import the HTTP client on the first query, not when the app module is imported.
    import subprocess
    import sys

    code = "import sys, pystreams.app; print(sorted(m for m in ('pystreams.queries', 'urllib.request') if m in sys.modules))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "[]"
