"""Input positions under exactly-once (sans-IO): the records that make a task's input offsets
commit atomically with its outputs, and the rule a task's new owner follows before it starts.

Offsets live in our group coordinator, not in Kafka's, so ``sendOffsetsToTransaction`` has no
counterpart. Instead each commit's transaction also writes one *position record* per task whose
positions moved, to the internal topic ``<application.id>-input-positions`` (compacted, keyed by
task id, partition = the task's partition number). A position record is in the same Kafka
transaction as the sink, repartition and changelog records it accounts for, so on Apache Kafka
they become visible together or not at all; the fetch-side filter gives the embedded broker
the same meaning. The coordinator's committed offsets follow in step for lag and tooling, but a
task resumes from its position records.

Every record names its *writer* (the transactional id of the stream thread that wrote it) and
its kind:

* ``claim`` — written and committed when a task starts, before it processes anything: from then
  on the latest record of the task names its owner, even if the owner dies before its first
  commit;
* ``commit`` — the positions of a periodic commit;
* ``release`` — the last commit of an owner that gave the task up cleanly (revocation, close).

Takeover (:func:`plan_takeover`): the latest record of a task that is not a ``release`` names an
owner that may still hold an open transaction with the task's outputs (it crashed, or it is a
zombie paused past its session). The new owner *fences* that writer — initializing a producer
with its transactional id aborts its open transaction and makes every later write of the old
producer fail — then reads the positions again, to their end, and resumes from the latest
committed record. What a zombie can do: commit a transaction before it is fenced (its outputs
and positions are then both visible, and the new owner resumes after them — still once). What
it cannot do: make anything visible after the fence, or have its positions ignored.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

import msgspec

from pystreams.serdes import UNDECODABLE
from pystreams.state import TopicPartition
from pystreams.topology.ir import TaskId
from pystreams.topology.resolve import ResolvedTopology

log = logging.getLogger(__name__)

POSITION_RECORD_VERSION = 1


def positions_topic(app_id: str) -> str:
    return f"{app_id}-input-positions"


def positions_partition_count(resolved: ResolvedTopology) -> int:
    """One partition per task partition number (tasks of every sub-topology share them)."""
    return max((task.partition for task in resolved.tasks), default=0) + 1


def positions_partition(task_id: TaskId) -> int:
    return task_id.partition


class PositionKind(StrEnum):
    CLAIM = "claim"
    COMMIT = "commit"
    RELEASE = "release"


class _Offset(msgspec.Struct, array_like=True):
    topic: str
    partition: int
    offset: int


class PositionRecord(msgspec.Struct, kw_only=True):
    """The value of a position record; the key is the task id."""

    version: int = POSITION_RECORD_VERSION
    kind: PositionKind
    writer: str
    offsets: list[_Offset] = msgspec.field(default_factory=list)

    def input_offsets(self) -> dict[TopicPartition, int]:
        return {TopicPartition(o.topic, o.partition): o.offset for o in self.offsets}


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(PositionRecord)


def encode_position(task_id: TaskId, kind: PositionKind, writer: str, offsets: Mapping[TopicPartition, int]) -> tuple[bytes, bytes]:
    """(key, value) of a position record."""
    entries = [_Offset(tp.topic, tp.partition, offset) for tp, offset in sorted(offsets.items())]
    return str(task_id).encode(), _encoder.encode(PositionRecord(kind=kind, writer=writer, offsets=entries))


class UnreadablePositionError(ValueError):
    """A record of the positions topic that is not a position record of this version."""


def decode_position(key: bytes | None, value: bytes | None) -> tuple[TaskId, PositionRecord] | None:
    """The task and record, or None for a tombstone; raises UnreadablePositionError."""
    if key is None:
        raise UnreadablePositionError("a position record without a key (task id)")
    try:
        task_id = TaskId.parse(key.decode())
    except (UnicodeDecodeError, ValueError) as error:
        raise UnreadablePositionError(f"key {key!r} is not a task id: {error}") from None
    if value is None:
        return None
    try:
        record = _decoder.decode(value)
    except UNDECODABLE as error:
        raise UnreadablePositionError(f"position record of task {task_id} does not decode: {error}") from None
    if record.version != POSITION_RECORD_VERSION:
        raise UnreadablePositionError(f"position record of task {task_id} has unsupported version {record.version}")
    return task_id, record


@dataclass
class PositionTable:
    """The latest committed position record of each task seen in one positions partition: the
    one at the highest offset. Committed records are fed (offset, key, value) as each
    transaction ends, in any order: a transaction that ended later may hold older records, and
    a writer's open transaction must not hide what others committed after it (the reader's
    filter does not wait for it)."""

    latest: dict[TaskId, PositionRecord] = field(default_factory=dict)
    unreadable: int = 0
    #: Offset of each task's latest record (tombstones included).
    _offsets: dict[TaskId, int] = field(default_factory=dict)

    def offset_of(self, task_id: TaskId) -> int:
        """The offset of the task's latest record (-1: none)."""
        return self._offsets.get(task_id, -1)

    def apply(self, records: Iterable[tuple[int, bytes | None, bytes | None]]) -> None:
        for offset, key, value in records:
            try:
                decoded = decode_position(key, value)
            except UnreadablePositionError as error:
                self.unreadable += 1
                log.warning("positions topic: skipping a record: %s", error)
                continue
            if decoded is None:  # a tombstone (its key is a task id: decode_position checked)
                assert key is not None
                task_id, record = TaskId.parse(key.decode()), None
            else:
                task_id, record = decoded
            if offset <= self.offset_of(task_id):
                continue  # older than the record kept
            self._offsets[task_id] = offset
            if record is None:
                self.latest.pop(task_id, None)
            else:
                self.latest[task_id] = record


def pending_writers(pending: Iterable[tuple[int, bytes | None, bytes | None]]) -> dict[TaskId, dict[str, int]]:
    """The writers of position records still in an open transaction, per task, each with the
    offset of its newest such record."""
    writers: dict[TaskId, dict[str, int]] = {}
    for offset, key, value in pending:
        try:
            decoded = decode_position(key, value)
        except UnreadablePositionError:
            continue
        if decoded is not None:
            task_id, record = decoded
            newest = writers.setdefault(task_id, {})
            newest[record.writer] = max(offset, newest.get(record.writer, -1))
    return writers


def still_fenced(fenced_at: Mapping[str, int], newest: Mapping[str, int]) -> set[str]:
    """The writers a fence still covers, given the end offset of the positions partition just
    after each was fenced (``fenced_at``) and the offset of each writer's newest record that
    matters here (``newest``). A fenced producer cannot append, so a record at or past its fence
    comes from a later incarnation of the same transactional id (a restart on the same state
    directory), which must be fenced again if it left the task unreleased."""
    return {writer for writer, end in fenced_at.items() if newest.get(writer, -1) < end}


@dataclass(frozen=True, slots=True)
class Resume:
    """Start the task at these positions (None: no position record, ask the coordinator)."""

    offsets: dict[TopicPartition, int] | None


@dataclass(frozen=True, slots=True)
class Fence:
    """Fence these writers (their transactional ids), then read the positions again."""

    writers: frozenset[str]


@dataclass(frozen=True, slots=True)
class Wait:
    """A fenced writer's transaction is not resolved in what was read yet: read further."""

    writers: frozenset[str]


@dataclass(frozen=True, slots=True)
class Lost:
    """Another owner wrote the task's positions after us: we do not own it any more."""

    owner: str


Takeover = Resume | Fence | Wait | Lost


def plan_takeover(
    latest: PositionRecord | None,
    pending: set[str],
    *,
    me: str,
    fenced: frozenset[str] | set[str],
    reviving: bool,
) -> Takeover:
    """What a thread (transactional id ``me``) does before starting a task whose latest
    committed position record is ``latest`` and whose open transactions hold position records
    of ``pending`` writers. ``fenced``: writers this thread fenced already. ``reviving``: the
    thread owned the task a moment ago and rebuilds it after an aborted transaction; it then
    never fences anyone (whoever wrote after it took the task over)."""
    others_pending = set(pending) - {me}
    suspects = set(others_pending)
    if latest is not None and latest.kind is not PositionKind.RELEASE and latest.writer != me:
        suspects.add(latest.writer)
    if reviving:
        if latest is not None and latest.writer != me and latest.writer not in fenced and latest.kind is not PositionKind.RELEASE:
            return Lost(latest.writer)
        if others_pending - set(fenced):
            return Lost(sorted(others_pending)[0])
    to_fence = suspects - set(fenced)
    if to_fence:
        return Fence(frozenset(to_fence))
    if others_pending:
        return Wait(frozenset(others_pending))
    return Resume(None if latest is None else latest.input_offsets())
