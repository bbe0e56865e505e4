"""The foreign-key table–table join's rules (Kafka Streams' KIP-213 subscription/response
design), written once for the kernels.

``left.join(right, foreign_key=fn)``: each left row ``(K, V)`` *subscribes* to the right row
``fn(V)`` through the registration topic (keyed by the foreign key, so it reaches the right
row's task); the right side keeps the subscriptions and *responds* — on a subscription, and on
every update of the subscribed right row — through the response topic (keyed by K). A response
carries a hash of the left value it answers; the left side drops a response whose hash is not
its current row's (a stale answer to an earlier value), which is what keeps racing updates and
foreign-key changes correct.
"""

from __future__ import annotations

import enum
import hashlib
import struct
from dataclasses import dataclass
from typing import Any

import msgspec

from pystreams.serdes import UNDECODABLE, Serde, SerdeError


class Instruction(enum.IntEnum):
    """What the right side does with a subscription (Kafka Streams' SubscriptionWrapper)."""

    #: Drop the subscription and answer None (the left row is gone).
    DELETE_KEY_AND_PROPAGATE = 0
    #: Drop the subscription silently (the left row moved to another foreign key).
    DELETE_KEY_NO_PROPAGATE = 1
    #: Keep it and answer with the right row, None when there is none.
    PROPAGATE_NULL_IF_NO_FK_VAL_AVAILABLE = 2


def value_hash(value: bytes | None) -> bytes | None:
    """The hash a response carries of the left value it answers (None: no left row)."""
    return None if value is None else hashlib.blake2b(value, digest_size=16).digest()


@dataclass(frozen=True, slots=True)
class Subscription:
    hash: bytes | None
    instruction: Instruction
    primary_key: Any


@dataclass(frozen=True, slots=True)
class SubscriptionResponse:
    hash: bytes | None
    foreign_value: Any


def subscriptions(old: tuple[bytes | None] | None, new: tuple[bytes | None] | None) -> list[tuple[bytes | None, Instruction]]:
    """The (foreign key bytes, instruction) subscriptions a left row sends when it goes from
    ``old`` to ``new`` — each ``(foreign key bytes,)``, its foreign key None when ``fn`` gave
    None; ``old``/``new`` None when there was / is no row.

    Every change of a row gets exactly one answer that sets its result, whatever else is on
    its way: a row subscribes to its foreign key, answered with the right row or None (a None
    foreign key is answered at once, with None); a row that moves away from a key deletes its
    subscription there silently; a deleted row's subscription is deleted and answered with
    None (one with a None foreign key is answered at once). An answer carries the hash of the
    value it answers, so an earlier one arriving late is stale and dropped.

    Kafka Streams' SubscriptionSend sends fewer answers, and the racing property in
    tests/test_semantics_foreign_key_join.py finds each of its shortcuts ending with a wrong
    result when answers from two foreign keys' tasks cross: a left join's move answers from
    the old key too (with the new value's hash: that None can overwrite the new key's
    answer); an inner join answers a new row only when the right row exists, and skips a
    None foreign key (the result of the key's previous row, whose delete answer arrives
    stale, stays); an inner join also skips a row whose foreign key was None before. The
    price here: an inner join sends a tombstone for a row with no match, which a
    materialized join does not pass on for a key it never held."""
    old_key = None if old is None else old[0]
    sent: list[tuple[bytes | None, Instruction]] = []
    if old_key is not None:
        if new is None:
            sent.append((old_key, Instruction.DELETE_KEY_AND_PROPAGATE))
        elif new[0] != old_key:
            sent.append((old_key, Instruction.DELETE_KEY_NO_PROPAGATE))
    if new is not None:
        sent.append((new[0], Instruction.PROPAGATE_NULL_IF_NO_FK_VAL_AVAILABLE))
    elif old is not None and old_key is None:
        sent.append((None, Instruction.PROPAGATE_NULL_IF_NO_FK_VAL_AVAILABLE))
    return sent


def answers(instruction: Instruction, foreign_value: Any) -> tuple[bool, Any]:
    """Whether the right side answers a subscription, and with which right row (Kafka
    Streams' SubscriptionJoin)."""
    match instruction:
        case Instruction.DELETE_KEY_AND_PROPAGATE:
            return True, None
        case Instruction.DELETE_KEY_NO_PROPAGATE:
            return False, None
        case Instruction.PROPAGATE_NULL_IF_NO_FK_VAL_AVAILABLE:
            return True, foreign_value


def joined_row(left_join: bool, fn: Any, key: Any, current: Any, foreign_value: Any) -> Any:
    """The join's row for an answer that is not stale (Kafka Streams' ResponseJoin): a
    tombstone when there is no right row for an inner join or no left row; else
    ``fn(key, left, right)``."""
    if foreign_value is None and (not left_join or current is None):
        return None
    return fn(key, current, foreign_value)


_KEY_LENGTH = struct.Struct(">I")


def subscription_key(foreign_key: bytes, primary_key: bytes) -> bytes:
    """A subscription's place in the right side's store: every subscriber of one foreign key
    under one prefix (the foreign key's length, then the key), then the left key."""
    return _KEY_LENGTH.pack(len(foreign_key)) + foreign_key + primary_key


def subscription_prefix(foreign_key: bytes) -> bytes:
    return _KEY_LENGTH.pack(len(foreign_key)) + foreign_key


def primary_key_of(stored_key: bytes) -> bytes:
    (length,) = _KEY_LENGTH.unpack_from(stored_key)
    return stored_key[_KEY_LENGTH.size + length :]


_encode = msgspec.msgpack.Encoder().encode
_decode_subscription = msgspec.msgpack.Decoder(tuple[bytes | None, int, bytes]).decode
_decode_response = msgspec.msgpack.Decoder(tuple[bytes | None, bytes | None]).decode
_decode_row = msgspec.msgpack.Decoder(tuple[bytes | None]).decode


def encode_row(row: tuple[bytes | None]) -> bytes:
    """What a left row's subscribe step keeps per left key: its last foreign key bytes."""
    return _encode(row)


def decode_row(data: bytes) -> tuple[bytes | None]:
    (foreign_key,) = _decode_row(data)
    return (foreign_key,)


class SubscriptionSerde(Serde):
    """The registration topic's values: a ``Subscription`` whose primary key is a value of
    ``key`` (the left table's key serde)."""

    def __init__(self, key: Serde) -> None:
        self.key = key

    @property
    def name(self) -> str:
        return f"fk-subscription({self.key.name})"

    def _to_bytes(self, value: Any) -> bytes:
        if not isinstance(value, Subscription):
            raise SerdeError(f"{self.name} needs a Subscription, got {type(value).__name__}")
        return _encode((value.hash, int(value.instruction), self.key.serialize(value.primary_key) or b""))

    def _from_bytes(self, data: bytes) -> Subscription:
        try:
            hashed, instruction, primary_key = _decode_subscription(data)
            return Subscription(hashed, Instruction(instruction), self.key.deserialize(primary_key))
        except (*UNDECODABLE, ValueError) as error:
            raise SerdeError(f"{self.name}: not a subscription: {error}") from None


class ResponseSerde(Serde):
    """The response topic's values: a ``SubscriptionResponse`` whose right row is a value of
    ``value`` (the right table's value serde)."""

    def __init__(self, value: Serde) -> None:
        self.value = value

    @property
    def name(self) -> str:
        return f"fk-response({self.value.name})"

    def _to_bytes(self, value: Any) -> bytes:
        if not isinstance(value, SubscriptionResponse):
            raise SerdeError(f"{self.name} needs a SubscriptionResponse, got {type(value).__name__}")
        return _encode((value.hash, self.value.serialize(value.foreign_value)))

    def _from_bytes(self, data: bytes) -> SubscriptionResponse:
        try:
            hashed, foreign = _decode_response(data)
        except UNDECODABLE as error:
            raise SerdeError(f"{self.name}: not a response: {error}") from None
        return SubscriptionResponse(hashed, self.value.deserialize(foreign))
