"""A coordinator node's lease on its membership of the coordinators' group
(``cluster.MembershipLease``): a node cut off from the brokers, but not from its clients, stops
answering for its shards before the brokers can hand them to another node.

The end-to-end case runs two nodes in this process on the embedded broker: one is cut off
(its heartbeats to the brokers fail from a moment on, everything else still works), the other
takes its shard over, and a member heartbeats to both all along. With the lease, the cut-off
node's last successful answer comes before the new owner's first; without it, the cut-off node
keeps answering from memory while the new owner serves the same member (a zombie).
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import kafka.errors as Errors
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pystreams.coordinator.cluster import ClusterView, MembershipLease, NodeInfo, ShardAssignor, ShardMap, ShardOwnership, keep_serving
from pystreams.coordinator.log import KafkaLog, MemoryLog
from pystreams.coordinator.runtime import Coordinator, StaticTopics
from pystreams.protocol import messages as m
from pystreams.protocol.server import BrokerAddress
from tests.aio import within

# --- the lease, sans-IO -------------------------------------------------------------------------


def test_a_lease_runs_a_session_from_the_send_time_of_the_newest_accepted_request():
    lease = MembershipLease(10.0)
    assert not lease.valid(0.0) and lease.expires_at() is None  # no membership yet
    lease.confirm(sent_at=5.0)
    assert lease.valid(14.999) and not lease.valid(15.0)
    lease.confirm(sent_at=3.0)  # an older request answered late extends nothing
    assert lease.expires_at() == 15.0
    lease.confirm(sent_at=9.0)
    assert lease.valid(18.9) and not lease.valid(19.0)
    lease.end()
    assert not lease.valid(9.5)


@given(st.lists(st.one_of(st.floats(0, 100), st.none()), max_size=30), st.floats(0, 120))
def test_a_lease_is_valid_exactly_within_a_session_of_a_confirmation_since_it_last_ended(events: list[float | None], now: float):
    lease = MembershipLease(7.0)
    confirmed: list[float] = []
    for sent_at in events:
        if sent_at is None:
            lease.end()
            confirmed.clear()
        else:
            lease.confirm(sent_at)
            confirmed.append(sent_at)
    assert lease.valid(now) == (bool(confirmed) and now < max(confirmed) + 7.0)


def test_an_assignment_confirms_the_membership_from_when_its_join_group_was_built():
    clock = SimpleNamespace(now=100.0)
    node = NodeInfo(1, "h1", 9001)
    ownership = ShardOwnership(
        "unused:9092", "log", node, loop=None, release=None, served=list, on_map=lambda mapped: None, session_timeout_ms=10_000, clock=lambda: clock.now
    )  # type: ignore[arg-type]
    ownership._publish = lambda mapped: None  # no event loop here: the map itself is not under test
    assignor = ShardAssignor(node, ownership._mapped, clock=lambda: clock.now)
    ownership._assignor = assignor
    assert ownership.why_not_serving() == "this coordinator is not a member of the coordinators' group"
    assignor.metadata(["log"])  # the JoinGroup is built at 100 s ...
    clock.now = 103.0
    ownership._mapped(ShardMap(1, (1,), (node,)), [0])  # ... and its assignment arrives at 103 s
    assert ownership.lease.expires_at() == 110.0
    clock.now = 109.9
    assert ownership.why_not_serving() is None
    clock.now = 110.0
    assert "no word from the brokers for 10 s" in (ownership.why_not_serving() or "")


def test_a_heartbeat_renews_the_lease_from_its_send_time_and_only_when_accepted():
    clock = SimpleNamespace(now=0.0)
    ownership = ShardOwnership(
        "unused:9092",
        "log",
        NodeInfo(1, "h", 1),
        loop=None,
        release=None,
        served=list,
        on_map=lambda mapped: None,
        session_timeout_ms=10_000,
        clock=lambda: clock.now,
    )  # type: ignore[arg-type]

    async def accepted() -> None:
        clock.now += 0.4  # the answer comes back 0.4 s after the request left

    async def rebalancing() -> None:
        clock.now += 0.4
        raise Errors.RebalanceInProgressError()

    asyncio.run(ownership._confirming(accepted)())
    assert ownership.lease.expires_at() == 10.0  # sent at 0, not answered at 0.4
    with pytest.raises(Errors.RebalanceInProgressError):
        asyncio.run(ownership._confirming(rebalancing)())
    assert ownership.lease.expires_at() == 10.0


# --- the coordinator's gate -----------------------------------------------------------------------


async def call(coordinator: Coordinator, request: Any) -> Any:
    from kafka.protocol.api_header import RequestHeader

    request.API_VERSION = 0
    header = RequestHeader(request_api_key=request.API_KEY, request_api_version=0, correlation_id=1, client_id="test")
    return await within(coordinator.handle(header, request), 10)


def joining(group: str) -> m.ConsumerGroupHeartbeatRequest:
    return m.ConsumerGroupHeartbeatRequest(
        group_id=group, member_id="", member_epoch=0, rebalance_timeout_ms=5_000, subscribed_topic_names=["t"], server_assignor="uniform"
    )


def test_a_node_whose_membership_lapsed_answers_not_coordinator_even_for_an_answer_worked_out_before():
    async def scenario() -> None:
        node = Coordinator(MemoryLog(1), topic_source=StaticTopics({}), owned_shards=[0])
        await node.start()
        await node.wait_until_loaded()
        lapsed: list[str] = []
        node.serve_only_while(lambda: lapsed[0] if lapsed else None)
        joined = await call(node, joining("g"))
        assert joined.error_code == 0 and node.unavailable_reason("g") is None

        lapsed.append("no word from the brokers")
        refused = await call(node, joining("g2"))
        assert refused.error_code == Errors.NotCoordinatorError.errno and refused.error_message == "no word from the brokers"
        assert node.unavailable_reason("g") == "no word from the brokers"  # FindCoordinator: not here

        # The lease lapses while a request is being handled: its answer does not leave.
        lapsed.clear()
        runner = node.runners[0]
        submit = runner.submit

        async def lapsing_meanwhile(*args: Any) -> Any:
            answer = await submit(*args)
            lapsed.append("lapsed meanwhile")
            return answer

        runner.submit = lapsing_meanwhile  # type: ignore[method-assign]
        late = await call(
            node, m.ConsumerGroupHeartbeatRequest(group_id="g", member_id=joined.member_id, member_epoch=joined.member_epoch, rebalance_timeout_ms=5_000)
        )
        assert late.error_code == Errors.NotCoordinatorError.errno and late.error_message == "lapsed meanwhile"
        await node.close()

    asyncio.run(scenario())


# --- a node cut off from the brokers, end to end --------------------------------------------------

SESSION_MS = 2_000


class CutOff(ShardOwnership):
    """A node whose heartbeats stop reaching the brokers once ``cut`` is set; its clients, its
    log and everything else still reach it."""

    cut = False

    def _confirming(self, send_heartbeat: Any) -> Any:
        confirming = super()._confirming(send_heartbeat)

        async def maybe_cut() -> Any:
            if self.cut:
                raise Errors.RequestTimedOutError("cut off from the brokers")
            return await confirming()

        return maybe_cut


class Node:
    def __init__(self, bootstrap: str, topic: str, node_id: int, *, lease: bool) -> None:
        self.coordinator = Coordinator(KafkaLog(bootstrap, 1, topic=topic), topic_source=StaticTopics({}), owned_shards=())
        address = BrokerAddress(node_id, "127.0.0.1", 19_000 + node_id)
        self.view = ClusterView(self.coordinator.shard_for, lambda: address, self.coordinator.unavailable_reason)
        self.ownership = CutOff(
            bootstrap,
            topic,
            NodeInfo(node_id, address.host, address.port),
            loop=asyncio.get_running_loop(),
            release=self.coordinator.release,
            served=lambda: self.coordinator.served_shards,
            on_map=self.view.update,
            session_timeout_ms=SESSION_MS,
            heartbeat_interval_ms=200,
        )
        if lease:
            self.coordinator.serve_only_while(self.ownership.why_not_serving)
        self.keeper: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.coordinator.start()
        self.keeper = asyncio.create_task(keep_serving(self.view, self.coordinator, lambda: self.ownership.held, recheck_s=0.1))
        self.ownership.start()

    async def stop(self) -> None:
        assert self.keeper is not None
        self.keeper.cancel()
        await asyncio.gather(self.keeper, return_exceptions=True)
        await self.ownership.stop()
        await self.coordinator.close()


async def until(condition: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


@pytest.mark.integration
@pytest.mark.parametrize("lease", [True, False], ids=["with-the-lease", "without-it"])
def test_a_node_cut_off_from_the_brokers_stops_answering_before_the_new_owner_of_its_shard_starts(kafka_bootstrap: str, unique_topic: Any, lease: bool) -> None:
    async def scenario() -> None:
        topic = unique_topic("lease-log")
        cut, other = Node(kafka_bootstrap, topic, 1, lease=lease), Node(kafka_bootstrap, topic, 2, lease=lease)
        try:
            await cut.start()
            await until(lambda: cut.coordinator.serves(0), 30, "the first node to serve the shard")
            joined = await call(cut.coordinator, joining("orders"))
            assert joined.error_code == 0, joined.error_message
            await other.start()
            await until(lambda: other.view.map is not None and other.view.map.owners == (1,), 30, "the second node to join (the shard stays put)")

            member = m.ConsumerGroupHeartbeatRequest(
                group_id="orders", member_id=joined.member_id, member_epoch=joined.member_epoch, rebalance_timeout_ms=5_000
            )
            answered: dict[str, list[float]] = {"cut": [], "other": []}
            refusals: set[str] = set()
            cut.ownership.cut = True
            cut_at = time.monotonic()
            deadline = time.monotonic() + 40
            while time.monotonic() < deadline and (not answered["other"] or time.monotonic() < answered["other"][0] + 1.0):
                for name, node in (("cut", cut), ("other", other)):
                    answer = await call(node.coordinator, member)
                    if answer.error_code == 0:
                        answered[name].append(time.monotonic())
                    elif name == "cut":
                        refusals.add(answer.error_message or "")
                await asyncio.sleep(0.05)
            assert answered["other"], "the shard never moved to the node that can still reach the brokers"
            assert answered["cut"], "the cut-off node answered nothing at all, even before its session could have ended"
            print(
                f"lease={lease}: cut node last answered {max(answered['cut']) - cut_at:.2f} s after the cut, the new owner first {min(answered['other']) - cut_at:.2f} s after it"
            )
            if lease:
                assert max(answered["cut"]) < min(answered["other"])
                # The lease ran from a heartbeat sent before the cut: it lapsed within a session.
                assert max(answered["cut"]) < cut_at + SESSION_MS / 1000 + 1.0
                assert any("no word from the brokers" in why for why in refusals), refusals
            else:
                assert max(answered["cut"]) > min(answered["other"])  # both told the member it is in the group
        finally:
            for node in (other, cut):
                await node.stop()

    asyncio.run(scenario())
