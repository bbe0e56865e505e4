"""One seeded random scenario: build a world, shake it per a profile, stop, demand convergence.

From the seed: the topics and their partition counts, how many members there are, which are
static, which subscribe by regex, whether assignment is server side (``uniform``/``range``)
or client side (``SimAssignor``), and when faults stop. While faults last, each kind of fault
fires as a Poisson process whose rate the profile gives; each firing picks its victims from
the world as it is at that instant. When faults stop, every process that should run runs and
the group must converge (``Simulation.convergence_gap``) within ``convergence_bound_ms``, and
still be converged a few heartbeats later. Convergence is only looked for once the last
message duplicated or held back during the faults has landed and requests lost meanwhile have
timed out, and it counts only members that heartbeated successfully since; the time reported
is still measured from the moment faults stopped. A run ends with a brand-new shard replaying
the whole log, which must equal the live one.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Literal

from pystreams.sim.cluster import ClusterTiming
from pystreams.sim.invariants import Violation
from pystreams.sim.process import MAX_LOOKUP_BACKOFF_MS, ProcessSpec
from pystreams.sim.profiles import PROFILES, Profile
from pystreams.sim.world import Simulation, Timing

REGEX = "orders|payments|audit-.*"
BASE_TOPICS = ("orders", "payments")
#: Client-side assignor version ranges (min, max, metadata version) of a two-phase roll:
#: first learn to read v2, then start writing it. Ranges always overlap.
ROLL_PHASES = ((1, 1, 1), (1, 2, 1), (1, 2, 2))


def convergence_bound_ms(timing: Timing, nodes: int = 1) -> int:
    """How long after faults stop the group may take to converge: a dead member's session, a
    slow revocation or computation hitting the rebalance timeout, the restarts they cause, and
    the heartbeats in between; with several coordinator nodes, also the nodes' restarts, a move
    of the shard, and the members' lookups backing off."""
    bound = 4 * timing.session_timeout_ms + 4 * timing.rebalance_timeout_ms + 10 * timing.heartbeat_interval_ms
    if nodes > 1:
        bound += ClusterTiming().move_bound_ms() + MAX_LOOKUP_BACKOFF_MS
    return bound


@dataclass
class SeedResult:
    seed: int
    profile: str
    steps: int
    simulated_ms: int
    faults_stopped_at_ms: int
    #: Simulated time from faults stopping to convergence; None if it never converged.
    converged_after_ms: int | None
    violations: list[Violation]
    stats: Counter = field(default_factory=Counter)
    fingerprint: str = ""
    trace: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    @property
    def replay_command(self) -> str:
        return f"pystreams sim --profile {self.profile} --seed {self.seed}"


class RandomScenario:
    def __init__(self, world: Simulation, profile: Profile) -> None:
        self.world = world
        self.profile = profile
        self.rng = world.rng
        self.node_cut_rng = random.Random(f"node-cuts-{world.seed}")
        self.client_side = False
        self._names = (f"p{i}" for i in range(1_000_000))
        self._joins = 0
        self._topics_created = 0
        self._roll_phase = 0
        self.faults_end_ms = 0
        #: The classic protocol's assignor for this seed ("range" is eager, the other KIP-429).
        self.classic_assignor = self.rng.choice(("range", "cooperative-sticky")) if profile.classic or profile.protocol_flips_per_s else "range"

    # ------------------------------------------------------------------ set-up

    def build(self) -> None:
        world, rng, profile = self.world, self.rng, self.profile
        world.create_topic("orders", rng.randint(2, 8))
        world.create_topic("payments", rng.randint(1, 6))
        self.client_side = rng.random() < profile.client_side
        for _ in range(rng.randint(*profile.members)):
            spec = self._new_spec()
            process = world.add_process(spec, start=False)
            process.wanted = True
            world.at(rng.randint(0, 500), world.restart_if_wanted, process)

    def _new_spec(self) -> ProcessSpec:
        rng = self.rng
        name = next(self._names)
        static = rng.random() < self.profile.static_members
        regex = rng.random() < self.profile.regex_subscriptions
        server_assignor = None if self.client_side else rng.choice((None, "uniform", "range"))
        # Classic members join only groups that assign on the server side.
        classic = rng.random() < self.profile.classic and not self.client_side
        return ProcessSpec(
            name=name,
            instance_id=f"instance-{name}" if static else None,
            topics=None if regex else BASE_TOPICS,
            regex=REGEX if regex else None,
            server_assignor=server_assignor,
            client_versions=ROLL_PHASES[self._roll_phase] if self.client_side else None,
            classic_assignor=self.classic_assignor if classic else None,
        )

    # ------------------------------------------------------------------ faults

    def start_faults(self, until_ms: int) -> None:
        world, profile = self.world, self.profile
        world.set_faults(profile.network, profile.misbehaviour)
        self.faults_end_ms = until_ms
        for rate, action in (
            (profile.churn_per_s, self._churn),
            (profile.topic_changes_per_s, self._change_topics),
            (profile.failovers_per_s, self._fail_over),
            (profile.cuts_per_s, self._cut),
            (0.0 if self.client_side else profile.protocol_flips_per_s, self._flip_protocol),
            (profile.node_kills_per_s, self._kill_node),
            (profile.node_stops_per_s, self._stop_node),
        ):
            if rate > 0:
                self._next(rate, action)
        if profile.node_cuts_per_s > 0:
            # Drawn from a stream of their own: the other faults of a seed stay where they were.
            self._next(profile.node_cuts_per_s, self._cut_node, self.node_cut_rng)
        if self.client_side and self.rng.random() < profile.roll:
            world.at(self.rng.randint(0, until_ms // 2), self._roll_next, 1, 0)

    def _next(self, rate_per_s: float, action, rng: random.Random | None = None) -> None:
        at = self.world.now + max(1, int((rng or self.rng).expovariate(rate_per_s) * 1000))
        if at < self.faults_end_ms:
            self.world.at(at, self._fire, rate_per_s, action, rng)

    def _fire(self, rate_per_s: float, action, rng: random.Random | None = None) -> None:
        if not self.world.faults_on:
            return
        action()
        self._next(rate_per_s, action, rng)

    def _running(self):
        return [p for p in self.world.processes.values() if p.running]

    def _churn(self) -> None:
        world, rng = self.world, self.rng
        running = self._running()
        wanted = [p for p in world.processes.values() if p.wanted]
        roll = rng.random()
        if roll < 0.15 and self._joins < self.profile.max_joins:
            self._joins += 1
            world.stats["churn.joins"] += 1
            world.add_process(self._new_spec())
        elif not running:
            return
        elif roll < 0.5:
            world.stats["churn.crashes"] += 1
            rng.choice(running).crash()
        elif roll < 0.9 or len(wanted) <= 1:
            # A bounce: static members leave with -2 and come back as themselves.
            world.stats["churn.bounces"] += 1
            rng.choice(running).leave()
        else:
            world.stats["churn.departures"] += 1
            process = rng.choice(running)
            process.wanted = False
            process.leave(permanent=True)

    def _change_topics(self) -> None:
        world, rng = self.world, self.rng
        roll = rng.random()
        if roll < 0.5:
            name = rng.choice(sorted(world.coordinator.topics))
            world.add_partitions(name, rng.randint(1, 2))
        else:
            self._topics_created += 1
            prefix = "audit" if roll < 0.8 else "noise"  # noise-* matches no subscription
            world.create_topic(f"{prefix}-{self._topics_created}", rng.randint(1, 4))

    def _fail_over(self) -> None:
        self.world.fail_over(self.rng.randint(10, 400))

    def _node_victim(self, rng: random.Random | None = None) -> str | None:
        """A node that is up: the one serving the shard half the time (if one does)."""
        cluster = self.world.cluster
        assert cluster is not None
        rng = rng or self.rng
        up = [name for name in cluster.names if cluster.nodes[name].up]
        if not up:
            return None
        if cluster.serving is not None and rng.random() < 0.5:
            return cluster.serving
        return rng.choice(up)

    def _kill_node(self) -> None:
        victim = self._node_victim()
        if victim is not None:
            self.world.cluster.kill(victim)  # type: ignore[union-attr]

    def _stop_node(self) -> None:
        victim = self._node_victim()
        if victim is not None:
            self.world.cluster.stop(victim)  # type: ignore[union-attr]

    def _cut_node(self) -> None:
        victim = self._node_victim(self.node_cut_rng)
        if victim is not None:
            self.world.cluster.cut(victim)  # type: ignore[union-attr]

    def _cut(self) -> None:
        running = self._running()
        if not running:
            return
        victims = self.rng.sample(running, min(len(running), self.rng.randint(1, 2)))
        self.world.cut(sorted(p.name for p in victims), self.rng.randint(*self.profile.cut_ms))

    def _flip_protocol(self) -> None:
        """An operator restarts one process with the other ``group.protocol`` (same instance
        id): gracefully, or it crashed and comes back switched."""
        world, rng = self.world, self.rng
        wanted = [p for p in world.processes.values() if p.wanted]
        if not wanted:
            return
        process = rng.choice(wanted)
        classic = None if process.spec.classic_assignor is not None else self.classic_assignor
        process.spec = replace(process.spec, classic_assignor=classic)
        world.stats["migration.to_classic" if classic else "migration.to_consumer"] += 1
        if process.running:
            if rng.random() < 0.7:
                process.leave()  # restarts with the new spec once it has left
            else:
                process.crash()

    def _roll_next(self, phase: int, index: int) -> None:
        """Restart processes one by one with the phase's version range (an operator's roll)."""
        world = self.world
        if not world.faults_on or phase >= len(ROLL_PHASES):
            return
        self._roll_phase = phase
        processes = [p for p in world.processes.values() if p.wanted]
        if index >= len(processes):
            world.stats["roll.phases"] += 1
            world.at(world.now + self.rng.randint(200, 800), self._roll_next, phase + 1, 0)
            return
        process = processes[index]
        process.spec = replace(process.spec, client_versions=ROLL_PHASES[phase])
        world.stats["roll.restarts"] += 1
        if process.running:
            process.leave()  # restarts with the new spec once it has left
        world.at(world.now + self.rng.randint(200, 800), self._roll_next, phase, index + 1)


def run_seed(seed: int, profile: str | Profile = "chaos", *, trace: bool | Literal["all"] = False, timing: Timing | None = None) -> SeedResult:
    """Run one seed of a profile to the end; the result says what, if anything, went wrong."""
    profile = PROFILES[profile] if isinstance(profile, str) else profile
    world = Simulation(seed, timing, trace=trace, nodes=profile.nodes)
    scenario = RandomScenario(world, profile)
    scenario.build()
    faults_end = world.rng.randint(*profile.fault_ms)
    scenario.start_faults(faults_end)
    world.run_until(faults_end)
    converged_after = None
    if not world.failed:
        world.stop_faults(profile.calm_network)
        bound = convergence_bound_ms(world.timing, profile.nodes)
        # Duplicated or held-back messages sent while faults lasted still land until then, and
        # requests lost meanwhile time out up to a request timeout later.
        world.quiet_since_ms = max(world.network.last_fault_arrival_ms, faults_end + world.timing.request_timeout_ms)
        world.run_until(world.quiet_since_ms)
        if not world.failed and world.run_until(faults_end + bound, until=world.converged):
            converged_after = world.now - faults_end
            settle_until = world.now + 3 * world.timing.heartbeat_interval_ms
            world.run_until(settle_until)
            gap = None if world.failed else world.convergence_gap()
            if gap is not None:
                world.violation("unstable-after-convergence", f"converged, then: {gap}")
        elif not world.failed:
            world.violation("no-convergence", f"not converged {bound} ms after faults stopped: {world.convergence_gap()}")
    world.invariants.check_fresh_replay()
    return SeedResult(
        seed=seed,
        profile=profile.name,
        steps=world.steps,
        simulated_ms=world.now,
        faults_stopped_at_ms=faults_end,
        converged_after_ms=converged_after,
        violations=list(world.violations),
        stats=world.stats,
        fingerprint=world.fingerprint(),
        trace=list(world.trace) if world.trace is not None else [],
    )
