"""The coordinator's records (KIP-848 "Records"): the only way group state changes.

Every key type names its record; its value type is fixed by the key. A ``None`` value is a
tombstone: it deletes what the key names. Keys and values are msgpack through msgspec; a key
carries its type tag, so a log partition is self-describing. Fields added later get defaults,
so older records stay readable (the role tagged fields play in Kafka's JSON records).
"""
from __future__ import annotations

from typing import Union
from uuid import UUID

import msgspec


class _Key(msgspec.Struct, frozen=True, tag_field="type", array_like=False):
    group_id: str


# --- keys -------------------------------------------------------------------------------------


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


RecordKey = Union[
    GroupMetadataKey,
    PartitionMetadataKey,
    MemberMetadataKey,
    TargetAssignmentMetadataKey,
    TargetAssignmentMemberKey,
    CurrentAssignmentKey,
    OffsetCommitKey,
    GroupConfigKey,
]

# --- values -----------------------------------------------------------------------------------


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


RecordValue = Union[
    GroupMetadataValue,
    PartitionMetadataValue,
    MemberMetadataValue,
    TargetAssignmentMetadataValue,
    TargetAssignmentMemberValue,
    CurrentAssignmentValue,
    OffsetCommitValue,
    GroupConfigValue,
]

VALUE_TYPES: dict[type, type] = {
    GroupMetadataKey: GroupMetadataValue,
    PartitionMetadataKey: PartitionMetadataValue,
    MemberMetadataKey: MemberMetadataValue,
    TargetAssignmentMetadataKey: TargetAssignmentMetadataValue,
    TargetAssignmentMemberKey: TargetAssignmentMemberValue,
    CurrentAssignmentKey: CurrentAssignmentValue,
    OffsetCommitKey: OffsetCommitValue,
    GroupConfigKey: GroupConfigValue,
}


class Record(msgspec.Struct, frozen=True):
    key: RecordKey
    value: RecordValue | None  # None: tombstone

    def __post_init__(self) -> None:
        if self.value is not None and type(self.value) is not VALUE_TYPES[type(self.key)]:
            raise TypeError(f"{type(self.key).__name__} takes {VALUE_TYPES[type(self.key)].__name__}, got {type(self.value).__name__}")


_key_encoder = msgspec.msgpack.Encoder()
_key_decoder = msgspec.msgpack.Decoder(RecordKey)
_value_decoders = {key: msgspec.msgpack.Decoder(value) for key, value in VALUE_TYPES.items()}


def encode(record: Record) -> tuple[bytes, bytes | None]:
    value = None if record.value is None else _key_encoder.encode(record.value)
    return _key_encoder.encode(record.key), value


def decode(key: bytes, value: bytes | None) -> Record:
    decoded_key = _key_decoder.decode(key)
    decoded_value = None if value is None else _value_decoders[type(decoded_key)].decode(value)
    return Record(decoded_key, decoded_value)
