"""Deadlines without a clock: the shard schedules by key, the runtime asks what is due."""
from __future__ import annotations

import heapq
import itertools
from collections.abc import Hashable


class Timers:
    def __init__(self) -> None:
        self._deadlines: dict[Hashable, int] = {}
        self._heap: list[tuple[int, int, Hashable]] = []
        self._sequence = itertools.count()

    def schedule(self, key: Hashable, deadline_ms: int) -> None:
        """(Re)arm ``key``; a later schedule of the same key replaces the earlier one."""
        self._deadlines[key] = deadline_ms
        heapq.heappush(self._heap, (deadline_ms, next(self._sequence), key))

    def cancel(self, key: Hashable) -> None:
        self._deadlines.pop(key, None)

    def deadline(self, key: Hashable) -> int | None:
        return self._deadlines.get(key)

    def pop_due(self, now_ms: int) -> list[Hashable]:
        """Keys whose deadline is at or before ``now_ms``, earliest first; they are disarmed."""
        due = []
        while self._heap and self._heap[0][0] <= now_ms:
            deadline, _, key = heapq.heappop(self._heap)
            if self._deadlines.get(key) == deadline:
                del self._deadlines[key]
                due.append(key)
        return due

    def next_deadline(self) -> int | None:
        while self._heap and self._deadlines.get(self._heap[0][2]) != self._heap[0][0]:
            heapq.heappop(self._heap)  # stale entry of a cancelled or re-armed key
        return self._heap[0][0] if self._heap else None

    def __len__(self) -> int:
        return len(self._deadlines)
