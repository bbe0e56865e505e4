"""The OS thread that alone touches a stream thread's :class:`~pystreams.worker.engine.TaskEngine`
(the engine is single-threaded by design). It loops *run queued commands → poll → check lags
when due → commit when due* until stopped. The asyncio side talks to it only through commands:
``call`` queues one and awaits its result (membership events: add, revoke, lose tasks; queries),
``post`` queues one nobody waits for (replica changes). What the thread has to tell the loop —
tasks migrated, a fatal failure — it hands over with ``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from .commits import TaskMigratedError
from .engine import TaskEngine
from .errors import RecordProcessingError

log = logging.getLogger(__name__)

T = TypeVar("T")


class EngineStopped(RuntimeError):
    """A command was given to a stream thread whose engine thread has stopped (or failed)."""


class EngineThread:
    def __init__(
        self,
        name: str,
        engine: TaskEngine,
        *,
        loop: asyncio.AbstractEventLoop,
        lag_check_interval_ms: int,
        check_lags: Callable[[int], None],
        on_tasks_migrated: Callable[[TaskMigratedError], None],
        on_failure: Callable[[BaseException], None],
    ) -> None:
        """``check_lags(now_ms)`` runs on this thread every ``lag_check_interval_ms``;
        ``on_tasks_migrated`` and ``on_failure`` run on ``loop``."""
        self.name = name
        self.engine = engine
        self._loop = loop
        self._lag_check_interval_s = lag_check_interval_ms / 1000
        self._check_lags = check_lags
        self._on_tasks_migrated = on_tasks_migrated
        self._on_failure = on_failure
        self._commands: queue.SimpleQueue[tuple[Callable[[], Any], concurrent.futures.Future[Any]]] = queue.SimpleQueue()
        #: Set (under the lock) once the thread takes no more commands: a command queued after
        #: it would wait forever, so ``call`` refuses it instead.
        self._command_lock = threading.Lock()
        self._stopped_taking_commands = False
        #: Why the engine failed (None: it did not). Such an engine cannot commit.
        self.failure: BaseException | None = None
        self._stop = threading.Event()
        self._started: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    # -- the asyncio side ----------------------------------------------------------------------

    async def start(self) -> None:
        """Start the thread; returns once the engine has started (raises what it raised)."""
        self._thread.start()
        await asyncio.wrap_future(self._started)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def started(self) -> bool:
        """Whether the engine's start has finished (well or not)."""
        return self._started.done()

    async def call(self, command: Callable[[], T]) -> T:
        """Run ``command`` on the engine thread, between two polls."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        with self._command_lock:
            if self._stopped_taking_commands or not self._thread.is_alive():
                raise EngineStopped(f"{self.name}: the engine thread is not running")
            self._commands.put((command, future))
        self.engine.wake()
        return await asyncio.wrap_future(future)

    def post(self, command: Callable[[], None]) -> None:
        """Queue ``command`` with nobody waiting for it: it must log its own failures."""
        self._commands.put((command, concurrent.futures.Future()))
        self.engine.wake()

    async def stop(self, timeout_s: float) -> None:
        """Finish the commands queued, close the engine and wait (at most ``timeout_s``)."""
        self._stop.set()
        self.engine.wake()
        await asyncio.get_running_loop().run_in_executor(None, self._thread.join, timeout_s)

    # -- the thread ----------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self.engine.start()
        except BaseException as error:
            self._started.set_exception(error)
            return
        self._started.set_result(None)
        next_lag_check = 0.0
        try:
            while not self._stop.is_set():
                self._run_commands()
                try:
                    self.engine.poll()
                except TaskMigratedError as error:
                    self._to_loop(self._on_tasks_migrated, error)
                now = time.monotonic()
                if now >= next_lag_check:
                    next_lag_check = now + self._lag_check_interval_s
                    try:
                        self._check_lags(int(now * 1000))
                    except Exception:
                        # A lag is a hint: a broker that does not answer now is asked again later.
                        log.exception("%s: checking lags failed", self.name)
                try:
                    self.engine.maybe_commit()
                except TaskMigratedError as error:
                    self._to_loop(self._on_tasks_migrated, error)
                except Exception:
                    # Flushing the outputs failed; the offsets stay uncommitted (at-least-once).
                    log.exception("%s: periodic commit failed", self.name)
            self._run_commands()
        except BaseException as error:
            self.failure = error
            if isinstance(error, RecordProcessingError):  # the failure says all: where, which node, why
                log.error("%s: the engine failed: %s", self.name, error)
            else:
                log.exception("%s: the engine failed", self.name)
            self._to_loop(self._on_failure, error)
        finally:
            with self._command_lock:
                self._stopped_taking_commands = True
            self._fail_pending_commands()
            with contextlib.suppress(Exception):
                # Normally nothing is left: leaving revoked (committed) every task.
                self.engine.lose_tasks(list(self.engine.tasks))
            with contextlib.suppress(Exception):
                self.engine.close()

    def _run_commands(self) -> None:
        while True:
            try:
                command, future = self._commands.get_nowait()
            except queue.Empty:
                return
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(command())
            except BaseException as error:
                future.set_exception(error)

    def _fail_pending_commands(self) -> None:
        while True:
            try:
                _, future = self._commands.get_nowait()
            except queue.Empty:
                return
            if future.set_running_or_notify_cancel():
                future.set_exception(EngineStopped(f"{self.name}: the engine thread stopped"))

    def _to_loop(self, callback: Callable[[Any], None], argument: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed already
            self._loop.call_soon_threadsafe(callback, argument)
