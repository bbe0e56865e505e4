"""Where a coordinator shard's records live: the record log, one partition per shard.

The interface is small. A :class:`RecordLog` has ``partition_count`` partitions; a runtime that
wants to own shard ``p`` calls ``claim(p)`` and gets a :class:`PartitionLog`, its exclusive
writer for that partition. Claiming *fences* every earlier claim of the same partition (an old
coordinator process that is still alive gets :class:`LogFencedError` on its next append) and
finishes whatever append such a writer left half-done, so that ``read()`` afterwards sees a
quiescent partition: every committed record, in order, from the beginning to the end.
``append(records)`` is atomic: after a crash or a failure the log holds all of an append's
records or none of them (the KIP writes a new target assignment as one batch).

Backends:

* :class:`MemoryLog` — records kept in the process (encoded and decoded like the real thing).
  One instance can be shared by two coordinator runtimes in one process to simulate a restart;
  the newer claim fences the older one, as a transactional id does in Kafka. An optional
  ``before_append`` hook lets tests and simulations delay or fail appends.
* :class:`KafkaLog` — the compacted topic ``__pystreams_groups`` (``cleanup.policy=compact``),
  one partition per shard, created if absent. Each partition is written transactionally, under a
  transactional id that names the partition (``log_writer.TransactionalWriter``, which speaks
  the transaction requests itself): one transaction per append gives atomicity on Apache Kafka,
  and the claim's InitProducerId fences the previous owner and aborts its open transaction.
  Reads use kafka-python consumers, ``read_committed``.

  The embedded broker (Tansu) holds back open transactions under ``read_committed`` but does not
  report *aborted* ones, so kafka-python would hand us the records of an aborted transaction.
  Every record therefore also carries a small *append frame* header (append id, index, count),
  and the loader drops an append whose writer stopped part-way (a prefix of its records followed
  only by the abort marker), while still accepting appends that compaction thinned out (see
  ``_AppendAssembler``). A crash or failure in the middle of an append thus leaves nothing
  behind on either broker. (A complete append whose commit was aborted afterwards is still
  applied on Tansu; that is the same "unknown outcome" a timed-out commit has on any broker,
  which the protocol tolerates: the request was answered with an error and the client retries.)

  "The end" of a partition is found by fetching: reading stops once the consumer's position has
  reached the high watermark reported by the fetch responses themselves, never by trusting
  ``end_offsets`` (ListOffsets LATEST is wrong on the embedded broker). Since the partition has
  just been claimed, nobody else writes to it and that watermark cannot move under us.

**Followers.** ``follow(p)`` reads a partition another coordinator owns as it grows (committed
records, whole appends), without claiming it: a hot standby replays them as they come. Its
``position()`` — the next offset and, on the Kafka log, the append it has seen part of — lets the
reader of a later claim go on from there (``read(resume=...)``), so that taking the shard over
replays only the tail. The claim still fences the old owner first, so the tail is quiescent.

Blocking kafka-python reads run on one worker thread per claimed or followed partition, so the
event loop never blocks and one slow partition never holds up another; appends are asyncio.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import dataclasses
import functools
import logging
import struct
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pystreams.coordinator import records as r
from pystreams.coordinator.log_writer import TransactionalWriter, WriterError
from pystreams.protocol.connection import parse_bootstrap
from pystreams.protocol.security import ClientSecurity

__all__ = [
    "DEFAULT_TOPIC",
    "KafkaLog",
    "LogConfigurationError",
    "LogError",
    "LogFencedError",
    "LogFollower",
    "LogPosition",
    "MemoryLog",
    "PartitionLog",
    "RecordLog",
]

log = logging.getLogger(__name__)

DEFAULT_TOPIC = "__pystreams_groups"

#: Record header that frames an append: 16-byte append id, index, count (big-endian uint32s).
FRAME_HEADER = "pystreams.append"
_FRAME = struct.Struct(">16sII")


class LogError(Exception):
    """The log could not be read or written; the outcome of a failed append is unknown."""


class LogFencedError(LogError):
    """Another writer claimed the partition after us: we no longer own this shard."""


class LogConfigurationError(LogError):
    """The log exists but cannot be used as configured (e.g. a different partition count)."""


@dataclasses.dataclass(frozen=True)
class LogPosition:
    """Where a :class:`LogFollower` stopped: the next offset to read, and what it holds of an
    append it has seen only part of (the Kafka log's assembler; None on the memory log)."""

    next_offset: int
    pending: Any = None


class PartitionLog(abc.ABC):
    """The exclusive writer (and reader) of one claimed partition."""

    partition: int

    @abc.abstractmethod
    def read(self, resume: LogPosition | None = None) -> AsyncGenerator[list[r.Record | r.UnreadableRecord], None]:
        """Every committed record of the partition, oldest first, in chunks; then stops. A stored
        record that does not decode comes as an UnreadableRecord (offset, key bytes, reason).
        With ``resume`` (a follower's position), only what comes after what it read."""

    @abc.abstractmethod
    async def append(self, records: Sequence[r.Record]) -> None:
        """Make ``records`` durable, all or none. Raises LogFencedError or LogError."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release the writer; the log itself stays."""


class LogFollower(abc.ABC):
    """Reads a partition it does not own, as it grows: committed records, whole appends."""

    partition: int

    @abc.abstractmethod
    async def poll(self) -> list[r.Record | r.UnreadableRecord]:
        """What became readable since the last call (waiting briefly for it; maybe nothing)."""

    @abc.abstractmethod
    def position(self) -> LogPosition:
        """Where the next poll would go on from; call it between polls."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Stop following."""


class RecordLog(abc.ABC):
    """A set of partitions, one per coordinator shard."""

    partition_count: int

    async def open(self) -> None:
        """Connect and check (or create) the storage. Idempotent."""

    @abc.abstractmethod
    async def claim(self, partition: int) -> PartitionLog:
        """Become the only writer of ``partition``, fencing earlier claims."""

    async def close(self) -> None:
        """Release what ``open`` acquired."""

    def scan(self, partition: int) -> AsyncIterator[list[r.Record | r.UnreadableRecord]]:
        """Read a partition without claiming it (a live owner keeps writing): for tools."""
        raise NotImplementedError(f"{type(self).__name__} cannot be scanned")

    def follow(self, partition: int) -> LogFollower:
        """Follow a partition without claiming it (a hot standby)."""
        raise NotImplementedError(f"{type(self).__name__} cannot be followed")

    async def write_tombstones(self, partition: int, raw_keys: Sequence[bytes]) -> None:
        """Append a tombstone for each key, outside any claim (the repair tool's one write)."""
        raise NotImplementedError(f"{type(self).__name__} cannot be repaired")

    @property
    def internal_topics(self) -> frozenset[str]:
        """Topics of the cluster that belong to the log, to hide from subscriptions."""
        return frozenset()

    def describe(self) -> str:
        return type(self).__name__

    def _check_partition(self, partition: int) -> None:
        if not 0 <= partition < self.partition_count:
            raise ValueError(f"partition {partition} outside 0..{self.partition_count - 1}")


# --- memory ------------------------------------------------------------------------------------

#: ``before_append(partition, records)``: awaited before an append is stored; raise to fail it.
AppendHook = Callable[[int, Sequence[r.Record]], Awaitable[None]]


class MemoryLog(RecordLog):
    """Records in memory, encoded as they would be in Kafka. Not durable across processes."""

    def __init__(self, partition_count: int, *, before_append: AppendHook | None = None, read_chunk: int = 1000) -> None:
        if partition_count < 1:
            raise ValueError("partition_count must be >= 1")
        self.partition_count = partition_count
        self.before_append = before_append
        self._read_chunk = read_chunk
        self._entries: list[list[tuple[bytes, bytes | None]]] = [[] for _ in range(partition_count)]
        self._writer_epochs = [0] * partition_count

    async def claim(self, partition: int) -> PartitionLog:
        self._check_partition(partition)
        self._writer_epochs[partition] += 1
        return _MemoryPartition(self, partition, self._writer_epochs[partition])

    def records(self, partition: int) -> list[r.Record | r.UnreadableRecord]:
        """What the partition holds, decoded (for tests and tools)."""
        return _decoded(self._entries[partition], 0)

    def append_raw(self, partition: int, key: bytes, value: bytes | None) -> None:
        """Store bytes as they are, bypassing every check (tests of what replay tolerates)."""
        self._entries[partition].append((key, value))

    def size(self, partition: int) -> int:
        return len(self._entries[partition])

    async def scan(self, partition: int) -> AsyncIterator[list[r.Record | r.UnreadableRecord]]:
        self._check_partition(partition)
        yield self.records(partition)

    async def write_tombstones(self, partition: int, raw_keys: Sequence[bytes]) -> None:
        self._check_partition(partition)
        self._entries[partition].extend((key, None) for key in raw_keys)

    def follow(self, partition: int) -> LogFollower:
        self._check_partition(partition)
        return _MemoryFollower(self, partition)

    def describe(self) -> str:
        return f"memory log, {self.partition_count} partitions"


class _MemoryPartition(PartitionLog):
    def __init__(self, owner: MemoryLog, partition: int, epoch: int) -> None:
        self._owner = owner
        self.partition = partition
        self._epoch = epoch

    def _check_owner(self) -> None:
        if self._owner._writer_epochs[self.partition] != self._epoch:
            raise LogFencedError(f"memory log partition {self.partition} was claimed by a newer writer")

    async def read(self, resume: LogPosition | None = None) -> AsyncGenerator[list[r.Record | r.UnreadableRecord], None]:
        first = 0 if resume is None else resume.next_offset
        entries = self._owner._entries[self.partition][first:]  # a stable view: appends may follow
        chunk = self._owner._read_chunk
        for start in range(0, len(entries), chunk):
            yield _decoded(entries[start : start + chunk], first + start)
            await asyncio.sleep(0)  # a big log must not starve the other shards

    async def append(self, records: Sequence[r.Record]) -> None:
        self._check_owner()
        encoded = [r.encode(record) for record in records]
        if self._owner.before_append is not None:
            await self._owner.before_append(self.partition, records)
        self._check_owner()  # claimed by someone else while the hook waited
        self._owner._entries[self.partition].extend(encoded)

    async def close(self) -> None:
        pass


def _decoded(entries: Sequence[tuple[bytes, bytes | None]], first_offset: int) -> list[r.Record | r.UnreadableRecord]:
    return [r.read_stored(first_offset + i, key, value) for i, (key, value) in enumerate(entries)]


class _MemoryFollower(LogFollower):
    """Memory appends are atomic: whatever is stored is whole."""

    def __init__(self, owner: MemoryLog, partition: int) -> None:
        self._owner = owner
        self.partition = partition
        self._next = 0

    async def poll(self) -> list[r.Record | r.UnreadableRecord]:
        await asyncio.sleep(0)
        first, entries = self._next, self._owner._entries[self.partition][self._next :]
        self._next += len(entries)
        return _decoded(entries, first)

    def position(self) -> LogPosition:
        return LogPosition(self._next)

    async def close(self) -> None:
        pass


# --- Kafka -------------------------------------------------------------------------------------


class KafkaLog(RecordLog):
    """The compacted topic ``topic`` with ``partition_count`` partitions; see the module docstring.

    ``client_config`` goes to every kafka-python client (security settings and the like).
    """

    def __init__(
        self,
        bootstrap_servers: str | Sequence[str],
        partition_count: int,
        *,
        topic: str = DEFAULT_TOPIC,
        transactional_id_prefix: str = "pystreams-coordinator",
        replication_factor: int = -1,
        append_timeout_s: float = 30.0,
        load_timeout_s: float = 300.0,
        client_id: str = "pystreams-coordinator",
        **client_config: Any,
    ) -> None:
        if partition_count < 1:
            raise ValueError("partition_count must be >= 1")
        self.bootstrap_servers = bootstrap_servers
        self.partition_count = partition_count
        self.topic = topic
        self.transactional_id_prefix = transactional_id_prefix
        self.replication_factor = replication_factor
        self.append_timeout_s = append_timeout_s
        self.load_timeout_s = load_timeout_s
        self.client_id = client_id
        self.client_config = client_config
        #: The writer's connections take the security settings among ``client_config``.
        self.security = ClientSecurity(**{field.name: client_config[field.name] for field in dataclasses.fields(ClientSecurity) if field.name in client_config})
        self._opened = False

    @property
    def internal_topics(self) -> frozenset[str]:
        return frozenset({self.topic})

    def describe(self) -> str:
        return f"Kafka topic {self.topic!r} ({self.partition_count} partitions) at {self.bootstrap_servers}"

    async def open(self) -> None:
        if self._opened:
            return
        await asyncio.get_running_loop().run_in_executor(None, self._ensure_topic)
        self._opened = True

    def _ensure_topic(self) -> None:
        from pystreams.cluster import ClusterMetadata, TopicMismatchError, TopicSpec

        spec = TopicSpec(self.topic, self.partition_count, self.replication_factor, {"cleanup.policy": "compact"})
        with ClusterMetadata(self.bootstrap_servers, client_id=f"{self.client_id}-admin", **self.client_config) as cluster:
            try:
                cluster.ensure_topics([spec])
            except TopicMismatchError as error:
                raise LogConfigurationError(
                    f"{error}. A group's shard is a hash of its id modulo the partition count, so the "
                    f"count of {self.topic!r} can never change: run with as many shards as the topic "
                    "has partitions, or point the coordinator at another log topic"
                ) from error
            except Exception as error:
                raise LogError(f"cannot create or check the log topic {self.topic!r} at {self.bootstrap_servers}: {error!r}") from error

    async def claim(self, partition: int) -> PartitionLog:
        self._check_partition(partition)
        if not self._opened:
            await self.open()
        handle = _KafkaPartition(self, partition)
        try:
            await handle.claim()
        except BaseException:
            await handle.close()
            raise
        return handle

    def follow(self, partition: int) -> LogFollower:
        self._check_partition(partition)
        return _KafkaFollower(self, partition)

    def transactional_id(self, partition: int) -> str:
        return f"{self.transactional_id_prefix}-{self.topic}-{partition}"

    async def scan(self, partition: int) -> AsyncIterator[list[r.Record | r.UnreadableRecord]]:
        self._check_partition(partition)
        reader = _KafkaPartition(self, partition)  # no producer: nobody is fenced
        try:
            async for chunk in reader.read():
                yield chunk
        finally:
            await reader.close()

    async def write_tombstones(self, partition: int, raw_keys: Sequence[bytes]) -> None:
        self._check_partition(partition)

        def write() -> None:
            from kafka import KafkaProducer

            producer = KafkaProducer(bootstrap_servers=self.bootstrap_servers, client_id=f"{self.client_id}-repair", acks="all", **self.client_config)
            try:
                for key in raw_keys:
                    producer.send(self.topic, key=key, value=None, partition=partition)
                producer.flush(timeout=self.append_timeout_s)
            finally:
                producer.close(timeout=5)

        await asyncio.get_running_loop().run_in_executor(None, write)


class _AppendAssembler:
    """Turns framed records back into whole appends; drops the unfinished ones.

    A writer sends an append's records in order, so one that died mid-append (its transaction
    aborted, yet visible on a broker that does not report aborted transactions) leaves a
    *prefix* of the append followed by nothing but the abort marker: the next offset is at most
    two past its last record. Compaction on Apache Kafka removes records too (older values of a
    key), from anywhere in an append, but then the removed records and the commit marker leave a
    wider gap, or the missing records are not a suffix. Only the first case is dropped.
    """

    def __init__(self, partition: int) -> None:
        self._partition = partition
        self._append_id: bytes | None = None
        self._count = 0
        self._pending: list[tuple[int, r.Record | r.UnreadableRecord]] = []
        self._last_offset = -1
        self.dropped_records = 0

    def add(self, offset: int, key: bytes, value: bytes | None, headers: Sequence[tuple[str, bytes]]) -> list[r.Record | r.UnreadableRecord]:
        frame = next((v for k, v in headers or () if k == FRAME_HEADER), None)
        if frame is None or len(frame) != _FRAME.size:  # not written by an append of ours: take it as it is
            return self._close(offset) + [r.read_stored(offset, key, value)]
        append_id, index, count = _FRAME.unpack(frame)
        ready: list[r.Record | r.UnreadableRecord] = []
        if append_id != self._append_id or (self._pending and index <= self._pending[-1][0]):
            ready = self._close(offset)
            self._append_id, self._count = append_id, count
        self._pending.append((index, r.read_stored(offset, key, value)))
        self._last_offset = offset
        if len(self._pending) == self._count:
            ready += self._take()
        return ready

    def finish(self, end_offset: int) -> list[r.Record | r.UnreadableRecord]:
        """The end of the partition (the offset after its last record or marker) was reached."""
        return self._close(end_offset)

    def _take(self) -> list[r.Record | r.UnreadableRecord]:
        records = [record for _, record in self._pending]
        self._pending, self._append_id = [], None
        return records

    def _close(self, next_offset: int) -> list[r.Record | r.UnreadableRecord]:
        """The pending append will get no more records: apply it, or drop it if unfinished."""
        if not self._pending:
            return []
        indexes = [index for index, _ in self._pending]
        unfinished = indexes == list(range(len(indexes))) and next_offset - self._last_offset <= 2
        if not unfinished:  # complete but for what compaction removed
            return self._take()
        log.warning(
            "log partition %d: dropping %d of %d records of an append its writer never finished",
            self._partition,
            len(self._pending),
            self._count,
        )
        self.dropped_records += len(self._pending)
        self._pending, self._append_id = [], None
        return []


class _KafkaPartition(PartitionLog):
    """One claimed partition: a transactional writer, and a worker thread of its own for reads."""

    def __init__(self, owner: KafkaLog, partition: int) -> None:
        self._owner = owner
        self.partition = partition
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"pystreams-log-{partition}")
        self._writer: TransactionalWriter | None = None
        self._closed = False

    async def _run(self, fn: Callable[..., Any], *args: Any, timeout_s: float | None = None) -> Any:
        if self._closed:
            raise LogError(f"log partition {self.partition} is closed")
        future = asyncio.get_running_loop().run_in_executor(self._executor, functools.partial(fn, *args))
        if timeout_s is None:
            return await future
        try:
            async with asyncio.timeout(timeout_s):
                return await future
        except TimeoutError:
            raise LogError(f"log partition {self.partition}: no answer within {timeout_s:g} s") from None

    # -- worker-thread side ------------------------------------------------------------------

    def _common_config(self) -> dict[str, Any]:
        return {"bootstrap_servers": self._owner.bootstrap_servers, **self._owner.client_config}

    def _open_consumer(self, start_offset: int | None = None, fetch_max_wait_ms: int = 10) -> Any:
        """A reader from ``start_offset`` (None: the beginning). A loader's fetches wait little
        for data: at the end of the partition they return at once with the high watermark
        that tells it it is done; a follower's wait longer, as it polls for ever."""
        from kafka import KafkaConsumer, TopicPartition

        consumer = KafkaConsumer(
            **self._common_config(),
            client_id=f"{self._owner.client_id}-loader-{self.partition}",
            group_id=None,
            enable_auto_commit=False,
            isolation_level="read_committed",
            max_poll_records=10_000,
            fetch_max_wait_ms=fetch_max_wait_ms,
        )
        partition = TopicPartition(self._owner.topic, self.partition)
        consumer.assign([partition])
        if start_offset is None:
            consumer.seek_to_beginning(partition)
        else:
            consumer.seek(partition, start_offset)
        return consumer, partition

    def _read_chunk(self, consumer: Any, partition: Any, assembler: _AppendAssembler) -> tuple[list[r.Record | r.UnreadableRecord], bool]:
        batches = consumer.poll(timeout_ms=20)
        records: list[r.Record | r.UnreadableRecord] = []
        for message in batches.get(partition, ()):
            records.extend(assembler.add(message.offset, message.key, message.value, message.headers))
        highwater = consumer.highwater(partition)  # from the fetch responses, not ListOffsets
        position = consumer.position(partition)
        done = highwater is not None and position >= highwater
        if done:
            records.extend(assembler.finish(position))
        return records, done

    # -- event-loop side ---------------------------------------------------------------------

    async def read(self, resume: LogPosition | None = None) -> AsyncGenerator[list[r.Record | r.UnreadableRecord], None]:
        # A new consumer even when resuming: its first high watermark comes from a fetch made
        # after the claim, so the read cannot stop short of what the fenced owner wrote last.
        start = None if resume is None else resume.next_offset
        consumer, partition = await self._run(self._open_consumer, start, timeout_s=self._owner.append_timeout_s)
        assembler = resume.pending if resume is not None and resume.pending is not None else _AppendAssembler(self.partition)
        deadline = time.monotonic() + self._owner.load_timeout_s
        try:
            while True:
                records, done = await self._run(self._read_chunk, consumer, partition, assembler, timeout_s=self._owner.append_timeout_s)
                if records:
                    yield records
                if done:
                    return
                if time.monotonic() > deadline:
                    raise LogError(f"log partition {self.partition}: not read to its end within {self._owner.load_timeout_s:g} s")
        finally:
            with contextlib.suppress(Exception):
                await self._run(consumer.close)

    async def claim(self) -> None:
        """Fence every earlier writer of the partition (and abort what it left open)."""
        owner = self._owner
        writer = self._writer = TransactionalWriter(
            parse_bootstrap(owner.bootstrap_servers),
            owner.topic,
            self.partition,
            owner.transactional_id(self.partition),
            client_id=f"{owner.client_id}-{self.partition}",
            security=owner.security,
            timeout_s=owner.append_timeout_s,
        )
        try:
            await writer.claim()
        except WriterError as error:
            raise LogError(f"log partition {self.partition}: claim failed: {error}") from error

    async def append(self, records: Sequence[r.Record]) -> None:
        if self._closed or self._writer is None:
            raise LogError(f"log partition {self.partition} has no writer")
        append_id, count = uuid.uuid4().bytes, len(records)
        entries = []
        for index, record in enumerate(records):
            key, value = r.encode(record)
            entries.append((key, value, ((FRAME_HEADER, _FRAME.pack(append_id, index, count)),)))
        try:
            await self._writer.append(entries)
        except WriterError as error:
            if error.fenced:
                raise LogFencedError(f"log partition {self.partition}: another coordinator took over ({error})") from error
            raise LogError(f"log partition {self.partition}: append failed: {error}") from error

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        writer, self._writer = self._writer, None
        if writer is not None:
            await writer.close()
        self._executor.shutdown(wait=False, cancel_futures=True)


class _KafkaFollower(LogFollower):
    """A ``read_committed`` consumer of a partition another coordinator owns, on a worker thread
    of its own, and the assembler that keeps an append until all of it has come."""

    #: How long a poll waits for records: also how long a takeover waits for a poll to end.
    POLL_MS = 100

    def __init__(self, owner: KafkaLog, partition: int) -> None:
        self.partition = partition
        self._reader = _KafkaPartition(owner, partition)  # no producer: nobody is fenced
        self._timeout_s = owner.append_timeout_s
        self._assembler = _AppendAssembler(partition)
        self._consumer: Any = None
        self._topic_partition: Any = None
        self._next = 0

    async def poll(self) -> list[r.Record | r.UnreadableRecord]:
        if self._consumer is None:
            self._consumer, self._topic_partition = await self._reader._run(self._reader._open_consumer, None, self.POLL_MS, timeout_s=self._timeout_s)
        return await self._reader._run(self._poll_once, timeout_s=self._timeout_s)

    def _poll_once(self) -> list[r.Record | r.UnreadableRecord]:
        batches = self._consumer.poll(timeout_ms=self.POLL_MS)
        records: list[r.Record | r.UnreadableRecord] = []
        for message in batches.get(self._topic_partition, ()):
            records.extend(self._assembler.add(message.offset, message.key, message.value, message.headers))
        self._next = self._consumer.position(self._topic_partition)
        return records

    def position(self) -> LogPosition:
        return LogPosition(self._next, self._assembler)

    async def close(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            with contextlib.suppress(Exception):
                await self._reader._run(consumer.close, timeout_s=self._timeout_s)
        await self._reader.close()
