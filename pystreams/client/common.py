"""What the KIP-848 member and the classic member share: the :class:`GroupMember` surface the
driver and the simulator drive either through, a subscription (topic names or one regex, checked
once), the book of revocations handed to the caller, and :class:`MemberBase`, the partitions and
events both keep the same way."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import kafka.errors as Errors
from kafka.protocol.api_message import ApiMessage

from pystreams.client.events import MemberEvent, MemberFatalError, MemberState, PartitionsLost, RevokePartitions
from pystreams.partitions import NO_PARTITIONS, PartitionSet


class ErrorCode:
    """Error codes the members match responses on (a ``match`` value pattern needs a dotted name)."""

    NONE = Errors.NoError.errno
    UNKNOWN_MEMBER_ID = Errors.UnknownMemberIdError.errno
    ILLEGAL_GENERATION = Errors.IllegalGenerationError.errno
    REBALANCE_IN_PROGRESS = Errors.RebalanceInProgressError.errno
    MEMBER_ID_REQUIRED = Errors.MemberIdRequiredError.errno
    FENCED_INSTANCE_ID = Errors.FencedInstanceIdError.errno
    INCONSISTENT_GROUP_PROTOCOL = Errors.InconsistentGroupProtocolError.errno
    LOAD_IN_PROGRESS = Errors.CoordinatorLoadInProgressError.errno
    REQUEST_TIMED_OUT = Errors.RequestTimedOutError.errno
    FENCED_MEMBER_EPOCH = Errors.FencedMemberEpochError.errno
    STALE_MEMBER_EPOCH = Errors.StaleMemberEpochError.errno
    UNRELEASED_INSTANCE_ID = Errors.UnreleasedInstanceIdError.errno
    GROUP_ID_NOT_FOUND = Errors.GroupIdNotFoundError.errno


class GroupMember(Protocol):
    """A sans-IO group member, KIP-848 (:class:`~pystreams.client.member.ConsumerGroupMember`) or
    classic (:class:`~pystreams.client.classic.ClassicGroupMember`): what the driver and the
    simulator call, without knowing which protocol it speaks. See pystreams.client.member's
    docstring for the driving loop and the events."""

    @property
    def state(self) -> MemberState: ...
    @property
    def member_id(self) -> str: ...
    @property
    def member_epoch(self) -> int: ...
    @property
    def owned_partitions(self) -> PartitionSet: ...
    @property
    def revoking_partitions(self) -> PartitionSet: ...
    @property
    def pending_partitions(self) -> PartitionSet: ...
    @property
    def heartbeat_interval_ms(self) -> int: ...
    @property
    def fatal_error(self) -> str | None: ...
    @property
    def computing_assignment(self) -> bool: ...
    @property
    def closed(self) -> bool: ...

    def take_events(self) -> list[MemberEvent]: ...
    def subscribe(self, topics: Iterable[str] | None = None, regex: str | None = None) -> None: ...
    def request_heartbeat(self) -> None: ...
    def revocation_done(self, now_ms: int, revocation_id: int | None = None) -> None: ...
    def leave(self, now_ms: int, *, permanent: bool = False, lose: bool = False) -> None: ...
    def close(self, now_ms: int) -> None: ...
    def poll(self, now_ms: int) -> Sequence[ApiMessage]: ...
    def request_timeout_ms(self, request: ApiMessage, default_ms: int) -> int: ...
    def next_deadline(self) -> int | None: ...
    def on_response(self, request: ApiMessage, response: ApiMessage, now_ms: int) -> None: ...
    def on_request_failed(self, request: ApiMessage, now_ms: int) -> None: ...


@dataclass(frozen=True)
class Subscription:
    topics: tuple[str, ...]  # sorted; empty for a regex subscription
    regex: str  # "" for a topic-name subscription


def parse_subscription(topics: Iterable[str] | None, regex: str | None) -> Subscription:
    """Topic names or one regex, exactly one of them; a clear error for anything else."""
    if (topics is None) == (regex is None):
        raise ValueError("subscribe to either topics or regex, exactly one of them")
    if topics is not None:
        if isinstance(topics, str):
            raise TypeError("topics must be an iterable of names, not a string")
        names = tuple(sorted(set(topics)))
        if not names or not all(names):
            raise ValueError("topics must be non-empty names; use leave() to unsubscribe")
        return Subscription(topics=names, regex="")
    if not regex:
        raise ValueError("regex must be non-empty")
    return Subscription(topics=(), regex=regex)


class Revocations:
    """Revocations handed to the caller (``RevokePartitions``) and not done yet, by id. Ids only
    grow, so the done-call of a revocation given up since (fenced, lost) is recognised and ignored."""

    def __init__(self) -> None:
        self._open: dict[int, PartitionSet] = {}
        self._next_id = 1

    def open(self, partitions: PartitionSet) -> RevokePartitions:
        revocation_id = self._next_id
        self._next_id += 1
        self._open[revocation_id] = partitions
        return RevokePartitions(partitions, revocation_id)

    def close(self, revocation_id: int | None) -> bool:
        """Mark one revocation done (``None``: all of them). True when that closed the last open
        one, i.e. the member may go on; False for an unknown id or while others are open."""
        if revocation_id is None:
            if not self._open:
                return False
            self._open.clear()
            return True
        if self._open.pop(revocation_id, None) is None:
            return False
        return not self._open

    def clear(self) -> None:
        self._open.clear()

    @property
    def partitions(self) -> PartitionSet:
        return NO_PARTITIONS.union(*self._open.values())

    def __bool__(self) -> bool:
        return bool(self._open)


class MemberBase(ABC):
    """What both members keep the same way, whatever their protocol: the partitions the
    application owns and revokes, the events for the caller, the clock, and closing and failing.
    These outlive every session (revocation ids only grow, events wait for the caller)."""

    def __init__(self) -> None:
        self._owned: PartitionSet = NO_PARTITIONS
        self._revocations = Revocations()
        self._closed = False
        self._fatal_error: str | None = None
        self._now_ms = 0  # the latest time the caller told us about
        self._events: list[MemberEvent] = []

    @property
    def owned_partitions(self) -> PartitionSet:
        """What this member may process right now (revoked partitions leave at once)."""
        return self._owned

    @property
    def revoking_partitions(self) -> PartitionSet:
        """Handed to the caller for revocation; still reported to the coordinator as owned."""
        return self._revocations.partitions

    @property
    def fatal_error(self) -> str | None:
        return self._fatal_error

    @property
    def closed(self) -> bool:
        return self._closed

    def take_events(self) -> list[MemberEvent]:
        """Return and forget the events produced since the last call, oldest first."""
        events, self._events = self._events, []
        return events

    @abstractmethod
    def leave(self, now_ms: int, *, permanent: bool = False, lose: bool = False) -> None: ...

    def close(self, now_ms: int) -> None:
        """Leave (as :meth:`leave`) and refuse any later subscribe."""
        self._closed = True
        self.leave(now_ms)

    def _advance(self, now_ms: int) -> None:
        # Callers may pass a stale time (e.g. a late callback); the clock never goes back.
        self._now_ms = max(self._now_ms, now_ms)

    def _raise_if_failed(self) -> None:
        if self._fatal_error is not None:  # set once, when the member turns FATAL
            raise MemberFatalError(self._fatal_error)

    def _check_may_subscribe(self, leaving: bool) -> None:
        self._raise_if_failed()
        if self._closed:
            raise RuntimeError("the member is closed")
        if leaving:
            raise RuntimeError("the member is leaving the group; subscribe once it has left")

    def _revoke(self, partitions: PartitionSet) -> None:
        """Hand ``partitions`` to the caller for revocation: they stop being processed now."""
        self._owned = self._owned - partitions
        self._events.append(self._revocations.open(partitions))

    def _lose_partitions(self, error_code: int) -> None:
        """Give up everything owned or being revoked, without a commit (PartitionsLost)."""
        lost = self._owned | self.revoking_partitions
        self._owned = NO_PARTITIONS
        self._revocations.clear()
        if lost:
            self._events.append(PartitionsLost(lost, error_code))
