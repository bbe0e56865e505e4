"""Drives a GroupCoordinatorShard the way the KIP's case studies talk about it."""

from __future__ import annotations

import itertools
import uuid

import msgspec
from pystreams.assignors.api import GroupAssignment, MemberAssignment, TopicMetadata

from pystreams.coordinator import records as r
from pystreams.coordinator.config import CoordinatorConfig
from pystreams.coordinator.shard import GroupCoordinatorShard, RequestContext
from pystreams.partitions import PartitionSet
from pystreams.protocol import messages as m

HB = m.ConsumerGroupHeartbeatRequest
GROUP = "grp"
TOPIC_IDS = {name: uuid.UUID(int=i + 1) for i, name in enumerate(["foo", "bar", "baz", "qux"])}
NAMES = {v: k for k, v in TOPIC_IDS.items()}

FAST = CoordinatorConfig(
    session_timeout_ms=1_000,
    min_session_timeout_ms=100,
    max_session_timeout_ms=10_000,
    heartbeat_interval_ms=100,
    min_heartbeat_interval_ms=10,
    max_heartbeat_interval_ms=1_000,
)


def topics(**counts: int) -> dict[str, TopicMetadata]:
    return {name: TopicMetadata(TOPIC_IDS[name], name, n) for name, n in counts.items()}


def parts(spec: str) -> PartitionSet:
    """'foo-0, foo-1, bar-2' -> {foo: {0, 1}, bar: {2}}"""
    items = filter(None, (s.strip() for s in spec.split(",")))
    return PartitionSet.from_pairs((TOPIC_IDS[name], int(p)) for name, p in (item.rsplit("-", 1) for item in items))


def owned(spec: str):
    return parts(spec).to_wire(HB.TopicPartitions)


class ScriptedAssignor:
    """A server assignor that returns the target a case study prints, and records its inputs."""

    name = "scripted"

    def __init__(self) -> None:
        self.next: dict[str, str] | None = None
        self.specs = []

    def assign(self, spec):
        self.specs.append(spec)
        if self.next is None:
            raise AssertionError("the coordinator computed an assignment the test did not expect")
        plan, self.next = self.next, None
        return GroupAssignment({mid: MemberAssignment(parts(plan.get(mid, ""))) for mid in spec.members})


class Harness:
    def __init__(self, config: CoordinatorConfig = FAST, assignors=None) -> None:
        self.scripted = ScriptedAssignor()
        if assignors is None:
            assignors = {"scripted": self.scripted}
        config = CoordinatorConfig(**{**_fields(config), "assignors": tuple(assignors)})
        self.shard = GroupCoordinatorShard(config, assignors=assignors, new_member_id=self._new_id)
        self.log = []
        self.last_records: list[r.Record] = []
        self.now = 0
        self.ids = iter(f"member-{i}" for i in range(1_000_000))
        #: Deferred answers (classic JoinGroup/SyncGroup long polls) by request id, as they come.
        self.answers: dict[int, object] = {}
        self._request_ids = itertools.count(1)
        self.last_request_id = 0

    def _new_id(self) -> str:
        return next(self.ids)

    def _collect(self, result):
        self.log.extend(result.records)
        self.last_records = list(result.records)
        for request_id, response in result.completions:
            assert request_id not in self.answers, f"request {request_id} answered twice"
            self.answers[request_id] = response
        return result.response

    def topics(self, **counts: int) -> None:
        self._collect(self.shard.update_topics(topics(**counts), self.now))

    def send(self, request, client_id: str = ""):
        self.last_request_id = next(self._request_ids)
        context = RequestContext(client_id=client_id, client_host="", request_id=self.last_request_id)
        return self._collect(self.shard.handle(request, self.now, context))

    def heartbeat(self, member_id: str, epoch: int, owned_spec: str | None = None, **fields):
        return self.send(
            HB(
                group_id=fields.pop("group_id", GROUP),
                member_id=member_id,
                member_epoch=epoch,
                topic_partitions=owned(owned_spec) if owned_spec is not None else None,
                **fields,
            )
        )

    def join(self, member_id: str, subscribe=("foo",), **fields):
        fields.setdefault("rebalance_timeout_ms", 5_000)
        if "subscribed_topic_regex" not in fields:
            fields.setdefault("subscribed_topic_names", list(subscribe))
        return self.heartbeat(member_id, 0, "", **fields)

    def advance(self, ms: int):
        self.now += ms
        return self._collect(self.shard.expire(self.now))

    @property
    def group(self):
        return self.shard.groups[GROUP]

    def target(self) -> dict[str, str]:
        return {mid: t.partitions.describe(NAMES) for mid, t in sorted(self.group.targets.items())}

    def members(self) -> dict[str, tuple[int, str, str]]:
        """member -> (epoch, partitions, pending-partitions), as the case studies print them."""
        out = {}
        for mid, member in sorted(self.group.members.items()):
            at_target = member.member_epoch == self.group.assignment_epoch and not member.revoking
            pending = self.group.target_of(mid) - member.assigned if at_target else PartitionSet()
            held = member.assigned | member.revoking  # revoking partitions are still held
            out[mid] = (member.member_epoch, held.describe(NAMES), pending.describe(NAMES))
        return out

    def replayed(self) -> GroupCoordinatorShard:
        fresh = GroupCoordinatorShard(self.shard.config, assignors=self.shard.assignors)
        for record in self.log:
            fresh.replay(record)
        return fresh

    def assert_replay_equals_live(self) -> None:
        assert self.replayed().snapshot() == self.shard.snapshot()


def response_parts(response, field: str = "assigned_topic_partitions") -> str:
    if response.assignment is None:
        return None
    return PartitionSet.from_wire(getattr(response.assignment, field)).describe(NAMES)


def _fields(config: CoordinatorConfig) -> dict:
    return msgspec.structs.asdict(config)


class RoundRobinAssignor:
    """A simple valid server assignor for property tests: sorted members take turns."""

    name = "scripted"

    def assign(self, spec):
        members = sorted(spec.members)
        out = {mid: {} for mid in members}
        for topic_id in sorted(spec.topics):
            subscribers = [mid for mid in members if topic_id in spec.members[mid].subscribed_topic_ids]
            for p in range(spec.topics[topic_id].num_partitions):
                if subscribers:
                    out[subscribers[p % len(subscribers)]].setdefault(topic_id, set()).add(p)
        return GroupAssignment({mid: MemberAssignment(PartitionSet(a)) for mid, a in out.items()})


def assert_records(actual: list[r.Record], expected: list[r.Record]) -> None:
    """The exact records a step wrote, in order, as Kafka's coordinator tests pin them."""
    assert actual == expected, (
        "records differ:\n"
        + "\n".join(f"  {'=' if a == e else '!'} {a!r}\n    expected {e!r}" for a, e in zip(actual, expected, strict=False))
        + (f"\n  extra: {actual[len(expected) :]!r}" if len(actual) > len(expected) else "")
        + (f"\n  missing: {expected[len(actual) :]!r}" if len(expected) > len(actual) else "")
    )


def target_member(member_id: str, spec: str, group_id: str = GROUP, **value_fields) -> r.TargetAssignmentMember:
    """One member's TargetAssignmentMember record, its partitions in case-study notation."""
    return r.TargetAssignmentMember(group_id, member_id, r.TargetAssignmentMemberValue(parts(spec).to_wire(r.TopicPartitions), **value_fields))


def assignment_records(group_id: str, **members: str) -> list[r.TargetAssignmentMember]:
    """The TargetAssignmentMember records of a target given in case-study notation."""
    return [target_member(mid, spec, group_id) for mid, spec in members.items()]


# --- the records a consumer-group step writes, as tests pin them (see assert_records) -------------


def current(member_id: str, epoch: int, previous: int, assigned: str = "", revoking: str = "", **value_fields) -> r.CurrentAssignment:
    return r.CurrentAssignment(
        GROUP,
        member_id,
        r.CurrentAssignmentValue(
            member_epoch=epoch,
            previous_member_epoch=previous,
            assigned=parts(assigned).to_wire(r.TopicPartitions),
            revoking=parts(revoking).to_wire(r.TopicPartitions),
            **value_fields,
        ),
    )


def member_metadata(member_id: str, group_epoch: int, topics=("foo",), **value_fields) -> r.MemberMetadata:
    return r.MemberMetadata(
        GROUP,
        member_id,
        r.MemberMetadataValue(
            group_epoch=group_epoch,
            client_id="",
            client_host="",
            rebalance_timeout_ms=5_000,
            subscribed_topic_names=list(topics),
            **value_fields,
        ),
    )


def group_epoch(epoch: int) -> r.GroupMetadata:
    return r.GroupMetadata(GROUP, r.GroupMetadataValue(epoch))


def target_epoch(epoch: int) -> r.TargetAssignmentMetadata:
    return r.TargetAssignmentMetadata(GROUP, r.TargetAssignmentMetadataValue(epoch))


def partition_metadata(**counts: int) -> r.PartitionMetadata:
    """The group's PartitionMetadata record for the topics given as name=partition count."""
    return r.PartitionMetadata(GROUP, r.PartitionMetadataValue([r.TopicMetadataValue(TOPIC_IDS[name], name, n) for name, n in counts.items()]))
