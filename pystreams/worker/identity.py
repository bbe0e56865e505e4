"""A worker's stable identity under exactly-once: the ``transactional.id`` of each stream thread.

KIP-447 ties one transactional producer to one stream thread. Its transactional id must be the
same when the same worker comes back (a restart after a crash then fences its own previous
incarnation at once and aborts the transaction it left open, instead of leaving it to a
timeout) and different for every worker running at the same time (two producers with one id
fence each other). So it is the application id, the worker's identity and the thread index:

* the static instance id (``--instance-id``) when there is one (a StatefulSet pod's name);
* else a process id persisted in the state directory, like Kafka Streams' process metadata
  file, created on first use. The file is locked while the worker runs: two live workers on one
  state directory would share transactional ids (and tasks' state), so the second one stops
  with a clear error.
"""

from __future__ import annotations

import errno
import fcntl
import os
import uuid
from pathlib import Path

from pystreams.state.task_directory import application_path

PROCESS_ID_FILE = ".process-id"


class StateDirectoryInUseError(RuntimeError):
    """Another live worker of the same app uses this state directory."""


def transactional_id_for(app_id: str, *, instance_id: str | None, process_id: uuid.UUID, thread_index: int) -> str:
    identity = instance_id if instance_id else process_id.hex
    return f"{app_id}-{identity}-{thread_index}"


class ProcessIdentity:
    """The process id kept in ``<state_dir>/<app_id>/.process-id``, locked until ``close``."""

    def __init__(self, state_dir: str | os.PathLike[str], app_id: str) -> None:
        directory = application_path(state_dir, app_id)
        directory.mkdir(parents=True, exist_ok=True)
        self.path: Path = directory / PROCESS_ID_FILE
        descriptor = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            os.close(descriptor)
            if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise StateDirectoryInUseError(
                    f"another worker of app {app_id!r} runs on the state directory {directory.parent} "
                    "(two workers cannot share one under exactly-once: give each its own --state-dir)"
                ) from error
            raise
        self._descriptor: int | None = descriptor
        self.process_id = self._read_or_create(descriptor)

    @staticmethod
    def _read_or_create(descriptor: int) -> uuid.UUID:
        text = os.pread(descriptor, 64, 0).decode(errors="replace").strip()
        try:
            return uuid.UUID(text)
        except ValueError:
            pass  # absent, or torn by a crash while it was first written: a new identity
        process_id = uuid.uuid4()
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, f"{process_id}\n".encode(), 0)
        os.fsync(descriptor)
        return process_id

    def close(self) -> None:
        if self._descriptor is not None:
            fcntl.flock(self._descriptor, fcntl.LOCK_UN)
            os.close(self._descriptor)
            self._descriptor = None
