"""The KIP-848 member: a sans-IO state machine for one consumer-group member.

No sockets, threads, sleeps, randomness or wall clock: the caller (an asyncio driver, or the
deterministic simulator) owns time and the network. The loop is::

    requests = member.poll(now_ms)          # heartbeats, Prepare/Install, when due
    ... send them; for each outcome:
    member.on_response(request, response, now_ms)   # or
    member.on_request_failed(request, now_ms)       # timeout / disconnect
    for event in member.take_events(): ...          # what the caller must act on
    wake up again at member.next_deadline()

Design choice — **events, not callbacks.** Everything the application must do is returned as
an event from :meth:`GroupMember.take_events`, in order:

* :class:`RevokePartitions` — stop processing these partitions *now* (they already left
  :attr:`GroupMember.owned_partitions`), commit their offsets, call the rebalance listener's
  ``on_partitions_revoked``, then call :meth:`GroupMember.revocation_done` with the event's
  ``revocation_id``. Only then is the revocation acknowledged, in a heartbeat sent right away
  that carries the remaining owned partitions (KIP: revoke, commit, onPartitionsRevoked, ack in
  the next heartbeat). The commit is IO, which is why the caller completes it.
* :class:`PartitionsAssigned` — start processing these; may come several times in one epoch,
  as the previous owners release partitions.
* :class:`PartitionsLost` — fenced, unknown, or possibly removed by the coordinator (a revocation
  not acknowledged within the rebalance timeout; optionally, no answer within the session
  timeout): the partitions are gone (no commit is possible); the member is already rejoining
  with epoch 0 and the same member id.
* :class:`MemberFailed` (fatal, e.g. UNRELEASED_INSTANCE_ID), :class:`LeftGroup`,
  :class:`CoordinatorUnavailable` (re-discover the coordinator), :class:`AssignmentInstalled`,
  :class:`AssignmentAbandoned` (client-side assignment outcome).

``pystreams.client.listener.notify_listener`` maps the three partition events onto a
``RebalanceListener`` for callers that prefer the Kafka listener shape. The one synchronous
call-out is the client-side assignor (``metadata()``, ``assign()``, ``on_assignment()``): it is a
pure, in-memory object owned by the member, as in the KIP's PartitionAssignor.

Heartbeat fields: every field on a join (epoch 0) and after an error response or a failed
request; otherwise only what changed since the last heartbeat. Owned partitions
(``TopicPartitions``) are also sent after any response that carried an ``Assignment`` and in a
revocation's acknowledgement, since reporting them is how the coordinator learns the member
converged. A topic-name subscription sends ``SubscribedTopicRegex`` = "" when it replaces a
regex; a regex subscription sends ``SubscribedTopicNames`` = []. Assignor metadata is sent
whenever ``metadata()`` returns something different from what was last sent.

Owned, revoking and pending partitions are ``PartitionSet`` values (sets of ``TopicIdPartition``, topic ids only).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import kafka.errors as Errors

from pystreams.assignors.api import (
    AssignmentSpec,
    AssignorMetadata,
    ClientAssignor,
    GroupAssignment,
    MemberAssignment,
    MemberSpec,
    PartitionAssignorError,
    TopicMetadata,
)
from pystreams.client.common import ErrorCode, MemberBase, Subscription, parse_subscription
from pystreams.client.events import (
    IN_GROUP as _IN_GROUP,
)
from pystreams.client.events import (
    AssignmentAbandoned,
    AssignmentInstalled,
    CoordinatorUnavailable,
    InstanceIdUnreleased,
    LeftGroup,
    MemberEvent,  # noqa: F401  (re-exported: callers import the events from here too)
    MemberFailed,
    MemberFatalError,  # noqa: F401  (re-exported)
    MemberState,
    PartitionsAssigned,
    PartitionsLost,  # noqa: F401  (re-exported)
    RevokePartitions,  # noqa: F401  (re-exported)
    error_name,
)
from pystreams.partitions import NO_PARTITIONS, PartitionSet
from pystreams.protocol.messages import (
    ConsumerGroupHeartbeatRequest,
    ConsumerGroupHeartbeatResponse,
    ConsumerGroupInstallAssignmentRequest,
    ConsumerGroupInstallAssignmentResponse,
    ConsumerGroupPrepareAssignmentRequest,
    ConsumerGroupPrepareAssignmentResponse,
)
from pystreams.protocol.sentinels import COORDINATOR_MOVED, JOIN_EPOCH, LEAVE_EPOCH, LEAVE_STATIC_EPOCH, RETRIABLE

Request = ConsumerGroupHeartbeatRequest | ConsumerGroupPrepareAssignmentRequest | ConsumerGroupInstallAssignmentRequest
Response = ConsumerGroupHeartbeatResponse | ConsumerGroupPrepareAssignmentResponse | ConsumerGroupInstallAssignmentResponse


#: The Install ``Error`` the member sends when its assignor raises PartitionAssignorError
#: (any non-zero value makes the coordinator keep the current target assignment).
ASSIGNOR_FAILED = 1


#: The longest wait between two joins of a static member whose instance id is not released yet.
_UNRELEASED_RETRY_MAX_MS = 2_000
#: The coordinator moved or is down: the caller must look it up again; the member retries.
_COORDINATOR_ERRORS = COORDINATOR_MOVED
#: Transient heartbeat errors: retry after a back-off, with all fields (the KIP's "when an
#: error occurs"). Everything else that is not fencing is fatal, as in Kafka's consumer.
#: STALE_MEMBER_EPOCH is not listed for the heartbeat by the KIP; if it comes, the epoch we
#: sent is behind and the next (full) heartbeat sorts it out.
_RETRIABLE_HEARTBEAT_ERRORS = RETRIABLE | frozenset({ErrorCode.STALE_MEMBER_EPOCH})


@dataclass(frozen=True)
class MemberConfig:
    group_id: str
    client_id: str = ""  # goes into the request header; the driver's business
    instance_id: str | None = None  # static membership (KIP-345)
    rack_id: str | None = None
    #: Sent to the coordinator; also bounds, locally, how long a revocation may stay
    #: unacknowledged before the member assumes it was removed (see _revocation_deadline).
    rebalance_timeout_ms: int = 300_000  # Kafka's max.poll.interval.ms default
    server_assignor: str | None = None
    #: Client-side assignors in order of precedence; exclusive with ``server_assignor``.
    client_assignors: Sequence[ClientAssignor] = ()
    retry_backoff_ms: int = 100
    #: Optional client-side guard: if no heartbeat sent in the last ``session_timeout_ms`` got
    #: a successful answer, the coordinator may already have expired this member and handed its
    #: partitions on, so the member gives them up (lost) and rejoins. Set it to the group's
    #: ``group.consumer.session.timeout.ms`` to keep "no partition owned twice" under network
    #: partitions; None (the default, Kafka's behaviour) relies on fencing alone.
    session_timeout_ms: int | None = None

    def __post_init__(self) -> None:
        if not self.group_id:
            raise ValueError("group_id must be non-empty")
        if self.instance_id == "":
            raise ValueError("instance_id, when given, must be non-empty")
        if self.rebalance_timeout_ms <= 0:
            raise ValueError("rebalance_timeout_ms must be positive")
        if self.server_assignor is not None and self.client_assignors:
            raise ValueError("server_assignor and client_assignors cannot be used together")
        if self.retry_backoff_ms < 0:
            raise ValueError("retry_backoff_ms must be >= 0")
        names = [assignor.name for assignor in self.client_assignors]
        if len(set(names)) != len(names):
            raise ValueError(f"client assignor names must be unique: {names}")


# ----------------------------------------------------------------------------- internals


@dataclass(frozen=True)
class _SentFields:
    """What the coordinator has been told, for "only changed fields"."""

    topics: tuple[str, ...]
    regex: str
    assignors: tuple[tuple, ...] | None
    owned: PartitionSet


@dataclass(frozen=True)
class _Target:
    """The latest Assignment the coordinator sent."""

    member_epoch: int
    assigned: PartitionSet
    pending: PartitionSet


@dataclass
class _InFlightHeartbeat:
    request: ConsumerGroupHeartbeatRequest
    sent_at_ms: int
    carries_ack: bool
    is_leave: bool


class _AssignPhase(enum.Enum):
    IDLE = "idle"
    PREPARE_DUE = "prepare_due"
    PREPARE_IN_FLIGHT = "prepare_in_flight"
    PREPARE_AWAITS_EPOCH = "prepare_awaits_epoch"  # STALE_MEMBER_EPOCH: next heartbeat first
    INSTALL_DUE = "install_due"
    INSTALL_IN_FLIGHT = "install_in_flight"
    INSTALL_AWAITS_EPOCH = "install_awaits_epoch"


@dataclass
class _Computation:
    """One ShouldComputeAssignment → Prepare → assign → Install round."""

    phase: _AssignPhase = _AssignPhase.IDLE
    due_ms: int | None = None  # None: as soon as polled
    in_flight: Request | None = None
    group_epoch: int = 0
    result: GroupAssignment | None = None


def _assignor_entry(assignor: ClientAssignor) -> tuple:
    """The heartbeat's Assignor entry, from what ``metadata()`` says right now."""
    metadata: AssignorMetadata = assignor.metadata()
    version_range = (metadata.minimum_version, metadata.maximum_version)
    if version_range == (0, 0):
        # AssignorMetadata's defaults: the assignor left the range to its attributes.
        version_range = (assignor.minimum_version, assignor.maximum_version)
    return (
        assignor.name,
        *version_range,
        metadata.reason,
        metadata.version,
        bytes(metadata.data),
    )


# ----------------------------------------------------------------------------- the member


@dataclass
class _Session:
    """Everything one session with the coordinator builds up, from a join to a fence, a leave
    or a failure. Each of those replaces it whole (``_Session()``): nothing of a fenced epoch
    can leak into the next one. The member itself keeps only what outlives sessions."""

    member_epoch: int = JOIN_EPOCH
    target: _Target | None = None
    on_assignment_epoch: int | None = None
    # Heartbeat scheduling: one heartbeat in flight at most.
    sent: _SentFields | None = None  # None: the next heartbeat carries all fields
    heartbeat: _InFlightHeartbeat | None = None  # a late answer to it belongs to this session only
    heartbeat_due_ms: int | None = None
    heartbeat_asap: bool = False
    ack_pending: bool = False  # a revocation is done and not yet reported
    report_owned: bool = False  # an Assignment arrived: report owned partitions next time
    #: Send time of the latest heartbeat answered without error, since the last (re)join;
    #: None while the coordinator has not accepted this member (or has dropped it).
    last_answered_send_ms: int | None = None
    #: Send time of the first heartbeat sent since the last one answered while STABLE (joins
    #: aside). Any of those may have been answered with a revocation the member never heard
    #: (a lost response), so the coordinator's revocation timer started no earlier than this.
    first_unsettled_send_ms: int | None = None
    computation: _Computation = field(default_factory=_Computation)


class ConsumerGroupMember(MemberBase):
    """One KIP-848 group member (``group.protocol=consumer``). See the module docstring for the
    driving loop and events."""

    def __init__(self, config: MemberConfig) -> None:
        super().__init__()
        self.config = config
        self._state = MemberState.UNSUBSCRIBED
        self._member_id = ""  # kept across fences (KIP: same member id) and leaves
        self._heartbeat_interval_ms = 5_000  # until the coordinator says otherwise
        self._subscription: Subscription | None = None
        self._regex_ever_sent = False
        self._unreleased_attempts = 0
        self._leave_epoch = LEAVE_EPOCH
        self._session = _Session()

    # ------------------------------------------------------------------ observation

    @property
    def state(self) -> MemberState:
        return self._state

    @property
    def member_id(self) -> str:
        return self._member_id

    @property
    def member_epoch(self) -> int:
        return self._session.member_epoch

    @property
    def pending_partitions(self) -> PartitionSet:
        """In the current target but not processed yet: not released by their previous owners
        yet, or held back until this member's own revocations are done."""
        if self._session.target is None:
            return NO_PARTITIONS
        return (self._session.target.assigned | self._session.target.pending) - self._owned

    @property
    def heartbeat_interval_ms(self) -> int:
        return self._heartbeat_interval_ms

    @property
    def computing_assignment(self) -> bool:
        return self._session.computation.phase is not _AssignPhase.IDLE

    # ------------------------------------------------------------------ application API

    def subscribe(self, topics: Iterable[str] | None = None, regex: str | None = None) -> None:
        """Subscribe to topic names or to one RE2 regex; (re)join if not in the group."""
        self._check_may_subscribe(leaving=self._state in (MemberState.PREPARE_LEAVING, MemberState.LEAVING))
        subscription = parse_subscription(topics, regex)
        changed = subscription != self._subscription
        self._subscription = subscription
        if self._state is MemberState.UNSUBSCRIBED:
            self._state = MemberState.JOINING
            self._session.heartbeat_asap = True
        elif changed:
            # Subscription changes go out right away rather than at the next interval.
            self._session.heartbeat_asap = True

    def request_heartbeat(self) -> None:
        """Heartbeat as soon as possible, e.g. because an assignor's metadata() changed."""
        if self._wants_heartbeats():
            self._session.heartbeat_asap = True

    def revocation_done(self, now_ms: int, revocation_id: int | None = None) -> None:
        """The caller committed and called on_partitions_revoked for a RevokePartitions.

        ``revocation_id`` identifies the event; a stale id (from before a fence) is ignored.
        Without it, every outstanding revocation is considered done.
        """
        self._advance(now_ms)
        if not self._revocations.close(revocation_id):
            return
        if self._state is MemberState.PREPARE_LEAVING:
            self._maybe_leave()
            return
        if self._state is MemberState.RECONCILING:
            self._state = MemberState.ACKNOWLEDGING
            self._session.ack_pending = True
            self._session.heartbeat_asap = True  # KIP: acknowledge in the very next heartbeat
            self._reconcile()

    def leave(self, now_ms: int, *, permanent: bool = False, lose: bool = False) -> None:
        """Leave the group: revoke everything (RevokePartitions), then heartbeat -1.

        A static member (instance id set) leaves temporarily with -2 unless ``permanent``.
        With ``lose`` (the application can no longer commit: its processing failed) the
        partitions are lost, not revoked — PartitionsLost with error 0, revocations under way
        included — and the leave heartbeat goes out at once, so they move without waiting.
        """
        self._advance(now_ms)
        if self._state in (
            MemberState.UNSUBSCRIBED,
            MemberState.FATAL,
            MemberState.PREPARE_LEAVING,
            MemberState.LEAVING,
        ):
            return
        static = self.config.instance_id is not None
        self._leave_epoch = LEAVE_STATIC_EPOCH if static and not permanent else LEAVE_EPOCH
        self._abandon_computation(None)
        self._session.ack_pending = False
        self._session.heartbeat_asap = False  # nothing to acknowledge any more: the leave says it all
        self._state = MemberState.PREPARE_LEAVING
        if lose:
            self._lose_partitions(0)
        elif self._owned:
            self._start_revocation(self._owned)
        self._maybe_leave()

    # ------------------------------------------------------------------ driver API

    def poll(self, now_ms: int) -> list[Request]:
        """The requests to send now. Each must be answered by on_response or on_request_failed."""
        self._advance(now_ms)
        self._check_timeouts(now_ms)
        requests: list[Request] = []
        if self._session.heartbeat is None and self._heartbeat_due(now_ms):
            requests.append(self._send_heartbeat(now_ms))
        computation_request = self._computation_request(now_ms)
        if computation_request is not None:
            requests.append(computation_request)
        return requests

    def request_timeout_ms(self, request: Request, default_ms: int) -> int:
        """How long the driver may wait for ``request``: every KIP-848 request is short."""
        return default_ms

    def next_deadline(self) -> int | None:
        """When to call poll() next (a time in the past or now means: at once), or None."""
        deadlines: list[int] = []
        if self._session.heartbeat is None and self._wants_heartbeats():
            if self._session.heartbeat_asap:
                deadlines.append(self._now_ms)
            elif self._session.heartbeat_due_ms is not None:
                deadlines.append(self._session.heartbeat_due_ms)
        if self._session.computation.phase in (_AssignPhase.PREPARE_DUE, _AssignPhase.INSTALL_DUE):
            due = self._session.computation.due_ms
            deadlines.append(self._now_ms if due is None else due)
        for deadline in (self._session_deadline(), self._revocation_deadline()):
            if deadline is not None:
                deadlines.append(deadline)
        return min(deadlines) if deadlines else None

    def on_response(self, request: Request, response: Response, now_ms: int) -> None:
        """Feed the coordinator's answer to a request that poll() returned."""
        self._advance(now_ms)
        if self._session.heartbeat is not None and request is self._session.heartbeat.request:
            in_flight, self._session.heartbeat = self._session.heartbeat, None
            self._on_heartbeat_response(in_flight, response, now_ms)
        elif self._session.computation.in_flight is not None and request is self._session.computation.in_flight:
            self._session.computation.in_flight = None
            if isinstance(request, ConsumerGroupPrepareAssignmentRequest):
                self._on_prepare_response(response)
            else:
                self._on_install_response(response)
        # Anything else answers a request this member no longer waits for (fenced, left,
        # duplicated by the network): ignoring it is what keeps the epochs straight.

    def on_request_failed(self, request: Request, now_ms: int) -> None:
        """The request timed out or the connection dropped: the outcome is unknown."""
        self._advance(now_ms)
        if self._session.heartbeat is not None and request is self._session.heartbeat.request:
            in_flight, self._session.heartbeat = self._session.heartbeat, None
            if in_flight.is_leave:
                self._finish_leave(self._leave_epoch)  # best effort, as Kafka's consumer: no retry
                return
            self._after_heartbeat_error(in_flight, now_ms)
            if self._state is MemberState.PREPARE_LEAVING:
                self._maybe_leave()
        elif self._session.computation.in_flight is not None and request is self._session.computation.in_flight:
            self._session.computation.in_flight = None
            if isinstance(request, ConsumerGroupPrepareAssignmentRequest):
                # Prepare only reads: try again after the back-off.
                self._session.computation.phase = _AssignPhase.PREPARE_DUE
                self._session.computation.due_ms = now_ms + self.config.retry_backoff_ms
            else:
                # An Install may have been applied; re-sending an old assignment could install
                # it over a newer one, so the round is abandoned and the coordinator re-elects.
                self._abandon_computation(AssignmentAbandoned("install", Errors.RequestTimedOutError.errno, "install request failed; outcome unknown"))

    # ------------------------------------------------------------------ heartbeats

    def _wants_heartbeats(self) -> bool:
        if self._state is MemberState.LEAVING:
            return self._session.heartbeat is None or not self._session.heartbeat.is_leave
        return self._state in _IN_GROUP or self._state in (
            MemberState.JOINING,
            MemberState.FENCED,
            MemberState.PREPARE_LEAVING,
        )

    def _heartbeat_due(self, now_ms: int) -> bool:
        if not self._wants_heartbeats():
            return False
        if self._session.heartbeat_asap:
            return True
        return self._session.heartbeat_due_ms is not None and now_ms >= self._session.heartbeat_due_ms

    def _send_heartbeat(self, now_ms: int) -> ConsumerGroupHeartbeatRequest:
        self._session.heartbeat_asap = False
        self._session.heartbeat_due_ms = None
        if self._state is MemberState.LEAVING:
            request = ConsumerGroupHeartbeatRequest(
                group_id=self.config.group_id,
                member_id=self._member_id,
                member_epoch=self._leave_epoch,
                instance_id=self.config.instance_id,
            )
            self._session.heartbeat = _InFlightHeartbeat(request, now_ms, carries_ack=False, is_leave=True)
            return request

        if self._state is MemberState.FENCED:
            self._state = MemberState.JOINING
        joining = self._state is MemberState.JOINING
        if joining:
            self._session.sent = None  # a join always carries every field
        full = self._session.sent is None
        assert self._subscription is not None
        subscription = self._subscription
        assignors = tuple(_assignor_entry(a) for a in self.config.client_assignors) if self.config.client_assignors else None
        reported = self._owned | self.revoking_partitions
        sent = self._session.sent

        topics: list[str] | None = None
        if sent is None or subscription.topics != sent.topics:
            topics = list(subscription.topics)
        regex: str | None = None
        if sent is None:
            # "" clears a regex the coordinator may still hold from before an error.
            if subscription.regex or self._regex_ever_sent:
                regex = subscription.regex
        elif subscription.regex != sent.regex:
            regex = subscription.regex
        if regex:
            self._regex_ever_sent = True
        client_assignors = None
        if assignors is not None and (sent is None or assignors != sent.assignors):
            client_assignors = [
                ConsumerGroupHeartbeatRequest.Assignor(
                    name=name,
                    minimum_version=min_version,
                    maximum_version=max_version,
                    reason=reason,
                    metadata_version=version,
                    metadata_bytes=data,
                )
                for name, min_version, max_version, reason, version, data in assignors
            ]
        topic_partitions = None
        if sent is None or self._session.ack_pending or self._session.report_owned or reported != sent.owned:
            topic_partitions = reported.to_wire(ConsumerGroupHeartbeatRequest.TopicPartitions)

        request = ConsumerGroupHeartbeatRequest(
            group_id=self.config.group_id,
            member_id=self._member_id,
            member_epoch=JOIN_EPOCH if joining else self._session.member_epoch,
            instance_id=self.config.instance_id if full else None,
            rack_id=self.config.rack_id if full else None,
            rebalance_timeout_ms=self.config.rebalance_timeout_ms if full else -1,
            subscribed_topic_names=topics,
            subscribed_topic_regex=regex,
            server_assignor=self.config.server_assignor if full else None,
            client_assignors=client_assignors,
            topic_partitions=topic_partitions,
        )
        self._session.sent = _SentFields(
            topics=subscription.topics,
            regex=subscription.regex,
            assignors=assignors,
            owned=reported,
        )
        self._session.heartbeat = _InFlightHeartbeat(request, now_ms, carries_ack=self._session.ack_pending, is_leave=False)
        if self._session.first_unsettled_send_ms is None and not joining:
            self._session.first_unsettled_send_ms = now_ms
        self._session.ack_pending = False
        self._session.report_owned = False
        return request

    def _on_heartbeat_response(self, in_flight: _InFlightHeartbeat, response: ConsumerGroupHeartbeatResponse, now_ms: int) -> None:
        if in_flight.is_leave:
            self._finish_leave(self._leave_epoch)  # whatever the answer, the member is gone
            return
        match response.error_code:
            case ErrorCode.NONE:
                self._on_heartbeat_success(in_flight, response, now_ms)
            case ErrorCode.FENCED_MEMBER_EPOCH | ErrorCode.UNKNOWN_MEMBER_ID as code:
                self._lose_everything(code)
            case ErrorCode.GROUP_ID_NOT_FOUND if in_flight.request.member_epoch > 0:
                # Its group is gone or runs the classic protocol now: the coordinator removed
                # this member (session expired while it was cut off) and converted the group back
                # for the classic members left (KIP-848's downgrade). Kafka's consumer dies here;
                # rejoining at epoch 0 upgrades the group again, or fails then, as a join would.
                self._lose_everything(ErrorCode.GROUP_ID_NOT_FOUND)
            case ErrorCode.UNRELEASED_INSTANCE_ID if self.config.instance_id is not None and in_flight.request.member_epoch == JOIN_EPOCH:
                # A crash-restart is what static membership is for: the old incarnation's session
                # will expire (or a -2 leave arrive); until then, keep asking, backing off.
                self._unreleased_attempts += 1
                delay = min(self.config.retry_backoff_ms * 2 ** min(self._unreleased_attempts, 16), _UNRELEASED_RETRY_MAX_MS)
                self._events.append(InstanceIdUnreleased(self.config.instance_id, self._unreleased_attempts, delay))
                self._after_heartbeat_error(in_flight, now_ms)
                self._session.heartbeat_due_ms = now_ms + delay
            case code if code in _RETRIABLE_HEARTBEAT_ERRORS:
                if code in _COORDINATOR_ERRORS:
                    self._events.append(CoordinatorUnavailable(code))
                self._after_heartbeat_error(in_flight, now_ms)
                if self._state is MemberState.PREPARE_LEAVING:
                    self._maybe_leave()
            case code:
                self._fail(code, response.error_message)

    def _after_heartbeat_error(self, in_flight: _InFlightHeartbeat, now_ms: int) -> None:
        self._session.sent = None  # KIP: after an error or a timeout, send every field again
        self._session.ack_pending = self._session.ack_pending or in_flight.carries_ack
        self._session.heartbeat_due_ms = now_ms + self.config.retry_backoff_ms

    def _on_heartbeat_success(self, in_flight: _InFlightHeartbeat, response: ConsumerGroupHeartbeatResponse, now_ms: int) -> None:
        if response.member_id:
            self._member_id = response.member_id
        self._session.member_epoch = response.member_epoch
        self._unreleased_attempts = 0
        if response.heartbeat_interval_ms > 0:
            self._heartbeat_interval_ms = response.heartbeat_interval_ms
        # The interval counts from the send, as Kafka's consumer does.
        self._session.heartbeat_due_ms = in_flight.sent_at_ms + self._heartbeat_interval_ms
        self._session.last_answered_send_ms = in_flight.sent_at_ms

        if self._state in (MemberState.PREPARE_LEAVING, MemberState.LEAVING):
            # A leaving member takes nothing new; its leave releases whatever it was given.
            self._maybe_leave()
            return
        if self._state is MemberState.JOINING:
            self._state = MemberState.STABLE
        if in_flight.carries_ack and self._state is MemberState.ACKNOWLEDGING:
            self._state = MemberState.STABLE

        assignment = response.assignment
        if assignment is not None:
            assigned = PartitionSet.from_wire(assignment.assigned_topic_partitions)
            pending = PartitionSet.from_wire(assignment.pending_topic_partitions) - assigned
            self._session.target = _Target(response.member_epoch, assigned, pending)
            # Reporting owned partitions is how the member acknowledges an assignment.
            self._session.report_owned = True
            if response.member_epoch != self._session.on_assignment_epoch:
                self._session.on_assignment_epoch = response.member_epoch
                self._call_on_assignment(assignment, assigned | pending, response.member_epoch)
            self._reconcile()

        if self._state is MemberState.STABLE:
            self._session.first_unsettled_send_ms = None
        self._resume_computation_after_heartbeat()
        if response.should_compute_assignment:
            self._start_computation()

    def _call_on_assignment(
        self,
        assignment: ConsumerGroupHeartbeatResponse.Assignment,  # type: ignore[name-defined]  # kafka-python builds it from JSON at import
        target: PartitionSet,
        member_epoch: int,
    ) -> None:
        if not self.config.client_assignors:
            return
        # The heartbeat does not say which assignor the group selected; the member's preferred
        # one is the group's choice whenever the group runs one assignor version.
        self.config.client_assignors[0].on_assignment(
            assignment.error,
            MemberAssignment(
                partitions=target.by_topic,
                metadata_version=assignment.metadata_version,
                metadata=bytes(assignment.metadata_bytes or b""),
            ),
            member_epoch,
        )

    # ------------------------------------------------------------------ reconciliation

    def _reconcile(self) -> None:
        """Move owned partitions towards the latest target: revoke first, assign when clear."""
        if self._session.target is None or self._state not in _IN_GROUP:
            return
        revoked = self._owned - self._session.target.assigned
        if revoked:
            self._start_revocation(revoked)
        if self._revocations:
            # New partitions wait until every revocation is done (the KIP never mixes both),
            # so a partition being revoked cannot come back before its commit finished.
            return
        newly_assigned = self._session.target.assigned - self._owned
        if newly_assigned:
            self._owned = self._owned | newly_assigned
            self._events.append(PartitionsAssigned(newly_assigned, self._session.member_epoch))
            # Acknowledge in the very next heartbeat, as Kafka's consumer does once it has
            # reconciled: the coordinator learns the member reached its target.
            self._session.heartbeat_asap = True

    def _start_revocation(self, partitions: PartitionSet) -> None:
        self._revoke(partitions)
        if self._state in _IN_GROUP:
            self._state = MemberState.RECONCILING

    def _lose_everything(self, error_code: int) -> None:
        """Fenced / unknown / expired: give up every partition and rejoin with epoch 0, under
        the same member id (KIP), in a new session."""
        self._lose_partitions(error_code)
        if self._state in (MemberState.PREPARE_LEAVING, MemberState.LEAVING):
            self._finish_leave()  # the coordinator already dropped us: nothing left to leave
            return
        self._session = _Session(heartbeat_asap=True)  # KIP: rejoin immediately
        self._state = MemberState.FENCED

    # ------------------------------------------------------------------ session guard

    def _session_deadline(self) -> int | None:
        timeout = self.config.session_timeout_ms
        if timeout is None or self._session.last_answered_send_ms is None:
            return None
        if self._state not in _IN_GROUP and self._state is not MemberState.PREPARE_LEAVING:
            return None
        # The coordinator restarted the session no earlier than when that heartbeat was sent,
        # so it cannot expire us before this.
        return self._session.last_answered_send_ms + timeout

    def _revocation_deadline(self) -> int | None:
        """The coordinator removes a member that does not acknowledge a revocation within its
        rebalance timeout, and hands its partitions on. Its timer started no earlier than the
        first heartbeat sent since the member was last answered as settled, even if the member
        never heard of the revocation (its response was lost) or is leaving; past that plus the
        rebalance timeout, without a settled answer, the member may be out and must let go.
        """
        if self._session.first_unsettled_send_ms is None or self._state not in (
            MemberState.STABLE,
            MemberState.RECONCILING,
            MemberState.ACKNOWLEDGING,
            MemberState.PREPARE_LEAVING,
        ):
            return None
        return self._session.first_unsettled_send_ms + self.config.rebalance_timeout_ms

    def _check_timeouts(self, now_ms: int) -> None:
        for deadline in (self._session_deadline(), self._revocation_deadline()):
            if deadline is not None and now_ms >= deadline:
                self._lose_everything(Errors.RequestTimedOutError.errno)
                return

    # ------------------------------------------------------------------ leaving

    def _maybe_leave(self) -> None:
        """From PREPARE_LEAVING, once revocations are done: send the leave heartbeat or stop."""
        if self._state is not MemberState.PREPARE_LEAVING or self._revocations:
            return
        if self._member_id and self._session.last_answered_send_ms is not None:
            # Accepted by the coordinator (possibly still at epoch 0, waiting for its first
            # assignment): it must be told.
            self._state = MemberState.LEAVING
            self._session.heartbeat_asap = True
        elif self._session.heartbeat is None:
            self._finish_leave()  # never joined (or fenced): nothing to tell the coordinator
        # else: a join is in flight; its answer tells us the member id to leave with.

    def _finish_leave(self, sent_epoch: int | None = None) -> None:
        # Nothing is owned or revoked by now: leave() revoked or lost it all, and a leaving
        # member takes nothing new.
        self._session = _Session()
        self._state = MemberState.UNSUBSCRIBED
        self._subscription = None
        self._events.append(LeftGroup(sent_epoch))

    # ------------------------------------------------------------------ failure

    def _fail(self, error_code: int, server_message: str | None) -> None:
        if error_code == ErrorCode.UNRELEASED_INSTANCE_ID:
            message = (
                f"group {self.config.group_id!r}: instance id {self.config.instance_id!r} is "
                "still used by another member (UNRELEASED_INSTANCE_ID); that member must leave, "
                "or its session expire, before this one can join"
            )
        else:
            message = f"group {self.config.group_id!r}: heartbeat failed with {error_name(error_code)} ({error_code}), which is not retriable"
        if server_message:
            message += f": {server_message}"
        self._lose_partitions(error_code)
        # Kept: member_epoch stays readable as the epoch the member failed at.
        self._session = _Session(member_epoch=self._session.member_epoch)
        self._state = MemberState.FATAL
        self._fatal_error = message
        self._events.append(MemberFailed(error_code, message))

    # ------------------------------------------------------------------ client-side assignment

    def _start_computation(self) -> None:
        if self._session.computation.phase is not _AssignPhase.IDLE or self._state not in _IN_GROUP:
            return
        if not self.config.client_assignors:
            self._events.append(AssignmentAbandoned("assign", 0, "asked to compute an assignment but this member has no client-side assignor"))
            return
        self._session.computation = _Computation(phase=_AssignPhase.PREPARE_DUE)

    def _resume_computation_after_heartbeat(self) -> None:
        # KIP: on STALE_MEMBER_EPOCH, retry once the next heartbeat response brings the epoch.
        computation = self._session.computation
        if computation.phase is _AssignPhase.PREPARE_AWAITS_EPOCH:
            computation.phase, computation.due_ms = _AssignPhase.PREPARE_DUE, None
        elif computation.phase is _AssignPhase.INSTALL_AWAITS_EPOCH:
            computation.phase, computation.due_ms = _AssignPhase.INSTALL_DUE, None

    def _abandon_computation(self, event: AssignmentAbandoned | None) -> None:
        self._session.computation = _Computation()
        if event is not None:
            self._events.append(event)

    def _computation_request(self, now_ms: int) -> Request | None:
        computation = self._session.computation
        if computation.in_flight is not None:
            return None
        if computation.due_ms is not None and now_ms < computation.due_ms:
            return None
        request: Request
        if computation.phase is _AssignPhase.PREPARE_DUE:
            request = ConsumerGroupPrepareAssignmentRequest(
                group_id=self.config.group_id,
                member_id=self._member_id,
                member_epoch=self._session.member_epoch,
            )
            computation.phase = _AssignPhase.PREPARE_IN_FLIGHT
        elif computation.phase is _AssignPhase.INSTALL_DUE:
            assert computation.result is not None
            request = ConsumerGroupInstallAssignmentRequest(
                group_id=self.config.group_id,
                member_id=self._member_id,
                member_epoch=self._session.member_epoch,  # the current one: retries carry the new epoch
                group_epoch=computation.group_epoch,
                error=computation.result.error,
                members=[
                    ConsumerGroupInstallAssignmentRequest.Member(
                        member_id=member_id,
                        partitions=PartitionSet.of(member.partitions).to_wire(
                            ConsumerGroupInstallAssignmentRequest.Member.TopicPartitions,
                        ),
                        metadata_version=member.metadata_version,
                        metadata_bytes=bytes(member.metadata),
                    )
                    for member_id, member in sorted(computation.result.members.items())
                ],
            )
            computation.phase = _AssignPhase.INSTALL_IN_FLIGHT
        else:
            return None
        computation.in_flight = request
        computation.due_ms = None
        return request

    def _on_prepare_response(self, response: ConsumerGroupPrepareAssignmentResponse) -> None:
        code = response.error_code
        if code == ErrorCode.STALE_MEMBER_EPOCH:
            self._session.computation.phase = _AssignPhase.PREPARE_AWAITS_EPOCH
            self._session.heartbeat_asap = True  # fetch the epoch now rather than at the next interval
            return
        if code != ErrorCode.NONE:
            # UNKNOWN_MEMBER_ID (not, or no longer, the chosen member) and anything else.
            self._abandon_computation(AssignmentAbandoned("prepare", code, response.error_message or error_name(code)))
            return
        assignor = next((a for a in self.config.client_assignors if a.name == response.assignor_name), None)
        if assignor is None:
            self._abandon_computation(
                AssignmentAbandoned("assign", 0, f"the group selected assignor {response.assignor_name!r}, which this member does not have")
            )
            return
        spec = assignment_spec_from_prepare(response)
        try:
            result = assignor.assign(spec)
        except PartitionAssignorError:
            # The coordinator keeps the current target when the assignment carries an error.
            result = GroupAssignment(members={}, error=ASSIGNOR_FAILED)
        self._session.computation.group_epoch = response.group_epoch
        self._session.computation.result = result
        self._session.computation.phase = _AssignPhase.INSTALL_DUE
        self._session.computation.due_ms = None

    def _on_install_response(self, response: ConsumerGroupInstallAssignmentResponse) -> None:
        code = response.error_code
        if code == ErrorCode.NONE:
            group_epoch = self._session.computation.group_epoch
            self._abandon_computation(None)
            self._events.append(AssignmentInstalled(group_epoch))
            # The installed target holds this member's new assignment: fetch it now rather
            # than at the next interval.
            self.request_heartbeat()
        elif code == ErrorCode.STALE_MEMBER_EPOCH:
            self._session.computation.phase = _AssignPhase.INSTALL_AWAITS_EPOCH
            self._session.heartbeat_asap = True
        else:
            self._abandon_computation(AssignmentAbandoned("install", code, response.error_message or error_name(code)))


def assignment_spec_from_prepare(
    response: ConsumerGroupPrepareAssignmentResponse,
) -> AssignmentSpec:
    """The assignor's input, built from a ConsumerGroupPrepareAssignment response."""
    members = {}
    for member in response.members:
        metadata = member.assignor
        members[member.member_id] = MemberSpec(
            subscribed_topic_ids=frozenset(member.subscribed_topic_ids or ()),
            target_partitions=PartitionSet.from_wire(member.topic_partitions).by_topic,
            instance_id=member.instance_id,
            rack_id=member.rack_id,
            metadata=AssignorMetadata(
                reason=metadata.reason,
                version=metadata.metadata_version,
                data=bytes(metadata.metadata_bytes or b""),
                minimum_version=metadata.minimum_version,
                maximum_version=metadata.maximum_version,
            ),
        )
    topics = {topic.topic_id: TopicMetadata(topic_id=topic.topic_id, name=topic.topic_name, num_partitions=topic.num_partitions) for topic in response.topics}
    return AssignmentSpec(members=members, topics=topics)
