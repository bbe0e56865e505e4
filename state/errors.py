"""Errors raised by the state layer."""

from __future__ import annotations


class StateError(Exception):
    """Base class of every state-store error."""


class TaskDirectoryLockedError(StateError):
    """Another process (or another TaskState in this one) already holds the task's state."""


class StoreCorruptedError(StateError):
    """RocksDB reported corruption while reading a store.

    The runtime should close the task with ``wipe=True`` and reopen it; the store is then
    rebuilt from its changelog (Kafka Streams' TaskCorruptedException)."""


class CheckpointCorruptedError(StateError):
    """A checkpoint file exists but cannot be parsed or fails validation."""
