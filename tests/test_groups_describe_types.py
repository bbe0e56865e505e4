"""``pystreams groups --describe`` rendering of group types and member protocols, from canned
coordinator answers: a consumer group whose members are classic and consumer (ConsumerGroupDescribe
v1's MemberType), and a classic group (the fallback to DescribeGroups, its embedded consumer
protocol decoded)."""

from __future__ import annotations

import argparse
import json
import uuid

import kafka.errors as Errors

from pystreams.commands import groups
from pystreams.protocol import messages as m
from pystreams.protocol.consumer_protocol import Assignment, Subscription, encode_assignment, encode_subscription, named_partitions

FOO = uuid.UUID(int=7)


class CannedClient:
    def __init__(self, *answers: object) -> None:
        self.answers = list(answers)
        self.sent: list[object] = []

    def send(self, request: object) -> object:
        self.sent.append(request)
        return self.answers.pop(0)


def args(json_output: bool) -> argparse.Namespace:
    return argparse.Namespace(describe="g", json=json_output)


def consumer_group_with_member_types() -> object:
    described = m.ConsumerGroupDescribeResponse.DescribedGroup
    member = described.Member
    assignment = member.Assignment
    tp = assignment.TopicPartitions

    def one(member_id: str, member_type: int) -> object:
        return member(
            member_id=member_id,
            instance_id=None,
            rack_id=None,
            member_epoch=3,
            client_id="c",
            client_host="/h",
            subscribed_topic_names=["foo"],
            subscribed_topic_regex=None,
            assignment=assignment(topic_partitions=[tp(topic_id=FOO, topic_name="foo", partitions=[0])], error=0, metadata_version=0, metadata_bytes=b""),
            target_assignment=assignment(topic_partitions=[], error=0, metadata_version=0, metadata_bytes=b""),
            member_type=member_type,
        )

    return m.ConsumerGroupDescribeResponse(
        throttle_time_ms=0,
        groups=[
            described(
                error_code=0,
                error_message=None,
                group_id="g",
                group_state="Reconciling",
                group_epoch=4,
                assignment_epoch=4,
                assignor_name="uniform",
                members=[one("a", 0), one("b", 1), one("c", -1)],
            )
        ],
    )


def test_a_migrating_consumer_group_shows_each_members_protocol(capsys) -> None:
    assert groups._describe(args(False), CannedClient(consumer_group_with_member_types())) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert rows[0][:3] == ["GROUP", "TYPE", "STATE"] and rows[1][:3] == ["g", "consumer", "Reconciling"]
    protocol = rows[2].index("PROTOCOL")
    assert {row[0]: row[protocol] for row in rows[3:]} == {"a": "classic", "b": "consumer", "c": "unknown"}

    assert groups._describe(args(True), CannedClient(consumer_group_with_member_types())) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["group_type"] == "consumer"
    assert {mem["member_id"]: mem["member_type"] for mem in document["members"]} == {"a": "classic", "b": "consumer", "c": "unknown"}


def classic_answers() -> tuple[object, object]:
    not_consumer = m.ConsumerGroupDescribeResponse(
        throttle_time_ms=0,
        groups=[
            m.ConsumerGroupDescribeResponse.DescribedGroup(
                error_code=Errors.GroupIdNotFoundError.errno,
                error_message="Group g is not a consumer group.",
                group_id="g",
                group_state="",
                group_epoch=0,
                assignment_epoch=0,
                assignor_name="",
                members=[],
            )
        ],
    )
    described = m.DescribeGroupsResponse.DescribedGroup
    member = described.DescribedGroupMember
    classic = m.DescribeGroupsResponse(
        throttle_time_ms=0,
        groups=[
            described(
                error_code=0,
                error_message=None,
                group_id="g",
                group_state="Stable",
                protocol_type="consumer",
                protocol_data="range",
                members=[
                    member(
                        member_id="m-1",
                        group_instance_id="i-1",
                        client_id="c",
                        client_host="/h",
                        member_metadata=encode_subscription(Subscription(topics=("foo",))),
                        member_assignment=encode_assignment(Assignment(named_partitions([("foo", [0, 1, 2])]))),
                    ),
                    member(member_id="m-2", group_instance_id=None, client_id="c", client_host="/h", member_metadata=b"\x00\x01junk", member_assignment=b""),
                ],
                authorized_operations=-2147483648,
            )
        ],
    )
    return not_consumer, classic


def test_a_classic_group_is_described_through_describe_groups(capsys) -> None:
    client = CannedClient(*classic_answers())
    assert groups._describe(args(False), client) == 0
    assert [type(request).__name__ for request in client.sent] == ["ConsumerGroupDescribeRequest", "DescribeGroupsRequest"]
    rows = [line.split() for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert rows[0] == ["GROUP", "TYPE", "STATE", "PROTOCOL-TYPE", "PROTOCOL", "MEMBERS"]
    assert rows[1] == ["g", "classic", "Stable", "consumer", "range", "2"]
    assert rows[3] == ["m-1", "i-1", "c", "/h", "classic", "foo", "foo:0-2"]
    assert rows[4] == ["m-2", "-", "c", "/h", "classic", "-", "-"]  # unreadable metadata: shown as nothing, no crash

    assert groups._describe(args(True), CannedClient(*classic_answers())) == 0
    document = json.loads(capsys.readouterr().out)
    assert (document["group_type"], document["protocol"]) == ("classic", "range")
    assert document["members"][0]["assignment"] == {"foo": [0, 1, 2]} and document["members"][1]["subscribed_topic_names"] is None


def test_a_missing_group_is_reported_with_the_coordinators_reason(capsys) -> None:
    not_consumer, _ = classic_answers()
    dead = m.DescribeGroupsResponse(
        throttle_time_ms=0,
        groups=[
            m.DescribeGroupsResponse.DescribedGroup(
                error_code=Errors.GroupIdNotFoundError.errno,
                error_message="Group g not found.",
                group_id="g",
                group_state="Dead",
                protocol_type="",
                protocol_data="",
                members=[],
                authorized_operations=-2147483648,
            )
        ],
    )
    assert groups._describe(args(False), CannedClient(not_consumer, dead)) == 1
    assert "GROUP_ID_NOT_FOUND" in capsys.readouterr().err
