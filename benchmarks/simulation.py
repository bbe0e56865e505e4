"""Benchmarks of the deterministic simulator; prints JSON.

* ``steps_per_second`` — how fast the simulator runs each fault profile (wall clock, with every
  invariant checked after every step), and seeds per second.
* ``rebalance`` — a group of 10 members consuming 1,000 partitions grows to 11 members, then
  shrinks to 9 (two members leave gracefully), over a delaying network (1-10 ms). For the
  ``uniform`` server-side assignor and for a client-side assignor (the simulator's sticky one),
  the distribution over seeds of the simulated time and of the heartbeats (all members) from
  the change until the group is STABLE with every member owning its target.

Usage: ``python benchmarks/simulation.py [--seeds N] [--rebalance-seeds N]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from pystreams.sim import PROFILES, Simulation, run_seed
from pystreams.sim.network import NetworkFaults
from pystreams.sim.process import ProcessSpec

MEMBERS = 10
PARTITIONS = 1_000
TOPIC = "events"
DEADLINE_MS = 120_000


def steps_per_second(seeds: int) -> dict:
    out = {}
    for name in ("steady", "churn", "chaos"):
        started = time.perf_counter()
        steps = violations = 0
        for seed in range(seeds):
            result = run_seed(seed, name)
            steps += result.steps
            violations += not result.ok
        elapsed = time.perf_counter() - started
        out[name] = {
            "seeds": seeds,
            "steps": steps,
            "steps_per_second": round(steps / elapsed),
            "seeds_per_second": round(seeds / elapsed, 1),
            "seconds_per_1000_seeds": round(elapsed * 1000 / seeds, 1),
            "violations": violations,
        }
    return out


def _spec(index: int, client_side: bool) -> ProcessSpec:
    return ProcessSpec(
        name=f"p{index}",
        topics=(TOPIC,),
        server_assignor=None if client_side else "uniform",
        client_versions=(1, 1, 1) if client_side else None,
    )


def _until_stable(world: Simulation) -> tuple[int, int]:
    """(simulated ms, heartbeats) until the group converges; raises if it does not."""
    started, heartbeats = world.now, world.stats["heartbeats"]
    if not world.run_until(world.now + DEADLINE_MS, until=world.converged, probe_every_ms=5):
        raise RuntimeError(f"seed {world.seed}: {world.violations or world.convergence_gap()}")
    return world.now - started, world.stats["heartbeats"] - heartbeats


def grow_and_shrink(seed: int, client_side: bool) -> dict[str, tuple[int, int]]:
    world = Simulation(seed)
    world.network.faults = NetworkFaults(min_delay_ms=1, max_delay_ms=10)
    world.create_topic(TOPIC, PARTITIONS)
    for index in range(MEMBERS):
        world.add_process(_spec(index, client_side))
    _until_stable(world)
    world.add_process(_spec(MEMBERS, client_side))
    grow = _until_stable(world)
    for process in world.rng.sample(sorted(world.live_processes(), key=lambda p: p.name), 2):
        process.wanted = False
        process.leave(permanent=True)
    shrink = _until_stable(world)
    return {"grow_10_to_11": grow, "shrink_11_to_9": shrink}


def _distribution(values: list[int]) -> dict:
    values = sorted(values)
    return {
        "min": values[0],
        "p50": values[len(values) // 2],
        "p90": values[min(len(values) - 1, int(len(values) * 0.9))],
        "max": values[-1],
        "mean": round(statistics.fmean(values), 1),
    }


def rebalance(seeds: int) -> dict:
    out = {}
    for label, client_side in (("uniform (server side)", False), ("sim-sticky (client side)", True)):
        runs = [grow_and_shrink(seed, client_side) for seed in range(seeds)]
        out[label] = {
            change: {
                "simulated_ms_to_stable": _distribution([run[change][0] for run in runs]),
                "heartbeats_to_stable": _distribution([run[change][1] for run in runs]),
            }
            for change in ("grow_10_to_11", "shrink_11_to_9")
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=300, help="seeds per profile for steps/second")
    parser.add_argument("--rebalance-seeds", type=int, default=20, help="seeds per assignor for the grow/shrink runs")
    args = parser.parse_args(argv)
    timing = Simulation(0).timing
    report = {
        "python": sys.version.split()[0],
        "timing": {
            "heartbeat_interval_ms": timing.heartbeat_interval_ms,
            "session_timeout_ms": timing.session_timeout_ms,
            "rebalance_timeout_ms": timing.rebalance_timeout_ms,
        },
        "steps_per_second": steps_per_second(args.seeds),
        "rebalance": {
            "members": MEMBERS,
            "partitions": PARTITIONS,
            "network_delay_ms": [1, 10],
            "seeds": args.rebalance_seeds,
            "results": rebalance(args.rebalance_seeds),
        },
        "profiles": sorted(PROFILES),
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
