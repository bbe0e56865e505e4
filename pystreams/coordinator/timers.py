"""Deadlines without a clock: the shard schedules by key, the runtime asks what is due.

Timer keys are small frozen values, one type per kind of deadline, so expiry dispatches with
``match`` and a key can never be confused with another kind's.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SessionTimer:
    """A member that does not heartbeat before this is removed (session timeout)."""

    group_id: str
    member_id: str


@dataclass(frozen=True, slots=True)
class RevocationTimer:
    """A member still revoking at this point is removed (its rebalance timeout)."""

    group_id: str
    member_id: str


@dataclass(frozen=True, slots=True)
class ComputationTimer:
    """A client-side assignment not installed by now moves to another member."""

    group_id: str


@dataclass(frozen=True, slots=True)
class EmptyGroupTimer:
    """An EMPTY group still empty by now is deleted (offsets retention)."""

    group_id: str


@dataclass(frozen=True, slots=True)
class ClassicHeartbeatTimer:
    """A classic group's member (or KIP-394 pending member) that does not heartbeat before this
    is removed: its session timeout, or the new-member join timeout."""

    group_id: str
    member_id: str


@dataclass(frozen=True, slots=True)
class ClassicJoinTimer:
    """A classic group's join phase ends by this time: the initial rebalance delay, or the
    rebalance timeout for members to rejoin."""

    group_id: str


@dataclass(frozen=True, slots=True)
class ClassicSyncTimer:
    """Members of a classic group that joined but have not synced by this time are removed."""

    group_id: str


@dataclass(frozen=True, slots=True)
class ClassicMemberJoinTimer:
    """A classic member of a consumer group told to rejoin (REBALANCE_IN_PROGRESS) that has not
    by this time is fenced (its rebalance timeout)."""

    group_id: str
    member_id: str


@dataclass(frozen=True, slots=True)
class ClassicMemberSyncTimer:
    """A classic member of a consumer group that joined but has not synced by this time is fenced."""

    group_id: str
    member_id: str


TimerKey = (
    SessionTimer
    | RevocationTimer
    | ComputationTimer
    | EmptyGroupTimer
    | ClassicHeartbeatTimer
    | ClassicJoinTimer
    | ClassicSyncTimer
    | ClassicMemberJoinTimer
    | ClassicMemberSyncTimer
)


class Timers:
    def __init__(self) -> None:
        self._deadlines: dict[TimerKey, int] = {}
        self._heap: list[tuple[int, int, TimerKey]] = []
        self._sequence = itertools.count()

    def schedule(self, key: TimerKey, deadline_ms: int) -> None:
        """(Re)arm ``key``; a later schedule of the same key replaces the earlier one."""
        self._deadlines[key] = deadline_ms
        heapq.heappush(self._heap, (deadline_ms, next(self._sequence), key))

    def cancel(self, key: TimerKey) -> None:
        self._deadlines.pop(key, None)

    def deadline(self, key: TimerKey) -> int | None:
        return self._deadlines.get(key)

    def pop_due(self, now_ms: int) -> list[TimerKey]:
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
