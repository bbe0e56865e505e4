"""The error a handler answers with: a Kafka error code and the reason, for the response."""

from __future__ import annotations

import kafka.errors as Errors


class RequestError(Exception):
    """A request is refused with a Kafka error code and a message saying why."""

    def __init__(self, error: type[Errors.BrokerResponseError], message: str) -> None:
        super().__init__(message)
        self.code = error.errno
        self.message = message


def while_loading(request: object) -> int:
    """The error code a coordinator whose shard is still loading answers ``request`` with.

    Kafka's: COORDINATOR_LOAD_IN_PROGRESS (retriable), except for two classic requests whose
    members would take it as fatal. A SyncGroup gets REBALANCE_IN_PROGRESS (the loading shard
    lost the rebalance in progress: the member rejoins without rediscovering the coordinator),
    and a classic Heartbeat gets NONE (answered blindly until the group is loaded).
    """
    name = type(request).__name__
    if name == "SyncGroupRequest":
        return Errors.RebalanceInProgressError.errno
    if name == "HeartbeatRequest":
        return Errors.NoError.errno
    return Errors.CoordinatorLoadInProgressError.errno
