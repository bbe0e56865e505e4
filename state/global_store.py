"""Global tables' state (Kafka Streams' global state stores): every partition of a table's
topic in one database per table, under ``<state_dir>/<application_id>/global`` — locked and
checkpointed like a task directory, so one process holds it and a restart reads only what
the topic gained since the checkpoint.

The topic is the changelog: records are applied as written (their key and value bytes; a
null value deletes, a null key is skipped as Kafka Streams skips it), nothing is ever
written back, and the checkpoint keeps the next offset of every partition. A store knows
nothing of serdes or Kafka clients: the runtime reads the topic and applies what it fetched.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator, Mapping, Sequence

from .changelog import ChangelogRecord, TopicPartition
from .database import OrderedBytesDatabase
from .errors import StateError
from .key_value_store import _prefix_end, _successor
from .memory import MemoryTaskStorage
from .rocksdb import RocksDBSettings
from .task_directory import TaskDirectory
from .task_storage import RocksDBTaskStorage, StateWipe, TaskStorage

log = logging.getLogger(__name__)

#: The directory of a process's global tables, beside its task directories.
GLOBAL_DIRECTORY = "global"


class GlobalStore:
    """One global table's rows, read-only to everything but its topic.

    One thread applies records (the process's global thread) while others read (tasks,
    queries). A key lookup needs nothing more; a scan is read whole under the lock the applies
    take, since the database's scan re-seeks at its end to tell a finished scan from a cut-short
    one, and a key written meanwhile past its last would look like the latter."""

    def __init__(self, name: str, topic: str, database: OrderedBytesDatabase, positions: Mapping[int, int]) -> None:
        self.name = name
        self.topic = topic
        self._db = database
        self._writing = threading.Lock()
        #: Next offset to apply, per partition of the topic.
        self._positions: dict[int, int] = dict(positions)
        self.records_applied = 0
        #: Records of the topic skipped for their null key (a table has no row for one).
        self.null_keys_skipped = 0

    @property
    def positions(self) -> dict[TopicPartition, int]:
        return {TopicPartition(self.topic, partition): offset for partition, offset in self._positions.items()}

    def position(self, partition: int) -> int | None:
        return self._positions.get(partition)

    def apply(self, partition: int, records: Sequence[ChangelogRecord], end_offset: int | None = None) -> int:
        """Apply records fetched from ``partition`` (in offset order) in one batch and move its
        position past them — to ``end_offset`` when given (a restore read up to there: the
        offsets between are markers or compacted away). Returns the records applied."""
        batch = self._db.new_batch()
        put, delete = batch.put, batch.delete
        skipped = 0
        for _, key, value, _ in records:
            if key is None:
                skipped += 1
            elif value is None:
                delete(key)
            else:
                put(key, value)
        if not batch.is_empty():
            with self._writing:
                self._db.write(batch)
        position = records[-1][0] + 1 if records else self._positions.get(partition, 0)
        if end_offset is not None:
            position = max(position, end_offset)
        self._positions[partition] = max(position, self._positions.get(partition, 0))
        if skipped:
            if not self.null_keys_skipped:
                log.warning("global table %s skips records of %s with a null key, as Kafka Streams does", self.name, self.topic)
            self.null_keys_skipped += skipped
        applied = len(records) - skipped
        self.records_applied += applied
        return applied

    # -- reads (a key-value store's, for lookups, processors and queries) -------------------

    def get(self, key: bytes) -> bytes | None:
        return self._db.get(key)

    def range(self, key_from: bytes | None, key_to: bytes | None) -> Iterator[tuple[bytes, bytes]]:
        """Entries with ``key_from <= key <= key_to`` (both inclusive; None: unbounded)."""
        return self._scan(key_from, None if key_to is None else _successor(key_to))

    def prefix_scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        return self._scan(prefix, _prefix_end(prefix))

    def all(self) -> Iterator[tuple[bytes, bytes]]:
        return self._scan(None, None)

    def _scan(self, lower: bytes | None, upper: bytes | None) -> Iterator[tuple[bytes, bytes]]:
        with self._writing:
            return iter(list(self._db.scan(lower, upper)))

    def approximate_count(self) -> int:
        return self._db.estimate_num_keys()

    def put(self, key: bytes, value: bytes | None = None) -> None:
        raise StateError(f"global table {self.name!r} is read-only: write its topic {self.topic!r} instead")

    put_if_absent = delete = put

    def flush_to_disk(self) -> None:
        self._db.flush_memtables()

    def close(self) -> None:
        self._db.close()


class GlobalState:
    """The global tables of one process: their stores, checkpoint and lock. ``state_dir``
    None keeps them in memory (the test driver), with no directory, lock or checkpoint."""

    def __init__(
        self,
        state_dir: str | os.PathLike[str] | None,
        application_id: str,
        topics: Mapping[str, str],
        *,
        rocksdb_settings: RocksDBSettings = RocksDBSettings(),
        checkpoint_min_records: int = 0,
    ) -> None:
        """``topics``: each global table's topic, by table (store) name."""
        self.wipes: list[StateWipe] = []
        self._checkpoint_min_records = checkpoint_min_records
        self._storage: TaskStorage = (
            MemoryTaskStorage()
            if state_dir is None
            else RocksDBTaskStorage(TaskDirectory(state_dir, application_id, GLOBAL_DIRECTORY), rocksdb_settings, self._record_wipe)
        )
        self.stores: dict[str, GlobalStore] = {}
        self._by_topic: dict[str, GlobalStore] = {}
        self._closed = False
        self._written: dict[TopicPartition, int] = {}
        try:
            checkpointed = self._storage.read_checkpoint()
            for name, topic in sorted(topics.items()):
                positions = {tp.partition: offset for tp, offset in checkpointed.items() if tp.topic == topic}
                # The storage wipes a database the checkpoint does not vouch for (and says so);
                # any checkpointed partition vouches for the database as a whole.
                database, kept = self._storage.open_database(name, TopicPartition(topic, 0), min(positions.values()) if positions else None)
                if kept is None and positions:
                    # Wiped on open: stop the checkpoint file vouching for it at once, or a crash
                    # before its restore ends would leave a partial database trusted.
                    checkpointed = {tp: offset for tp, offset in checkpointed.items() if tp.topic != topic}
                    self._storage.write_checkpoint(checkpointed)
                    positions = {}
                store = GlobalStore(name, topic, database, positions)
                self.stores[name] = store
                self._by_topic[topic] = store
        except BaseException:
            self.close(checkpoint=False)
            raise
        self._written = self.positions()

    def _record_wipe(self, store_name: str | None, reason: str) -> None:
        self.wipes.append(StateWipe(GLOBAL_DIRECTORY, store_name, reason))
        log.warning("global tables%s: wiping state: %s", f" store {store_name}" if store_name else "", reason)

    def store_of(self, topic: str) -> GlobalStore:
        try:
            return self._by_topic[topic]
        except KeyError:
            raise StateError(f"no global table reads topic {topic!r}") from None

    def positions(self) -> dict[TopicPartition, int]:
        return {tp: offset for store in self.stores.values() for tp, offset in store.positions.items()}

    def checkpoint(self, *, force: bool = False) -> bool:
        """Make the applied records durable and record the positions they reach (skipped when
        nothing moved, or less than ``checkpoint_min_records`` unless ``force``)."""
        positions = self.positions()
        if positions == self._written:
            return False
        if not force and self._checkpoint_min_records:
            advanced = sum(offset - self._written.get(tp, 0) for tp, offset in positions.items())
            if advanced < self._checkpoint_min_records:
                return False
        for store in self.stores.values():
            store.flush_to_disk()  # the WAL is off: data on disk before the offsets naming it
        self._storage.write_checkpoint(positions)
        self._written = positions
        return True

    def close(self, *, checkpoint: bool = True) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if checkpoint and self.stores:
                self.checkpoint(force=True)
        finally:
            for store in self.stores.values():
                store.close()
            self.stores = {}
            self._by_topic = {}
            self._storage.release(wipe=False)
