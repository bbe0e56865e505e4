"""The error a handler answers with: a Kafka error code and the reason, for the response."""

from __future__ import annotations

import kafka.errors as Errors


class RequestError(Exception):
    """A request is refused with a Kafka error code and a message saying why."""

    def __init__(self, error: type[Errors.BrokerResponseError], message: str) -> None:
        super().__init__(message)
        self.code = error.errno
        self.message = message
