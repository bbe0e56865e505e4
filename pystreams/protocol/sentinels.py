"""Values with a meaning of their own in the group protocols, defined once for every side.

Member epochs (KIP-848): 0 joins, -1 leaves, -2 is a static member's temporary leave (and the
epoch the coordinator holds for it while it is away). Error groups: which error codes mean "look
the coordinator up again" and which are worth retrying as they are; the member client, its
driver and the tools all decide with these sets.
"""

from __future__ import annotations

import kafka.errors as Errors

JOIN_EPOCH = 0
LEAVE_EPOCH = -1
LEAVE_STATIC_EPOCH = -2

#: The coordinator moved or is down: find it again (Kafka's consumer marks it unknown).
COORDINATOR_MOVED = frozenset({Errors.NotCoordinatorError.errno, Errors.CoordinatorNotAvailableError.errno})

#: Transient errors: the same request may succeed after a back-off.
RETRIABLE = COORDINATOR_MOVED | frozenset(
    {
        Errors.CoordinatorLoadInProgressError.errno,
        Errors.RequestTimedOutError.errno,
        Errors.NetworkExceptionError.errno,
    }
)
