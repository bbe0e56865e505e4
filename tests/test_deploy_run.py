"""Run the manifests: the rendered StatefulSets' containers, with their exact commands and
environment, as local processes (see tests/kubelet.py for what is emulated and how), against
the embedded broker.

* dev overlay: the broker pod, the topics Job, the coordinator and one worker come up as
  rendered, and the worker counts what it is sent.
* prod overlay (three coordinators sharing the shards, three workers, one standby, warm-ups,
  zones): with input flowing, a rolling restart of the coordinators loses no member's tasks and
  keeps every count exact; a rolling restart of every worker keeps every count exact and at
  least one worker ready; a pod deleted
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


def _await_counts(reader: LatestValueReader, expected: Counter[str], timeout_s: float, what: str, kubelet: MiniKubelet) -> dict[str, int]:
    deadline = time.monotonic() + timeout_s
    counts: dict[str, int] = {}
    while time.monotonic() < deadline:
        counts = reader.read_more(0.5)
        if counts == dict(expected):
            return counts
    wrong = {k: (counts.get(k), n) for k, n in expected.items() if counts.get(k) != n}
    tails = "\n".join(f"--- {p.name} ---\n" + "\n".join(p.log().splitlines()[-25:]) for p in kubelet.pods.values())
    raise AssertionError(f"{what}: counts not exact after {timeout_s:.0f} s; (got, sent) for {len(wrong)} keys: {dict(list(wrong.items())[:8])}\n{tails}")


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


# -- the prod overlay --------------------------------------------------------------------------------


def _changelog_records(bootstrap: str, partitions: list[int]) -> int:
    """Records in the given partitions of the counts changelog, counted by reading them (the
    embedded broker's ListOffsets is not to be trusted)."""
    from kafka import KafkaConsumer, TopicPartition

    topic = "pystreams-demo-counts-changelog"
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, auto_offset_reset="earliest", consumer_timeout_ms=2000)
    try:
        consumer.assign([TopicPartition(topic, p) for p in partitions])
        consumer.seek_to_beginning()
        return sum(1 for _ in consumer)
    finally:
        consumer.close()


def _active_tasks(pod) -> list[str]:
    status, body = pod.get("/metrics", "metrics")
    assert status == 200, body
    return sorted(set(re.findall(r'pystreams_task_lag_records\{task="([^"]+)"', body)))


def _tasks_by_worker(kubelet: MiniKubelet, workers: list[str]) -> dict[str, list[str]]:
    return {name: _active_tasks(kubelet.pods[name]) for name in workers}


def _await_every_task_running(kubelet: MiniKubelet, workers: list[str], timeout_s: float) -> dict[str, list[str]]:
    """Until the workers run all the app's tasks between them, each once."""
    deadline = time.monotonic() + timeout_s
    while True:
        tasks = _tasks_by_worker(kubelet, workers)
        running = [t for ts in tasks.values() for t in ts]
        if len(running) == PARTITIONS and len(set(running)) == PARTITIONS:
            return tasks
        assert time.monotonic() < deadline, f"not every task runs exactly once: {tasks}"
        time.sleep(0.5)


def _seconds_until_spread(kubelet: MiniKubelet, workers: list[str], timeout_s: float) -> float | None:
    """Until every worker runs an active task (the assignor moves tasks onto new workers
    through warm-ups, at its own pace): seconds, or None if not within ``timeout_s``."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if all(_tasks_by_worker(kubelet, workers).values()):
            return round(time.monotonic() - started, 1)
        time.sleep(0.5)
    return None


def _zone_of_endpoints(kubelet: MiniKubelet) -> dict[str, str]:
    return {
        f"{pod.name}.{WORKER}.{kubelet.namespace}.svc:7070": pod.labels["topology.kubernetes.io/zone"] for pod in kubelet.pods.values() if pod.owner == WORKER
    }


def test_prod_overlay_rolls_restores_and_scales_with_exact_counts(tmp_path: Path) -> None:
    objects = _rendered("prod")
    kafka_config = next(o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("pystreams-kafka"))
    with EmbeddedBroker(port=None) as broker:
        # The overlay's one setting a user must change: the bootstrap of their Kafka cluster.
        kafka_config["data"]["PYSTREAMS_BOOTSTRAP_SERVERS"] = broker.bootstrap_servers
        ensure_input_topics(broker.bootstrap_servers, [INPUT, OUTPUT], partitions=PARTITIONS)
        kubelet = _kubelet(objects, tmp_path)
        workers = [f"{WORKER}-{n}" for n in range(3)]
        replicas = int(kubelet.find("StatefulSet", WORKER)["spec"]["replicas"])
        assert replicas == 3
        measured: dict[str, object] = {}
        feed = Feed(broker.bootstrap_servers)
        reader = LatestValueReader(broker.bootstrap_servers, OUTPUT)
        with running(kubelet):
            try:
                coordinators = int(kubelet.find("StatefulSet", COORDINATOR)["spec"]["replicas"])
                assert coordinators == 3
                for ordinal in range(coordinators):  # OrderedReady: each ready before the next starts
                    coordinator = kubelet.start_pod(COORDINATOR, ordinal)
                    kubelet.wait_ready([coordinator.name], 90, what=f"coordinator {ordinal}")
                for ordinal in range(replicas):  # podManagementPolicy: Parallel
                    kubelet.start_pod(WORKER, ordinal)
                measured["fleet_ready_s"] = round(kubelet.wait_ready(workers, 120, what="three workers"), 1)
                feed.start()
                _await_every_task_running(kubelet, workers, 120)
                # Ready is per pod; the group settles after: warm-ups move actives onto the
                # workers that joined after the first assignment (measured, not required).
                measured["fleet_every_worker_active_s"] = _seconds_until_spread(kubelet, workers, 30)

                # 0. Rolling restart of the coordinators, highest ordinal first, each ready before
                # the next: a leaving node hands its shards to the others, the members keep their
                # ids and epochs, so no group rebalances and every count stays exact.
                coordinator_rolls = []
                for ordinal in reversed(range(coordinators)):
                    name = f"{COORDINATOR}-{ordinal}"
                    code, stop_s = kubelet.delete_pod(name)
                    assert code == 0, kubelet.pods[name].log()[-3000:]
                    kubelet.start_pod(COORDINATOR, ordinal)
                    ready_s = kubelet.wait_ready([name], 120, what=f"{name} after its restart")
                    coordinator_rolls.append({"pod": name, "stop_s": round(stop_s, 2), "ready_again_s": round(ready_s, 2)})
                measured["coordinator_rolling_restart"] = coordinator_rolls
                feed.pause()
                _await_counts(reader, feed.sent, 90, "after the coordinators' rolling restart", kubelet)
                for name in workers:
                    assert "lost tasks" not in kubelet.pods[name].log(), kubelet.pods[name].log()[-3000:]
                feed.start()

                # 1. Rolling restart, highest ordinal first, each pod ready before the next.
                rolls = []
                with ReadinessRecorder(kubelet, lambda: workers) as readiness:
                    for ordinal in reversed(range(replicas)):
                        name = f"{WORKER}-{ordinal}"
                        old = kubelet.pods[name]
                        code, stop_s = kubelet.delete_pod(name)
                        assert code == 0, old.log()
                        assert "left the group (epoch -2)" in old.log()  # static: back soon, keep my tasks
                        kubelet.start_pod(WORKER, ordinal)
                        ready_s = kubelet.wait_ready([name], 120, what=f"{name} after its restart")
                        restored = sum(int(n) for n in re.findall(r"\(restored (\d+) records\)", kubelet.pods[name].log()))
                        rolls.append({"pod": name, "stop_s": round(stop_s, 2), "ready_again_s": round(ready_s, 2), "restored_records": restored})
                assert readiness.samples, "readiness was never sampled"
                assert readiness.fewest_ready >= 1, "at some moment of the rolling restart no worker was ready"
                measured["rolling_restart"] = rolls
                measured["rolling_restart_fewest_ready"] = readiness.fewest_ready
                feed.pause()
                _await_counts(reader, feed.sent, 90, "after the rolling restart", kubelet)
                measured["records_after_roll"] = sum(feed.sent.values())

                # 2. A pod deleted and recreated with its volume restores from its checkpoint.
                feed.start()
                by_worker = _await_every_task_running(kubelet, workers, 60)
                victim = max(workers, key=lambda name: len(by_worker[name]))
                tasks = by_worker[victim]
                code, _ = kubelet.delete_pod(victim)
                assert code == 0
                assert (tmp_path / "pvc" / f"state-{victim}" / "pystreams-demo").is_dir()
                recreated = kubelet.start_pod(WORKER, int(victim.rsplit("-", 1)[1]))
                kubelet.wait_ready([victim], 120, what="the recreated pod")
                status, body = recreated.get("/metrics", "metrics")
                restored = int(_metric(body, "pystreams_restore_records_total"))
                logged = sum(int(n) for n in re.findall(r"started tasks .* \(restored (\d+) records\)", recreated.log()))
                assert restored == logged, (restored, logged)
                feed.pause()
                in_changelogs = _changelog_records(broker.bootstrap_servers, [int(t.split("_")[1]) for t in tasks])
                # From the beginning it would have read every changelog record of its tasks.
                assert in_changelogs > 0 and restored < in_changelogs, (restored, in_changelogs)
                measured["recreated_pod"] = {"pod": victim, "tasks": tasks, "restored_records": restored, "changelog_records_of_its_tasks": in_changelogs}
                _await_counts(reader, feed.sent, 90, "after the pod was recreated", kubelet)

                # 3. Scale out to five (both new pods at once), input flowing.
                feed.start()
                started = time.monotonic()
                for ordinal in (3, 4):
                    kubelet.start_pod(WORKER, ordinal)
                workers = [f"{WORKER}-{n}" for n in range(5)]
                kubelet.wait_ready(workers, 120, what="five workers")
                measured["scale_out_ready_s"] = round(time.monotonic() - started, 1)
                spread = _seconds_until_spread(kubelet, workers, 60)
                measured["scale_out_every_worker_active_s"] = None if spread is None else round(time.monotonic() - started, 1)
                measured["scale_out_tasks"] = _await_every_task_running(kubelet, workers, 60)
                feed.pause()
                _await_counts(reader, feed.sent, 90, "after scaling to five", kubelet)
                # Rack awareness: every standby in another zone than its active.
                status, body = kubelet.pods[workers[0]].get("/v1/metadata", "queries")
                metadata = json.loads(body)
                zones = _zone_of_endpoints(kubelet)
                active_zone = {p: zones[host] for host, pairs in metadata["active"].items() for _, p in pairs}
                standby_zone = {p: zones[host] for host, pairs in metadata["standby"].items() for _, p in pairs}
                assert set(active_zone) == set(range(PARTITIONS)) and set(standby_zone) == set(range(PARTITIONS))
                assert all(active_zone[p] != standby_zone[p] for p in range(PARTITIONS)), (active_zone, standby_zone)

                # 4. Scale back in to three: annotated, so the two leave for good (-1).
                feed.start()
                started = time.monotonic()
                for name in workers[3:]:
                    kubelet.annotate(name, "pystreams.io/leave-group", "true")
                for name, (code, _) in kubelet.delete_pods(workers[3:]).items():  # both at once: Parallel
                    assert code == 0, kubelet.pods[name].log()[-3000:]
                    assert "left the group (epoch -1)" in kubelet.pods[name].log(), kubelet.pods[name].log()[-3000:]
                workers = workers[:3]
                _await_every_task_running(kubelet, workers, 120)
                kubelet.wait_ready(workers, 120, what="three workers after scaling in")
                measured["scale_in_tasks_moved_s"] = round(time.monotonic() - started, 1)
                feed.pause()
                _await_counts(reader, feed.sent, 90, "after scaling back to three", kubelet)
                measured["records_total"] = sum(feed.sent.values())
            finally:
                reader.close()
                feed.close()
        print("MEASUREMENTS " + json.dumps(measured))
