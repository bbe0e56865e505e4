"""Unit-test an app without a broker: Kafka Streams' ``TopologyTestDriver`` for pystreams.

    from pystreams.testing import TopologyTestDriver

    with TopologyTestDriver(app) as driver:
        lines = driver.input_topic("text-lines")
        counts = driver.output_topic("word-counts")
        lines.pipe_input(None, "a b a", timestamp=1_000)
        assert counts.read_table() == {"a": 2, "b": 1}
        assert driver.store_contents("counts") == {"a": 2, "b": 1}

The driver runs the worker's own tasks (``pystreams.worker.StreamTask``: the same kernels,
the same stores and record caches, over the in-memory store backend: no RocksDB, no disk) in
this thread: deterministic, no broker, no threads of its own. As Kafka Streams' driver does, it processes each piped record
to the end — through repartition topics, whose records it hands to the reading task at once
— and then commits every task, so table updates (folded per key within one input record)
reach the output topics after every record.

Topics have one partition unless ``partitions`` says otherwise; with more, input records
go to the partition Kafka's default partitioner picks for their key bytes (or the one given),
each partition is a task, and stream time is per task, as on a worker. Stream time moves with
the timestamps of the records piped in (``pipe_input(timestamp=...)``, or an input topic's
own clock: ``start_ms``, ``auto_advance_ms``, ``advance_time``); wall-clock time moves only
with ``advance_wall_clock``, which runs the wall-clock punctuations that come due.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pystreams.serdes import Bytes, Serde
from pystreams.state import CacheLimits, ChangelogRecord, GlobalState, TopicPartition
from pystreams.topology.ir import SinkNode, SourceNode, TaskId, Topology
from pystreams.topology.patterns import matching_topics
from pystreams.topology.resolve import ResolvedTopology, resolve
from pystreams.topology.stores import TypedStore, typed
from pystreams.worker.engine import ErrorHandling
from pystreams.worker.errors import ErrorPolicy
from pystreams.worker.packing import UnpackedRecord, partition_for_key
from pystreams.worker.tasks import StreamTask

__all__ = ["TestInputTopic", "TestOutputTopic", "TestRecord", "TopologyTestDriver"]

Headers = Sequence[tuple[str, bytes]]


@dataclass(frozen=True, slots=True)
class TestRecord:
    """A record read from an output topic (deserialized unless the topic was opened raw)."""

    __test__ = False  # not a pytest test class

    key: Any
    value: Any
    timestamp: int
    headers: tuple[tuple[str, bytes], ...] = ()
    partition: int = 0


@dataclass(frozen=True, slots=True)
class _Written:
    """A record a task wrote, as bytes."""

    topic: str
    partition: int
    key: bytes | None
    value: bytes | None
    timestamp: int
    headers: tuple[tuple[str, bytes], ...]


class _Delivered:
    """What the worker's changelog sink keeps of a send: a future that completed."""

    __slots__ = ("value",)
    is_done = True
    exception = None

    def __init__(self, offset: int) -> None:
        self.value = _Offset(offset)

    def failed(self) -> bool:
        return False


@dataclass(frozen=True, slots=True)
class _Offset:
    offset: int


class _DriverSender:
    """Stands in for the worker's ``RecordSender``: output records are kept per topic,
    repartition records go back to the driver to be processed at once, changelog writes are
    acknowledged on the spot."""

    def __init__(self, driver: TopologyTestDriver) -> None:
        self._driver = driver
        self._changelog_offsets: dict[tuple[str, int], int] = {}
        self.records_sent = 0

    def send(self, topic: str, key: bytes | None, value: bytes | None, timestamp_ms: int | None, headers: Headers = ()) -> None:
        self._driver._written(topic, key, value, timestamp_ms, tuple(headers))

    def send_partitioned(
        self, topic: str, key: bytes | None, value: bytes | None, timestamp_ms: int | None, partitioner: Callable[[bytes, int], int], headers: Headers = ()
    ) -> None:
        self._driver._written(topic, key, value, timestamp_ms, tuple(headers), partitioner)

    def send_with_headers(self, topic: str, key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes]]) -> None:
        self._driver._written(topic, key, value, None, tuple(headers))

    def send_to_partition(self, topic: str, partition: int, key: bytes | None, value: bytes | None, timestamp_ms: int | None = None) -> _Delivered:
        offset = self._changelog_offsets.get((topic, partition), 0)
        self._changelog_offsets[(topic, partition)] = offset + 1
        return _Delivered(offset)

    def repartition_sink(self, topic: str) -> Any:
        def append(key: bytes | None, value: bytes | None, timestamp: int, headers: Headers) -> None:
            self._driver._written(topic, key, value, timestamp, tuple(headers))

        return append

    def send_repartition_buffers(self) -> None:
        pass

    def flush(self, timeout_s: float | None = None) -> None:
        pass


class TopologyTestDriver:
    """Runs an app's topology in memory, record by record. Use it as a context manager (or
    call ``close``) so the temporary state is removed.

    ``partitions``: partition counts of the app's input topics (named ones default to 1) and
    of any topic a pattern source should match; sink topics may be listed too, so output
    records carry the partition a producer would pick. ``initial_wall_clock_ms``: the wall
    clock at start (wall-clock punctuations are scheduled from it). The error policies are the
    app's (``App(processing_errors=...)``, a source's ``deserialization_errors=``), replaced by
    the ones given here as ``pystreams worker --processing-errors ...`` replaces them; ``fail``
    raises ``pystreams.worker.RecordProcessingError`` from ``pipe_input``.
    """

    def __init__(
        self,
        app: Any,
        *,
        partitions: Mapping[str, int] | None = None,
        initial_wall_clock_ms: int = 0,
        deserialization_errors: ErrorPolicy | str | None = None,
        processing_errors: ErrorPolicy | str | None = None,
        dead_letter_topic: str | None = None,
        cache_limits: CacheLimits | None = None,
    ) -> None:
        topology: Topology = app if isinstance(app, Topology) else app.topology()
        self.topology = topology
        self.resolved: ResolvedTopology = resolve(topology, _input_partition_counts(topology, partitions or {}))
        self._partition_counts = {**dict(partitions or {}), **self.resolved.partitions}
        self._errors = ErrorHandling(
            topology.errors.overridden(
                deserialization=deserialization_errors,
                processing=processing_errors,
                dead_letter_topic=dead_letter_topic,
            )
        )
        self._errors.policies.check()
        self._sender = _DriverSender(self)
        self._repartition_topics = frozenset(topology.repartition_topics)
        self._pending: deque[_Written] = deque()
        self._outputs: dict[str, deque[_Written]] = {}
        self._next_offsets: dict[tuple[str, int], int] = {}
        self._null_key_partitions = random.Random(0)
        self._tasks: dict[TaskId, StreamTask] = {}
        self._task_of: dict[tuple[str, int], StreamTask] = {}
        self.wall_clock_ms = initial_wall_clock_ms
        self._closed = False
        # Global tables in memory: a record piped into a global topic is applied at once, as
        # Kafka Streams' driver does.
        self._global = GlobalState(None, topology.app_id, {name: table.topic for name, table in topology.global_tables.items()})
        self._global_topics = {table.topic: table for table in topology.global_tables.values()}
        try:
            for task_id in self.resolved.tasks:
                task = StreamTask(
                    self.resolved,
                    task_id,
                    state_dir=None,  # stores in memory
                    sender=self._sender,
                    errors=self._errors,
                    cache_limits=cache_limits or CacheLimits(),
                    global_stores=self._global.stores,
                )
                self._tasks[task_id] = task
                task.initialize()
                for topic, partition in self.resolved.input_partitions(task_id):
                    self._task_of[(topic, partition)] = task
            for task in self._tasks.values():
                task.punctuate_wall_clock(self.wall_clock_ms)  # schedules wall-clock punctuations
            self._settle()
        except BaseException:
            self.close()
            raise

    # -- topics ---------------------------------------------------------------------------

    def input_topic(
        self,
        topic: str,
        *,
        key: Serde | None = None,
        value: Serde | None = None,
        start_ms: int = 0,
        auto_advance_ms: int = 0,
    ) -> TestInputTopic:
        """A source topic of the app, to pipe records into (serialized with its source's
        serdes unless ``key``/``value`` say otherwise). Records piped without a timestamp
        get the topic's clock: ``start_ms``, then ``auto_advance_ms`` later each time."""
        node = self._source_node(topic)
        return TestInputTopic(self, topic, key or node.key_serde, value or node.value_serde, start_ms, auto_advance_ms)

    def output_topic(self, topic: str, *, key: Serde | None = None, value: Serde | None = None) -> TestOutputTopic:
        """A topic the app writes, to read records from (deserialized with the serdes of the
        sink writing it unless ``key``/``value`` say otherwise; a dead-letter topic is read
        with ``Bytes`` serdes, as its records are the failed input's bytes)."""
        if key is None or value is None:
            sink_key, sink_value = self._sink_serdes(topic)
            key, value = key or sink_key, value or sink_value
        return TestOutputTopic(self, topic, key, value)

    def pipe_input(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        timestamp: int,
        *,
        headers: Headers = (),
        partition: int | None = None,
    ) -> None:
        """Pipe one record of *bytes* into ``topic`` and process it to the end (then commit).
        ``TestInputTopic.pipe_input`` serializes for you. ``headers`` reach the task as a
        worker's consumer hands them over (a dead letter carries its own headers: why it
        failed; pystreams' sinks write none)."""
        self._check_open()
        self._source_node(topic)  # raises, naming the inputs, for any other topic
        count = self._partition_counts[topic]
        if partition is None:
            partition = self._partition_for(key, count)
        elif not 0 <= partition < count:
            raise ValueError(f"topic {topic!r} has {count} partition(s); there is no partition {partition}")
        if topic in self._global_topics:
            offset = self._next_offsets.get((topic, partition), 0)
            self._next_offsets[(topic, partition)] = offset + 1
            self._global.store_of(topic).apply(partition, [ChangelogRecord(offset, key, value)])  # type: ignore[arg-type]
            return
        self._process(topic, partition, key, value, timestamp, tuple(headers))
        self._settle()

    # -- time -----------------------------------------------------------------------------

    def advance_wall_clock(self, millis: int) -> None:
        """Move the wall clock forward and run the wall-clock punctuations that come due."""
        self._check_open()
        if millis < 0:
            raise ValueError(f"the wall clock only moves forward, not by {millis} ms")
        self.wall_clock_ms += millis
        for task in self._tasks.values():
            task.punctuate_wall_clock(self.wall_clock_ms)
        self._settle()

    # -- stores ---------------------------------------------------------------------------

    def store(self, name: str, *, partition: int | None = None) -> TypedStore:
        """Store ``name`` of the task of ``partition`` (needed only when its sub-topology has
        several tasks), as a processor sees it: ``get``, ``items``, ``fetch``, ..."""
        self._check_open()
        if name in self.topology.global_tables:
            return typed(self._global.stores[name], self.topology.global_tables[name].store)  # the global table's own
        instances = {task_id.partition: task.graph.typed_stores[name] for task_id, task in self._tasks.items() if name in task.graph.typed_stores}
        if not instances:
            raise KeyError(f"app {self.topology.app_id!r} has no store named {name!r}")
        if partition is None:
            if len(instances) > 1:
                raise ValueError(f"store {name!r} has one instance per partition {sorted(instances)}: pass partition=")
            partition = next(iter(instances))
        return instances[partition]

    def store_contents(self, name: str) -> dict[Any, Any]:
        """Every entry of store ``name`` over every task, deserialized: ``key -> value`` for a
        key-value store, ``(key, window start) -> value`` for a window store and ``(key,
        start, end) -> value`` for a session store."""
        self._check_open()
        if name in self.topology.global_tables:
            return dict(self.store(name).items())
        contents: dict[Any, Any] = {}
        found = False
        for task in self._tasks.values():
            store = task.graph.typed_stores.get(name)
            if store is not None:
                found = True
                contents.update(store.items())
        if not found:
            raise KeyError(f"app {self.topology.app_id!r} has no store named {name!r}")
        return contents

    @property
    def late_records_dropped(self) -> int:
        """Records that windowed nodes dropped as late, over every task."""
        return sum(task.ctx.late_records_dropped for task in self._tasks.values())

    @property
    def invalid_timestamps_dropped(self) -> int:
        """Records skipped because their timestamp was negative, over every task."""
        return sum(task.ctx.invalid_timestamps_dropped for task in self._tasks.values())

    @property
    def null_keys_dropped(self) -> int:
        """Records tables, aggregations and joins skipped for their null key, over every task."""
        return sum(task.ctx.null_keys_dropped for task in self._tasks.values())

    @property
    def failures(self) -> list[Any]:
        """Records skipped under the log-and-continue or dead-letter policies, oldest first."""
        return list(self._errors.recent_failures)

    # -- lifecycle ------------------------------------------------------------------------

    def close(self) -> None:
        """Close every processor and drop the state."""
        if self._closed:
            return
        self._closed = True
        for task in self._tasks.values():
            task.close_dirty()
        self._global.close()

    def __enter__(self) -> TopologyTestDriver:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- internals --------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the test driver is closed")

    def _source_node(self, topic: str) -> Any:
        if topic in self._global_topics:
            return self._global_topics[topic]  # its serdes are the global table's
        for node_name, topics in self.resolved.source_topics.items():
            node = self.topology.source(node_name)
            if topic in topics and not (isinstance(node, SourceNode) and node.internal):
                return node
        inputs = sorted({*(t for topics in self.resolved.source_topics.values() for t in topics if t not in self._repartition_topics), *self._global_topics})
        raise ValueError(f"topic {topic!r} is not an input topic of app {self.topology.app_id!r} (inputs: {inputs})")

    def _sink_serdes(self, topic: str) -> tuple[Serde, Serde]:
        if topic == self._errors.dead_letter_topic:
            return Bytes(), Bytes()
        sinks = [node for node in self.topology.nodes.values() if isinstance(node, SinkNode) and node.topic == topic]
        if not sinks or sinks[0].internal:
            raise ValueError(f"app {self.topology.app_id!r} writes no topic {topic!r}")
        serde_pairs = {(sink.key_serde, sink.value_serde) for sink in sinks}
        if len(serde_pairs) > 1:
            raise ValueError(f"sinks write {topic!r} with different serdes; pass key= and value=")
        return next(iter(serde_pairs))

    def _partition_for(self, key: bytes | None, count: int, partitioner: Callable[[bytes, int], int] = partition_for_key) -> int:
        if count == 1:
            return 0
        if key is None:
            return self._null_key_partitions.randrange(count)
        return partitioner(key, count)

    def _written(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        timestamp: int | None,
        headers: tuple[tuple[str, bytes], ...],
        partitioner: Callable[[bytes, int], int] = partition_for_key,
    ) -> None:
        count = self._partition_counts.get(topic, 1)
        record = _Written(topic, self._partition_for(key, count, partitioner), key, value, timestamp if timestamp is not None else self.wall_clock_ms, headers)
        if topic in self._repartition_topics:
            self._pending.append(record)
        else:
            self._outputs.setdefault(topic, deque()).append(record)

    def _process(self, topic: str, partition: int, key: bytes | None, value: bytes | None, timestamp: int, headers: Headers) -> None:
        task = self._task_of[(topic, partition)]
        offset = self._next_offsets.get((topic, partition), 0)
        self._next_offsets[(topic, partition)] = offset + 1
        record = UnpackedRecord(topic, partition, offset, timestamp, key, value, tuple(headers))
        task.process([record])
        task.mark_consumed(TopicPartition(topic, partition), offset + 1)

    def _settle(self) -> None:
        """Process repartition records until none are left, then commit every task (which
        forwards table updates); repeat while commits produce more."""
        while True:
            while self._pending:
                written = self._pending.popleft()
                self._process(written.topic, written.partition, written.key, written.value, written.timestamp, written.headers)
            for task in self._tasks.values():
                task.flush()
            if not self._pending:
                return

    def _read(self, topic: str) -> deque[_Written]:
        return self._outputs.setdefault(topic, deque())


class TestInputTopic:
    """An input topic of a ``TopologyTestDriver``: ``pipe_input(key, value, timestamp=...)``."""

    __test__ = False

    def __init__(
        self,
        driver: TopologyTestDriver,
        topic: str,
        key_serde: Serde,
        value_serde: Serde,
        start_ms: int,
        auto_advance_ms: int,
    ) -> None:
        self.driver = driver
        self.topic = topic
        self._key = key_serde.serialize
        self._value = value_serde.serialize
        self.next_timestamp = start_ms
        self.auto_advance_ms = auto_advance_ms

    def pipe_input(
        self,
        key: Any,
        value: Any,
        *,
        timestamp: int | None = None,
        headers: Headers = (),
        partition: int | None = None,
    ) -> None:
        """Serialize and pipe one record; without ``timestamp`` it gets the topic's clock."""
        if timestamp is None:
            timestamp = self.next_timestamp
            self.next_timestamp += self.auto_advance_ms
        self.driver.pipe_input(self.topic, self._key(key), self._value(value), timestamp, headers=headers, partition=partition)

    def pipe_inputs(self, records: Iterable[tuple[Any, Any] | tuple[Any, Any, int]]) -> None:
        """Pipe ``(key, value)`` or ``(key, value, timestamp)`` records in order."""
        for key, value, *timestamp in records:
            self.pipe_input(key, value, timestamp=timestamp[0] if timestamp else None)

    def pipe_values(self, values: Iterable[Any]) -> None:
        """Pipe records with a null key."""
        for value in values:
            self.pipe_input(None, value)

    def advance_time(self, millis: int) -> None:
        """Move this topic's clock (the timestamp of the next record piped without one)."""
        self.next_timestamp += millis


class TestOutputTopic:
    """An output topic of a ``TopologyTestDriver``; reading consumes its records."""

    __test__ = False

    def __init__(self, driver: TopologyTestDriver, topic: str, key_serde: Serde, value_serde: Serde) -> None:
        self.driver = driver
        self.topic = topic
        self._key_of = key_serde.deserialize
        self._value_of = value_serde.deserialize

    @property
    def queue_size(self) -> int:
        return len(self.driver._read(self.topic))

    @property
    def is_empty(self) -> bool:
        return not self.driver._read(self.topic)

    def read_record(self) -> TestRecord:
        queue = self.driver._read(self.topic)
        if not queue:
            raise LookupError(f"no record left in output topic {self.topic!r}")
        written = queue.popleft()
        return TestRecord(
            self._key_of(written.key),
            self._value_of(written.value),
            written.timestamp,
            written.headers,
            written.partition,
        )

    def read_records(self) -> list[TestRecord]:
        return list(self._drain())

    def read_key_value(self) -> tuple[Any, Any]:
        record = self.read_record()
        return record.key, record.value

    def read_key_values(self) -> list[tuple[Any, Any]]:
        return [(record.key, record.value) for record in self._drain()]

    def read_values(self) -> list[Any]:
        return [record.value for record in self._drain()]

    def read_table(self) -> dict[Any, Any]:
        """The latest value per key (a null value deletes the key): what a consumer of a
        compacted topic ends up with."""
        table: dict[Any, Any] = {}
        for record in self._drain():
            if record.value is None:
                table.pop(record.key, None)
            else:
                table[record.key] = record.value
        return table

    def _drain(self) -> Iterator[TestRecord]:
        while not self.is_empty:
            yield self.read_record()


def _input_partition_counts(topology: Topology, partitions: Mapping[str, int]) -> dict[str, int]:
    """Partition counts of every input topic: given, else 1; pattern sources match the given
    topics (a pattern source with no matching topic fails in ``resolve``, naming it)."""
    counts = {topic: count for topic, count in partitions.items()}
    for topic in (*topology.external_source_topics, *topology.global_topics):
        counts.setdefault(topic, 1)
    for node in topology.nodes.values():
        if isinstance(node, SourceNode) and node.pattern is not None:
            for topic in matching_topics(node.pattern, node.name, partitions):
                counts.setdefault(topic, partitions[topic])
    for count in counts.values():
        if not isinstance(count, int) or count < 1:
            raise ValueError(f"partition counts must be positive ints, got {dict(partitions)}")
    return counts
