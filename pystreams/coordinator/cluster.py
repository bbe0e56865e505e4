"""Coordinator nodes that share the shards: which node owns which partition of the record log.

Ownership is decided through the Kafka cluster itself, not by a protocol of our own. Every
``pystreams coordinator --cluster`` node joins one classic consumer group of the brokers
(``<log topic>.coordinators``) subscribed to the log topic; the brokers' group membership notices
a node that stops (its session times out) or leaves (LeaveGroup on a graceful stop), and the
group's leader spreads the log's partitions — the shards — over the nodes with
:class:`ShardAssignor`:

* balanced (each node ``shards // nodes`` or one more) and sticky (a node keeps what it owns up to
  its share), so a node joining or leaving moves only the shards it must;
* a shard moves in two rounds, as KIP-429's cooperative protocol moves a partition: in the first
  its old owner loses it and releases it (answers what it queued, finishes its append, closes its
  writer), in the second its new owner claims it. The claim fences any writer still left (a node
  that stopped answering), exactly as a single coordinator's restart does, so two nodes never
  both write a shard, whatever the timing;
* every node's assignment carries the whole :class:`ShardMap` (shard → node, node → address), so
  every node answers FindCoordinator for any group with the same owner and lists every node in
  Metadata. A shard between owners has none: FindCoordinator answers COORDINATOR_NOT_AVAILABLE
  and clients retry.

:func:`plan_shards` is the rule, sans-IO; :class:`ShardAssignor` is kafka-python's glue around it;
:class:`ShardOwnership` runs the group member on a thread of its own and hands the changes to
the event loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec
from kafka.coordinator.assignors.abstract import AbstractPartitionAssignor, RebalanceProtocol
from kafka.protocol.consumer.metadata import ConsumerProtocolAssignment, ConsumerProtocolSubscription

from pystreams.serdes import UNDECODABLE

log = logging.getLogger(__name__)

__all__ = ["ClusterView", "DuplicateNodeId", "MembershipLease", "NodeInfo", "ShardAssignor", "ShardMap", "ShardOwnership", "keep_serving", "plan_shards"]

#: The assignor's protocol name in the coordinators' group.
PROTOCOL_NAME = "pystreams-shards"


#: What a node may claim to be: FindCoordinator and Metadata answer these (int32 ids, a
#: host name, a TCP port), so a node metadata or a shard map outside them is unreadable.
NodeId = Annotated[int, msgspec.Meta(ge=0, le=2**31 - 1)]
Host = Annotated[str, msgspec.Meta(min_length=1, max_length=255)]
Port = Annotated[int, msgspec.Meta(ge=1, le=65_535)]


class NodeInfo(msgspec.Struct, frozen=True, array_like=True):
    """A coordinator node as clients reach it."""

    node_id: NodeId
    host: Host
    port: Port


class ShardMap(msgspec.Struct, frozen=True, array_like=True):
    """Who serves each shard: ``owners[shard]`` is a node id, or None while the shard moves."""

    generation: int
    owners: tuple[NodeId | None, ...]
    nodes: tuple[NodeInfo, ...]

    def owner(self, shard: int) -> NodeInfo | None:
        node_id = self.owners[shard] if 0 <= shard < len(self.owners) else None
        if node_id is None:
            return None
        return next((node for node in self.nodes if node.node_id == node_id), None)


_encode = msgspec.msgpack.Encoder().encode
#: What reading another node's bytes may raise (TypeError: user data that is not bytes).
_UNREADABLE = (*UNDECODABLE, TypeError)
_decode_node = msgspec.msgpack.Decoder(NodeInfo).decode
_decode_map = msgspec.msgpack.Decoder(ShardMap).decode


@dataclass(frozen=True, slots=True)
class ShardPlan:
    """``final``: where every shard goes; ``now``: what each member may own in this round (a
    shard moving between two members is nobody's until its old owner released it)."""

    final: dict[str, list[int]]
    now: dict[str, list[int]]


def plan_shards(shard_count: int, members: Iterable[str], owned: Mapping[str, Collection[int]]) -> ShardPlan:
    """Balanced and sticky: each member gets ``shard_count // len(members)`` shards or one more
    (those already owning the most get the extra ones), keeping what it owns up to that; the
    rest go to whoever is below its share, lowest shard first. Deterministic for the same
    input, whoever leads."""
    names = sorted(set(members))
    if not names:
        return ShardPlan({}, {})
    current: dict[int, str] = {}
    claimants: dict[int, set[str]] = {}
    for member in sorted(owned, key=lambda m: (-len(owned[m]), m)):
        if member in names:
            for shard in sorted(owned[member]):
                if 0 <= shard < shard_count:
                    current.setdefault(shard, member)  # a shard claimed twice stays with the first
                    claimants.setdefault(shard, set()).add(member)
    base, extra = divmod(shard_count, len(names))
    by_holding = sorted(names, key=lambda m: (-sum(1 for owner in current.values() if owner == m), m))
    quota = {member: base + (1 if rank < extra else 0) for rank, member in enumerate(by_holding)}
    final: dict[str, list[int]] = {member: [] for member in names}
    free: list[int] = []
    for shard in range(shard_count):
        owner = current.get(shard)
        if owner is not None and len(final[owner]) < quota[owner]:
            final[owner].append(shard)
        else:
            free.append(shard)
    for shard in free:
        member = next(m for m in names if len(final[m]) < quota[m])
        final[member].append(shard)
    # A shard is handed over only once nobody else holds it: not even a member that claims it
    # by mistake (say, one the group evicted and that has not noticed yet).
    now = {member: [s for s in shards if claimants.get(s, {member}) == {member}] for member, shards in final.items()}
    return ShardPlan(final, now)


def shard_map(generation: int, plan: ShardPlan, nodes: Mapping[str, NodeInfo], shard_count: int) -> ShardMap:
    owners: list[int | None] = [None] * shard_count
    for member, shards in plan.now.items():
        for shard in shards:
            owners[shard] = nodes[member].node_id
    listed = sorted({node.node_id: node for node in nodes.values()}.values(), key=lambda node: node.node_id)
    return ShardMap(generation, tuple(owners), tuple(listed))


class MembershipLease:
    """How long a node may act on its membership of the coordinators' group without word from
    the brokers (sans-IO: times are the caller's monotonic seconds).

    The brokers keep a member for a session timeout after the last request of it they
    received, and a request is received after it was sent. So a node that counts the session
    from when it *sent* the last request the brokers accepted (a heartbeat answered without
    error, or the JoinGroup of its assignment) stops serving no later than the brokers can
    give its shards to another node. Without it, a node cut off from the brokers but not from
    its clients (a zombie) would keep answering heartbeats from memory, partitions that the
    new owner of its shards hands on included.
    """

    def __init__(self, duration_s: float) -> None:
        self.duration_s = duration_s
        #: When the newest accepted request was sent; None: no membership to act on.
        self.confirmed_at: float | None = None

    def confirm(self, sent_at: float) -> None:
        """The brokers accepted a request sent at ``sent_at`` (an older one changes nothing)."""
        if self.confirmed_at is None or sent_at > self.confirmed_at:
            self.confirmed_at = sent_at

    def end(self) -> None:
        """The membership is gone (left, lost or failed): nothing to act on until confirmed."""
        self.confirmed_at = None

    def expires_at(self) -> float | None:
        return None if self.confirmed_at is None else self.confirmed_at + self.duration_s

    def valid(self, now: float) -> bool:
        expires = self.expires_at()
        return expires is not None and now < expires


# --- kafka-python's side ----------------------------------------------------------------------


class ShardAssignor(AbstractPartitionAssignor):
    """The coordinators' group assignor: :func:`plan_shards` over the log topic's partitions,
    moving cooperatively; every assignment carries the whole :class:`ShardMap`."""

    name = PROTOCOL_NAME
    version = 1  # ConsumerProtocolSubscription v1 carries OwnedPartitions (KIP-429)

    def __init__(
        self,
        node: NodeInfo,
        on_map: Callable[[ShardMap, list[int]], None],
        owned_now: Callable[[], Iterable[int]] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``owned_now()``: the shards this member holds now (its consumer's assignment, empty
        once the group evicted it); without it, those of its last assignment."""
        self.node = node
        self._on_map = on_map
        self._owned_now = owned_now
        self._clock = clock
        self.owned: list[int] = []
        self._generation = 0
        #: When this node last built its JoinGroup's metadata: no later than the JoinGroup was
        #: sent, so the assignment that request led to is a membership confirmed from then.
        self.join_sent_at: float | None = None

    def supported_protocols(self) -> list[Any]:
        return [RebalanceProtocol.COOPERATIVE]

    def metadata(self, topics: Iterable[str]) -> Any:
        self.join_sent_at = self._clock()
        topics = sorted(topics)
        held = sorted(self._owned_now()) if self._owned_now is not None else self.owned
        owned = [ConsumerProtocolSubscription.TopicPartition(topic=topics[0], partitions=held)] if topics and held else []
        return ConsumerProtocolSubscription(version=self.version, topics=topics, user_data=_encode(self.node), owned_partitions=owned)

    def assign(self, cluster: Any, members: Iterable[Any]) -> dict[str, Any]:
        members = list(members)
        topics = sorted({topic for member in members for topic in member.metadata.topics})
        if len(topics) != 1:
            raise ValueError(f"the coordinators' group must follow one log topic, not {topics}")
        [topic] = topics
        shard_count = len(cluster.partitions_for_topic(topic) or ())
        nodes: dict[str, NodeInfo] = {}
        owned: dict[str, list[int]] = {}
        for member in members:
            try:
                nodes[member.member_id] = _decode_node(member.metadata.user_data)
            except _UNREADABLE as error:
                log.error("coordinator group member %s sent unreadable node metadata (%s): it gets no shard", member.member_id, error)
                continue
            owned[member.member_id] = [p for tp in (member.metadata.owned_partitions or ()) if tp.topic == topic for p in tp.partitions]
        # Two nodes with one id cannot both be named: the one already holding shards (then the
        # lowest member id) keeps it, the other gets nothing and, seeing its id with another
        # address in the map, stops (ShardOwnership).
        by_id: dict[int, str] = {}
        for member_id in sorted(nodes, key=lambda m: (-len(owned[m]), m)):
            kept = by_id.setdefault(nodes[member_id].node_id, member_id)
            if kept != member_id:
                log.error("coordinator node id %d is used twice (%s and %s): the second gets no shard", nodes[member_id].node_id, kept, member_id)
                del nodes[member_id], owned[member_id]
        self._generation += 1
        plan = plan_shards(shard_count, nodes, owned)
        mapped = _encode(shard_map(self._generation, plan, nodes, shard_count))
        assignments = {
            member.member_id: ConsumerProtocolAssignment(self.version, [(topic, sorted(plan.now.get(member.member_id, [])))], mapped) for member in members
        }
        log.info("coordinator shards: %s", {nodes[m].node_id: shards for m, shards in plan.final.items()})
        return assignments

    def on_assignment(self, assignment: Any, generation: int) -> None:
        self.owned = sorted(tp.partition for tp in assignment.partitions())
        try:
            mapped = _decode_map(assignment.user_data)
        except _UNREADABLE as error:
            log.error("the coordinators' group leader sent an unreadable shard map (%s); keeping the last one", error)
            return
        self._on_map(mapped, self.owned)


class DuplicateNodeId(Exception):
    """Another coordinator node of the cluster uses this node's id."""


class ShardOwnership:
    """One coordinator node's membership of the coordinators' group, on a thread of its own.

    ``release(shard)`` is a coroutine function run on ``loop``. The group waits for the
    releases of a round (run together, each bounded by ``release_timeout_s``, a third of the
    session so that the membership is not lost meanwhile) before it moves on, so a shard's new
    owner claims it once it is let go. ``on_map`` gets every new :class:`ShardMap` (None when
    this node is out of the group); :func:`keep_serving` acquires what the map gives this node.
    A membership that fails (the brokers unreachable, say) releases every shard and joins again
    after a pause; one that finds its node id taken stops for good (``failure``).
    """

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        node: NodeInfo,
        *,
        loop: asyncio.AbstractEventLoop,
        release: Callable[[int], Any],
        served: Callable[[], Iterable[int]],
        on_map: Callable[[ShardMap | None], None],
        session_timeout_ms: int = 10_000,
        heartbeat_interval_ms: int = 1_000,
        client_config: Mapping[str, Any] | None = None,
        retry_backoff_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.group_id = f"{topic}.coordinators"
        self._bootstrap = bootstrap_servers
        self._topic = topic
        self.node = node
        self._loop = loop
        self._release, self._served, self._on_map = release, served, on_map
        self._session_timeout_ms = session_timeout_ms
        self._heartbeat_interval_ms = heartbeat_interval_ms
        self._release_timeout_s = session_timeout_ms / 1000 / 3
        self._client_config = dict(client_config or {})
        self._retry_backoff_s = retry_backoff_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pystreams-shard-ownership", daemon=True)
        #: Why this node stopped taking part for good (its node id is taken); None otherwise.
        self.failure: BaseException | None = None
        self.map: ShardMap | None = None
        #: The shards the group gives this node now: set with each assignment, emptied of what
        #: is revoked or lost (an evicted node's map is stale until it joins again; this is not).
        self.held: frozenset[int] = frozenset()
        self._clock = clock
        #: Renewed by every heartbeat the brokers accept and by every assignment: once it
        #: lapses the node answers nothing for any shard (``why_not_serving``).
        self.lease = MembershipLease(session_timeout_ms / 1000)
        self._assignor: ShardAssignor | None = None

    def start(self) -> None:
        self._thread.start()

    def serving(self) -> bool:
        """Whether this node takes part: a member of the group, with a shard map."""
        return self._thread.is_alive() and self.failure is None and self.map is not None

    def why_not_serving(self) -> str | None:
        """Why this node must not answer for any shard now (None: it may answer for those it
        serves): its membership lapsed, so the brokers may have handed its shards on."""
        if self.lease.valid(self._clock()):
            return None
        if self.lease.confirmed_at is None:
            return "this coordinator is not a member of the coordinators' group"
        return f"this coordinator has had no word from the brokers for {self.lease.duration_s:g} s: its shards may have moved"

    async def stop(self) -> None:
        """Leave the group (the others take the shards over at once), after releasing ours."""
        self._stop.set()
        await asyncio.get_running_loop().run_in_executor(None, self._thread.join, self._session_timeout_ms / 1000 + 10)

    # -- the thread ------------------------------------------------------------------------------

    def _release_now(self, shards: Iterable[int]) -> None:
        """Release ``shards`` together on the loop; wait (bounded) for them."""
        shards = sorted(set(shards))
        if not shards:
            return

        async def release_all() -> None:
            await asyncio.gather(*(self._release(shard) for shard in shards))

        future = asyncio.run_coroutine_threadsafe(release_all(), self._loop)
        try:
            future.result(self._release_timeout_s)
        except (TimeoutError, concurrent.futures.TimeoutError):
            log.warning("shards %s: not released within %.1f s; their next owners' claims fence them", shards, self._release_timeout_s)
        except Exception:
            log.exception("shards %s: releasing them failed", shards)

    def _publish(self, mapped: ShardMap | None) -> None:
        self.map = mapped
        if mapped is None:
            self.held = frozenset()
            self.lease.end()
        self._loop.call_soon_threadsafe(self._on_map, mapped)

    def _mapped(self, mapped: ShardMap, owned: list[int]) -> None:
        me = next((node for node in mapped.nodes if node.node_id == self.node.node_id), None)
        if me is not None and me != self.node:
            # Stop for good (the thread leaves the group); the command sees ``failure``.
            self.failure = DuplicateNodeId(f"node id {self.node.node_id} is taken by the coordinator at {me.host}:{me.port}: give each node its own --node-id")
            log.error("%s", self.failure)
            self._stop.set()
            return
        if self._assignor is not None and self._assignor.join_sent_at is not None:
            self.lease.confirm(self._assignor.join_sent_at)
        self.held = frozenset(owned)
        self._publish(mapped)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._member()
            except Exception:
                log.exception("coordinator group membership failed; releasing every shard and joining again in %.0f s", self._retry_backoff_s)
                self._leave_quietly()
                self._stop.wait(self._retry_backoff_s)

    def _leave_quietly(self) -> None:
        self._publish(None)
        self._release_now(self._served())

    def _confirming(self, send_heartbeat: Callable[[], Awaitable[Any]]) -> Callable[[], Awaitable[Any]]:
        """kafka-python's heartbeat request, renewing the lease from its send time when the
        brokers answer it without error (REBALANCE_IN_PROGRESS and the rest raise)."""

        async def send_and_confirm() -> Any:
            sent_at = self._clock()
            answer = await send_heartbeat()
            self.lease.confirm(sent_at)
            return answer

        return send_and_confirm

    def _member(self) -> None:
        from kafka import KafkaConsumer
        from kafka.consumer.subscription_state import ConsumerRebalanceListener

        ownership = self
        consumer: Any = None

        class Listener(ConsumerRebalanceListener):
            def on_partitions_revoked(self, revoked: Any) -> None:
                gone = {tp.partition for tp in revoked}
                ownership.held = ownership.held - gone
                log.info("shards %s: moving to other coordinators (or lost with the membership); releasing them", sorted(gone))
                ownership._release_now(gone)

            def on_partitions_assigned(self, assigned: Any) -> None:
                consumer.pause(*assigned)  # the group decides ownership; the shards read their own partitions

        assignor = ShardAssignor(self.node, self._mapped, owned_now=lambda: [tp.partition for tp in consumer.assignment()], clock=self._clock)
        self._assignor = assignor
        try:
            consumer = KafkaConsumer(
                bootstrap_servers=self._bootstrap,
                group_id=self.group_id,
                client_id=f"pystreams-coordinator-{self.node.node_id}",
                enable_auto_commit=False,
                partition_assignment_strategy=[assignor],
                session_timeout_ms=self._session_timeout_ms,
                heartbeat_interval_ms=self._heartbeat_interval_ms,
                max_poll_interval_ms=max(self._session_timeout_ms, 30_000),
                **self._client_config,
            )
            # The heartbeats run on kafka-python's own thread; wrapping its request is the one
            # place that knows when an accepted one was sent (the lease needs the send time).
            group_member = consumer._coordinator
            group_member._send_heartbeat_request = self._confirming(group_member._send_heartbeat_request)
            consumer.subscribe([self._topic], listener=Listener())
            while not self._stop.is_set():
                consumer.poll(timeout_ms=200)
        finally:
            if consumer is not None:
                try:
                    self._release_now(tp.partition for tp in consumer.assignment())
                    consumer.close()  # LeaveGroup: the other nodes take the shards over now
                except Exception:
                    log.warning("leaving the coordinators' group failed", exc_info=True)


class ClusterView:
    """What a node of the cluster tells clients, from the latest :class:`ShardMap`: the node
    that coordinates a group (FindCoordinator) and every node (Metadata)."""

    def __init__(self, shard_for: Callable[[str], int], me: Callable[[], Any], served_here: Callable[[str], str | None]) -> None:
        """``me()``: this node's address (a ``BrokerAddress``); ``served_here(group)``: why this
        node does not serve a group it owns by the map (None: it does, or is loading it)."""
        self._shard_for, self._me, self._served_here = shard_for, me, served_here
        self.map: ShardMap | None = None
        self.changed = asyncio.Event()

    def update(self, mapped: ShardMap | None) -> None:
        if mapped != self.map:
            log.info("shard map: %s", None if mapped is None else {shard: owner for shard, owner in enumerate(mapped.owners)})
        self.map = mapped
        self.changed.set()

    def mine(self) -> set[int] | None:
        """The shards the map gives this node (None: no map)."""
        if self.map is None:
            return None
        me = self._me().node_id
        return {shard for shard, owner in enumerate(self.map.owners) if owner == me}

    def settled_here(self, serves: Callable[[int], bool]) -> bool:
        """Ready: a map in which every shard has an owner, and this node serves its own."""
        mine = self.mine()
        return mine is not None and self.map is not None and None not in self.map.owners and all(serves(shard) for shard in mine)

    def locate(self, group_id: str) -> Any:
        from pystreams.protocol.server import BrokerAddress

        shard = self._shard_for(group_id)
        if self.map is None:
            return "this coordinator is not in the coordinators' group now"
        owner = self.map.owner(shard)
        if owner is None:
            return f"shard {shard} is moving between coordinators"
        me = self._me()
        if owner.node_id == me.node_id:
            return self._served_here(group_id) or me
        return BrokerAddress(owner.node_id, owner.host, owner.port)

    def nodes(self) -> list[Any]:
        from pystreams.protocol.server import BrokerAddress

        if self.map is None:
            return []
        return [BrokerAddress(node.node_id, node.host, node.port) for node in self.map.nodes]


async def keep_serving(
    view: ClusterView,
    coordinator: Any,
    held: Callable[[], Collection[int]],
    *,
    recheck_s: float = 1.0,
    refence_backoff_s: float = 10.0,
    hot_standby: bool = False,
) -> None:
    """Serve what the group gives this node, and only that: acquire each of its shards that is
    not served here, release any other. A shard is this node's when the map names it and the
    group membership holds it now (``held()``: an evicted node's map is stale until it joins
    again). A shard that failed here — fenced by a late writer — is loaded again, but only
    ``refence_backoff_s`` after it failed: a node that does not know yet that it was evicted
    must not fence the rightful owner back and forth. With ``hot_standby``, every shard another
    node serves is followed here, so that taking it over replays only its tail. Runs until
    cancelled; wakes on every map and every ``recheck_s``."""
    failed_since: dict[int, float] = {}
    while True:
        view.changed.clear()
        mine = view.mine()
        if mine is not None:
            mine &= set(held())
            now = asyncio.get_running_loop().time()
            for shard in range(coordinator.shard_count):
                try:
                    if shard in mine:
                        if coordinator.failed(shard):
                            since = failed_since.setdefault(shard, now)
                            if now - since < refence_backoff_s:
                                continue
                        failed_since.pop(shard, None)
                        await coordinator.acquire(shard)
                    else:
                        if shard in coordinator.served_shards:
                            await coordinator.release(shard)
                        if hot_standby:
                            await coordinator.follow(shard)
                except Exception:
                    log.exception("shard %d: taking or giving it up failed; trying again", shard)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(recheck_s):
                await view.changed.wait()
