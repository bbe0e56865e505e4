"""The group's shard as the simulation serves it: the real shard, its durable record log, and
fail-over. With one coordinator node, the shard's life is the node's; with several
(``pystreams.sim.cluster``), the shard moves between them and this holds it wherever it is.

Every record a shard call produces is appended to the log before the response leaves (the
runtime's contract with the shard). A *shadow* shard replays each record as it is appended:
it is, at every instant, what a fresh shard replaying the whole log would hold, so the
simulator can compare it with the live shard after every step.

A classic group's JoinGroup and SyncGroup are long polls: the shard answers them DEFERRED and
a later event (another member's request, a timer) completes them. The node keeps where each
deferred request came from and hands the completions to ``deliver``; a fail-over drops them all,
as the connections holding them close (their members time out and retry).

A fail-over kills the live shard (its timers and in-flight client-side computations die with
it); after a load time a new shard replays the whole log, gets the topic metadata, and runs
its fail-over duties (``on_loaded``). Until then requests get no answer. A release (a node
giving the shard up to another) ends the live shard the same way, but its node stays up and
answers the requests the shard held.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from typing import Any

from pystreams.assignors.api import TopicMetadata
from pystreams.coordinator.config import CoordinatorConfig
from pystreams.coordinator.context import DEFERRED
from pystreams.coordinator.records import Record
from pystreams.coordinator.shard import CoordinatorResult, GroupCoordinatorShard, RequestContext


class CoordinatorNode:
    def __init__(
        self, config: CoordinatorConfig, new_member_id: Callable[[], str], deliver: Callable[[Any, object], None] | None = None, *, serving: bool = True
    ) -> None:
        self.config = config
        self.new_member_id = new_member_id
        #: Called with (route, response) for every deferred request the shard answers later.
        self.deliver = deliver
        self._request_ids = itertools.count(1)
        #: Deferred requests by the id the shard knows them by -> where the answer goes.
        self._deferred: dict[int, Any] = {}
        self.log: list[Record] = []
        #: The live shard; None while no node serves it (dead, moving or loading).
        self.shard: GroupCoordinatorShard | None = self._new_shard() if serving else None
        self.shadow = self._new_shard()
        #: Bumped by every fail-over; messages to or from an older incarnation are lost.
        self.incarnation = 0
        self.topics: dict[str, TopicMetadata] = {}
        self.failovers = 0
        #: The live shard's snapshot when it died, to compare with what the log replays to.
        self.snapshot_at_death: dict | None = None

    def _new_shard(self) -> GroupCoordinatorShard:
        return GroupCoordinatorShard(self.config, new_member_id=self.new_member_id)

    @property
    def up(self) -> bool:
        return self.shard is not None

    def _persist(self, result: CoordinatorResult) -> object | None:
        self.log.extend(result.records)
        for record in result.records:
            self.shadow.replay(record)
        for request_id, response in result.completions:
            route = self._deferred.pop(request_id, None)
            if route is not None and self.deliver is not None:
                self.deliver(route, response)
        return result.response

    def handle(self, request: object, now_ms: int, client_id: str = "", route: Any = None) -> object | None:
        """The shard's answer, or DEFERRED (then it reaches ``deliver`` with ``route`` later)."""
        assert self.shard is not None
        request_id = next(self._request_ids)
        result = self.shard.handle(request, now_ms, RequestContext(client_id=client_id, request_id=request_id))
        if result.response is DEFERRED:
            self._deferred[request_id] = route
        return self._persist(result)

    def expire(self, now_ms: int) -> None:
        assert self.shard is not None
        self._persist(self.shard.expire(now_ms))

    def next_deadline(self) -> int | None:
        return self.shard.next_deadline() if self.shard is not None else None

    def update_topics(self, topics: Mapping[str, TopicMetadata], now_ms: int) -> None:
        self.topics = dict(topics)
        if self.shard is not None:
            self._persist(self.shard.update_topics(self.topics, now_ms))

    def crash(self) -> list[Any]:
        """The shard ends (its node dies, or gives it up): it and everything it held in memory
        only are gone. Returns the routes of the requests it was holding."""
        assert self.shard is not None
        self.snapshot_at_death = self.shard.snapshot()
        self.shard = None
        held = list(self._deferred.values())
        self._deferred.clear()
        self.incarnation += 1
        self.failovers += 1
        return held

    def replayed_snapshot(self) -> dict:
        """What a brand-new shard holds after replaying the whole log."""
        fresh = self._new_shard()
        for record in self.log:
            fresh.replay(record)
        return fresh.snapshot()

    def load(self, now_ms: int) -> dict:
        """A new shard replays the log and takes over. Returns the snapshot the replay produced,
        before the fail-over duties change anything, for comparison with ``snapshot_at_death``."""
        fresh = self._new_shard()
        for record in self.log:
            fresh.replay(record)
        replayed = fresh.snapshot()
        self.shard = fresh
        self.incarnation += 1  # nothing sent while loading survives either
        self._persist(fresh.update_topics(self.topics, now_ms))
        self._persist(fresh.on_loaded(now_ms))
        return replayed
