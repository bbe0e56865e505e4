"""Coordinator (broker-level) configuration and the dynamic per-group overrides of KIP-848."""

from __future__ import annotations

import re

import msgspec

SESSION_TIMEOUT = "group.consumer.session.timeout.ms"
HEARTBEAT_INTERVAL = "group.consumer.heartbeat.interval.ms"
MIGRATION_POLICY = "group.consumer.migration.policy"
#: The dynamic group configurations of KIP-848 ("Group Configurations"), plus the migration
#: policy per group (Kafka has it only for the whole cluster).
GROUP_CONFIG_NAMES = (SESSION_TIMEOUT, HEARTBEAT_INTERVAL, MIGRATION_POLICY)
#: Which online conversions a group may make (KIP-848 "Supporting Online Consumer Group Upgrade").
MIGRATION_POLICIES = ("bidirectional", "upgrade", "downgrade", "disabled")


def allows_upgrade(policy: str) -> bool:
    return policy in ("bidirectional", "upgrade")


def allows_downgrade(policy: str) -> bool:
    return policy in ("bidirectional", "downgrade")


class CoordinatorConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Defaults are the KIP's broker configuration table."""

    session_timeout_ms: int = 45_000
    min_session_timeout_ms: int = 45_000
    max_session_timeout_ms: int = 60_000
    heartbeat_interval_ms: int = 5_000
    min_heartbeat_interval_ms: int = 5_000
    max_heartbeat_interval_ms: int = 15_000
    #: The interval answered to a member with work in a rebalance (a target being computed, an
    #: assignment to compute, partitions to revoke or to receive), so that each step of the
    #: rebalance takes a round trip rather than a heartbeat interval; never above the group's
    #: interval. A stable member is told the group's interval.
    rebalance_heartbeat_interval_ms: int = 100
    max_group_size: int = 2**31 - 1
    #: Server-side assignors by name; the first one is the default.
    assignors: tuple[str, ...] = ("uniform", "range")
    #: How long a group stays EMPTY before it is deleted (DEAD), offsets included; Kafka's
    #: offsets.retention.minutes default of 7 days.
    empty_group_retention_ms: int = 7 * 24 * 3600 * 1000
    #: offset.metadata.max.bytes: longer commit metadata is OFFSET_METADATA_TOO_LARGE.
    offset_metadata_max_bytes: int = 4096
    #: The groups one shard holds at most; a new group beyond it is refused (POLICY_VIOLATION).
    max_groups: int = 100_000
    #: A client assignor's metadata (in a heartbeat) or one member's assignment metadata (in an
    #: install) at most: both are written as records, which must fit a log batch.
    max_assignor_metadata_bytes: int = 256 * 1024
    #: Classic groups (Kafka's group.min/max.session.timeout.ms, group.max.size,
    #: group.initial.rebalance.delay.ms).
    classic_min_session_timeout_ms: int = 6_000
    classic_max_session_timeout_ms: int = 1_800_000
    classic_max_group_size: int = 2**31 - 1
    initial_rebalance_delay_ms: int = 3_000
    #: A classic member that joined but never completed a join is dropped after this (Kafka's
    #: CLASSIC_GROUP_NEW_MEMBER_JOIN_TIMEOUT_MS).
    classic_new_member_join_timeout_ms: int = 5 * 60 * 1000
    #: group.consumer.migration.policy: bidirectional, upgrade, downgrade or disabled.
    migration_policy: str = "bidirectional"

    def __post_init__(self) -> None:
        if not self.min_session_timeout_ms <= self.session_timeout_ms <= self.max_session_timeout_ms:
            raise ValueError("session_timeout_ms must lie within [min_session_timeout_ms, max_session_timeout_ms]")
        if not self.min_heartbeat_interval_ms <= self.heartbeat_interval_ms <= self.max_heartbeat_interval_ms:
            raise ValueError("heartbeat_interval_ms must lie within [min_heartbeat_interval_ms, max_heartbeat_interval_ms]")
        if self.heartbeat_interval_ms >= self.session_timeout_ms:
            raise ValueError("heartbeat_interval_ms must be smaller than session_timeout_ms")
        if self.rebalance_heartbeat_interval_ms < 1:
            raise ValueError("rebalance_heartbeat_interval_ms must be positive")
        if not self.assignors:
            raise ValueError("at least one server-side assignor must be configured")
        for name in ("offset_metadata_max_bytes", "max_groups", "max_assignor_metadata_bytes", "classic_max_group_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if not 0 < self.classic_min_session_timeout_ms <= self.classic_max_session_timeout_ms:
            raise ValueError("classic_min_session_timeout_ms must be positive and at most classic_max_session_timeout_ms")
        if self.initial_rebalance_delay_ms < 0:
            raise ValueError("initial_rebalance_delay_ms must be >= 0")
        if self.migration_policy not in MIGRATION_POLICIES:
            raise ValueError(f"migration_policy must be one of {', '.join(MIGRATION_POLICIES)}, got {self.migration_policy!r}")

    def default_text(self, name: str) -> str:
        return self.migration_policy if name == MIGRATION_POLICY else str(self.default(name))

    def bounds(self, name: str) -> tuple[int, int]:
        if name == SESSION_TIMEOUT:
            return self.min_session_timeout_ms, self.max_session_timeout_ms
        if name == HEARTBEAT_INTERVAL:
            return self.min_heartbeat_interval_ms, self.max_heartbeat_interval_ms
        raise KeyError(name)

    def default(self, name: str) -> int:
        if name == SESSION_TIMEOUT:
            return self.session_timeout_ms
        if name == HEARTBEAT_INTERVAL:
            return self.heartbeat_interval_ms
        raise KeyError(name)


_DECIMAL = re.compile(r"[+-]?[0-9]+")


def parse_int(value: object, name: str) -> int:
    """A decimal integer as Kafka's config parser reads one (``Integer.parseInt`` of the trimmed
    text): ``5_0000`` or ``٣`` is not one, though Python's ``int()`` takes both."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if isinstance(value, str):
        if not _DECIMAL.fullmatch(value.strip()):
            raise ValueError(f"{name} must be an integer, got {value!r}")
        value = value.strip()
    return int(value)


def validate_group_config(config: CoordinatorConfig, name: str, value: str) -> int | str:
    """The parsed value of one group override, or ValueError with the reason."""
    if name not in GROUP_CONFIG_NAMES:
        raise ValueError(f"unknown group config {name!r}; supported: {', '.join(GROUP_CONFIG_NAMES)}")
    if name == MIGRATION_POLICY:
        policy = str(value).strip().lower()
        if policy not in MIGRATION_POLICIES:
            raise ValueError(f"{name} must be one of {', '.join(MIGRATION_POLICIES)}, got {value!r}")
        return policy
    parsed = parse_int(value, name)
    low, high = config.bounds(name)
    if not low <= parsed <= high:
        raise ValueError(f"{name}={parsed} is outside the coordinator's bounds [{low}, {high}]")
    return parsed
