"""The coordinator's metrics (KIP-848 "Broker Metrics"), exported with prometheus_client and
served over HTTP with aiohttp.

Names follow what the Prometheus JMX exporter makes of Kafka's
``kafka.server:type=group-coordinator-metrics,name=NAME``: ``kafka_server_group_coordinator_metrics_``
followed by NAME with dashes as underscores, so dashboards written for Kafka's coordinator fit:

==============================================  ================================================
KIP name                                        exposed as (suffix after the prefix)
==============================================  ================================================
group-count{protocol}                           ``group_count{protocol="consumer"|"classic"}``
consumer-group-count{state}                     ``consumer_group_count{state="empty"|...}``
partition-count{state}                          ``partition_count{state="loading"|"active"|"failed"}``
event-queue-size                                ``event_queue_size`` (and per shard)
consumer-group-rebalance-rate / -count          ``consumer_group_rebalance_rate`` / ``_count``
partition-load-time-avg / -max                  ``partition_load_time_avg`` / ``_max`` (ms)
thread-idle-ratio-min / -avg                    ``thread_idle_ratio_min`` / ``_avg``
classic-group-count{state}                      ``classic_group_count{state="Empty"|...}``
==============================================  ================================================

pystreams' own, for operating it safely (``pystreams_coordinator_``): ``refusals_total{reason}``
(connections and requests the server refused: limits, deadlines, malformed or invalid requests,
failed authentication, denied by ACL), ``handler_failures_total`` (requests whose handler raised
and was rolled back), ``shard_reloads_total``, ``quarantined_groups``, ``connections``; and for
online migration, under the Kafka prefix, ``consumer_group_classic_members`` and
``group_conversions_total{direction="upgrade"|"downgrade"}``.

Rates and idle ratios are over a sliding window (60 s, Kafka's two 30 s samples); load times
cover every load since the process started. A *rebalance* is a new target assignment. Every
value is read from the shards when Prometheus scrapes (a custom collector): nothing is counted
per request on the hot path. ``GET /metrics``; ``GET /ready`` (and ``/readyz``) answers 200
once every shard is active and 503 before (a readiness probe); ``GET /healthz`` answers 200
while the process serves (a liveness probe).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from pystreams.coordinator.runtime import Coordinator

log = logging.getLogger(__name__)

PREFIX = "kafka_server_group_coordinator_metrics_"
OWN_PREFIX = "pystreams_coordinator_"
WINDOW_S = 60.0


class WindowedCounter:
    """Events per second over the last ``window_s`` seconds, in one-second buckets."""

    def __init__(self, window_s: float = WINDOW_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._window_s = window_s
        self._clock = clock
        self._started = clock()
        self._buckets: deque[list[float]] = deque()  # [second, amount]
        self.total = 0.0

    def record(self, amount: float = 1.0, at: float | None = None) -> None:
        now = self._clock() if at is None else at
        second = math.floor(now)
        if self._buckets and self._buckets[-1][0] == second:
            self._buckets[-1][1] += amount
        else:
            self._buckets.append([second, amount])
        self.total += amount
        self._prune(now)

    def sum(self, now: float | None = None) -> float:
        now = self._clock() if now is None else now
        self._prune(now)
        return sum(amount for _, amount in self._buckets)

    def elapsed(self, now: float | None = None) -> float:
        now = self._clock() if now is None else now
        return max(min(now - self._started, self._window_s), 1e-9)

    def rate(self, now: float | None = None) -> float:
        now = self._clock() if now is None else now
        return self.sum(now) / self.elapsed(now)

    def _prune(self, now: float) -> None:
        horizon = math.floor(now - self._window_s)
        while self._buckets and self._buckets[0][0] <= horizon:
            self._buckets.popleft()


class IdleTracker:
    """How much of the recent window one shard's event loop spent waiting for work."""

    def __init__(self, window_s: float = WINDOW_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._idle = WindowedCounter(window_s, clock)
        self._idle_since: float | None = None

    def idle(self) -> None:
        if self._idle_since is None:
            self._idle_since = self._clock()

    def busy(self) -> None:
        if self._idle_since is not None:
            self._record_idle(self._idle_since, self._clock())
            self._idle_since = None

    def _record_idle(self, start: float, end: float) -> None:
        # Split at second boundaries so the window drops old idle time precisely enough.
        while end - start > 1e-9:
            boundary = min(end, math.floor(start) + 1.0)
            self._idle.record(boundary - start, at=start)
            start = boundary

    def ratio(self) -> float:
        now = self._clock()
        if self._idle_since is not None:  # count the idle period in progress
            self._record_idle(self._idle_since, now)
            self._idle_since = now
        return min(1.0, self._idle.sum(now) / self._idle.elapsed(now))


class LoadTimes:
    def __init__(self) -> None:
        self.count = 0
        self.total_ms = 0.0
        self.max_ms = math.nan

    def record(self, ms: float) -> None:
        self.count += 1
        self.total_ms += ms
        self.max_ms = ms if math.isnan(self.max_ms) else max(self.max_ms, ms)

    @property
    def avg_ms(self) -> float:
        return self.total_ms / self.count if self.count else math.nan


class CoordinatorMetrics:
    """What the runtime records as it goes; gauges are read from the shards at scrape time."""

    def __init__(self) -> None:
        self.rebalances = WindowedCounter()
        self.load_times = LoadTimes()
        #: Online conversions between group types since start: "upgrade" and "downgrade".
        self.conversions: Counter[str] = Counter({"upgrade": 0, "downgrade": 0})


# --- export -------------------------------------------------------------------------------------


def _family(kind: type, name: str, help_text: str, samples: Iterable[tuple[dict[str, str], float]], prefix: str = PREFIX) -> Any:
    samples = list(samples)
    labels = sorted(samples[0][0]) if samples and samples[0][0] else []
    family = kind(prefix + name, help_text, labels=labels)
    for values, value in samples:
        family.add_metric([values[label] for label in labels], value)
    return family


def _gauge(name: str, help_text: str, samples: Iterable[tuple[dict[str, str], float]], prefix: str = PREFIX) -> GaugeMetricFamily:
    return _family(GaugeMetricFamily, name, help_text, samples, prefix)


def _counter(name: str, help_text: str, samples: Iterable[tuple[dict[str, str], float]], prefix: str = PREFIX) -> CounterMetricFamily:
    return _family(CounterMetricFamily, name, help_text, samples, prefix)


class CoordinatorCollector(Collector):
    """Reads the coordinator (and its server's refusal counts) at scrape time."""

    def __init__(self, coordinator: Coordinator, refusals: Callable[[], Mapping[str, int]] | None = None, connections: Callable[[], int] | None = None) -> None:
        self._coordinator = coordinator
        self._refusals = refusals or (lambda: {})
        self._connections = connections or (lambda: 0)

    def collect(self) -> Iterable[Any]:
        from pystreams.coordinator.runtime import ShardState

        coordinator = self._coordinator
        by_protocol = {"consumer": 0, "classic": 0}
        by_state: dict[str, int] = {}
        by_classic_state: dict[str, int] = {}
        classic_members = 0
        by_partition_state = {"loading": 0, "active": 0, "failed": 0}
        quarantined = 0
        handler_failures = coordinator.retired_handler_failures
        for runner in coordinator.runners:
            if runner.state is ShardState.ACTIVE:
                by_partition_state["active"] += 1
            elif runner.state is ShardState.LOADING:
                by_partition_state["loading"] += 1
            else:
                by_partition_state["failed"] += 1
            if runner.shard is None:
                continue
            handler_failures += runner.shard.handler_failures
            if runner.state is not ShardState.ACTIVE:
                continue
            quarantined += len(runner.shard.quarantined)
            for _, group in runner.shard.groups.served():
                by_protocol[group.group_type] = by_protocol.get(group.group_type, 0) + 1
                if group.group_type == "consumer":
                    state = group.state.value.lower()
                    by_state[state] = by_state.get(state, 0) + 1
                    classic_members += sum(1 for member in group.members.values() if member.classic is not None)
                else:
                    classic_state = group.state.value
                    by_classic_state[classic_state] = by_classic_state.get(classic_state, 0) + 1
        for state in ("empty", "assigning", "reconciling", "stable", "dead"):
            by_state.setdefault(state, 0)
        idle = [runner.idle.ratio() for runner in coordinator.runners]
        rebalances = coordinator.metrics.rebalances
        loads = coordinator.metrics.load_times
        yield _gauge("group_count", "Number of groups by rebalance protocol (KIP-848 group-count).", (({"protocol": p}, n) for p, n in by_protocol.items()))
        yield _gauge(
            "consumer_group_count", "Number of consumer groups by state (consumer-group-count).", (({"state": s}, n) for s, n in sorted(by_state.items()))
        )
        for state in ("Empty", "PreparingRebalance", "CompletingRebalance", "Stable", "Dead"):
            by_classic_state.setdefault(state, 0)
        yield _gauge(
            "classic_group_count", "Number of classic groups by state (classic-group-count).", (({"state": s}, n) for s, n in sorted(by_classic_state.items()))
        )
        yield _gauge(
            "consumer_group_classic_members", "Members of consumer groups that still speak the classic protocol (online migration).", [({}, classic_members)]
        )
        yield _counter(
            "group_conversions",
            "Online conversions between classic and consumer groups since start.",
            (({"direction": d}, n) for d, n in sorted(coordinator.metrics.conversions.items())),
        )
        yield _gauge(
            "partition_count",
            "Number of record-log partitions (shards) by state (partition-count).",
            (({"state": s}, n) for s, n in by_partition_state.items()),
        )
        yield _gauge(
            "event_queue_size", "Events waiting in the shards' queues (event-queue-size).", [({}, sum(runner.queue_size for runner in coordinator.runners))]
        )
        yield _gauge(
            "shard_event_queue_size",
            "Events waiting in one shard's queue.",
            (({"shard": str(runner.shard_id)}, runner.queue_size) for runner in coordinator.runners),
        )
        yield _gauge(
            "consumer_group_rebalance_rate",
            "New target assignments per second over the last minute (consumer-group-rebalance-rate).",
            [({}, rebalances.rate())],
        )
        yield _gauge("consumer_group_rebalance_count", "New target assignments since start (consumer-group-rebalance-count).", [({}, rebalances.total)])
        yield _gauge("partition_load_time_avg", "Average shard load time in ms (partition-load-time-avg).", [({}, loads.avg_ms)])
        yield _gauge("partition_load_time_max", "Longest shard load time in ms (partition-load-time-max).", [({}, loads.max_ms)])
        yield _gauge(
            "thread_idle_ratio_min",
            "Lowest share of the last minute a shard spent waiting for events (thread-idle-ratio-min).",
            [({}, min(idle) if idle else 1.0)],
        )
        yield _gauge(
            "thread_idle_ratio_avg",
            "Average share of the last minute the shards spent waiting for events (thread-idle-ratio-avg).",
            [({}, sum(idle) / len(idle) if idle else 1.0)],
        )

        refusals = CounterMetricFamily(OWN_PREFIX + "refusals", "Connections and requests refused, by reason.", labels=["reason"])
        for reason, count in sorted(self._refusals().items()):
            refusals.add_metric([reason], count)
        yield refusals
        yield CounterMetricFamily(
            OWN_PREFIX + "handler_failures", "Requests whose handler raised; rolled back, answered UNKNOWN_SERVER_ERROR.", value=handler_failures
        )
        yield CounterMetricFamily(
            OWN_PREFIX + "shard_reloads",
            "Shards reloaded from the log after a failed append.",
            value=coordinator.retired_reloads + sum(runner.reload_count for runner in coordinator.runners),
        )
        yield _gauge("quarantined_groups", "Groups not served because a record of theirs cannot be replayed.", [({}, quarantined)], prefix=OWN_PREFIX)
        yield _gauge("connections", "Open client connections.", [({}, self._connections())], prefix=OWN_PREFIX)
        requests = CounterMetricFamily(OWN_PREFIX + "requests", "Requests received, by API.", labels=["api"])
        for api, count in sorted(coordinator.requests_received.items()):
            requests.add_metric([api], count)
        yield requests


def coordinator_registry(coordinator: Coordinator, **sources: Any) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(CoordinatorCollector(coordinator, **sources))
    return registry


def render(registry: CollectorRegistry) -> str:
    return generate_latest(registry).decode()


# --- HTTP ---------------------------------------------------------------------------------------


class MetricsHttpServer:
    """``GET /metrics``: the registry; ``/ready`` (``/readyz``): 200 if ``ready()`` else 503;
    ``/healthz``: 200 while the process serves."""

    CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

    def __init__(self, host: str, port: int, registry: CollectorRegistry, ready: Callable[[], bool]) -> None:
        self._host, self._requested_port = host, port
        self._registry, self._ready = registry, ready
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/", self._metrics)
        for path in ("/ready", "/readyz"):
            app.router.add_get(path, self._readiness)
        app.router.add_get("/healthz", self._liveness)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        self._site = web.TCPSite(self._runner, self._host, self._requested_port)
        await self._site.start()

    @property
    def port(self) -> int:
        server = self._site._server if self._site is not None else None  # aiohttp keeps the bound socket here
        if not isinstance(server, asyncio.Server) or not server.sockets:  # None until started
            raise RuntimeError("metrics server not started")
        return server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self._registry), headers={"Content-Type": self.CONTENT_TYPE})

    async def _readiness(self, request: web.Request) -> web.Response:
        ready = self._ready()
        return web.Response(status=200 if ready else 503, text="ready\n" if ready else "loading\n")

    async def _liveness(self, request: web.Request) -> web.Response:
        return web.Response(text="alive\n")
