"""Task state: key-value, window and session stores behind a record cache, backed by
compacted changelog topics, with checkpoints and restore. One store interface
(interface.py); the stores keep their data in an ordered bytes database (database.py):
RocksDB (rocksdict) on workers, memory in the test driver.

Layout on disk: ``<state_dir>/<application_id>/<task_id>/{.lock,.checkpoint,<store>/}``.
Stores take and return bytes; serdes live in the runtime above.
"""

from .cache import CacheLimits
from .changelog import (
    ChangelogReader,
    ChangelogRecord,
    ChangelogSink,
    RestoreProgress,
    TopicPartition,
    changelog_topic_config,
    changelog_topic_name,
)
from .checkpoint import read_checkpoint, write_checkpoint
from .database import OrderedBytesDatabase
from .errors import (
    CheckpointCorruptedError,
    StateError,
    StoreCorruptedError,
    TaskDirectoryLockedError,
)
from .global_store import GlobalState, GlobalStore
from .interface import BytesStore, KeyValueBytesStore, SessionBytesStore, WindowBytesStore
from .key_value_store import KeyValueChange, KeyValueStore
from .memory import MemoryDatabase
from .memory_changelog import InMemoryChangelog
from .restore import RestoreProgressLogger
from .rocksdb import RocksDBSettings
from .session_store import Session, SessionChange, SessionStore
from .task_state import StateWipe, TaskState, read_local_task_offsets
from .versioned_store import VersionedPut, VersionedStore
from .window_store import WindowChange, WindowedValue, WindowStore

__all__ = [
    "BytesStore",
    "CacheLimits",
    "ChangelogReader",
    "ChangelogRecord",
    "ChangelogSink",
    "CheckpointCorruptedError",
    "GlobalState",
    "GlobalStore",
    "InMemoryChangelog",
    "MemoryDatabase",
    "OrderedBytesDatabase",
    "KeyValueBytesStore",
    "KeyValueChange",
    "KeyValueStore",
    "RestoreProgress",
    "RestoreProgressLogger",
    "RocksDBSettings",
    "Session",
    "SessionBytesStore",
    "SessionChange",
    "SessionStore",
    "StateError",
    "StateWipe",
    "StoreCorruptedError",
    "TaskDirectoryLockedError",
    "TaskState",
    "TopicPartition",
    "VersionedPut",
    "VersionedStore",
    "WindowBytesStore",
    "WindowChange",
    "WindowStore",
    "WindowedValue",
    "changelog_topic_config",
    "changelog_topic_name",
    "read_checkpoint",
    "read_local_task_offsets",
    "write_checkpoint",
]
