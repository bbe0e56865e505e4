"""The Kafka API messages pystreams speaks, as kafka-python 3 ApiMessage classes.

The KIP-848 APIs are generated from the JSON specs in ``schemas/`` (the one source of truth for
their shape, as Apache Kafka generates its ``*Data`` classes); the APIs Kafka already has are
kafka-python's own classes, so standard tooling and pystreams agree byte for byte.
"""

from __future__ import annotations

import weakref

from kafka.protocol.admin.configs import (
    DescribeConfigsRequest,
    DescribeConfigsResponse,
    IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResponse,
)
from kafka.protocol.admin.groups import (
    DescribeGroupsRequest,
    DescribeGroupsResponse,
    ListGroupsRequest,
    ListGroupsResponse,
)
from kafka.protocol.api_header import ResponseClassRegistry
from kafka.protocol.api_message import ApiMessage
from kafka.protocol.consumer.group import (
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    OffsetCommitRequest,
    OffsetFetchRequest,
    OffsetFetchResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)
from kafka.protocol.consumer.group import OffsetCommitResponse as _KafkaOffsetCommitResponse
from kafka.protocol.metadata.api_versions import ApiVersionsRequest, ApiVersionsResponse
from kafka.protocol.metadata.find_coordinator import FindCoordinatorRequest, FindCoordinatorResponse
from kafka.protocol.metadata.metadata import MetadataRequest, MetadataResponse
from kafka.protocol.producer import (
    AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse,
    EndTxnRequest,
    EndTxnResponse,
    InitProducerIdRequest,
    InitProducerIdResponse,
    ProduceRequest,
    ProduceResponse,
)
from kafka.protocol.sasl import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)

from pystreams.protocol import schemas as _schemas


# kafka-python ships no types, so mypy cannot see that ApiMessage.__init_subclass__ takes load_json.
class OffsetCommitResponse(ApiMessage, load_json=_schemas):
    """Kafka's OffsetCommitResponse plus one tagged field of pystreams' own, ``GroupEpoch``
    (see the schema): a worker learns from the commit it makes anyway (every commit interval)
    that its group moved on, and heartbeats at once instead of at its next interval."""

    pass  # type: ignore[call-arg]  # untyped base


# Defining the class registered it as kafka-python's OffsetCommit response class for the whole
# process; pystreams decodes through its own registry, so put kafka-python's own back: a user's
# kafka-python consumer in the same process keeps decoding with kafka-python's class.
ResponseClassRegistry.register_response_class(weakref.proxy(_KafkaOffsetCommitResponse))


class ConsumerGroupHeartbeatRequest(ApiMessage, load_json=_schemas):
    pass  # type: ignore[call-arg]  # untyped base


class ConsumerGroupHeartbeatResponse(ApiMessage, load_json=_schemas):
    pass  # type: ignore[call-arg]  # untyped base


class ConsumerGroupDescribeRequest(ApiMessage, load_json=_schemas):
    pass  # type: ignore[call-arg]  # untyped base


class ConsumerGroupDescribeResponse(ApiMessage, load_json=_schemas):
    pass  # type: ignore[call-arg]  # untyped base


class ConsumerGroupPrepareAssignmentRequest(ApiMessage, load_json=_schemas):
    pass  # type: ignore[call-arg]  # untyped base


class ConsumerGroupPrepareAssignmentResponse(ApiMessage, load_json=_schemas):
    pass  # type: ignore[call-arg]  # untyped base


class ConsumerGroupInstallAssignmentRequest(ApiMessage, load_json=_schemas):
    pass  # type: ignore[call-arg]  # untyped base


class ConsumerGroupInstallAssignmentResponse(ApiMessage, load_json=_schemas):
    pass  # type: ignore[call-arg]  # untyped base


__all__ = [name for name in dir() if name.endswith(("Request", "Response")) and not name.startswith("_")]
