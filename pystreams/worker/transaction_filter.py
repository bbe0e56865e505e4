"""The fetch-side transaction filter (sans-IO): what ``read_committed`` must mean, decided from
the records and transaction markers of one partition, in offset order.

Apache Kafka tells a ``read_committed`` consumer which transactions were aborted (the
aborted-transactions list of a Fetch response); the embedded broker does not, and hands their
records over like committed ones. Both brokers write the COMMIT/ABORT *control records*
(markers), though, so the outcome of every transaction is in the partition itself. This filter
holds a transactional producer's records until its marker arrives, then releases them (COMMIT)
or drops them (ABORT). Records are released strictly in offset order: a non-transactional
record behind a held one waits too, so the offset after the last released record is always a
consistent resume position (everything before it was released or dropped, nothing after it was).

On Apache Kafka, with ``read_committed``, the filter is redundant but correct: records past the
last stable offset never arrive, and a committed transaction's records wait at most until its
marker is fetched.

A reader that keeps only the latest record per key (the input positions) must not wait for
transactions that are not its key's business: one writer that died with a transaction open
would hide every later committed record of the partition, and the reader would take an old
record for the latest. ``TransactionFilter(in_offset_order=False)`` releases each transaction's
records as soon as its own marker arrives, and records outside transactions at once; the
reader orders them by offset itself (and must, since an older transaction may commit later).

    filter = TransactionFilter()
    filter.add_batch(producer_id, records)      # -1: not transactional
    filter.add_marker(producer_id, committed=True)
    released = filter.take_released()

Work is per batch (a list append or extend), never per record.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

#: The producer id of records that belong to no transaction.
NO_TRANSACTION = -1

_OPEN, _COMMITTED, _ABORTED = 0, 1, 2
#: Released or dropped already (out of offset order); only its place in the queue is left.
_SETTLED = 3


class _Segment:
    """Consecutive records of one producer's open transaction (or released-behind records)."""

    __slots__ = ("producer_id", "records", "state")

    def __init__(self, producer_id: int, records: list[Any], state: int) -> None:
        self.producer_id = producer_id
        self.records = records
        self.state = state


class TransactionFilter:
    """The filter of one partition, fed in offset order from where its reader started.
    ``in_offset_order=False``: release each transaction when it ends (see the module docstring)."""

    def __init__(self, *, in_offset_order: bool = True) -> None:
        self._in_offset_order = in_offset_order
        self._queue: deque[_Segment] = deque()
        self._open: dict[int, list[_Segment]] = {}
        self._released: list[Any] = []
        self._held = 0
        #: Records of aborted transactions dropped so far.
        self.aborted_records = 0

    # -- input --------------------------------------------------------------------------------

    def add_batch(self, producer_id: int, records: list[Any]) -> None:
        """Records of one batch: ``producer_id`` of a transactional batch, else NO_TRANSACTION."""
        if not records:
            return
        if producer_id == NO_TRANSACTION:
            if self._queue and self._in_offset_order:
                self._queue.append(_Segment(producer_id, records, _COMMITTED))
                self._held += len(records)
            else:
                self._released.extend(records)
            return
        queue = self._queue
        segments = self._open.get(producer_id)
        if segments is not None and queue and queue[-1] is segments[-1]:
            segments[-1].records.extend(records)  # the same transaction, still last in line
        else:
            segment = _Segment(producer_id, list(records), _OPEN)
            queue.append(segment)
            self._open.setdefault(producer_id, []).append(segment)
        self._held += len(records)

    def add_marker(self, producer_id: int, *, committed: bool) -> None:
        """A COMMIT or ABORT control record of ``producer_id``: its open transaction ends. A marker
        with nothing held (its records came before this reader's start) changes nothing."""
        segments = self._open.pop(producer_id, None)
        if segments is None:
            return
        state = _COMMITTED if committed else _ABORTED
        for segment in segments:
            segment.state = state
            if not self._in_offset_order:
                self._settle(segment)
        self._release_resolved()

    def _release_resolved(self) -> None:
        queue = self._queue
        while queue and queue[0].state != _OPEN:
            segment = queue.popleft()
            if segment.state != _SETTLED:
                self._settle(segment)

    def _settle(self, segment: _Segment) -> None:
        """Release (committed) or drop (aborted) a resolved segment's records."""
        self._held -= len(segment.records)
        if segment.state == _COMMITTED:
            self._released.extend(segment.records)
        else:
            self.aborted_records += len(segment.records)
        segment.records = []
        segment.state = _SETTLED

    # -- output -------------------------------------------------------------------------------

    def take_released(self) -> list[Any]:
        """Records released since the last call: in offset order, unless the filter releases
        each transaction when it ends (then in the order the transactions ended)."""
        released, self._released = self._released, []
        return released

    @property
    def held(self) -> int:
        """Records waiting for a marker (theirs, or an earlier record's)."""
        return self._held

    @property
    def open_producers(self) -> frozenset[int]:
        """Producers with a transaction this filter has seen records of but no marker yet."""
        return frozenset(self._open)

    def pending(self) -> list[tuple[int, Sequence[Any]]]:
        """(producer id, records) of every transaction still open, oldest first: what a reader
        that must know about unresolved writes (the position log) looks at."""
        return [(s.producer_id, s.records) for s in self._queue if s.state == _OPEN]
