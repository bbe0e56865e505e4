"""The classic group member: Kafka's consumer group protocol (JoinGroup / SyncGroup / Heartbeat /
LeaveGroup), sans-IO, with the KIP-848 member's surface and events.

:class:`ClassicGroupMember` is driven exactly as :class:`~pystreams.client.member.GroupMember`
is (``poll`` → requests, ``on_response`` / ``on_request_failed``, ``take_events``,
``next_deadline``, ``revocation_done``, ``leave``), so :class:`~pystreams.client.driver.MemberDriver`,
the worker and the simulator run either without knowing which. What it does follows Kafka's
``AbstractCoordinator`` / ``ConsumerCoordinator``:

* **Joining.** JoinGroup (protocol type ``consumer``; one protocol per assignor, its metadata a
  ``ConsumerProtocolSubscription`` v3: topics, userData, owned partitions, generation, rack).
  MEMBER_ID_REQUIRED (KIP-394) → rejoin at once with the member id it carries. The leader runs
  the selected protocol's assignor (:mod:`pystreams.client.classic_leader`) and sends every
  assignment in its SyncGroup; followers send an empty one. SyncGroup's assignment is applied
  and the member is STABLE. The JoinGroup is a long poll: its request timeout is the rebalance
  timeout plus 5 s (:meth:`ClassicGroupMember.request_timeout_ms`), as Kafka's consumer sets it.
* **Rebalancing.** A Heartbeat answered REBALANCE_IN_PROGRESS while STABLE asks for a rejoin.
  Before it, **eager** members revoke everything (:class:`RevokePartitions`, then
  ``revocation_done``); **cooperative** members (KIP-429) revoke only partitions of topics they
  no longer subscribe to, keep processing the rest, and after SyncGroup revoke what the new
  assignment took away and rejoin, so that the next rebalance can hand it on (also when a guard
  below has given it up since the JoinGroup reported owning it: the leader withheld it all the
  same). A static leader told to skip the assignment (KIP-814) watches the group's topics from
  then on, as one that assigned does.
* **Errors**, as Kafka's consumer: UNKNOWN_MEMBER_ID → partitions lost, generation and member id
  reset, rejoin; ILLEGAL_GENERATION → the same, keeping the member id; REBALANCE_IN_PROGRESS on
  JoinGroup/SyncGroup → rejoin at once; NOT_COORDINATOR / COORDINATOR_NOT_AVAILABLE →
  :class:`CoordinatorUnavailable` and retry after the back-off; COORDINATOR_LOAD_IN_PROGRESS →
  retry after the back-off; FENCED_INSTANCE_ID, GROUP_MAX_SIZE_REACHED,
  INCONSISTENT_GROUP_PROTOCOL, INVALID_SESSION_TIMEOUT, GROUP_AUTHORIZATION_FAILED and anything
  unexpected on JoinGroup/SyncGroup → :class:`MemberFailed` (fatal). Heartbeat errors other
  than those are retried, as Kafka's heartbeat thread does; a response that answers an older
  generation than the member's is ignored.
* **Static members** (KIP-345, ``instance_id``) never send LeaveGroup when they stop — their
  session keeps their assignment until they return — unless they leave for good
  (``leave(permanent=True)``, Kafka's ``CloseOptions.LEAVE_GROUP``). Their :class:`LeftGroup`
  carries -2 (KIP-848's temporary leave), a LeaveGroup -1.
* **Guards**, the KIP-848 member's where they apply: a revocation not done within the rebalance
  timeout of the rebalance that asked for it means the coordinator has moved on without this
  member (Kafka's ``max.poll.interval.ms``): its partitions are lost and it rejoins afresh.
  With ``lose_partitions_on_session_timeout``, no successful answer within the session timeout
  (or the rebalance timeout, when shorter: a rebalance it never heard of may have ended without
  it) does the same (off by default: Kafka only looks the coordinator up again); and a
  cooperative member keeping partitions through a rebalance gives them up when it has not
  rejoined and synced a rebalance timeout after its last answered JoinGroup (or its rejoin, or
  the rebalance it heard of).
  Both also hold while it revokes before leaving: it is still a member then, and is removed
  all the same.

The member never learns whether the coordinator runs the group as a classic group or as a
KIP-848 group holding classic members (online migration): there it is never the leader, its
generation is its member epoch, SyncGroup returns its assignment and Heartbeat says
REBALANCE_IN_PROGRESS whenever it should rejoin — all of which the rules above already handle.

**Client-side assignors** (KIP-848's ``ClientAssignor``) are protocols too: the subscription's
userData is the assignor's metadata (``classic_metadata()`` when the assignor has it, else
``metadata().data``), which every assignor sees at version -1; the assignment's userData is handed
to ``on_assignment`` with version -1. A non-zero ``metadata().reason`` with new metadata asks for
a rebalance, as a KIP-848 member's would: the member rejoins.

Partitions are ``PartitionSet`` values (topic ids); topic names go through the injected
:class:`~pystreams.client.topics.TopicResolver`.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeAlias

import kafka.errors as Errors

from pystreams.assignors.api import ClientAssignor, MemberAssignment, ServerAssignor
from pystreams.assignors.range import RangeAssignor
from pystreams.assignors.uniform import UniformAssignor
from pystreams.client.classic_leader import (
    CLASSIC_METADATA_VERSION,
    RebalanceProtocol,
    assign_group,
    decode_members,
    to_ids,
    to_names,
)
from pystreams.client.common import ErrorCode, MemberBase, parse_subscription
from pystreams.client.common import Subscription as _Subscription
from pystreams.client.events import (
    CoordinatorUnavailable,
    LeftGroup,
    MemberFailed,
    MemberState,
    PartitionsAssigned,
    error_name,
)
from pystreams.client.topics import TopicResolver
from pystreams.partitions import NO_PARTITIONS, PartitionSet
from pystreams.protocol.consumer_protocol import (
    NO_GENERATION,
    PROTOCOL_TYPE,
    SUBSCRIPTION_VERSION,
    ConsumerProtocolError,
    Subscription,
    decode_assignment,
    decode_subscription,
    encode_subscription,
)
from pystreams.protocol.messages import (
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)
from pystreams.protocol.sentinels import COORDINATOR_MOVED, LEAVE_EPOCH, LEAVE_STATIC_EPOCH

log = logging.getLogger(__name__)

__all__ = [
    "BUILTIN_ASSIGNORS",
    "ClassicGroupMember",
    "ClassicMemberConfig",
    "ClassicState",
    "RebalanceProtocol",
    "topic_names_in",
]

Request: TypeAlias = JoinGroupRequest | SyncGroupRequest | HeartbeatRequest | LeaveGroupRequest
Response: TypeAlias = JoinGroupResponse | SyncGroupResponse | HeartbeatResponse | LeaveGroupResponse

#: Kafka's JOIN_GROUP_TIMEOUT_LAPSE: a JoinGroup waits up to the rebalance timeout at the
#: coordinator, so its request timeout is that plus this margin.
JOIN_GROUP_TIMEOUT_LAPSE_MS = 5_000
#: JoinGroup's Reason field is cut to this length, as Kafka's ``maybeTruncateReason`` does.
_REASON_MAX_CHARS = 255


#: Built-in assignors by classic protocol name, run by the leader, with the rebalance protocols
#: each supports (Kafka's: ``range`` is eager only; ``cooperative-sticky`` both). ``uniform`` is
#: the KIP-848 server assignor of that name, sticky and balanced like cooperative-sticky.
BUILTIN_ASSIGNORS: dict[str, tuple[type, frozenset[RebalanceProtocol]]] = {
    "range": (RangeAssignor, frozenset({RebalanceProtocol.EAGER})),
    "cooperative-sticky": (UniformAssignor, frozenset({RebalanceProtocol.COOPERATIVE, RebalanceProtocol.EAGER})),
    "uniform": (UniformAssignor, frozenset({RebalanceProtocol.COOPERATIVE, RebalanceProtocol.EAGER})),
}
#: A client-side assignor that does not say otherwise supports both: the leader withholds moving
#: partitions itself (see classic_leader), so any assignor is safe under the cooperative protocol.
_CLIENT_ASSIGNOR_PROTOCOLS = frozenset({RebalanceProtocol.COOPERATIVE, RebalanceProtocol.EAGER})


@dataclass(frozen=True)
class ClassicMemberConfig:
    """A classic member's settings, with Kafka's consumer names and defaults."""

    group_id: str
    client_id: str = ""
    instance_id: str | None = None  # group.instance.id: static membership (KIP-345)
    rack_id: str | None = None  # client.rack, sent in the subscription (v3)
    session_timeout_ms: int = 45_000
    heartbeat_interval_ms: int = 3_000
    rebalance_timeout_ms: int = 300_000  # max.poll.interval.ms
    #: partition.assignment.strategy, in order of preference: built-in names
    #: (:data:`BUILTIN_ASSIGNORS`) and/or client-side assignors (``ClientAssignor`` objects).
    assignors: Sequence[str | ClientAssignor] = ("range", "cooperative-sticky")
    retry_backoff_ms: int = 100
    #: Give partitions up (lost) when no request was answered within the session timeout (or the
    #: rebalance timeout, when shorter), or a JoinGroup within the rebalance timeout: the
    #: coordinator may have removed the member, or had the leader assign around it,
    #: already. Off: Kafka only re-discovers the coordinator, and waits for the JoinGroup.
    lose_partitions_on_session_timeout: bool = False

    def __post_init__(self) -> None:
        if not self.group_id:
            raise ValueError("group_id must be non-empty")
        if self.instance_id == "":
            raise ValueError("instance_id, when given, must be non-empty")
        for name, value in (
            ("session_timeout_ms", self.session_timeout_ms),
            ("heartbeat_interval_ms", self.heartbeat_interval_ms),
            ("rebalance_timeout_ms", self.rebalance_timeout_ms),
        ):
            if value <= 0:
                raise ValueError(f"{name} must be positive")
        if self.heartbeat_interval_ms >= self.session_timeout_ms:
            raise ValueError("heartbeat_interval_ms must be lower than session_timeout_ms")
        if self.retry_backoff_ms < 0:
            raise ValueError("retry_backoff_ms must be >= 0")
        if not self.assignors:
            raise ValueError("at least one assignor is needed")
        names = [_protocol_name(a) for a in self.assignors]
        if len(set(names)) != len(names):
            raise ValueError(f"assignor names must be unique: {names}")
        unknown = [a for a in self.assignors if isinstance(a, str) and a not in BUILTIN_ASSIGNORS]
        if unknown:
            raise ValueError(f"unknown assignor(s) {unknown}; built-in: {', '.join(sorted(BUILTIN_ASSIGNORS))}")

    @property
    def rebalance_protocol(self) -> RebalanceProtocol:
        """COOPERATIVE when every assignor supports it, else EAGER (Kafka's rule)."""
        supported = set(RebalanceProtocol)
        for assignor in self.assignors:
            supported &= _supported_protocols(assignor)
        return RebalanceProtocol.COOPERATIVE if RebalanceProtocol.COOPERATIVE in supported else RebalanceProtocol.EAGER


def _protocol_name(assignor: str | ClientAssignor) -> str:
    return assignor if isinstance(assignor, str) else assignor.name


def _supported_protocols(assignor: str | ClientAssignor) -> frozenset[RebalanceProtocol]:
    if isinstance(assignor, str):
        return BUILTIN_ASSIGNORS[assignor][1]
    # Names ("cooperative", "eager") or RebalanceProtocol values: assignors do not import the client.
    return frozenset(RebalanceProtocol(p) for p in getattr(assignor, "supported_protocols", _CLIENT_ASSIGNOR_PROTOCOLS))


class ClassicState(enum.Enum):
    """Kafka's ``AbstractCoordinator.MemberState``, plus leaving and failed."""

    UNJOINED = "unjoined"  # no generation: never joined, reset after an error, or left
    PREPARING_REBALANCE = "preparing_rebalance"  # JoinGroup due or in flight
    COMPLETING_REBALANCE = "completing_rebalance"  # SyncGroup due or in flight
    STABLE = "stable"
    LEAVING = "leaving"  # revoking for the leave, or LeaveGroup in flight
    FATAL = "fatal"


@dataclass
class _InFlight:
    request: Request
    sent_at_ms: int
    generation: int
    member_id: str


@dataclass
class _Protocol:
    name: str
    assignor: ServerAssignor | ClientAssignor
    #: The same assignor when it is a client-side one (its metadata rides in the userData).
    client: ClientAssignor | None

    @property
    def client_side(self) -> bool:
        return self.client is not None


@dataclass
class _LeaderMemory:
    """What this member computed as leader, for stickiness and for its metadata watch."""

    generation: int
    targets: dict[str, PartitionSet] = field(default_factory=dict)
    topic_partition_counts: dict[str, int | None] = field(default_factory=dict)


@dataclass
class _Session:
    """What one membership builds up, from its JoinGroup to a reset, a leave or a failure; each
    replaces it whole (``_Session(...)``), keeping on purpose only what its call names."""

    #: Who the group says this member is (Kafka's ``Generation``), and who leads it.
    generation: int = NO_GENERATION
    member_id: str = ""
    protocol_name: str | None = None
    leader_id: str = ""
    rejoin_needed: bool = False
    rejoin_reason: str = ""
    needs_join_prepare: bool = True
    join_due_ms: int | None = None  # None: as soon as possible
    heartbeat_due_ms: int | None = None
    heartbeat_asap: bool = False
    leave_due: bool = False
    leave_epoch: int | None = None
    #: Send time of the latest request answered without error: the coordinator restarted the
    #: member's session no earlier than that.
    last_answered_send_ms: int | None = None
    #: The coordinator's rebalance timer for this member started no earlier than this: the
    #: send time of the last request answered before a heartbeat first said
    #: REBALANCE_IN_PROGRESS (a classic group's rebalance may begin right after that answer).
    rebalance_heard_ms: int | None = None
    #: Send time of the last JoinGroup answered until a SyncGroup succeeds: the coordinator
    #: answered it (and started waiting for this member's sync) no earlier than that.
    sync_awaited_since_ms: int | None = None
    leader: _LeaderMemory | None = None


class ClassicGroupMember(MemberBase):
    """One classic-protocol member (``group.protocol=classic``). See the module docstring."""

    def __init__(self, config: ClassicMemberConfig, topics: TopicResolver) -> None:
        super().__init__()
        self.config = config
        self.topics = topics
        self.rebalance_protocol = config.rebalance_protocol
        self._protocols = [_Protocol(a, BUILTIN_ASSIGNORS[a][0](), None) if isinstance(a, str) else _Protocol(a.name, a, a) for a in config.assignors]
        self._state = ClassicState.UNJOINED
        self._subscription: _Subscription | None = None
        self._session = _Session()
        # What the last JoinGroup reported, whatever happened since: the leader acts on it.
        self._joined_topics: tuple[str, ...] = ()
        self._joined_user_data: dict[str, bytes] = {}
        #: What the last JoinGroup reported owning: the leader withholds those partitions from
        #: any new owner until this member rejoins without them (KIP-429).
        self._joined_owned: PartitionSet = NO_PARTITIONS
        #: Assigned by the last SyncGroup but held back until this member's revocations are done;
        #: goes with the owned partitions (lost with them).
        self._pending_assigned: PartitionSet = NO_PARTITIONS
        self._lost_error = ErrorCode.UNKNOWN_MEMBER_ID  # what a reset's lost partitions are reported with
        # Requests on the wire. A reset does not drop them: each answer is checked against the
        # generation it was sent in (``_generation_unchanged``).
        self._sync_request: SyncGroupRequest | None = None  # built from the JoinGroup answer
        self._join: _InFlight | None = None
        self._sync: _InFlight | None = None
        self._heartbeat: _InFlight | None = None
        self._leave: _InFlight | None = None

    # ------------------------------------------------------------------ observation

    @property
    def state(self) -> MemberState:
        """The classic phase as a :class:`MemberState` (see :attr:`classic_state` for Kafka's)."""
        state = self._state
        if state is ClassicState.FATAL:
            return MemberState.FATAL
        if state is ClassicState.LEAVING:
            return MemberState.PREPARE_LEAVING if self._revocations else MemberState.LEAVING
        if self._subscription is None:
            return MemberState.UNSUBSCRIBED
        if self._revocations:
            return MemberState.RECONCILING
        if state is ClassicState.STABLE and not self._session.rejoin_needed:
            return MemberState.STABLE
        if state is ClassicState.UNJOINED or self._session.generation == NO_GENERATION:
            return MemberState.JOINING
        return MemberState.ACKNOWLEDGING  # in the group, completing a rebalance

    @property
    def classic_state(self) -> ClassicState:
        return self._state

    @property
    def member_id(self) -> str:
        return self._session.member_id

    @property
    def member_epoch(self) -> int:
        """The generation (-1 when none): what offset commits carry."""
        return self._session.generation

    @property
    def generation(self) -> int:
        return self._session.generation

    @property
    def protocol_name(self) -> str | None:
        return self._session.protocol_name

    @property
    def is_leader(self) -> bool:
        return bool(self._session.member_id) and self._session.leader_id == self._session.member_id

    @property
    def pending_partitions(self) -> PartitionSet:
        return self._pending_assigned - self._owned

    @property
    def heartbeat_interval_ms(self) -> int:
        return self.config.heartbeat_interval_ms

    @property
    def computing_assignment(self) -> bool:
        return False  # the leader computes synchronously, inside on_response

    # ------------------------------------------------------------------ application API

    def subscribe(self, topics: Iterable[str] | None = None, regex: str | None = None) -> None:
        """Subscribe to topic names or to one RE2 regex (matched here, against the resolver's
        topics, as Kafka's classic consumer matches patterns); (re)join."""
        self._check_may_subscribe(leaving=self._state is ClassicState.LEAVING)
        subscription = parse_subscription(topics, regex)
        if subscription.regex:
            _compile(subscription.regex)  # matched here, not by the coordinator: a bad pattern fails now
        changed = subscription != self._subscription
        self._subscription = subscription
        if changed or self._state is ClassicState.UNJOINED:
            self._request_rejoin("subscription changed" if self._session.generation != NO_GENERATION else "joining")

    def request_rejoin(self, reason: str = "requested by the application") -> None:
        """Rebalance the group (Kafka's ``enforceRebalance``)."""
        if self._subscription is not None and self._state not in (ClassicState.LEAVING, ClassicState.FATAL):
            self._request_rejoin(reason)

    def request_heartbeat(self) -> None:
        """Heartbeat now; and rejoin when a client-side assignor's metadata asks for a rebalance
        (a non-zero reason with metadata the group has not seen), as a KIP-848 member's would."""
        if self._state in (ClassicState.COMPLETING_REBALANCE, ClassicState.STABLE):
            self._session.heartbeat_asap = True
        self._check_assignor_reasons()

    def metadata_changed(self) -> None:
        """The resolver was refreshed: re-match a regex subscription, and as leader rebalance
        when a subscribed topic appeared, vanished or changed its partition count."""
        if self._subscription is None or self._state in (ClassicState.LEAVING, ClassicState.FATAL):
            return
        if self._subscription.regex and self._state is not ClassicState.UNJOINED:
            if self._current_topics() != self._joined_topics:
                self._request_rejoin("the topics matching the subscription changed")
                return
        leader = self._session.leader
        if leader is not None and self.is_leader and self._state is ClassicState.STABLE:
            counts = {name: (t.num_partitions if (t := self.topics.topic(name)) else None) for name in leader.topic_partition_counts}
            if counts != leader.topic_partition_counts:
                self._request_rejoin("the metadata of a subscribed topic changed")

    def revocation_done(self, now_ms: int, revocation_id: int | None = None) -> None:
        """The caller committed and stopped processing a :class:`RevokePartitions`."""
        self._advance(now_ms)
        if not self._revocations.close(revocation_id):
            return
        if self._state is ClassicState.LEAVING:
            self._after_leave_revocations()
            return
        self._assign_pending()

    def leave(self, now_ms: int, *, permanent: bool = False, lose: bool = False) -> None:
        """Revoke everything, then LeaveGroup — except a static member, which keeps its session
        (and its assignment) for its return unless it leaves for good (``permanent``). With
        ``lose`` (the application failed and cannot commit) the partitions are lost, not
        revoked (PartitionsLost, error 0), and the LeaveGroup goes out at once."""
        self._advance(now_ms)
        if self._state in (ClassicState.LEAVING, ClassicState.FATAL) or self._subscription is None:
            return
        static = self.config.instance_id is not None
        in_group = bool(self._session.member_id) and self._state is not ClassicState.UNJOINED
        send = in_group and (not static or permanent)
        if send:
            self._session.leave_epoch = LEAVE_EPOCH
        elif static and in_group:
            self._session.leave_epoch = LEAVE_STATIC_EPOCH  # the session keeps its place: KIP-848's -2
        else:
            self._session.leave_epoch = None
        self._session.leave_due = send
        reset = self._session.generation == NO_GENERATION or not self._session.member_id
        self._state = ClassicState.LEAVING
        self._join = self._sync = None  # their answers no longer matter
        self._sync_request = None
        self._session.rejoin_needed = False
        self._pending_assigned = NO_PARTITIONS
        if lose:
            self._lose_owned(0)
        elif self._owned:
            if reset:
                self._lose_owned(self._lost_error)
            else:
                self._revoke(self._owned)
        if not self._revocations:
            self._after_leave_revocations()

    # ------------------------------------------------------------------ driver API

    def request_timeout_ms(self, request: Request, default_ms: int) -> int:
        """JoinGroup waits at the coordinator for the whole rebalance: its timeout is longer."""
        if isinstance(request, JoinGroupRequest):
            return max(default_ms, self.config.rebalance_timeout_ms + JOIN_GROUP_TIMEOUT_LAPSE_MS)
        return default_ms

    def poll(self, now_ms: int) -> list[Request]:
        """The requests to send now. Each must be answered by on_response or on_request_failed."""
        self._advance(now_ms)
        self._check_timeouts(now_ms)
        requests: list[Request] = []
        if self._state is ClassicState.FATAL:
            return requests
        if self._state is ClassicState.LEAVING:
            if self._session.leave_due and self._leave is None and not self._revocations:
                requests.append(self._send_leave(now_ms))
            if self._revocations and self._heartbeat_wanted() and self._heartbeat_due(now_ms):
                requests.append(self._send_heartbeat(now_ms))
            return requests
        if self._subscription is None:
            return requests
        if self._state is ClassicState.STABLE and not self._session.rejoin_needed and self._heartbeat_due(now_ms):
            self._check_assignor_reasons()  # costs a metadata() call, so only when heartbeating
        if self._join_wanted():
            if self._session.needs_join_prepare:
                self._join_prepare()
            if not self._revocations and (self._session.join_due_ms is None or now_ms >= self._session.join_due_ms):
                requests.append(self._send_join(now_ms))
        if self._sync_request is not None and self._sync is None:
            requests.append(self._send_sync(now_ms))
        if self._heartbeat_wanted() and self._heartbeat_due(now_ms):
            requests.append(self._send_heartbeat(now_ms))
        return requests

    def next_deadline(self) -> int | None:
        """When to call poll() next (now or in the past: at once), or None."""
        now = self._now_ms
        deadlines: list[int] = []
        if self._state is ClassicState.FATAL:
            return None
        if self._state is ClassicState.LEAVING:
            if self._session.leave_due and self._leave is None and not self._revocations:
                deadlines.append(now)
        elif self._subscription is not None:
            if self._join_wanted() and (self._session.needs_join_prepare or not self._revocations):
                deadlines.append(now if self._session.join_due_ms is None or self._session.needs_join_prepare else self._session.join_due_ms)
            if self._sync_request is not None and self._sync is None:
                deadlines.append(now)
        if self._heartbeat_wanted() and (self._state is not ClassicState.LEAVING or self._revocations):
            deadlines.append(now if self._session.heartbeat_asap or self._session.heartbeat_due_ms is None else self._session.heartbeat_due_ms)
        deadlines.extend(d for d in (self._session_deadline(), self._rebalance_deadline(), self._join_deadline()) if d is not None)
        return min(deadlines) if deadlines else None

    def on_response(self, request: Request, response: Response, now_ms: int) -> None:
        """Feed the coordinator's answer to a request that poll() returned."""
        self._advance(now_ms)
        if self._join is not None and request is self._join.request:
            in_flight, self._join = self._join, None
            self._on_join_response(in_flight, response, now_ms)
        elif self._sync is not None and request is self._sync.request:
            in_flight, self._sync = self._sync, None
            self._on_sync_response(in_flight, response, now_ms)
        elif self._heartbeat is not None and request is self._heartbeat.request:
            in_flight, self._heartbeat = self._heartbeat, None
            self._on_heartbeat_response(in_flight, response, now_ms)
        elif self._leave is not None and request is self._leave.request:
            self._leave = None
            self._finish_leave()
        # Anything else answers a request this member no longer waits for.

    def on_request_failed(self, request: Request, now_ms: int) -> None:
        """The request timed out or the connection dropped: the outcome is unknown."""
        self._advance(now_ms)
        if self._join is not None and request is self._join.request:
            self._join = None
            self._session.join_due_ms = now_ms + self.config.retry_backoff_ms
        elif self._sync is not None and request is self._sync.request:
            self._sync = None
            self._rejoin_after(now_ms + self.config.retry_backoff_ms, "SyncGroup failed")
        elif self._heartbeat is not None and request is self._heartbeat.request:
            self._heartbeat = None
            self._session.heartbeat_due_ms = now_ms + self.config.retry_backoff_ms
        elif self._leave is not None and request is self._leave.request:
            self._leave = None
            self._finish_leave()  # best effort, as Kafka's consumer: no retry

    # ------------------------------------------------------------------ joining

    def _join_wanted(self) -> bool:
        return (
            self._session.rejoin_needed
            and self._join is None
            and self._sync is None
            and self._sync_request is None
            and self._state not in (ClassicState.LEAVING, ClassicState.FATAL)
        )

    def _request_rejoin(self, reason: str) -> None:
        if not self._session.rejoin_needed:
            log.debug("group %s: rejoining: %s", self.config.group_id, reason)
        self._session.rejoin_needed = True
        self._session.rejoin_reason = reason

    def _rejoin_after(self, due_ms: int | None, reason: str) -> None:
        self._request_rejoin(reason)
        self._session.join_due_ms = due_ms

    def _join_prepare(self) -> None:
        """Kafka's ``onJoinPrepare``: lose (after a reset), revoke all (eager), or revoke the
        partitions of topics no longer subscribed (cooperative)."""
        self._session.needs_join_prepare = False
        if not self._owned:
            return
        if self._session.generation == NO_GENERATION or not self._session.member_id:
            self._lose_owned(self._lost_error)
        elif self.rebalance_protocol is RebalanceProtocol.EAGER:
            self._revoke(self._owned)
        else:
            topics = set(self._current_topics())
            unsubscribed = PartitionSet({t: ps for t, ps in self._owned.by_topic.items() if self.topics.name_of(t) not in topics})
            if unsubscribed:
                self._revoke(unsubscribed)

    def _current_topics(self) -> tuple[str, ...]:
        assert self._subscription is not None
        if not self._subscription.regex:
            return self._subscription.topics
        pattern = _compile(self._subscription.regex)
        return tuple(sorted(n for n in self.topics.topic_names() if not n.startswith("__") and pattern.fullmatch(n)))

    def _user_data(self, protocol: _Protocol) -> bytes | None:
        assignor = protocol.client
        if assignor is None:
            return None
        classic_metadata = getattr(assignor, "classic_metadata", None)
        if callable(classic_metadata):
            return bytes(classic_metadata())
        return bytes(assignor.metadata().data)

    def _send_join(self, now_ms: int) -> JoinGroupRequest:
        topics = self._current_topics()
        owned = to_names(self._owned, self.topics)
        user_data = {p.name: self._user_data(p) for p in self._protocols}
        protocols = [
            JoinGroupRequest.JoinGroupRequestProtocol(
                name=p.name,
                metadata=encode_subscription(
                    Subscription(
                        topics=topics,
                        user_data=user_data[p.name],
                        owned_partitions=owned,
                        generation_id=self._session.generation,
                        rack_id=self.config.rack_id,
                    ),
                    SUBSCRIPTION_VERSION,
                ),
            )
            for p in self._protocols
        ]
        request = JoinGroupRequest(
            group_id=self.config.group_id,
            session_timeout_ms=self.config.session_timeout_ms,
            rebalance_timeout_ms=self.config.rebalance_timeout_ms,
            member_id=self._session.member_id,
            group_instance_id=self.config.instance_id,
            protocol_type=PROTOCOL_TYPE,
            protocols=protocols,
            reason=self._session.rejoin_reason[:_REASON_MAX_CHARS] or None,
        )
        self._state = ClassicState.PREPARING_REBALANCE
        self._join = _InFlight(request, now_ms, self._session.generation, self._session.member_id)
        self._session.join_due_ms = None
        self._joined_topics = topics
        self._joined_user_data = {name: data for name, data in user_data.items() if data is not None}
        self._joined_owned = self._owned
        self._session.heartbeat_asap = False
        return request

    def _on_join_response(self, in_flight: _InFlight, response: JoinGroupResponse, now_ms: int) -> None:
        code = response.error_code
        self._session.rebalance_heard_ms = None  # the coordinator has the join: rejoined in time
        match code:
            case ErrorCode.NONE:
                if response.protocol_type is not None and response.protocol_type != PROTOCOL_TYPE:
                    self._fail(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, f"JoinGroup answered protocol type {response.protocol_type!r}, not {PROTOCOL_TYPE!r}")
                    return
                self._state = ClassicState.COMPLETING_REBALANCE
                self._session.generation = response.generation_id
                self._session.member_id = response.member_id
                self._session.protocol_name = response.protocol_name
                self._session.leader_id = response.leader or ""
                self._session.last_answered_send_ms = in_flight.sent_at_ms
                self._session.sync_awaited_since_ms = in_flight.sent_at_ms
                self._session.heartbeat_due_ms = now_ms + self.config.heartbeat_interval_ms
                assignments: dict[str, bytes] = {}
                if self.is_leader and response.skip_assignment:
                    self._watch_as_returning_leader(response)
                elif self.is_leader:
                    try:
                        assignments = self._lead(response)
                    except _SelectedProtocolUnknown as error:
                        self._fail(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, str(error))
                        return
                self._sync_request = SyncGroupRequest(
                    group_id=self.config.group_id,
                    generation_id=self._session.generation,
                    member_id=self._session.member_id,
                    group_instance_id=self.config.instance_id,
                    protocol_type=PROTOCOL_TYPE,
                    protocol_name=self._session.protocol_name,
                    assignments=[
                        SyncGroupRequest.SyncGroupRequestAssignment(member_id=member_id, assignment=data) for member_id, data in sorted(assignments.items())
                    ],
                )
            case ErrorCode.MEMBER_ID_REQUIRED:
                # KIP-394: join again, at once, with the id the coordinator has reserved for us.
                self._session.member_id = response.member_id
                self._session.generation, self._session.protocol_name = NO_GENERATION, None
                self._session.join_due_ms = None
            case ErrorCode.UNKNOWN_MEMBER_ID:
                if self._generation_unchanged(in_flight):
                    self._reset(code, reset_member_id=True)
                self._session.join_due_ms = None
            case ErrorCode.ILLEGAL_GENERATION:
                # Kafka's coordinator never says this to a JoinGroup; treated as the SyncGroup answer.
                if self._generation_unchanged(in_flight):
                    self._reset(code, reset_member_id=False)
                self._session.join_due_ms = None
            case ErrorCode.REBALANCE_IN_PROGRESS:
                self._session.join_due_ms = None  # e.g. the group was converted meanwhile: retry at once
            case _ if code in COORDINATOR_MOVED:
                self._events.append(CoordinatorUnavailable(code))
                self._session.join_due_ms = now_ms + self.config.retry_backoff_ms
            case ErrorCode.LOAD_IN_PROGRESS:
                self._session.join_due_ms = now_ms + self.config.retry_backoff_ms
            case _:
                self._fail(code, response_message(response), api="JoinGroup")

    def _lead(self, response: JoinGroupResponse) -> dict[str, bytes]:
        protocol = next((p for p in self._protocols if p.name == response.protocol_name), None)
        if protocol is None:
            raise _SelectedProtocolUnknown(f"the coordinator selected protocol {response.protocol_name!r}, which this member does not have")
        memory = self._session.leader
        previous = memory.targets if memory is not None and memory.generation == self._session.generation - 1 else None
        result = assign_group(
            protocol.assignor,
            client_side=protocol.client_side,
            members=decode_members(response.members or ()),
            topics=self.topics,
            protocol=self.rebalance_protocol,
            previous_targets=previous,
        )
        self._session.leader = _LeaderMemory(self._session.generation, result.targets, result.topic_partition_counts)
        return result.assignments

    def _watch_as_returning_leader(self, response: JoinGroupResponse) -> None:
        """A static leader back without a rebalance (KIP-814 SkipAssignment) keeps the group's
        assignment but watches the metadata of every topic the group subscribes to from now on,
        as Kafka's ``onLeaderElected`` does (``updateGroupSubscription``, then
        ``assignmentSnapshot = metadataSnapshot``): a partition count that changes later makes it
        rebalance the group."""
        names = sorted({name for member in decode_members(response.members or ()) if member.subscription for name in member.subscription.topics})
        counts = {name: (t.num_partitions if (t := self.topics.topic(name)) else None) for name in names}
        self._session.leader = _LeaderMemory(self._session.generation, {}, counts)

    def _send_sync(self, now_ms: int) -> SyncGroupRequest:
        assert self._sync_request is not None
        request, self._sync_request = self._sync_request, None
        self._sync = _InFlight(request, now_ms, self._session.generation, self._session.member_id)
        return request

    def _on_sync_response(self, in_flight: _InFlight, response: SyncGroupResponse, now_ms: int) -> None:
        code = response.error_code
        match code:
            case ErrorCode.NONE:
                if response.protocol_type is not None and response.protocol_type != PROTOCOL_TYPE:
                    self._fail(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, f"SyncGroup answered protocol type {response.protocol_type!r}, not {PROTOCOL_TYPE!r}")
                    return
                if not self._generation_unchanged(in_flight) or self._state is not ClassicState.COMPLETING_REBALANCE:
                    # A heartbeat reset the generation meanwhile: this rebalance failed, rejoin.
                    self._rejoin_after(None, "the generation was reset during the rebalance")
                    return
                if response.protocol_name is not None and response.protocol_name != self._session.protocol_name:
                    self._fail(
                        ErrorCode.INCONSISTENT_GROUP_PROTOCOL, f"SyncGroup answered protocol {response.protocol_name!r}, not {self._session.protocol_name!r}"
                    )
                    return
                self._state = ClassicState.STABLE
                self._session.rejoin_needed = False
                self._session.rejoin_reason = ""
                self._session.needs_join_prepare = True
                self._session.last_answered_send_ms = in_flight.sent_at_ms
                self._session.sync_awaited_since_ms = None
                self._on_join_complete(bytes(response.assignment or b""))
                if self._state is ClassicState.STABLE and self._current_topics() != self._joined_topics:
                    self._request_rejoin("the subscription changed during the rebalance")
            case ErrorCode.REBALANCE_IN_PROGRESS:
                self._rejoin_after(None, "the group began another rebalance")
            case ErrorCode.UNKNOWN_MEMBER_ID | ErrorCode.ILLEGAL_GENERATION:
                if self._generation_unchanged(in_flight):
                    self._reset(code, reset_member_id=code == ErrorCode.UNKNOWN_MEMBER_ID)
                self._rejoin_after(None, f"SyncGroup said {error_name(code)}")
            case _ if code in COORDINATOR_MOVED:
                self._events.append(CoordinatorUnavailable(code))
                self._rejoin_after(now_ms + self.config.retry_backoff_ms, "the coordinator moved")
            case _:
                self._fail(code, response_message(response), api="SyncGroup")

    def _on_join_complete(self, data: bytes) -> None:
        """Kafka's ``onJoinComplete``: apply the assignment SyncGroup handed out."""
        try:
            assignment = decode_assignment(data)
        except ConsumerProtocolError as error:
            self._fail(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, f"the assignment from SyncGroup cannot be read: {error}")
            return
        subscribed = set(self._current_topics())
        if not assignment.topics() <= subscribed:
            # The subscription changed since the join: rejoin with the current one.
            self._request_rejoin("the assignment does not match the current subscription")
            return
        unknown = sorted(t for t in assignment.topics() if self.topics.topic(t) is None)
        if unknown:
            log.warning("group %s: assigned partitions of unknown topics %s; ignored", self.config.group_id, unknown)
        assigned = to_ids(assignment.partitions, self.topics)
        revoked = self._owned - assigned
        if revoked:
            # Cooperative: give up what moved, then rejoin so the next rebalance hands it on.
            # (An eager member owns nothing here: it revoked everything before joining.)
            self._revoke(revoked)
            self._request_rejoin("need to revoke partitions and re-join")
        elif self._joined_owned - assigned:
            # It reported owning these in its JoinGroup and lost them since (a guard gave them
            # up while the rebalance ran): the leader withheld them from their new owner on the
            # strength of that report, so only a rejoin without them lets the next rebalance
            # hand them on, as after a revocation.
            self._request_rejoin("partitions it reported owning moved, and it no longer owns them")
        self._notify_assignor(assigned, assignment.user_data)
        self._pending_assigned = assigned
        if not self._revocations:
            self._assign_pending()

    def _notify_assignor(self, assigned: PartitionSet, user_data: bytes | None) -> None:
        protocol = next((p for p in self._protocols if p.name == self._session.protocol_name), None)
        if protocol is None or protocol.client is None:
            return
        protocol.client.on_assignment(
            ErrorCode.NONE,
            MemberAssignment(partitions=assigned.by_topic, metadata_version=CLASSIC_METADATA_VERSION, metadata=user_data or b""),
            self._session.generation,
        )

    def _assign_pending(self) -> None:
        added = self._pending_assigned - self._owned
        self._pending_assigned = NO_PARTITIONS
        if added:
            self._owned = self._owned | added
            self._events.append(PartitionsAssigned(added, self._session.generation))

    def _check_assignor_reasons(self) -> None:
        """A client-side assignor with a reason and metadata the group has not seen rejoins."""
        if self._state is not ClassicState.STABLE or self._session.rejoin_needed:
            return
        for protocol in self._protocols:
            if protocol.client is None or protocol.client.metadata().reason == 0:
                continue
            if self._user_data(protocol) != self._joined_user_data.get(protocol.name):
                self._request_rejoin(f"assignor {protocol.name} asks for a new assignment")
                return

    # ------------------------------------------------------------------ heartbeats

    def _heartbeat_wanted(self) -> bool:
        """Kafka's heartbeat thread runs from the JoinGroup answer until the next join."""
        if self._heartbeat is not None:
            return False
        if self._state is ClassicState.LEAVING:
            return self._session.generation != NO_GENERATION and bool(self._session.member_id)
        return self._state in (ClassicState.COMPLETING_REBALANCE, ClassicState.STABLE)

    def _heartbeat_due(self, now_ms: int) -> bool:
        if self._session.heartbeat_asap:
            return True
        return self._session.heartbeat_due_ms is not None and now_ms >= self._session.heartbeat_due_ms

    def _send_heartbeat(self, now_ms: int) -> HeartbeatRequest:
        request = HeartbeatRequest(
            group_id=self.config.group_id,
            generation_id=self._session.generation,
            member_id=self._session.member_id,
            group_instance_id=self.config.instance_id,
        )
        self._heartbeat = _InFlight(request, now_ms, self._session.generation, self._session.member_id)
        self._session.heartbeat_asap = False
        self._session.heartbeat_due_ms = None
        return request

    def _on_heartbeat_response(self, in_flight: _InFlight, response: HeartbeatResponse, now_ms: int) -> None:
        code = response.error_code
        self._session.heartbeat_due_ms = in_flight.sent_at_ms + self.config.heartbeat_interval_ms
        match code:
            case ErrorCode.NONE:
                if self._generation_unchanged(in_flight):
                    self._session.last_answered_send_ms = in_flight.sent_at_ms
            case ErrorCode.REBALANCE_IN_PROGRESS:
                settled_send_ms = self._session.last_answered_send_ms
                if self._generation_unchanged(in_flight):
                    # Still a member: the coordinator keeps it while it rejoins within the rebalance timeout.
                    self._session.last_answered_send_ms = in_flight.sent_at_ms
                guarded = self._state is ClassicState.STABLE or (self._state is ClassicState.LEAVING and self._revocations)
                if guarded and self._session.rebalance_heard_ms is None:
                    # The rebalance (and the coordinator's timer) began after it answered this
                    # member's previous request without one: count from that request's send.
                    self._session.rebalance_heard_ms = min(in_flight.sent_at_ms, settled_send_ms if settled_send_ms is not None else in_flight.sent_at_ms)
                if self._state is ClassicState.STABLE:
                    self._request_rejoin("the group is rebalancing")
                # Otherwise already rebalancing (or leaving): no rejoin, as Kafka does.
            case ErrorCode.ILLEGAL_GENERATION | ErrorCode.UNKNOWN_MEMBER_ID | ErrorCode.FENCED_INSTANCE_ID:
                if not self._generation_unchanged(in_flight):
                    return  # answers a generation this member has already left behind
                if code == ErrorCode.FENCED_INSTANCE_ID:
                    self._fail(code, response_message(response), api="Heartbeat")
                    return
                if self._state is ClassicState.LEAVING:
                    self._lose_revoking(code)
                    return
                self._reset(code, reset_member_id=code == ErrorCode.UNKNOWN_MEMBER_ID)
                self._rejoin_after(None, f"Heartbeat said {error_name(code)}")
            case _ if code in COORDINATOR_MOVED:
                self._events.append(CoordinatorUnavailable(code))
                self._session.heartbeat_due_ms = now_ms + self.config.retry_backoff_ms
            case _:
                # Kafka's heartbeat thread retries anything else after the back-off.
                log.info("group %s: heartbeat failed with %s; retrying", self.config.group_id, error_name(code))
                self._session.heartbeat_due_ms = now_ms + self.config.retry_backoff_ms

    # ------------------------------------------------------------------ losing and resetting

    def _generation_unchanged(self, in_flight: _InFlight) -> bool:
        return in_flight.generation == self._session.generation and in_flight.member_id == self._session.member_id

    def _reset(self, error_code: int, *, reset_member_id: bool) -> None:
        """Kafka's ``resetStateAndGeneration``: out of the group; everything owned is lost."""
        self._lose_owned(error_code)
        old = self._session
        self._session = _Session(
            member_id="" if reset_member_id else old.member_id,  # ILLEGAL_GENERATION keeps it
            join_due_ms=old.join_due_ms,  # kept: a failed JoinGroup's back-off still holds
            leader=old.leader,  # kept: the next assignment it leads stays sticky to its last
        )
        self._state = ClassicState.UNJOINED
        self._sync_request = None  # built for the generation just reset: never sent
        self._lost_error = error_code
        self._request_rejoin(f"reset after {error_name(error_code)}")

    def _lose_owned(self, error_code: int) -> None:
        self._pending_assigned = NO_PARTITIONS
        self._lose_partitions(error_code)

    def _lose_revoking(self, error_code: int) -> None:
        """Leaving, and out of the group (the coordinator said so, or has removed us by now): the
        revocations become losses."""
        self._lose_owned(error_code)
        self._session.generation = NO_GENERATION
        self._after_leave_revocations()

    # ------------------------------------------------------------------ guards

    def _revoking_before_leave(self) -> bool:
        """Leaving, still revoking: the member is in the group and holds partitions meanwhile."""
        return self._state is ClassicState.LEAVING and bool(self._revocations)

    def _session_deadline(self) -> int | None:
        """Guarded and settled (or revoking before a leave), also the rebalance timeout when
        shorter: a rebalance may begin right after the coordinator's last answer, every later
        answer (its REBALANCE_IN_PROGRESS) be lost, and the join phase end without this member a
        rebalance timeout later (Kafka's completeJoin drops a dynamic member that did not
        rejoin, and has the leader assign around a static one's old partitions), while its
        session still runs. Not while completing a rebalance: its last answer is the JoinGroup,
        which may have waited out a whole join phase at the coordinator."""
        if self._session.last_answered_send_ms is None:
            return None
        if self._state not in (ClassicState.COMPLETING_REBALANCE, ClassicState.STABLE) and not self._revoking_before_leave():
            return None
        timeout_ms = self.config.session_timeout_ms
        if self.config.lose_partitions_on_session_timeout and self._state is not ClassicState.COMPLETING_REBALANCE:
            timeout_ms = min(timeout_ms, self.config.rebalance_timeout_ms)
        return self._session.last_answered_send_ms + timeout_ms

    def _rebalance_deadline(self) -> int | None:
        if self._session.rebalance_heard_ms is None:
            return None
        if self._state is not ClassicState.STABLE and not self._revoking_before_leave():
            return None
        return self._session.rebalance_heard_ms + self.config.rebalance_timeout_ms

    def _join_deadline(self) -> int | None:
        """Guarded, a member still owning partitions between a rebalance and its next successful
        SyncGroup (KIP-429) may have been removed by now: the coordinator drops a member that has
        not rejoined a rebalance timeout after the rebalance began, or has not synced one after
        answering its join (the timer a failed SyncGroup and an unanswered rejoin leave running);
        the JoinGroup's own timeout is later still. Only its partitions go: the answers it waits
        for may still come, and then it carries on. Partitions it is revoking are still its own
        (it processes them until the revocation is done), so they count, also when it revokes
        before leaving: leave() drops the join and sync it waited for, not the coordinator's
        timer (Kafka's GroupMetadataManager: scheduleConsumerGroupSyncTimeout for a classic
        member of a consumer group, the classic group's pending-sync expiry, remove the member
        whatever it does meanwhile short of a JoinGroup or SyncGroup reaching it)."""
        if not self.config.lose_partitions_on_session_timeout or not (self._owned or self._revocations):
            return None
        starts = [self._session.sync_awaited_since_ms] if self._session.sync_awaited_since_ms is not None else []
        if self._join is not None:
            starts.append(self._join.sent_at_ms)
        if self._join is not None or self._state is ClassicState.PREPARING_REBALANCE:
            # Rejoining, it no longer heartbeats: a rebalance it never heard of may have begun
            # right after its last answered request (the JoinGroup that would have saved it may
            # be lost), and ends without it a rebalance timeout later.
            heard = self._session.rebalance_heard_ms
            if heard is None:
                heard = self._session.last_answered_send_ms
            if heard is not None:
                starts.append(heard)
        return min(starts) + self.config.rebalance_timeout_ms if starts else None

    def _check_timeouts(self, now_ms: int) -> None:
        join = self._join_deadline()
        if join is not None and now_ms >= join:
            log.warning("group %s: not rejoined and synced within the rebalance timeout; giving up every partition", self.config.group_id)
            if self._state is ClassicState.LEAVING:
                # Revoking before a leave: no answer can bring it back; LeaveGroup, best effort.
                self._lose_revoking(ErrorCode.REQUEST_TIMED_OUT)
                return
            self._lose_owned(ErrorCode.REQUEST_TIMED_OUT)  # the answer may still come: then carry on
        rebalance = self._rebalance_deadline()
        if rebalance is not None and now_ms >= rebalance:
            # Not rejoined within the rebalance timeout (revocations too slow, Kafka's max poll
            # interval): the coordinator has gone on without this member.
            log.warning("group %s: did not rejoin within the rebalance timeout; giving up every partition", self.config.group_id)
            if self._state is ClassicState.LEAVING:
                self._lose_revoking(ErrorCode.REQUEST_TIMED_OUT)  # then LeaveGroup, best effort
            else:
                self._reset(ErrorCode.REQUEST_TIMED_OUT, reset_member_id=True)
            return
        session = self._session_deadline()
        if session is not None and now_ms >= session:
            self._events.append(CoordinatorUnavailable(ErrorCode.REQUEST_TIMED_OUT))
            if not self.config.lose_partitions_on_session_timeout:
                self._session.last_answered_send_ms = now_ms  # look the coordinator up again, keep going
            elif self._state is ClassicState.LEAVING:
                self._lose_revoking(ErrorCode.REQUEST_TIMED_OUT)
            else:
                self._reset(ErrorCode.REQUEST_TIMED_OUT, reset_member_id=True)

    # ------------------------------------------------------------------ leaving

    def _after_leave_revocations(self) -> None:
        if self._session.leave_due:
            return  # poll() sends the LeaveGroup
        self._finish_leave()

    def _send_leave(self, now_ms: int) -> LeaveGroupRequest:
        self._session.leave_due = False
        request = LeaveGroupRequest(
            group_id=self.config.group_id,
            members=[
                LeaveGroupRequest.MemberIdentity(
                    member_id=self._session.member_id,
                    group_instance_id=self.config.instance_id,
                    reason="the consumer is being closed" if self._closed else "the consumer left the group",
                )
            ],
        )
        self._leave = _InFlight(request, now_ms, self._session.generation, self._session.member_id)
        return request

    def _finish_leave(self) -> None:
        old = self._session
        # A new session: no generation, no member id (Kafka's resetGenerationOnLeaveGroup).
        self._session = _Session(join_due_ms=old.join_due_ms)  # kept: a failed JoinGroup's back-off still holds
        self._heartbeat = None  # a late answer must not act on the group just left
        self._state = ClassicState.UNJOINED
        self._subscription = None
        self._events.append(LeftGroup(old.leave_epoch))

    # ------------------------------------------------------------------ failure

    def _fail(self, error_code: int, server_message: str | None, *, api: str | None = None) -> None:
        if api is None:
            message = f"group {self.config.group_id!r}: {server_message}"
        else:
            message = f"group {self.config.group_id!r}: {api} failed with {error_name(error_code)} ({error_code}), which is fatal"
            if error_code == ErrorCode.FENCED_INSTANCE_ID:
                message += f": another member uses instance id {self.config.instance_id!r}"
            elif error_code == Errors.GroupMaxSizeReachedError.errno:
                message += ": the group already has its maximum number of members"
            if server_message:
                message += f": {server_message}"
        self._lose_owned(error_code)
        old = self._session
        # Kept: the generation it failed in stays readable (member_epoch, member_id, is_leader).
        self._session = _Session(generation=old.generation, member_id=old.member_id, protocol_name=old.protocol_name, leader_id=old.leader_id)
        self._join = self._sync = self._heartbeat = self._leave = None
        self._sync_request = None
        self._state = ClassicState.FATAL
        self._fatal_error = message
        self._events.append(MemberFailed(error_code, message))


class _SelectedProtocolUnknown(Exception):
    pass


def response_message(response: object) -> str | None:
    """A response's error message, for the versions that carry one."""
    return getattr(response, "error_message", None)


def _compile(regex: str):
    import re2

    try:
        return re2.compile(regex)
    except re2.error as error:
        raise ValueError(f"invalid subscription regex {regex!r}: {error}") from None


def topic_names_in(response: object) -> set[str]:
    """The topic names a classic response makes the member resolve: the leader's JoinGroup
    answer (every member's subscription and owned partitions) and SyncGroup's assignment. The
    driver refreshes the resolver first when one of them is unknown. Unreadable bytes name none
    (the member reports them itself)."""
    names: set[str] = set()
    if isinstance(response, JoinGroupResponse) and response.error_code == ErrorCode.NONE:
        for member in response.members or ():
            try:
                subscription = decode_subscription(bytes(member.metadata))
            except ConsumerProtocolError:
                continue
            names.update(subscription.topics)
            names.update(subscription.owned_partitions)
    elif isinstance(response, SyncGroupResponse) and response.error_code == ErrorCode.NONE:
        try:
            names.update(decode_assignment(bytes(response.assignment or b"")).topics())
        except ConsumerProtocolError:
            pass
    return names
