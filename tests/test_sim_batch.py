"""Thousands of simulation seeds across the profiles, in chunks of 100 (one test per chunk).

2,600 seeds take about a minute on one core, so they stay in the default run. A failing chunk
lists each failing seed with its violation and the command that replays it.
"""

from __future__ import annotations

import pytest

from pystreams.sim import run_seed
from pystreams.sim.batch import run_chunk

CHUNK = 100
SEEDS_PER_PROFILE = {"steady": 400, "churn": 800, "chaos": 1_000, "migration": 400, "cluster": 400}
CHUNKS = [(profile, start) for profile, count in SEEDS_PER_PROFILE.items() for start in range(0, count, CHUNK)]


@pytest.mark.parametrize(("profile", "start"), CHUNKS, ids=[f"{p}-{s}" for p, s in CHUNKS])
def test_seeds_keep_every_invariant_and_converge(profile, start):
    summary = run_chunk(profile, range(start, start + CHUNK))
    assert summary.seeds == CHUNK
    report = "\n".join(f"seed {f.seed}: {f.violations[0]}\n  replay: {f.replay_command}" for f in summary.failures)
    assert summary.ok, f"{summary.violations} of {CHUNK} {profile} seeds failed:\n{report}"


#: Seeds that exposed protocol bugs in the coordinator or the member client (each also fails
#: on some partially fixed code); they must pass once, and as long as, those bugs are fixed.
REGRESSION_SEEDS = [
    ("chaos", 66),  # member never heard of its revocation: removed while still processing
    ("chaos", 276),  # leave() during a revocation: no revocation guard while leaving
    ("chaos", 8),  # a known member rejoining with epoch 0 kept its revocation and its old timer
    ("chaos", 1091),
    ("chaos", 625),  # a Prepare from a member not yet notified left the computation without deadline
    ("chaos", 777),
    ("churn", 606),  # a static member replaced during a client-side computation got no target
    ("migration", 21),  # a classic member revoking before its leave ignored the rebalance that removed it
    ("migration", 8),  # a cooperative classic member kept its partitions while its JoinGroup went unanswered
    ("migration", 31),
    ("migration", 47),  # an upgrade mid-rebalance by a static replacement kept a target covering too little
    ("migration", 39),
    ("migration", 219),  # a classic group rebalancing with no members refused every protocol
    ("migration", 359),  # a static member never told of a rebalance shorter than its session kept its partitions
    ("migration", 391),
    ("migration", 192),  # a downgrade by a static replacement handed out a target not reached yet
    ("migration", 118),  # an upgrade mid-rebalance forgot what cooperative members still owned
    ("migration", 200),
    ("migration", 290),  # a failed SyncGroup and a lost rejoin: the coordinator's sync timer ran on
    ("migration", 179),
    ("migration", 20),  # the silence bound counted from a long-polled JoinGroup: no convergence
    # Fresh seeds (100000..104999): a downgrade wrote targets, not what members held, as the
    # classic assignments; an upgrade before the rebalance ended handed out held partitions.
    ("migration", 101460),
    ("migration", 103461),
    ("migration", 104217),
    ("migration", 104488),
    ("migration", 104682),
    ("migration", 100561),
    ("migration", 101701),
    ("migration", 102392),
    ("migration", 102514),
    ("migration", 104571),
    # A static replacement lost in a fail-over fenced the member that made it, and a generation
    # handed out again after one: Kafka's behaviour, which the invariants had refused.
    ("migration", 101375),
    ("migration", 103147),
    ("migration", 100357),
    # No convergence: a guarded cooperative member that gave up what it had reported never
    # rejoined; stale assignments handed back to a returning static member, kept by a load, or
    # unwatched after a conversion without a rebalance; partitions added meanwhile.
    ("migration", 101356),
    ("migration", 101469),
    ("migration", 101613),
    ("migration", 102217),
    ("migration", 102358),
    ("migration", 102559),
    ("migration", 104060),
    ("migration", 104590),
    # A guarded classic member leaving while its SyncGroup was lost: leave() turned what it owned
    # into revocations, which the sync-timer guard did not count, and kept them past its removal.
    ("migration", 103095),
    # Fresh seeds (1000000..1019999): a classic member rejoining on its own (a topic change)
    # counted its guard from its lost JoinGroup, not from its last answer, and kept partitions
    # handed on by a rebalance it never heard of; a KIP-848 member removed while cut off, its
    # group converted back to classic, died on GROUP_ID_NOT_FOUND instead of rejoining.
    ("migration", 1016713),
    ("migration", 1001270),
    ("migration", 1002588),
    ("migration", 1011071),
    ("migration", 1011981),
    ("migration", 1012499),
    ("migration", 1016729),
    ("migration", 1017190),
    ("migration", 1017236),
    ("migration", 1002341),
    ("cluster", 30004649),  # a generation a released shard told in a JoinGroup answer, arriving after the release, was checked against the written one
    # Fresh seeds (40000000..40004999): a node back from a cut rejoined and took the shard over
    # after the checker had called the group converged (a rebalance of the nodes was still due).
    ("cluster", 40000741),
    ("cluster", 40002005),
]


@pytest.mark.parametrize(("profile", "seed"), REGRESSION_SEEDS, ids=[f"{p}-{s}" for p, s in REGRESSION_SEEDS])
def test_seeds_that_found_bugs(profile, seed):
    result = run_seed(profile=profile, seed=seed)
    assert result.ok, f"{result.violations[0]}\n  replay: {result.replay_command}"
