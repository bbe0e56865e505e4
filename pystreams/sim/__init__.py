"""Deterministic simulation of KIP-848 consumer groups (KIP-848 "Test Plan").

The real coordinator shard and the real member state machines, driven by one seeded event
loop: a virtual clock, a faulty network, crashing and restarting members, coordinator
fail-over by log replay (or, with several coordinator nodes, the shard moving between them and
members finding it), topic changes, misbehaving client-side assignors and version rolls.
Invariants are checked after every step; ``run_seed(seed, profile)`` replays a seed exactly.

* ``world`` — the event loop and the world (``Simulation``), ``scenario`` — seeded random
  scenarios per ``profiles``, ``batch`` — many seeds; ``invariants`` — what must always hold;
  ``process``, ``coordinator``, ``cluster``, ``network``, ``assignors``, ``events`` — the parts.
"""

from pystreams.sim.batch import BatchSummary, run_seeds
from pystreams.sim.invariants import Violation
from pystreams.sim.profiles import PROFILES, Profile
from pystreams.sim.scenario import SeedResult, convergence_bound_ms, run_seed
from pystreams.sim.world import Simulation, Timing

__all__ = [
    "PROFILES",
    "BatchSummary",
    "Profile",
    "SeedResult",
    "Simulation",
    "Timing",
    "Violation",
    "convergence_bound_ms",
    "run_seed",
    "run_seeds",
]
