"""The Streams metadata of KIP-848, as versioned msgspec structs.

Two payloads travel through the client-side assignor fields of the protocol:

* **member metadata** — what each member advertises in its heartbeats (``Assignor.Metadata``):
  process id, user endpoint, client tags, topology hash and task lags. Its *reason* is not
  part of the payload: it travels in the assignor's ``Reason`` field, because that is what the
  coordinator looks at to decide that a new assignment is wanted;
* **assignment metadata** — what the assignor hands each member with its partitions: active,
  standby and warm-up tasks, partitions by host (for interactive queries) and an error.

Both are msgpack-encoded; the protocol's ``MetadataVersion`` field carries the version, so the
bytes stay small and a decoder refuses versions it does not know rather than guessing.
"""
from __future__ import annotations

import enum
from collections.abc import Mapping
from uuid import UUID

import msgspec

from pystreams.topology.ir import TaskId

#: The only metadata version so far; the assignor advertises [MINIMUM, MAXIMUM].
METADATA_VERSION = 1
MINIMUM_METADATA_VERSION = 1
MAXIMUM_METADATA_VERSION = 1


class MemberReason(enum.IntEnum):
    """Why a member's metadata changed (non-zero asks the coordinator for a new assignment)."""

    NONE = 0
    SHUTDOWN = 1
    WARM_UP_READY = 2
    WARM_UP_FAILED = 3
    TOPOLOGY_CHANGED = 4


class AssignmentError(enum.IntEnum):
    """The assignment metadata's error (also the group-level assignor error)."""

    NONE = 0
    SHUTDOWN = 1
    ASSIGNMENT_ERROR = 2
    INCONSISTENT_TOPOLOGY = 3


class MetadataDecodeError(ValueError):
    """The bytes are not Streams metadata of a version this client understands."""


class StreamsMemberMetadata(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    #: One per process (instance); shared by all its stream threads (members).
    process_id: UUID
    #: "host:port" where this process serves interactive queries; "" for none.
    user_endpoint: str = ""
    #: For rack-aware placement of standbys (next issue).
    client_tags: dict[str, str] = {}
    topology_hash: UUID = UUID(int=0)
    #: Task id ("1_3") -> records behind the changelog end; only tasks with local state.
    task_lags: dict[str, int] = {}


class StreamsAssignmentMetadata(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    #: Task ids ("1_3") this member processes.
    active_tasks: list[str] = []
    #: Sub-topology id (as text: msgpack maps keep str keys) -> partition numbers of standby replicas (placement: next issue).
    standby_tasks: dict[str, list[int]] = {}
    #: Sub-topology id -> partition numbers being warmed up (placement: next issue).
    warmup_tasks: dict[str, list[int]] = {}
    #: "host:port" -> [[topic, partition], ...] of the active tasks of every process with an
    #: endpoint (interactive queries route by it).
    partitions_by_host: dict[str, list[tuple[str, int]]] = {}
    error: int = AssignmentError.NONE

    def active_task_ids(self) -> list[TaskId]:
        return [TaskId.parse(text) for text in self.active_tasks]


_member_decoder = msgspec.msgpack.Decoder(StreamsMemberMetadata)
_assignment_decoder = msgspec.msgpack.Decoder(StreamsAssignmentMetadata)
_encoder = msgspec.msgpack.Encoder(order="deterministic")


def encode_member_metadata(metadata: StreamsMemberMetadata) -> bytes:
    return _encoder.encode(metadata)


def decode_member_metadata(version: int, data: bytes) -> StreamsMemberMetadata:
    _check_version(version)
    try:
        return _member_decoder.decode(data)
    except msgspec.DecodeError as error:
        raise MetadataDecodeError(f"not Streams member metadata v{version}: {error}") from error


def encode_assignment_metadata(metadata: StreamsAssignmentMetadata) -> bytes:
    return _encoder.encode(metadata)


def decode_assignment_metadata(version: int, data: bytes) -> StreamsAssignmentMetadata:
    _check_version(version)
    try:
        return _assignment_decoder.decode(data)
    except msgspec.DecodeError as error:
        raise MetadataDecodeError(f"not Streams assignment metadata v{version}: {error}") from error


def _check_version(version: int) -> None:
    if not MINIMUM_METADATA_VERSION <= version <= MAXIMUM_METADATA_VERSION:
        raise MetadataDecodeError(
            f"Streams metadata version {version} is outside the supported range "
            f"[{MINIMUM_METADATA_VERSION}, {MAXIMUM_METADATA_VERSION}]"
        )


def task_lags_from(lags: Mapping[TaskId, int]) -> dict[str, int]:
    return {str(task): lag for task, lag in sorted(lags.items())}
