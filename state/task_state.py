"""The state of one task: its stores, checkpoint, restore and lock (Kafka Streams'
ProcessorStateManager).

Commit protocol, driven by the runtime:

    state.flush()                      # caches → RocksDB + changelog sends + forwards
    producer.flush()                   # the runtime learns the changelog offsets written
    state.checkpoint(written_offsets)  # memtables → disk, then the checkpoint file

Where the stores' databases live is a ``TaskStorage``: RocksDB under a locked task directory
with a checkpoint file (workers; see task_storage.py for when it wipes state), or memory (the
test driver). The stores and this commit protocol are the same over both.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

from .cache import CacheLimits, RecordClock
from .changelog import (
    ChangelogReader,
    ChangelogRecord,
    ChangelogSink,
    TopicPartition,
    changelog_topic_name,
)
from .checkpoint import read_checkpoint
from .errors import CheckpointCorruptedError, StateError
from .key_value_store import KeyValueChange, KeyValueStore
from .memory import MemoryTaskStorage
from .restore import ProgressListener, restore_store
from .rocksdb import RocksDBSettings
from .session_store import SessionChange, SessionStore
from .store import CachedStore, Forward
from .task_directory import CHECKPOINT_FILE, TaskDirectory, application_path, check_name
from .task_storage import RocksDBTaskStorage, StateWipe, TaskStorage
from .timestamped import TimestampedKeyValueStore, TimestampedWindowStore
from .versioned_store import VersionedStore
from .window_store import WindowChange, WindowStore

log = logging.getLogger(__name__)

StoreT = TypeVar("StoreT", bound=CachedStore)


class TaskState:
    """The stores of one task, their checkpoint and their restore (Kafka Streams'
    ProcessorStateManager). Named apart from the Spark runtime's ``TaskClocks``, which keeps
    only a Spark task's times."""

    def __init__(
        self,
        state_dir: str | os.PathLike[str] | None,
        application_id: str,
        task_id: str,
        changelog_partition: int,
        changelog_sink: ChangelogSink,
        *,
        rocksdb_settings: RocksDBSettings = RocksDBSettings(),
        on_restore_progress: ProgressListener | None = None,
        on_wipe: Callable[[StateWipe], None] | None = None,
        checkpoint_min_records: int = 0,
    ) -> None:
        """Lock the task directory and read its checkpoint (``state_dir`` None: the stores
        live in memory — the test driver's backend — with no directory, lock or checkpoint
        file; everything else, changelogs included, behaves the same).

        ``checkpoint_min_records`` > 0 skips checkpoints until the changelogs advanced by that
        many offsets (Kafka Streams uses 10,000): each checkpoint flushes memtables to a new
        SST file, which a very short commit interval would otherwise do constantly."""
        self.application_id = check_name("application id", application_id)
        self.task_id = task_id
        self.changelog_partition = changelog_partition
        self.wipes: list[StateWipe] = []
        self._sink = changelog_sink
        self._on_restore_progress = on_restore_progress
        self._on_wipe = on_wipe
        self._checkpoint_min_records = checkpoint_min_records
        self._stores: dict[str, CachedStore] = {}
        self._by_changelog: dict[TopicPartition, CachedStore] = {}
        self._closed = False
        self._storage: TaskStorage = (
            MemoryTaskStorage()
            if state_dir is None
            else RocksDBTaskStorage(TaskDirectory(state_dir, application_id, task_id), rocksdb_settings, self._record_wipe)
        )
        # Stores take their start positions from _checkpointed; _written_checkpoint is what
        # the checkpoint file says.
        self._checkpointed = self._storage.read_checkpoint()
        self._written_checkpoint: dict[TopicPartition, int] = dict(self._checkpointed)

    def _record_wipe(self, store_name: str | None, reason: str) -> None:
        wipe = StateWipe(self.task_id, store_name, reason)
        self.wipes.append(wipe)
        log.warning("task %s%s: wiping state: %s", self.task_id, f" store {store_name}" if store_name else "", reason)
        if self._on_wipe is not None:
            self._on_wipe(wipe)

    # -- stores ---------------------------------------------------------------------------

    def key_value_store(
        self,
        name: str,
        *,
        cache_limits: CacheLimits = CacheLimits(),
        forward: Forward[KeyValueChange] | None = None,
        send_old_values: bool = False,
        record_clock: RecordClock | None = None,
        timestamped: bool = False,
    ) -> KeyValueStore:
        """``timestamped``: a table's store, each row with its timestamp (timestamped.py)."""
        kind = TimestampedKeyValueStore if timestamped else KeyValueStore
        return self._open_store(kind, name, cache_limits=cache_limits, forward=forward, send_old_values=send_old_values, record_clock=record_clock)

    def versioned_store(
        self,
        name: str,
        *,
        history_ms: int,
        cache_limits: CacheLimits = CacheLimits(),
        record_clock: RecordClock | None = None,
    ) -> VersionedStore:
        """A key-value store keeping each key's versions for ``history_ms`` (versioned.py);
        it forwards nothing itself: its owner forwards each write that changes the latest."""
        return self._open_store(VersionedStore, name, history_ms=history_ms, cache_limits=cache_limits, record_clock=record_clock)

    def window_store(
        self,
        name: str,
        *,
        retention_ms: int,
        cache_limits: CacheLimits = CacheLimits(),
        forward: Forward[WindowChange] | None = None,
        send_old_values: bool = False,
        record_clock: RecordClock | None = None,
        timestamped: bool = False,
    ) -> WindowStore:
        """``timestamped``: a windowed aggregation's store, each window with its timestamp."""
        kind = TimestampedWindowStore if timestamped else WindowStore
        return self._open_store(
            kind, name, retention_ms=retention_ms, cache_limits=cache_limits, forward=forward, send_old_values=send_old_values, record_clock=record_clock
        )

    def session_store(
        self,
        name: str,
        *,
        retention_ms: int,
        cache_limits: CacheLimits = CacheLimits(),
        forward: Forward[SessionChange] | None = None,
        send_old_values: bool = False,
        record_clock: RecordClock | None = None,
    ) -> SessionStore:
        return self._open_store(
            SessionStore,
            name,
            retention_ms=retention_ms,
            cache_limits=cache_limits,
            forward=forward,
            send_old_values=send_old_values,
            record_clock=record_clock,
        )

    def _open_store(self, kind: type[StoreT], name: str, **options: Any) -> StoreT:
        self._check_open()
        if name in self._stores:
            raise StateError(f"task {self.task_id} already has a store named {name}")
        changelog = TopicPartition(changelog_topic_name(self.application_id, name), self.changelog_partition)
        database, position = self._storage.open_database(name, changelog, self._checkpointed.get(changelog))
        if position is None and self._checkpointed.pop(changelog, None) is not None:
            # Wiped on open: the checkpoint file must stop vouching for it now, or a crash
            # before its restore ends would leave a partial database trusted at the old offset.
            self._storage.write_checkpoint(self._checkpointed)
            self._written_checkpoint = dict(self._checkpointed)
        store = kind(name, database, changelog, self._sink, changelog_position=position, **options)
        self._stores[name] = store
        self._by_changelog[changelog] = store
        return store

    def store(self, name: str) -> CachedStore:
        return self._stores[name]

    @property
    def stores(self) -> Mapping[str, CachedStore]:
        return self._stores

    # -- commit ---------------------------------------------------------------------------

    def flush(self) -> None:
        """Flush every store's cache (one changelog record and one forward per key).

        A store's flush forwards updates downstream, which may write another store of the
        task (a suppression buffer behind a table) that was flushed already in this pass: the
        passes repeat until every cache is empty, so a commit covers everything its outputs
        depend on. Forwards only go downstream, so this ends."""
        self._check_open()
        stores = list(self._stores.values())
        for _ in range(len(stores) + 1):
            for store in stores:
                store.flush()
            if not any(len(store.cache) for store in stores):
                return
        raise StateError(f"task {self.task_id}: store caches still hold writes after {len(stores) + 1} flushes")

    def checkpoint(self, written_offsets: Mapping[TopicPartition, int] | None = None, *, force: bool = False) -> bool:
        """Record the changelog offsets the stores reflect and write the checkpoint file.

        ``written_offsets``: for each changelog written since the last checkpoint, the offset
        of the last record the producer acknowledged. Returns whether a file was written (it
        is skipped when nothing changed, or below ``checkpoint_min_records``)."""
        self.record_written(written_offsets or {})
        offsets = self.changelog_offsets()
        if not force:
            if offsets == self._written_checkpoint:
                return False
            if self._checkpoint_min_records and not self._advanced_enough(offsets):
                return False
        for store in self._stores.values():
            store.flush_to_disk()  # the WAL is off: data must be on disk before the offsets are
        self._storage.write_checkpoint(offsets)
        self._written_checkpoint = offsets
        return True

    def record_written(self, written_offsets: Mapping[TopicPartition, int]) -> None:
        """Advance the stores' changelog positions past the records the producer acknowledged,
        without writing a checkpoint (exactly-once: the data is not known clean on disk)."""
        self._check_open()
        for changelog, last_offset in written_offsets.items():
            store = self._by_changelog.get(changelog)
            if store is None:
                raise StateError(f"task {self.task_id} has no store with changelog {changelog}")
            store.advance_position(last_offset + 1)

    def invalidate_checkpoint(self) -> None:
        """Remove the checkpoint file: the stores are about to take writes that no commit
        covers yet (exactly-once), so after a crash they must be rebuilt from their changelogs,
        not trusted. The next ``checkpoint`` (a clean close) writes the file again."""
        self._check_open()
        self._storage.remove_checkpoint()
        self._written_checkpoint = {}

    def _advanced_enough(self, offsets: Mapping[TopicPartition, int]) -> bool:
        if offsets.keys() - self._written_checkpoint.keys():
            return True
        advanced = sum(offset - self._written_checkpoint[changelog] for changelog, offset in offsets.items())
        return advanced >= self._checkpoint_min_records

    def changelog_offsets(self) -> dict[TopicPartition, int]:
        """Next changelog offset of every store whose position is known (the checkpoint)."""
        return {store.changelog: store.changelog_position for store in self._stores.values() if store.changelog_position is not None}

    # -- restore, standbys, lag -----------------------------------------------------------

    def restore_positions(self) -> dict[TopicPartition, int | None]:
        """Where each changelog must be read from (None: from the beginning)."""
        return {store.changelog: store.changelog_position for store in self._stores.values()}

    def restore(self, reader: ChangelogReader) -> dict[str, int]:
        """Bring every store up to its changelog's current end before processing starts,
        then checkpoint. Returns the records restored per store."""
        self._check_open()
        restored: dict[str, int] = {}
        for store in self._stores.values():
            end_offset = reader.end_offset(store.changelog)
            start = store.changelog_position
            batches: Iterable[Sequence[ChangelogRecord]] = () if start is not None and start >= end_offset else reader.read(store.changelog, start, end_offset)
            restored[store.name] = restore_store(store, batches, end_offset, task_id=self.task_id, on_progress=self._on_restore_progress)
        self.checkpoint()
        return restored

    def restore_changelog(self, changelog: TopicPartition, batches: Iterable[Sequence[ChangelogRecord]], end_offset: int) -> int:
        """Restore one store from batches the caller reads (up to ``end_offset``)."""
        self._check_open()
        return restore_store(
            self._store_for(changelog),
            batches,
            end_offset,
            task_id=self.task_id,
            on_progress=self._on_restore_progress,
        )

    def apply_changelog(self, changelog: TopicPartition, records: Sequence[ChangelogRecord]) -> int:
        """Standby and warm-up tasks: apply newly fetched changelog records, no processing."""
        self._check_open()
        return self._store_for(changelog).apply_changelog(records)

    def _store_for(self, changelog: TopicPartition) -> CachedStore:
        try:
            return self._by_changelog[changelog]
        except KeyError:
            raise StateError(f"task {self.task_id} has no store with changelog {changelog}") from None

    def changelog_lags(self, end_offsets: Mapping[TopicPartition, int]) -> dict[TopicPartition, int]:
        """Changelog end − store position, for each changelog ``end_offsets`` names (the
        caller's: stores without logging have no changelog to lag behind); a store with no
        position lags by the whole changelog."""
        lags = {}
        for changelog, end_offset in end_offsets.items():
            store = self._by_changelog.get(changelog)
            if store is None:
                raise StateError(f"task {self.task_id} has no store with changelog {changelog}")
            lags[changelog] = max(0, end_offset - (store.changelog_position or 0))
        return lags

    def offset_sum(self) -> int:
        """Sum of the stores' changelog positions: the task offset sum a Streams member
        reports for lag-aware assignment (KIP-441)."""
        return sum(store.changelog_position or 0 for store in self._stores.values())

    # -- lifecycle ------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self, written_offsets: Mapping[TopicPartition, int] | None = None, *, wipe: bool = False) -> None:
        """Checkpoint (unless ``wipe``), close every store and release the lock.

        Call flush() and let the producer deliver first; cached writes still unflushed are
        dropped. ``wipe`` deletes the task's state instead (after StoreCorruptedError)."""
        if self._closed:
            return
        try:
            if not wipe:
                self.checkpoint(written_offsets, force=True)
        finally:
            self._closed = True
            for store in self._stores.values():
                store.close()
            self._storage.release(wipe=wipe)

    def __enter__(self) -> TaskState:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise StateError(f"state of task {self.task_id} is closed")


def read_local_task_offsets(state_dir: str | os.PathLike[str], application_id: str) -> dict[str, dict[TopicPartition, int]]:
    """Checkpointed changelog offsets of every task with state on this machine, assigned or
    not: what a Streams member reports as task lags so the assignor can place tasks where
    their state already is. Unreadable checkpoints count as no state."""
    application_dir = application_path(state_dir, application_id)
    if not application_dir.is_dir():
        return {}
    found: dict[str, dict[TopicPartition, int]] = {}
    for entry in sorted(application_dir.iterdir()):
        if not entry.is_dir():
            continue
        try:
            offsets = read_checkpoint(entry / CHECKPOINT_FILE)
        except CheckpointCorruptedError:
            continue
        if offsets:
            found[entry.name] = offsets
    return found
