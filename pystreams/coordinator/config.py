"""Coordinator (broker-level) configuration and the dynamic per-group overrides of KIP-848."""
from __future__ import annotations

import msgspec

SESSION_TIMEOUT = "group.consumer.session.timeout.ms"
HEARTBEAT_INTERVAL = "group.consumer.heartbeat.interval.ms"
#: The dynamic group configurations of KIP-848 ("Group Configurations").
GROUP_CONFIG_NAMES = (SESSION_TIMEOUT, HEARTBEAT_INTERVAL)


class CoordinatorConfig(msgspec.Struct, frozen=True, kw_only=True):
    """Defaults are the KIP's broker configuration table."""

    session_timeout_ms: int = 45_000
    min_session_timeout_ms: int = 45_000
    max_session_timeout_ms: int = 60_000
    heartbeat_interval_ms: int = 5_000
    min_heartbeat_interval_ms: int = 5_000
    max_heartbeat_interval_ms: int = 15_000
    max_group_size: int = 2**31 - 1
    #: Server-side assignors by name; the first one is the default.
    assignors: tuple[str, ...] = ("uniform", "range")
    #: How long a group stays EMPTY before it is deleted (DEAD), offsets included; Kafka's
    #: offsets.retention.minutes default of 7 days.
    empty_group_retention_ms: int = 7 * 24 * 3600 * 1000

    def __post_init__(self) -> None:
        if not self.min_session_timeout_ms <= self.session_timeout_ms <= self.max_session_timeout_ms:
            raise ValueError("session_timeout_ms must lie within [min_session_timeout_ms, max_session_timeout_ms]")
        if not self.min_heartbeat_interval_ms <= self.heartbeat_interval_ms <= self.max_heartbeat_interval_ms:
            raise ValueError("heartbeat_interval_ms must lie within [min_heartbeat_interval_ms, max_heartbeat_interval_ms]")
        if self.heartbeat_interval_ms >= self.session_timeout_ms:
            raise ValueError("heartbeat_interval_ms must be smaller than session_timeout_ms")
        if not self.assignors:
            raise ValueError("at least one server-side assignor must be configured")

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


def validate_group_config(config: CoordinatorConfig, name: str, value: str) -> int:
    """The parsed value of one group override, or ValueError with the reason."""
    if name not in GROUP_CONFIG_NAMES:
        raise ValueError(f"unknown group config {name!r}; supported: {', '.join(GROUP_CONFIG_NAMES)}")
    try:
        parsed = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be an integer, got {value!r}") from None
    low, high = config.bounds(name)
    if not low <= parsed <= high:
        raise ValueError(f"{name}={parsed} is outside the coordinator's bounds [{low}, {high}]")
    return parsed
