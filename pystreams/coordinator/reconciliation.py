"""Reconciliation: one member's next current assignment (KIP-848 "Member Epoch").

A pure function of the member's current assignment, its target, the partitions it reports
owning, and who else still holds what. The three phases of the KIP:

1. revoke: while the member holds partitions outside its target, it is told to keep only
   ``current ∩ target`` and stays at its epoch until it reports none of the revoked ones (a
   member that already reports owning none of them skips this phase, as in Kafka: an eager
   classic member rejoins having revoked everything);
2. then it moves to the target epoch;
3. target partitions are handed out as their previous holders release them (``pending``).

Revoking and assigning never happen in the same step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from uuid import UUID

from pystreams.partitions import NO_PARTITIONS, PartitionSet


@dataclass(frozen=True, slots=True)
class MemberAssignmentState:
    member_epoch: int
    previous_member_epoch: int
    assigned: PartitionSet
    revoking: PartitionSet


def reconcile(
    current: MemberAssignmentState,
    target_epoch: int,
    target: PartitionSet,
    owned: PartitionSet | None,
    is_free: Callable[[UUID, int], bool],
) -> MemberAssignmentState:
    """The member's next state. ``owned`` is what the member reported in this heartbeat (None
    when it did not send the field); ``is_free(topic, partition)`` says no *other* member holds it.
    """
    if current.revoking:
        # Phase 1, waiting: only the member's own report that it let go moves it on.
        if owned is None or not owned.isdisjoint(current.revoking):
            return current
    elif current.member_epoch == target_epoch and current.assigned == target:
        return current
    return _next(current, target_epoch, target, owned, is_free)


def _next(
    current: MemberAssignmentState,
    target_epoch: int,
    target: PartitionSet,
    owned: PartitionSet | None,
    is_free: Callable[[UUID, int], bool],
) -> MemberAssignmentState:
    keep = current.assigned & target
    revoke = current.assigned - target
    if revoke and (owned is None or not owned.isdisjoint(revoke)):
        # Stay at the current epoch: the member may not take anything new before it revokes.
        return MemberAssignmentState(current.member_epoch, current.previous_member_epoch, keep, revoke)
    free = PartitionSet.from_pairs(pair for pair in (target - keep) if is_free(*pair))
    granted = keep | free
    if current.member_epoch == target_epoch:
        return MemberAssignmentState(target_epoch, current.previous_member_epoch, granted, NO_PARTITIONS)
    return MemberAssignmentState(target_epoch, current.member_epoch, granted, NO_PARTITIONS)
