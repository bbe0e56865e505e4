"""Coordinator nodes sharing the shards (``coordinator/cluster.py``): the placement rule, the
assignor's wire, a node taking and giving up shards, and what FindCoordinator answers."""

from __future__ import annotations

import asyncio
import collections
from types import SimpleNamespace

import kafka.errors as Errors
import msgspec
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from kafka.protocol.consumer.metadata import ConsumerProtocolAssignment, ConsumerProtocolSubscription

from pystreams.coordinator.cluster import ClusterView, NodeInfo, ShardAssignor, ShardMap, plan_shards
from pystreams.coordinator.log import MemoryLog
from pystreams.coordinator.runtime import Coordinator, ShardState, StaticTopics, group_shard
from pystreams.protocol import messages as m
from pystreams.protocol.server import BrokerAddress
from tests.aio import within

TOPIC = "__pystreams_groups"


# --- the placement rule ---------------------------------------------------------------------------


def test_shards_spread_evenly_over_new_nodes():
    plan = plan_shards(8, ["b", "a", "c"], {})
    assert sorted(len(shards) for shards in plan.final.values()) == [2, 3, 3]
    assert sorted(s for shards in plan.final.values() for s in shards) == list(range(8))
    assert plan.now == plan.final  # nothing is owned: nothing waits for a release


def test_a_joining_node_takes_shards_only_after_their_owner_released_them():
    owned = {"a": [0, 1, 2, 3]}
    plan = plan_shards(4, ["a", "b"], owned)
    assert len(plan.final["a"]) == len(plan.final["b"]) == 2
    assert set(plan.final["a"]) <= {0, 1, 2, 3}  # a keeps two of its own
    assert plan.now["b"] == []  # round one: b gets nothing yet ...
    assert plan.now["a"] == plan.final["a"]  # ... a keeps two and lets two go
    after = plan_shards(4, ["a", "b"], {"a": plan.now["a"]})  # round two, after the release
    assert after.now == after.final == plan.final


def test_a_departed_nodes_shards_go_to_the_others_at_once_and_nobody_else_moves():
    owned = {"a": [0, 3], "b": [1, 4], "c": [2, 5]}
    plan = plan_shards(6, ["a", "b"], owned)
    assert plan.now == plan.final
    assert set(plan.final["a"]) >= {0, 3} and set(plan.final["b"]) >= {1, 4}
    assert sorted(plan.final["a"] + plan.final["b"]) == list(range(6))


@settings(max_examples=200, deadline=None)
@given(
    shard_count=st.integers(1, 16),
    members=st.sets(st.sampled_from("abcdef"), min_size=1),
    owned=st.dictionaries(st.sampled_from("abcdefg"), st.sets(st.integers(0, 20), max_size=8), max_size=7),
)
def test_every_plan_is_complete_balanced_sticky_and_never_hands_over_an_unreleased_shard(shard_count, members, owned):
    plan = plan_shards(shard_count, members, {k: sorted(v) for k, v in owned.items()})
    placed = [s for shards in plan.final.values() for s in shards]
    assert sorted(placed) == list(range(shard_count))  # every shard, once
    sizes = [len(plan.final[mb]) for mb in members]
    assert max(sizes) - min(sizes) <= 1
    holder = {}
    for member in sorted(owned, key=lambda mb: (-len(owned[mb]), mb)):
        if member in members:
            for shard in sorted(owned[member]):
                if shard < shard_count:
                    holder.setdefault(shard, member)
    for member, shards in plan.now.items():
        assert set(shards) <= set(plan.final[member])
        for shard in shards:
            assert holder.get(shard) in (None, member), "a shard still held elsewhere was handed over"
    # Sticky: a member keeps min(what it held, its share) of its shards.
    for member in members:
        held = [s for s, h in holder.items() if h == member]
        assert len(set(held) & set(plan.final[member])) == min(len(held), len(plan.final[member]))


# --- the assignor's wire ------------------------------------------------------------------------


def member(member_id: str, node: NodeInfo, owned: list[int]):
    assignor = ShardAssignor(node, lambda mapped, shards: None)
    assignor.owned = owned
    return SimpleNamespace(member_id=member_id, metadata=assignor.metadata({TOPIC}))


def test_the_assignor_gives_every_node_its_shards_and_the_whole_map():
    cluster = SimpleNamespace(partitions_for_topic=lambda topic: set(range(4)) if topic == TOPIC else None)
    one, two = NodeInfo(1, "h1", 9001), NodeInfo(2, "h2", 9002)
    leader = ShardAssignor(one, lambda mapped, shards: None)
    assignments = leader.assign(cluster, [member("m1", one, [0, 1, 2, 3]), member("m2", two, [])])
    # Round one: m1 keeps two shards; the two it gives up belong to nobody until released.
    seen = {}
    for member_id, assignment in assignments.items():
        decoded = ConsumerProtocolAssignment.decode(assignment.encode())
        node = one if member_id == "m1" else two
        received = ShardAssignor(node, lambda mapped, shards, member_id=member_id: seen.__setitem__(member_id, (mapped, shards)))
        received.on_assignment(decoded, 1)
    (map_one, shards_one), (map_two, shards_two) = seen["m1"], seen["m2"]
    assert map_one == map_two and len(shards_one) == 2 and shards_two == []
    assert [map_one.owners[s] for s in shards_one] == [1, 1]
    assert sorted(s for s, owner in enumerate(map_one.owners) if owner is None) == sorted(set(range(4)) - set(shards_one))
    assert map_one.nodes == (one, two)


def test_unreadable_node_metadata_gets_no_shard_and_the_others_are_served():
    cluster = SimpleNamespace(partitions_for_topic=lambda topic: set(range(2)))
    one = NodeInfo(1, "h1", 9001)
    garbage = SimpleNamespace(member_id="bad", metadata=ConsumerProtocolSubscription(version=1, topics=[TOPIC], user_data=b"\xff\x00", owned_partitions=[]))
    assignments = ShardAssignor(one, lambda mapped, shards: None).assign(cluster, [member("m1", one, []), garbage])
    assert sorted(p for _, parts in assignments["m1"].assigned_partitions for p in parts) == [0, 1]
    assert [p for _, parts in assignments["bad"].assigned_partitions for p in parts] == []


_msgpack_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**64 - 1) | st.text(max_size=300) | st.binary(max_size=16),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=4), children, max_size=4),
    max_leaves=16,
)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=1024), _msgpack_values.map(msgspec.msgpack.encode)))
@example(msgspec.msgpack.encode([2, "h2", 9002]))  # a readable node: it gets its share
@example(msgspec.msgpack.encode([2, "h2", 0]))
@example(msgspec.msgpack.encode([2, "h2", 70_000]))
@example(msgspec.msgpack.encode([2, "", 9002]))
@example(msgspec.msgpack.encode([-1, "h2", 9002]))
@example(msgspec.msgpack.encode([2**31, "h2", 9002]))
@example(msgspec.msgpack.encode([3, [1, None, 2**40], [[1, "h1", 9001]]]))  # a map naming an impossible node id
@example(msgspec.msgpack.encode([3, [2], [[2, "h2", 99_999]]]))  # a map naming an impossible port
@example(b"\x93\x00\xa1\x80")  # a host that is not UTF-8 (found by Hypothesis)
def test_any_bytes_as_node_metadata_or_as_a_shard_map_leave_the_cluster_serving(data: bytes):
    """Hostile input: whatever a member sends as its node, or a leader as its map, the others
    keep their shards and the receiver its last map; what is read is within FindCoordinator's
    bounds (an int32 id, a host, a TCP port)."""
    cluster = SimpleNamespace(partitions_for_topic=lambda topic: set(range(2)))
    one = NodeInfo(1, "h1", 9001)
    stranger = SimpleNamespace(member_id="z", metadata=ConsumerProtocolSubscription(version=1, topics=[TOPIC], user_data=data, owned_partitions=[]))
    assignments = ShardAssignor(one, lambda mapped, shards: None).assign(cluster, [member("m1", one, []), stranger])
    given_out = {member_id: sorted(p for _, parts in a.assigned_partitions for p in parts) for member_id, a in assignments.items()}
    assert sorted(given_out["m1"] + given_out["z"]) == [0, 1]  # every shard has exactly one owner
    if given_out["z"]:
        node = msgspec.msgpack.decode(data, type=NodeInfo)  # only a readable node is given shards
        assert node.node_id != one.node_id and 0 < node.port < 65_536 and node.host

    last = ShardMap(1, (1, 1), (one,))
    seen: list[ShardMap] = []
    receiver = ShardAssignor(one, lambda mapped, shards: seen.append(mapped))
    receiver.on_assignment(ConsumerProtocolAssignment(1, [(TOPIC, [0])], msgspec.msgpack.encode(last)), 1)
    receiver.on_assignment(ConsumerProtocolAssignment(1, [(TOPIC, [0])], data), 2)
    assert seen[0] == last and len(seen) <= 2
    for mapped in seen:
        for shard in range(-1, len(mapped.owners) + 1):
            owner = mapped.owner(shard)
            assert owner is None or (0 <= owner.node_id < 2**31 and 0 < owner.port < 65_536 and owner.host)


def test_a_shard_map_round_trips_and_names_no_owner_for_a_moving_shard():
    mapped = ShardMap(3, (1, None), (NodeInfo(1, "h", 1),))
    assert mapped.owner(0) == NodeInfo(1, "h", 1)
    assert mapped.owner(1) is None and mapped.owner(7) is None


# --- a node taking and giving up shards -----------------------------------------------------------


def run(coroutine):
    return asyncio.run(coroutine)


def heartbeat(group: str) -> m.ConsumerGroupHeartbeatRequest:
    return m.ConsumerGroupHeartbeatRequest(
        group_id=group, member_id="", member_epoch=0, rebalance_timeout_ms=5_000, subscribed_topic_names=["t"], topic_partitions=[], server_assignor="uniform"
    )


VERSIONS = {m.ConsumerGroupHeartbeatRequest: 0, m.ListGroupsRequest: 5}


async def call(coordinator: Coordinator, request):
    from kafka.protocol.api_header import RequestHeader

    version = request.API_VERSION = VERSIONS[type(request)]
    header = RequestHeader(request_api_key=request.API_KEY, request_api_version=version, correlation_id=1, client_id="test")
    return await within(coordinator.handle(header, request), 10)


def groups_on(shard: int, count: int = 4) -> str:
    return next(f"group-{i}" for i in range(10_000) if group_shard(f"group-{i}", count) == shard)


def test_a_node_serves_only_what_it_acquired_and_a_released_shard_is_loaded_by_the_next_owner():
    async def scenario():
        log = MemoryLog(4)
        topics = StaticTopics({})
        first = Coordinator(log, topic_source=topics, owned_shards=())
        second = Coordinator(log, topic_source=topics, owned_shards=())
        await first.start()
        await second.start()
        g0, g1 = groups_on(0), groups_on(1)
        refused = await call(first, heartbeat(g0))
        assert refused.error_code == Errors.NotCoordinatorError.errno
        assert "not served by this coordinator" in first.unavailable_reason(g0)
        await first.acquire(0)
        await first.acquire(1)
        await first.wait_until_loaded()
        joined = await call(first, heartbeat(g0))
        assert joined.error_code == 0 and joined.member_epoch >= 1
        assert first.served_shards == [0, 1] and first.unavailable_reason(g1) is None
        # The shard moves: released here, acquired there, with the member it had.
        await first.release(0)
        assert (await call(first, heartbeat(g0))).error_code == Errors.NotCoordinatorError.errno
        await second.acquire(0)
        await second.wait_until_loaded()
        again = await call(
            second,
            m.ConsumerGroupHeartbeatRequest(group_id=g0, member_id=joined.member_id, member_epoch=joined.member_epoch, rebalance_timeout_ms=5_000),
        )
        assert again.error_code == 0 and again.member_epoch == joined.member_epoch
        listed = await call(first, m.ListGroupsRequest())
        assert listed.groups == []  # shard 1 holds no group; shard 0 is the second node's now
        await first.close()
        await second.close()

    run(scenario())


def test_acquiring_a_shard_another_node_fenced_here_loads_it_afresh():
    async def scenario():
        log = MemoryLog(2)
        first = Coordinator(log, topic_source=StaticTopics({}), owned_shards=[0])
        await first.start()
        await first.wait_until_loaded()
        thief = await log.claim(0)
        g0 = groups_on(0, 2)
        assert (await call(first, heartbeat(g0))).error_code == Errors.NotCoordinatorError.errno
        assert first.runners[0].state is ShardState.FAILED
        await thief.close()
        await first.acquire(0)  # the group gave it back: claim and load again
        await first.wait_until_loaded()
        assert (await call(first, heartbeat(g0))).error_code == 0
        await first.close()

    run(scenario())


# --- what FindCoordinator answers -----------------------------------------------------------------


def test_every_node_names_the_same_owner_and_none_while_a_shard_moves():
    me = BrokerAddress(2, "h2", 9002)
    reasons: dict[str, str | None] = collections.defaultdict(lambda: None)
    view = ClusterView(lambda group: int(group[-1]), lambda: me, lambda group: reasons[group])
    assert "not in the coordinators' group" in view.locate("g0")
    view.update(ShardMap(1, (1, 2, None), (NodeInfo(1, "h1", 9001), NodeInfo(2, "h2", 9002))))
    assert view.locate("g0") == BrokerAddress(1, "h1", 9001)
    assert view.locate("g1") == me
    assert "moving" in view.locate("g2")
    reasons["g1"] = "shard 1 was taken over by another coordinator"
    assert view.locate("g1") == reasons["g1"]
    assert view.nodes() == [BrokerAddress(1, "h1", 9001), BrokerAddress(2, "h2", 9002)]


@pytest.mark.parametrize("value", [b"", b"\x93\x01", b"\xc1" * 10])
def test_an_unreadable_shard_map_keeps_the_last_one(value):
    seen = []
    assignor = ShardAssignor(NodeInfo(1, "h", 1), lambda mapped, shards: seen.append(mapped))
    assignor.on_assignment(ConsumerProtocolAssignment(1, [(TOPIC, [0])], value), 1)
    assert seen == [] and assignor.owned == [0]


# --- review findings: readiness, double claims, duplicates, self-healing ------------------------


def test_a_node_is_ready_only_once_every_shard_has_an_owner_and_it_serves_its_own():
    me = BrokerAddress(2, "h2", 9002)
    view = ClusterView(lambda group: 0, lambda: me, lambda group: None)
    nodes = (NodeInfo(1, "h1", 9001), NodeInfo(2, "h2", 9002))
    served: set[int] = set()
    assert not view.settled_here(served.__contains__)  # no map yet
    view.update(ShardMap(1, (1, 1, None, None), nodes))  # round one of a join: nothing for node 2 yet
    assert view.mine() == set() and not view.settled_here(served.__contains__)
    view.update(ShardMap(2, (1, 1, 2, 2), nodes))
    assert not view.settled_here(served.__contains__)  # its shards are not loaded yet
    served |= {2, 3}
    assert view.settled_here(served.__contains__)
    view.update(ShardMap(3, (1, 1, 1, 1), (nodes[0],)))  # more nodes than it needs: none of its own
    assert view.settled_here(served.__contains__)


def test_a_shard_two_members_claim_is_handed_to_nobody_until_one_lets_go():
    plan = plan_shards(2, ["a", "b"], {"a": [0, 1], "b": [1]})
    assert 1 not in plan.now["a"] and 1 not in plan.now["b"]
    assert sorted(plan.final["a"] + plan.final["b"]) == [0, 1]


def test_the_subscription_claims_what_the_consumer_holds_now_not_its_last_assignment():
    held = [0, 1]
    assignor = ShardAssignor(NodeInfo(1, "h", 1), lambda mapped, shards: None, owned_now=lambda: held)
    assignor.owned = [0, 1, 2]  # its last assignment; the group has since evicted it from 2
    [claimed] = assignor.metadata({TOPIC}).owned_partitions
    assert claimed.partitions == [0, 1]
    held.clear()  # evicted (partitions lost): it claims nothing when it rejoins
    assert assignor.metadata({TOPIC}).owned_partitions == []


def test_a_second_node_with_a_taken_id_gets_no_shard_and_stops():
    from pystreams.coordinator.cluster import DuplicateNodeId, ShardOwnership

    cluster = SimpleNamespace(partitions_for_topic=lambda topic: set(range(4)))
    first, second = NodeInfo(1, "h1", 9001), NodeInfo(1, "h2", 9002)
    assignments = ShardAssignor(first, lambda mapped, shards: None).assign(cluster, [member("m1", first, [0, 1, 2, 3]), member("m2", second, [])])
    assert [p for _, parts in assignments["m2"].assigned_partitions for p in parts] == []
    received: list[ShardMap] = []
    ShardAssignor(second, lambda m_, shards: received.append(m_)).on_assignment(ConsumerProtocolAssignment.decode(assignments["m2"].encode()), 1)
    [mapped] = received
    assert mapped.nodes == (first,)
    loop = asyncio.new_event_loop()
    try:
        ownership = ShardOwnership("unused:9092", TOPIC, second, loop=loop, release=None, served=list, on_map=lambda m_: None)
        ownership._mapped(mapped, [])
        assert isinstance(ownership.failure, DuplicateNodeId) and "--node-id" in str(ownership.failure)
        assert ownership.map is None  # it never publishes a map that names another node as itself
    finally:
        loop.close()


class SlowClaimLog(MemoryLog):
    """A memory log whose claims wait until ``go`` is set: a shard stays loading meanwhile."""

    def __init__(self, partitions: int) -> None:
        super().__init__(partitions)
        self.go = asyncio.Event()

    async def claim(self, partition: int):
        await self.go.wait()
        return await super().claim(partition)


def test_a_shard_released_while_loading_leaves_the_node_healthy_and_can_come_back():
    async def scenario():
        log = SlowClaimLog(2)
        node = Coordinator(log, topic_source=StaticTopics({}), owned_shards=())
        await node.start()
        await node.acquire(0)
        await asyncio.sleep(0.05)
        assert not node.serves(0) and node.runners[0].state is ShardState.LOADING
        await node.release(0)  # it moved away before it loaded
        assert node.served_shards == [] and node.is_ready()
        log.go.set()
        await node.acquire(0)
        await node.wait_until_loaded()
        assert node.serves(0)
        await node.close()

    run(scenario())


def test_keep_serving_takes_its_shards_gives_up_the_others_and_reloads_one_fenced_here():
    from pystreams.coordinator.cluster import keep_serving

    async def scenario():
        log = MemoryLog(2)
        node = Coordinator(log, topic_source=StaticTopics({}), owned_shards=[1])
        await node.start()
        me = BrokerAddress(7, "h", 1)
        view = ClusterView(node.shard_for, lambda: me, node.unavailable_reason)
        held = {0, 1}
        keeper = asyncio.create_task(keep_serving(view, node, lambda: held, recheck_s=0.05, refence_backoff_s=0.3))
        view.update(ShardMap(1, (7, 3), (NodeInfo(3, "o", 2), NodeInfo(7, "h", 1))))

        async def until(condition, what):
            async with asyncio.timeout(10):
                while not condition():
                    await asyncio.sleep(0.02)

        await until(lambda: node.serves(0) and node.served_shards == [0], "shard 0 served, shard 1 given up")
        thief = await log.claim(0)  # a late writer fences this node's shard 0
        g0 = groups_on(0, 2)
        assert (await call(node, heartbeat(g0))).error_code == Errors.NotCoordinatorError.errno
        await thief.close()
        await until(lambda: node.serves(0), "shard 0 reloaded: the map still gives it to this node")
        assert (await call(node, heartbeat(g0))).error_code == 0
        # Evicted from the group (it no longer holds shard 0), its map is stale: once fenced
        # there, it does not take the shard back, whatever the map says.
        held.clear()
        usurper = await log.claim(0)
        assert (await call(node, heartbeat(g0))).error_code == Errors.NotCoordinatorError.errno
        await asyncio.sleep(0.6)  # past the back-off
        assert not node.serves(0) and node.served_shards == []  # released: not the map's any more
        await usurper.close()
        keeper.cancel()
        await asyncio.gather(keeper, return_exceptions=True)
        await node.close()

    run(scenario())


# --- hot standbys ---------------------------------------------------------------------------------


def member_heartbeat(group: str, member_id: str, epoch: int) -> m.ConsumerGroupHeartbeatRequest:
    return m.ConsumerGroupHeartbeatRequest(group_id=group, member_id=member_id, member_epoch=epoch, rebalance_timeout_ms=5_000)


def replayed_from_scratch(log: MemoryLog, shard: int) -> dict:
    from pystreams.coordinator.shard import GroupCoordinatorShard

    fresh = GroupCoordinatorShard(Coordinator(log).config)
    for record in log.records(shard):
        fresh.replay(record)
    return fresh.snapshot()


async def caught_up(standby, log: MemoryLog, shard: int) -> None:
    async with asyncio.timeout(10):
        while standby.replayed < log.size(shard):
            await asyncio.sleep(0.01)


def test_a_hot_standby_takes_a_shard_over_replaying_only_what_it_had_not_read():
    async def scenario():
        log = MemoryLog(2)
        owner = Coordinator(log, topic_source=StaticTopics({}), owned_shards=[0])
        other = Coordinator(log, topic_source=StaticTopics({}), owned_shards=())
        await owner.start()
        await other.start()
        await owner.wait_until_loaded()
        await other.follow(0)
        await other.follow(0)  # following twice keeps one standby
        standby = other.standbys[0]
        g0 = groups_on(0, 2)
        first = await call(owner, heartbeat(g0))
        await caught_up(standby, log, 0)
        followed = standby.replayed
        assert followed == log.size(0) > 0
        second = await call(owner, heartbeat(g0))  # most likely still unread when the shard moves
        await call(owner, member_heartbeat(g0, first.member_id, first.member_epoch))
        written = log.size(0)
        # The owner is gone without a word; the other node is given the shard.
        await other.acquire(0)
        await other.wait_until_loaded()
        runner = other.runners[0]
        # Every record replayed once: what the standby had read, then the rest from there.
        assert runner.replayed_by_standby >= followed
        assert runner.replayed_by_standby + runner.replayed_at_load == written
        assert other.standbys == {}
        # What the standby plus the tail hold is what a replay of the whole log holds.
        assert runner.shard is not None and runner.shard.snapshot() == replayed_from_scratch(log, 0)
        # Members keep their ids and epochs; the old owner is fenced at its next write.
        kept = await call(other, member_heartbeat(g0, second.member_id, second.member_epoch))
        assert kept.error_code == 0 and kept.member_epoch == second.member_epoch
        assert (await call(owner, heartbeat(g0))).error_code == Errors.NotCoordinatorError.errno
        await owner.close()
        await other.close()

    run(scenario())


def test_a_standby_that_failed_is_dropped_and_the_takeover_replays_the_whole_log():
    from pystreams.coordinator.log import LogFollower, LogPosition

    class BrokenFollower(LogFollower):
        partition = 0

        async def poll(self):
            raise OSError("the brokers are unreachable")

        def position(self) -> LogPosition:
            raise AssertionError("a failed standby's position must not be used")

        async def close(self) -> None:
            pass

    class UnfollowableLog(MemoryLog):
        def follow(self, partition: int) -> LogFollower:
            return BrokenFollower()

    async def scenario():
        log = UnfollowableLog(2)
        owner = Coordinator(log, topic_source=StaticTopics({}), owned_shards=[0])
        other = Coordinator(log, topic_source=StaticTopics({}), owned_shards=())
        await owner.start()
        await other.start()
        await owner.wait_until_loaded()
        joined = await call(owner, heartbeat(groups_on(0, 2)))
        await other.follow(0)
        async with asyncio.timeout(10):
            while other.standbys[0].failure is None:
                await asyncio.sleep(0.01)
        written = log.size(0)
        await other.acquire(0)
        await other.wait_until_loaded()
        runner = other.runners[0]
        assert (runner.replayed_by_standby, runner.replayed_at_load) == (0, written)
        kept = await call(other, member_heartbeat(groups_on(0, 2), joined.member_id, joined.member_epoch))
        assert kept.error_code == 0 and kept.member_epoch == joined.member_epoch
        await owner.close()
        await other.close()

    run(scenario())


def test_keep_serving_with_hot_standbys_follows_what_other_nodes_serve_and_takes_it_over():
    from pystreams.coordinator.cluster import keep_serving

    async def scenario():
        log = MemoryLog(3)
        node = Coordinator(log, topic_source=StaticTopics({}), owned_shards=[])
        await node.start()
        me = BrokerAddress(7, "h", 1)
        view = ClusterView(node.shard_for, lambda: me, node.unavailable_reason)
        held = {0}
        keeper = asyncio.create_task(keep_serving(view, node, lambda: held, recheck_s=0.05, hot_standby=True))

        async def until(condition):
            async with asyncio.timeout(10):
                while not condition():
                    await asyncio.sleep(0.02)

        other = Coordinator(log, topic_source=StaticTopics({}), owned_shards=[1])  # node 3, serving shard 1
        await other.start()
        await other.wait_until_loaded()
        assert (await call(other, heartbeat(groups_on(1, 3)))).error_code == 0
        view.update(ShardMap(1, (7, 3, 3), (NodeInfo(3, "o", 2), NodeInfo(7, "h", 1))))
        await until(lambda: node.serves(0) and sorted(node.standbys) == [1, 2])
        written = log.size(1)
        await until(lambda: node.standbys[1].replayed == written > 0)
        # Node 3 goes; shard 1 comes here and is taken over from its standby, replaying nothing again.
        held.add(1)
        view.update(ShardMap(2, (7, 7, 3), (NodeInfo(3, "o", 2), NodeInfo(7, "h", 1))))
        await until(lambda: node.serves(1) and sorted(node.standbys) == [2])
        taken = node.runners[1]
        assert (taken.replayed_by_standby, taken.replayed_at_load, taken.load_count) == (written, 0, 1)
        # Shard 0 moves away: released here, then followed.
        held.discard(0)
        view.update(ShardMap(3, (3, 7, 3), (NodeInfo(3, "o", 2), NodeInfo(7, "h", 1))))
        await until(lambda: node.served_shards == [1] and sorted(node.standbys) == [0, 2])
        keeper.cancel()
        await asyncio.gather(keeper, return_exceptions=True)
        await node.close()
        await other.close()
        assert node.standbys == {}

    run(scenario())
