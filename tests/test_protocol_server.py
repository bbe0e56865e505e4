"""The Kafka-protocol TCP server, over real sockets on 127.0.0.1, with kafka-python as the client.

No assertion depends on how fast anything runs: waits are guarded by a generous timeout only so
that a broken server fails the test instead of hanging it.
"""

from __future__ import annotations

import asyncio
import functools
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import kafka.errors as Errors
import pytest
from kafka.admin import KafkaAdminClient
from kafka.protocol.api_header import RequestHeader
from kafka.protocol.api_message import ApiMessage
from kafka.protocol.parser import KafkaProtocol
from kafka.structs import OffsetAndMetadata, TopicPartition

from pystreams.protocol import messages as m
from pystreams.protocol.registry import advertised_versions
from pystreams.protocol.server import KafkaProtocolServer, ServerLimits, _buffered, current_peer
from tests.aio import run_within, within

GUARD_S = 10.0  # only a safety net against hangs


def async_test(test: Callable[..., Awaitable[None]]) -> Callable[..., None]:
    @functools.wraps(test)
    def run(*args: object, **kwargs: object) -> None:
        run_within(test(*args, **kwargs), GUARD_S * 3)

    return run


async def no_handler(header: RequestHeader, request: ApiMessage) -> ApiMessage:
    raise AssertionError(f"unexpected {type(request).__name__}")


@asynccontextmanager
async def serving(handler=no_handler, **options: object) -> AsyncIterator[KafkaProtocolServer]:
    server = KafkaProtocolServer("127.0.0.1", 0, handler, **options)
    async with server:
        yield server


class Client:
    """A connection that frames and parses exactly as kafka-python's client does."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, client_id: str) -> None:
        self.reader, self.writer = reader, writer
        self.protocol = KafkaProtocol(client_id=client_id)

    @classmethod
    async def connect(cls, server: KafkaProtocolServer, client_id: str = "test-client") -> Client:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        return cls(reader, writer, client_id)

    async def send(self, *requests: ApiMessage) -> None:
        for request in requests:
            self.protocol.send_request(request)
        self.writer.write(self.protocol.send_bytes())
        await self.writer.drain()

    async def receive(self) -> tuple[int, ApiMessage]:
        size_bytes = await within(self.reader.readexactly(4), GUARD_S)
        body = await within(self.reader.readexactly(struct.unpack(">i", size_bytes)[0]), GUARD_S)
        [answer] = self.protocol.receive_bytes(size_bytes + body)
        return answer

    async def call(self, request: ApiMessage) -> ApiMessage:
        await self.send(request)
        _, response = await self.receive()
        return response

    async def send_raw(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def closed_by_server(self) -> bool:
        try:
            return await within(self.reader.read(1), GUARD_S) == b""
        except ConnectionResetError:
            return True

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except ConnectionError:
            pass


def raw_frame(api_key: int, api_version: int, body: bytes = b"", correlation_id: int = 1) -> bytes:
    header = struct.pack(">hhih", api_key, api_version, correlation_id, 4) + b"test"
    payload = header + body
    return struct.pack(">i", len(payload)) + payload


def heartbeat(member_id: str = "m") -> ApiMessage:
    return m.HeartbeatRequest(version=4, group_id="g", generation_id=1, member_id=member_id)


async def answer_heartbeats(header: RequestHeader, request: ApiMessage) -> ApiMessage:
    return m.HeartbeatResponse(error_code=0)


async def wait_until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(GUARD_S):
        while not condition():
            await asyncio.sleep(0.01)


# --- ApiVersions ---------------------------------------------------------------------------------


@async_test
async def test_api_versions_lists_every_served_api():
    async with serving() as server:
        client = await Client.connect(server)
        response = await client.call(
            m.ApiVersionsRequest(
                version=3,
                client_software_name="kafka-python",
                client_software_version="3.0.12",
            )
        )
        assert response.error_code == 0
        advertised = {(k.api_key, k.min_version, k.max_version) for k in response.api_keys}
        assert advertised == set(advertised_versions())
        assert {68, 69, 1000, 1001} <= {key for key, _, _ in advertised}
        assert (m.OffsetCommitRequest.API_KEY, 2, 10) in advertised
        await client.close()


@async_test
async def test_unsupported_api_versions_version_gets_unsupported_version_and_the_connection_stays():
    async with serving() as server:
        client = await Client.connect(server)
        response = await client.call(
            m.ApiVersionsRequest(
                version=4,
                client_software_name="kafka-python",
                client_software_version="3.0.12",
            )
        )
        assert response.error_code == Errors.UnsupportedVersionError.errno
        assert response.version == 0
        assert [(k.api_key, k.min_version, k.max_version) for k in response.api_keys] == [(18, 0, 3)]

        # The client retries at the version it was told, on the same connection, as Kafka clients do.
        retried = await client.call(m.ApiVersionsRequest(version=3, client_software_name="x", client_software_version="1"))
        assert retried.error_code == 0
        await client.close()


@async_test
async def test_api_versions_with_an_invalid_software_name_is_an_invalid_request():
    async with serving() as server:
        client = await Client.connect(server)
        response = await client.call(
            m.ApiVersionsRequest(
                version=3,
                client_software_name="-bad name-",
                client_software_version="1.0",
            )
        )
        assert response.error_code == Errors.InvalidRequestError.errno
        await client.close()


# --- requests the server cannot serve ------------------------------------------------------------


@pytest.mark.parametrize("api_key", [1, 999, -1])  # Fetch (real, not served), unknown, negative
@async_test
async def test_unknown_api_key_closes_the_connection(api_key):
    async with serving(answer_heartbeats) as server:
        client = await Client.connect(server)
        await client.send_raw(raw_frame(api_key, 0, b"\x00" * 8))
        assert await client.closed_by_server()

        other = await Client.connect(server)
        assert (await other.call(heartbeat())).error_code == 0
        await other.close()


@pytest.mark.parametrize(
    "api_key, version",
    [
        (m.ListGroupsRequest.API_KEY, 6),
        (m.OffsetCommitRequest.API_KEY, 1),
        (m.ConsumerGroupHeartbeatRequest.API_KEY, 1),
    ],
)
@async_test
async def test_unsupported_version_of_other_apis_closes_the_connection(api_key, version):
    async with serving(answer_heartbeats) as server:
        client = await Client.connect(server)
        await client.send_raw(raw_frame(api_key, version, b"\x00" * 32))
        assert await client.closed_by_server()

        other = await Client.connect(server)
        assert (await other.call(heartbeat())).error_code == 0
        await other.close()


@pytest.mark.parametrize(
    "frame",
    [
        struct.pack(">i", 12) + bytes(range(200, 212)),  # garbage from the first byte
        raw_frame(m.ListGroupsRequest.API_KEY, 5, b"\x05\x7f\x7f\x7f"),  # valid header, garbage body
        raw_frame(m.HeartbeatRequest.API_KEY, 4, b""),  # valid header, no body
        struct.pack(">i", 3) + b"\x00\x10\x00",  # shorter than any header
        struct.pack(">i", 0),  # empty frame
    ],
    ids=["garbage", "garbage-body", "no-body", "short", "empty"],
)
@async_test
async def test_malformed_frames_close_only_that_connection(frame):
    async with serving(answer_heartbeats) as server:
        bystander = await Client.connect(server)
        client = await Client.connect(server)
        await client.send_raw(frame)
        assert await client.closed_by_server()

        assert (await bystander.call(heartbeat())).error_code == 0
        fresh = await Client.connect(server)
        assert (await fresh.call(heartbeat())).error_code == 0
        await wait_until(lambda: server.connection_count == 2)
        await bystander.close()
        await fresh.close()


@pytest.mark.parametrize("size", [1025, 2**31 - 1, -5])
@async_test
async def test_oversized_or_negative_frames_close_the_connection(size):
    async with serving(answer_heartbeats, limits=ServerLimits(max_request_bytes=1024)) as server:
        client = await Client.connect(server)
        await client.send_raw(struct.pack(">i", size))  # the body is never sent, nor read
        assert await client.closed_by_server()

        fresh = await Client.connect(server)
        assert (await fresh.call(heartbeat())).error_code == 0
        await fresh.close()


@async_test
async def test_a_frame_of_exactly_the_maximum_size_is_served():
    async with serving(answer_heartbeats, limits=ServerLimits(max_request_bytes=1024)) as server:
        client = await Client.connect(server)
        request = heartbeat()
        client.protocol.send_request(request)
        frame = client.protocol.send_bytes()
        padded = frame + b"\x00" * (1024 + 4 - len(frame))  # trailing bytes are ignored, as in Kafka
        await client.send_raw(struct.pack(">i", 1024) + padded[4:])
        _, response = await client.receive()
        assert response.error_code == 0
        await client.close()


@async_test
async def test_a_request_larger_than_the_stream_buffer_is_read_whole():
    async def handler(header: RequestHeader, request: ApiMessage) -> ApiMessage:
        topic_class = m.OffsetCommitResponse.OffsetCommitResponseTopic
        return m.OffsetCommitResponse(
            topics=[
                topic_class(
                    name=t.name, partitions=[topic_class.OffsetCommitResponsePartition(partition_index=p.partition_index, error_code=0) for p in t.partitions]
                )
                for t in request.topics
            ]
        )

    topic_class = m.OffsetCommitRequest.OffsetCommitRequestTopic
    partition_class = topic_class.OffsetCommitRequestPartition
    request = m.OffsetCommitRequest(
        version=9,
        group_id="g",
        member_id="m",
        topics=[
            topic_class(name="t", partitions=[partition_class(partition_index=i, committed_offset=i, committed_metadata="x" * 200) for i in range(10_000)]),
        ],
    )
    async with serving(handler) as server:
        client = await Client.connect(server)
        response = await client.call(request)  # about 2 MiB, far above asyncio's 64 KiB buffer limit
        assert [p.partition_index for p in response.topics[0].partitions] == list(range(10_000))
        await client.close()


# --- the handler ---------------------------------------------------------------------------------


@async_test
async def test_a_slow_handler_does_not_stall_other_connections():
    release = asyncio.Event()
    slow_entered = asyncio.Event()

    async def handler(header: RequestHeader, request: ApiMessage) -> ApiMessage:
        if header.client_id == "slow":
            slow_entered.set()
            await release.wait()
        return m.HeartbeatResponse(error_code=0)

    async with serving(handler) as server:
        slow = await Client.connect(server, client_id="slow")
        fast = await Client.connect(server, client_id="fast")
        slow_call = asyncio.create_task(slow.call(heartbeat()))
        await within(slow_entered.wait(), GUARD_S)

        assert (await fast.call(heartbeat())).error_code == 0
        assert not slow_call.done()

        release.set()
        assert (await slow_call).error_code == 0
        await slow.close()
        await fast.close()


@async_test
async def test_requests_on_one_connection_are_handled_one_at_a_time_in_order():
    events: list[str] = []
    release_first = asyncio.Event()

    async def handler(header: RequestHeader, request: ApiMessage) -> ApiMessage:
        events.append(f"start {request.member_id}")
        if request.member_id == "first":
            await release_first.wait()
        events.append(f"end {request.member_id}")
        return m.HeartbeatResponse(error_code=0)

    async with serving(handler) as server:
        client = await Client.connect(server)
        await client.send(heartbeat("first"), heartbeat("second"), heartbeat("third"))  # pipelined
        await wait_until(lambda: events == ["start first"])
        await asyncio.sleep(0.05)  # room for a server that wrongly runs "second" concurrently
        release_first.set()

        correlation_ids = [(await client.receive())[0] for _ in range(3)]
        assert correlation_ids == sorted(correlation_ids)
        assert events == ["start first", "end first", "start second", "end second", "start third", "end third"]
        await client.close()


@pytest.mark.parametrize(
    "failure, expected_code",
    [
        (RuntimeError("boom"), Errors.UnknownError.errno),
        (Errors.RebalanceInProgressError("rebalancing"), Errors.RebalanceInProgressError.errno),
        (None, Errors.UnknownError.errno),  # the handler returns the wrong response type
    ],
)
@async_test
async def test_handler_failures_become_error_responses_and_the_connection_goes_on(failure, expected_code):
    async def handler(header: RequestHeader, request: ApiMessage) -> ApiMessage:
        if request.member_id == "fail":
            if failure is None:
                return m.ListGroupsResponse(error_code=0, groups=[])
            raise failure
        return m.HeartbeatResponse(error_code=0)

    async with serving(handler) as server:
        client = await Client.connect(server)
        assert (await client.call(heartbeat("fail"))).error_code == expected_code
        assert (await client.call(heartbeat("ok"))).error_code == 0
        await client.close()


@async_test
async def test_handler_errors_keep_the_shape_of_the_api():
    async def handler(header: RequestHeader, request: ApiMessage) -> ApiMessage:
        raise Errors.CoordinatorLoadInProgressError("loading")

    async with serving(handler) as server:
        client = await Client.connect(server)
        response = await client.call(m.ConsumerGroupDescribeRequest(version=0, group_ids=["a", "b"]))
        assert [(g.group_id, g.error_code, g.error_message) for g in response.groups] == [
            ("a", Errors.CoordinatorLoadInProgressError.errno, "loading"),
            ("b", Errors.CoordinatorLoadInProgressError.errno, "loading"),
        ]
        await client.close()


@async_test
async def test_the_handler_sees_the_header_and_the_peer_address():
    seen: list[tuple[RequestHeader, tuple[str, int] | None]] = []

    async def handler(header: RequestHeader, request: ApiMessage) -> ApiMessage:
        seen.append((header, current_peer()))
        return m.ConsumerGroupHeartbeatResponse(error_code=0, member_id="abc", member_epoch=1, heartbeat_interval_ms=5000)

    async with serving(handler) as server:
        client = await Client.connect(server, client_id="worker-1")
        response = await client.call(
            m.ConsumerGroupHeartbeatRequest(
                version=0,
                group_id="g",
                member_id="",
                member_epoch=0,
                subscribed_topic_names=["t"],
            )
        )
        assert (response.member_id, response.member_epoch) == ("abc", 1)
        [(header, peer)] = seen
        assert header.client_id == "worker-1"
        assert header.request_api_key == m.ConsumerGroupHeartbeatRequest.API_KEY
        assert peer == client.writer.get_extra_info("sockname")[:2]
        await client.close()


# --- Metadata and FindCoordinator ----------------------------------------------------------------


@async_test
async def test_metadata_presents_this_server_as_the_only_broker():
    async with serving(node_id=7, advertised_host="coordinator.local", advertised_port=19092, cluster_id="c1") as server:
        client = await Client.connect(server)
        response = await client.call(
            m.MetadataRequest(
                version=12,
                topics=[
                    m.MetadataRequest.MetadataRequestTopic(name="orders"),
                ],
            )
        )
        assert [(b.node_id, b.host, b.port) for b in response.brokers] == [(7, "coordinator.local", 19092)]
        assert (response.controller_id, response.cluster_id) == (7, "c1")
        assert [(t.name, t.error_code) for t in response.topics] == [
            ("orders", Errors.UnknownTopicOrPartitionError.errno),
        ]
        all_topics = await client.call(m.MetadataRequest(version=1, topics=None))
        assert all_topics.topics == []
        await client.close()


@async_test
async def test_find_coordinator_answers_with_this_server_for_groups_only():
    async with serving(node_id=3) as server:
        client = await Client.connect(server)
        single = await client.call(m.FindCoordinatorRequest(version=3, key="g", key_type=0))
        assert (single.error_code, single.node_id, single.host, single.port) == (0, 3, "127.0.0.1", server.port)

        batch = await client.call(m.FindCoordinatorRequest(version=4, key_type=0, coordinator_keys=["a", "b"]))
        assert [(c.key, c.error_code, c.node_id, c.port) for c in batch.coordinators] == [
            ("a", 0, 3, server.port),
            ("b", 0, 3, server.port),
        ]

        transactional = await client.call(m.FindCoordinatorRequest(version=3, key="tx", key_type=1))
        assert transactional.error_code == Errors.CoordinatorNotAvailableError.errno
        await client.close()


@async_test
async def test_find_coordinator_does_not_name_this_server_for_a_group_it_no_longer_serves():
    """A group whose shard another coordinator took over is COORDINATOR_NOT_AVAILABLE here, with
    the reason, so a client moves on to the next address it has instead of being sent back."""
    lost = {"b": "shard 1 was taken over by another coordinator"}
    async with serving(node_id=3, locate_group=lambda group: lost.get(group) or server.address) as server:
        client = await Client.connect(server)
        batch = await client.call(m.FindCoordinatorRequest(version=4, key_type=0, coordinator_keys=["a", "b"]))
        assert [(c.key, c.error_code, c.node_id, c.port, c.error_message) for c in batch.coordinators] == [
            ("a", 0, 3, server.port, None),
            ("b", Errors.CoordinatorNotAvailableError.errno, -1, -1, lost["b"]),
        ]
        single = await client.call(m.FindCoordinatorRequest(version=3, key="b", key_type=0))
        assert (single.error_code, single.error_message) == (Errors.CoordinatorNotAvailableError.errno, lost["b"])
        await client.close()


# --- standard tooling ----------------------------------------------------------------------------


@async_test
async def test_kafka_python_admin_client_lists_groups_and_reads_offsets():
    async def handler(header: RequestHeader, request: ApiMessage) -> ApiMessage:
        if isinstance(request, m.ListGroupsRequest):
            listed = m.ListGroupsResponse.ListedGroup
            return m.ListGroupsResponse(
                error_code=0,
                groups=[
                    listed(group_id="orders-app", protocol_type="consumer", group_state="Stable", group_type="consumer"),
                    listed(group_id="billing", protocol_type="consumer", group_state="Empty", group_type="classic"),
                ],
            )
        if isinstance(request, m.OffsetFetchRequest):
            group_class = m.OffsetFetchResponse.OffsetFetchResponseGroup
            topic_class = group_class.OffsetFetchResponseTopics
            partition_class = topic_class.OffsetFetchResponsePartitions
            return m.OffsetFetchResponse(
                groups=[
                    group_class(
                        group_id=group.group_id,
                        error_code=0,
                        topics=[
                            topic_class(
                                name="orders",
                                partitions=[
                                    partition_class(partition_index=0, committed_offset=42, committed_leader_epoch=-1, metadata="", error_code=0),
                                ],
                            ),
                        ],
                    )
                    for group in request.groups
                ]
            )
        raise Errors.InvalidRequestError(f"unexpected {type(request).__name__}")

    async with serving(handler) as server:

        def use_admin_client() -> tuple[list[dict], dict]:
            admin = KafkaAdminClient(
                bootstrap_servers=f"127.0.0.1:{server.port}",
                request_timeout_ms=5000,
                bootstrap_timeout_ms=5000,
                client_id="admin",
            )
            try:
                return admin.list_groups(), admin.list_group_offsets({"orders-app": None})
            finally:
                admin.close()

        # The admin client blocks, so it runs off the event loop that serves it.
        groups, offsets = await asyncio.to_thread(use_admin_client)

    assert sorted((g["group_id"], g["group_state"], g["group_type"]) for g in groups) == [
        ("billing", "Empty", "classic"),
        ("orders-app", "Stable", "consumer"),
    ]
    assert offsets == {"orders-app": {TopicPartition("orders", 0): OffsetAndMetadata(42, "", -1)}}


# --- lifecycle -----------------------------------------------------------------------------------


@async_test
async def test_close_drops_open_connections_and_cancels_requests_in_progress():
    entered = asyncio.Event()
    cancelled = asyncio.Event()

    async def handler(header: RequestHeader, request: ApiMessage) -> ApiMessage:
        entered.set()
        try:
            await asyncio.Event().wait()  # never answers on its own
        except asyncio.CancelledError:
            cancelled.set()
            raise
        raise AssertionError("unreachable")

    server = KafkaProtocolServer("127.0.0.1", 0, handler)
    await server.start()
    port = server.port
    idle = await Client.connect(server)
    busy = await Client.connect(server)
    await busy.send(heartbeat())
    await within(entered.wait(), GUARD_S)
    assert server.connection_count == 2

    await server.close()

    assert cancelled.is_set()
    assert server.connection_count == 0
    assert await idle.closed_by_server()
    assert await busy.closed_by_server()
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", port)


@async_test
async def test_idle_connections_are_closed():
    async with serving(answer_heartbeats, limits=ServerLimits(connections_max_idle_ms=100)) as server:
        client = await Client.connect(server)
        assert await client.closed_by_server()
        await wait_until(lambda: server.connection_count == 0)


@async_test
async def test_a_connection_that_keeps_asking_is_not_idle():
    """The idle limit counts from the last request, not from the connection's start."""
    async with serving(answer_heartbeats, limits=ServerLimits(connections_max_idle_ms=300)) as server:
        client = await Client.connect(server)
        for _ in range(8):  # 8 x 50 ms: more than the limit in all, never 300 ms without a request
            assert (await client.call(heartbeat())).error_code == 0
            await asyncio.sleep(0.05)
        assert server.connection_count == 1
        assert await client.closed_by_server()  # then silence: closed


def test_binding_a_wildcard_address_needs_an_advertised_host():
    with pytest.raises(ValueError):
        KafkaProtocolServer("0.0.0.0", 0, no_handler)
    assert KafkaProtocolServer("0.0.0.0", 0, no_handler, advertised_host="coordinator-0").cluster_id


# --- stopping ------------------------------------------------------------------------------------


@async_test
async def test_closing_with_connections_open_logs_no_error(caplog: pytest.LogCaptureFixture) -> None:
    # Operators grep for ERROR: a clean stop cancels open connections, which is no error (it
    # logged one CancelledError traceback per connection through asyncio's start_server).
    async with serving(answer_heartbeats) as server:
        clients = [await Client.connect(server) for _ in range(3)]
        assert (await clients[0].call(heartbeat())).error_code == 0
        await wait_until(lambda: len(server._connections) == 3)
    await asyncio.sleep(0.05)  # asyncio's done callbacks of the cancelled connections
    assert [await client.closed_by_server() for client in clients] == [True, True, True]
    assert [record.getMessage() for record in caplog.records if record.levelname == "ERROR"] == []


def test_the_server_sees_what_a_stream_reader_already_holds() -> None:
    """Reads of bytes already buffered skip the read timers; that needs StreamReader's buffer
    (private), so an asyncio that renamed it shows here rather than as a silent slowdown."""

    async def scenario() -> None:
        reader = asyncio.StreamReader()
        assert _buffered(reader) == 0
        reader.feed_data(b"\x00\x00\x00\x03abc")
        assert _buffered(reader) == 7
        assert await reader.readexactly(4) == b"\x00\x00\x00\x03"
        assert _buffered(reader) == 3

    asyncio.run(scenario())
