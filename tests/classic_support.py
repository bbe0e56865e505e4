"""Classic group members for coordinator tests: they send JoinGroup, SyncGroup, Heartbeat and
LeaveGroup through the ``Harness`` and remember what a real client would (member id,
generation), so a test reads like the protocol it checks."""

from __future__ import annotations

from dataclasses import dataclass, field

from coordinator_support import GROUP, Harness

from pystreams.coordinator.context import DEFERRED
from pystreams.protocol import consumer_protocol as cp
from pystreams.protocol import messages as m

JoinProtocol = m.JoinGroupRequest.JoinGroupRequestProtocol
SyncAssignment = m.SyncGroupRequest.SyncGroupRequestAssignment
SESSION_MS = 10_000
REBALANCE_MS = 30_000


def subscription(*topics: str, owned: dict[str, list[int]] | None = None, user_data: bytes | None = None, version: int = 3) -> bytes:
    return cp.encode_subscription(
        cp.Subscription(tuple(topics), user_data=user_data, owned_partitions=cp.named_partitions((owned or {}).items()), version=version),
    )


def assignment(user_data: bytes | None = None, version: int = 3, **partitions: list[int]) -> bytes:
    return cp.encode_assignment(cp.Assignment(cp.named_partitions(partitions.items()), user_data=user_data), version)


def decoded(data: bytes) -> dict[str, list[int]]:
    return {topic: sorted(numbers) for topic, numbers in cp.decode_assignment(data).partitions.items()}


@dataclass
class Classic:
    """One classic member. ``join`` returns the answer, or DEFERRED while it waits (the answer
    then arrives in ``h.answers`` and ``answer()`` collects it)."""

    h: Harness
    topics: tuple[str, ...] = ("foo",)
    instance_id: str | None = None
    protocols: tuple[str, ...] = ("range",)
    version: int = 7
    group_id: str = GROUP
    client_id: str = "c"
    user_data: bytes | None = None
    session_ms: int = SESSION_MS
    rebalance_ms: int = REBALANCE_MS
    member_id: str = ""
    generation: int = -1
    pending: int | None = None
    owned: dict[str, list[int]] = field(default_factory=dict)

    def metadata(self) -> bytes:
        return subscription(*self.topics, owned=self.owned, user_data=self.user_data)

    def join(self, *, protocol_type: str = "consumer", protocols: list[tuple[str, bytes]] | None = None, member_id: str | None = None):
        request = m.JoinGroupRequest(
            group_id=self.group_id,
            session_timeout_ms=self.session_ms,
            rebalance_timeout_ms=self.rebalance_ms,
            member_id=self.member_id if member_id is None else member_id,
            group_instance_id=self.instance_id,
            protocol_type=protocol_type,
            reason=None,
            protocols=[
                JoinProtocol(name=n, metadata=md) for n, md in (protocols if protocols is not None else [(name, self.metadata()) for name in self.protocols])
            ],
        )
        request.API_VERSION = self.version
        response = self.h.send(request, client_id=self.client_id)
        if response is DEFERRED:
            self.pending = self.h.last_request_id
            return DEFERRED
        return self._joined(response)

    def join_fully(self):
        """JoinGroup, taking the member id MEMBER_ID_REQUIRED hands out first."""
        response = self.join()
        if response is not DEFERRED and response.error_code == 79:
            response = self.join()
        return response

    def answer(self):
        """The deferred answer, once it came (None if it has not)."""
        if self.pending is None or self.pending not in self.h.answers:
            return None
        response = self.h.answers.pop(self.pending)
        self.pending = None
        if isinstance(response, m.JoinGroupResponse):
            return self._joined(response)
        return response

    def _joined(self, response):
        if response.member_id:
            self.member_id = response.member_id
        if response.error_code == 0:
            self.generation = response.generation_id
        return response

    def sync(self, assignments: dict[str, bytes] | None = None, *, generation: int | None = None, protocol_name: str | None = "range"):
        request = m.SyncGroupRequest(
            group_id=self.group_id,
            generation_id=self.generation if generation is None else generation,
            member_id=self.member_id,
            group_instance_id=self.instance_id,
            protocol_type="consumer",
            protocol_name=protocol_name,
            assignments=[SyncAssignment(member_id=mid, assignment=data) for mid, data in (assignments or {}).items()],
        )
        request.API_VERSION = 5
        response = self.h.send(request, client_id=self.client_id)
        if response is DEFERRED:
            self.pending = self.h.last_request_id
        return response

    def heartbeat(self, generation: int | None = None) -> int:
        request = m.HeartbeatRequest(
            group_id=self.group_id,
            generation_id=self.generation if generation is None else generation,
            member_id=self.member_id,
            group_instance_id=self.instance_id,
        )
        request.API_VERSION = 4
        return self.h.send(request, client_id=self.client_id).error_code

    def leave(self) -> int:
        return leave(self.h, [(self.member_id, self.instance_id)], group_id=self.group_id).members[0].error_code

    def commit(self, offset: int = 1, generation: int | None = None, version: int = 8) -> int:
        Topic = m.OffsetCommitRequest.OffsetCommitRequestTopic
        request = m.OffsetCommitRequest(
            group_id=self.group_id,
            generation_id_or_member_epoch=self.generation if generation is None else generation,
            member_id=self.member_id,
            group_instance_id=self.instance_id,
            retention_time_ms=-1,
            topics=[
                Topic(
                    name="foo",
                    partitions=[
                        Topic.OffsetCommitRequestPartition(partition_index=0, committed_offset=offset, committed_leader_epoch=-1, committed_metadata="")
                    ],
                )
            ],
        )
        request.API_VERSION = version
        return self.h.send(request).topics[0].partitions[0].error_code


def leave(h: Harness, members: list[tuple[str, str | None]], group_id: str = GROUP, version: int = 5):
    Member = m.LeaveGroupRequest.MemberIdentity
    request = m.LeaveGroupRequest(group_id=group_id, members=[Member(member_id=mid, group_instance_id=iid, reason=None) for mid, iid in members])
    request.API_VERSION = version
    return h.send(request)


def form_group(h: Harness, members: list[Classic], plan: dict[int, dict[str, list[int]]], *, delay_ms: int | None = None) -> None:
    """Members join a new classic group, the first leads and hands out ``plan`` (member index ->
    partitions): the group ends Stable at generation 1 with every member synced."""
    for member in members:
        if member.join() is not DEFERRED:  # a dynamic member takes a member id first (KIP-394)
            assert member.join() is DEFERRED
    step = delay_ms if delay_ms is not None else h.shard.config.initial_rebalance_delay_ms
    for _ in range(10):  # the initial delay extends while members keep arriving
        h.advance(step)
        if all(member.pending in h.answers for member in members):
            break
    answers = [member.answer() for member in members]
    assert all(a is not None and a.error_code == 0 for a in answers), answers
    leader = next(member for member, a in zip(members, answers, strict=False) if a.leader == a.member_id)
    for member in members:
        if member is not leader:
            assert member.sync() is DEFERRED
    plan_bytes = {members[i].member_id: assignment(**parts) for i, parts in plan.items()}
    leader.sync(plan_bytes)
    for member in members:
        got = member.answer()
        assert got is not None and got.error_code == 0, got
        member.owned = decoded(got.assignment)
