"""OffsetCommit/OffsetFetch fenced by member epoch; ListGroups; Describe; group configs."""

import uuid

import kafka.errors as Errors
from coordinator_support import FAST, GROUP, TOPIC_IDS, Harness

from pystreams.coordinator.config import HEARTBEAT_INTERVAL, MIGRATION_POLICY, SESSION_TIMEOUT
from pystreams.protocol import messages as m

Commit, Fetch = m.OffsetCommitRequest, m.OffsetFetchRequest
CTopic, CPart = Commit.OffsetCommitRequestTopic, Commit.OffsetCommitRequestTopic.OffsetCommitRequestPartition
FGroup, FTopics = Fetch.OffsetFetchRequestGroup, Fetch.OffsetFetchRequestGroup.OffsetFetchRequestTopics


def commit(h, member_id, epoch, offsets: dict[tuple[str, int], int], by_id=False, group_id=GROUP):
    topics = {}
    for (name, p), offset in offsets.items():
        topics.setdefault(name, []).append(CPart(partition_index=p, committed_offset=offset, committed_metadata="m"))
    request = Commit(
        group_id=group_id,
        generation_id_or_member_epoch=epoch,
        member_id=member_id,
        topics=[CTopic(name="" if by_id else name, topic_id=TOPIC_IDS[name] if by_id else None, partitions=ps) for name, ps in topics.items()],
    )
    response = h.send(request)
    return {(t.name or t.topic_id, p.partition_index): p.error_code for t in response.topics for p in t.partitions}


def fetch(h, topics=None, member_id=None, epoch=-1, by_id=False, group_id=GROUP):
    request_topics = (
        None
        if topics is None
        else [FTopics(name="" if by_id else name, topic_id=TOPIC_IDS[name] if by_id else None, partition_indexes=ps) for name, ps in topics.items()]
    )
    response = h.send(Fetch(groups=[FGroup(group_id=group_id, member_id=member_id, member_epoch=epoch, topics=request_topics)]))
    group = response.groups[0]
    return group.error_code, {(t.name or t.topic_id, p.partition_index): (p.committed_offset, p.error_code) for t in group.topics for p in t.partitions}


def _member(h):
    h.topics(foo=2, bar=1)
    h.scripted.next = {"A": "foo-0, foo-1"}
    h.join("A")
    return h.group.members["A"].member_epoch


def test_commit_is_fenced_by_member_epoch():
    h = Harness()
    epoch = _member(h)
    assert commit(h, "A", epoch, {("foo", 0): 10}) == {("foo", 0): 0}
    assert commit(h, "A", epoch - 1, {("foo", 0): 11}) == {("foo", 0): Errors.StaleMemberEpochError.errno}
    assert commit(h, "A", epoch + 1, {("foo", 0): 12}) == {("foo", 0): Errors.FencedMemberEpochError.errno}
    assert commit(h, "Z", epoch, {("foo", 0): 13}) == {("foo", 0): Errors.UnknownMemberIdError.errno}
    assert commit(h, "", -1, {("foo", 0): 14}) == {("foo", 0): Errors.UnknownMemberIdError.errno}  # admin, group not empty
    assert fetch(h, {"foo": [0, 1]}) == (0, {("foo", 0): (10, 0), ("foo", 1): (-1, 0)})
    h.assert_replay_equals_live()


def test_commit_and_fetch_by_topic_id_never_both():
    h = Harness()
    epoch = _member(h)
    assert commit(h, "A", epoch, {("foo", 1): 5}, by_id=True) == {(TOPIC_IDS["foo"], 1): 0}
    assert fetch(h, {"foo": [1]}, by_id=True)[1] == {(TOPIC_IDS["foo"], 1): (5, 0)}
    assert fetch(h, {"foo": [1]})[1] == {("foo", 1): (5, 0)}
    both = Commit(
        group_id=GROUP,
        generation_id_or_member_epoch=epoch,
        member_id="A",
        topics=[CTopic(name="foo", topic_id=TOPIC_IDS["foo"], partitions=[CPart(partition_index=0, committed_offset=1)])],
    )
    assert h.send(both).topics[0].partitions[0].error_code == Errors.InvalidRequestError.errno
    unknown = Commit(
        group_id=GROUP,
        generation_id_or_member_epoch=epoch,
        member_id="A",
        topics=[CTopic(name="", topic_id=uuid.UUID(int=77), partitions=[CPart(partition_index=0, committed_offset=1)])],
    )
    assert h.send(unknown).topics[0].partitions[0].error_code == Errors.UnknownTopicIdError.errno


def test_offsets_of_a_recreated_topic_are_not_inherited():
    from pystreams.assignors.api import TopicMetadata

    h = Harness()
    epoch = _member(h)
    commit(h, "A", epoch, {("foo", 0): 42}, by_id=True)
    h.scripted.next = {}
    new_id = uuid.UUID(int=1234)
    h.shard.update_topics({"foo": TopicMetadata(new_id, "foo", 2)}, h.now)
    response = h.send(Fetch(groups=[FGroup(group_id=GROUP, topics=[FTopics(name="", topic_id=new_id, partition_indexes=[0])])]))
    assert response.groups[0].topics[0].partitions[0].committed_offset == -1


def test_fetch_validates_the_member_when_given():
    h = Harness()
    epoch = _member(h)
    assert fetch(h, {"foo": [0]}, member_id="A", epoch=epoch)[0] == 0
    assert fetch(h, {"foo": [0]}, member_id="A", epoch=epoch - 1)[0] == Errors.StaleMemberEpochError.errno
    assert fetch(h, {"foo": [0]}, member_id="Q", epoch=epoch)[0] == Errors.UnknownMemberIdError.errno


def test_admin_commit_creates_an_empty_group_and_fetch_all():
    h = Harness()
    h.topics(foo=2)
    assert commit(h, "", -1, {("foo", 0): 3, ("foo", 1): 4}, group_id="offsets-only") == {("foo", 0): 0, ("foo", 1): 0}
    error, offsets = fetch(h, None, group_id="offsets-only")
    assert (error, offsets) == (0, {("foo", 0): (3, 0), ("foo", 1): (4, 0)})
    old = h.send(Fetch(group_id="offsets-only", topics=None))  # the pre-v8 layout
    assert {(t.name, p.partition_index): p.committed_offset for t in old.topics for p in t.partitions} == {("foo", 0): 3, ("foo", 1): 4}


def test_empty_group_expires_with_its_offsets():
    import msgspec

    from pystreams.coordinator.config import CoordinatorConfig

    h = Harness(CoordinatorConfig(**{**msgspec.structs.asdict(FAST), "empty_group_retention_ms": 5_000}))
    epoch = _member(h)
    commit(h, "A", epoch, {("foo", 0): 1})
    h.scripted.next = {}
    h.heartbeat("A", -1)
    h.advance(4_999)
    assert GROUP in h.shard.groups
    h.advance(1)
    assert GROUP not in h.shard.groups
    assert h.replayed().snapshot() == h.shard.snapshot() == {"groups": {}, "offsets": {}, "group_configs": {}}


def test_list_groups_filters_by_state_and_type():
    h = Harness()
    _member(h)
    commit(h, "", -1, {("foo", 0): 3}, group_id="idle")

    def listed(**kw):
        return {(g.group_id, g.group_state, g.group_type) for g in h.send(m.ListGroupsRequest(**kw)).groups}

    assert listed() == {(GROUP, "Stable", "consumer"), ("idle", "Empty", "consumer")}
    assert listed(states_filter=["stable"]) == {(GROUP, "Stable", "consumer")}
    assert listed(types_filter=["classic"]) == set()
    assert listed(types_filter=["consumer"], states_filter=["Empty"]) == {("idle", "Empty", "consumer")}


def test_consumer_group_describe():
    h = Harness()
    _member(h)
    response = h.send(m.ConsumerGroupDescribeRequest(group_ids=[GROUP, "missing"]))
    group, missing = response.groups
    assert (group.group_state, group.group_epoch, group.assignment_epoch, group.assignor_name) == ("Stable", 1, 1, "scripted")
    member = group.members[0]
    assert member.member_id == "A" and member.subscribed_topic_names == ["foo"]
    assert [(t.topic_name, t.partitions) for t in member.assignment.topic_partitions] == [("foo", [0, 1])]
    assert [(t.topic_name, t.partitions) for t in member.target_assignment.topic_partitions] == [("foo", [0, 1])]
    assert missing.error_code == Errors.GroupIdNotFoundError.errno
    assert h.send(m.ConsumerGroupDescribeRequest(group_ids=[])).groups[0].error_code == Errors.InvalidRequestError.errno


def _alter(h, group, *entries, validate_only=False):
    Resource = m.IncrementalAlterConfigsRequest.AlterConfigsResource
    request = m.IncrementalAlterConfigsRequest(
        validate_only=validate_only,
        resources=[
            Resource(resource_type=16, resource_name=group, configs=[Resource.AlterableConfig(name=n, config_operation=op, value=v) for n, op, v in entries])
        ],
    )
    result = h.send(request).responses[0]
    return result.error_code, result.error_message


def _describe(h, group):
    Resource = m.DescribeConfigsRequest.DescribeConfigsResource
    result = h.send(m.DescribeConfigsRequest(resources=[Resource(resource_type=16, resource_name=group, configuration_keys=None)])).results[0]
    return {c.name: (c.value, c.is_default) for c in result.configs}


def test_dynamic_group_configs_within_bounds():
    h = Harness()
    _member(h)
    assert _describe(h, GROUP) == {
        SESSION_TIMEOUT: (str(FAST.session_timeout_ms), True),
        HEARTBEAT_INTERVAL: (str(FAST.heartbeat_interval_ms), True),
        MIGRATION_POLICY: ("bidirectional", True),
    }
    assert _alter(h, GROUP, (MIGRATION_POLICY, 0, "Upgrade")) == (0, None)
    assert _describe(h, GROUP)[MIGRATION_POLICY] == ("upgrade", False)
    code, message = _alter(h, GROUP, (MIGRATION_POLICY, 0, "sideways"))
    assert code == Errors.InvalidConfigurationError.errno and "bidirectional" in message
    assert _alter(h, GROUP, (HEARTBEAT_INTERVAL, 0, "250"), (SESSION_TIMEOUT, 0, "2000")) == (0, None)
    assert _describe(h, GROUP)[HEARTBEAT_INTERVAL] == ("250", False)
    assert h.heartbeat("A", 1).heartbeat_interval_ms == 250
    assert h.shard.consumer.session_timeout_ms(GROUP) == 2000
    code, message = _alter(h, GROUP, (SESSION_TIMEOUT, 0, "999999"))
    assert code == Errors.InvalidConfigurationError.errno and "outside" in message
    code, message = _alter(h, GROUP, ("group.consumer.assignors", 0, "x"))
    assert code == Errors.InvalidConfigurationError.errno and "unknown" in message
    code, _ = _alter(h, GROUP, (HEARTBEAT_INTERVAL, 2, "1"))  # APPEND makes no sense here
    assert code == Errors.InvalidConfigurationError.errno
    assert _alter(h, GROUP, (HEARTBEAT_INTERVAL, 0, "300"), validate_only=True) == (0, None)
    assert _describe(h, GROUP)[HEARTBEAT_INTERVAL] == ("250", False)
    assert _alter(h, GROUP, (HEARTBEAT_INTERVAL, 1, None)) == (0, None)
    assert _describe(h, GROUP)[HEARTBEAT_INTERVAL] == (str(FAST.heartbeat_interval_ms), True)
    # Configs exist independently of the group, as the KIP says.
    assert _alter(h, "not-yet-a-group", (SESSION_TIMEOUT, 0, "5000")) == (0, None)
    h.assert_replay_equals_live()


def test_a_commit_answer_tells_a_kip_848_member_its_groups_epoch():
    # The tagged GroupEpoch field: a stable member commits every interval; when a member joins,
    # the answer to its next commit shows the group moved on, and it heartbeats at once.
    h = Harness()
    epoch = _member(h)

    def answer(member_epoch):
        topic = CTopic(name="foo", partitions=[CPart(partition_index=0, committed_offset=1, committed_metadata="")])
        return h.send(Commit(group_id=GROUP, generation_id_or_member_epoch=member_epoch, member_id="A", topics=[topic]))

    assert answer(epoch).group_epoch == epoch == h.group.group_epoch
    h.scripted.next = {"A": "foo-0", "B": "foo-1"}
    h.join("B")
    assert answer(epoch).group_epoch == h.group.group_epoch > epoch
    # A commit for no known group names no epoch.
    orphan = h.send(Commit(group_id="nobody", generation_id_or_member_epoch=-1, member_id="", topics=[]))
    assert orphan.group_epoch == -1
