"""Finding and releasing records the coordinator cannot replay (``pystreams coordinator --repair``).

A load that meets a record it cannot decode quarantines that record's group and serves the
rest (see ``shard``). This tool reads the log the way a load does, without claiming anything, so
it runs beside a live coordinator: ``find_unreadable`` lists every record that is unreadable and
not superseded by a later record of the same key; ``skip`` appends a tombstone for each one's key,
which supersedes it, so the next load of its shard (a coordinator restart) serves the group from
its other records. Nothing is rewritten in place: the log only grows, as it always does.
"""

from __future__ import annotations

from dataclasses import dataclass

from pystreams.coordinator import records as r
from pystreams.coordinator.log import RecordLog


@dataclass(frozen=True)
class Finding:
    partition: int
    record: r.UnreadableRecord

    def describe(self) -> str:
        group = repr(self.record.group_id) if self.record.group_id is not None else "(unknown group)"
        return f"partition {self.partition} offset {self.record.offset} group {group}: {self.record.reason}"


async def find_unreadable(log: RecordLog) -> list[Finding]:
    found: list[Finding] = []
    for partition in range(log.partition_count):
        pending: dict[bytes, r.UnreadableRecord] = {}
        async for chunk in log.scan(partition):
            for record in chunk:
                if isinstance(record, r.UnreadableRecord):
                    if record.tombstone:
                        pending.pop(record.raw_key, None)
                    else:
                        pending[record.raw_key] = record
                elif pending:
                    pending.pop(r.encode(record)[0], None)
        found += [Finding(partition, record) for record in sorted(pending.values(), key=lambda u: u.offset)]
    return found


async def skip(log: RecordLog, findings: list[Finding]) -> None:
    """Tombstone the key of each finding (grouped per partition, one write each)."""
    by_partition: dict[int, list[bytes]] = {}
    for finding in findings:
        by_partition.setdefault(finding.partition, []).append(finding.record.raw_key)
    for partition, keys in sorted(by_partition.items()):
        await log.write_tombstones(partition, keys)
