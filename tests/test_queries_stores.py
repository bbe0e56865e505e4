"""Interactive queries of every kind of store, as Kafka Streams offers them, against real worker
processes (``tests/apps/query_stores.py`` on two workers, each with a user endpoint): a window
store's windows of one key in a time range, a session store's sessions of one key, range and
prefix scans of a key-value store gathered from both workers — through ``App.query_*`` and
``pystreams query``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaProducer
from worker_support import Cluster, Workers, fleet_of

from pystreams.app import Windowed, load_app
from pystreams.broker import free_port
from pystreams.commands.dev import ensure_input_topics
from pystreams.queries import QueryError

pytestmark = pytest.mark.integration

APP_PATH = Path(__file__).resolve().parent / "apps" / "query_stores.py"
APP = load_app(str(APP_PATH))
MINUTE = 60_000
BASE = 1_700_000_040_000  # a minute boundary
#: (user, event time): ann twice in the first minute and once 70 s in (a second window and,
#: after more than the 30 s gap, a second session); andy and bob once.
VISITS = [("ann", BASE), ("bob", BASE + 5_000), ("ann", BASE + 10_000), ("andy", BASE + 20_000), ("ann", BASE + 70_000)]


@pytest.fixture(scope="module")
def endpoints(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    tmp_path = tmp_path_factory.mktemp("queries")
    cluster = Cluster(tmp_path)
    try:
        ensure_input_topics(cluster.bootstrap, ["visits"], partitions=4)
        producer = KafkaProducer(bootstrap_servers=cluster.bootstrap)
        for user, timestamp in VISITS:
            producer.send("visits", key=user.encode(), value=b"/home", timestamp_ms=timestamp)
        producer.close()
        for generated in fleet_of(Workers(cluster.bootstrap, cluster.coordinator_address, tmp_path, APP_PATH)):
            addresses = [f"127.0.0.1:{free_port()}" for _ in range(2)]
            for address in addresses:
                generated.start("--user-endpoint", address)
            # Every visit is counted and every task answers.
            eventually(lambda endpoints=addresses: APP.query("counts", "ann", endpoints=endpoints, timeout_s=1) == 3, generated.log_tails)
            eventually(lambda endpoints=addresses: len(APP.query_range("counts", endpoints=endpoints, timeout_s=1)) == 3, generated.log_tails)
            yield addresses
    finally:
        cluster.stop()


def eventually(condition: Callable[[], bool], logs: Callable[[], str], timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except QueryError:
            pass  # not available yet, or no assignment yet
        time.sleep(0.2)
    raise AssertionError("timed out\n" + logs())


def query_cli(endpoints: list[str], *args: str) -> tuple[int, list[Any]]:
    done = subprocess.run(
        [sys.executable, "-m", "pystreams", "query", str(APP_PATH), *args, *[option for endpoint in endpoints for option in ("--endpoint", endpoint)]],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.stderr == "", done.stderr
    return done.returncode, [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def test_a_window_store_gives_one_keys_windows_in_a_time_range(endpoints: list[str]) -> None:
    assert APP.query_windows("per-minute", "ann", endpoints=endpoints) == [(BASE, 2), (BASE + MINUTE, 1)]
    assert APP.query_windows("per-minute", "ann", BASE + 1, BASE + MINUTE, endpoints=endpoints) == [(BASE + MINUTE, 1)]
    assert APP.query_windows("per-minute", "ann", BASE, BASE + MINUTE - 1, endpoints=endpoints) == [(BASE, 2)]
    assert APP.query_windows("per-minute", "nobody", endpoints=endpoints) == []
    assert query_cli(endpoints, "per-minute", "ann", "--from-time", str(BASE + 1)) == (0, [{"start": BASE + MINUTE, "value": 1}])


def test_sliding_and_cogroup_window_stores_are_queryable(endpoints: list[str]) -> None:
    # ann at 0, 10 s and 70 s: her windows [-10 s, 0], [0, 10 s] (both visits), the right
    # window of the first [1 ms, 10 s + 1 ms] and [60 s, 70 s]; values are the counts only.
    assert APP.query_windows("recent", "ann", BASE, None, endpoints=endpoints) == [(BASE, 2), (BASE + 1, 1), (BASE + 60_000, 1)]
    assert query_cli(endpoints, "recent", "bob") == (0, [{"start": BASE - 5_000, "value": 1}])
    # The cogroup's one store: 1 per visit plus 10 per home page visit.
    assert APP.query_windows("weighted", "ann", endpoints=endpoints) == [(BASE, 22), (BASE + MINUTE, 11)]


def test_a_session_store_gives_all_of_a_keys_sessions(endpoints: list[str]) -> None:
    assert APP.query_sessions("sessions", "ann", endpoints=endpoints) == [
        (Windowed("ann", BASE, BASE + 10_000), 2),
        (Windowed("ann", BASE + 70_000, BASE + 70_000), 1),
    ]
    assert query_cli(endpoints, "sessions", "bob") == (0, [{"start": BASE + 5_000, "end": BASE + 5_000, "value": 1}])
    assert query_cli(endpoints, "sessions", "nobody") == (1, [])


def test_range_and_prefix_scans_gather_every_task_by_serialized_key(endpoints: list[str]) -> None:
    everything = [("andy", 1), ("ann", 3), ("bob", 1)]
    assert APP.query_range("counts", endpoints=endpoints) == everything
    assert APP.query_range("counts", "ann", "bob", endpoints=endpoints) == everything[1:]  # both ends inclusive
    assert APP.query_range("counts", key_to="azzz", endpoints=endpoints) == everything[:2]
    assert APP.query_prefix("counts", "an", endpoints=endpoints) == everything[:2]
    assert query_cli(endpoints, "counts", "--prefix", "b") == (0, [{"key": "bob", "value": 1}])
    assert query_cli(endpoints, "counts", "--all")[1] == [{"key": k, "value": v} for k, v in everything]


def test_each_kind_of_store_says_how_it_is_asked(endpoints: list[str]) -> None:
    with pytest.raises(QueryError, match="'per-minute' is a window store; ask it for a key's windows"):
        APP.query("per-minute", "ann", endpoints=endpoints)
    done = subprocess.run(
        [sys.executable, "-m", "pystreams", "query", str(APP_PATH), "sessions", "--all", "--endpoint", endpoints[0]], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "pystreams query: store 'sessions' is a session store: --from/--to/--prefix/--all scan key-value stores; a session store is read by KEY"
    )
