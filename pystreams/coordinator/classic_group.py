"""The classic group (JoinGroup/SyncGroup) and how its record changes it.

A classic group lives mostly in memory, as in Apache Kafka: members joining during a rebalance,
the join and sync answers they wait for, the rebalance state. Its record
(``ClassicGroupMetadata``) is written only at stable points — the leader's assignment stored,
the group emptied, a static member replaced, a conversion — and holds the last stable
generation. ``persisted`` is that record's value, live and after a load alike; it is what
``snapshot`` compares. Loading rebuilds the group from it: Stable with its members, or Empty.

The manager in ``classic.py`` decides; this module holds the data and the small rules about it
(protocol votes, leader election, member validation, offset-commit validation).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import kafka.errors as Errors

from pystreams.coordinator import records as r
from pystreams.coordinator.errors import RequestError
from pystreams.protocol import consumer_protocol as cp

if TYPE_CHECKING:
    from pystreams.assignors.api import TopicMetadata

CLASSIC = "classic"


class ClassicGroupState(enum.Enum):
    """Kafka's ClassicGroupState; values are the display names ListGroups and DescribeGroups use."""

    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


#: The states each state may be entered from (Kafka's ClassicGroupState).
_VALID_PREVIOUS = {
    ClassicGroupState.EMPTY: {ClassicGroupState.PREPARING_REBALANCE},
    ClassicGroupState.PREPARING_REBALANCE: {ClassicGroupState.STABLE, ClassicGroupState.COMPLETING_REBALANCE, ClassicGroupState.EMPTY},
    ClassicGroupState.COMPLETING_REBALANCE: {ClassicGroupState.PREPARING_REBALANCE},
    ClassicGroupState.STABLE: {ClassicGroupState.COMPLETING_REBALANCE},
    ClassicGroupState.DEAD: set(ClassicGroupState),
}


@dataclass(slots=True)
class ClassicMember:
    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    protocol_type: str
    #: (name, metadata) in the member's order of preference.
    protocols: tuple[tuple[str, bytes], ...]
    assignment: bytes = b""
    #: The request id of its JoinGroup waiting for the join phase to end, and the API version.
    awaiting_join: int | None = None
    join_version: int = 0
    #: The request id of its SyncGroup waiting for the leader's assignment.
    awaiting_sync: int | None = None
    #: Joined in the current rebalance, no join completed yet (its session timer is the join timeout).
    is_new: bool = False

    def metadata(self, protocol: str | None) -> bytes:
        for name, metadata in self.protocols:
            if name == protocol:
                return metadata
        return b""

    def vote(self, candidates: set[str]) -> str:
        """The member's first protocol among ``candidates`` (Kafka's ClassicGroupMember.vote)."""
        return next(name for name, _ in self.protocols if name in candidates)

    def matches(self, protocols: tuple[tuple[str, bytes], ...]) -> bool:
        return self.protocols == protocols

    @property
    def has_satisfied_heartbeat(self) -> bool:
        """A parked member is alive; a new one is judged by its join timeout only."""
        if self.is_new:
            return False
        return self.awaiting_join is not None or self.awaiting_sync is not None


@dataclass(slots=True)
class ClassicGroup:
    group_id: str
    state: ClassicGroupState = ClassicGroupState.EMPTY
    previous_state: ClassicGroupState | None = None
    current_state_timestamp: int = -1
    generation: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str | None = None
    members: dict[str, ClassicMember] = field(default_factory=dict)
    static_members: dict[str, str] = field(default_factory=dict)  # instance id -> member id
    #: KIP-394: member ids handed out with MEMBER_ID_REQUIRED, not joined yet.
    pending_join: set[str] = field(default_factory=set)
    #: Members that joined the current generation and have not synced yet.
    pending_sync: set[str] = field(default_factory=set)
    #: A member was added during the initial rebalance's delay (it extends the delay).
    new_member_added: bool = False
    #: The initial rebalance's current delay and what is left of the rebalance timeout to extend it.
    initial_delay_ms: int = 0
    initial_delay_remaining_ms: int = 0
    #: The group's last record (what a load would rebuild it from).
    persisted: r.ClassicGroupValue | None = None

    group_type = CLASSIC

    # --- derived views ---------------------------------------------------------------------

    @property
    def is_empty(self) -> bool:
        return self.state is ClassicGroupState.EMPTY

    @property
    def num_awaiting_join(self) -> int:
        return sum(1 for member in self.members.values() if member.awaiting_join is not None)

    def has_all_members_joined(self) -> bool:
        return len(self.members) == self.num_awaiting_join and not self.pending_join

    def rebalance_timeout_ms(self) -> int:
        """The group's rebalance timeout: the largest of its members'."""
        return max((member.rebalance_timeout_ms for member in self.members.values()), default=0)

    def can_rebalance(self) -> bool:
        return self.state in _VALID_PREVIOUS[ClassicGroupState.PREPARING_REBALANCE]

    def transition_to(self, state: ClassicGroupState, now_ms: int) -> None:
        if self.state not in _VALID_PREVIOUS[state]:
            raise AssertionError(f"classic group {self.group_id}: {self.state.value} cannot become {state.value}")
        self.previous_state, self.state = self.state, state
        self.current_state_timestamp = now_ms

    def supported_protocols(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for member in self.members.values():
            for name, _ in member.protocols:
                counts[name] = counts.get(name, 0) + 1
        return counts

    def supports_protocols(self, protocol_type: str, protocols: tuple[tuple[str, bytes], ...]) -> bool:
        """An Empty group takes any non-empty offer; otherwise the type must match and one offered
        protocol must be supported by every member (vacuously so, as in Kafka, by a group whose
        members all left while it rebalances)."""
        if self.is_empty:
            return bool(protocol_type) and bool(protocols)
        counts = self.supported_protocols()
        return protocol_type == self.protocol_type and any(counts.get(name, 0) == len(self.members) for name, _ in protocols)

    def select_protocol(self) -> str:
        """The vote: every member votes for its first protocol all members support; most votes
        wins (ties by name, where Kafka's is arbitrary)."""
        counts = self.supported_protocols()
        candidates = {name for name, count in counts.items() if count == len(self.members)}
        if not candidates:
            raise AssertionError(f"classic group {self.group_id} has no protocol every member supports")
        votes: dict[str, int] = {}
        for member in self.members.values():
            choice = member.vote(candidates)
            votes[choice] = votes.get(choice, 0) + 1
        return min(votes, key=lambda name: (-votes[name], name))

    def is_leader(self, member_id: str) -> bool:
        return self.leader_id == member_id

    def stale_assignment(self, topics: Mapping[str, TopicMetadata]) -> str | None:
        """Why the assignment the group holds no longer fits its members' subscriptions and the
        cluster's topics (None: it fits, or is not the consumer protocol's to judge): a member
        holds a partition outside its subscription, or a partition of a subscribed topic is
        nobody's (a topic or partitions added since the leader assigned, a subscription that
        grew, a member gone whose partitions no rebalance has handed on).

        Kafka keeps such an assignment wherever it skips a rebalance, and only the leader's
        metadata watch (or a member's rejoin) ever repairs it; where the coordinator itself
        would otherwise hand it out again, it rebalances instead (KAFKA-20273 rebalances a
        downgrade whose assignment is stale, KAFKA-12759 a static member whose subscription
        changed). A cooperative group between its two phases has partitions in nobody's hands
        too: a rebalance then only comes a little early."""
        if self.protocol_type != cp.PROTOCOL_TYPE or self.protocol_name is None or not self.members:
            return None
        subscribed: set[tuple[str, int]] = set()
        assigned: set[tuple[str, int]] = set()
        for member in self.members.values():
            try:
                subscription = cp.decode_subscription(member.metadata(self.protocol_name))
                assignment = cp.decode_assignment(member.assignment)
            except cp.ConsumerProtocolError:
                return None  # not ours to read: the leader's business, as in Kafka
            own = {(name, p) for name in subscription.topics if (topic := topics.get(name)) is not None for p in range(topic.num_partitions)}
            # Topics the coordinator has no metadata for are not judged (none yet, at a load).
            held = {(name, p) for name, numbers in assignment.partitions.items() if name in topics for p in numbers}
            if not held <= own:
                return f"member {member.member_id} holds {len(held - own)} partition(s) outside its subscription"
            subscribed |= own
            assigned |= held
        missing = subscribed - assigned
        if missing:
            return f"{len(missing)} subscribed partition(s) are assigned to no member"
        return None

    # --- membership -------------------------------------------------------------------------

    def add(self, member: ClassicMember) -> None:
        if not self.members:
            self.protocol_type = member.protocol_type
        if member.protocol_type != self.protocol_type:
            raise AssertionError(f"member {member.member_id} of type {member.protocol_type} in a {self.protocol_type} group")
        if self.leader_id is None:
            self.leader_id = member.member_id  # the first member leads, across generations
        self.members[member.member_id] = member
        if member.instance_id is not None:
            self.static_members[member.instance_id] = member.member_id
        self.pending_join.discard(member.member_id)

    def remove(self, member_id: str) -> ClassicMember | None:
        member = self.members.pop(member_id, None)
        if member is not None and member.instance_id is not None and self.static_members.get(member.instance_id) == member_id:
            del self.static_members[member.instance_id]
        if self.leader_id == member_id:
            self.leader_id = next(iter(self.members), None)
        self.pending_join.discard(member_id)
        self.pending_sync.discard(member_id)
        return member

    def elect_joined_leader(self) -> bool:
        """Keep the leader if it rejoined, else any member that did. False if none did."""
        leader = self.members.get(self.leader_id or "")
        if leader is not None and leader.awaiting_join is not None:
            return True
        joined = next((mid for mid, member in self.members.items() if member.awaiting_join is not None), None)
        if joined is None:
            return False
        self.leader_id = joined
        return True

    def validate_member(self, member_id: str, instance_id: str | None, operation: str) -> ClassicMember:
        """Kafka's validateMember: the instance id first (FENCED_INSTANCE_ID when it names another
        member), then the member id (UNKNOWN_MEMBER_ID)."""
        if instance_id is not None:
            holder = self.static_members.get(instance_id)
            if holder is None:
                raise RequestError(Errors.UnknownMemberIdError, f"Instance id {instance_id} is not a member of group {self.group_id} ({operation}).")
            if holder != member_id:
                raise RequestError(
                    Errors.FencedInstanceIdError, f"Instance id {instance_id} is now member {holder}; member {member_id} is fenced ({operation})."
                )
        member = self.members.get(member_id)
        if member is None:
            raise RequestError(Errors.UnknownMemberIdError, f"Member {member_id} is not a member of group {self.group_id} ({operation}).")
        return member

    # --- offsets (Kafka's ClassicGroup.validateOffsetCommit / validateOffsetFetch) ----------

    def validate_offset_commit(self, member_id: str, generation: int, instance_id: str | None = None) -> None:
        if self.state is ClassicGroupState.DEAD:
            raise RequestError(Errors.CoordinatorNotAvailableError, f"Group {self.group_id} is being unloaded.")
        if generation < 0 and self.is_empty:
            return  # an admin commit, or a simple group's
        if generation >= 0 or member_id or instance_id is not None:
            self.validate_member(member_id, instance_id, "offset-commit")
            if generation != self.generation:
                raise RequestError(Errors.IllegalGenerationError, f"Generation {generation} is not group {self.group_id}'s {self.generation}.")
        elif not self.is_empty:
            raise RequestError(Errors.UnknownMemberIdError, "Commits without a member are only accepted while the group is empty.")
        if self.state is ClassicGroupState.COMPLETING_REBALANCE:
            raise RequestError(Errors.RebalanceInProgressError, f"Group {self.group_id} is completing a rebalance.")

    def validate_offset_fetch(self, member_id: str | None, generation: int) -> None:
        if self.state is ClassicGroupState.DEAD:
            raise RequestError(Errors.GroupIdNotFoundError, f"Group {self.group_id} is being unloaded.")

    # --- records -----------------------------------------------------------------------------

    def record_value(self, assignments: dict[str, bytes] | None = None) -> r.ClassicGroupValue:
        """The group as a record: members with their subscription for the selected protocol and
        their assignment (``assignments`` overrides what the members hold)."""
        return r.ClassicGroupValue(
            protocol_type=self.protocol_type or "",
            generation=self.generation,
            protocol=self.protocol_name,
            leader=self.leader_id,
            current_state_timestamp=self.current_state_timestamp,
            members=[
                r.ClassicMemberValue(
                    member_id=member.member_id,
                    client_id=member.client_id,
                    client_host=member.client_host,
                    rebalance_timeout_ms=member.rebalance_timeout_ms,
                    session_timeout_ms=member.session_timeout_ms,
                    subscription=member.metadata(self.protocol_name),
                    assignment=member.assignment if assignments is None else assignments.get(member.member_id, b""),
                    instance_id=member.instance_id,
                )
                for member in self.members.values()
            ],
        )

    @classmethod
    def from_record(cls, group_id: str, value: r.ClassicGroupValue) -> ClassicGroup:
        """The group a load rebuilds: Stable with its members, or Empty (Kafka's replay)."""
        group = cls(group_id, persisted=value)
        group.generation = value.generation
        group.protocol_type = value.protocol_type or None
        group.protocol_name = value.protocol
        group.current_state_timestamp = value.current_state_timestamp
        for stored in value.members:
            member = ClassicMember(
                member_id=stored.member_id,
                instance_id=stored.instance_id,
                client_id=stored.client_id,
                client_host=stored.client_host,
                rebalance_timeout_ms=stored.rebalance_timeout_ms if stored.rebalance_timeout_ms >= 0 else stored.session_timeout_ms,
                session_timeout_ms=stored.session_timeout_ms,
                protocol_type=value.protocol_type,
                protocols=((value.protocol or "", stored.subscription),),
                assignment=stored.assignment,
            )
            group.members[member.member_id] = member
            if member.instance_id is not None:
                group.static_members[member.instance_id] = member.member_id
        group.leader_id = value.leader if value.leader in group.members else next(iter(group.members), None)
        group.state = ClassicGroupState.STABLE if group.members else ClassicGroupState.EMPTY
        return group

    def snapshot(self) -> dict:
        return {"group_type": CLASSIC, "persisted": self.persisted}
