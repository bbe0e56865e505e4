"""The log, pinned: the exact records each handler writes, as Apache Kafka's coordinator tests do.

A change that writes more than it must (a member-metadata record on every idle heartbeat, a
rewrite of unchanged target members) or something replay cannot read fails here. So does a
handler failure that leaves anything behind: every event runs in a journal and is rolled back
whole.
"""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from pystreams.coordinator import records as r
from pystreams.coordinator.context import ShardContext
from pystreams.coordinator.shard import HandlerFailed
from pystreams.protocol import messages as m
from tests.coordinator_support import (
    FAST,
    GROUP,
    TOPIC_IDS,
    Harness,
    assert_records,
    assignment_records,
    current,
    group_epoch,
    member_metadata,
    partition_metadata,
    target_epoch,
)


def stable_member_a() -> Harness:
    h = Harness()
    h.topics(foo=2)
    h.scripted.next = {"A": "foo-0, foo-1"}
    h.join("A")
    h.heartbeat("A", 1, "foo-0, foo-1")
    return h


# --- what each step writes ----------------------------------------------------------------------


def test_the_first_heartbeat_creates_the_group_subscribes_and_assigns_in_one_batch():
    h = Harness()
    h.topics(foo=2)
    h.scripted.next = {"A": "foo-0, foo-1"}
    h.join("A")
    assert_records(
        h.last_records,
        [
            group_epoch(0),
            member_metadata("A", 0),
            partition_metadata(foo=2),
            group_epoch(1),
            *assignment_records(GROUP, A="foo-0, foo-1"),
            target_epoch(1),
            current("A", 1, 0, "foo-0, foo-1"),
        ],
    )


def test_a_heartbeat_that_changes_nothing_writes_nothing():
    h = stable_member_a()
    for owned in ("foo-0, foo-1", None):  # with and without the owned partitions
        h.heartbeat("A", 1, owned)
        assert_records(h.last_records, [])
    h.heartbeat("A", 1, None, rebalance_timeout_ms=5_000, subscribed_topic_names=["foo"])  # same fields resent
    assert_records(h.last_records, [])


def test_a_rebalance_writes_only_the_deltas():
    h = stable_member_a()
    h.scripted.next = {"A": "foo-0", "B": "foo-1"}
    h.join("B")
    assert_records(
        h.last_records,
        [
            member_metadata("B", 1),
            group_epoch(2),
            *assignment_records(GROUP, A="foo-0", B="foo-1"),
            target_epoch(2),
            current("B", 2, 0),  # foo-1 is still A's
        ],
    )
    # A revokes foo-1: only its own current assignment changes.
    h.heartbeat("A", 1, "foo-0, foo-1")
    assert_records(h.last_records, [current("A", 1, 0, "foo-0", revoking="foo-1")])
    h.heartbeat("A", 1, "foo-0")
    assert_records(h.last_records, [current("A", 2, 1, "foo-0")])


def test_a_new_target_that_leaves_a_member_unchanged_does_not_rewrite_it():
    h = Harness()
    h.topics(foo=3)
    h.scripted.next = {"A": "foo-0, foo-1, foo-2"}
    h.join("A")
    h.scripted.next = {"A": "foo-0", "B": "foo-1, foo-2"}
    h.join("B")
    h.scripted.next = {"A": "foo-0", "B": "foo-1", "C": "foo-2"}
    h.join("C")
    targets = [record.member_id for record in h.last_records if isinstance(record, r.TargetAssignmentMember)]
    assert targets == ["B", "C"]  # A's target did not change, so no record for it


def test_leaving_writes_tombstones_a_new_epoch_and_the_new_target():
    h = stable_member_a()
    h.scripted.next = {"A": "foo-0", "B": "foo-1"}
    h.join("B")
    h.scripted.next = {"A": "foo-0, foo-1"}
    h.heartbeat("B", -1)
    assert_records(
        h.last_records,
        [
            r.CurrentAssignment(GROUP, "B", None),
            r.TargetAssignmentMember(GROUP, "B", None),
            r.MemberMetadata(GROUP, "B", None),
            group_epoch(3),
            *assignment_records(GROUP, A="foo-0, foo-1"),
            target_epoch(3),
        ],
    )


def test_an_offset_commit_writes_one_record_per_partition():
    h = stable_member_a()
    topic = m.OffsetCommitRequest.OffsetCommitRequestTopic
    partition = topic.OffsetCommitRequestPartition
    h.send(
        m.OffsetCommitRequest(
            version=9,
            group_id=GROUP,
            generation_id_or_member_epoch=1,
            member_id="A",
            topics=[
                topic(name="foo", partitions=[partition(partition_index=0, committed_offset=5), partition(partition_index=1, committed_offset=7)]),
            ],
        )
    )
    assert [(rec.topic, rec.partition, rec.value.offset) for rec in h.last_records] == [("foo", 0, 5), ("foo", 1, 7)]
    assert all(isinstance(rec, r.OffsetCommit) for rec in h.last_records)


# --- nothing unreadable is ever appended -----------------------------------------------------------


def test_a_record_replay_could_not_read_is_refused_before_it_changes_anything():
    bad = r.MemberMetadata(GROUP, "A", r.MemberMetadataValue(1, "c", "h", 5_000, [None]))  # type: ignore[list-item]
    with pytest.raises(r.UnappendableRecord, match=r"subscribed_topic_names\[0\]"):
        r.check_appendable(bad)
    too_big = r.OffsetCommit(GROUP, "foo", 0, r.OffsetCommitValue(1, 0, metadata="x" * r.MAX_RECORD_BYTES))
    with pytest.raises(r.UnappendableRecord, match="over the"):
        r.check_appendable(too_big)


def test_a_handler_that_emits_an_unappendable_record_fails_alone_and_leaves_no_trace(monkeypatch):
    h = stable_member_a()
    before = h.shard.snapshot()
    original = ShardContext.emit

    def poisoning_emit(self, record):
        if isinstance(record, r.MemberMetadata) and record.member_id == "B":
            record = msgspec.structs.replace(record, value=msgspec.structs.replace(record.value, client_id=None))
        original(self, record)

    monkeypatch.setattr(ShardContext, "emit", poisoning_emit)
    with pytest.raises(HandlerFailed):
        h.join("B")
    assert h.shard.snapshot() == before
    assert "B" not in h.group.members and h.shard.handler_failures == 1
    monkeypatch.undo()
    h.heartbeat("A", 1, "foo-0, foo-1")
    assert_records(h.last_records, [])  # still steady, nothing half-done to finish


# --- rollback is exact ---------------------------------------------------------------------------


class Boom(Exception):
    pass


def timers_of(h: Harness) -> dict:
    return dict(h.shard.timers._deadlines)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    steps=st.lists(st.tuples(st.sampled_from("ABCD"), st.sampled_from(["join", "ack", "leave", "commit", "wait"])), min_size=1, max_size=12),
    fail_at=st.integers(0, 30),
)
def test_a_failure_after_any_emit_rolls_the_event_back_exactly(steps, fail_at):
    from tests.coordinator_support import RoundRobinAssignor

    h = Harness(FAST, assignors={"scripted": RoundRobinAssignor()})
    h.topics(foo=4, bar=2)
    epochs: dict[str, int] = {}
    original = ShardContext.emit

    def step(member: str, action: str) -> None:
        if action == "join" or member not in epochs:
            response = h.join(member, subscribe=("foo", "bar"))
        elif action == "ack":
            held = h.group.members.get(member)
            owned = (held.assigned | held.revoking).describe({v: k for k, v in TOPIC_IDS.items()}) if held else ""
            response = h.heartbeat(member, epochs[member], owned)
        elif action == "leave":
            response = h.heartbeat(member, -1)
            epochs.pop(member, None)
            return
        elif action == "commit":
            topic = m.OffsetCommitRequest.OffsetCommitRequestTopic
            h.send(
                m.OffsetCommitRequest(
                    version=9,
                    group_id=GROUP,
                    generation_id_or_member_epoch=epochs[member],
                    member_id=member,
                    topics=[
                        topic(name="foo", partitions=[topic.OffsetCommitRequestPartition(partition_index=0, committed_offset=len(h.log))]),
                    ],
                )
            )
            return
        else:
            h.advance(400)
            return
        if response.error_code == 0:
            epochs[member] = response.member_epoch
        else:
            epochs.pop(member, None)

    for member, action in steps[:-1]:
        step(member, action)
    snapshot, timers = h.shard.snapshot(), timers_of(h)
    computations = dict(h.shard.computations)
    emitted = {"count": 0}

    def failing_emit(self, record):
        if emitted["count"] == fail_at:
            raise Boom()
        emitted["count"] += 1
        original(self, record)

    member, action = steps[-1]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ShardContext, "emit", failing_emit)
        try:
            step(member, action)
            failed = False
        except HandlerFailed:
            failed = True
    event("rolled back" if failed else "completed")
    if failed:
        assert h.shard.snapshot() == snapshot
        assert timers_of(h) == timers
        assert dict(h.shard.computations) == computations
    h.assert_replay_equals_live()  # whatever happened, the log and memory agree


def test_a_stored_record_whose_strings_are_not_utf8_is_unreadable_not_a_crash() -> None:
    """A key or value holding bytes that are not UTF-8 where a string belongs (msgspec raises
    UnicodeDecodeError for those) loads as an UnreadableRecord, so its group is quarantined
    and the shard still loads; before, the load failed and retried for ever."""
    from pystreams.coordinator import records as r

    key, value = r.encode(r.GroupMetadata("g", r.GroupMetadataValue(1)))
    assert value is not None
    bad_key = key.replace(b"\xa1g", b"\xa1\x80")
    stored = r.read_stored(7, bad_key, value)
    assert isinstance(stored, r.UnreadableRecord) and "does not decode" in stored.reason
    offset_key, offset_value = r.encode(r.OffsetCommit("g", "t", 0, r.OffsetCommitValue(offset=1, commit_timestamp_ms=0, metadata="c")))
    assert offset_value is not None and b"\xa1c" in offset_value
    stored = r.read_stored(8, offset_key, offset_value.replace(b"\xa1c", b"\xa1\x80", 1))
    assert isinstance(stored, r.UnreadableRecord) and "OffsetCommit" in stored.reason
