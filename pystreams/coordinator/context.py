"""What a group manager may touch, and the journal that makes a failed handler leave no trace.

The shard composes its managers (consumer groups, offsets, group configs, ...) with one
:class:`ShardContext`. A manager changes state only through it:

* ``emit(record)`` checks the record can be appended and replayed (``records.check_appendable``),
  remembers the *pre-image* of its key (the record that rebuilds what the key held before),
  replays it through the shard, and queues it for the log;
* ``schedule``/``cancel`` arm and disarm timers;
* ``on_undo(callback)`` registers how to revert runtime state that is not a record (a client-side
  computation in flight).

Everything above is journaled for the event being handled. If the handler raises, ``rollback``
replays the pre-images newest first and reverts the timers and callbacks, so the shard is exactly
as it was and nothing reaches the log: the request is answered with an error, the shard stays up.
Savepoints let one event handle several independent items (due timers) and drop only the one
that failed.

The shard's group registry lives here too: groups of every type by id, plus the groups held back
after a load because some of their records could not be read (``quarantined``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import kafka.errors as Errors

from pystreams.assignors.api import TopicMetadata
from pystreams.coordinator import records as r
from pystreams.coordinator.config import MIGRATION_POLICY, CoordinatorConfig
from pystreams.coordinator.errors import RequestError
from pystreams.coordinator.timers import TimerKey, Timers


class RecordSink(Protocol):
    """The shard, as the context sees it."""

    def replay(self, record: r.Record) -> None: ...

    def pre_image(self, record: r.Record) -> r.Record:
        """The record that restores what ``record``'s key holds now (a tombstone if nothing)."""
        ...


@dataclass(frozen=True)
class Quarantine:
    """Why a group is held back: records of it at these offsets could not be read."""

    group_id: str
    unreadable: tuple[r.UnreadableRecord, ...]

    def describe(self) -> str:
        first = self.unreadable[0]
        more = f" (and {len(self.unreadable) - 1} more)" if len(self.unreadable) > 1 else ""
        return f"its record at log offset {first.offset} cannot be replayed: {first.reason}{more}"


class GroupQuarantined(RequestError):
    """COORDINATOR_NOT_AVAILABLE: clients retry (and find it served once it is repaired)."""

    def __init__(self, quarantine: Quarantine) -> None:
        super().__init__(
            Errors.CoordinatorNotAvailableError,
            f"group {quarantine.group_id!r} is not served: {quarantine.describe()}; see `pystreams coordinator repair`",
        )
        self.quarantine = quarantine


class GroupRegistry:
    """Groups of every type by id. ``get`` refuses a quarantined group, so no handler can serve
    it or create a new group over it."""

    def __init__(self) -> None:
        self._groups: dict[str, Any] = {}
        self.quarantined: dict[str, Quarantine] = {}

    def get(self, group_id: str) -> Any | None:
        quarantine = self.quarantined.get(group_id)
        if quarantine is not None:
            raise GroupQuarantined(quarantine)
        return self._groups.get(group_id)

    def peek(self, group_id: str) -> Any | None:
        """The group, quarantined or not (replay and introspection only)."""
        return self._groups.get(group_id)

    def __contains__(self, group_id: object) -> bool:
        return group_id in self._groups

    def __getitem__(self, group_id: str) -> Any:
        return self._groups[group_id]

    def __setitem__(self, group_id: str, group: Any) -> None:
        self._groups[group_id] = group

    def __delitem__(self, group_id: str) -> None:
        del self._groups[group_id]

    def pop(self, group_id: str, default: Any = None) -> Any:
        return self._groups.pop(group_id, default)

    def __iter__(self) -> Iterator[str]:
        return iter(self._groups)

    def __len__(self) -> int:
        return len(self._groups)

    def items(self):
        return self._groups.items()

    def values(self):
        return self._groups.values()

    def served(self) -> Iterator[tuple[str, Any]]:
        """(id, group) of the groups that are not quarantined."""
        for group_id, group in self._groups.items():
            if group_id not in self.quarantined:
                yield group_id, group


class Deferred:
    """A handler's answer when the response comes later (a classic JoinGroup waits for the join
    phase to end): the runtime keeps the caller waiting under the request's id."""

    _instance: Deferred | None = None

    def __new__(cls) -> Deferred:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "DEFERRED"


DEFERRED = Deferred()


@dataclass
class _Journal:
    records: list[r.Record] = field(default_factory=list)
    undo: list[Callable[[], None]] = field(default_factory=list)
    #: (request id, response): answers to requests that were deferred earlier.
    completions: list[tuple[int, Any]] = field(default_factory=list)


class ShardContext:
    def __init__(
        self,
        config: CoordinatorConfig,
        sink: RecordSink,
        new_member_id: Callable[[], str],
    ) -> None:
        self.config = config
        self.groups = GroupRegistry()
        self.timers = Timers()
        self.topics: Mapping[str, TopicMetadata] = {}
        self.new_member_id = new_member_id
        self.group_configs: dict[str, dict[str, str]] = {}
        #: Who sent the request being handled (client id, host, request id).
        self.request: Any = None
        self._sink = sink
        self._journal: _Journal | None = None

    # --- the event being handled -----------------------------------------------------------

    def begin(self) -> None:
        if self._journal is not None:
            raise RuntimeError("an event is already being handled")
        self._journal = _Journal()

    def commit(self) -> tuple[list[r.Record], list[tuple[int, Any]]]:
        journal = self._require()
        self._journal = None
        return journal.records, journal.completions

    def savepoint(self) -> tuple[int, int, int]:
        journal = self._require()
        return len(journal.records), len(journal.undo), len(journal.completions)

    def rollback(self, savepoint: tuple[int, int, int] = (0, 0, 0)) -> None:
        """Undo everything since ``savepoint`` (the start of the event by default), newest first."""
        journal = self._require()
        records_at, undo_at, completions_at = savepoint
        while len(journal.undo) > undo_at:
            journal.undo.pop()()
        del journal.records[records_at:]
        del journal.completions[completions_at:]

    def abort(self) -> None:
        """Roll the whole event back and end it."""
        if self._journal is not None:
            self.rollback()
            self._journal = None

    def _require(self) -> _Journal:
        if self._journal is None:
            raise RuntimeError("records and timers change only while handling an event")
        return self._journal

    # --- what managers call ----------------------------------------------------------------

    def emit(self, record: r.Record) -> None:
        """Generate a record: check it, apply it now, and hand it to the runtime to persist."""
        journal = self._require()
        r.check_appendable(record)
        before = self._sink.pre_image(record)
        self._sink.replay(record)
        journal.undo.append(lambda: self._sink.replay(before))
        journal.records.append(record)

    def schedule(self, timer: TimerKey, deadline_ms: int) -> None:
        self._journal_timer(timer)
        self.timers.schedule(timer, deadline_ms)

    def cancel(self, timer: TimerKey) -> None:
        if self.timers.deadline(timer) is not None:
            self._journal_timer(timer)
            self.timers.cancel(timer)

    def complete(self, request_id: int, response: Any) -> None:
        """Answer a request that was deferred earlier; sent once this event's records are durable."""
        self._require().completions.append((request_id, response))

    def on_undo(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` if the event is rolled back (runtime state that is not a record)."""
        self._require().undo.append(callback)

    def _journal_timer(self, timer: TimerKey) -> None:
        previous = self.timers.deadline(timer)
        timers = self.timers
        self._require().undo.append(lambda: timers.cancel(timer) if previous is None else timers.schedule(timer, previous))

    # --- configuration ---------------------------------------------------------------------

    def group_config(self, group_id: str, name: str) -> int:
        """A dynamic group config (KIP-848 "Group Configurations"), or the coordinator's default."""
        value = self.group_configs.get(group_id, {}).get(name)
        return int(value) if value is not None else self.config.default(name)

    def migration_policy(self, group_id: str) -> str:
        return self.group_configs.get(group_id, {}).get(MIGRATION_POLICY) or self.config.migration_policy

    @property
    def in_event(self) -> bool:
        """True while handling an event (live), False while a load replays the log."""
        return self._journal is not None
