"""``pystreams worker`` with the wall-clock time of each start-up and stop phase on stderr, for
the benchmarks' breakdowns (``rolling_restart``). Same arguments as ``pystreams worker``:

    python benchmarks/worker_phases.py APP.py --bootstrap-servers ... --coordinator ...

Each phase prints one line ``PHASE <name> <time.time()>`` the first time it ends; the parent
subtracts the moment it launched the process. Nothing changes in what the worker does: the
phases are the worker's own functions, wrapped.
"""

from __future__ import annotations

import time

_launched_imports = time.time()

import atexit  # noqa: E402
import functools  # noqa: E402
import sys  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

PREFIX = "PHASE"
_seen: set[str] = set()


def mark(name: str, at: float | None = None) -> None:
    if name not in _seen:
        _seen.add(name)
        print(f"{PREFIX} {name} {time.time() if at is None else at:.6f}", file=sys.stderr, flush=True)


def parse_phases(text: str) -> dict[str, float]:
    """The phases a worker's output holds, by name: the wall-clock time each ended."""
    phases: dict[str, float] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == PREFIX:
            phases.setdefault(parts[1], float(parts[2]))
    return phases


def _timed(owner: Any, attribute: str, name: str, *, when: Callable[[Any], bool] = lambda _: True) -> None:
    """Mark ``name`` when ``owner.attribute`` first returns (a coroutine function: finishes)
    with a result ``when`` accepts."""
    original = getattr(owner, attribute)
    if _is_coroutine_function(original):

        @functools.wraps(original)
        async def wrapper_async(*args: Any, **kwargs: Any) -> Any:
            result = await original(*args, **kwargs)
            if when(result):
                mark(name)
            return result

        setattr(owner, attribute, wrapper_async)
        return

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        if when(result):
            mark(name)
        return result

    setattr(owner, attribute, wrapper)


def _is_coroutine_function(function: Any) -> bool:
    import inspect

    return inspect.iscoroutinefunction(function)


def main() -> int:
    mark("interpreter", _launched_imports)
    atexit.register(mark, "atexit_done")  # registered first, so it runs after every other handler
    from pystreams.commands import worker

    mark("imports")
    import pystreams.app
    from pystreams.client.driver import MemberDriver
    from pystreams.cluster import ClusterMetadata
    from pystreams.worker import process
    from pystreams.worker.engine import TaskEngine

    _timed(pystreams.app, "load_app", "load_app")
    _timed(process, "resolve_against_cluster", "resolve_topology")
    _timed(ClusterMetadata, "ensure_topics", "ensure_topics")
    _timed(process.TopicNames, "refresh", "topic_names")
    _timed(TaskEngine, "start", "engine_clients")
    _timed(MemberDriver, "start", "joined")
    _timed(TaskEngine, "add_tasks", "tasks_added")
    _timed(TaskEngine, "poll", "first_records", when=lambda processed: bool(processed))
    _timed(TaskEngine, "revoke_tasks", "revoked")
    _timed(MemberDriver, "leave", "left")
    _timed(process.StreamThread, "shutdown", "threads_stopped")
    atexit.register(mark, "exit")
    return worker.main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
