"""The rebalance listener, with KIP-848's semantics (Kafka's ConsumerRebalanceListener).

* ``on_partitions_revoked`` — the coordinator took these partitions away; processing has
  stopped and their offsets are committed. The member acknowledges the revocation only after
  this returns (the driver calls ``GroupMember.revocation_done`` afterwards).
* ``on_partitions_assigned`` — these partitions may be processed now. It can be called several
  times within one member epoch, as previous owners release partitions; each call carries only
  the partitions that are new.
* ``on_partitions_lost`` — the member was fenced (or its session expired): the partitions
  already belong to someone else; nothing can be committed for them.

The member state machine never calls a listener itself (it returns events, see
``pystreams.client.member``); :func:`notify_listener` is the one place where events become
listener calls, so drivers and tests share the mapping.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from pystreams.client.member import (
    MemberEvent,
    PartitionsAssigned,
    PartitionsLost,
    RevokePartitions,
)
from pystreams.partitions import PartitionSet


@runtime_checkable
class RebalanceListener(Protocol):
    def on_partitions_revoked(self, partitions: PartitionSet) -> None: ...

    def on_partitions_assigned(self, partitions: PartitionSet) -> None: ...

    def on_partitions_lost(self, partitions: PartitionSet) -> None: ...


class NoOpRebalanceListener:
    def on_partitions_revoked(self, partitions: PartitionSet) -> None:
        pass

    def on_partitions_assigned(self, partitions: PartitionSet) -> None:
        pass

    def on_partitions_lost(self, partitions: PartitionSet) -> None:
        pass


def notify_listener(listener: RebalanceListener, event: MemberEvent) -> bool:
    """Call the listener method matching a partition event; False for other events.

    For a :class:`RevokePartitions`, call this once the revoked partitions' offsets are
    committed and before ``revocation_done``: that is the KIP's order.
    """
    if isinstance(event, RevokePartitions):
        listener.on_partitions_revoked(event.partitions)
    elif isinstance(event, PartitionsAssigned):
        listener.on_partitions_assigned(event.partitions)
    elif isinstance(event, PartitionsLost):
        listener.on_partitions_lost(event.partitions)
    else:
        return False
    return True
