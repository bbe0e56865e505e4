"""A stream thread whose tasks were taken over (exactly-once: its producer fenced) asks the group
what it owns and starts that again; a fence that hits it *while* it restarts them must lead to
another restart, not leave the member holding partitions nobody processes.

Seen in the worker-kill tests: a worker restarted on its state directory reuses its transactional
id; a new owner of a task the dead incarnation held fences that id, which fences the live worker
in the middle of its recovery, and the recovery's own TaskMigratedError found the recovery still
running and started none, so the member kept its assignment and processed nothing for good.
"""

from __future__ import annotations

import asyncio

from pystreams.worker.commits import TaskMigratedError
from pystreams.worker.process import StreamThread


class _Driver:
    def __init__(self) -> None:
        self.heartbeats = 0

    async def next_heartbeat(self) -> None:
        self.heartbeats += 1


def _thread_fenced_during_its_first_restarts(fences: int) -> tuple[StreamThread, list[str]]:
    """A StreamThread reduced to its recovery: each start of the owned tasks is fenced ``fences``
    times, then succeeds."""
    thread = StreamThread.__new__(StreamThread)
    thread.name = "stream-thread-0"
    thread.driver = _Driver()  # type: ignore[assignment]
    thread._membership_lock = asyncio.Lock()
    thread._migration_recovery = None
    thread._running = frozenset()
    starts: list[str] = []

    async def start_owned_tasks() -> None:
        if len([s for s in starts if s == "fenced"]) < fences:
            starts.append("fenced")
            thread._tasks_migrated(TaskMigratedError("the producer was fenced"))
            return
        starts.append("started")

    thread._start_owned_tasks = start_owned_tasks  # type: ignore[method-assign]
    return thread, starts


async def _recover(thread: StreamThread) -> None:
    thread._tasks_migrated(TaskMigratedError("the producer was fenced"))
    for _ in range(100):
        recovery = thread._migration_recovery
        if recovery is None:
            return
        await recovery


def test_a_fence_during_the_recovery_starts_another_until_the_tasks_start() -> None:
    thread, starts = _thread_fenced_during_its_first_restarts(fences=2)
    asyncio.run(_recover(thread))
    assert starts == ["fenced", "fenced", "started"]
    assert thread.driver.heartbeats == 3  # type: ignore[attr-defined]  # each restart first asks the group


def test_a_recovery_that_is_not_fenced_starts_the_tasks_once() -> None:
    thread, starts = _thread_fenced_during_its_first_restarts(fences=0)
    asyncio.run(_recover(thread))
    assert starts == ["started"]
