"""The Kafka log's writer: one partition, one transaction per append, over the Kafka wire protocol.

kafka-python's transactional producer costs about 3 ms of Python per transaction (its sender
thread, accumulator and futures) and held a shard to some 130 appends a second. This writer sends
the four requests a transaction needs itself, on asyncio connections (``KafkaConnection``):

* **claim** — FindCoordinator (TRANSACTION key) and InitProducerId with the partition's
  transactional id. The broker bumps the id's epoch, which fences the previous writer and
  aborts the transaction it left open, as ``init_transactions()`` does;
* **append** — AddPartitionsToTxn, then Produce (record batches v2 of at most
  ``MAX_BATCH_BYTES``, transactional, ``acks=all``, sequence numbers continuing from the last
  append), then EndTxn(commit). The append returns once the commit is acknowledged.

Answers that say "try again" — the transaction coordinator moved or is loading, the previous
transaction is still completing (CONCURRENT_TRANSACTIONS), the partition's leader moved, a lost
connection — are retried, with a short doubling back-off, until the append's deadline; each of
those requests is safe to repeat (a repeated batch carries the same sequence numbers, so the
broker writes it once). PRODUCER_FENCED or INVALID_PRODUCER_EPOCH means another writer claimed
the partition: ``LogFencedError``, for good. Anything else fails the append with ``LogError``
after a best-effort abort, and the writer refuses further appends: the shard reloads with a new
claim, which starts a clean epoch.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence

import kafka.errors as Errors
from kafka.protocol.api_message import ApiMessage
from kafka.protocol.metadata.find_coordinator import CoordinatorType
from kafka.record.default_records import DefaultRecordBatchBuilder

from pystreams.protocol import messages as m
from pystreams.protocol.connection import Address, ConnectionLost, KafkaConnection
from pystreams.protocol.handshake import HandshakeError
from pystreams.protocol.security import ClientSecurity
from pystreams.protocol.sentinels import COORDINATOR_MOVED

log = logging.getLogger(__name__)

#: A record to write: key, value (None: a tombstone) and headers.
Entry = tuple[bytes, bytes | None, Sequence[tuple[str, bytes]]]

#: One record batch holds at most this much (Kafka's default message.max.bytes is 1 MiB).
MAX_BATCH_BYTES = 1_000_000
#: Retries back off from this, doubling, up to the maximum.
BACKOFF_S = (0.002, 0.1)
_SEQUENCE_LIMIT = 2**31

_NONE = Errors.NoError.errno
_FENCED = frozenset({Errors.ProducerFencedError.errno, Errors.InvalidProducerEpochError.errno})
#: Ask the same coordinator again shortly.
_COORDINATOR_BUSY = frozenset({Errors.CoordinatorLoadInProgressError.errno, Errors.ConcurrentTransactionsError.errno})
#: The partition's leader is elsewhere or not ready: look it up again.
_LEADER_MOVED = frozenset(
    {
        Errors.NotLeaderForPartitionError.errno,
        Errors.LeaderNotAvailableError.errno,
        Errors.UnknownTopicOrPartitionError.errno,
        Errors.NotEnoughReplicasError.errno,
        Errors.NotEnoughReplicasAfterAppendError.errno,
        Errors.RequestTimedOutError.errno,
        Errors.KafkaStorageError.errno,
    }
)
_TRANSPORT_ERRORS = (ConnectionLost, OSError, TimeoutError, HandshakeError)


class WriterError(Exception):
    """An append or claim failed; ``fenced`` when another writer claimed the partition."""

    def __init__(self, message: str, *, fenced: bool = False) -> None:
        super().__init__(message)
        self.fenced = fenced


class _Retry(Exception):
    """The answer says: try again (after forgetting the connection named by ``forget``)."""

    def __init__(self, reason: str, forget: str | None = None) -> None:
        super().__init__(reason)
        self.forget = forget


class TransactionalWriter:
    """Writes appends to ``topic``-``partition`` as ``transactional_id``; see the module docstring."""

    def __init__(
        self,
        bootstrap: Sequence[Address],
        topic: str,
        partition: int,
        transactional_id: str,
        *,
        client_id: str,
        security: ClientSecurity | None = None,
        timeout_s: float = 30.0,
        transaction_timeout_ms: int = 60_000,
    ) -> None:
        if not bootstrap:
            raise ValueError("at least one bootstrap address is needed")
        self.topic = topic
        self.partition = partition
        self.transactional_id = transactional_id
        self._bootstrap = list(bootstrap)
        self._client_id = client_id
        self._security = security or ClientSecurity()
        self._timeout_s = timeout_s
        self._transaction_timeout_ms = transaction_timeout_ms
        self._connections: dict[Address, KafkaConnection] = {}
        self._coordinator: Address | None = None
        self._leader: Address | None = None
        self._producer_id = -1
        self._epoch = -1
        self._sequence = 0
        self._lock = asyncio.Lock()
        self._failure: WriterError | None = None
        self._closed = False
        self.transactions = 0

    # ------------------------------------------------------------------ claim, append, close

    async def claim(self) -> None:
        """InitProducerId: this writer's epoch fences every earlier one."""
        async with self._lock:
            deadline = time.monotonic() + self._timeout_s
            response = await self._transaction_call(
                lambda: m.InitProducerIdRequest(
                    transactional_id=self.transactional_id,
                    transaction_timeout_ms=self._transaction_timeout_ms,
                    producer_id=-1,
                    producer_epoch=-1,
                ),
                lambda answer: answer.error_code,
                deadline,
            )
            self._producer_id, self._epoch, self._sequence = response.producer_id, response.producer_epoch, 0

    async def append(self, entries: Sequence[Entry]) -> None:
        """Write ``entries`` in one transaction; returns once it is committed."""
        async with self._lock:
            if self._closed:
                raise WriterError(f"the writer of {self.topic}-{self.partition} is closed")
            if self._failure is not None:
                raise WriterError(f"the writer of {self.topic}-{self.partition} failed earlier: {self._failure}", fenced=self._failure.fenced)
            if self._producer_id < 0:
                raise WriterError(f"the writer of {self.topic}-{self.partition} has not claimed it")
            deadline = time.monotonic() + self._timeout_s
            try:
                await self._transaction_call(self._add_partition, _add_partition_error, deadline)
                for batch, count in self._batches(entries):
                    await self._produce(batch, deadline)
                    self._sequence = (self._sequence + count) % _SEQUENCE_LIMIT
                await self._transaction_call(lambda: self._end(committed=True), lambda answer: answer.error_code, deadline)
                self.transactions += 1
            except WriterError as error:
                self._failure = error
                if not error.fenced:
                    await self._abort_quietly()
                raise
            except BaseException as error:  # cancelled mid-transaction: the next claim aborts it
                self._failure = WriterError(f"append interrupted: {error!r}")
                raise

    async def close(self) -> None:
        self._closed = True
        connections, self._connections = self._connections, {}
        for connection in connections.values():
            connection.close()
        for connection in connections.values():
            await connection.wait_closed()

    # ------------------------------------------------------------------ the requests

    def _add_partition(self) -> ApiMessage:
        Topic = m.AddPartitionsToTxnRequest.AddPartitionsToTxnTopic
        return m.AddPartitionsToTxnRequest(
            v3_and_below_transactional_id=self.transactional_id,
            v3_and_below_producer_id=self._producer_id,
            v3_and_below_producer_epoch=self._epoch,
            v3_and_below_topics=[Topic(name=self.topic, partitions=[self.partition])],
        )

    def _end(self, committed: bool) -> ApiMessage:
        return m.EndTxnRequest(transactional_id=self.transactional_id, producer_id=self._producer_id, producer_epoch=self._epoch, committed=committed)

    def _batches(self, entries: Sequence[Entry]) -> list[tuple[bytes, int]]:
        """Record batches of at most MAX_BATCH_BYTES (a single larger record gets one of its
        own), with their record counts; sequences continue from the last append."""
        batches: list[tuple[bytes, int]] = []
        timestamp = int(time.time() * 1000)
        sequence = self._sequence
        builder: DefaultRecordBatchBuilder | None = None
        count = 0
        for key, value, headers in entries:
            if builder is not None and builder.append(count, timestamp, key, value, list(headers)) is not None:
                count += 1
                continue
            if builder is not None:
                batches.append((bytes(builder.build()), count))
                sequence = (sequence + count) % _SEQUENCE_LIMIT
            builder = DefaultRecordBatchBuilder(2, 0, True, self._producer_id, self._epoch, sequence, MAX_BATCH_BYTES)
            builder.append(0, timestamp, key, value, list(headers))
            count = 1
        if builder is not None:
            batches.append((bytes(builder.build()), count))
        return batches

    async def _produce(self, batch: bytes, deadline: float) -> None:
        Topic = m.ProduceRequest.TopicProduceData
        request = m.ProduceRequest(
            transactional_id=self.transactional_id,
            acks=-1,
            timeout_ms=max(1, int((deadline - time.monotonic()) * 1000)),
            topic_data=[Topic(name=self.topic, partition_data=[Topic.PartitionProduceData(index=self.partition, records=batch)])],
        )

        async def attempt() -> None:
            connection = await self._leader_connection(deadline)
            response = await self._send(connection, request, deadline)
            code = _produce_error(response, self.topic, self.partition)
            if code in (_NONE, Errors.DuplicateSequenceNumberError.errno):  # a repeat: written once
                return
            if code in _FENCED:
                raise WriterError(f"{self.topic}-{self.partition}: another writer claimed it ({_name(code)})", fenced=True)
            if code in _LEADER_MOVED:
                raise _Retry(_name(code), forget="leader")
            raise WriterError(f"{self.topic}-{self.partition}: Produce failed with {_name(code)}")

        await self._retrying(attempt, deadline, "Produce")

    async def _transaction_call(self, build: Callable[[], ApiMessage], error_of: Callable[[ApiMessage], int], deadline: float) -> ApiMessage:
        """A request to the transaction coordinator, retried while the answer says so."""
        request = build()
        answer: list[ApiMessage] = []

        async def attempt() -> None:
            connection = await self._coordinator_connection(deadline)
            response = await self._send(connection, request, deadline)
            code = error_of(response)
            if code == _NONE:
                answer.append(response)
                return
            if code in _FENCED:
                raise WriterError(f"{self.transactional_id}: another writer claimed it ({_name(code)})", fenced=True)
            if code in COORDINATOR_MOVED:  # the transaction coordinator is elsewhere now
                raise _Retry(_name(code), forget="coordinator")
            if code in _COORDINATOR_BUSY:
                raise _Retry(_name(code))
            raise WriterError(f"{self.transactional_id}: {type(request).__name__} failed with {_name(code)}")

        await self._retrying(attempt, deadline, type(request).__name__)
        return answer[0]

    async def _retrying(self, attempt: Callable[[], Awaitable[None]], deadline: float, what: str) -> None:
        delay, ceiling = BACKOFF_S
        while True:
            try:
                await attempt()
                return
            except _Retry as retry:
                reason = str(retry)
                if retry.forget == "leader":
                    self._leader = None
                elif retry.forget == "coordinator":
                    self._coordinator = None
            except _TRANSPORT_ERRORS as error:
                reason = repr(error)
                self._coordinator = self._leader = None  # look both up again
            if time.monotonic() + delay >= deadline:
                raise WriterError(f"{self.transactional_id}: {what} still failing at its deadline ({reason})")
            log.debug("%s: %s: %s; again in %.0f ms", self.transactional_id, what, reason, delay * 1000)
            await asyncio.sleep(delay)
            delay = min(delay * 2, ceiling)

    async def _abort_quietly(self) -> None:
        with contextlib.suppress(Exception):
            deadline = time.monotonic() + min(self._timeout_s, 5.0)
            await self._transaction_call(lambda: self._end(committed=False), lambda answer: answer.error_code, deadline)

    # ------------------------------------------------------------------ connections

    async def _send(self, connection: KafkaConnection, request: ApiMessage, deadline: float) -> ApiMessage:
        assert connection.server is not None
        version = connection.server.version_for(request.API_KEY)
        if version is None:
            raise WriterError(f"{connection.address[0]}:{connection.address[1]} does not speak {type(request).__name__} at a version pystreams does")
        return await connection.send(request, version, max(0.001, deadline - time.monotonic()))

    async def _connect(self, address: Address, deadline: float) -> KafkaConnection:
        connection = self._connections.get(address)
        if connection is not None and not connection.closed:
            return connection
        connection = await KafkaConnection.open(address, self._client_id, max(0.001, deadline - time.monotonic()), self._security)
        self._connections[address] = connection
        return connection

    async def _any_broker(self, deadline: float) -> KafkaConnection:
        """A connection to some broker: one already open, else the bootstrap addresses in turn."""
        for connection in self._connections.values():
            if not connection.closed:
                return connection
        failures = []
        for address in self._bootstrap:
            try:
                return await self._connect(address, deadline)
            except _TRANSPORT_ERRORS as error:
                failures.append(f"{address[0]}:{address[1]}: {error!r}")
        raise ConnectionLost("no bootstrap broker answered: " + "; ".join(failures))

    async def _coordinator_connection(self, deadline: float) -> KafkaConnection:
        if self._coordinator is None:
            broker = await self._any_broker(deadline)
            response = await self._send(
                broker, m.FindCoordinatorRequest(key_type=CoordinatorType.TRANSACTION, coordinator_keys=[self.transactional_id]), deadline
            )
            [entry] = response.coordinators
            if entry.error_code != _NONE:
                raise _Retry(f"FindCoordinator: {_name(entry.error_code)}", forget="coordinator")
            self._coordinator = (entry.host, entry.port)
        return await self._connect(self._coordinator, deadline)

    async def _leader_connection(self, deadline: float) -> KafkaConnection:
        if self._leader is None:
            broker = await self._any_broker(deadline)
            response = await self._send(
                broker, m.MetadataRequest(topics=[m.MetadataRequest.MetadataRequestTopic(name=self.topic)], allow_auto_topic_creation=False), deadline
            )
            self._leader = _leader_of(response, self.topic, self.partition)
        return await self._connect(self._leader, deadline)


def _add_partition_error(response: ApiMessage) -> int:
    """AddPartitionsToTxn answers per partition (and, from v4, at the top)."""
    top = getattr(response, "error_code", _NONE) or _NONE
    if top != _NONE:
        return top
    for topic in response.results_by_topic_v3_and_below:
        for result in topic.results_by_partition:
            if result.partition_error_code != _NONE:
                return int(result.partition_error_code)
    return _NONE


def _produce_error(response: ApiMessage, topic: str, partition: int) -> int:
    for topic_response in response.responses:
        for partition_response in topic_response.partition_responses:
            if topic_response.name == topic and partition_response.index == partition:
                return int(partition_response.error_code)
    return Errors.UnknownServerError.errno  # no answer for the partition it was sent


def _leader_of(response: ApiMessage, topic: str, partition: int) -> Address:
    brokers = {broker.node_id: (broker.host, broker.port) for broker in response.brokers}
    for topic_metadata in response.topics:
        if topic_metadata.name != topic:
            continue
        if topic_metadata.error_code != _NONE:
            raise _Retry(f"Metadata for {topic}: {_name(topic_metadata.error_code)}", forget="leader")
        for partition_metadata in topic_metadata.partitions:
            if partition_metadata.partition_index == partition:
                leader = brokers.get(partition_metadata.leader_id)
                if partition_metadata.error_code not in (_NONE, Errors.ReplicaNotAvailableError.errno) or leader is None:
                    raise _Retry(f"{topic}-{partition} has no leader now ({_name(partition_metadata.error_code)})", forget="leader")
                return leader
    raise _Retry(f"no metadata for {topic}-{partition}", forget="leader")


def _name(code: int) -> str:
    return Errors.for_code(code).__name__
