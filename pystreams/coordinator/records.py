"""The coordinator's records (KIP-848 "Records"): the only way group state changes.

Each record kind is one frozen struct that ties its key fields to the one value type the key
takes (``MemberMetadata(group_id, member_id, value)``); the kinds form the tagged union
``Record``, which shards replay with ``match``. A ``None`` value is a tombstone: it deletes what
the key names.

On the log a record is a key and a value, both msgpack through msgspec. The key carries its
kind's tag, so a log partition is self-describing; fields added later get defaults, so older
records stay readable (the role tagged fields play in Kafka's JSON records). That layout is
the format of existing logs and does not change with the Python types.

Nothing may reach the log that replay cannot read: ``check_appendable`` round-trips a record
through the strict decoder (msgspec does not validate on construction, so a ``None`` where a
``str`` belongs would otherwise be written) and bounds its size. A record read back that does
not decode is an ``UnreadableRecord`` carrying the reason, never an exception that stops a load.
"""

from __future__ import annotations

from typing import Any, ClassVar
from uuid import UUID

import msgspec

from pystreams.serdes import UNDECODABLE

#: The largest record (key + value) a shard writes. Kafka's default max.message.bytes is about
#: 1 MiB per batch, and an append must fit: a larger record would fail every retry.
MAX_RECORD_BYTES = 512 * 1024


# --- keys (the on-log layout) ------------------------------------------------------------------


class _Key(msgspec.Struct, frozen=True, tag_field="type", array_like=False):
    group_id: str


class GroupMetadataKey(_Key, frozen=True, tag="group"):
    pass


class PartitionMetadataKey(_Key, frozen=True, tag="partition-metadata"):
    pass


class MemberMetadataKey(_Key, frozen=True, tag="member"):
    member_id: str


class TargetAssignmentMetadataKey(_Key, frozen=True, tag="target-metadata"):
    pass


class TargetAssignmentMemberKey(_Key, frozen=True, tag="target-member"):
    member_id: str


class CurrentAssignmentKey(_Key, frozen=True, tag="current-member"):
    member_id: str


class OffsetCommitKey(_Key, frozen=True, tag="offset"):
    topic: str
    partition: int


class GroupConfigKey(_Key, frozen=True, tag="group-config"):
    pass


class ClassicGroupKey(_Key, frozen=True, tag="classic-group"):
    pass


RecordKey = (
    GroupMetadataKey
    | PartitionMetadataKey
    | MemberMetadataKey
    | TargetAssignmentMetadataKey
    | TargetAssignmentMemberKey
    | CurrentAssignmentKey
    | OffsetCommitKey
    | GroupConfigKey
    | ClassicGroupKey
)

# --- values ------------------------------------------------------------------------------------


class TopicPartitions(msgspec.Struct, frozen=True, array_like=True):
    topic_id: UUID
    partitions: list[int]


class GroupMetadataValue(msgspec.Struct, frozen=True):
    #: Always the latest epoch of the group.
    epoch: int
    group_type: str = "consumer"


class TopicMetadataValue(msgspec.Struct, frozen=True, array_like=True):
    topic_id: UUID
    name: str
    num_partitions: int


class PartitionMetadataValue(msgspec.Struct, frozen=True):
    """The metadata of the topics the group subscribes to, to detect changes."""

    topics: list[TopicMetadataValue]


class AssignorValue(msgspec.Struct, frozen=True):
    name: str
    minimum_version: int
    maximum_version: int
    reason: int
    version: int
    metadata: bytes


class ClassicProtocolValue(msgspec.Struct, frozen=True, array_like=True):
    name: str
    metadata: bytes


class ClassicMemberMetadataValue(msgspec.Struct, frozen=True):
    """A consumer-group member that speaks the classic protocol (Kafka's ClassicMemberMetadata)."""

    session_timeout_ms: int
    #: Every protocol of its JoinGroup, in its order, with the raw subscription bytes.
    supported_protocols: list[ClassicProtocolValue]


class MemberMetadataValue(msgspec.Struct, frozen=True):
    group_epoch: int
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    subscribed_topic_names: list[str]
    instance_id: str | None = None
    rack_id: str | None = None
    subscribed_topic_regex: str | None = None
    server_assignor: str | None = None
    assignors: list[AssignorValue] = []
    #: Set while the member uses the classic protocol (online migration); None for KIP-848.
    classic_member: ClassicMemberMetadataValue | None = None


class TargetAssignmentMetadataValue(msgspec.Struct, frozen=True):
    assignment_epoch: int
    error: int = 0


class TargetAssignmentMemberValue(msgspec.Struct, frozen=True):
    partitions: list[TopicPartitions]
    metadata_version: int = 0
    metadata: bytes = b""


class CurrentAssignmentValue(msgspec.Struct, frozen=True):
    member_epoch: int
    previous_member_epoch: int
    #: Partitions the member owns and keeps.
    assigned: list[TopicPartitions]
    #: Partitions the member still owns but must revoke before moving to its next epoch.
    revoking: list[TopicPartitions] = []
    error: int = 0
    metadata_version: int = 0
    metadata: bytes = b""


class OffsetCommitValue(msgspec.Struct, frozen=True):
    offset: int
    commit_timestamp_ms: int
    leader_epoch: int = -1
    metadata: str | None = None
    #: The topic id the offset was committed for; None when committed by topic name only.
    topic_id: UUID | None = None


class GroupConfigValue(msgspec.Struct, frozen=True):
    configs: dict[str, str]


class ClassicMemberValue(msgspec.Struct, frozen=True):
    member_id: str
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    #: The member's metadata for the group's selected protocol.
    subscription: bytes
    assignment: bytes
    instance_id: str | None = None


class ClassicGroupValue(msgspec.Struct, frozen=True):
    """A classic group at its last stable point (Kafka's GroupMetadataValue): written when the
    leader's assignment is stored, when the group becomes empty, on a static replacement, on a
    conversion. A rebalance in progress is not written: a load brings the group back Stable (or
    Empty) and its members rejoin as they would after any coordinator move."""

    protocol_type: str
    generation: int
    protocol: str | None
    leader: str | None
    current_state_timestamp: int = -1
    members: list[ClassicMemberValue] = []


# --- record kinds: a key's fields and its value ------------------------------------------------


class _Record(msgspec.Struct, frozen=True):
    group_id: str

    KEY: ClassVar[type[_Key]]

    def key(self) -> _Key:
        return self.KEY(*msgspec.structs.astuple(self)[:-1])


class GroupMetadata(_Record, frozen=True):
    value: GroupMetadataValue | None
    KEY = GroupMetadataKey


class PartitionMetadata(_Record, frozen=True):
    value: PartitionMetadataValue | None
    KEY = PartitionMetadataKey


class MemberMetadata(_Record, frozen=True):
    member_id: str
    value: MemberMetadataValue | None
    KEY = MemberMetadataKey


class TargetAssignmentMetadata(_Record, frozen=True):
    value: TargetAssignmentMetadataValue | None
    KEY = TargetAssignmentMetadataKey


class TargetAssignmentMember(_Record, frozen=True):
    member_id: str
    value: TargetAssignmentMemberValue | None
    KEY = TargetAssignmentMemberKey


class CurrentAssignment(_Record, frozen=True):
    member_id: str
    value: CurrentAssignmentValue | None
    KEY = CurrentAssignmentKey


class OffsetCommit(_Record, frozen=True):
    topic: str
    partition: int
    value: OffsetCommitValue | None
    KEY = OffsetCommitKey


class GroupConfig(_Record, frozen=True):
    value: GroupConfigValue | None
    KEY = GroupConfigKey


class ClassicGroupMetadata(_Record, frozen=True):
    value: ClassicGroupValue | None
    KEY = ClassicGroupKey


Record = (
    GroupMetadata
    | PartitionMetadata
    | MemberMetadata
    | TargetAssignmentMetadata
    | TargetAssignmentMember
    | CurrentAssignment
    | OffsetCommit
    | GroupConfig
    | ClassicGroupMetadata
)

_KINDS: tuple[type[Record], ...] = (
    GroupMetadata,
    PartitionMetadata,
    MemberMetadata,
    TargetAssignmentMetadata,
    TargetAssignmentMember,
    CurrentAssignment,
    OffsetCommit,
    GroupConfig,
    ClassicGroupMetadata,
)

#: The record kinds of a KIP-848 consumer group (a conversion tombstones them all).
CONSUMER_GROUP_KINDS = (GroupMetadata, PartitionMetadata, MemberMetadata, TargetAssignmentMetadata, TargetAssignmentMember, CurrentAssignment)
_KIND_BY_KEY: dict[type[_Key], type[Record]] = {kind.KEY: kind for kind in _KINDS}


def _declared_value_type(kind: type[_Record]) -> type:
    """The struct in ``value: SomeValue | None``: the annotation is the one place it is written."""
    info = msgspec.inspect.type_info(kind)
    assert isinstance(info, msgspec.inspect.StructType), f"{kind.__name__} is a struct"
    union = info.fields[-1].type
    assert isinstance(union, msgspec.inspect.UnionType), f"{kind.__name__}.value is Value | None"
    return next(t.cls for t in union.types if isinstance(t, msgspec.inspect.StructType))


_VALUE_TYPE: dict[type[_Record], type] = {kind: _declared_value_type(kind) for kind in _KINDS}


def tombstone_of(record: Record) -> Record:
    """The tombstone of ``record``'s key."""
    fields = (*msgspec.structs.astuple(record)[:-1], None)  # one tuple: mypy cannot count a splat
    return type(record)(*fields)


def value_type(kind: type[_Record]) -> type:
    """The value struct a record kind takes."""
    return _VALUE_TYPE[kind]


# --- encoding ----------------------------------------------------------------------------------

_encoder = msgspec.msgpack.Encoder()
_key_decoder = msgspec.msgpack.Decoder(RecordKey)
_value_decoders: dict[type[Record], msgspec.msgpack.Decoder[Any]] = {kind: msgspec.msgpack.Decoder(_VALUE_TYPE[kind]) for kind in _KINDS}
_lenient_key_decoder = msgspec.msgpack.Decoder(dict)


class RecordDecodeError(ValueError):
    """Stored bytes that are not a record this coordinator can replay."""


class UnappendableRecord(ValueError):
    """A record that must not be written: replay could not read it back, or it is too large."""


def encode(record: Record) -> tuple[bytes, bytes | None]:
    value = None if record.value is None else _encoder.encode(record.value)
    return _encoder.encode(record.key()), value


def decode(key: bytes, value: bytes | None) -> Record:
    """The record stored as ``key`` and ``value``; RecordDecodeError if it is not one."""
    try:
        decoded_key = _key_decoder.decode(key)
    except UNDECODABLE as error:
        raise RecordDecodeError(f"the key does not decode: {error}") from None
    kind = _KIND_BY_KEY[type(decoded_key)]
    try:
        decoded_value = None if value is None else _value_decoders[kind].decode(value)
    except UNDECODABLE as error:
        raise RecordDecodeError(f"the value of a {kind.__name__} record does not decode: {error}") from None
    fields = (*msgspec.structs.astuple(decoded_key), decoded_value)  # one tuple: mypy cannot count a splat
    return kind(*fields)


def group_of_raw_key(key: bytes) -> str | None:
    """The group id in a key that does not decode as a record key, if it can be read at all."""
    try:
        fields = _lenient_key_decoder.decode(key)
    except UNDECODABLE:
        return None
    group = fields.get("group_id")
    return group if isinstance(group, str) else None


def check_appendable(record: Record) -> None:
    """Raise UnappendableRecord unless ``record`` decodes back to itself and fits a log batch."""
    try:
        key, value = encode(record)
    except (TypeError, ValueError, OverflowError) as error:  # msgspec.EncodeError is a ValueError
        raise UnappendableRecord(f"{type(record).__name__} does not encode: {error}") from None
    size = len(key) + (len(value) if value is not None else 0)
    if size > MAX_RECORD_BYTES:
        raise UnappendableRecord(f"{type(record).__name__} of group {record.group_id!r} is {size} bytes, over the {MAX_RECORD_BYTES}-byte limit")
    try:
        decoded = decode(key, value)
    except RecordDecodeError as error:
        raise UnappendableRecord(f"{type(record).__name__} would not replay: {error}") from None
    if decoded != record:
        raise UnappendableRecord(f"{type(record).__name__} does not survive a round trip: {record!r} reads back as {decoded!r}")


# --- what a load reads -------------------------------------------------------------------------


class UnreadableRecord(msgspec.Struct, frozen=True):
    """A stored record that does not decode: where it is, what it says of itself, and why.

    ``raw_key`` identifies it: a later record with the same key bytes supersedes it, as
    compaction would. ``group_id`` is None when not even that can be read from the key.
    """

    offset: int
    raw_key: bytes
    group_id: str | None
    reason: str
    #: A tombstone whose key does not decode still supersedes an earlier record of that key.
    tombstone: bool = False


def read_stored(offset: int, key: bytes, value: bytes | None) -> Record | UnreadableRecord:
    """A stored record as a load sees it: decoded, or unreadable with the reason."""
    try:
        return decode(key, value)
    except RecordDecodeError as error:
        return UnreadableRecord(offset, key, group_of_raw_key(key), str(error), tombstone=value is None)
