"""The simulator catches broken rules: each test breaks one (by monkeypatching the real code,
never by a switch in it) and asserts that some seed reports the violation it must, that the
same seed passes with the rule intact, and that the seed replays to the same report."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

import pystreams.coordinator.consumer as consumer
from pystreams.client.member import ConsumerGroupMember
from pystreams.coordinator import records
from pystreams.coordinator.consumer_group import ConsumerGroup
from pystreams.coordinator.context import ShardContext
from pystreams.partitions import PartitionSet
from pystreams.sim import PROFILES, Profile, run_seed
from pystreams.sim.scenario import SeedResult
from pystreams.sim.world import Misbehaviour

#: Churn plus applications that take a while (less than the rebalance timeout) to revoke.
SLOW_APPS = replace(
    PROFILES["churn"],
    name="slow-apps",
    misbehaviour=Misbehaviour(slow_revocation=0.5, slow_revocation_ms=(200, 800), restart_ms=(50, 2_500)),
)
#: Churn where every member uses the client-side assignor, which misbehaves half the time.
BAD_ASSIGNORS = replace(
    PROFILES["churn"],
    name="bad-assignors",
    client_side=1.0,
    misbehaviour=Misbehaviour(assignor=0.5, restart_ms=(50, 2_500)),
)
#: A steady group whose members get cut off from the coordinator now and then.
CUTS = replace(PROFILES["steady"], name="cuts", fault_ms=(3_000, 6_000), cuts_per_s=0.6)


def caught(
    monkeypatch: pytest.MonkeyPatch,
    break_rule: Callable[[pytest.MonkeyPatch], None],
    profile: Profile,
    kinds: set[str],
    seeds: range = range(40),
) -> SeedResult:
    """The first seed whose run with the rule broken reports one of ``kinds`` and whose run
    with the rule intact passes; checks that the seed replays to the same report."""

    def run(seed: int, broken: bool) -> SeedResult:
        if not broken:
            return run_seed(seed, profile)
        with monkeypatch.context() as patch:
            break_rule(patch)
            return run_seed(seed, profile)

    reported = []
    for seed in seeds:
        result = run(seed, broken=True)
        if not result.violations or result.violations[0].kind not in kinds:
            continue
        reported.append(seed)
        if run(seed, broken=False).ok:
            replayed = run(seed, broken=True)
            assert replayed.violations == result.violations and replayed.fingerprint == result.fingerprint
            assert result.replay_command == f"pystreams sim --profile {profile.name} --seed {seed}"
            return result
    raise AssertionError(f"no seed of {seeds} reported {kinds} with the rule broken and passed with it intact ({reported})")


def test_a_partition_handed_on_before_its_revocation_is_acknowledged_is_caught(monkeypatch):
    """The issue's example: the coordinator treats a revoking member as if it had released
    what it is revoking, so the new owner gets it while the old one still commits it."""
    original = consumer.reconcile

    def hand_over_early(current, target_epoch, target, owned, is_free):
        return original(current, target_epoch, target, PartitionSet() if current.revoking else owned, is_free)

    result = caught(monkeypatch, lambda patch: patch.setattr(consumer, "reconcile", hand_over_early), SLOW_APPS, {"double-ownership"})
    # The old owner still holds it in its own view (owned, or revoking) while the new one has it.
    assert "is owned in their own views by" in result.violations[0].message


def test_a_commit_from_a_stale_member_epoch_is_caught(monkeypatch):
    def only_membership(self, member, member_epoch):
        """The member exists (checked before this); its epoch is not checked."""

    caught(monkeypatch, lambda patch: patch.setattr(ConsumerGroup, "_validate_member_epoch", only_membership), PROFILES["churn"], {"stale-commit-accepted"})


def test_an_invalid_client_side_assignment_accepted_is_caught(monkeypatch):
    def unvalidated(request, computation, max_metadata_bytes):
        return {entry.member_id: (PartitionSet.from_wire(entry.partitions), entry.metadata_version, bytes(entry.metadata_bytes)) for entry in request.members}

    caught(
        monkeypatch,
        lambda patch: patch.setattr(consumer, "_validated_assignment", unvalidated),
        BAD_ASSIGNORS,
        {"invalid-assignment-installed", "target-double-assigned"},
    )


def test_a_state_change_missing_from_the_log_is_caught(monkeypatch):
    """Offsets applied live but never written: a replaying shard would not have them."""
    original = ShardContext.emit

    def emit_without_offsets(self, record):
        original(self, record)
        if isinstance(record, records.OffsetCommit):
            self._journal.records.pop()  # applied, but never handed to the log

    caught(monkeypatch, lambda patch: patch.setattr(ShardContext, "emit", emit_without_offsets), PROFILES["steady"], {"replay-diverged"})


def test_a_member_that_never_gives_up_partitions_on_its_own_is_caught(monkeypatch):
    """The member client's safety timers (session and revocation guards) are what keep a
    member cut off from the coordinator from processing partitions the coordinator has
    already handed on; switched off, the simulator sees both owners."""
    caught(monkeypatch, lambda patch: patch.setattr(ConsumerGroupMember, "_check_timeouts", lambda self, now_ms: None), CUTS, {"double-ownership"})


def test_requests_that_overtake_each_other_break_kip848_exclusivity():
    """Documents a limit of the protocol, not of this code: a heartbeat carries no sequence
    number, so on a network that duplicates or reorders one member's requests a stale copy
    fences a live member or releases partitions it still holds (the ``hostile`` profile)."""
    kinds = {r.violations[0].kind for r in (run_seed(seed, "hostile") for seed in range(60)) if not r.ok}
    assert "double-ownership" in kinds


@pytest.mark.parametrize(("profile", "seed"), [(SLOW_APPS, 107), (BAD_ASSIGNORS, 135)], ids=["slow-apps-107", "bad-assignors-135"])
def test_seeds_that_found_bugs(profile, seed):
    """slow-apps 107: leave() while revoking left the member without its revocation guard;
    bad-assignors 135: a static member replaced during a client-side computation got no target."""
    result = run_seed(seed, profile)
    assert result.ok, result.violations[0]
