"""Which Kafka APIs the pystreams coordinator serves, and at which versions.

The table below is plain data: one row per API (request class, response class, lowest and highest
version served). The server advertises exactly these ranges in ApiVersions and the codec refuses
anything outside them. To serve another API or version, edit a row.

The lowest versions follow Apache Kafka 4 (KIP-896 removed OffsetCommit v0-1, OffsetFetch v0 and
DescribeConfigs v0); kafka-python's JSON specs carry the same ``validVersions`` lower bounds, and
the import-time check below refuses a row that reaches outside what the message class can encode.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from kafka.protocol.api_message import ApiMessage
from kafka.protocol.schemas import BaseField

from pystreams.protocol import messages as m


@dataclass(frozen=True)
class ApiSpec:
    """One served API: its message classes and the inclusive version range we accept."""

    request_class: type[ApiMessage]
    response_class: type[ApiMessage]
    min_version: int
    max_version: int

    @property
    def api_key(self) -> int:
        return self.request_class.API_KEY

    @property
    def name(self) -> str:
        # "ConsumerGroupHeartbeatRequest" -> "ConsumerGroupHeartbeat"
        return self.request_class.name.removesuffix("Request")

    def supports(self, version: int) -> bool:
        return self.min_version <= version <= self.max_version

    def is_flexible(self, version: int) -> bool:
        return bool(self.request_class.flexible_version_q(version))

    def request_header_version(self, version: int) -> int:
        """Request header v2 (tagged fields) for flexible versions, v1 otherwise.

        Also right for ApiVersions versions we do not know: every ApiVersions version from 3 up is
        flexible, which is how Kafka reads the header of a too-new ApiVersions request.
        """
        return 2 if self.is_flexible(version) else 1

    def response_header_version(self, version: int) -> int:
        """Response header v1 for flexible versions, v0 otherwise; ApiVersions always v0.

        ApiVersions is the exception so that a client that does not yet know which versions the
        server speaks can always read the response header.
        """
        if self.api_key == API_VERSIONS_KEY:
            return 0
        return 1 if self.is_flexible(version) else 0


API_VERSIONS_KEY = m.ApiVersionsRequest.API_KEY  # 18

# (request class, response class, min version, max version)
_SERVED: tuple[tuple[type[ApiMessage], type[ApiMessage], int, int], ...] = (
    # v4 differs from v3 only in allowing SupportedFeatures with MinVersion 0 (KAFKA-17011);
    # clients that send v4 get UNSUPPORTED_VERSION and retry with v3, Kafka's own fallback.
    (m.ApiVersionsRequest, m.ApiVersionsResponse, 0, 3),
    # SASL (KIP-43, KIP-152): v1 handshakes hand the tokens to SaslAuthenticate; v0's raw
    # token frames were removed by KIP-896. SaslAuthenticate v2 is flexible.
    (m.SaslHandshakeRequest, m.SaslHandshakeResponse, 1, 1),
    (m.SaslAuthenticateRequest, m.SaslAuthenticateResponse, 0, 2),
    # v13 only adds a top-level ErrorCode; kafka-python's admin client is happy with 12.
    (m.MetadataRequest, m.MetadataResponse, 0, 12),
    # v4 is the batched CoordinatorKeys form (KIP-699); v5/v6 are transaction/share additions.
    (m.FindCoordinatorRequest, m.FindCoordinatorResponse, 0, 4),
    (m.ListGroupsRequest, m.ListGroupsResponse, 0, 5),
    (m.DescribeGroupsRequest, m.DescribeGroupsResponse, 0, 6),
    # v10 carries topic ids (Apache Kafka; the KIP text said v9).
    (m.OffsetCommitRequest, m.OffsetCommitResponse, 2, 10),
    (m.OffsetFetchRequest, m.OffsetFetchResponse, 1, 10),
    (m.DescribeConfigsRequest, m.DescribeConfigsResponse, 1, 4),
    (m.IncrementalAlterConfigsRequest, m.IncrementalAlterConfigsResponse, 0, 1),
    # The classic protocol, for online migration; kafka-python's consumer sends JoinGroup <= 7,
    # SyncGroup <= 5, LeaveGroup <= 5 and Heartbeat <= 4; the Java consumer goes up to JoinGroup 9.
    (m.JoinGroupRequest, m.JoinGroupResponse, 0, 9),
    (m.SyncGroupRequest, m.SyncGroupResponse, 0, 5),
    (m.HeartbeatRequest, m.HeartbeatResponse, 0, 4),
    (m.LeaveGroupRequest, m.LeaveGroupResponse, 0, 5),
    # KIP-848.
    (m.ConsumerGroupHeartbeatRequest, m.ConsumerGroupHeartbeatResponse, 0, 0),
    (m.ConsumerGroupDescribeRequest, m.ConsumerGroupDescribeResponse, 0, 1),
    (m.ConsumerGroupPrepareAssignmentRequest, m.ConsumerGroupPrepareAssignmentResponse, 0, 0),
    (m.ConsumerGroupInstallAssignmentRequest, m.ConsumerGroupInstallAssignmentResponse, 0, 0),
)


def _schema_version_range(message_class: type[ApiMessage]) -> tuple[int, int]:
    # kafka-python reports min_version 0 for every class; the JSON's validVersions is the truth.
    return BaseField.parse_versions(message_class.json["validVersions"])


def _build_table(rows: tuple[tuple[type[ApiMessage], type[ApiMessage], int, int], ...]) -> Mapping[int, ApiSpec]:
    table: dict[int, ApiSpec] = {}
    for request_class, response_class, min_version, max_version in rows:
        spec = ApiSpec(request_class, response_class, min_version, max_version)
        if request_class.API_KEY != response_class.API_KEY:
            raise ValueError(f"{spec.name}: request and response API keys differ")
        if spec.api_key in table:
            raise ValueError(f"{spec.name}: API key {spec.api_key} listed twice")
        for message_class in (request_class, response_class):
            low, high = _schema_version_range(message_class)
            if not low <= min_version <= max_version <= high:
                raise ValueError(f"{spec.name}: versions {min_version}-{max_version} outside {message_class.name}'s schema range {low}-{high}")
        table[spec.api_key] = spec
    return MappingProxyType(table)


SUPPORTED_APIS: Mapping[int, ApiSpec] = _build_table(_SERVED)

# APIs pystreams only speaks to Kafka brokers, as a client (the coordinator's transactional log
# writer): never served, never advertised.
_SPOKEN_TO_BROKERS: tuple[tuple[type[ApiMessage], type[ApiMessage], int, int], ...] = (
    # v3 is the first that carries a transactional id (record batches v2, KIP-98).
    (m.ProduceRequest, m.ProduceResponse, 3, 11),
    (m.InitProducerIdRequest, m.InitProducerIdResponse, 0, 5),
    # v4 and up are the brokers' own batched form (KIP-890); clients send v3 at most.
    (m.AddPartitionsToTxnRequest, m.AddPartitionsToTxnResponse, 0, 3),
    # v5 is KIP-890's second part (transactions v2), which the log writer does not speak.
    (m.EndTxnRequest, m.EndTxnResponse, 0, 4),
)

BROKER_CLIENT_APIS: Mapping[int, ApiSpec] = _build_table(_SPOKEN_TO_BROKERS)


def api_spec(api_key: int) -> ApiSpec | None:
    """The served API with this key, or None if the coordinator does not serve it."""
    return SUPPORTED_APIS.get(api_key)


def client_api_spec(api_key: int) -> ApiSpec | None:
    """An API pystreams sends as a client: one it serves (to a coordinator) or one it speaks
    to brokers."""
    return SUPPORTED_APIS.get(api_key) or BROKER_CLIENT_APIS.get(api_key)


def advertised_versions() -> Iterator[tuple[int, int, int]]:
    """(api_key, min_version, max_version) for every served API, in key order, for ApiVersions."""
    for api_key in sorted(SUPPORTED_APIS):
        spec = SUPPORTED_APIS[api_key]
        yield api_key, spec.min_version, spec.max_version
