"""Run the manifests: the rendered StatefulSets' containers, with their exact commands and
environment, as local processes (see tests/kubelet.py for what is emulated and how), against
the embedded broker.

* dev overlay: the broker pod, the topics Job, the coordinator and one worker come up as
  rendered, and the worker counts what it is sent.
* prod overlay (three workers, one standby, warm-ups, zones): with input flowing, a rolling
  restart of every worker keeps every count exact and at least one worker ready; a pod deleted
  and recreated with its volume restores from its checkpoint, not from the beginning; scaling
  3 -> 5 -> 3 loses nothing, and standbys sit in another zone than their actives.
"""
from __future__ import annotations

import json
import re
import shutil
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kubelet import KubeletUnavailable, MiniKubelet, ReadinessRecorder, render, running

from pystreams.broker import EmbeddedBroker
from pystreams.commands.dev import LatestValueReader, ensure_input_topics

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
INPUT, OUTPUT = "events", "event-counts"
PARTITIONS = 6
KEYS = [f"user-{n}" for n in range(60)]
WORKER, COORDINATOR = "pystreams-worker", "pystreams-coordinator"


def _kubelet(objects: list[dict], tmp_path: Path) -> MiniKubelet:
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed: the manifests cannot be rendered")
    try:
        return MiniKubelet(objects, tmp_path)
    except KubeletUnavailable as error:
        pytest.skip(str(error))


def _rendered(overlay: str) -> list[dict]:
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed: the manifests cannot be rendered")
    return render(DEPLOY / "overlays" / overlay)


class Feed:
    """Sends events (key = a user, in a fixed rotation) and knows exactly how many each key
    got; ``running`` ones keep sending in a background thread at about ``rate`` per second."""

    def __init__(self, bootstrap: str, rate: int = 400) -> None:
        from kafka import KafkaProducer

        self._producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, acks="all")
        self.sent: Counter[str] = Counter()
        self._rate = rate
        self._next = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def send(self, count: int) -> None:
        keys = [KEYS[(self._next + i) % len(KEYS)] for i in range(count)]
        self._next += count
        futures = [self._producer.send(INPUT, key=key.encode(), value=b"e") for key in keys]
        self._producer.flush()
        for future in futures:
            future.get(timeout=10)  # a lost send would make the expected counts wrong
        self.sent.update(keys)

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="feed", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        batch = max(1, self._rate // 10)
        try:
            while not self._stop.is_set():
                self.send(batch)
                self._stop.wait(0.1)
        except BaseException as error:  # surfaced by pause()
            self.error = error

    def pause(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
            self._thread = None
        if self.error is not None:
            raise self.error

    def close(self) -> None:
        self.pause()
        self._producer.close()


def _await_counts(reader: LatestValueReader, expected: Counter[str], timeout_s: float, what: str,
                  kubelet: MiniKubelet) -> dict[str, int]:
    deadline = time.monotonic() + timeout_s
    counts: dict[str, int] = {}
    while time.monotonic() < deadline:
        counts = reader.read_more(0.5)
        if counts == dict(expected):
            return counts
    wrong = {k: (counts.get(k), n) for k, n in expected.items() if counts.get(k) != n}
    tails = "\n".join(f"--- {p.name} ---\n" + "\n".join(p.log().splitlines()[-25:]) for p in kubelet.pods.values())
    raise AssertionError(f"{what}: counts not exact after {timeout_s:.0f} s; (got, sent) for {len(wrong)} keys: "
                         f"{dict(list(wrong.items())[:8])}\n{tails}")


def _metric(body: str, name: str) -> float:
    """The sum of every sample of ``name`` in a Prometheus text page."""
    total = 0.0
    for line in body.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


# -- the dev overlay ---------------------------------------------------------------------------------


def test_dev_overlay_comes_up_as_rendered_and_counts(tmp_path: Path) -> None:
    kubelet = _kubelet(_rendered("dev"), tmp_path)
    with running(kubelet):
        broker = kubelet.start_pod("kafka")
        kubelet.wait_ready([broker.name], 30, what="the broker pod")
        job = kubelet.start_pod("pystreams-topics", name="pystreams-topics-1")
        assert job.process is not None and job.process.wait(60) == 0, job.log()
        coordinator = kubelet.start_pod(COORDINATOR, 0)
        kubelet.wait_ready([coordinator.name], 60, what="the coordinator")
        worker = kubelet.start_pod(WORKER, 0)
        kubelet.wait_ready([worker.name], 90, what="the worker")
        with kubelet.cluster_dns():
            feed = Feed("kafka:9092")
            reader = LatestValueReader("kafka:9092", OUTPUT)
            try:
                feed.send(600)
                _await_counts(reader, feed.sent, 60, "the dev overlay's worker", kubelet)
            finally:
                reader.close()
                feed.close()
        status, body = worker.get("/metrics", "metrics")
        assert status == 200
        assert _metric(body, "pystreams_records_consumed_total") == 600
        assert _metric(body, "pystreams_worker_ready") == 1
        code, took = kubelet.delete_pod(worker.name)
        assert code == 0, worker.log()
        assert "left the group (epoch -2)" in worker.log()
