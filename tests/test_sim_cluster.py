"""Several coordinator nodes in the simulator: the shard moves between them, and members find it.

Scripted moves pin what the issue asks of a fail-over between nodes (members keep their ids and
epochs, nothing is owned twice, the shard replayed on the new node equals the one given up);
random seeds of the ``cluster`` profile shake everything at once; and each rule the move relies
on, broken on purpose, is caught.
"""

from __future__ import annotations

import pytest

from pystreams.client.member import MemberState
from pystreams.sim import PROFILES, Simulation, run_seed
from pystreams.sim.cluster import CoordinatorCluster
from pystreams.sim.network import NetworkFaults
from pystreams.sim.process import MemberProcess, ProcessSpec
from pystreams.sim.scenario import convergence_bound_ms
from pystreams.sim.world import Timing


def _world(seed: int = 3) -> tuple[Simulation, list[MemberProcess]]:
    world = Simulation(seed, nodes=3)
    world.network.faults = NetworkFaults(min_delay_ms=1, max_delay_ms=10)
    world.create_topic("orders", 6)
    processes = [world.add_process(ProcessSpec(name=f"p{i}", topics=("orders",), server_assignor="uniform")) for i in range(3)]
    for process in processes:
        process.wanted = True
    assert world.run_until(10_000, until=world.converged), world.convergence_gap()
    return world, processes


def _identities(processes: list[MemberProcess]) -> dict[str, tuple[str, int]]:
    return {p.name: (p.member_id, p.member_epoch) for p in processes}


def _serving(world: Simulation) -> str:
    assert world.cluster is not None and world.cluster.serving is not None
    return world.cluster.serving


def test_a_group_forms_on_the_node_the_map_names_and_every_member_found_it():
    world, processes = _world()
    cluster = world.cluster
    assert cluster is not None
    owner = _serving(world)
    assert cluster.owner == owner
    # Every node names the same owner in its FindCoordinator answers.
    assert {cluster.locate(name) for name in cluster.names} == {owner}
    assert {p.coordinator[0] for p in processes if p.coordinator is not None} == {owner}
    assert all(p.coordinator is not None for p in processes)


@pytest.mark.parametrize("how", ["stop", "kill"])
def test_members_keep_their_ids_and_epochs_when_the_shard_moves(how):
    """A graceful stop releases the shard at once; a kill leaves it unserved until the brokers
    notice. Either way the next node replays the log into the same shard, the members follow
    NOT_COORDINATOR (or their dead connection) to it, and nobody is fenced or rejoins. After a
    kill the shard is unserved for longer than the rebalance timeout (the brokers' session
    alone is as long), so the members' own guard lets their partitions go meanwhile; they get
    the same ones back at the same epoch."""
    world, processes = _world()
    cluster = world.cluster
    assert cluster is not None
    before, old = _identities(processes), _serving(world)
    views = {p.name: p.view() for p in processes}
    loads = world.coordinator.incarnation
    getattr(cluster, how)(old)
    start = world.now

    def served_again() -> bool:
        # Loaded afresh (by another node, or by the killed one if it came back in time), and
        # every member talks to the node serving it.
        serving = cluster.serving
        return (
            serving is not None and world.coordinator.incarnation > loads and all(p.coordinator is not None and p.coordinator[0] == serving for p in processes)
        )

    assert world.run_until(start + 5_000, until=served_again), (cluster.serving, [p.coordinator for p in processes])
    world.run_until(world.now + 1_000)
    assert not world.violations, world.violations
    assert _identities(processes) == before  # nobody fenced, nobody rejoined
    assert {p.name: p.view() for p in processes} == views
    assert all(p.member is not None and p.member.state is MemberState.STABLE for p in processes)
    assert world.stats["cluster.lookups"] > len(processes)  # each looked the new node up
    if how == "stop":
        # Served again within the rebalance timeout: no member had to let its partitions go.
        assert world.stats["partitions_lost_events"] == 0
    # (The stopped or killed node comes back meanwhile, and may take the shard over again.)
    if how == "stop":
        assert world.stats["cluster.releases"] >= 1
    else:
        assert world.stats["coordinator.failovers"] == 1


def test_a_node_that_comes_back_may_take_the_shard_over_in_two_rounds():
    """The shard goes to a node that joins only after its owner released it: the first map
    names no owner (FindCoordinator answers COORDINATOR_NOT_AVAILABLE), the second the new one."""
    for seed in range(40):
        world, processes = _world(seed)
        cluster = world.cluster
        assert cluster is not None
        published: list[str | None] = []
        original = cluster._publish

        def publish(owner: str | None, original=original, published=published) -> None:
            published.append(owner)
            original(owner)

        cluster._publish = publish  # type: ignore[method-assign]
        before, owner = _identities(processes), _serving(world)
        bystander = next(name for name in cluster.names if name != owner)
        cluster.stop(bystander)
        world.run_until(world.now + 3_000)
        if cluster.serving != bystander:
            continue
        first = published.index(bystander)
        assert published[first - 1] is None and owner in published[: first - 1]
        assert world.stats["cluster.releases"] >= 1
        assert world.run_until(world.now + 5_000, until=world.converged), world.convergence_gap()
        assert not world.violations and _identities(processes) == before
        return
    raise AssertionError("no seed moved the shard to the node that came back")


def test_every_node_answers_from_the_map_it_holds():
    world, _ = _world()
    cluster = world.cluster
    assert cluster is not None
    owner = _serving(world)
    other = next(name for name in cluster.names if name != owner)
    assert cluster.status(owner) == "serving" and cluster.status(other) == "elsewhere"
    cluster.kill(other)
    assert cluster.locate(other) is None  # a node that is not in the group names no owner


def test_cluster_seeds_move_the_shard_and_converge():
    results = [run_seed(seed, "cluster") for seed in range(30)]
    assert all(r.ok for r in results), next(r.violations for r in results if not r.ok)
    stats = sum((r.stats for r in results), start=type(results[0].stats)())
    for key in (
        "cluster.node_kills",
        "cluster.node_stops",
        "cluster.node_cuts",
        "cluster.lease_lapses",
        "cluster.releases",
        "cluster.not_coordinator",
        "cluster.lookups_failed",
        "coordinator.failovers",
    ):
        assert stats[key] > 0, key
    assert convergence_bound_ms(Timing(), 3) > convergence_bound_ms(Timing())


def test_a_shard_taken_over_before_its_owner_released_it_is_caught(monkeypatch):
    """The two rounds are what keep two nodes from both serving: a rebalance that hands the
    shard straight to a joining node makes it load while the owner still serves."""

    def one_round(self: CoordinatorCluster, token: int) -> None:
        if token != self._rebalance_token:
            return
        incoming = self.incoming if self.incoming in self.members else None
        self.incoming = None
        self._publish(incoming or self.owner or (next(iter(self.members), None)))

    def violations(broken: bool) -> set[str]:
        kinds: set[str] = set()
        with monkeypatch.context() as patch:
            if broken:
                patch.setattr(CoordinatorCluster, "_rebalance", one_round)
            for seed in range(40):
                result = run_seed(seed, "cluster")
                kinds |= {v.kind for v in result.violations}
        return kinds

    assert "two-coordinators" in violations(broken=True)
    assert violations(broken=False) == set()


def test_a_member_that_stays_with_a_node_that_gave_the_shard_up_is_caught(monkeypatch):
    """Following NOT_COORDINATOR is what brings members to the new node: one that never looks
    the coordinator up again keeps asking the old node and the group never settles."""
    world, processes = _world()
    monkeypatch.setattr(MemberProcess, "_forget_coordinator", lambda self: None)
    cluster = world.cluster
    assert cluster is not None
    cluster.stop(_serving(world))
    start = world.now
    assert not world.run_until(start + convergence_bound_ms(world.timing, 3), until=world.converged)
    assert world.stats["cluster.not_coordinator"] > 0


def test_a_node_cut_off_from_the_brokers_gives_the_shard_up_before_another_node_loads_it():
    """The serving node loses the brokers (not its members): it keeps serving while its lease
    runs, gives the shard up when the lease lapses, and answers lookups for it with no owner;
    the brokers drop it a session after they last heard from it, and only then does another
    node load the shard. The members follow, keeping their ids and epochs."""
    world, processes = _world()
    cluster = world.cluster
    assert cluster is not None
    before, old = _identities(processes), _serving(world)
    loads = world.coordinator.incarnation
    events: list[tuple[str, int]] = []
    lapsed, loaded = cluster._lease_lapsed, cluster._load

    def lapse(name: str, token: int) -> None:
        events.append(("lapse", world.now))
        lapsed(name, token)

    def load(name: str) -> None:
        events.append(("load", world.now))
        loaded(name)

    cluster._lease_lapsed, cluster._load = lapse, load  # type: ignore[method-assign]
    cluster.cut(old, duration_ms=4_000)
    cut_at = world.now
    timing = cluster.timing
    # Served while the lease runs (from a heartbeat sent at most an interval before the cut).
    assert world.run_until(cut_at + timing.node_session_ms - timing.node_heartbeat_ms - 1, until=lambda: cluster.serving != old) is False
    assert world.run_until(cut_at + 10_000, until=lambda: world.coordinator.incarnation > loads and cluster.serving is not None)
    lapse_at = next(at for kind, at in events if kind == "lapse")
    assert cut_at + timing.node_session_ms - timing.node_heartbeat_ms <= lapse_at <= cut_at + timing.node_session_ms
    assert events[0][0] == "lapse" and all(at > lapse_at for kind, at in events if kind == "load")
    assert world.run_until(world.now + 10_000, until=world.converged), world.convergence_gap()
    assert not world.violations, world.violations
    assert _identities(processes) == before


def test_a_node_cut_off_from_the_brokers_without_a_lease_is_caught(monkeypatch):
    """Without the lease a cut-off node serves from memory until it hears it was dropped, which
    it cannot: the next owner loads the shard while it still serves it."""

    def violations(lease: bool) -> set[str]:
        kinds: set[str] = set()
        with monkeypatch.context() as patch:
            if not lease:
                patch.setattr(CoordinatorCluster, "_lease_lapsed", lambda self, name, token: None)
            for seed in range(30):
                kinds |= {v.kind for v in run_seed(seed, "cluster").violations}
        return kinds

    assert "two-coordinators" in violations(lease=False)
    assert violations(lease=True) == set()


def test_the_cluster_profile_is_listed():
    assert PROFILES["cluster"].nodes == 3
