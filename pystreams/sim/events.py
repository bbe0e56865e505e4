"""The simulation's event queue: callbacks ordered by (virtual time, insertion sequence).

The sequence number breaks ties, so two events at the same millisecond always run in the order
they were scheduled and a seed replays exactly.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any


class EventQueue:
    def __init__(self) -> None:
        self._heap: list[tuple[int, int, Callable[..., Any], tuple]] = []
        self._sequence = 0

    def push(self, at_ms: int, action: Callable[..., Any], *args: Any) -> None:
        self._sequence += 1
        heapq.heappush(self._heap, (at_ms, self._sequence, action, args))

    def pop(self) -> tuple[int, Callable[..., Any], tuple]:
        at_ms, _, action, args = heapq.heappop(self._heap)
        return at_ms, action, args

    def next_time(self) -> int | None:
        return self._heap[0][0] if self._heap else None

    def __len__(self) -> int:
        return len(self._heap)
