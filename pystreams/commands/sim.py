"""``pystreams sim``: run the deterministic simulation of KIP-848 groups over many seeds.

``--seeds N --profile P`` runs seeds ``--first-seed`` .. ``--first-seed + N - 1`` and prints a
summary (seeds, steps, simulated time, violations, convergence after faults stopped); each
failing seed is printed with a one-line command that replays it. ``--seed S`` runs one seed;
if it fails, the last events before the violation are printed too. Exit status 1 on any
violation.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from pystreams.sim.profiles import PROFILES

HELP = "deterministic simulation: real coordinator and members, faults, invariants, many seeds"
PROFILE_NAMES = tuple(PROFILES)
TRACE_LINES = 60


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--profile", choices=PROFILE_NAMES, default="chaos", help="fault profile (default: chaos)")
    parser.add_argument("--seeds", type=int, default=100, metavar="N", help="how many seeds to run (default: 100)")
    parser.add_argument("--first-seed", type=int, default=0, metavar="F", help="the first seed of the range (default: 0)")
    parser.add_argument("--seed", type=int, metavar="S", help="run (replay) this one seed only")
    parser.add_argument("--jobs", type=int, default=1, metavar="J", help="worker processes for a batch (default: 1)")
    parser.add_argument("--chunk", type=int, default=100, metavar="C", help="seeds per chunk (default: 100)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


def run(args: argparse.Namespace) -> int:
    if args.seed is not None:
        return _run_one(args.seed, args.profile, as_json=args.json)
    if args.seeds < 1:
        print("--seeds must be at least 1", file=sys.stderr)
        return 2
    from pystreams.sim.batch import run_seeds

    seeds = range(args.first_seed, args.first_seed + args.seeds)
    started = time.perf_counter()  # wall time of the batch, for the report only
    summary = run_seeds(args.profile, seeds, chunk_size=max(1, args.chunk), jobs=max(1, args.jobs))
    elapsed = time.perf_counter() - started
    convergence = summary.convergence()
    if args.json:
        print(
            json.dumps(
                {
                    "profile": summary.profile,
                    "seeds": summary.seeds,
                    "first_seed": args.first_seed,
                    "steps": summary.steps,
                    "simulated_ms": summary.simulated_ms,
                    "violations": summary.violations,
                    "failures": [{"seed": f.seed, "violation": str(f.violations[0]), "replay": f.replay_command} for f in summary.failures],
                    "convergence_after_faults": convergence,
                    "wall_seconds": round(elapsed, 2),
                },
                indent=2,
            )
        )
    else:
        print(
            f"profile {summary.profile}: {summary.seeds} seeds ({seeds.start}..{seeds.stop - 1}), "
            f"{summary.steps:,} steps, {summary.simulated_ms / 1000:,.0f} s simulated, "
            f"{summary.violations} violation(s); {elapsed:.1f} s wall ({summary.seeds / max(elapsed, 1e-9):.0f} seeds/s)"
        )
        if convergence["max_ms"] is not None:
            print(
                f"convergence after faults stopped: p50 {convergence['p50_ms']} ms, p99 {convergence['p99_ms']} ms, "
                f"max {convergence['max_ms']} ms (bound {convergence['bound_ms']} ms)"
            )
        for failure in summary.failures:
            print(f"FAIL seed {failure.seed}: {failure.violations[0]}")
            print(f"  replay: {failure.replay_command}")
    return 0 if summary.ok else 1


def _run_one(seed: int, profile: str, *, as_json: bool) -> int:
    from pystreams.sim.scenario import run_seed

    result = run_seed(seed, profile, trace=True)
    if as_json:
        print(
            json.dumps(
                {
                    "profile": result.profile,
                    "seed": result.seed,
                    "steps": result.steps,
                    "simulated_ms": result.simulated_ms,
                    "faults_stopped_at_ms": result.faults_stopped_at_ms,
                    "converged_after_ms": result.converged_after_ms,
                    "violations": [str(v) for v in result.violations],
                    "fingerprint": result.fingerprint,
                    "trace": result.trace[-TRACE_LINES:] if result.violations else [],
                },
                indent=2,
            )
        )
        return 0 if result.ok else 1
    if result.violations:
        print(f"the last {TRACE_LINES} events before the violation (time ms, step, event):")
        for line in result.trace[-TRACE_LINES:]:
            print(f"  {line}")
    converged = "never" if result.converged_after_ms is None else f"{result.converged_after_ms} ms after faults stopped"
    print(
        f"profile {result.profile} seed {seed}: {result.steps:,} steps, {result.simulated_ms} ms simulated, "
        f"faults stopped at {result.faults_stopped_at_ms} ms, converged {converged}; fingerprint {result.fingerprint}"
    )
    for violation in result.violations:
        print(f"VIOLATION {violation}")
    if result.violations:
        print(f"replay: {result.replay_command}")
    return 0 if result.ok else 1
