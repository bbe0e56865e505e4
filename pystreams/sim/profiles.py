"""Fault profiles: how hard a random scenario shakes the group while faults last.

* ``steady`` — a group forms and runs; the network only delays.
* ``churn`` — members join, leave, crash and restart (static members bounce with -2, or crash
  and crash-loop on UNRELEASED_INSTANCE_ID until their session expires); partitions are added
  and topics matching the regex subscription are created.
* ``chaos`` — churn plus a lossy network (drops, duplicates, stragglers that overtake later
  messages and outlive request timeouts, cut links), coordinator fail-overs, client-side
  assignors that are slow, raise, return an error or an invalid assignment, applications slower
  than the rebalance timeout to revoke, and rolling upgrades that change assignor version ranges.
* ``migration`` — a fleet of classic members (Kafka's consumer, eager or cooperative) rolled to
  KIP-848 and back one process at a time (online migration both ways), under churn, a lossy
  network and coordinator fail-overs; server-side assignors.
* ``cluster`` — three coordinator nodes share the group's shard: nodes are killed (the shard
  waits for the brokers to notice) and restarted gracefully (the shard moves in two rounds), a
  node that comes back may take the shard over, a node cut off from the brokers gives the shard
  up when its lease lapses, and members find the node that serves the group with
  FindCoordinator and follow NOT_COORDINATOR; under churn, a lossy network, KIP-848 and
  classic members (server-side assignors), or client-side assignors that misbehave.
* ``hostile`` — chaos on a network that also duplicates and reorders a member's requests,
  which KIP-848 does not survive by design (see ``pystreams.sim.network``); for exploration.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pystreams.sim.network import NetworkFaults
from pystreams.sim.world import CALM, Misbehaviour


@dataclass(frozen=True)
class Profile:
    name: str
    #: How long faults last (ms), drawn per seed; then they stop and the group must converge.
    fault_ms: tuple[int, int]
    network: NetworkFaults
    #: The network once faults stop (delays only).
    calm_network: NetworkFaults
    churn_per_s: float = 0.0
    topic_changes_per_s: float = 0.0
    failovers_per_s: float = 0.0
    cuts_per_s: float = 0.0
    cut_ms: tuple[int, int] = (100, 3_000)
    misbehaviour: Misbehaviour = CALM
    #: Probability that a seed with client-side assignors rolls out new version ranges.
    roll: float = 0.0
    #: Share of seeds whose members use the client-side assignor (else server side).
    client_side: float = 0.4
    static_members: float = 0.5
    regex_subscriptions: float = 0.5
    members: tuple[int, int] = (2, 5)
    max_joins: int = 2
    #: Share of processes that start with the classic protocol.
    classic: float = 0.0
    #: Processes restarted with the other group protocol, per second.
    protocol_flips_per_s: float = 0.0
    #: Coordinator nodes sharing the shard (``pystreams.sim.cluster``); with one, the
    #: coordinator fails over in place (``failovers_per_s``).
    nodes: int = 1
    #: Coordinator nodes SIGKILLed, and stopped gracefully, per second (each comes back).
    node_kills_per_s: float = 0.0
    node_stops_per_s: float = 0.0
    #: Coordinator nodes cut off from the brokers (not from their members), per second.
    node_cuts_per_s: float = 0.0


PROFILES: dict[str, Profile] = {
    "steady": Profile(
        name="steady",
        fault_ms=(1_500, 3_000),
        network=NetworkFaults(min_delay_ms=1, max_delay_ms=10),
        calm_network=NetworkFaults(min_delay_ms=1, max_delay_ms=10),
    ),
    "churn": Profile(
        name="churn",
        fault_ms=(3_000, 6_000),
        network=NetworkFaults(min_delay_ms=1, max_delay_ms=20),
        calm_network=NetworkFaults(min_delay_ms=1, max_delay_ms=20),
        churn_per_s=1.5,
        topic_changes_per_s=0.4,
        misbehaviour=Misbehaviour(restart_ms=(50, 2_500)),
    ),
    "chaos": Profile(
        name="chaos",
        fault_ms=(3_000, 6_000),
        network=NetworkFaults(min_delay_ms=1, max_delay_ms=40, drop=0.04, duplicate=0.03, straggle=0.03, straggle_max_ms=1_500),
        calm_network=NetworkFaults(min_delay_ms=1, max_delay_ms=20),
        churn_per_s=1.0,
        topic_changes_per_s=0.3,
        failovers_per_s=0.2,
        cuts_per_s=0.3,
        misbehaviour=Misbehaviour(assignor=0.4, slow_revocation=0.1, restart_ms=(50, 2_500)),
        roll=0.5,
        client_side=0.5,
    ),
}

PROFILES["migration"] = Profile(
    name="migration",
    fault_ms=(4_000, 8_000),
    network=NetworkFaults(min_delay_ms=1, max_delay_ms=40, drop=0.03, duplicate=0.02, straggle=0.02, straggle_max_ms=1_000),
    calm_network=NetworkFaults(min_delay_ms=1, max_delay_ms=20),
    churn_per_s=0.6,
    topic_changes_per_s=0.3,
    failovers_per_s=0.2,
    cuts_per_s=0.2,
    misbehaviour=Misbehaviour(slow_revocation=0.1, restart_ms=(50, 1_500)),
    client_side=0.0,
    classic=1.0,
    protocol_flips_per_s=1.0,
)

PROFILES["cluster"] = Profile(
    name="cluster",
    fault_ms=(4_000, 8_000),
    network=NetworkFaults(min_delay_ms=1, max_delay_ms=30, drop=0.02, duplicate=0.02, straggle=0.02, straggle_max_ms=1_000),
    calm_network=NetworkFaults(min_delay_ms=1, max_delay_ms=20),
    churn_per_s=0.8,
    topic_changes_per_s=0.3,
    cuts_per_s=0.2,
    misbehaviour=Misbehaviour(assignor=0.2, slow_revocation=0.1, restart_ms=(50, 1_500)),
    client_side=0.4,
    # Classic members (and flips between the protocols) in the seeds with server-side assignors.
    classic=0.3,
    protocol_flips_per_s=0.3,
    nodes=3,
    node_kills_per_s=0.4,
    node_stops_per_s=0.4,
    node_cuts_per_s=0.3,
)

# Chaos on a network that also duplicates requests and lets one member's requests overtake each
# other: outside what KIP-848 assumes of a Kafka connection (see pystreams.sim.network). Not part
# of the regular runs; it shows what a heartbeat without a sequence number cannot survive.
PROFILES["hostile"] = replace(
    PROFILES["chaos"],
    name="hostile",
    network=replace(PROFILES["chaos"].network, duplicate_requests=0.03, ordered_requests=False),
)
