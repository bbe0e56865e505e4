"""The on-disk home of one task's state and the lock that makes it exclusive.

<state_dir>/<application_id>/<task_id>/
    .lock           flock()ed while a TaskState has the task open; holds the owner's pid
    .checkpoint     changelog offsets (checkpoint.py)
    <store_name>/   one RocksDB database per store
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import shutil
from pathlib import Path

from .errors import TaskDirectoryLockedError

LOCK_FILE = ".lock"
CHECKPOINT_FILE = ".checkpoint"

# Kafka's legal topic characters: names become directory names and parts of topic names.
_LEGAL_NAME = re.compile(r"[A-Za-z0-9._-]+")


def check_name(kind: str, name: str) -> str:
    if not _LEGAL_NAME.fullmatch(name) or name in (".", ".."):
        raise ValueError(f"{kind} {name!r} must be made of [A-Za-z0-9._-] and not be '.' or '..'")
    return name


def application_path(state_dir: str | os.PathLike[str], application_id: str) -> Path:
    return Path(state_dir) / check_name("application id", application_id)


def task_path(state_dir: str | os.PathLike[str], application_id: str, task_id: str) -> Path:
    return application_path(state_dir, application_id) / check_name("task id", task_id)


class TaskDirectory:
    """Creates and locks ``<state_dir>/<application_id>/<task_id>``."""

    def __init__(self, state_dir: str | os.PathLike[str], application_id: str, task_id: str) -> None:
        self.task_id = task_id
        self.path = task_path(state_dir, application_id, task_id)
        self.path.mkdir(parents=True, exist_ok=True)
        self._lock_descriptor: int | None = None
        self._lock()

    @property
    def checkpoint_path(self) -> Path:
        return self.path / CHECKPOINT_FILE

    def store_path(self, store_name: str) -> Path:
        return self.path / check_name("store name", store_name)

    def _lock(self) -> None:
        lock_path = self.path / LOCK_FILE
        descriptor = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            # flock locks belong to the open file, so a second open in the same process
            # conflicts too, not only another process.
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            owner = os.pread(descriptor, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(descriptor)
            if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise TaskDirectoryLockedError(
                    f"state of task {self.task_id} at {self.path} is in use by another process or state manager (lock holder pid {owner})"
                ) from error
            raise
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, f"{os.getpid()}\n".encode(), 0)
        self._lock_descriptor = descriptor

    @property
    def locked(self) -> bool:
        return self._lock_descriptor is not None

    def unlock(self) -> None:
        if self._lock_descriptor is not None:
            fcntl.flock(self._lock_descriptor, fcntl.LOCK_UN)
            os.close(self._lock_descriptor)
            self._lock_descriptor = None

    def wipe(self) -> None:
        """Delete everything in the task directory except the lock we hold."""
        for entry in self.path.iterdir():
            if entry.name == LOCK_FILE:
                continue
            remove_path(entry)

    def wipe_store(self, store_name: str) -> None:
        remove_path(self.store_path(store_name))


def remove_path(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
