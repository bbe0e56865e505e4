"""The PartitionAssignor interfaces of KIP-848.

Two sides share one spec and one result shape:

* server-side assignors (``range``, ``uniform``) run inside the coordinator shard;
* client-side assignors run in a member, fed by ConsumerGroupPrepareAssignment and installed
  with ConsumerGroupInstallAssignment; they also publish metadata (with a reason and a
  version range) in the member's heartbeats, and hear about their member's new assignment.

Partitions are always keyed by topic id: the protocol works with topic ids only, so a
re-created topic is a different topic.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, runtime_checkable
from uuid import UUID

import msgspec

#: Partitions keyed by topic id. Values are frozensets so an assignment can be shared safely.
Partitions = Mapping[UUID, frozenset[int]]

EMPTY_PARTITIONS: Partitions = {}


class PartitionAssignorError(Exception):
    """The assignor cannot compute an assignment for the spec it was given."""


class AssignorMetadata(msgspec.Struct, frozen=True):
    """A member's metadata for the selected client-side assignor (its ``Assignor`` fields)."""

    reason: int = 0
    version: int = 0
    data: bytes = b""
    minimum_version: int = 0
    maximum_version: int = 0


class MemberSpec(msgspec.Struct, frozen=True):
    """What an assignor knows about one member (KIP: AssignmentMemberSpec)."""

    subscribed_topic_ids: frozenset[UUID]
    #: The member's current *target* partitions: what stickiness is measured against.
    target_partitions: Partitions = EMPTY_PARTITIONS
    instance_id: str | None = None
    rack_id: str | None = None
    #: Only for client-side assignors: the member's metadata for the selected assignor.
    metadata: AssignorMetadata | None = None


class TopicMetadata(msgspec.Struct, frozen=True):
    topic_id: UUID
    name: str
    num_partitions: int


class AssignmentSpec(msgspec.Struct, frozen=True):
    """The assignor's whole input: members by member id, topics by topic id."""

    members: Mapping[str, MemberSpec]
    topics: Mapping[UUID, TopicMetadata]


class MemberAssignment(msgspec.Struct, frozen=True):
    partitions: Partitions = EMPTY_PARTITIONS
    #: Client-side assignors only: the assignment metadata for this member and its version.
    metadata_version: int = 0
    metadata: bytes = b""


class GroupAssignment(msgspec.Struct, frozen=True):
    """The assignor's output: one entry per member of the spec (members may get nothing)."""

    members: Mapping[str, MemberAssignment]
    #: Client-side assignors only: non-zero means "keep the current target assignment".
    error: int = 0


@runtime_checkable
class ServerAssignor(Protocol):
    """A server-side assignor: a pure function of the spec, selected by ``name``."""

    name: str

    def assign(self, spec: AssignmentSpec) -> GroupAssignment: ...


@runtime_checkable
class ClientAssignor(Protocol):
    """A client-side assignor (KIP-848 "Consumer API: New PartitionAssignor interface")."""

    name: str
    minimum_version: int
    maximum_version: int

    def metadata(self) -> AssignorMetadata:
        """The metadata this member advertises; a non-zero reason asks for a new assignment."""
        ...

    def assign(self, spec: AssignmentSpec) -> GroupAssignment: ...

    def on_assignment(self, error: int, assignment: MemberAssignment, group_epoch: int) -> None:
        """Called once per member epoch with the member's target assignment and metadata."""
        ...
