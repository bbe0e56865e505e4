"""Where the stores of one task keep their data: the seam between ``TaskState`` (stores,
commit, restore) and a backend. RocksDB on disk is the workers' backend; memory
(memory.py) is the test driver's.

The RocksDB storage wipes state that cannot be trusted on open, to be rebuilt from the
changelog: an unreadable checkpoint wipes the whole task; a corrupt or missing database, or a
database the checkpoint has no offset for, wipes that store. Every wipe is reported (and
logged by the task state) with its reason."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from .changelog import TopicPartition
from .checkpoint import read_checkpoint, remove_checkpoint, write_checkpoint
from .database import OrderedBytesDatabase
from .errors import CheckpointCorruptedError
from .rocksdb import DatabaseOpenError, RocksDatabase, RocksDBSettings, database_exists
from .task_directory import TaskDirectory


@dataclass(frozen=True, slots=True)
class StateWipe:
    """Why state was thrown away on open; ``store_name`` None means the whole task."""

    task_id: str
    store_name: str | None
    reason: str


class TaskStorage(Protocol):
    def read_checkpoint(self) -> dict[TopicPartition, int]:
        """The changelog offsets the stored data is known to reflect (empty: none)."""
        ...

    def open_database(self, name: str, changelog: TopicPartition, position: int | None) -> tuple[OrderedBytesDatabase, int | None]:
        """Store ``name``'s database, and the changelog position it reflects: the
        checkpointed ``position``, or None once its data was found untrustworthy and wiped."""
        ...

    def write_checkpoint(self, offsets: Mapping[TopicPartition, int]) -> None: ...

    def remove_checkpoint(self) -> None: ...

    def release(self, *, wipe: bool) -> None:
        """After every store closed: give up the task (``wipe``: deleting its data)."""
        ...


WipeListener = Callable[[str | None, str], None]


class RocksDBTaskStorage:
    """One RocksDB database per store under the task directory, which is locked until
    ``release``, and the checkpoint file beside them."""

    def __init__(self, directory: TaskDirectory, settings: RocksDBSettings, on_wipe: WipeListener) -> None:
        self.directory = directory
        self._settings = settings
        self._on_wipe = on_wipe

    def read_checkpoint(self) -> dict[TopicPartition, int]:
        try:
            try:
                return read_checkpoint(self.directory.checkpoint_path) or {}
            except CheckpointCorruptedError as error:
                self._on_wipe(None, f"checkpoint is unusable ({error}); rebuilding every store from its changelog")
                self.directory.wipe()
                return {}
        except BaseException:
            self.directory.unlock()  # the task state that would release it never opened
            raise

    def open_database(self, name: str, changelog: TopicPartition, position: int | None) -> tuple[OrderedBytesDatabase, int | None]:
        path = self.directory.store_path(name)
        if database_exists(path):
            if position is None:
                self._wipe_store(
                    name,
                    f"database has no checkpointed offset for {changelog.topic}-{changelog.partition} "
                    "(unclean shutdown before the first checkpoint?); rebuilding from the changelog",
                )
        elif position is not None:
            self._wipe_store(name, f"checkpoint has offset {position} but the database is missing; rebuilding from the changelog")
            position = None
        try:
            return RocksDatabase(path, self._settings), position
        except DatabaseOpenError as error:
            self._wipe_store(name, f"database is corrupt ({error}); rebuilding from the changelog")
            return RocksDatabase(path, self._settings), None

    def _wipe_store(self, name: str, reason: str) -> None:
        self._on_wipe(name, reason)
        self.directory.wipe_store(name)

    def write_checkpoint(self, offsets: Mapping[TopicPartition, int]) -> None:
        write_checkpoint(self.directory.checkpoint_path, offsets)

    def remove_checkpoint(self) -> None:
        remove_checkpoint(self.directory.checkpoint_path)

    def release(self, *, wipe: bool) -> None:
        try:
            if wipe:
                self.directory.wipe()
        finally:
            self.directory.unlock()
