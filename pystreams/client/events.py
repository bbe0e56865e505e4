"""What a group member tells its caller, whichever protocol it speaks.

The KIP-848 member (:mod:`pystreams.client.member`) and the classic member
(:mod:`pystreams.client.classic`) hand the same events to the same callers (the driver, the
worker, the simulator), so that either can be driven without knowing which one it is. See
``pystreams.client.member`` for what each event asks of the caller.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import kafka.errors as Errors

from pystreams.partitions import PartitionSet


def error_name(code: int) -> str:
    error = Errors.for_code(code)
    return getattr(error, "message", None) or error.__name__


class MemberState(enum.Enum):
    """Where a member stands, as the application sees it. The KIP-848 member's states; the classic
    member (``client.classic``) reports its own phases through the same values."""

    UNSUBSCRIBED = "unsubscribed"  # not in the group; no heartbeats
    JOINING = "joining"  # epoch-0 heartbeat (classic: first JoinGroup/SyncGroup) due or in flight
    STABLE = "stable"  # in the group, nothing to revoke or acknowledge
    RECONCILING = "reconciling"  # revocation handed to the caller, revocation_done() awaited
    ACKNOWLEDGING = "acknowledging"  # revocation done; its ack heartbeat not answered yet
    FENCED = "fenced"  # everything lost; the epoch-0 rejoin heartbeat is due
    PREPARE_LEAVING = "prepare_leaving"  # leave() called: revoking everything first
    LEAVING = "leaving"  # the -1/-2 heartbeat is due or in flight
    FATAL = "fatal"  # unrecoverable (see the member's fatal_error); no more requests


#: The states in which a member is part of the group with an assignment it acts on.
IN_GROUP = frozenset({MemberState.STABLE, MemberState.RECONCILING, MemberState.ACKNOWLEDGING})


@dataclass(frozen=True)
class RevokePartitions:
    """Stop, commit, call on_partitions_revoked, then ``revocation_done(now, revocation_id)``."""

    partitions: PartitionSet
    revocation_id: int


@dataclass(frozen=True)
class PartitionsAssigned:
    partitions: PartitionSet
    member_epoch: int


@dataclass(frozen=True)
class PartitionsLost:
    partitions: PartitionSet
    #: FENCED_MEMBER_EPOCH, UNKNOWN_MEMBER_ID, REQUEST_TIMED_OUT (session or revocation guard),
    #: the fatal error, or 0 when the application gave them up (``leave(lose=True)``).
    error_code: int


@dataclass(frozen=True)
class MemberFailed:
    error_code: int
    message: str


@dataclass(frozen=True)
class LeftGroup:
    member_epoch_sent: int | None  # -1 / -2, or None when there was no group to leave


@dataclass(frozen=True)
class CoordinatorUnavailable:
    error_code: int


@dataclass(frozen=True)
class InstanceIdUnreleased:
    """A static member's join met UNRELEASED_INSTANCE_ID: its previous incarnation (a crashed
    process) still holds the instance id until its session expires; the join is retried after
    ``retry_in_ms``. ``attempt`` counts the refusals in a row."""

    instance_id: str
    attempt: int
    retry_in_ms: int


@dataclass(frozen=True)
class AssignmentInstalled:
    group_epoch: int


@dataclass(frozen=True)
class AssignmentAbandoned:
    api: str  # "prepare" | "install" | "assign"
    error_code: int
    message: str


MemberEvent = (
    RevokePartitions
    | PartitionsAssigned
    | PartitionsLost
    | MemberFailed
    | LeftGroup
    | CoordinatorUnavailable
    | InstanceIdUnreleased
    | AssignmentInstalled
    | AssignmentAbandoned
)


class MemberFatalError(Exception):
    """Raised by API calls on a member that has failed; carries the same message as the event."""
