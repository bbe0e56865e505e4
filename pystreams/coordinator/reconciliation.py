"""Reconciliation: one member's next current assignment (KIP-848 "Member Epoch").

A pure function of the member's current assignment, its target, the partitions it reports
owning, and who else still holds what. The three phases of the KIP:

1. revoke: while the member holds partitions outside its target, it is told to keep only
   ``current ∩ target`` and stays at its epoch until it reports none of the revoked ones;
2. then it moves to the target epoch;
3. target partitions are handed out as their previous holders release them (``pending``).

Revoking and assigning never happen in the same step.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from uuid import UUID

from pystreams import partitions as tp


@dataclass(frozen=True, slots=True)
class MemberAssignmentState:
    member_epoch: int
    previous_member_epoch: int
    assigned: tp.Partitions
    revoking: tp.Partitions


def reconcile(
    current: MemberAssignmentState,
    target_epoch: int,
    target: tp.Partitions,
    owned: tp.Partitions | None,
    is_free: Callable[[UUID, int], bool],
) -> MemberAssignmentState:
    """The member's next state. ``owned`` is what the member reported in this heartbeat (None
    when it did not send the field); ``is_free(topic, partition)`` says no *other* member holds it.
    """
    if current.revoking:
        # Phase 1, waiting: only the member's own report that it let go moves it on.
        if owned is None or tp.overlaps(owned, current.revoking):
            return current
    elif current.member_epoch == target_epoch and dict(current.assigned) == dict(target):
        return current
    return _next(current, target_epoch, target, is_free)


def _next(
    current: MemberAssignmentState,
    target_epoch: int,
    target: tp.Partitions,
    is_free: Callable[[UUID, int], bool],
) -> MemberAssignmentState:
    keep = tp.intersection(current.assigned, target)
    revoke = tp.difference(current.assigned, target)
    if revoke:
        # Stay at the current epoch: the member may not take anything new before it revokes.
        return MemberAssignmentState(current.member_epoch, current.previous_member_epoch, keep, revoke)
    granted = dict(keep)
    for topic, parts in tp.difference(target, keep).items():
        free = frozenset(p for p in parts if is_free(topic, p))
        if free:
            granted[topic] = granted[topic] | free if topic in granted else free
    if current.member_epoch == target_epoch:
        return MemberAssignmentState(target_epoch, current.previous_member_epoch, granted, {})
    return MemberAssignmentState(target_epoch, current.member_epoch, granted, {})
