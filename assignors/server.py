"""The server-side assignors a coordinator can offer, by KIP-848 name.

``group.consumer.assignors`` lists names from :data:`SERVER_ASSIGNORS`; the first configured
one is the default for members that name none (Kafka's default order is uniform, then range).
"""

from __future__ import annotations

from .api import ServerAssignor
from .range import RangeAssignor
from .uniform import UniformAssignor

__all__ = ["DEFAULT_SERVER_ASSIGNOR", "SERVER_ASSIGNORS", "UnknownServerAssignorError", "server_assignor"]

#: Assignor classes by the name members put in ConsumerGroupHeartbeat's ServerAssignor field.
SERVER_ASSIGNORS: dict[str, type[ServerAssignor]] = {
    UniformAssignor.name: UniformAssignor,
    RangeAssignor.name: RangeAssignor,
}

DEFAULT_SERVER_ASSIGNOR = UniformAssignor.name


class UnknownServerAssignorError(LookupError):
    """No server-side assignor has this name (the coordinator answers UNSUPPORTED_ASSIGNOR)."""


def server_assignor(name: str) -> ServerAssignor:
    """A new instance of the server-side assignor called ``name``."""
    try:
        assignor_class = SERVER_ASSIGNORS[name]
    except KeyError:
        known = ", ".join(sorted(SERVER_ASSIGNORS))
        raise UnknownServerAssignorError(f"unknown server-side assignor {name!r}; known assignors: {known}") from None
    return assignor_class()
