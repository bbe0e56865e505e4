"""A client-side assignor for the simulator that computes a correct assignment, or misbehaves.

``SimAssignor`` is sticky and balanced, handles members with different subscriptions, and
advertises a version range and a metadata version (which rolling upgrades change). What it
does on each ``assign()`` call is decided by the simulator through ``choose_outcome``: compute
correctly, take a long time (the process holds the Install back), raise
PartitionAssignorError, return an error, or return an invalid assignment (a partition missing,
given twice, out of range, of an unknown topic, or to an unknown member). It refuses (returns
an error) when a member's metadata version lies outside its own range: it cannot read it.

After every failure it changes its metadata (a retry counter in the bytes) so that its member's
next heartbeat asks for a new assignment, as a Streams assignor does with its reason.
"""

from __future__ import annotations

import enum
import math
import random
from collections import Counter
from collections.abc import Callable
from uuid import UUID

from pystreams.assignors.api import (
    AssignmentSpec,
    AssignorMetadata,
    GroupAssignment,
    MemberAssignment,
    PartitionAssignorError,
)

ASSIGNOR_NAME = "sim-sticky"
#: The Install error our assignor reports when it chooses to fail by returning an error.
ASSIGNOR_ERROR = 7
#: The Install error when it cannot read some member's metadata version.
VERSION_ERROR = 8


class Outcome(enum.Enum):
    VALID = "valid"
    SLOW = "slow"
    RAISE = "raise"
    ERROR = "error"
    INVALID = "invalid"


INVALID_KINDS = ("missing", "twice", "out-of-range", "unknown-topic", "unknown-member")


class SimAssignor:
    name = ASSIGNOR_NAME

    def __init__(
        self,
        minimum_version: int,
        maximum_version: int,
        metadata_version: int,
        rng: random.Random,
        choose_outcome: Callable[[], Outcome],
        slow_ms: Callable[[], int] = lambda: 0,
        stats: Counter | None = None,
    ) -> None:
        self.minimum_version = minimum_version
        self.maximum_version = maximum_version
        self.metadata_version = metadata_version
        self.rng = rng
        self.choose_outcome = choose_outcome
        self.slow_ms = slow_ms
        self.retries = 0
        #: What the latest assign() did, and how long the process should hold its Install.
        self.last_outcome: Outcome | None = None
        self.last_invalid_kind: str | None = None
        self.compute_ms = 0
        self.stats = stats if stats is not None else Counter()

    def metadata(self) -> AssignorMetadata:
        return AssignorMetadata(
            reason=0,
            version=self.metadata_version,
            data=f"retry {self.retries}".encode(),
            minimum_version=self.minimum_version,
            maximum_version=self.maximum_version,
        )

    def on_assignment(self, error: int, assignment: MemberAssignment, group_epoch: int) -> None:
        pass

    def assign(self, spec: AssignmentSpec) -> GroupAssignment:
        self.compute_ms = 0
        self.last_invalid_kind = None
        unreadable = [
            member_id
            for member_id, member in spec.members.items()
            if member.metadata is None or not self.minimum_version <= member.metadata.version <= self.maximum_version
        ]
        if unreadable:
            # The coordinator chose a member that cannot read everyone's metadata.
            self.stats["assignor.version_refusals"] += 1
            return self._failed(Outcome.ERROR, VERSION_ERROR)
        outcome = self.choose_outcome()
        self.last_outcome = outcome
        if outcome is Outcome.RAISE:
            self.retries += 1
            raise PartitionAssignorError("the simulator told this assignor to fail")
        if outcome is Outcome.ERROR:
            return self._failed(outcome, ASSIGNOR_ERROR)
        assignment = sticky_balanced(spec)
        if outcome is Outcome.SLOW:
            self.compute_ms = self.slow_ms()
        elif outcome is Outcome.INVALID:
            self.retries += 1
            self.last_invalid_kind = self._corrupt(assignment, spec)
        return GroupAssignment(members={member_id: MemberAssignment(partitions=_frozen(parts)) for member_id, parts in assignment.items()})

    def _failed(self, outcome: Outcome, error: int) -> GroupAssignment:
        self.last_outcome = outcome
        self.retries += 1
        return GroupAssignment(members={}, error=error)

    def _corrupt(self, assignment: dict[str, dict[UUID, set[int]]], spec: AssignmentSpec) -> str:
        """Break the assignment in one way the coordinator must refuse; returns how."""
        holders = [(member_id, topic, p) for member_id, parts in sorted(assignment.items()) for topic in sorted(parts) for p in sorted(parts[topic])]
        kind = self.rng.choice(INVALID_KINDS)
        if kind == "missing" and holders:
            member_id, topic, p = self.rng.choice(holders)
            assignment[member_id][topic].discard(p)
        elif kind == "twice" and holders and len(assignment) > 1:
            member_id, topic, p = self.rng.choice(holders)
            other = self.rng.choice(sorted(m for m in assignment if m != member_id))
            assignment[other].setdefault(topic, set()).add(p)
        elif kind == "out-of-range" and spec.topics:
            topic = self.rng.choice(sorted(spec.topics))
            member_id = self.rng.choice(sorted(assignment))
            assignment[member_id].setdefault(topic, set()).add(spec.topics[topic].num_partitions)
        elif kind == "unknown-topic" and assignment:
            member_id = self.rng.choice(sorted(assignment))
            assignment[member_id][UUID(int=self.rng.getrandbits(128))] = {0}
        else:
            kind = "unknown-member"
            ghost = assignment[f"ghost-{self.rng.getrandbits(32):08x}"] = {}
            if holders:  # the ghost takes a partition, so the rest stays a valid assignment
                member_id, topic, p = holders[0]
                assignment[member_id][topic].discard(p)
                ghost[topic] = {p}
        return kind


def sticky_balanced(spec: AssignmentSpec) -> dict[str, dict[UUID, set[int]]]:
    """Every subscribed partition to exactly one subscriber; members keep their current target
    up to a common cap, the rest goes to the least loaded subscriber (ties by member id)."""
    member_ids = sorted(spec.members)
    assignment: dict[str, dict[UUID, set[int]]] = {member_id: {} for member_id in member_ids}
    subscribers = {topic: [m for m in member_ids if topic in spec.members[m].subscribed_topic_ids] for topic in sorted(spec.topics)}
    partitions = [(topic, p) for topic in sorted(spec.topics) if subscribers[topic] for p in range(spec.topics[topic].num_partitions)]
    active = sum(1 for m in member_ids if spec.members[m].subscribed_topic_ids)
    if not partitions or not active:
        return assignment
    cap = math.ceil(len(partitions) / active)
    current: dict[tuple[UUID, int], str] = {}
    for member_id in member_ids:
        for topic, parts in spec.members[member_id].target_partitions.items():
            for p in parts:
                current.setdefault((topic, p), member_id)
    counts = dict.fromkeys(member_ids, 0)
    unplaced = []
    for topic, p in partitions:
        owner = current.get((topic, p))
        if owner is not None and topic in spec.members[owner].subscribed_topic_ids and counts[owner] < cap:
            assignment[owner].setdefault(topic, set()).add(p)
            counts[owner] += 1
        else:
            unplaced.append((topic, p))
    for topic, p in unplaced:
        owner = min(subscribers[topic], key=lambda m: (counts[m], m))
        assignment[owner].setdefault(topic, set()).add(p)
        counts[owner] += 1
    return assignment


def _frozen(parts: dict[UUID, set[int]]) -> dict[UUID, frozenset[int]]:
    return {topic: frozenset(ps) for topic, ps in parts.items() if ps}
