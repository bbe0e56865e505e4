"""The KIP-848 message specs load through kafka-python's ApiMessage machinery and round-trip."""

import uuid

from pystreams.protocol import messages as m


def test_heartbeat_request_round_trips_with_nullable_fields_left_null():
    request = m.ConsumerGroupHeartbeatRequest(
        group_id="g",
        member_id="",
        member_epoch=0,
        rebalance_timeout_ms=30_000,
        subscribed_topic_names=["foo"],
        client_assignors=[
            m.ConsumerGroupHeartbeatRequest.Assignor(
                name="streams",
                minimum_version=1,
                maximum_version=2,
                reason=2,
                metadata_version=2,
                metadata_bytes=b"\x01\x02",
            )
        ],
        topic_partitions=[m.ConsumerGroupHeartbeatRequest.TopicPartitions(topic_id=uuid.uuid4(), partitions=[0, 3])],
    )
    decoded = m.ConsumerGroupHeartbeatRequest.decode(request.encode(version=0), version=0)
    assert decoded.client_assignors[0].metadata_bytes == b"\x01\x02"
    assert decoded.client_assignors[0].reason == 2
    assert decoded.topic_partitions[0].partitions == [0, 3]
    assert decoded.subscribed_topic_regex is None
    assert decoded.server_assignor is None


def test_kip_848_api_keys():
    assert m.ConsumerGroupHeartbeatRequest.API_KEY == 68
    assert m.ConsumerGroupDescribeRequest.API_KEY == 69
    # The KIP leaves these TBD; pystreams picks keys no Apache Kafka API uses.
    assert m.ConsumerGroupPrepareAssignmentRequest.API_KEY == 1000
    assert m.ConsumerGroupInstallAssignmentRequest.API_KEY == 1001


def test_offset_commit_answers_carry_the_group_epoch_as_a_tag_other_clients_skip():
    from kafka.protocol.api_header import ResponseClassRegistry
    from kafka.protocol.consumer.group import OffsetCommitResponse as KafkaOffsetCommitResponse

    from pystreams.protocol import messages as m

    ours = m.OffsetCommitResponse(version=9, topics=[], group_epoch=7)
    data = ours.encode()
    assert m.OffsetCommitResponse.decode(data, version=9).group_epoch == 7
    # kafka-python's own class reads the same bytes, skipping the unknown tag ...
    theirs = KafkaOffsetCommitResponse.decode(data, version=9)
    assert theirs.topics == [] and not hasattr(theirs, "group_epoch")
    # ... and stays the class kafka-python decodes OffsetCommit answers with, process-wide.
    registered = ResponseClassRegistry._response_class_registry[m.OffsetCommitRequest.API_KEY]
    assert not hasattr(registered.decode(data, version=9), "group_epoch")
    # Versions before the flexible ones have no tags: the field is its default there.
    assert m.OffsetCommitResponse.decode(m.OffsetCommitResponse(version=7, topics=[], group_epoch=7).encode(), version=7).group_epoch == -1
