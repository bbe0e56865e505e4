"""The checkpoint file of a task: for each changelog partition, the next offset to restore.

JSON (msgspec), written atomically — temporary file, fsync, rename, fsync of the directory —
so a crash leaves either the old or the new checkpoint, never a torn one:

    {"version": 2, "offsets": [{"topic": "app-counts-changelog", "partition": 3, "offset": 1042}]}

The version is also the format of the stores beside it: version 1 stores kept no row
timestamps in tables (timestamped.py), so a version 1 directory is rebuilt from its changelogs,
whose layout did not change.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import msgspec

from pystreams.serdes import UNDECODABLE

from .changelog import TopicPartition
from .errors import CheckpointCorruptedError

CHECKPOINT_VERSION = 2


class _CheckpointOffset(msgspec.Struct, forbid_unknown_fields=True):
    topic: str
    partition: int
    offset: int


class _CheckpointFile(msgspec.Struct, forbid_unknown_fields=True):
    version: int
    offsets: list[_CheckpointOffset]


_decoder = msgspec.json.Decoder(_CheckpointFile)
_encoder = msgspec.json.Encoder()


def read_checkpoint(path: str | os.PathLike[str]) -> dict[TopicPartition, int] | None:
    """The checkpointed offsets, or None when there is no checkpoint file.

    Raises CheckpointCorruptedError when the file exists but cannot be trusted."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return None
    except OSError as error:
        raise CheckpointCorruptedError(f"cannot read {path}: {error}") from error
    try:
        checkpoint = _decoder.decode(data)
    except UNDECODABLE as error:
        raise CheckpointCorruptedError(f"{path} is not a valid checkpoint: {error}") from error
    if checkpoint.version < CHECKPOINT_VERSION:
        raise CheckpointCorruptedError(f"{path} was written by an older pystreams (version {checkpoint.version}: table rows without timestamps)")
    if checkpoint.version != CHECKPOINT_VERSION:
        raise CheckpointCorruptedError(f"{path} has unsupported version {checkpoint.version}")
    offsets: dict[TopicPartition, int] = {}
    for entry in checkpoint.offsets:
        changelog = TopicPartition(entry.topic, entry.partition)
        if not entry.topic or entry.partition < 0 or entry.offset < 0:
            raise CheckpointCorruptedError(f"{path} has an invalid entry {entry}")
        if changelog in offsets:
            raise CheckpointCorruptedError(f"{path} lists {changelog} twice")
        offsets[changelog] = entry.offset
    return offsets


def write_checkpoint(path: str | os.PathLike[str], offsets: Mapping[TopicPartition, int]) -> None:
    path = Path(path)
    entries = [_CheckpointOffset(topic, partition, offset) for (topic, partition), offset in sorted(offsets.items())]
    data = _encoder.encode(_CheckpointFile(CHECKPOINT_VERSION, entries))
    temporary = path.with_name(path.name + ".tmp")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(descriptor, view) :]
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
    os.replace(temporary, path)
    _fsync_directory(path.parent)


def remove_checkpoint(path: str | os.PathLike[str]) -> None:
    """Delete the checkpoint durably (the directory is fsynced), if there is one."""
    path = Path(path)
    try:
        path.unlink()
    except FileNotFoundError:
        return
    _fsync_directory(path.parent)


def _fsync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
