"""The coordinator's metrics (KIP-848 "Broker Metrics") in Prometheus text format, over HTTP.

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
==============================================  ================================================

Rates and idle ratios are over a sliding window (60 s, Kafka's two 30 s samples); load times
cover every load since the process started. A *rebalance* is a new target assignment.
The HTTP side is a few lines of asyncio: ``GET /metrics`` and ``GET /ready`` (200 once every
shard is active, 503 before: a readiness probe).
"""
from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterable

log = logging.getLogger(__name__)

PREFIX = "kafka_server_group_coordinator_metrics_"
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


# --- Prometheus text format ---------------------------------------------------------------------


def _value(number: float) -> str:
    if math.isnan(number):
        return "NaN"
    if math.isinf(number):
        return "+Inf" if number > 0 else "-Inf"
    return repr(float(number)) if not float(number).is_integer() else str(int(number))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{key}="{_escape(str(value))}"' for key, value in labels.items()) + "}"


class Exposition:
    """Builds one Prometheus text exposition (format version 0.0.4)."""

    def __init__(self) -> None:
        self._lines: list[str] = []

    def metric(self, name: str, kind: str, help_text: str, samples: Iterable[tuple[dict[str, str], float]]) -> None:
        full = PREFIX + name
        self._lines.append(f"# HELP {full} {help_text}")
        self._lines.append(f"# TYPE {full} {kind}")
        for labels, value in samples:
            self._lines.append(f"{full}{_labels(labels)} {_value(value)}")

    def text(self) -> str:
        return "\n".join(self._lines) + "\n"


# --- HTTP ---------------------------------------------------------------------------------------


class MetricsHttpServer:
    """``GET /metrics`` -> ``render()``; ``GET /ready`` -> 200 if ``ready()`` else 503."""

    CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

    def __init__(self, host: str, port: int, render: Callable[[], str], ready: Callable[[], bool]) -> None:
        self._host, self._requested_port = host, port
        self._render, self._ready = render, ready
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self._host, self._requested_port)

    @property
    def port(self) -> int:
        if self._server is None or not self._server.sockets:
            raise RuntimeError("metrics server not started")
        return self._server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
            await server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(10):
                request_line = (await reader.readline()).decode("latin-1").split()
                while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                    pass  # headers are not needed
            method, path = (request_line + ["", ""])[:2]
            path = path.split("?", 1)[0]
            if method not in ("GET", "HEAD"):
                status, body, content_type = "405 Method Not Allowed", "only GET\n", "text/plain"
            elif path in ("/metrics", "/"):
                status, body, content_type = "200 OK", self._render(), self.CONTENT_TYPE
            elif path in ("/ready", "/healthz"):
                ready = self._ready()
                status = "200 OK" if ready else "503 Service Unavailable"
                body, content_type = ("ready\n" if ready else "loading\n"), "text/plain"
            else:
                status, body, content_type = "404 Not Found", "not found\n", "text/plain"
            payload = body.encode()
            head = (
                f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
                f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
            ).encode()
            writer.write(head if method == "HEAD" else head + payload)
            await writer.drain()
        except (TimeoutError, ConnectionError):
            pass
        except Exception:
            log.exception("metrics request failed")
        finally:
            writer.close()
            try:
                await writer.wait_closed()
            except OSError:
                pass
