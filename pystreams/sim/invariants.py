"""The invariants the simulator checks after every step (and around every offset commit).

* **Exclusive ownership, in the members' own views.** At every instant, no partition is in the
  own view (see ``process.MemberProcess.view``) of two processes. Kept incrementally: only
  processes touched by a step can have changed, and all their releases apply before any of
  their acquisitions (a step is one instant).
* **Epochs.** Per group: group epoch >= assignment epoch >= every member epoch; the group and
  assignment epochs never decrease, nor does any member id's epoch (across fencing and
  rejoining with the same id); -2 (a static member away) and 0 (joined, nothing assigned yet)
  are states, not epochs. Client side: a member's epoch never decreases between two resets to
  0, and never exceeds the group's assignment epoch (epochs only come from the coordinator),
  except where a classic generation was lost (see *Classic groups*).
* **Fenced commits.** An OffsetCommit the coordinator accepts comes from a member it knows,
  at exactly that member's current epoch, for partitions that member holds (assigned or still
  revoking), and no *other* process owns any of them in its own view at that instant.
* **Replay.** The live shard's snapshot equals that of a shard replaying the log (the shadow,
  fed record by record); at a fail-over, the shard that replays the whole log equals the dead
  one.
* **One holder.** Targets never give a partition to two members; neither do the members'
  current assignments (assigned + revoking).
* **Classic groups** (the migration profile): the generation never goes back, not even across
  conversions (a consumer group's epoch continues a classic group's generation and back), and
  an accepted commit comes from a member at the current generation for partitions in its
  assignment. Two things the classic protocol (as Kafka implements it) does not promise are
  not demanded: a generation handed out in JoinGroup answers is written only when the leader's
  SyncGroup stores the assignment (or the group becomes Empty), so a fail-over in between
  brings the group back at the last *written* generation; a member may then still hold the
  lost one (it fails to sync or is told ILLEGAL_GENERATION and rejoins), and the next shard
  hands the lost numbers out again (Kafka's completeClassicGroupJoin answers JoinGroup with
  the next generation and appends no record). So a member's generation may go back, without a
  reset, from one only a JoinGroup answer of a shard that died since told it, never written
  before that shard died, to what the next shard gives it: Kafka's consumer sets its generation
  from every successful JoinGroup answer (AbstractCoordinator's JoinGroupResponseHandler: a
  JoinGroup carries no generation and the answer is not compared with the one held), and a
  failed SyncGroup or a closed connection does not reset it. And an *empty* group
  that changes protocol is deleted (tombstones) and created afresh, restarting at epoch 0
  (Kafka's ``maybeDeleteEmptyClassicGroup`` / ``maybeDeleteEmptyConsumerGroup``); a non-empty
  one is converted and its epoch continues.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pystreams.coordinator import records as r
from pystreams.coordinator.classic_group import ClassicGroup
from pystreams.coordinator.consumer_group import ConsumerGroup
from pystreams.partitions import PartitionSet, TopicIdPartition
from pystreams.protocol import consumer_protocol
from pystreams.protocol.sentinels import LEAVE_STATIC_EPOCH

if TYPE_CHECKING:
    from pystreams.sim.process import MemberProcess
    from pystreams.sim.world import Simulation


@dataclass(frozen=True)
class Violation:
    kind: str
    at_ms: int
    step: int
    message: str

    def __str__(self) -> str:
        return f"[{self.kind}] t={self.at_ms}ms step={self.step}: {self.message}"


@dataclass(frozen=True)
class CommitContext:
    """What the coordinator knew of the committing member just before it handled the commit."""

    member_epoch: int | None  # None: the member was unknown
    held: frozenset[TopicIdPartition]


class InvariantChecker:
    def __init__(self, world: Simulation) -> None:
        self.world = world
        self._view_of: dict[str, PartitionSet | frozenset[TopicIdPartition]] = {}
        self._owner_of: dict[TopicIdPartition, str] = {}
        self._group_epoch: dict[str, int] = {}
        self._assignment_epoch: dict[str, int] = {}
        self._member_epoch: dict[tuple[str, str], int] = {}
        self._client_epoch: dict[tuple[str, int], int] = {}
        #: Per process incarnation: where its current epoch came from, as (coordinator
        #: incarnation, life of the group): answers of a dead coordinator are dropped on
        #: arrival, so a new epoch comes from the incarnation live at the time.
        self._epoch_source: dict[tuple[str, int], tuple[int, int]] = {}
        #: Per (coordinator incarnation, group life): the highest epoch or classic generation
        #: its live shard reached, written or not (what its answers may have told members).
        self._newest_told: dict[tuple[int, int], int] = {}
        #: Per (coordinator incarnation, group life): the highest epoch or classic generation
        #: the log held while that shard lived (what a shard loading the log after it resumes).
        self._newest_written: dict[tuple[int, int], int] = {}
        #: The simulated group's lives: a new one starts when an empty group is deleted.
        self._group_life = 0
        #: Members per group at the last check of the log (a deleted group must have had none).
        self._members_seen: dict[str, int] = {}
        self._log_checked = 0

    def owner_of(self, partition: TopicIdPartition) -> str | None:
        return self._owner_of.get(partition)

    # ------------------------------------------------------------------ after every step

    def after_step(self, touched: list[MemberProcess], coordinator_touched: bool) -> None:
        if coordinator_touched:
            self._forget_deleted_groups()
        self._note_newest_told()
        if touched:
            self._check_ownership(touched)
            self._check_client_epochs(touched)
        if coordinator_touched:
            self._check_coordinator()

    def _check_ownership(self, touched: list[MemberProcess]) -> None:
        views = [(process.name, self._view_of.get(process.name, frozenset()), process.view()) for process in touched]
        owner_of = self._owner_of
        for name, old, new in views:
            if old and old != new:
                for partition in old - new:
                    if owner_of.get(partition) == name:
                        del owner_of[partition]
        for name, old, new in views:
            if new and old != new:
                for partition in new - old:
                    holder = owner_of.setdefault(partition, name)
                    if holder != name:
                        world = self.world
                        world.violation(
                            "double-ownership",
                            f"{world.describe_partition(partition)} is owned in their own views by "
                            f"{world.describe_holding(world.processes[holder], partition)} and "
                            f"{world.describe_holding(world.processes[name], partition)}",
                        )
                        return
            self._view_of[name] = new

    def _check_client_epochs(self, touched: list[MemberProcess]) -> None:
        node = self.world.coordinator
        shadow_groups = node.shadow.groups
        # A classic generation starts when the join phase ends and is written only at SyncGroup:
        # the live shard knows it first.
        live_groups = node.shard.groups if node.shard is not None else shadow_groups
        # An answer carries the epoch of the shard that wrote it, which with several nodes may
        # have been released since (its node stays up and its answers still arrive).
        answered_by = self.world.answer_shard_incarnation
        now_source = (node.incarnation if answered_by is None else answered_by, self._group_life)
        for process in touched:
            if process.member is None:
                continue
            epoch = process.member.member_epoch
            key = (process.name, process.incarnation)
            last = self._client_epoch.get(key, 0)
            # A classic member's generation resets to -1 when it rejoins afresh. One whose
            # epoch came from a group deleted since (it was out of it, the group emptied) may
            # rejoin the new one with its old member id and get a lower epoch without a reset:
            # Kafka creates a classic member joining a consumer group with any member id.
            last_source = self._epoch_source.get(key, now_source)
            same_life = last_source[1] == self._group_life
            # A classic generation handed out in a JoinGroup answer and never written died with
            # the shard that handed it out: the next shard hands the same numbers out again
            # (module docstring), and Kafka's consumer takes the generation its next JoinGroup
            # answer carries, whatever it held before.
            lost = last_source[0] != node.incarnation and last > self._newest_written.get(last_source, 0)
            if epoch > 0 and last > 0 and epoch < last and same_life and not lost:
                self.world.violation("client-epoch-regressed", f"{process.name}'s member epoch went from {last} to {epoch}")
                return
            if epoch != last:
                self._epoch_source[key] = now_source
            self._client_epoch[key] = epoch
            source = self._epoch_source.get(key, now_source)
            newest = None
            if source[1] == self._group_life:
                group = shadow_groups.get(self.world.group_id)
                if group is None or isinstance(group, ClassicGroup):
                    group = live_groups.get(self.world.group_id) or group
                newest = _newest_epoch(group)
            # Learnt from a shard that is not the live one (with several nodes, a released
            # shard's answer may arrive after the release, so the answer's own shard counts).
            if source != (node.incarnation, self._group_life):
                # Learnt from a shard that has died since (a classic generation it handed out
                # in JoinGroup answers but never wrote died with it), or from an earlier life of
                # the group, deleted since: bounded by what that shard told in that life.
                told = self._newest_told.get(source)
                if told is not None:
                    newest = told if newest is None else max(newest, told)
            if epoch > 0 and (newest is None or epoch > newest):
                self.world.violation(
                    "client-epoch-ahead",
                    f"{process.name} is at epoch {epoch}, beyond the group's assignment epoch (or generation) {newest}",
                )
                return

    def _note_newest_told(self) -> None:
        node = self.world.coordinator
        if node.shard is None:
            return
        key = (node.incarnation, self._group_life)
        newest = _newest_epoch(node.shard.groups.get(self.world.group_id))
        if newest is not None:
            told = self._newest_told
            told[key] = max(told.get(key, 0), newest)
        written = _written_epoch(node.shadow.groups.get(self.world.group_id))
        if written is not None:
            self._newest_written[key] = max(self._newest_written.get(key, 0), written)

    def _check_coordinator(self) -> None:
        node = self.world.coordinator
        shard = node.shard
        if shard is None:
            return
        live, replayed = shard.snapshot(), node.shadow.snapshot()
        if live != replayed:
            self.world.violation("replay-diverged", "the live shard differs from a shard replaying its log: " + _diff(live, replayed))
            return
        for group in shard.groups.values():
            if not self._check_group(group, node.shadow.groups.get(group.group_id)):
                return
        self._members_seen = {gid: len(group.members) for gid, group in node.shadow.groups.items()}

    def _forget_deleted_groups(self) -> None:
        """A group tombstone deletes a group: if it was empty, the group made afresh (another
        protocol's, or after DeleteGroups) starts its epochs again; a non-empty group is only
        ever converted, and its epoch carries on, so its history stays."""
        log = self.world.coordinator.log
        for record in log[self._log_checked :]:
            if isinstance(record, (r.GroupMetadata, r.ClassicGroupMetadata)) and record.value is None:
                gid = record.group_id
                if self._members_seen.get(gid, 0) == 0:
                    if gid == self.world.group_id:
                        self._group_life += 1
                    self._group_epoch.pop(gid, None)
                    self._assignment_epoch.pop(gid, None)
                    for key in [k for k in self._member_epoch if k[0] == gid]:
                        del self._member_epoch[key]
        self._log_checked = len(log)

    def check_fresh_replay(self) -> None:
        """A brand-new shard replaying the whole log equals the live one (end of a run)."""
        node = self.world.coordinator
        if node.shard is not None and not self.world.violations:
            live, replayed = node.shard.snapshot(), node.replayed_snapshot()
            if live != replayed:
                self.world.violation("replay-diverged", "a fresh shard replaying the log differs from the live one: " + _diff(live, replayed))

    def check_failover(self, before: dict | None, replayed: dict) -> None:
        if before is not None and before != replayed:
            self.world.violation("failover-replay-diverged", "the shard replayed at fail-over differs from the one that died: " + _diff(before, replayed))

    def _check_group(self, group: ConsumerGroup | ClassicGroup, written: ConsumerGroup | ClassicGroup | None) -> bool:
        gid = group.group_id
        violation = self.world.violation
        if isinstance(group, ClassicGroup):
            # The generation that must never go back is the written one (the shadow's): a
            # fail-over legitimately loses a generation not yet written (module docstring).
            generation = written.persisted.generation if isinstance(written, ClassicGroup) and written.persisted else 0
            if generation < self._group_epoch.get(gid, 0):
                violation("epochs", f"classic generation {generation} < the group's earlier epoch {self._group_epoch[gid]}")
                return False
            if group.generation < generation:
                violation("epochs", f"the live classic generation {group.generation} is behind the written {generation}")
                return False
            self._group_epoch[gid] = generation
            return True
        if group.group_epoch < group.assignment_epoch:
            violation("epochs", f"group epoch {group.group_epoch} < assignment epoch {group.assignment_epoch}")
            return False
        if group.group_epoch < self._group_epoch.get(gid, 0):
            violation("epochs", f"group epoch went back from {self._group_epoch[gid]} to {group.group_epoch}")
            return False
        if group.assignment_epoch < self._assignment_epoch.get(gid, 0):
            violation("epochs", f"assignment epoch went back from {self._assignment_epoch[gid]} to {group.assignment_epoch}")
            return False
        self._group_epoch[gid] = group.group_epoch
        self._assignment_epoch[gid] = group.assignment_epoch
        held: dict[tuple, str] = {}
        for member_id, member in group.members.items():
            epoch = member.member_epoch
            if epoch > group.assignment_epoch:
                violation("epochs", f"member {member_id} epoch {epoch} > assignment epoch {group.assignment_epoch}")
                return False
            if epoch > 0:
                key = (gid, member_id)
                if epoch < self._member_epoch.get(key, 0):
                    violation("epochs", f"member {member_id} epoch went back from {self._member_epoch[key]} to {epoch}")
                    return False
                self._member_epoch[key] = epoch
            elif epoch not in (0, LEAVE_STATIC_EPOCH):
                violation("epochs", f"member {member_id} has epoch {epoch}")
                return False
            for pair in member.assigned:
                if held.setdefault(pair, member_id) != member_id:
                    violation("coordinator-double-holder", f"{pair} held by {held[pair]} and {member_id}")
                    return False
            for pair in member.revoking:
                if held.setdefault(pair, member_id) != member_id:
                    violation("coordinator-double-holder", f"{pair} held by {held[pair]} and {member_id}")
                    return False
        targeted: dict[tuple, str] = {}
        for member_id, target in group.targets.items():
            for pair in target.partitions:
                if targeted.setdefault(pair, member_id) != member_id:
                    violation("target-double-assigned", f"{pair} is in the targets of {targeted[pair]} and {member_id}")
                    return False
        return True

    # ------------------------------------------------------------------ offset commits

    def before_commit(self, request) -> CommitContext:
        shard = self.world.coordinator.shard
        group = shard.groups.get(request.group_id) if shard is not None else None
        member = group.members.get(request.member_id) if group is not None else None
        if member is None:
            return CommitContext(None, frozenset())
        if isinstance(group, ClassicGroup):
            return CommitContext(group.generation, classic_assignment(self.world, member.assignment))
        held = frozenset(TopicIdPartition(topic, p) for holding in (member.assigned, member.revoking) for topic, p in holding)
        return CommitContext(member.member_epoch, held)

    def after_commit(self, process: MemberProcess, request, context: CommitContext, response) -> None:
        accepted = [(topic.name, partition.partition_index) for topic in response.topics for partition in topic.partitions if partition.error_code == 0]
        if not accepted:
            return
        world = self.world
        world.stats["commits.accepted"] += 1
        epoch = request.generation_id_or_member_epoch
        who = f"{process.name} ({request.member_id}, epoch {epoch})"
        if context.member_epoch is None:
            world.violation("fenced-commit-accepted", f"commit from {who} accepted although the coordinator does not know the member")
            return
        if epoch != context.member_epoch:
            world.violation("stale-commit-accepted", f"commit from {who} accepted although the member's epoch is {context.member_epoch}")
            return
        for name, index in accepted:
            topic_id = world.topic_id(name)
            partition = TopicIdPartition(topic_id, index)
            if partition not in context.held:
                world.violation("commit-of-unheld-partition", f"commit of {name}-{index} from {who} accepted; the member does not hold it")
                return
            owner = self._owner_of.get(partition)
            if owner is not None and owner != process.name:
                world.violation("zombie-commit", f"commit of {name}-{index} from {who} accepted while {owner} owns it")
                return


def _newest_epoch(group: ConsumerGroup | ClassicGroup | None) -> int | None:
    """The highest epoch a member may know: the assignment epoch, or a classic generation."""
    if group is None:
        return None
    return group.generation if isinstance(group, ClassicGroup) else group.assignment_epoch


def _written_epoch(group: ConsumerGroup | ClassicGroup | None) -> int | None:
    """The highest epoch the log holds for a group (the shadow's): a consumer group's group
    epoch (every epoch is written before any answer tells it), a classic group's last written
    generation."""
    if group is None:
        return None
    if isinstance(group, ClassicGroup):
        return group.persisted.generation if group.persisted is not None else 0
    return group.group_epoch


def classic_assignment(world: Simulation, data: bytes) -> frozenset[TopicIdPartition]:
    """A classic member's assignment (SyncGroup bytes) as partitions, by topic id."""
    if not data:
        return frozenset()
    topics = world.coordinator.topics
    return frozenset(
        TopicIdPartition(topics[name].topic_id, p)
        for name, partitions in consumer_protocol.decode_assignment(data).partitions.items()
        if name in topics
        for p in partitions
    )


def _diff(a: dict, b: dict) -> str:
    """The first difference between two nested snapshots, as a short readable path."""

    def walk(x, y, path: str) -> str | None:
        if isinstance(x, dict) and isinstance(y, dict):
            for key in sorted(set(x) | set(y), key=repr):
                if key not in x or key not in y:
                    return f"{path}/{key!r}: only in {'live' if key in x else 'replayed'}"
                found = walk(x[key], y[key], f"{path}/{key!r}")
                if found:
                    return found
            return None
        return None if x == y else f"{path}: live {x!r} != replayed {y!r}"

    return walk(a, b, "") or "(no difference found)"
