"""Hostile input at the protocol edge: what a stranger with a socket can send the coordinator.

Decoding is linear and bounded (no quadratic copies, no unbounded varints), a decoded request is
checked against its schema before any handler sees it, and the server bounds what a connection
can hold: frame deadlines, connection limits, a byte budget for large frames. Nothing here
asserts on speed; cost is pinned by memory (tracemalloc) and by what the server refuses.
"""

from __future__ import annotations

import asyncio
import struct
import subprocess
import sys
import tracemalloc

import kafka.errors as Errors
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.protocol.api_header import RequestHeader
from kafka.protocol.api_message import ApiMessage
from kafka.protocol.schemas.fields.codecs import UnsignedVarInt32

from pystreams.protocol import codec, framing
from pystreams.protocol import messages as m
from pystreams.protocol.server import ServerLimits, _ByteBudget
from pystreams.protocol.validation import MAX_STRING_BYTES
from tests.aio import within
from tests.test_protocol_server import Client, answer_heartbeats, async_test, heartbeat, serving, wait_until

Install = m.ConsumerGroupInstallAssignmentRequest


def request_bytes(request: ApiMessage, version: int) -> bytes:
    """A request frame body (header + body) exactly as a client would write it."""
    header = RequestHeader(request_api_key=request.API_KEY, request_api_version=version, correlation_id=7, client_id="probe")
    flexible = bool(type(request).flexible_version_q(version))
    return bytes(header.encode(flexible=flexible)) + bytes(request.encode(version=version))


def compact_string(text: str | None) -> bytes:
    if text is None:
        return b"\x00"
    raw = text.encode()
    return UnsignedVarInt32.encode(len(raw) + 1) + raw


def heartbeat_with_null_topic() -> bytes:
    """A first ConsumerGroupHeartbeat whose SubscribedTopicNames is [null]: it decodes."""
    request = m.ConsumerGroupHeartbeatRequest(
        group_id="g",
        member_id="",
        member_epoch=0,
        rebalance_timeout_ms=30_000,
        subscribed_topic_names=["t"],
    )
    frame = request_bytes(request, 0)
    marker = b"\x02" + compact_string("t")  # a one-element compact array holding "t"
    assert frame.count(marker) == 1
    return frame.replace(marker, b"\x02" + compact_string(None))


# --- schema checks at the edge ----------------------------------------------------------------------


def test_a_null_in_a_non_nullable_array_element_is_an_invalid_field_naming_it():
    with pytest.raises(codec.InvalidFieldError, match=r"SubscribedTopicNames\[0\] must not be null"):
        codec.decode_request(heartbeat_with_null_topic())


def test_list_groups_with_a_null_state_filter_is_refused_before_any_handler():
    frame = request_bytes(m.ListGroupsRequest(states_filter=["Stable"], types_filter=[]), 4)
    frame = frame.replace(b"\x02" + compact_string("Stable"), b"\x02" + compact_string(None))
    with pytest.raises(codec.InvalidFieldError, match=r"StatesFilter\[0\]"):
        codec.decode_request(frame)


def test_an_offset_commit_with_a_null_topic_name_is_refused():
    topic = m.OffsetCommitRequest.OffsetCommitRequestTopic(name="orders", partitions=[])
    frame = request_bytes(m.OffsetCommitRequest(group_id="g", generation_id_or_member_epoch=-1, member_id="", topics=[topic]), 9)
    frame = frame.replace(compact_string("orders"), compact_string(None))
    with pytest.raises(codec.InvalidFieldError, match=r"Topics\[0\]\.Name must not be null"):
        codec.decode_request(frame)


def test_strings_longer_than_kafkas_limit_are_refused_and_the_limit_itself_is_served():
    at_limit = request_bytes(m.ListGroupsRequest(states_filter=["s" * MAX_STRING_BYTES], types_filter=[]), 5)
    assert codec.decode_request(at_limit).request.states_filter == ["s" * MAX_STRING_BYTES]
    over = request_bytes(m.ListGroupsRequest(states_filter=["é" * (MAX_STRING_BYTES // 2 + 1)], types_filter=[]), 5)
    with pytest.raises(codec.InvalidFieldError, match="longer than 32767 bytes"):
        codec.decode_request(over)


def test_nullable_fields_may_be_null():
    request = m.ConsumerGroupHeartbeatRequest(group_id="g", member_id="m", member_epoch=3, rebalance_timeout_ms=-1)
    decoded = codec.decode_request(request_bytes(request, 0)).request
    assert decoded.subscribed_topic_names is None and decoded.instance_id is None


def test_a_string_running_past_the_end_of_the_frame_is_malformed_not_silently_cut():
    frame = request_bytes(m.FindCoordinatorRequest(key="orders-app", key_type=0), 0)  # v0: the key ends the body
    cut = frame[: frame.index(b"orders-app") + 3]  # the length says 10 bytes, 3 arrive
    with pytest.raises(codec.MalformedRequestError, match="truncated"):
        codec.decode_request(cut)


def test_a_varint_longer_than_five_bytes_is_malformed():
    header = RequestHeader(request_api_key=m.ConsumerGroupHeartbeatRequest.API_KEY, request_api_version=0, correlation_id=1, client_id="x")
    frame = bytes(header.encode(flexible=True)) + b"\x80" * 6 + b"\x01"
    with pytest.raises(codec.MalformedRequestError, match="longer than 5 bytes"):
        codec.decode_request(frame)


_KAFKA_DECODING_UNTOUCHED = """
from kafka.protocol.schemas.fields.codecs import types
from kafka.protocol.schemas.fields.struct import StructField
before = (types.UnsignedVarInt32.__dict__["emit_decode_from"], StructField.__dict__["_emit_tagged_decode"])

import pystreams
from pystreams.protocol import codec, framing
from pystreams.protocol import messages as m

frame = bytes.fromhex(FRAME)
assert len(codec.decode_request(frame).request.members) == 3
after = (types.UnsignedVarInt32.__dict__["emit_decode_from"], StructField.__dict__["_emit_tagged_decode"])
assert all(a is b for a, b in zip(before, after)), "pystreams changed kafka-python's decoder generators"
decoders = [key for key in m.ConsumerGroupInstallAssignmentRequest._struct._compiled_encoders if key[0] == "decode"]
assert decoders == [], f"pystreams' decoders landed in kafka-python's own cache: {decoders}"
print("untouched")
"""


def test_importing_pystreams_leaves_kafka_pythons_decoders_as_they_are():
    """pystreams guards its own decoding only: the user's kafka-python clients in the same
    process keep kafka-python's generators, cache and behaviour. A fresh interpreter, as the
    test session has imported pystreams already."""
    script = _KAFKA_DECODING_UNTOUCHED.replace("FRAME", repr(install_with_tagged_members(3).hex()))
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "untouched"


def test_a_response_with_a_varint_longer_than_five_bytes_is_refused_by_the_client_framing():
    """The guard covers what pystreams' own client side decodes too (responses it frames)."""
    framer = framing.ClientFraming("probe")
    correlation_id, _ = framer.request_bytes(m.ConsumerGroupHeartbeatRequest(group_id="g", member_epoch=0), 0)
    # Response header v1 (correlation id, no tags); body: throttle, error code, then the error
    # message's length as a 7-byte varint.
    frame = struct.pack(">ib", correlation_id, 0) + struct.pack(">ih", 0, 0) + b"\x80" * 6 + b"\x01"
    with pytest.raises(framing.FramingError, match="longer than 5 bytes"):
        framer.receive(struct.pack(">i", len(frame)) + frame)


def install_with_tagged_members(count: int) -> bytes:
    """An InstallAssignment of ``count`` members, each carrying one unknown tagged field."""
    one = Install.Member(member_id="m", partitions=[], metadata_version=0, metadata_bytes=b"")
    request = Install(group_id="g", member_id="x", member_epoch=1, group_epoch=1, error=0, members=[one])
    frame = request_bytes(request, 0)
    member = compact_string("m") + b"\x01" + b"\x00\x00" + b"\x01" + b"\x00"  # no partitions, v0, empty bytes, no tags
    start = frame.index(b"\x02" + member)  # one-element array
    tagged = member[:-1] + b"\x01\x63\x00"  # one unknown tag (99) of size 0
    return frame[:start] + UnsignedVarInt32.encode(count + 1) + tagged * count + frame[start + 1 + len(member) :]


def test_tagged_fields_decode_without_copying_the_rest_of_the_frame():
    frame = install_with_tagged_members(20_000)
    tracemalloc.start()
    try:
        decoded = codec.decode_request(frame).request
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(decoded.members) == 20_000
    assert decoded.members[-1].unknown_tags == {"_99": b""}
    # Copying the rest of the frame once per member would peak near len(frame) per member alive
    # at once and total ~len(frame)**2 / 2 bytes; the decoded objects alone take ~1 KB a member.
    assert peak < 2_000 * 20_000


# --- the server's bounds ---------------------------------------------------------------------------


@async_test
async def test_an_invalid_request_is_answered_with_invalid_request_and_the_connection_goes_on():
    async with serving(answer_heartbeats) as server:
        client = await Client.connect(server)
        await client.send_raw(struct.pack(">i", len(heartbeat_with_null_topic())) + heartbeat_with_null_topic())
        size = struct.unpack(">i", await client.reader.readexactly(4))[0]
        body = await client.reader.readexactly(size)
        response = m.ConsumerGroupHeartbeatResponse.decode(body[4 + 1 :], version=0)  # correlation id, tag byte
        assert response.error_code == Errors.InvalidRequestError.errno
        assert "SubscribedTopicNames[0] must not be null" in response.error_message
        assert (await client.call(heartbeat())).error_code == 0
        assert server.refusals["invalid_request"] == 1
        await client.close()


@async_test
async def test_a_frame_that_never_finishes_arriving_is_dropped_after_the_read_deadline():
    async with serving(answer_heartbeats, limits=ServerLimits(request_read_timeout_ms=200)) as server:
        slow = await Client.connect(server)
        await slow.send_raw(struct.pack(">i", 100) + b"\x00" * 10)  # 10 of 100 bytes, then silence
        assert await slow.closed_by_server()
        assert server.refusals["request_read_timeout"] == 1
        also_slow = await Client.connect(server)
        await also_slow.send_raw(b"\x00\x00")  # half a size prefix
        assert await also_slow.closed_by_server()
        assert server.refusals["request_read_timeout"] == 2
        fresh = await Client.connect(server)
        assert (await fresh.call(heartbeat())).error_code == 0
        await fresh.close()


@async_test
async def test_connections_over_the_per_ip_and_total_limits_are_refused_and_others_served():
    async with serving(answer_heartbeats, limits=ServerLimits(max_connections=6, max_connections_per_ip=3)) as server:
        held = [await Client.connect(server) for _ in range(3)]
        await wait_until(lambda: server.connection_count == 3)
        refused = await Client.connect(server)
        assert await refused.closed_by_server()
        assert server.refusals["max_connections_per_ip"] == 1
        assert (await held[0].call(heartbeat())).error_code == 0  # the ones inside keep working
        await held[1].close()
        await wait_until(lambda: server.connection_count == 2)
        again = await Client.connect(server)
        assert (await again.call(heartbeat())).error_code == 0
        for client in (held[0], held[2], again):
            await client.close()


@async_test
async def test_a_connection_flood_is_bounded_and_the_server_keeps_serving():
    async with serving(answer_heartbeats, limits=ServerLimits(max_connections=20, max_connections_per_ip=1000)) as server:
        flood = []
        for _ in range(60):
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            flood.append(writer)
        await wait_until(lambda: server.refusals["max_connections"] == 40)
        assert server.connection_count == 20
        for writer in flood[:5]:
            writer.close()
        await wait_until(lambda: server.connection_count == 15)
        client = await Client.connect(server)
        assert (await client.call(heartbeat())).error_code == 0
        await client.close()
        for writer in flood[5:]:
            writer.close()


@async_test
async def test_large_frames_are_decoded_off_the_event_loop_and_answered():
    seen_members = []

    async def handler(header, request):
        seen_members.append(len(request.members))
        return m.ConsumerGroupInstallAssignmentResponse(error_code=0)

    frame = install_with_tagged_members(5_000)
    async with serving(handler, limits=ServerLimits(decode_in_thread_bytes=1024)) as server:
        client = await Client.connect(server)
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        ticker = asyncio.create_task(tick())
        await client.send_raw(struct.pack(">i", len(frame)) + frame)
        size = struct.unpack(">i", await client.reader.readexactly(4))[0]
        await client.reader.readexactly(size)
        ticker.cancel()
        assert seen_members == [5_000]
        assert server._decoder is not None  # the worker thread decoded it
        assert ticks > 1  # the loop ran other work while the frame was being decoded
        await client.close()


@async_test
async def test_the_byte_budget_makes_large_frames_wait_in_order_and_never_overcommits():
    budget = _ByteBudget(100)
    await budget.acquire(60)
    second = asyncio.create_task(budget.acquire(50))
    third = asyncio.create_task(budget.acquire(10))
    await asyncio.sleep(0)
    assert not second.done() and not third.done()  # FIFO: the small one does not jump the queue
    budget.release(60)
    await within(asyncio.gather(second, third), 1)
    assert budget.used == 60
    cancelled = asyncio.create_task(budget.acquire(50))
    await asyncio.sleep(0)
    cancelled.cancel()
    await asyncio.gather(cancelled, return_exceptions=True)
    budget.release(50)
    budget.release(10)
    assert budget.used == 0


def test_limits_refuse_a_budget_smaller_than_the_largest_frame():
    with pytest.raises(ValueError, match="largest frame"):
        ServerLimits(max_request_bytes=10_000, queued_max_request_bytes=100)


# --- OffsetCommit and pystreams' GroupEpoch tag -----------------------------------------------------
# GroupEpoch (tag 9100) rides on the OffsetCommit *answer*, which pystreams' client decodes; the
# request is Kafka's own, which the server decodes. A peer can cut either short or fill the tagged
# section with garbage: the reader refuses it with its decode error (FramingError on the client,
# MalformedRequestError on the server), never another exception and never a quietly short field.

GROUP_EPOCH_TAG = UnsignedVarInt32.encode(9100)


def offset_commit_request() -> m.OffsetCommitRequest:
    topic = m.OffsetCommitRequest.OffsetCommitRequestTopic
    partition = topic.OffsetCommitRequestPartition
    return m.OffsetCommitRequest(
        group_id="g", generation_id_or_member_epoch=3, member_id="A", topics=[topic(name="foo", partitions=[partition(partition_index=0, committed_offset=5)])]
    )


def offset_commit_with_tags(tagged: bytes) -> bytes:
    """An OffsetCommit v9 request frame whose top-level tagged section is ``tagged``."""
    frame = request_bytes(offset_commit_request(), 9)
    assert frame.endswith(b"\x00")  # no tags of its own
    return frame[:-1] + tagged


#: A client echoing the answer's GroupEpoch tag on its request: a tag the request does not know.
REQUEST_WITH_GROUP_EPOCH_TAG = offset_commit_with_tags(b"\x01" + GROUP_EPOCH_TAG + b"\x04" + struct.pack(">i", 7))


def test_an_unknown_tag_on_an_offset_commit_is_kept_aside_and_every_truncation_of_it_is_malformed():
    decoded = codec.decode_request(REQUEST_WITH_GROUP_EPOCH_TAG).request
    assert decoded.generation_id_or_member_epoch == 3 and decoded.unknown_tags == {"_9100": struct.pack(">i", 7)}
    for cut in range(len(REQUEST_WITH_GROUP_EPOCH_TAG)):
        with pytest.raises(codec.MalformedRequestError):
            codec.decode_request(REQUEST_WITH_GROUP_EPOCH_TAG[:cut])


@pytest.mark.parametrize(
    "tagged",
    [
        b"\x01" + GROUP_EPOCH_TAG + UnsignedVarInt32.encode(2**31 - 1) + struct.pack(">i", 7),  # a size far past the frame
        b"\x01" + GROUP_EPOCH_TAG + b"\x08" + struct.pack(">i", 7),  # 8 bytes said, 4 sent
        b"\x02" + GROUP_EPOCH_TAG + b"\x04" + struct.pack(">i", 7),  # two tags said, one sent
        UnsignedVarInt32.encode(2**31 - 1) + GROUP_EPOCH_TAG + b"\x04" + struct.pack(">i", 7),  # a count far past the frame
        b"\x01" + b"\x80" * 6 + b"\x01" + b"\x04" + struct.pack(">i", 7),  # a tag number longer than a varint32
    ],
    ids=["size-past-frame", "size-short", "count-short", "count-past-frame", "tag-varint-too-long"],
)
def test_an_offset_commit_whose_tagged_section_overruns_the_frame_is_malformed(tagged):
    with pytest.raises(codec.MalformedRequestError):
        codec.decode_request(offset_commit_with_tags(tagged))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=24))
def test_garbage_in_an_offset_commits_tagged_section_decodes_or_is_malformed(tagged):
    try:
        decoded = codec.decode_request(offset_commit_with_tags(tagged)).request
    except codec.MalformedRequestError:
        return
    # Whatever the tags held, the fields before them are the ones sent.
    assert (decoded.group_id, decoded.member_id, decoded.generation_id_or_member_epoch) == ("g", "A", 3)


def offset_commit_answer_frame(correlation_id: int, body: bytes) -> bytes:
    """An OffsetCommit v9 answer as the server frames it: response header v1 (no tags), body."""
    payload = struct.pack(">ib", correlation_id, 0) + body
    return struct.pack(">i", len(payload)) + payload


def receive_offset_commit_answer(body: bytes):
    framer = framing.ClientFraming("probe")
    correlation_id, _ = framer.request_bytes(offset_commit_request(), 9)
    return framer.receive(offset_commit_answer_frame(correlation_id, body))


ANSWER_WITH_GROUP_EPOCH = bytes(m.OffsetCommitResponse(version=9, throttle_time_ms=0, topics=[], group_epoch=7).encode(version=9))


def test_every_truncation_of_an_offset_commit_answer_carrying_the_group_epoch_is_a_framing_error():
    [(_, answer)] = receive_offset_commit_answer(ANSWER_WITH_GROUP_EPOCH)
    assert answer.group_epoch == 7
    assert ANSWER_WITH_GROUP_EPOCH.endswith(GROUP_EPOCH_TAG + b"\x04" + struct.pack(">i", 7))  # the tag is what gets cut
    for cut in range(len(ANSWER_WITH_GROUP_EPOCH)):
        with pytest.raises(framing.FramingError, match="OffsetCommit"):
            receive_offset_commit_answer(ANSWER_WITH_GROUP_EPOCH[:cut])


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=24))
def test_garbage_in_an_offset_commit_answers_tagged_section_decodes_or_is_a_framing_error(tagged):
    untagged = bytes(m.OffsetCommitResponse(version=9, throttle_time_ms=0, topics=[]).encode(version=9))
    try:
        [(_, answer)] = receive_offset_commit_answer(untagged[:-1] + tagged)
    except framing.FramingError:
        return
    assert isinstance(answer.group_epoch, int) and -(2**31) <= answer.group_epoch < 2**31


@async_test
async def test_a_truncated_offset_commit_closes_only_its_connection():
    seen: list[object] = []

    async def handler(header, request):
        seen.append(request)
        return m.OffsetCommitResponse(topics=[]) if isinstance(request, m.OffsetCommitRequest) else m.HeartbeatResponse(error_code=0)

    cut = REQUEST_WITH_GROUP_EPOCH_TAG[:-2]  # the tag says 4 bytes, 2 arrive
    async with serving(handler) as server:
        bystander = await Client.connect(server)
        client = await Client.connect(server)
        await client.send_raw(struct.pack(">i", len(cut)) + cut)
        assert await client.closed_by_server()
        assert server.refusals["malformed_request"] == 1
        assert seen == []  # no handler saw it
        assert (await bystander.call(heartbeat())).error_code == 0
        await bystander.close()
