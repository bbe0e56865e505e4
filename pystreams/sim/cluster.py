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

    def move_bound_ms(self) -> int:
        """The longest a node's restart and the shard's move can take once faults stop."""
        rounds = 2 * (self.rebalance_ms[1] + self.map_delay_ms[1])
        return self.restart_ms[1] + self.node_session_ms + 2 * rounds + self.load_ms[1]


@dataclass
class Node:
    name: str
    up: bool = False
    #: Bumped when the node starts and when it dies: connections to an older one are gone.
    incarnation: int = 0
    #: The map it holds: (generation, owner); None while it is not in the coordinators' group.
    map: tuple[int, str | None] | None = None


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
        """SIGTERM: the node releases its shard and leaves the coordinators' group."""
        node = self.nodes[name]
        if not node.up:
            return
        self.world.stats["cluster.node_stops"] += 1
        self._down(node, graceful=True)
        self._leave(name)
        self._restart_later(name)

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
        if not node.up or node.incarnation != incarnation or self.members.get(name) == incarnation:
            return
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
        self.world.at(self.world.now + self.rng.randint(*self.timing.rebalance_ms), self._rebalance, self._rebalance_token)

    def _rebalance(self, token: int) -> None:
        if token != self._rebalance_token:
            return  # a later change restarted the rebalance
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
        node.map = (generation, owner)
        if owner == name:
            if self.serving != name and self.loading != name:
                self._load(name)
            return
        held = self.loading == name or self.serving == name
        if self.loading == name:
            self.loading = None
            self._load_token += 1
        if self.serving == name:
            self._release(name)
        if held and name in self.members:
            self._rebalance_soon()  # it rejoins having given the shard up: round 2

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
        held = self.nodes[name].map
        return held[1] if held is not None else None

    def settled(self) -> bool:
        """Every node up and in the group, and the shard served by the node the map names."""
        return all(node.up for node in self.nodes.values()) and len(self.members) == len(self.names) and self.serving is not None and self.serving == self.owner

    def start_all(self) -> None:
        for name in self.names:
            self.start(name)
