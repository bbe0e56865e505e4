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

Versions (a member advertises ``[MINIMUM, MAXIMUM]``; the coordinator picks a computing member
whose range covers every version in use, and the assignor answers each member at the highest
version that member understands):

* member metadata: **v1 and v2 share one layout** (``StreamsMemberMetadata``); v2 exists so a
  group can tell which members understand v2 assignments.
* assignment metadata v1: active tasks as task-id strings (``"1_3"``), standby and warm-up
  tasks as ``{sub-topology: [partitions]}``, active partitions by host, error.
* assignment metadata v2: active, standby and warm-up tasks all as task-id strings, active
  partitions by host, **standby partitions by host** (standbys may answer queries), error;
  partitions by host are ``{host: {topic index: [partitions]}}`` with the topic names listed
  once (v1's ``[(topic, partition)]`` repeats each name per partition: at 1,000 members and
  2,000 tasks every member's bytes were about 77 KB).

* **version -1: classic members** (KIP-848 "Kafka Streams Migration"): a member speaking the
  classic protocol puts its metadata in its subscription's userData, which every assignor sees
  at version -1, and reads its assignment's userData as -1 too (nothing on the classic wire
  carries a version). Member metadata -1 is v1's layout plus the member's *reason*, which no
  other field carries for it; assignment metadata -1 is v2's layout. A member that reads -1
  advertises the range [-1, 2], which is what lets it compute for a group still holding classic
  members.

The rest of the code sees one in-memory model, ``StreamsAssignmentMetadata``, whatever version
the bytes had.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping, Sequence
from uuid import UUID

import msgspec
from pystreams.topology.ir import TaskId

MINIMUM_METADATA_VERSION = 1
MAXIMUM_METADATA_VERSION = 2
#: Classic members' metadata (subscription and assignment userData), as KIP-848 numbers it.
CLASSIC_METADATA_VERSION = -1
#: The lowest version a member of this code reads, as advertised in its heartbeats.
LOWEST_READABLE_VERSION = CLASSIC_METADATA_VERSION
#: The version this code writes when nothing asks for an older one.
METADATA_VERSION = MAXIMUM_METADATA_VERSION
#: The version member metadata is sent at. Its layout is the same in v1 and v2 (v2 changed
#: only the assignment), so it goes out as v1: every member of a group rolling between the two
#: can read everyone's metadata and compute the assignment, should the coordinator pick it.
MEMBER_METADATA_VERSION = MINIMUM_METADATA_VERSION


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


HostPartitions = dict[str, list[tuple[str, int]]]
#: v2's wire form of ``HostPartitions``: host -> index in ``topics`` -> partitions.
_CompactHostPartitions = dict[str, dict[int, list[int]]]


class StreamsMemberMetadata(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    """Member metadata; the same layout at v1 and v2."""

    #: One per process (instance); shared by all its stream threads (members).
    process_id: UUID
    #: "host:port" where this process serves interactive queries; "" for none.
    user_endpoint: str = ""
    #: For rack-aware placement of standbys (``rack.aware.assignment.tags`` picks the keys).
    client_tags: dict[str, str] = {}
    topology_hash: UUID = UUID(int=0)
    #: Task id ("1_3") -> records behind the changelog end; only tasks with local state.
    task_lags: dict[str, int] = {}


class ClassicStreamsMemberMetadata(StreamsMemberMetadata, frozen=True, forbid_unknown_fields=False):
    """Member metadata -1 (a classic member's subscription userData): v1's layout and the reason
    the KIP-848 heartbeat carries in a field of its own. A v1 reader ignores ``reason``."""

    reason: int = 0


class StreamsAssignmentMetadata(msgspec.Struct, frozen=True):
    """One member's assignment metadata, independent of the version it travelled at."""

    active_tasks: tuple[TaskId, ...] = ()
    standby_tasks: tuple[TaskId, ...] = ()
    warmup_tasks: tuple[TaskId, ...] = ()
    #: "host:port" -> [(topic, partition), ...] of the active tasks of every process with an
    #: endpoint (interactive queries route by it).
    partitions_by_host: HostPartitions = {}
    #: The same for standby tasks; always empty when the bytes were v1.
    standby_partitions_by_host: HostPartitions = {}
    error: int = AssignmentError.NONE

    def active_task_ids(self) -> list[TaskId]:
        return list(self.active_tasks)

    def standby_task_ids(self) -> list[TaskId]:
        return list(self.standby_tasks)

    def warmup_task_ids(self) -> list[TaskId]:
        return list(self.warmup_tasks)


# -- wire layouts (private: callers use the model above) --------------------------------------


class _AssignmentV1(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    active_tasks: list[str] = []
    #: Sub-topology id (text: msgpack map keys stay str) -> partition numbers.
    standby_tasks: dict[str, list[int]] = {}
    warmup_tasks: dict[str, list[int]] = {}
    partitions_by_host: HostPartitions = {}
    error: int = AssignmentError.NONE


class _AssignmentV2(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    active_tasks: list[str] = []
    standby_tasks: list[str] = []
    warmup_tasks: list[str] = []
    #: The topic names the two by-host maps index.
    topics: list[str] = []
    partitions_by_host: _CompactHostPartitions = {}
    standby_partitions_by_host: _CompactHostPartitions = {}
    error: int = AssignmentError.NONE


class _EncodedAssignmentV1(msgspec.Struct, frozen=True):
    """_AssignmentV1 as written: the by-host map spliced in pre-encoded (it is the same for
    every member)."""

    active_tasks: list[str]
    standby_tasks: dict[str, list[int]]
    warmup_tasks: dict[str, list[int]]
    partitions_by_host: msgspec.Raw
    error: int


class _EncodedAssignmentV2(msgspec.Struct, frozen=True):
    """_AssignmentV2 as written: topic names and both by-host maps spliced in pre-encoded."""

    active_tasks: list[str]
    standby_tasks: list[str]
    warmup_tasks: list[str]
    topics: msgspec.Raw
    partitions_by_host: msgspec.Raw
    standby_partitions_by_host: msgspec.Raw
    error: int


_member_decoder = msgspec.msgpack.Decoder(StreamsMemberMetadata)
_classic_member_decoder = msgspec.msgpack.Decoder(ClassicStreamsMemberMetadata)
_assignment_decoders: dict[int, msgspec.msgpack.Decoder[_AssignmentV1] | msgspec.msgpack.Decoder[_AssignmentV2]] = {
    1: msgspec.msgpack.Decoder(_AssignmentV1),
    2: msgspec.msgpack.Decoder(_AssignmentV2),
}
_encoder = msgspec.msgpack.Encoder(order="deterministic")
#: For maps with int keys (built in sorted order: "deterministic" takes str keys only).
_insertion_order_encoder = msgspec.msgpack.Encoder()


def encode_member_metadata(metadata: StreamsMemberMetadata) -> bytes:
    return _encoder.encode(metadata)


def decode_member_metadata(version: int, data: bytes) -> StreamsMemberMetadata:
    """At -1 the result is a :class:`ClassicStreamsMemberMetadata` (it has the reason)."""
    _check_version(version)
    try:
        if version == CLASSIC_METADATA_VERSION:
            return _classic_member_decoder.decode(data)
        return _member_decoder.decode(data)
    except msgspec.DecodeError as error:
        raise MetadataDecodeError(f"not Streams member metadata v{version}: {error}") from error


class AssignmentMetadataWriter:
    """Encodes many members' assignment metadata that share the by-host maps.

    The maps name every partition of the group and are the same for every member, so they are
    encoded once and spliced into each member's bytes (``msgspec.Raw``), which keeps a
    1,000-member assignment cheap.
    """

    def __init__(
        self, partitions_by_host: Mapping[str, Sequence[tuple[str, int]]], standby_partitions_by_host: Mapping[str, Sequence[tuple[str, int]]]
    ) -> None:
        self._by_host, self._standby_by_host = partitions_by_host, standby_partitions_by_host
        self._topics = sorted({topic for hosts in (partitions_by_host, standby_partitions_by_host) for pairs in hosts.values() for topic, _ in pairs})
        self._encoded: dict[tuple[int, bool], msgspec.Raw] = {}
        self._encoded_topics = msgspec.Raw(_encoder.encode(self._topics))

    def _hosts(self, version: int, standby: bool = False) -> msgspec.Raw:
        """The pre-encoded map at ``version``'s layout, encoded on first use."""
        version = _layout(version)
        raw = self._encoded.get((version, standby))
        if raw is None:
            hosts = self._standby_by_host if standby else self._by_host
            if version == 1:
                encoded = _encoder.encode(_sorted_hosts(hosts))
            else:
                encoded = _insertion_order_encoder.encode(_compact_hosts(hosts, self._topics))
            raw = self._encoded[(version, standby)] = msgspec.Raw(encoded)
        return raw

    def encode(
        self,
        version: int,
        active: Iterable[TaskId] = (),
        standby: Iterable[TaskId] = (),
        warmup: Iterable[TaskId] = (),
        error: int = AssignmentError.NONE,
    ) -> bytes:
        _check_version(version)
        if _layout(version) == 1:
            wire: msgspec.Struct = _EncodedAssignmentV1(
                active_tasks=_task_strings(active),
                standby_tasks=_by_subtopology(standby),
                warmup_tasks=_by_subtopology(warmup),
                partitions_by_host=self._hosts(1),
                error=int(error),
            )
        else:
            wire = _EncodedAssignmentV2(
                active_tasks=_task_strings(active),
                standby_tasks=_task_strings(standby),
                warmup_tasks=_task_strings(warmup),
                topics=self._encoded_topics,
                partitions_by_host=self._hosts(2),
                standby_partitions_by_host=self._hosts(2, standby=True),
                error=int(error),
            )
        return _encoder.encode(wire)


def encode_assignment_metadata(metadata: StreamsAssignmentMetadata, version: int = MAXIMUM_METADATA_VERSION) -> bytes:
    """The bytes of ``metadata`` at ``version`` (v1 cannot carry standby partitions by host)."""
    writer = AssignmentMetadataWriter(metadata.partitions_by_host, metadata.standby_partitions_by_host)
    return writer.encode(version, metadata.active_tasks, metadata.standby_tasks, metadata.warmup_tasks, metadata.error)


def decode_assignment_metadata(version: int, data: bytes) -> StreamsAssignmentMetadata:
    _check_version(version)
    try:
        wire = _assignment_decoders[_layout(version)].decode(data)
        if isinstance(wire, _AssignmentV1):
            return StreamsAssignmentMetadata(
                active_tasks=_parse_tasks(wire.active_tasks),
                standby_tasks=_tasks_from_subtopologies(wire.standby_tasks),
                warmup_tasks=_tasks_from_subtopologies(wire.warmup_tasks),
                partitions_by_host=wire.partitions_by_host,
                error=wire.error,
            )
        return StreamsAssignmentMetadata(
            active_tasks=_parse_tasks(wire.active_tasks),
            standby_tasks=_parse_tasks(wire.standby_tasks),
            warmup_tasks=_parse_tasks(wire.warmup_tasks),
            partitions_by_host=_expand_hosts(wire.partitions_by_host, wire.topics),
            standby_partitions_by_host=_expand_hosts(wire.standby_partitions_by_host, wire.topics),
            error=wire.error,
        )
    except (msgspec.DecodeError, ValueError) as error:
        raise MetadataDecodeError(f"not Streams assignment metadata v{version}: {error}") from error


def _check_version(version: int) -> None:
    if version != CLASSIC_METADATA_VERSION and not MINIMUM_METADATA_VERSION <= version <= MAXIMUM_METADATA_VERSION:
        raise MetadataDecodeError(
            f"Streams metadata version {version} is outside the supported range "
            f"[{MINIMUM_METADATA_VERSION}, {MAXIMUM_METADATA_VERSION}] (or {CLASSIC_METADATA_VERSION}, classic members)"
        )


def _layout(version: int) -> int:
    """The wire layout of an assignment version: -1 (classic members) is v2's."""
    return MAXIMUM_METADATA_VERSION if version == CLASSIC_METADATA_VERSION else version


def _sorted_hosts(hosts: Mapping[str, Sequence[tuple[str, int]]]) -> HostPartitions:
    return {host: sorted((topic, partition) for topic, partition in pairs) for host, pairs in sorted(hosts.items())}


def _compact_hosts(hosts: Mapping[str, Sequence[tuple[str, int]]], topics: Sequence[str]) -> _CompactHostPartitions:
    index_of = {topic: index for index, topic in enumerate(topics)}
    compact: _CompactHostPartitions = {}
    for host, pairs in sorted(hosts.items()):
        by_topic: dict[int, list[int]] = {}
        for topic, partition in pairs:
            by_topic.setdefault(index_of[topic], []).append(partition)
        compact[host] = {index: sorted(partitions) for index, partitions in sorted(by_topic.items())}
    return compact


def _expand_hosts(compact: Mapping[str, Mapping[int, Sequence[int]]], topics: Sequence[str]) -> HostPartitions:
    """Raises ValueError (bad metadata) for a topic index outside ``topics``."""
    try:
        return {
            host: sorted((topics[index], partition) for index, partitions in by_topic.items() for partition in partitions) for host, by_topic in compact.items()
        }
    except IndexError:
        raise ValueError(f"a topic index is outside the {len(topics)} topics listed") from None


def _task_strings(tasks: Iterable[TaskId]) -> list[str]:
    return [str(task) for task in sorted(tasks)]


def _parse_tasks(texts: Iterable[str]) -> tuple[TaskId, ...]:
    return tuple(sorted(TaskId.parse(text) for text in texts))


def _by_subtopology(tasks: Iterable[TaskId]) -> dict[str, list[int]]:
    grouped: dict[int, list[int]] = {}
    for task in sorted(tasks):
        grouped.setdefault(task.subtopology, []).append(task.partition)
    return {str(subtopology): partitions for subtopology, partitions in grouped.items()}


def _tasks_from_subtopologies(grouped: Mapping[str, Iterable[int]]) -> tuple[TaskId, ...]:
    return tuple(sorted(TaskId(int(subtopology), partition) for subtopology, partitions in grouped.items() for partition in partitions))


def task_lags_from(lags: Mapping[TaskId, int]) -> dict[str, int]:
    return {str(task): lag for task, lag in sorted(lags.items())}
