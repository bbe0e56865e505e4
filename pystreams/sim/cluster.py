"""Several coordinator nodes that share the group's shard, as ``pystreams coordinator --cluster``
runs them (``pystreams.coordinator.cluster``).

The nodes are members of one group of the brokers (the coordinators' group). Its leader hands
out a *map*: which node serves the shard, or none while the shard moves. The simulation keeps
the real system's rules and draws their timing:

* **Membership.** A node that starts joins after a rebalance; one that stops gracefully releases
  its shard and leaves at once; one that is killed stays a member, to the brokers, until its
  session times out (``node_session_ms``). Every change triggers a rebalance of the
  coordinators' group (``rebalance_ms``).
* **Two rounds per move** (KIP-429's cooperative protocol, as ``ShardAssignor`` moves a shard):
  a shard whose owner is still a member first goes to no one; its owner releases it when it
  hears that map, then rejoins, and the next round gives it to the new owner. A shard whose
  owner has left or died goes to the new owner in one round. So a node loads the shard only
  once no other node serves it.
* **Maps arrive late.** Every node hears each map after its own delay (``map_delay_ms``), so
  for a while two nodes may name different owners. A node answers FindCoordinator from the map
  it holds: the owner, or COORDINATOR_NOT_AVAILABLE while the shard moves or while the node is
  not in the group. A request for the group reaches a node that serves the shard, one that is
  loading it (COORDINATOR_LOAD_IN_PROGRESS), or one that does neither (NOT_COORDINATOR).
* **Taking the shard over** (claim, then replay from a hot standby's position) takes
  ``load_ms``; the replayed shard must equal the one released or killed.
* **Cut off from the brokers** (``cut``): a node whose requests to the brokers fail for a while
  but that its members and its log still reach. It hears no maps and cannot leave; the brokers
  drop it a session after they last heard from it. Its *lease* (``MembershipLease``) runs a
  session from when it sent its last accepted heartbeat, which is no later than the brokers
  received it, so it gives the shard up (answering NOT_COORDINATOR, and COORDINATOR_NOT_AVAILABLE
  to lookups for it) before another node can be handed it. Without the lease it would go on
  answering from memory while the next owner loads (``two-coordinators``). Once the cut heals
  it rejoins.

A killed or stopped node comes back after ``restart_ms``. Connections to a node die with it:
each start and each death bumps its incarnation, and messages of an older one are lost.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pystreams.sim.world import Simulation


@dataclass(frozen=True)
class ClusterTiming:
    #: The brokers' session timeout for the coordinators' group: a killed node keeps its place
    #: (and its shard, unserved) this long.
    node_session_ms: int = 1_000
    #: One rebalance of the coordinators' group, from the change that triggers it to the map.
    rebalance_ms: tuple[int, int] = (20, 200)
    #: How much later than the leader each node hears a new map.
    map_delay_ms: tuple[int, int] = (1, 100)
    #: Claiming the shard's partition and replaying what a hot standby has not seen.
    load_ms: tuple[int, int] = (10, 300)
    #: A node that stopped or was killed starts again after this long.
    restart_ms: tuple[int, int] = (100, 1_500)
    #: How often a node heartbeats the brokers (the runtime's session / 10).
    node_heartbeat_ms: int = 100
    #: How long a node stays cut off from the brokers.
    cut_ms: tuple[int, int] = (100, 2_500)

    def move_bound_ms(self) -> int:
        """The longest a node's cut, restart and the shard's move can take once faults stop."""
        rounds = 2 * (self.rebalance_ms[1] + self.map_delay_ms[1])
        return self.cut_ms[1] + self.restart_ms[1] + self.node_session_ms + 2 * rounds + self.load_ms[1]


@dataclass
class Node:
    name: str
    up: bool = False
    #: Bumped when the node starts and when it dies: connections to an older one are gone.
    incarnation: int = 0
    #: The map it holds: (generation, owner); None while it is not in the coordinators' group.
    map: tuple[int, str | None] | None = None
    #: Cut off from the brokers (not from its members or its log).
    cut: bool = False
    #: Its lease lapsed during the cut: it answers for no shard until it is back in the group.
    lapsed: bool = False
    #: Bumped by every cut and heal: a lapse scheduled for an earlier cut is void.
    cut_token: int = 0


class CoordinatorCluster:
    def __init__(self, world: Simulation, count: int, timing: ClusterTiming, rng: random.Random) -> None:
        self.world = world
        self.timing = timing
        self.rng = rng
        self.names = [f"c{i}" for i in range(count)]
        self.nodes = {name: Node(name) for name in self.names}
        #: The coordinators' group as the brokers see it, in joining order: node -> the
        #: incarnation that joined (a killed one stays until its session expires).
        self.members: dict[str, int] = {}
        self.generation = 0
        #: The owner named by the newest map (None: the shard is moving).
        self.owner: str | None = None
        #: The node whose shard is ``world.coordinator.shard``, and the one loading it.
        self.serving: str | None = None
        self.loading: str | None = None
        #: A node that joined and takes the shard over once its owner has released it.
        self.incoming: str | None = None
        self._load_token = 0
        self._rebalance_token = 0
        #: A rebalance of the coordinators' group is due (a node joined or left).
        self.rebalancing = False
        self.moves = 0
        self._last_owner: str | None = None

    # ------------------------------------------------------------------ node life

    def start(self, name: str) -> None:
        node = self.nodes[name]
        if node.up:
            return
        node.up = True
        node.incarnation += 1
        self.world.stats["cluster.node_starts"] += 1
        self.world.at(self.world.now + self.rng.randint(*self.timing.rebalance_ms), self._joined, name, node.incarnation)

    def kill(self, name: str) -> None:
        """SIGKILL: the node is gone at once; the brokers notice after its session."""
        node = self.nodes[name]
        if not node.up:
            return
        self.world.stats["cluster.node_kills"] += 1
        joined_as = self.members.get(name)
        self._down(node, graceful=False)
        if joined_as is not None:
            self.world.at(self.world.now + self.timing.node_session_ms, self._session_expired, name, joined_as)
        self._restart_later(name)

    def stop(self, name: str) -> None:
        """SIGTERM: the node releases its shard and leaves the coordinators' group (a node cut
        off from the brokers cannot: they drop it when its session runs out)."""
        node = self.nodes[name]
        if not node.up:
            return
        self.world.stats["cluster.node_stops"] += 1
        self._down(node, graceful=True)
        if not node.cut:
            self._leave(name)
        self._restart_later(name)

    def cut(self, name: str, duration_ms: int | None = None) -> None:
        """The node's requests to the brokers fail from now on, for ``duration_ms`` (drawn from
        ``cut_ms`` by default)."""
        node = self.nodes[name]
        if node.cut:
            return
        world, rng = self.world, self.rng
        world.stats["cluster.node_cuts"] += 1
        node.cut = True
        node.cut_token += 1
        joined_as = self.members.get(name)
        if joined_as is not None and node.up and joined_as == node.incarnation:
            # Its last accepted heartbeat left up to an interval ago and reached the brokers
            # after it left: their session runs from the arrival, its lease from the sending.
            sent = world.now - rng.randint(0, self.timing.node_heartbeat_ms)
            received = rng.randint(sent, world.now)
            world.at(received + self.timing.node_session_ms, self._cut_session_expired, name, joined_as, node.cut_token)
            world.at(max(world.now, sent + self.timing.node_session_ms), self._lease_lapsed, name, node.cut_token)
        world.at(world.now + (duration_ms if duration_ms is not None else rng.randint(*self.timing.cut_ms)), self._heal, name, node.cut_token)

    def _cut_session_expired(self, name: str, joined_as: int, cut_token: int) -> None:
        """The brokers drop a node cut off for a whole session (a heal first renews it)."""
        if self.nodes[name].cut_token == cut_token:
            self._session_expired(name, joined_as)

    def _lease_lapsed(self, name: str, cut_token: int) -> None:
        node = self.nodes[name]
        if not node.up or node.cut_token != cut_token:
            return  # healed (or dead) first
        self.world.stats["cluster.lease_lapses"] += 1
        node.lapsed = True
        self._give_up(name)

    def _heal(self, name: str, cut_token: int) -> None:
        node = self.nodes[name]
        if node.cut_token != cut_token:
            return
        node.cut = False
        node.cut_token += 1
        if not node.up:
            return
        if self.members.get(name) == node.incarnation:
            # Still a member: its next heartbeat says a rebalance it missed is on, or renews
            # its lease; either way it rejoins and hears the current map.
            node.lapsed = False
            self._rebalance_soon()
        else:
            node.map = None
            self.world.at(self.world.now + self.rng.randint(*self.timing.rebalance_ms), self._joined, name, node.incarnation)

    def _restart_later(self, name: str) -> None:
        self.world.at(self.world.now + self.rng.randint(*self.timing.restart_ms), self.start, name)

    def _down(self, node: Node, graceful: bool) -> None:
        world = self.world
        if self.serving == node.name:
            if graceful:
                self._release(node.name)
            else:
                world.kill_shard()
                self.serving = None
        if self.loading == node.name:
            self.loading = None
            self._load_token += 1
        node.up = False
        node.map = None
        node.incarnation += 1

    def _joined(self, name: str, incarnation: int) -> None:
        node = self.nodes[name]
        if not node.up or node.incarnation != incarnation or self.members.get(name) == incarnation or node.cut:
            return  # a node cut off joins once the cut heals
        node.lapsed = False
        # A node that was killed and rejoins before its session expired replaces its old self.
        self.members.pop(name, None)
        self.members[name] = incarnation
        # Sticky and balanced: a node that joins takes the shard over as often as a fair share.
        if self.owner is not None and self.owner != name and self.incoming is None and self.rng.random() < 1 / len(self.members):
            self.incoming = name
        self._rebalance_soon()

    def _session_expired(self, name: str, joined_as: int) -> None:
        """The brokers notice a killed node (unless it came back and joined again meanwhile)."""
        if self.members.get(name) == joined_as:
            self._leave(name)

    def _leave(self, name: str) -> None:
        if name in self.members:
            del self.members[name]
            if self.incoming == name:
                self.incoming = None
            self._rebalance_soon()

    # ------------------------------------------------------------------ the coordinators' group

    def _rebalance_soon(self) -> None:
        self._rebalance_token += 1
        self.rebalancing = True
        self.world.at(self.world.now + self.rng.randint(*self.timing.rebalance_ms), self._rebalance, self._rebalance_token)

    def _rebalance(self, token: int) -> None:
        if token != self._rebalance_token:
            return  # a later change restarted the rebalance
        self.rebalancing = False
        members = list(self.members)
        incoming = self.incoming if self.incoming in self.members else None
        # Every rebalance hands every member a map, even one that changes nothing.
        holder = self.serving or self.loading
        if holder is not None and holder in members:
            if incoming is None or incoming == holder:
                self.incoming = None
                self._publish(holder)  # sticky
            else:
                self._publish(None)  # round 1: the holder gives the shard up first
            return
        if incoming is not None:
            chosen: str | None = incoming
        elif self.owner in self.members:
            chosen = self.owner  # sticky: named, not loaded yet (or restarted and back)
        else:
            chosen = self.rng.choice(members) if members else None
        self.incoming = None
        self._publish(chosen)

    def _publish(self, owner: str | None) -> None:
        self.generation += 1
        self.owner = owner
        if owner is not None and owner != self._last_owner:
            self.moves += 1
            self._last_owner = owner
        for name, joined_as in self.members.items():
            self.world.at(self.world.now + self.rng.randint(*self.timing.map_delay_ms), self._hear_map, name, joined_as, self.generation, owner)

    def _hear_map(self, name: str, incarnation: int, generation: int, owner: str | None) -> None:
        node = self.nodes[name]
        if not node.up or node.incarnation != incarnation or generation != self.generation:
            return  # a later rebalance has begun: the node rejoins instead of acting on this one
        if node.cut:
            return  # the map does not reach it; it rejoins once the cut heals
        node.map = (generation, owner)
        if owner == name:
            if self.serving != name and self.loading != name:
                self._load(name)
            return
        held = self._give_up(name)
        if held and name in self.members:
            self._rebalance_soon()  # it rejoins having given the shard up: round 2

    def _give_up(self, name: str) -> bool:
        """The node stops loading or serving the shard; whether it had it."""
        held = self.loading == name or self.serving == name
        if self.loading == name:
            self.loading = None
            self._load_token += 1
        if self.serving == name:
            self._release(name)
        return held

    # ------------------------------------------------------------------ serving the shard

    def _load(self, name: str) -> None:
        world = self.world
        if self.serving is not None or self.loading is not None:
            # The rounds must never let two nodes take the shard (the claim would fence one).
            world.violation("two-coordinators", f"{name} takes the shard over while {self.serving or self.loading} has it")
            return
        self.loading = name
        self._load_token += 1
        world.at(world.now + self.rng.randint(*self.timing.load_ms), self._loaded, name, self._load_token)

    def _loaded(self, name: str, token: int) -> None:
        if token != self._load_token or self.loading != name:
            return
        self.loading = None
        self.serving = name
        self.world.load_shard()

    def _release(self, name: str) -> None:
        assert self.serving == name
        self.serving = None
        self.world.release_shard()

    # ------------------------------------------------------------------ what a node answers

    def alive(self, name: str, incarnation: int) -> bool:
        """Whether that life of the node is up (its connections stand)."""
        node = self.nodes[name]
        return node.up and node.incarnation == incarnation

    def status(self, name: str) -> str:
        """ "serving", "loading" or "elsewhere": how the node answers a request for the group."""
        if self.serving == name:
            return "serving"
        if self.loading == name:
            return "loading"
        return "elsewhere"

    def locate(self, name: str) -> str | None:
        """The owner the node names in a FindCoordinator answer (None: not available)."""
        node = self.nodes[name]
        if node.map is None or (node.lapsed and node.map[1] == name):
            return None
        return node.map[1]

    def settled(self) -> bool:
        """Every node up, reaching the brokers and in the group, no rebalance of the group due
        (a node that just joined may take the shard over), and the shard served by the node
        the map names."""
        return (
            all(node.up and not node.cut for node in self.nodes.values())
            and len(self.members) == len(self.names)
            and not self.rebalancing
            and self.incoming is None
            and self.serving is not None
            and self.serving == self.owner
        )

    def start_all(self) -> None:
        for name in self.names:
            self.start(name)
