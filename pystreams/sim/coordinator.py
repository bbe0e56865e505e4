"""The coordinator as a simulated node: the real shard, its durable record log, and fail-over.

Every record a shard call produces is appended to the log before the response leaves (the
runtime's contract with the shard). A *shadow* shard replays each record as it is appended:
it is, at every instant, what a fresh shard replaying the whole log would hold, so the
simulator can compare it with the live shard after every step.

A fail-over kills the live shard (its timers and in-flight client-side computations die with
it); after a load time a new shard replays the whole log, gets the topic metadata, and runs
its fail-over duties (``on_loaded``). Until then requests get no answer.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping

from pystreams.assignors.api import TopicMetadata
from pystreams.coordinator.config import CoordinatorConfig
from pystreams.coordinator.records import Record
from pystreams.coordinator.shard import CoordinatorResult, GroupCoordinatorShard


class CoordinatorNode:
    def __init__(self, config: CoordinatorConfig, new_member_id: Callable[[], str]) -> None:
        self.config = config
        self.new_member_id = new_member_id
        self.log: list[Record] = []
        self.shard: GroupCoordinatorShard | None = self._new_shard()
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
        return result.response

    def handle(self, request: object, now_ms: int) -> object | None:
        assert self.shard is not None
        return self._persist(self.shard.handle(request, now_ms))

    def expire(self, now_ms: int) -> None:
        assert self.shard is not None
        self._persist(self.shard.expire(now_ms))

    def next_deadline(self) -> int | None:
        return self.shard.next_deadline() if self.shard is not None else None

    def update_topics(self, topics: Mapping[str, TopicMetadata], now_ms: int) -> None:
        self.topics = dict(topics)
        if self.shard is not None:
            self._persist(self.shard.update_topics(self.topics, now_ms))

    def crash(self) -> None:
        """The node dies: the live shard and everything it held in memory only are gone."""
        assert self.shard is not None
        self.snapshot_at_death = self.shard.snapshot()
        self.shard = None
        self.incarnation += 1
        self.failovers += 1

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
