"""A stream thread's offsets on their way to the coordinator: the engine thread commits and reads
offsets through this object, which hops onto the asyncio loop where the member driver commits
with its member id and epoch (OffsetCommit v9, by topic name).

* ``commit_blocking``: a commit that ends ownership (revocation, close). It waits, after any
  periodic commit in flight, so that an older background commit can never land after it.
* ``commit_in_background``: at-least-once's periodic commit. The engine goes on processing while
  it travels; offsets that come while one is on its way wait and go next, merged.
* ``confirm_membership``: exactly-once's *membership gate*, inside each commit before the Kafka
  transaction commits. A refusal (fenced or unknown member) raises MembershipLost, which aborts
  the transaction. A coordinator that does not answer within ``GATE_TIMEOUT_S`` does not stop
  commits (the positions in the transaction keep them exact): CoordinatorAway, and the offsets
  follow in the background until it answers again.

STALE_MEMBER_EPOCH (or a classic group's REBALANCE_IN_PROGRESS) waits for the next heartbeat,
which brings the new epoch, and commits again. The loop is never blocked by the engine, so the
hops cannot deadlock.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import uuid
from collections.abc import Mapping, Sequence

from pystreams.client.driver import MemberDriver
from pystreams.state import TopicPartition

from .transaction import MembershipLost

log = logging.getLogger(__name__)

#: How long a commit or offset fetch (made from the engine thread) may wait for the loop.
OFFSETS_CALL_TIMEOUT_S = 30.0
#: Exactly-once: how long a commit waits for the coordinator's word before going on without it.
GATE_TIMEOUT_S = 5.0
_STALE_EPOCH_RETRIES = 5
#: OffsetCommit errors that mean the member no longer owns what it commits.
_MEMBERSHIP_ERRORS = frozenset({22, 25, 82, 110})  # ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID, FENCED_INSTANCE_ID, FENCED_MEMBER_EPOCH


class CommitFailed(RuntimeError):
    """The coordinator refused a commit (fenced, unknown member, ...)."""


class CoordinatorAway(CommitFailed):
    """Exactly-once: the coordinator did not answer the membership gate in time."""


class OffsetGate:
    def __init__(self, name: str, driver: MemberDriver, loop: asyncio.AbstractEventLoop) -> None:
        self._name = name
        self._driver = driver
        self._loop = loop
        #: The periodic commit on its way to the coordinator (one at a time, so offsets never
        #: go back), and the newest offsets waiting for it to finish.
        self._background_commit: concurrent.futures.Future[None] | None = None
        self._next_background_commit: dict[TopicPartition, int] = {}
        self._lock = threading.Lock()
        self._background_failures = 0
        #: Exactly-once: the coordinator missed a gate; offsets go in the background until it answers.
        self._gate_bypassed = False

    # -- called on the engine thread ----------------------------------------------------------

    def commit_blocking(self, offsets: Mapping[TopicPartition, int]) -> None:
        with self._lock:
            self._next_background_commit.clear()  # these offsets supersede them
            in_flight = self._background_commit
        if in_flight is not None:
            with contextlib.suppress(Exception):
                in_flight.result(OFFSETS_CALL_TIMEOUT_S)
        asyncio.run_coroutine_threadsafe(self._commit(offsets), self._loop).result(OFFSETS_CALL_TIMEOUT_S)

    def commit_in_background(self, offsets: Mapping[TopicPartition, int]) -> None:
        with self._lock:
            if self._background_commit is not None and not self._background_commit.done():
                self._next_background_commit.update(offsets)
                return
            self._background_commit = asyncio.run_coroutine_threadsafe(self._commit_chain(dict(offsets)), self._loop)

    def confirm_membership(self, offsets: Mapping[TopicPartition, int]) -> None:
        """MembershipLost when the coordinator refuses the member; CoordinatorAway when it does
        not answer in time (then the following commits do not wait for it until one gets through)."""
        with self._lock:
            bypassed = self._gate_bypassed
            if not bypassed:
                self._next_background_commit.clear()  # these offsets supersede them
            in_flight = self._background_commit
        if bypassed:
            self.commit_in_background(offsets)
            raise CoordinatorAway("the coordinator is away; offsets follow in the background")
        if in_flight is not None:
            with contextlib.suppress(Exception):
                in_flight.result(GATE_TIMEOUT_S)
        future = asyncio.run_coroutine_threadsafe(self._commit(offsets), self._loop)
        try:
            future.result(GATE_TIMEOUT_S)
        except concurrent.futures.TimeoutError:
            future.cancel()
            self._gate_bypassed = True
            raise CoordinatorAway(f"no answer from the coordinator within {GATE_TIMEOUT_S:g} s") from None
        except MembershipLost:
            raise
        except CommitFailed:
            self._gate_bypassed = True
            raise

    def read_committed_blocking(self, partitions: Sequence[TopicPartition]) -> Mapping[TopicPartition, int]:
        return asyncio.run_coroutine_threadsafe(self._read_committed(partitions), self._loop).result(OFFSETS_CALL_TIMEOUT_S)

    # -- on the loop ---------------------------------------------------------------------------

    async def _commit_chain(self, offsets: dict[TopicPartition, int]) -> None:
        while True:
            try:
                await self._commit(offsets)
                if self._background_failures:
                    log.info("%s: offsets committed again after %d failed attempt(s)", self._name, self._background_failures)
                self._background_failures = 0
                self._gate_bypassed = False
            except Exception as error:
                # The offsets stay uncommitted for now: the next periodic commit carries newer ones.
                self._background_failures += 1
                if self._background_failures in (1, 10) or self._background_failures % 100 == 0:
                    log.warning("%s: committing offsets failed (%s); processing goes on and the next commit retries", self._name, error)
            with self._lock:
                if not self._next_background_commit:
                    return
                offsets, self._next_background_commit = self._next_background_commit, {}

    async def _commit(self, offsets: Mapping[TopicPartition, int]) -> None:
        keyed: dict[tuple[uuid.UUID | str, int], int] = {(tp.topic, tp.partition): offset for tp, offset in offsets.items()}
        for _ in range(_STALE_EPOCH_RETRIES):
            result = await self._driver.commit_offsets(keyed)
            if result.ok:
                return
            if _MEMBERSHIP_ERRORS & set(result.failed.values()):
                raise MembershipLost(f"the coordinator refused the member's offsets: {result.failed}")
            if not result.retry_after_heartbeat:
                raise CommitFailed(f"commit refused: {result.failed}")
            # Brings the current epoch (or, in a classic group, the end of its rebalance).
            await self._driver.next_heartbeat()
        raise CommitFailed("commit kept failing with STALE_MEMBER_EPOCH or REBALANCE_IN_PROGRESS")

    async def _read_committed(self, partitions: Sequence[TopicPartition]) -> dict[TopicPartition, int]:
        keys = [(tp.topic, tp.partition) for tp in partitions]
        for attempt in range(_STALE_EPOCH_RETRIES):
            result = await self._driver.fetch_offsets(keys)
            if result.ok:
                # Asked by topic name, answered by topic name.
                return {TopicPartition(str(topic), partition): offset for (topic, partition), offset in result.offsets.items() if offset >= 0}
            log.info("%s: offset fetch failed (%s); retrying", self._name, result.errors)
            await asyncio.sleep(0.1 * (attempt + 1))
        raise RuntimeError(f"{self._name}: cannot read committed offsets: {result.errors}")
