"""The embedded consumer protocol: what classic members of protocol type ``consumer`` put in
JoinGroup metadata (a *subscription*) and what the leader hands back through SyncGroup (an
*assignment*).

The bytes are Kafka's ``ConsumerProtocolSubscription`` / ``ConsumerProtocolAssignment``
(versions 0-3, an int16 version header first), encoded and decoded with kafka-python's own
classes, so Java, kafka-python and pystreams members read each other. Topics are named, as the
classic protocol names them; callers map names to topic ids.

Versions: v1 added owned partitions (KIP-429), v2 the generation, v3 the rack id. A newer
version than 3 decodes as 3 (its extra fields are ignored, Kafka's forward-compatibility rule);
an assignment of 0 bytes is no partitions (a member that joined but never synced, KAFKA-17733).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from kafka.protocol.consumer.metadata import ConsumerProtocolAssignment, ConsumerProtocolSubscription

#: JoinGroup's ProtocolType for consumers.
PROTOCOL_TYPE = "consumer"
HIGHEST_VERSION = 3
#: The version a subscription is written at unless the caller asks for another (Kafka's).
SUBSCRIPTION_VERSION = HIGHEST_VERSION
NO_GENERATION = -1

#: Partition numbers by topic name.
NamedPartitions = Mapping[str, frozenset[int]]
_NO_NAMED_PARTITIONS: NamedPartitions = MappingProxyType({})


class ConsumerProtocolError(ValueError):
    """Bytes that are not a consumer-protocol subscription or assignment."""


@dataclass(frozen=True)
class Subscription:
    topics: tuple[str, ...]
    user_data: bytes | None = None
    owned_partitions: NamedPartitions = field(default_factory=lambda: _NO_NAMED_PARTITIONS)
    generation_id: int = NO_GENERATION
    rack_id: str | None = None
    #: The version the bytes were written at (what the member understands).
    version: int = SUBSCRIPTION_VERSION


@dataclass(frozen=True)
class Assignment:
    partitions: NamedPartitions = field(default_factory=lambda: _NO_NAMED_PARTITIONS)
    user_data: bytes | None = None
    version: int = HIGHEST_VERSION

    def topics(self) -> frozenset[str]:
        return frozenset(topic for topic, numbers in self.partitions.items() if numbers)


def named_partitions(pairs: Iterable[tuple[str, Iterable[int]]]) -> NamedPartitions:
    """``{topic: frozenset(partitions)}`` from ``(topic, partitions)`` pairs; empty topics dropped."""
    merged: dict[str, set[int]] = {}
    for topic, numbers in pairs:
        merged.setdefault(topic, set()).update(numbers)
    return MappingProxyType({topic: frozenset(numbers) for topic, numbers in sorted(merged.items()) if numbers})


def version_of(data: bytes) -> int:
    """The version header of embedded protocol bytes (0 for empty bytes)."""
    if len(data) < 2:
        return 0
    return struct.unpack_from(">h", data)[0]


def encode_subscription(subscription: Subscription, version: int | None = None) -> bytes:
    version = subscription.version if version is None else version
    version = max(0, min(version, HIGHEST_VERSION))
    tp = ConsumerProtocolSubscription.TopicPartition
    return bytes(
        ConsumerProtocolSubscription(
            version=version,
            topics=list(subscription.topics),
            user_data=subscription.user_data,
            owned_partitions=[tp(topic=topic, partitions=sorted(numbers)) for topic, numbers in sorted(subscription.owned_partitions.items())],
            generation_id=subscription.generation_id,
            rack_id=subscription.rack_id,
        ).encode()
    )


def decode_subscription(data: bytes) -> Subscription:
    if len(data) < 2:
        raise ConsumerProtocolError(f"a subscription of {len(data)} bytes has no version header")
    version = version_of(data)
    if version < 0:
        raise ConsumerProtocolError(f"subscription version {version} is negative")
    try:
        decoded = ConsumerProtocolSubscription.decode(data)
    except Exception as error:  # struct.error, UnicodeDecodeError, ...: malformed bytes
        raise ConsumerProtocolError(f"malformed consumer-protocol subscription (v{version}): {error!r}") from None
    owned = decoded.owned_partitions if version >= 1 else []
    return Subscription(
        topics=tuple(decoded.topics or ()),
        user_data=_bytes_or_none(decoded.user_data),
        owned_partitions=named_partitions((entry.topic, entry.partitions) for entry in owned or ()),
        generation_id=decoded.generation_id if version >= 2 else NO_GENERATION,
        rack_id=decoded.rack_id if version >= 3 else None,
        version=version,
    )


def encode_assignment(assignment: Assignment, version: int | None = None) -> bytes:
    version = assignment.version if version is None else version
    version = max(0, min(version, HIGHEST_VERSION))
    tp = ConsumerProtocolAssignment.TopicPartition
    return bytes(
        ConsumerProtocolAssignment(
            version=version,
            assigned_partitions=[tp(topic=topic, partitions=sorted(numbers)) for topic, numbers in sorted(assignment.partitions.items()) if numbers],
            user_data=assignment.user_data,
        ).encode()
    )


def decode_assignment(data: bytes) -> Assignment:
    if not data:
        return Assignment(version=0)
    if len(data) < 2:
        raise ConsumerProtocolError(f"an assignment of {len(data)} byte has no version header")
    version = version_of(data)
    if version < 0:
        raise ConsumerProtocolError(f"assignment version {version} is negative")
    try:
        decoded = ConsumerProtocolAssignment.decode(data)
    except Exception as error:
        raise ConsumerProtocolError(f"malformed consumer-protocol assignment (v{version}): {error!r}") from None
    return Assignment(
        partitions=named_partitions((entry.topic, entry.partitions) for entry in decoded.assigned_partitions or ()),
        user_data=_bytes_or_none(decoded.user_data),
        version=version,
    )


def _bytes_or_none(value: bytes | bytearray | memoryview | None) -> bytes | None:
    if value is None:
        return None
    return bytes(value)
