"""What a coordinator fail-over takes from a classic group, scripted in the simulator.

Kafka writes a classic group only at stable points (the leader's SyncGroup stores the
assignment, the group empties, a static member is replaced while Stable): a generation handed
out in JoinGroup answers, or a static replacement made while the group rebalances, dies with
the coordinator that held it. The simulator must take what follows as the classic protocol,
not as faults: a member fenced by its own earlier incarnation (FENCED_INSTANCE_ID, fatal in
Kafka's consumer, so its supervisor restarts it), and a member whose generation goes back.
"""

from __future__ import annotations

from pystreams.coordinator.classic_group import ClassicGroup, ClassicGroupState
from pystreams.coordinator.consumer_group import ConsumerGroup
from pystreams.sim import Simulation
from pystreams.sim.network import NetworkFaults
from pystreams.sim.process import ProcessSpec


def _world() -> Simulation:
    world = Simulation(1)
    world.network.faults = NetworkFaults(min_delay_ms=1, max_delay_ms=10)
    world.create_topic("orders", 4)
    return world


def _classic(name: str, instance_id: str | None = None) -> ProcessSpec:
    return ProcessSpec(name=name, instance_id=instance_id, topics=("orders",), classic_assignor="range")


def _group(world: Simulation) -> ClassicGroup | ConsumerGroup:
    assert world.coordinator.shard is not None
    return world.coordinator.shard.groups[world.group_id]


def _static_member(world: Simulation, instance_id: str) -> str | None:
    shard = world.coordinator.shard
    group = shard.groups.get(world.group_id) if shard is not None else None
    return group.static_members.get(instance_id) if group is not None else None


def _static_replacement_lost_in_a_failover(world: Simulation):
    """p4's first incarnation joins and crashes before its JoinGroup answer reaches it; the
    generation written next maps its instance id to that member id (X), which the process
    never learnt. Its next incarnation replaces X while the group rebalances (not written), and
    the coordinator dies before the leader's SyncGroup stores the generation: the log maps the
    instance id to X again. Returns p4 and X."""
    p0 = world.add_process(_classic("p0"))
    p4 = world.add_process(_classic("p4", "instance-p4"))
    assert world.run_until(2_000, until=lambda: _static_member(world, "instance-p4") is not None, probe_every_ms=0)
    assert not p4.issued_member_ids  # its JoinGroup waits for the join phase to end
    p4.wanted = False
    p4.crash()
    earlier = _group(world).static_members["instance-p4"]

    def written_with_earlier() -> bool:
        group = _group(world)
        return group.state is ClassicGroupState.STABLE and group.persisted is not None and earlier in {m.member_id for m in group.persisted.members}

    assert world.run_until(5_000, until=written_with_earlier, probe_every_ms=0)
    written = _group(world).persisted.generation
    assert earlier in p4.issued_member_ids  # answered to an incarnation that had crashed
    # A newcomer starts a rebalance; once p0 and p1 wait in the join phase they are cut off, so
    # the leader's SyncGroup never comes.
    p1 = world.add_process(_classic("p1"))

    def others_joined() -> bool:
        group = _group(world)
        joined = [group.members.get(p.member_id) for p in (p0, p1)]
        return group.state is ClassicGroupState.PREPARING_REBALANCE and all(m is not None and m.awaiting_join is not None for m in joined)

    assert world.run_until(world.now + 1_000, until=others_joined, probe_every_ms=0)
    world.cut(["p0", "p1"], 2_000)
    p4.wanted = True
    p4.start()

    def p4_syncing() -> bool:
        held = _group(world).members.get(p4.member_id)
        return p4.member.generation > written and held is not None and held.awaiting_sync is not None

    assert world.run_until(world.now + 1_000, until=p4_syncing, probe_every_ms=0)
    assert _group(world).static_members["instance-p4"] == p4.member_id != earlier
    assert _group(world).persisted.generation == written
    world.fail_over(load_ms=50)
    return p4, earlier


def test_a_static_member_fenced_by_its_own_forgotten_replacement_restarts():
    world = _world()
    p4, earlier = _static_replacement_lost_in_a_failover(world)
    fenced = world.run_until(world.now + 3_000, until=lambda: world.stats["process.fenced_after_failover"] > 0, probe_every_ms=0)
    assert not world.violations and fenced
    assert isinstance(_group(world), ClassicGroup) and _group(world).static_members["instance-p4"] == earlier
    assert world.run_until(world.now + 15_000, until=world.converged)
    assert not world.violations and _group(world).static_members["instance-p4"] == p4.member_id != earlier


def test_a_forgotten_replacement_fences_the_member_in_the_consumer_group_it_was_converted_into():
    """A KIP-848 member upgrades the group the log rebuilt: the consumer group keeps the static
    members it converts (Kafka's ConsumerGroup.fromClassicGroup), X among them."""
    world = _world()
    p4, earlier = _static_replacement_lost_in_a_failover(world)
    world.run_until(world.now + 40)
    world.add_process(ProcessSpec(name="p2", topics=("orders",)))
    fenced = world.run_until(world.now + 3_000, until=lambda: world.stats["process.fenced_after_failover"] > 0, probe_every_ms=0)
    assert not world.violations and fenced
    assert isinstance(_group(world), ConsumerGroup) and _group(world).static_members["instance-p4"] == earlier
    assert world.run_until(world.now + 15_000, until=world.converged)
    assert not world.violations and _group(world).static_members["instance-p4"] == p4.member_id != earlier


def test_a_classic_generation_lost_in_a_failover_is_handed_out_again():
    """Two generations are handed out and never written (their static leader crashes each time
    before it syncs); a follower that knew the second one rejoins the next coordinator, which
    continues from the written generation: Kafka's consumer takes the lower generation its
    JoinGroup answer carries."""
    world = _world()
    p0, p1 = world.add_process(_classic("p0", "i-p0")), world.add_process(_classic("p1", "i-p1"))
    assert world.run_until(5_000, until=world.converged)
    group = _group(world)
    written = group.persisted.generation
    leader, follower = (p0, p1) if group.leader_id == p0.member_id else (p1, p0)

    def follower_syncing(generation: int):
        def check() -> bool:
            held = _group(world).members.get(follower.member_id)
            return follower.member.generation == generation and held is not None and held.awaiting_sync is not None

        return check

    # A newcomer starts a rebalance; the static leader rejoins, then crashes: it still leads.
    world.add_process(_classic("p2"))

    def rejoined() -> bool:
        group = _group(world)
        return group.state is ClassicGroupState.PREPARING_REBALANCE and group.members[leader.member_id].awaiting_join is not None

    assert world.run_until(world.now + 2_000, until=rejoined, probe_every_ms=0)
    leader.wanted = False
    leader.crash()
    assert world.run_until(world.now + 2_000, until=follower_syncing(written + 1), probe_every_ms=0)
    # It comes back (a static replacement: another rebalance, which it leads) and crashes again.
    leader.wanted = True
    leader.start()

    def completing() -> bool:
        group = _group(world)
        return group.state is ClassicGroupState.COMPLETING_REBALANCE and group.generation == written + 2

    assert world.run_until(world.now + 2_000, until=completing, probe_every_ms=0)
    assert _group(world).leader_id == _group(world).static_members["i-" + leader.name]
    leader.wanted = False
    leader.crash()
    assert world.run_until(world.now + 1_000, until=follower_syncing(written + 2), probe_every_ms=0)
    assert _group(world).persisted.generation == written
    world.fail_over(load_ms=50)
    went_back = world.run_until(world.now + 3_000, until=lambda: 0 < follower.member.generation < written + 2, probe_every_ms=0)
    assert not world.violations and went_back
    leader.wanted = True
    world.restart_if_wanted(leader)
    assert world.run_until(world.now + 15_000, until=world.converged)
    assert not world.violations
