"""A member *process*: the real GroupMember plus what an application does around it.

The application part is small and deliberate:

* it sends what ``GroupMember.poll`` returns, through its own transport: every request has a
  request timeout, after which the member hears ``on_request_failed``; answers for requests it
  no longer waits for (late, or duplicated by the network) are still handed to the member,
  which must ignore them;
* it "processes" the partitions it owns (a position that advances with time, starting from
  the committed offset) and commits them with its member epoch every commit interval;
* on RevokePartitions it commits the revoked partitions, waits for the answer (or its
  timeout), works a little longer (a random delay, long when the profile makes apps slow) and
  then calls ``revocation_done``;
* a slow client-side assignor holds its Install request back for the computation time;
* it can crash (gone at once, no leave), leave (-1, or -2 when static), and start again as a
  new incarnation (a new GroupMember; a static one keeps its instance id);
* it speaks the group protocol its spec names: KIP-848 (``ConsumerGroupMember``) or classic
  (``ClassicGroupMember``, Kafka's consumer: JoinGroup / SyncGroup long polls, whose request
  timeout is the rebalance timeout plus 5 s). A restart may switch it (online migration);
* with several coordinator nodes, it finds the one serving its group as the client's driver
  does: FindCoordinator to the nodes in turn (backing off after a failed lookup), requests held
  until a node is found, and the node forgotten (its connection closed, failing what was in
  flight on it) on NOT_COORDINATOR or COORDINATOR_NOT_AVAILABLE, a timed-out request, or a
  connection that dies.

A process's *own view* of what it owns is what its member would report as owned in its next
heartbeat: ``owned_partitions`` (being processed) plus ``revoking_partitions`` (handed to the
application for revocation and not released by ``revocation_done`` yet: it is still
committing them). A crashed process owns nothing.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import kafka.errors as Errors
from kafka.protocol.api_message import ApiMessage

from pystreams.client.classic import ClassicGroupMember, ClassicMemberConfig
from pystreams.client.common import GroupMember
from pystreams.client.events import CoordinatorUnavailable
from pystreams.client.member import (
    AssignmentAbandoned,
    AssignmentInstalled,
    ConsumerGroupMember,
    InstanceIdUnreleased,
    LeftGroup,
    MemberConfig,
    MemberFailed,
    MemberState,
    PartitionsAssigned,
    PartitionsLost,
    RevokePartitions,
)
from pystreams.coordinator.classic_group import ClassicGroup
from pystreams.coordinator.consumer_group import ConsumerGroup
from pystreams.partitions import NO_PARTITIONS, PartitionSet, TopicIdPartition
from pystreams.protocol import messages as m
from pystreams.protocol.registry import api_spec
from pystreams.protocol.sentinels import COORDINATOR_MOVED  # what sends the driver looking again
from pystreams.sim.assignors import Outcome, SimAssignor

if TYPE_CHECKING:
    from pystreams.sim.world import Simulation

Commit = m.OffsetCommitRequest
CommitTopic = Commit.OffsetCommitRequestTopic
CommitPartition = CommitTopic.OffsetCommitRequestPartition

#: Records "processed" per millisecond of ownership: a position that grows with time.
RECORDS_PER_MS = 1


@dataclass(frozen=True)
class ProcessSpec:
    name: str
    instance_id: str | None = None
    topics: tuple[str, ...] | None = None
    regex: str | None = None
    server_assignor: str | None = None
    #: Client-side assignor (min version, max version, metadata version); None: server side.
    client_versions: tuple[int, int, int] | None = None
    #: Speak the classic protocol with this assignor ("range": eager, "cooperative-sticky":
    #: KIP-429); None: KIP-848.
    classic_assignor: str | None = None


#: A failed lookup is retried after the retry back-off, doubled per failure up to this.
MAX_LOOKUP_BACKOFF_MS = 1_000


@dataclass
class _Outstanding:
    request: ApiMessage | None  # None: a commit that was never sent
    kind: str  # "member" | "commit"
    revocation_id: int | None = None
    #: The connection it went out on; None while it waits for a coordinator to be found.
    connection: int | None = None


class MemberProcess:
    def __init__(self, world: Simulation, spec: ProcessSpec) -> None:
        self.world = world
        self.spec = spec
        self.name = spec.name
        self.member: GroupMember | None = None
        self.assignor: SimAssignor | None = None
        #: Changes on every start and crash: callbacks of an older incarnation are ignored.
        self.incarnation = 0
        self.running = False
        #: Whether this process should be running once faults stop (it may be down meanwhile).
        self.wanted = False
        self._request_ids = itertools.count(1)
        self._outstanding: dict[int, _Outstanding] = {}
        #: Install requests broken on purpose: id -> (the request, kept alive so the id stays
        #: unique, and how it was broken).
        self._invalid_installs: dict[int, tuple[object, str]] = {}
        #: Per owned partition: (committed offset it started from, when it got it).
        self._positions: dict[TopicIdPartition, tuple[int, int]] = {}
        # Wake-up bookkeeping for the world (a token makes superseded wake events no-ops).
        self.wake_token = 0
        self.wake_at: int | None = None
        self.woken_at: int | None = None
        #: When the coordinator last answered one of its heartbeats without error.
        self.last_heartbeat_ok_ms: int | None = None
        #: Every member id the coordinator handed to this process's requests, over all its
        #: incarnations (also to one that stopped before the answer reached it), in the order
        #: first handed out: id -> rank.
        self.issued_member_ids: dict[str, int] = {}
        #: With several coordinator nodes: the node it talks to, as (name, incarnation); None
        #: until a lookup finds one. The connection number changes whenever it forgets the
        #: node: answers that come over an older connection are lost.
        self.coordinator: tuple[str, int] | None = None
        self.connection = 0
        self._lookup: int | None = None
        self._lookup_tokens = itertools.count(1)
        #: Lookups so far (which node to ask next) and failed ones in a row (the back-off).
        self._lookups = len(world.processes)
        self._failed_lookups = 0

    # ------------------------------------------------------------------ observation

    def view(self) -> PartitionSet:
        """What this process owns in its own view (see the module docstring)."""
        member = self.member
        if member is None:
            return NO_PARTITIONS
        revoking = member.revoking_partitions
        return member.owned_partitions | revoking if revoking else member.owned_partitions

    @property
    def member_epoch(self) -> int:
        return self.member.member_epoch if self.member is not None else 0

    @property
    def member_id(self) -> str:
        return self.member.member_id if self.member is not None else ""

    # ------------------------------------------------------------------ life cycle

    def start(self) -> None:
        if self.running:
            return
        world, spec = self.world, self.spec
        self.incarnation += 1
        self.running = True
        if spec.client_versions is not None:
            low, high, version = spec.client_versions
            self.assignor = SimAssignor(low, high, version, world.assignor_rng, world.assignor_outcome, world.assignor_slow_ms, world.stats)
        else:
            self.assignor = None
        timing = world.timing
        if spec.classic_assignor is not None:
            self.assignor = None
            self.member = ClassicGroupMember(
                ClassicMemberConfig(
                    group_id=world.group_id,
                    client_id=self.name,
                    instance_id=spec.instance_id,
                    session_timeout_ms=timing.session_timeout_ms,
                    heartbeat_interval_ms=timing.heartbeat_interval_ms,
                    rebalance_timeout_ms=timing.rebalance_timeout_ms,
                    assignors=(spec.classic_assignor,),
                    retry_backoff_ms=timing.retry_backoff_ms,
                    # The same guard as the KIP-848 member's: give partitions up no later than the
                    # coordinator may hand them on.
                    lose_partitions_on_session_timeout=True,
                ),
                world.topic_table,
            )
        else:
            self.member = self._kip848_member()
        if spec.regex is not None:
            self.member.subscribe(regex=spec.regex)
        else:
            self.member.subscribe(topics=spec.topics)
        world.at(world.now + timing.commit_interval_ms, self._periodic_commit, self.incarnation)
        world.touched(self)

    def _kip848_member(self) -> ConsumerGroupMember:
        timing = self.world.timing
        spec = self.spec
        return ConsumerGroupMember(
            MemberConfig(
                group_id=self.world.group_id,
                client_id=self.name,
                instance_id=spec.instance_id,
                rebalance_timeout_ms=timing.rebalance_timeout_ms,
                retry_backoff_ms=timing.retry_backoff_ms,
                # The client's guard, set to the group's session timeout: it gives its partitions
                # up no later than the coordinator may hand them on.
                session_timeout_ms=timing.session_timeout_ms,
                server_assignor=spec.server_assignor if self.assignor is None else None,
                client_assignors=() if self.assignor is None else (self.assignor,),
            )
        )

    def metadata_refreshed(self, incarnation: int) -> None:
        """A classic member's metadata refresh saw the topics change (a KIP-848 member hears it
        from the coordinator)."""
        if incarnation != self.incarnation or not isinstance(self.member, ClassicGroupMember):
            return
        self.member.metadata_changed()
        self._drain_events()
        self.world.touched(self)

    def crash(self) -> None:
        """Gone at once: no leave heartbeat, no commit; whatever it had in flight is lost."""
        if not self.running:
            return
        self._stop()
        self.world.stats["process.crashes"] += 1
        self.world.after_stop(self)

    def leave(self, permanent: bool = False) -> None:
        """Graceful leave: revoke (commit) everything, then -1 (or -2 for a static member)."""
        if not self.running or self.member is None:
            return
        self.member.leave(self.world.now, permanent=permanent)
        self._drain_events()
        self.world.touched(self)

    def _stop(self) -> None:
        self.running = False
        self.member = None
        self.assignor = None
        self.incarnation += 1
        self._outstanding.clear()
        self._invalid_installs.clear()
        self._positions.clear()
        self.wake_token += 1
        self.wake_at = None
        self.last_heartbeat_ok_ms = None
        self.coordinator = None
        self.connection += 1
        self._lookup = None
        self._failed_lookups = 0
        self.world.touched(self)

    # ------------------------------------------------------------------ driving the member

    def wake(self, token: int) -> None:
        if token != self.wake_token:
            return
        self.wake_at = None
        if self.member is None:
            return
        self.woken_at = self.world.now
        for request in self.member.poll(self.world.now):
            self._dispatch(request)
        self._drain_events()
        self.world.touched(self)

    def _dispatch(self, request: ApiMessage) -> None:
        if isinstance(request, (m.ConsumerGroupHeartbeatRequest, m.HeartbeatRequest)):
            self.world.stats["heartbeats"] += 1
        elif isinstance(request, m.JoinGroupRequest):
            self.world.stats["classic.joins"] += 1
        if isinstance(request, m.ConsumerGroupInstallAssignmentRequest) and self.assignor is not None:
            assignor = self.assignor
            if assignor.last_outcome is Outcome.INVALID:
                self._invalid_installs[id(request)] = (request, assignor.last_invalid_kind or "invalid")
            delay, assignor.compute_ms, assignor.last_outcome = assignor.compute_ms, 0, None
            if delay > 0:
                # A slow assignor: the computation takes this long before the Install leaves.
                self.world.stats["assignor.install_held"] += 1
                self.world.at(self.world.now + delay, self._send_later, self.incarnation, request)
                return
        self._send(request, "member")

    def _send_later(self, incarnation: int, request: ApiMessage) -> None:
        if incarnation == self.incarnation:
            self._send(request, "member")

    def _send(self, request: ApiMessage, kind: str, revocation_id: int | None = None) -> None:
        if isinstance(self.member, ClassicGroupMember):
            # Kafka's consumer speaks the newest version both sides serve (the coordinator's).
            spec = api_spec(request.API_KEY)
            assert spec is not None  # the member only sends APIs of the registry
            request.API_VERSION = spec.max_version
        request_id = next(self._request_ids)
        outstanding = self._outstanding[request_id] = _Outstanding(request, kind, revocation_id)
        world = self.world
        timeout_ms = world.timing.request_timeout_ms
        if self.member is not None:
            timeout_ms = self.member.request_timeout_ms(request, timeout_ms)  # a JoinGroup waits longer
        world.at(world.now + timeout_ms, self._timed_out, self.incarnation, request_id)
        if world.cluster is not None and self.coordinator is None:
            self._look_up()  # it goes out once a node is found
            return
        self._transmit(request_id, outstanding)

    def _transmit(self, request_id: int, outstanding: _Outstanding) -> None:
        assert outstanding.request is not None
        outstanding.connection = self.connection
        self.world.send_to_coordinator(self, self.incarnation, request_id, outstanding.request)

    # ------------------------------------------------------------------ finding the coordinator (several nodes)

    def _look_up(self) -> None:
        """FindCoordinator to the next node (unless a lookup is under way)."""
        world = self.world
        cluster = world.cluster
        if cluster is None or self._lookup is not None or self.coordinator is not None or self.member is None:
            return
        self._lookup = token = next(self._lookup_tokens)
        name = cluster.names[self._lookups % len(cluster.names)]
        self._lookups += 1
        world.at(world.now + world.timing.request_timeout_ms, self.found, self.incarnation, token, None)
        world.find_coordinator(self, self.incarnation, token, name)

    def found(self, incarnation: int, token: int, coordinator: tuple[str, int] | None) -> None:
        """A lookup ended: the node serving the group (connected), or None (an error, a node
        that refused, or the lookup's timeout): try again after the back-off."""
        if incarnation != self.incarnation or token != self._lookup or self.member is None:
            return
        self._lookup = None
        world = self.world
        if coordinator is None:
            world.stats["cluster.lookups_failed"] += 1
            delay = min(world.timing.retry_backoff_ms * 2 ** min(self._failed_lookups, 8), MAX_LOOKUP_BACKOFF_MS)
            self._failed_lookups += 1
            world.at(world.now + delay, self._look_up_again, incarnation)
            return
        world.stats["cluster.lookups"] += 1
        self._failed_lookups = 0
        self.coordinator = coordinator
        for request_id, outstanding in list(self._outstanding.items()):
            if outstanding.connection is None and outstanding.request is not None:
                self._transmit(request_id, outstanding)

    def _look_up_again(self, incarnation: int) -> None:
        if incarnation == self.incarnation and any(o.connection is None for o in self._outstanding.values()):
            self._look_up()

    def _forget_coordinator(self) -> None:
        """Close the connection to the node: what is in flight on it fails now, and the next
        request looks the coordinator up again."""
        if self.world.cluster is None or self.coordinator is None:
            return
        self.world.stats["cluster.coordinator_forgotten"] += 1
        self.coordinator = None
        closed, self.connection = self.connection, self.connection + 1
        for request_id in [rid for rid, o in self._outstanding.items() if o.connection == closed]:
            self._fail(request_id, "requests.connection_closed")

    def connection_lost(self, incarnation: int, link: tuple) -> None:
        """A request reached a node that is gone: its connection is refused."""
        if incarnation == self.incarnation and link[2] == self.connection:
            self._forget_coordinator()

    def on_answer(self, incarnation: int, request_id: int, request: ApiMessage, response: ApiMessage) -> None:
        if incarnation != self.incarnation or self.member is None:
            return  # an answer to a process that has since crashed or restarted
        outstanding = self._outstanding.pop(request_id, None)
        if outstanding is None:
            # Late (after its timeout) or a duplicate: a member request is still shown to the
            # member, which must ignore it; a commit answer no one waits for is dropped.
            self.world.stats["answers.unexpected"] += 1
            if not isinstance(request, Commit):
                self.member.on_response(request, response, self.world.now)
                self._drain_events()
                self.world.touched(self)
            return
        if outstanding.kind == "commit":
            if any(p.error_code in COORDINATOR_MOVED for t in response.topics for p in t.partitions):
                self._forget_coordinator()
            self._commit_finished(outstanding)
            return
        if isinstance(response, m.ConsumerGroupInstallAssignmentResponse):
            self._check_install(request, response)
        elif isinstance(response, (m.ConsumerGroupHeartbeatResponse, m.HeartbeatResponse)) and response.error_code == 0:
            self.last_heartbeat_ok_ms = self.world.now
        self.member.on_response(request, response, self.world.now)
        self._drain_events()
        self.world.touched(self)

    def connection_closed(self, incarnation: int, request_id: int, link: object) -> None:
        """The coordinator holding this request (a classic long poll) died: the request fails
        now rather than at its timeout, as a closed connection fails it."""
        if isinstance(link, tuple) and incarnation == self.incarnation and link[2] == self.connection:
            self._forget_coordinator()  # fails it with everything else on that connection
            return
        self._timed_out(incarnation, request_id)

    def _timed_out(self, incarnation: int, request_id: int) -> None:
        if incarnation != self.incarnation or self.member is None:
            return
        outstanding = self._outstanding.get(request_id)
        if outstanding is None:
            return
        if outstanding.connection is not None and outstanding.connection == self.connection and self.coordinator is not None:
            # The driver closes a connection on which a request timed out.
            self.world.stats["requests.timed_out"] += 1
            self._forget_coordinator()
            return
        self._fail(request_id, "requests.timed_out")

    def _fail(self, request_id: int, stat: str) -> None:
        outstanding = self._outstanding.pop(request_id, None)
        if outstanding is None or self.member is None:
            return
        self.world.stats[stat] += 1
        if outstanding.kind == "commit":
            self._commit_finished(outstanding)
            return
        assert outstanding.request is not None  # only commits go unsent
        self.member.on_request_failed(outstanding.request, self.world.now)
        self._drain_events()
        self.world.touched(self)

    def _check_install(self, request: ApiMessage, response: m.ConsumerGroupInstallAssignmentResponse) -> None:
        broken = self._invalid_installs.pop(id(request), None)
        if broken is not None and broken[0] is request and response.error_code == 0:
            kind = broken[1]
            self.world.violation(
                "invalid-assignment-installed",
                f"{self.name} ({self.member_id}) installed an assignment broken on purpose ({kind}) and the coordinator accepted it",
            )

    # ------------------------------------------------------------------ application behaviour

    def _drain_events(self) -> None:
        member = self.member
        if member is None:
            return
        world = self.world
        unavailable = False
        for event in member.take_events():
            if isinstance(event, RevokePartitions):
                world.stats["revocations"] += 1
                self._commit(event.partitions, revocation_id=event.revocation_id)
                for partition in event.partitions:
                    self._positions.pop(partition, None)
            elif isinstance(event, PartitionsAssigned):
                for partition in event.partitions:
                    self._positions[partition] = (world.committed_offset(partition), world.now)
            elif isinstance(event, PartitionsLost):
                world.stats["partitions_lost_events"] += 1
                for partition in event.partitions:
                    self._positions.pop(partition, None)
            elif isinstance(event, LeftGroup):
                world.stats["process.left"] += 1
                self._stop()
                world.after_stop(self)
                return
            elif isinstance(event, InstanceIdUnreleased):
                # Its previous incarnation's session has not expired yet: the member retries.
                world.stats["process.unreleased_instance_id"] += 1
            elif isinstance(event, MemberFailed):
                if self._fenced_by_a_forgotten_replacement(event):
                    # Kafka's consumer gives up on FENCED_INSTANCE_ID; its supervisor restarts it.
                    world.stats["process.fenced_after_failover"] += 1
                    self.crash()
                    return
                world.violation("member-failed", f"{self.name} ({self.member_id}) failed: {event.message}")
                return
            elif isinstance(event, AssignmentInstalled):
                world.stats["assignor.installed"] += 1
            elif isinstance(event, AssignmentAbandoned):
                world.stats[f"assignor.abandoned.{event.api}"] += 1
            elif isinstance(event, CoordinatorUnavailable):
                unavailable = True
        if unavailable:
            self._forget_coordinator()  # after the events: it fails requests, which make more

    def note_answer(self, response: object) -> None:
        """The coordinator answers one of this process's requests (any incarnation): keep the
        member id it hands out."""
        member_id = getattr(response, "member_id", None)
        if member_id:
            self.issued_member_ids.setdefault(member_id, len(self.issued_member_ids))

    def _fenced_by_a_forgotten_replacement(self, event: MemberFailed) -> bool:
        """A classic static member that replaced its earlier self while the group rebalanced is
        not written until the next generation's assignment is stored (Kafka writes a static
        replacement only in Stable: GroupMetadataManager's
        updateStaticMemberThenRebalanceOrCompleteJoin appends no record in PreparingRebalance
        or CompletingRebalance); a fail-over meanwhile brings the instance id back mapped to
        the earlier member id — in the classic group the log rebuilds, or in the consumer group
        an online upgrade converts it into (ConsumerGroup.fromClassicGroup keeps the static
        members) — so the new one is told FENCED_INSTANCE_ID (KIP-345: a known instance id
        with another member id is fenced), which Kafka's consumer treats as fatal. That is the
        classic protocol, not a fault: true only when the coordinator maps this process's
        instance id to a member id it handed to this process *before* the one it now fences.
        The earlier id need not have reached the process: the incarnation that joined with it
        may have crashed or left before its JoinGroup answer arrived (a static member sends no
        LeaveGroup), and the fail-over brings it back all the same."""
        member = self.member
        if not isinstance(member, ClassicGroupMember) or event.error_code != Errors.FencedInstanceIdError.errno:
            return False
        shard = self.world.coordinator.shard
        group = shard.groups.get(self.world.group_id) if shard is not None else None
        if not isinstance(group, (ClassicGroup, ConsumerGroup)) or self.spec.instance_id is None:
            return False
        mapped = group.static_members.get(self.spec.instance_id)
        if mapped is None or mapped == member.member_id:
            return False
        earlier, current = self.issued_member_ids.get(mapped), self.issued_member_ids.get(member.member_id)
        return earlier is not None and current is not None and earlier < current

    def _commit(self, partitions: Iterable[TopicIdPartition], revocation_id: int | None = None) -> None:
        """OffsetCommit of these partitions' positions, with the member epoch the app knows."""
        member = self.member
        assert member is not None
        world = self.world
        offsets: dict[str, list] = {}
        for partition in sorted(partitions):
            started = self._positions.get(partition)
            name = world.topic_name(partition.topic_id)
            if started is None or name is None:
                continue
            offset, since = started
            position = offset + (world.now - since) * RECORDS_PER_MS
            offsets.setdefault(name, []).append(CommitPartition(partition_index=partition.partition, committed_offset=position))
        if not offsets or member.member_epoch <= 0:
            if revocation_id is not None:
                self._commit_finished(_Outstanding(None, "commit", revocation_id))
            return
        request = Commit(
            group_id=world.group_id,
            generation_id_or_member_epoch=member.member_epoch,
            member_id=member.member_id,
            group_instance_id=self.spec.instance_id if isinstance(member, ClassicGroupMember) else None,
            topics=[CommitTopic(name=name, partitions=parts) for name, parts in sorted(offsets.items())],
        )
        world.stats["commits.sent"] += 1
        self._send(request, "commit", revocation_id)

    def _commit_finished(self, outstanding: _Outstanding) -> None:
        """Committed (or failed: the app goes on, as a consumer whose commit failed)."""
        if outstanding.revocation_id is None:
            return
        world = self.world
        world.at(world.now + world.revocation_work_ms(), self._revocation_done, self.incarnation, outstanding.revocation_id)

    def _revocation_done(self, incarnation: int, revocation_id: int) -> None:
        if incarnation != self.incarnation or self.member is None:
            return
        self.member.revocation_done(self.world.now, revocation_id)
        self._drain_events()
        self.world.touched(self)

    def _periodic_commit(self, incarnation: int) -> None:
        if incarnation != self.incarnation or self.member is None:
            return
        world = self.world
        if self.member.state in (MemberState.STABLE, MemberState.RECONCILING, MemberState.ACKNOWLEDGING):
            owned = self.member.owned_partitions
            if owned:
                self._commit(owned)
        world.at(world.now + world.timing.commit_interval_ms, self._periodic_commit, incarnation)
