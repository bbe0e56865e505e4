"""Global tables on a worker (Kafka Streams' global stream thread): every partition of each
global table's topic, restored into the process's global state before any task starts, then
followed as the topic grows.

One :class:`GlobalTables` per process. ``pystreams worker`` restores it before its stream
threads join the group and keeps it current from a :class:`GlobalThread` of its own, while the
tasks of every stream thread read it (RocksDB takes reads beside the thread's batched writes).
A :class:`~pystreams.worker.engine.TaskEngine` run on its own opens one itself and follows it
between its polls. Under exactly-once the topic is read ``read_committed`` behind the
transaction filter, as every other input.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from kafka import TopicPartition as KafkaTopicPartition

from pystreams.state import ChangelogRecord, GlobalState, GlobalStore, TopicPartition
from pystreams.state.restore import RESTORE_CHUNK_RECORDS
from pystreams.topology.resolve import ResolvedTopology

from .commits import ExactlyOnceCommits
from .committed_consumer import CommittedConsumer
from .kafka_io import ChangelogRestorer, make_consumer

if TYPE_CHECKING:
    from .engine import EngineConfig

log = logging.getLogger(__name__)


def global_consumers(config: EngineConfig, client_id: str) -> tuple[Any, Any | None]:
    """The consumer reading global topics, and under exactly-once the ``read_uncommitted`` one
    that finds their true ends (see ``ChangelogRestorer``)."""
    settings = {**config.client_config, **config.consumer_config}
    if not config.processing_guarantee.exactly_once:
        return make_consumer(config.bootstrap_servers, client_id, settings), None
    committed = make_consumer(config.bootstrap_servers, client_id, {**settings, **ExactlyOnceCommits.consumer_overrides})
    return CommittedConsumer(committed), make_consumer(config.bootstrap_servers, f"{client_id}-ends", settings)


class GlobalTables:
    """The global tables of one process: restore them, then ``poll`` to follow their topics."""

    def __init__(self, resolved: ResolvedTopology, state: GlobalState, consumer: Any, *, end_consumer: Any = None) -> None:
        self.state = state
        self._consumer = consumer
        self._restorer = ChangelogRestorer(consumer, end_consumer=end_consumer)
        self.partitions = tuple(
            TopicPartition(table.topic, partition)
            for table in resolved.topology.global_tables.values()
            for partition in range(resolved.partitions[table.topic])
        )
        self.records_restored = 0
        self.records_followed = 0
        self.restored = False

    @classmethod
    def open(cls, resolved: ResolvedTopology, config: EngineConfig, client_id: str) -> GlobalTables:
        """The process's global tables in ``config.state_dir``, with consumers of its settings."""
        topology = resolved.topology
        state = GlobalState(
            config.state_dir,
            topology.app_id,
            {name: table.topic for name, table in topology.global_tables.items()},
            checkpoint_min_records=config.checkpoint_min_records,
        )
        try:
            consumer, end_consumer = global_consumers(config, client_id)
        except BaseException:
            state.close()
            raise
        return cls(resolved, state, consumer, end_consumer=end_consumer)

    @property
    def stores(self) -> Mapping[str, GlobalStore]:
        return self.state.stores

    def restore(self) -> int:
        """Bring every partition to its end as of now (Kafka Streams' global bootstrap: no task
        may look a row up before), checkpoint, then follow from there. Returns the records
        applied."""
        started = time.perf_counter()
        restored = 0
        for changelog in self.partitions:
            store = self.state.store_of(changelog.topic)
            end = self._restorer.true_end_offset(changelog)
            start = store.position(changelog.partition)
            if start is not None and start >= end:
                continue
            pending: list[ChangelogRecord] = []
            for batch in self._restorer.read(changelog, start, end):
                pending.extend(batch)
                if len(pending) >= RESTORE_CHUNK_RECORDS:
                    restored += store.apply(changelog.partition, pending)
                    pending = []
            restored += store.apply(changelog.partition, pending, end_offset=end)
        self.state.checkpoint(force=True)
        self.records_restored += restored
        self.restored = True
        if restored:
            log.info("global tables %s: restored %d records in %.2f s", ", ".join(sorted(self.stores)), restored, time.perf_counter() - started)
        self._follow()
        return restored

    def _follow(self) -> None:
        consumer = self._consumer
        consumer.assign([KafkaTopicPartition(*changelog) for changelog in self.partitions])
        for changelog in self.partitions:
            partition = KafkaTopicPartition(*changelog)
            position = self.state.store_of(changelog.topic).position(changelog.partition)
            if position is None:
                consumer.seek_to_beginning(partition)
            else:
                consumer.seek(partition, position)

    def poll(self, timeout_ms: int = 0) -> int:
        """Apply what the topics gained since; returns the records applied."""
        applied = 0
        for partition, records in self._consumer.poll(timeout_ms=timeout_ms).items():
            if records:
                store = self.state.store_of(partition.topic)
                applied += store.apply(partition.partition, [ChangelogRecord(r.offset, r.key, r.value) for r in records])
        self.records_followed += applied
        return applied

    def lags(self) -> dict[str, int]:
        """Records each table is behind its topic's end, as of the follower's last fetch (a
        partition not fetched yet counts 0: its end is unknown without asking)."""
        lags = {name: 0 for name in self.stores}
        for changelog in self.partitions:
            store = self.state.store_of(changelog.topic)
            end = self._consumer.highwater(KafkaTopicPartition(*changelog))
            if end is not None:
                lags[store.name] += max(0, end - (store.position(changelog.partition) or 0))
        return lags

    def checkpoint(self) -> None:
        self.state.checkpoint()

    def close(self) -> None:
        try:
            self.state.close()
        finally:
            self._restorer.close()


class GlobalThread:
    """Follows a process's global tables on an OS thread of its own, checkpointing every
    ``checkpoint_interval_s``; a failure stops it and is handed to ``on_failure``."""

    def __init__(self, tables: GlobalTables, *, checkpoint_interval_s: float, on_failure: Callable[[BaseException], None]) -> None:
        self.tables = tables
        self._checkpoint_interval_s = checkpoint_interval_s
        self._on_failure = on_failure
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pystreams-global", daemon=True)
        self.failure: BaseException | None = None

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        next_checkpoint = time.monotonic() + self._checkpoint_interval_s
        try:
            while not self._stop.is_set():
                self.tables.poll(100)
                if time.monotonic() >= next_checkpoint:
                    self.tables.checkpoint()
                    next_checkpoint = time.monotonic() + self._checkpoint_interval_s
        except BaseException as error:
            log.exception("the global tables' thread failed")
            self.failure = error
            self._on_failure(error)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop following, then checkpoint and close the tables."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        if self._thread.is_alive():
            # Its poll is stuck: closing the store under it would fail its next write. The
            # process is exiting; the restart restores from the last checkpoint.
            log.warning("the global tables' thread did not stop within %.0f s; its state is left unclosed", timeout_s)
            return
        self.tables.close()
