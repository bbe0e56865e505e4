"""The worker's HTTP endpoints, served by aiohttp on the worker's own asyncio loop.

Two sets of routes exist: interactive queries (:mod:`pystreams.worker.queries`, on the user
endpoint) and operations — ``/healthz``, ``/readyz``, ``/metrics`` — (:class:`OperationsRoutes`,
on ``--http-port``). :class:`HttpSite` serves one or more route sets on one address, so both can
share a port when the two are configured alike.

Probes, as Kubernetes uses them:

``GET /healthz`` (liveness)
    200 while every stream thread's engine thread is alive (and the loop answers at all);
    503 naming the dead threads otherwise. A long restore is *not* a liveness failure: killing
    a restoring pod only starts the restore again.
``GET /readyz`` (readiness)
    200 when every stream thread has heard its assignment and has its active tasks restored
    and running; 503 with the reason per thread before that (joining, restoring, starting).
``GET /metrics``
    Prometheus text format (:mod:`pystreams.worker.metrics`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from aiohttp import web

from .metrics import CONTENT_TYPE, WorkerMetrics

if TYPE_CHECKING:
    from .process import StreamThread

log = logging.getLogger(__name__)

Routes = Sequence[web.RouteDef]


class HttpSite:
    """An aiohttp application bound to ``host:port``, serving the route sets given in order
    (a catch-all route, if any, must come last)."""

    def __init__(self, host: str, port: int, *route_sets: Routes) -> None:
        self.host, self.requested_port = host, port
        self._app = web.Application()
        for routes in route_sets:
            self._app.add_routes(routes)
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None

    async def start(self) -> None:
        # No access log: probes and scrapes would flood it.
        runner = web.AppRunner(self._app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.requested_port)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner, self._site = runner, site

    @property
    def port(self) -> int:
        """The bound port (useful when 0 asked for a free one)."""
        if self._runner is None or not self._runner.addresses:
            raise RuntimeError("the HTTP site is not started")
        return int(self._runner.addresses[0][1])

    async def stop(self) -> None:
        runner, self._runner, self._site = self._runner, None, None
        if runner is not None:
            await runner.cleanup()


class OperationsRoutes:
    """``/healthz``, ``/readyz`` and ``/metrics`` of one worker process."""

    def __init__(self, threads: Sequence[StreamThread], metrics: WorkerMetrics, *, started: Callable[[], bool] = lambda: True) -> None:
        self._threads = threads
        self._metrics = metrics
        #: False until every stream thread has been started (joining the group).
        self._started = started

    def routes(self) -> Routes:
        return [
            web.get("/healthz", self._healthz),
            web.get("/readyz", self._readyz),
            web.get("/metrics", self._metrics_page),
        ]

    def ready(self) -> bool:
        return self._started() and all(thread.ready for thread in self._threads)

    async def _healthz(self, request: web.Request) -> web.Response:
        dead = [thread.name for thread in self._threads if thread.state == "dead"]
        if dead:
            return web.Response(status=503, text=f"stream threads dead: {', '.join(dead)}\n")
        return web.Response(text="ok\n")

    async def _readyz(self, request: web.Request) -> web.Response:
        if self.ready():
            return web.Response(text="ready\n")
        if not self._started():
            return web.Response(status=503, text="starting: joining the group\n")
        states = ", ".join(f"{t.name}: {t.state}" for t in self._threads if not t.ready)
        return web.Response(status=503, text=f"not ready ({states})\n")

    async def _metrics_page(self, request: web.Request) -> web.Response:
        # Rendering walks the state directory now and then: keep it off the loop.
        body = await asyncio.get_running_loop().run_in_executor(None, self._metrics.render)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})
