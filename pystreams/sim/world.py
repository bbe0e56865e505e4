"""The simulated world: virtual clock, event loop, network, coordinator node(s), member processes.

A *step* is one event taken from the queue (a message arriving, a member or coordinator timer,
an application callback, a fault). After every step the world re-arms the timers of whatever
the step touched and runs the invariant checks; the first violation stops the run.

Everything random comes from ``random.Random(seed)`` (split into independent streams, so one
component drawing more numbers does not reshuffle the others); nothing reads the wall clock,
and nothing iterates a set of strings (string hashing differs between interpreter runs), so a
seed replays exactly in any process.

With one coordinator node, every process talks to it. With several (``nodes > 1``, see
``pystreams.sim.cluster``), a process finds the node that serves the group with FindCoordinator
(asking the nodes in turn), sends its requests there, and forgets it, as the client's driver
does, when an answer says NOT_COORDINATOR or COORDINATOR_NOT_AVAILABLE, a request times out,
or the connection dies; requests made meanwhile wait until the next node is found.
"""

from __future__ import annotations

import random
import uuid
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import kafka.errors as Errors
from kafka.protocol.api_message import ApiMessage

from pystreams.assignors.api import TopicMetadata
from pystreams.client.member import MemberState
from pystreams.coordinator.classic_group import ClassicGroup, ClassicGroupState
from pystreams.coordinator.config import CoordinatorConfig
from pystreams.coordinator.consumer_group import GroupState
from pystreams.coordinator.context import DEFERRED
from pystreams.coordinator.errors import while_loading
from pystreams.coordinator.subscriptions import subscribed_names
from pystreams.partitions import TopicIdPartition
from pystreams.protocol import consumer_protocol
from pystreams.protocol import messages as m
from pystreams.sim.assignors import Outcome
from pystreams.sim.cluster import ClusterTiming, CoordinatorCluster
from pystreams.sim.coordinator import CoordinatorNode
from pystreams.sim.events import EventQueue
from pystreams.sim.invariants import InvariantChecker, Violation, classic_assignment
from pystreams.sim.network import QUIET_NETWORK, Network, NetworkFaults
from pystreams.sim.process import MemberProcess, ProcessSpec

_LOADING = Errors.CoordinatorLoadInProgressError.errno
_NOT_COORDINATOR = Errors.NotCoordinatorError.errno

#: Where a request went and its answer comes back: with one node, the node's incarnation; with
#: several, (node, the node's incarnation, the process's connection number).
Link = Any


@dataclass(frozen=True)
class Timing:
    """Protocol and application timings of a simulated world (short, so runs stay small)."""

    session_timeout_ms: int = 2_000
    heartbeat_interval_ms: int = 200
    rebalance_timeout_ms: int = 1_000
    request_timeout_ms: int = 600
    retry_backoff_ms: int = 50
    commit_interval_ms: int = 400
    #: A crash-looping process (UNRELEASED_INSTANCE_ID) starts again after this long.
    restart_backoff_ms: int = 300

    def coordinator_config(self) -> CoordinatorConfig:
        return CoordinatorConfig(
            session_timeout_ms=self.session_timeout_ms,
            min_session_timeout_ms=min(self.session_timeout_ms, 100),
            max_session_timeout_ms=max(self.session_timeout_ms, 60_000),
            heartbeat_interval_ms=self.heartbeat_interval_ms,
            min_heartbeat_interval_ms=min(self.heartbeat_interval_ms, 10),
            max_heartbeat_interval_ms=max(self.heartbeat_interval_ms, 15_000),
            classic_min_session_timeout_ms=min(self.session_timeout_ms, 100),
            # A new classic group waits this long for more members before its first assignment.
            initial_rebalance_delay_ms=min(self.rebalance_timeout_ms, 300),
        )


@dataclass(frozen=True)
class Misbehaviour:
    """How badly applications and client-side assignors behave while faults are on."""

    #: Probability an assign() call misbehaves (slow, raise, error or invalid, equally likely).
    assignor: float = 0.0
    #: Probability the application is slow to revoke, and how slow (the default range goes
    #: past the rebalance timeout of the default Timing).
    slow_revocation: float = 0.0
    slow_revocation_ms: tuple[int, int] = (500, 2_000)
    #: Restart delay range after a crash or a leave.
    restart_ms: tuple[int, int] = (50, 300)


CALM = Misbehaviour()


class Simulation:
    def __init__(
        self,
        seed: int,
        timing: Timing | None = None,
        *,
        trace: bool | Literal["all"] = False,
        group_id: str = "sim-group",
        max_steps: int = 400_000,
        nodes: int = 1,
        cluster_timing: ClusterTiming | None = None,
    ) -> None:
        self.seed = seed
        self.timing = timing or Timing()
        self.group_id = group_id
        self.max_steps = max_steps
        root = random.Random(seed)
        # Independent streams: drawing more in one does not shift the others.
        self.rng = random.Random(root.getrandbits(64))  # scenario decisions
        self.net_rng = random.Random(root.getrandbits(64))
        self.app_rng = random.Random(root.getrandbits(64))
        self.assignor_rng = random.Random(root.getrandbits(64))
        self._id_rng = random.Random(root.getrandbits(64))
        # Drawn last, so that the streams above are those of a world with one node.
        self.cluster_rng = random.Random(root.getrandbits(64))

        self.now = 0
        self.steps = 0
        self.queue = EventQueue()
        self.stats: Counter = Counter()
        self.network = Network(self.net_rng, self.queue, lambda: self.now, self.stats)
        self.coordinator = CoordinatorNode(self.timing.coordinator_config(), self._new_member_id, self._answer_later, serving=nodes == 1)
        self.cluster: CoordinatorCluster | None = None
        if nodes > 1:
            self.cluster = CoordinatorCluster(self, nodes, cluster_timing or ClusterTiming(), self.cluster_rng)
        #: The shard incarnation that produced the answer a step delivers (for the invariants).
        self.answer_shard_incarnation: int | None = None
        self.processes: dict[str, MemberProcess] = {}
        self.invariants = InvariantChecker(self)
        self.violations: list[Violation] = []
        self.misbehaviour = CALM
        self.faults_on = False
        #: Convergence counts only members that heartbeated successfully since then: before,
        #: the effects of faults (expiring sessions, lost requests) may still land.
        self.quiet_since_ms = 0
        self._topic_names: dict[uuid.UUID, str] = {}
        self._touched: dict[str, MemberProcess] = {}
        self._coordinator_touched = False
        self._timer_token = 0
        self._timer_at: int | None = None
        self.trace: deque[str] | None = deque(maxlen=400_000 if trace == "all" else 400) if trace else None
        if self.cluster is not None:
            self.cluster.start_all()

    # ------------------------------------------------------------------ identities

    def _new_member_id(self) -> str:
        return f"m{self._id_rng.getrandbits(40):010x}"

    def new_topic_id(self) -> uuid.UUID:
        return uuid.UUID(int=self._id_rng.getrandbits(128))

    def topic_name(self, topic_id: uuid.UUID) -> str | None:
        return self._topic_names.get(topic_id)

    def topic_id(self, name: str) -> uuid.UUID:
        return self.coordinator.topics[name].topic_id

    @property
    def topic_table(self) -> WorldTopics:
        """The cluster's topics as a classic member resolves them (its metadata, always fresh)."""
        return WorldTopics(self)

    def describe_partition(self, partition: TopicIdPartition) -> str:
        return f"{self.topic_name(partition.topic_id) or partition.topic_id}-{partition.partition}"

    def describe_holding(self, process: MemberProcess, partition: TopicIdPartition) -> str:
        """How a process holds a partition, and what the coordinator thinks of that member."""
        member = process.member
        if member is None:
            return f"{process.name} (down)"
        how = "revoking" if partition in member.revoking_partitions else "owned" if partition in member.owned_partitions else "not held"
        shard = self.coordinator.shard or self.coordinator.shadow
        group = shard.groups.get(self.group_id)
        known = group.members.get(member.member_id) if group is not None else None
        if known is None:
            seen = "unknown to the coordinator"
        elif hasattr(known, "member_epoch"):
            seen = f"coordinator epoch {known.member_epoch}"
        else:
            seen = f"a classic member at generation {getattr(group, 'generation', None)}"
        return f"{process.name} ({member.member_id}, {member.state.value}, epoch {member.member_epoch}, {how}; {seen})"

    # ------------------------------------------------------------------ scheduling

    def at(self, at_ms: int, action: Callable[..., Any], *args: Any) -> None:
        self.queue.push(max(at_ms, self.now), action, *args)

    def touched(self, process: MemberProcess) -> None:
        self._touched.setdefault(process.name, process)

    def violation(self, kind: str, message: str) -> None:
        self.violations.append(Violation(kind, self.now, self.steps, message))

    @property
    def failed(self) -> bool:
        return bool(self.violations)

    def step(self) -> None:
        at_ms, action, args = self.queue.pop()
        self.now = at_ms
        self.steps += 1
        if self.trace is not None:
            self.trace.append(f"{at_ms:>7} #{self.steps:<6} {_label(action, args)}")
        try:
            action(*args)
        except Exception as exc:  # a state machine that raises is a finding, not a harness crash
            self.violation("exception", f"{type(exc).__name__} in {_label(action, args)}: {exc}")
            return
        self._after_step()
        self.answer_shard_incarnation = None

    def _after_step(self) -> None:
        touched = list(self._touched.values())
        self._touched.clear()
        for process in touched:
            self._arm_wake(process)
        coordinator_touched, self._coordinator_touched = self._coordinator_touched, False
        if coordinator_touched:
            self._arm_coordinator_timer()
        if not self.violations:
            self.invariants.after_step(touched, coordinator_touched)
        if self.steps >= self.max_steps and not self.violations:
            self.violation("step-budget", f"{self.steps} steps without finishing: a livelock?")

    def _arm_wake(self, process: MemberProcess) -> None:
        member = process.member
        if member is None:
            return
        deadline = member.next_deadline()
        if deadline is None:
            return
        # A wake-up that left work due "now" must not spin in the same instant.
        earliest = self.now + 1 if process.woken_at == self.now else self.now
        deadline = max(deadline, earliest)
        if process.wake_at is None or deadline < process.wake_at:
            process.wake_token += 1
            process.wake_at = deadline
            self.queue.push(deadline, process.wake, process.wake_token)

    def _arm_coordinator_timer(self) -> None:
        deadline = self.coordinator.next_deadline()
        if deadline is None:
            return
        deadline = max(deadline, self.now)
        if self._timer_at is None or deadline < self._timer_at:
            self._timer_token += 1
            self._timer_at = deadline
            self.queue.push(deadline, self._coordinator_timer, self._timer_token)

    def _coordinator_timer(self, token: int) -> None:
        if token != self._timer_token:
            return
        self._timer_at = None
        if self.coordinator.up:
            self.coordinator.expire(self.now)
            self._coordinator_touched = True

    # ------------------------------------------------------------------ running

    def run_until(self, end_ms: int, until: Callable[[], bool] | None = None, probe_every_ms: int = 20) -> bool:
        """Run events up to ``end_ms`` (or until ``until()`` holds, probed every few ms of
        simulated time); True if ``until`` held. Stops at the first violation."""
        next_probe = self.now
        while not self.violations:
            at_ms = self.queue.next_time()
            if at_ms is None or at_ms > end_ms:
                break
            if until is not None and at_ms >= next_probe:
                if until():
                    return True
                next_probe = at_ms + probe_every_ms
            self.step()
        if not self.violations:
            self.now = max(self.now, end_ms)
        return until is not None and not self.violations and until()

    # ------------------------------------------------------------------ the network and the coordinator

    def send_to_coordinator(self, process: MemberProcess, incarnation: int, request_id: int, request: ApiMessage) -> None:
        if self.cluster is None:
            link: Link = self.coordinator.incarnation
        else:
            assert process.coordinator is not None  # the process found one before sending
            link = (*process.coordinator, process.connection)
        self.network.send(process.name, self._arrive_at_coordinator, process, incarnation, request_id, request, link, request=True)

    def _arrive_at_coordinator(self, process: MemberProcess, incarnation: int, request_id: int, request: ApiMessage, link: Link) -> None:
        node = self.coordinator
        if self.cluster is None:
            if link != node.incarnation:
                self.stats["net.lost_in_failover"] += 1
                return
            status = "serving" if node.up else "loading"
        else:
            name, node_incarnation, _ = link
            if not self.cluster.alive(name, node_incarnation):
                # The node died (or restarted): the connection is refused, the request fails.
                self.stats["net.lost_in_failover"] += 1
                self.at(self.now + 1, process.connection_lost, incarnation, link)
                return
            status = self.cluster.status(name)
        if status == "loading":
            self.stats["coordinator.refused_while_loading"] += 1
            response = _error_response(request, _LOADING)
        elif status == "elsewhere":
            self.stats["cluster.not_coordinator"] += 1
            response = _error_response(request, _NOT_COORDINATOR)
        elif isinstance(request, m.OffsetCommitRequest):
            context = self.invariants.before_commit(request)
            response = node.handle(request, self.now, process.name)
            self._coordinator_touched = True
            self.invariants.after_commit(process, request, context, response)
        else:
            response = node.handle(request, self.now, process.name, (process, incarnation, request_id, request, link))
            self._coordinator_touched = True
            if response is DEFERRED:
                return  # a classic long poll: answered when some later event completes it
        self._answer(process, incarnation, request_id, request, response, link)

    def _answer(self, process: MemberProcess, incarnation: int, request_id: int, request: ApiMessage, response: ApiMessage, link: Link) -> None:
        process.note_answer(response)
        self.network.send(process.name, self._arrive_at_member, process, incarnation, request_id, request, response, link, self.coordinator.incarnation)

    def _answer_later(self, route: tuple, response: ApiMessage) -> None:
        """A deferred request's answer leaves the coordinator now."""
        process, incarnation, request_id, request, link = route
        self._answer(process, incarnation, request_id, request, response, link)

    def _arrive_at_member(
        self, process: MemberProcess, incarnation: int, request_id: int, request: ApiMessage, response: ApiMessage, link: Link, shard_incarnation: int
    ) -> None:
        if not self.link_alive(process, link):
            self.stats["net.lost_in_failover"] += 1  # the connection to that coordinator is gone
            return
        self.answer_shard_incarnation = shard_incarnation
        process.on_answer(incarnation, request_id, request, response)

    def link_alive(self, process: MemberProcess, link: Link) -> bool:
        """Whether the connection a message went over still stands."""
        if self.cluster is None:
            return bool(link == self.coordinator.incarnation)
        name, node_incarnation, connection = link
        return self.cluster.alive(name, node_incarnation) and connection == process.connection

    def find_coordinator(self, process: MemberProcess, incarnation: int, token: int, name: str) -> None:
        """``process`` asks node ``name`` which node serves the group."""
        assert self.cluster is not None
        self.stats["cluster.find_coordinator"] += 1
        node_incarnation = self.cluster.nodes[name].incarnation if self.cluster.nodes[name].up else None
        self.network.send(process.name, self._find_arrives, process, incarnation, token, name, node_incarnation, request=True)

    def _find_arrives(self, process: MemberProcess, incarnation: int, token: int, name: str, node_incarnation: int | None) -> None:
        cluster = self.cluster
        assert cluster is not None
        if node_incarnation is None or not cluster.alive(name, node_incarnation):
            self.at(self.now + 1, process.found, incarnation, token, None)  # refused
            return
        owner = cluster.locate(name)
        self.network.send(process.name, self._found_arrives, process, incarnation, token, name, node_incarnation, owner)

    def _found_arrives(self, process: MemberProcess, incarnation: int, token: int, name: str, node_incarnation: int, owner: str | None) -> None:
        cluster = self.cluster
        assert cluster is not None
        if not cluster.alive(name, node_incarnation):
            return  # that connection died with its node: the lookup times out
        # The process connects to the node named; a node that is down refuses.
        found = (owner, cluster.nodes[owner].incarnation) if owner is not None and cluster.nodes[owner].up else None
        process.found(incarnation, token, found)

    def committed_offset(self, partition: TopicIdPartition) -> int:
        """The committed offset a new owner starts from (an OffsetFetch that cannot fail)."""
        name = self.topic_name(partition.topic_id)
        value = self.coordinator.shadow.offsets.of(self.group_id).get((name, partition.partition)) if name else None
        return value.offset if value is not None else 0

    # ------------------------------------------------------------------ world changes

    def create_topic(self, name: str, partitions: int) -> None:
        topics = dict(self.coordinator.topics)
        topics[name] = TopicMetadata(self.new_topic_id(), name, partitions)
        self._topic_names[topics[name].topic_id] = name
        self._update_topics(topics)

    def add_partitions(self, name: str, count: int) -> None:
        topics = dict(self.coordinator.topics)
        old = topics[name]
        topics[name] = TopicMetadata(old.topic_id, name, old.num_partitions + count)
        self._update_topics(topics)

    def _update_topics(self, topics: dict[str, TopicMetadata]) -> None:
        self.stats["topics.changes"] += 1
        self.coordinator.update_topics(topics, self.now)
        self._coordinator_touched = True
        for process in self.processes.values():
            if process.running and process.spec.classic_assignor is not None:
                # Its next metadata refresh (metadata.max.age.ms, short here) sees the change.
                self.at(self.now + self.rng.randint(1, 500), process.metadata_refreshed, process.incarnation)

    def add_process(self, spec: ProcessSpec, start: bool = True) -> MemberProcess:
        process = MemberProcess(self, spec)
        self.processes[spec.name] = process
        process.wanted = start
        if start:
            process.start()
        return process

    def restart_if_wanted(self, process: MemberProcess) -> None:
        if process.wanted and not process.running:
            process.start()

    def after_stop(self, process: MemberProcess) -> None:
        """A process stopped (crashed or left): a wanted one comes back after a while."""
        if process.wanted:
            low, high = self.misbehaviour.restart_ms if self.faults_on else CALM.restart_ms
            self.at(self.now + self.rng.randint(low, high), self.restart_if_wanted, process)

    def fail_over(self, load_ms: int) -> None:
        """The coordinator dies now; a new one, replaying the log, serves after ``load_ms``
        (one node: with several, nodes die and the shard moves, ``pystreams.sim.cluster``)."""
        assert self.cluster is None
        if not self.coordinator.up:
            return
        self.kill_shard()
        self.at(self.now + load_ms, self.load_shard)

    def kill_shard(self) -> None:
        """The node serving the shard dies: the connections of the requests it held close."""
        self.stats["coordinator.failovers"] += 1
        for process, incarnation, request_id, _request, link in self.coordinator.crash():
            self.at(self.now + 1, process.connection_closed, incarnation, request_id, link)
        self._timer_token += 1
        self._timer_at = None

    def release_shard(self) -> None:
        """The node serving the shard gives it up and stays up: it answers the requests the shard
        held with NOT_COORDINATOR, as the runtime answers a released shard's deferred requests."""
        self.stats["cluster.releases"] += 1
        for process, incarnation, request_id, request, link in self.coordinator.crash():
            self._answer(process, incarnation, request_id, request, _error_response(request, _NOT_COORDINATOR), link)
        self._timer_token += 1
        self._timer_at = None

    def load_shard(self) -> None:
        """A node has replayed the log: its shard serves from now on."""
        replayed = self.coordinator.load(self.now)
        self.invariants.check_failover(self.coordinator.snapshot_at_death, replayed)
        self._coordinator_touched = True

    def cut(self, names: list[str], duration_ms: int) -> None:
        for name in names:
            self.network.cut.add(name)
        self.stats["net.partitions"] += 1
        self.at(self.now + duration_ms, self.heal, names)

    def heal(self, names: list[str] | None = None) -> None:
        if names is None:
            self.network.cut.clear()
        else:
            for name in names:
                self.network.cut.discard(name)

    def set_faults(self, network: NetworkFaults, misbehaviour: Misbehaviour) -> None:
        self.faults_on = True
        self.network.faults = network
        self.misbehaviour = misbehaviour

    def stop_faults(self, network: NetworkFaults = QUIET_NETWORK) -> None:
        """Faults stop: a calm network, no cut links, well-behaved apps and assignors; every
        process that should run runs (or restarts once its leave completes)."""
        self.faults_on = False
        self.network.faults = network
        self.misbehaviour = CALM
        self.heal()
        if self.cluster is not None:
            self.cluster.start_all()
        for process in self.processes.values():
            self.restart_if_wanted(process)

    # ------------------------------------------------------------------ application and assignor behaviour

    def revocation_work_ms(self) -> int:
        """How long an application works on a revocation after its commit."""
        if self.faults_on and self.app_rng.random() < self.misbehaviour.slow_revocation:
            self.stats["app.slow_revocations"] += 1
            return self.app_rng.randint(*self.misbehaviour.slow_revocation_ms)
        return self.app_rng.randint(0, 20)

    def assignor_outcome(self) -> Outcome:
        if self.faults_on and self.assignor_rng.random() < self.misbehaviour.assignor:
            outcome = self.assignor_rng.choice((Outcome.SLOW, Outcome.RAISE, Outcome.ERROR, Outcome.INVALID))
            self.stats[f"assignor.{outcome.value}"] += 1
            return outcome
        return Outcome.VALID

    def assignor_slow_ms(self) -> int:
        return self.assignor_rng.randint(50, self.timing.rebalance_timeout_ms * 2)

    # ------------------------------------------------------------------ convergence

    def live_processes(self) -> list[MemberProcess]:
        return [p for p in self.processes.values() if p.running]

    def subscribed_partitions(self) -> frozenset[TopicIdPartition]:
        """Every partition some running process subscribes to (by the cluster's topics)."""
        topics = self.coordinator.topics
        names: set[str] = set()
        for process in self.live_processes():
            names |= subscribed_names(process.spec.topics or (), process.spec.regex, topics)
        return frozenset(TopicIdPartition(topics[n].topic_id, p) for n in sorted(names) for p in range(topics[n].num_partitions))

    def convergence_gap(self) -> str | None:
        """None once the group is Stable with every wanted process in it, at the group's current
        epoch (a consumer group's assignment epoch, a classic group's generation), owning exactly
        what the group gives it (its target, or the leader's assignment), together covering every
        subscribed partition; otherwise what is still missing."""
        shard = self.coordinator.shard
        if shard is None:
            return "the coordinator is loading"
        if self.cluster is not None and not self.cluster.settled():
            return "the coordinator nodes are moving the shard"
        wanted = [p for p in self.processes.values() if p.wanted]
        if any(not p.running for p in wanted) or any(p.running and not p.wanted for p in self.processes.values()):
            return "processes are starting or stopping"
        group = shard.groups.get(self.group_id)
        if not wanted:
            return None if group is None or not group.members else "members remain in an abandoned group"
        if group is None:
            return "no group"
        if isinstance(group, ClassicGroup):
            classic = group
            stable, epoch_name, epoch = group.state is ClassicGroupState.STABLE, "generation", group.generation
            must_cover = True

            def held_by(member_id: str) -> frozenset[TopicIdPartition]:
                return classic_assignment(self, classic.members[member_id].assignment)

        else:
            consumer = group
            stable, epoch_name, epoch = group.state is GroupState.STABLE, "assignment epoch", group.assignment_epoch
            must_cover = group.assignment_error == 0

            def held_by(member_id: str) -> frozenset[TopicIdPartition]:
                return frozenset(TopicIdPartition(t, p) for t, p in consumer.target_of(member_id))

        if not stable:
            return f"{group.group_type} group is {group.state.value} ({epoch_name} {epoch})"
        member_ids = sorted(p.member_id for p in wanted)
        if member_ids != sorted(group.members):
            return f"members {sorted(group.members)} != processes {member_ids}"
        covered: set[TopicIdPartition] = set()
        for process in wanted:
            member = process.member
            assert member is not None
            if process.last_heartbeat_ok_ms is None or process.last_heartbeat_ok_ms < self.quiet_since_ms:
                return f"{process.name} has not heartbeated successfully since faults stopped"
            if member.state is not MemberState.STABLE or member.member_epoch != epoch:
                return f"{process.name} is {member.state.value} at epoch {member.member_epoch} ({epoch_name} {epoch})"
            held = held_by(member.member_id)
            if process.view() != held:
                return f"{process.name} owns {len(process.view())} partitions, the group gives it {len(held)}"
            covered |= held
        if must_cover and covered != self.subscribed_partitions():
            return f"the group gives out {len(covered)} of {len(self.subscribed_partitions())} subscribed partitions"
        return None

    def converged(self) -> bool:
        return self.convergence_gap() is None

    def fingerprint(self) -> str:
        """A digest of the whole run: equal for two runs of the same seed, in any process."""
        import hashlib

        import msgspec

        digest = hashlib.sha256()
        digest.update(f"{self.steps}/{self.now}/{sorted(self.stats.items())}".encode())
        for record in self.coordinator.log:
            digest.update(msgspec.msgpack.encode(record))
        return digest.hexdigest()[:16]


class WorldTopics:
    """A ``TopicResolver`` over the simulated cluster's topics."""

    def __init__(self, world: Simulation) -> None:
        self._world = world

    def topic(self, name: str) -> TopicMetadata | None:
        return self._world.coordinator.topics.get(name)

    def name_of(self, topic_id: uuid.UUID) -> str | None:
        return self._world.topic_name(topic_id)

    def topic_names(self) -> list[str]:
        return sorted(self._world.coordinator.topics)


def _error_response(request: ApiMessage, error: int) -> ApiMessage:
    """What a node answers when it cannot serve the request: COORDINATOR_LOAD_IN_PROGRESS while
    its shard loads (two classic requests get other codes: ``while_loading``) or
    NOT_COORDINATOR (every request)."""
    if isinstance(request, (m.SyncGroupRequest, m.HeartbeatRequest)) and error == _LOADING:
        error = while_loading(request)
    if isinstance(request, m.ConsumerGroupHeartbeatRequest):
        return m.ConsumerGroupHeartbeatResponse(error_code=error, member_epoch=-1, heartbeat_interval_ms=0)
    if isinstance(request, m.ConsumerGroupPrepareAssignmentRequest):
        return m.ConsumerGroupPrepareAssignmentResponse(error_code=error)
    if isinstance(request, m.ConsumerGroupInstallAssignmentRequest):
        return m.ConsumerGroupInstallAssignmentResponse(error_code=error)
    if isinstance(request, m.OffsetCommitRequest):
        Topic = m.OffsetCommitResponse.OffsetCommitResponseTopic
        return m.OffsetCommitResponse(
            topics=[
                Topic(name=t.name, partitions=[Topic.OffsetCommitResponsePartition(partition_index=p.partition_index, error_code=error) for p in t.partitions])
                for t in request.topics
            ]
        )
    if isinstance(request, m.JoinGroupRequest):
        return m.JoinGroupResponse(error_code=error, generation_id=-1, member_id=request.member_id, members=[])
    if isinstance(request, m.SyncGroupRequest):
        return m.SyncGroupResponse(error_code=error, assignment=b"")
    if isinstance(request, m.HeartbeatRequest):
        return m.HeartbeatResponse(error_code=error)
    if isinstance(request, m.LeaveGroupRequest):
        return m.LeaveGroupResponse(error_code=error, members=[])
    raise TypeError(f"no error answer for {type(request).__name__}")


def _label(action: Callable[..., Any], args: tuple) -> str:
    """A short description of an event for traces."""
    owner = getattr(action, "__self__", None)
    prefix = f"{owner.name}." if isinstance(owner, MemberProcess) else ""
    return f"{prefix}{getattr(action, '__qualname__', 'event')}({_describe_args(args)})"


def _describe_args(args: tuple) -> str:
    parts = []
    for arg in args:
        if isinstance(arg, MemberProcess):
            parts.append(arg.name)
        elif hasattr(arg, "API_KEY"):
            parts.append(_describe_message(arg))
        elif callable(arg):
            parts.append(getattr(arg, "__qualname__", "fn"))
        elif isinstance(arg, tuple):
            parts.append(f"({_describe_args(arg)})")
        elif isinstance(arg, (int, str)):
            parts.append(str(arg))
    return ", ".join(parts)


def _describe_message(message: Any) -> str:
    kind = type(message).__name__
    fields = []
    for attribute in ("member_id", "member_epoch", "error_code", "generation_id_or_member_epoch", "group_epoch", "generation_id", "leader"):
        value = getattr(message, attribute, None)
        if value not in (None, ""):
            fields.append(f"{attribute}={value}")
    assignment = getattr(message, "assignment", None)
    if isinstance(assignment, bytes):  # a classic SyncGroup answer
        fields.append(f"assigned={_classic_partition_count(assignment)}")
    elif assignment is not None:
        fields.append(f"assigned={sum(len(t.partitions) for t in assignment.assigned_topic_partitions)}")
    owned = getattr(message, "topic_partitions", None)
    if owned is not None and kind.endswith("Request"):
        fields.append(f"owned={sum(len(t.partitions) for t in owned)}")
    return f"{kind}[{' '.join(fields)}]"


def _classic_partition_count(data: bytes) -> int | str:
    if not data:
        return 0
    try:
        return sum(len(p) for p in consumer_protocol.decode_assignment(data).partitions.values())
    except Exception:  # a trace line must not fail on bytes it cannot read
        return "?"
