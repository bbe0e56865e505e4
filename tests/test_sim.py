"""The deterministic simulator itself: replay, coverage of its faults, convergence, the CLI."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections import Counter

import pytest

from pystreams.commands import sim as sim_command
from pystreams.sim import PROFILES, Simulation, convergence_bound_ms, run_seed
from pystreams.sim.network import NetworkFaults
from pystreams.sim.process import ProcessSpec
from pystreams.sim.world import Timing


def test_a_seed_determines_the_whole_run():
    first, again = run_seed(7, "chaos"), run_seed(7, "chaos")
    assert (first.steps, first.simulated_ms, first.fingerprint) == (again.steps, again.simulated_ms, again.fingerprint)
    assert run_seed(8, "chaos").fingerprint != first.fingerprint


def test_a_seed_replays_exactly_in_another_interpreter():
    """String hashing differs between interpreters; the run must not depend on it."""
    code = "from pystreams.sim import run_seed; print(run_seed(11, 'chaos').fingerprint)"
    fingerprints = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": hash_seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        for hash_seed in ("1", "2")
    }
    assert fingerprints == {run_seed(11, "chaos").fingerprint}


def _stats(profile: str, seeds: range) -> Counter:
    total = Counter()
    for seed in seeds:
        total.update(run_seed(seed, profile).stats)
    return total


def test_churn_moves_members_and_topics():
    stats = _stats("churn", range(40))
    for key in (
        "churn.crashes",
        "churn.bounces",
        "churn.joins",
        "churn.departures",
        "process.unreleased_instance_id",
        "topics.changes",
        "revocations",
        "commits.accepted",
    ):
        assert stats[key] > 0, key
    for key in ("coordinator.failovers", "net.dropped", "net.duplicated", "net.partitions", "assignor.invalid"):
        assert stats[key] == 0, key


def test_chaos_exercises_every_fault():
    stats = _stats("chaos", range(60))
    for key in (
        "net.dropped",
        "net.duplicated",
        "net.straggled",
        "net.partitions",
        "net.cut",
        "net.lost_in_failover",
        "coordinator.failovers",
        "coordinator.refused_while_loading",
        "requests.timed_out",
        "answers.unexpected",
        "churn.crashes",
        "churn.bounces",
        "churn.joins",
        "process.unreleased_instance_id",
        "topics.changes",
        "assignor.slow",
        "assignor.raise",
        "assignor.error",
        "assignor.invalid",
        "assignor.installed",
        "app.slow_revocations",
        "roll.restarts",
        "roll.phases",
    ):
        assert stats[key] > 0, key


def test_steady_profile_only_delays():
    stats = _stats("steady", range(20))
    assert stats["heartbeats"] > 0 and stats["commits.accepted"] > 0
    assert not any(key.startswith(("churn.", "assignor.raise", "coordinator.")) or key in ("net.dropped", "net.cut") for key in stats)


@pytest.mark.parametrize("client_side", [False, True], ids=["uniform", "client-side"])
def test_a_group_forms_and_every_partition_is_owned_once(client_side):
    world = Simulation(3)
    world.network.faults = NetworkFaults(min_delay_ms=1, max_delay_ms=10)
    world.create_topic("orders", 12)
    world.create_topic("payments", 5)
    for index in range(4):
        world.add_process(
            ProcessSpec(
                name=f"p{index}",
                topics=("orders", "payments"),
                instance_id=f"i{index}" if index % 2 else None,
                server_assignor=None if client_side else "uniform",
                client_versions=(1, 1, 1) if client_side else None,
            )
        )
    assert world.run_until(10_000, until=world.converged)
    owned = [partition for process in world.live_processes() for partition in process.view()]
    assert len(owned) == len(set(owned)) == 17
    assert not world.violations


def test_failover_replays_the_log_into_the_same_state():
    world = Simulation(5)
    world.create_topic("orders", 6)
    for index in range(3):
        world.add_process(ProcessSpec(name=f"p{index}", topics=("orders",)))
    assert world.run_until(5_000, until=world.converged)
    epoch = world.coordinator.shard.groups[world.group_id].group_epoch
    world.fail_over(load_ms=100)
    assert not world.coordinator.up
    world.run_until(world.now + 200)
    assert world.coordinator.up and world.coordinator.failovers == 1
    assert world.coordinator.shard.groups[world.group_id].group_epoch >= epoch
    assert world.run_until(world.now + 10_000, until=world.converged)
    assert not world.violations


def test_faults_stop_and_the_group_converges_within_the_bound():
    bound = convergence_bound_ms(Timing())
    for seed in range(10):
        result = run_seed(seed, "churn")
        assert result.ok, result.violations
        assert result.converged_after_ms is not None and result.converged_after_ms <= bound


def test_a_failure_names_its_seed_and_the_command_that_replays_it():
    result = run_seed(4, "chaos")
    assert result.replay_command == "pystreams sim --profile chaos --seed 4"


def _cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="pystreams sim")
    sim_command.configure(parser)
    return sim_command.run(parser.parse_args(argv))


def test_cli_prints_a_summary(capsys):
    assert _cli(["--profile", "steady", "--seeds", "5", "--chunk", "2"]) == 0
    out = capsys.readouterr().out
    assert "profile steady: 5 seeds (0..4)" in out and "0 violation(s)" in out


def test_cli_replays_one_seed(capsys):
    assert _cli(["--profile", "churn", "--seed", "2"]) == 0
    out = capsys.readouterr().out
    assert "profile churn seed 2:" in out and f"fingerprint {run_seed(2, 'churn').fingerprint}" in out


def test_profiles_are_the_documented_ones():
    assert {"steady", "churn", "chaos"} <= set(PROFILES) <= set(sim_command.PROFILE_NAMES)


def _accept_commits_at_any_epoch(monkeypatch):
    from pystreams.coordinator.consumer_group import ConsumerGroup

    monkeypatch.setattr(ConsumerGroup, "_validate_member_epoch", lambda self, member_id, member_epoch: None)


def test_cli_prints_each_failing_seed_with_its_replay_command(monkeypatch, capsys):
    _accept_commits_at_any_epoch(monkeypatch)
    assert _cli(["--profile", "churn", "--seeds", "10"]) == 1
    out = capsys.readouterr().out
    failing = [line for line in out.splitlines() if line.startswith("FAIL seed ")]
    assert failing and "stale-commit-accepted" in out
    seed = int(failing[0].split()[2].rstrip(":"))
    assert f"  replay: pystreams sim --profile churn --seed {seed}" in out
    assert _cli(["--profile", "churn", "--seed", str(seed)]) == 1
    replay = capsys.readouterr().out
    assert "the last 60 events before the violation" in replay and "VIOLATION [stale-commit-accepted]" in replay
