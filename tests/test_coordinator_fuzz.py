"""A wire fuzzer against a live coordinator process.

Requests are generated from the served APIs' JSON schemas (every field null, empty, huge,
negative, at its bounds, or ordinary; versions just outside the served range), then sometimes
mangled on the wire (truncated, bytes flipped, sizes that lie, oversized frames, unknown API
keys). They are sent in batches, each on fresh connections, to a real ``pystreams coordinator``
process whose records live on the embedded broker. Meanwhile a well-behaved member of another
group keeps heartbeating. After every batch: the coordinator still answers, the member keeps
its epoch and assignment, and the process's memory stays bounded. At the end the coordinator
is killed and restarted, and it must load every shard (nothing unreplayable was appended) and
still know the member.

CI runs a few thousand requests; ``PYSTREAMS_FUZZ_EXAMPLES`` (the ``slow`` run) asks for more.
"""

from __future__ import annotations

import os
import random
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.protocol.api_header import RequestHeader
from kafka.protocol.schemas.fields.codecs import types as codec_types
from worker_support import listening, wait_for

from pystreams.broker import free_port
from pystreams.protocol import messages as m
from pystreams.protocol.client import KafkaProtocolClient
from pystreams.protocol.registry import SUPPORTED_APIS

pytestmark = pytest.mark.integration

BATCH = 50
EXAMPLES = int(os.environ.get("PYSTREAMS_FUZZ_EXAMPLES", "40"))  # x BATCH requests: 2,000 by default
MEMORY_GROWTH_LIMIT = 300 * 1024 * 1024
HUGE = 40_000  # longer than any string field may be (32767 bytes)
GOOD_GROUP = "well-behaved"


# --- a coordinator process -------------------------------------------------------------------------


@dataclass
class Running:
    process: subprocess.Popen[bytes]
    port: int

    def rss_bytes(self) -> int:
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")


def start_coordinator(bootstrap: str, log_topic: str, port: int, log_path: Path) -> Running:
    log = log_path.open("ab")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pystreams",
            "coordinator",
            "--bootstrap-servers",
            bootstrap,
            "--log",
            "kafka",
            "--log-topic",
            log_topic,
            "--shards",
            "2",
            "--listen",
            f"127.0.0.1:{port}",
            "--session-timeout-ms",
            "60000",
            "--heartbeat-interval-ms",
            "5000",
            "--request-read-timeout-ms",
            "2000",
            "--socket-request-max-bytes",
            str(4 * 1024 * 1024),
            "--queued-max-request-bytes",
            str(16 * 1024 * 1024),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    running = Running(process, port)
    wait_for(lambda: listening(port), 30, "the coordinator to listen")
    wait_for(lambda: "coordinator ready" in log_path.read_text(errors="replace").split("coordinator: ")[-1], 60, "every shard to load")
    return running


@pytest.fixture(scope="module")
def coordinator(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Running, str, Path]]:
    log_path = tmp_path_factory.mktemp("fuzz") / "coordinator.log"
    log_topic = f"__pystreams_groups_fuzz_{random.randrange(1 << 30)}"
    running = start_coordinator(kafka_bootstrap, log_topic, free_port(), log_path)
    try:
        yield running, log_topic, log_path
    finally:
        running.process.kill()
        running.process.wait(10)


# --- the well-behaved member -------------------------------------------------------------------------


class GoodMember:
    """A member of another group that heartbeats every second from a thread, noting anything odd."""

    def __init__(self, port: int) -> None:
        self.port = port
        with self.client() as client:
            response = client.send(
                m.ConsumerGroupHeartbeatRequest(
                    group_id=GOOD_GROUP,
                    member_id="",
                    member_epoch=0,
                    rebalance_timeout_ms=30_000,
                    subscribed_topic_names=["fuzz-topic"],
                    server_assignor="uniform",
                    topic_partitions=[],
                )
            )
        assert response.error_code == 0, response
        self.member_id, self.epoch = response.member_id, response.member_epoch
        self.problems: list[object] = []
        self.beats = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True)

    def client(self) -> KafkaProtocolClient:
        return KafkaProtocolClient("127.0.0.1", self.port, timeout_s=10).connect()

    def heartbeat(self) -> m.ConsumerGroupHeartbeatResponse:
        with self.client() as client:
            return client.send(m.ConsumerGroupHeartbeatRequest(group_id=GOOD_GROUP, member_id=self.member_id, member_epoch=self.epoch, rebalance_timeout_ms=-1))

    def _beat(self) -> None:
        while not self._stop.wait(1.0):
            try:
                response = self.heartbeat()
            except Exception as error:  # the coordinator did not answer
                self.problems.append(error)
                continue
            self.beats += 1
            if response.error_code or response.member_epoch != self.epoch or response.assignment is not None:
                self.problems.append(response)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(15)


# --- generating requests from the schemas --------------------------------------------------------


_INT_BOUNDS = {codec_types.Int8: 7, codec_types.Int16: 15, codec_types.Int32: 31, codec_types.Int64: 63}


def _value(draw, field, version: int, depth: int):
    kind = getattr(field, "_type", None)
    if field.is_struct_array() or field.is_array():
        choice = draw(st.sampled_from(["null", "empty", "some", "many"]))
        if choice == "null":
            return None
        if choice == "empty":
            return []
        element = field.array_of
        draw_one = (lambda: _struct(draw, element, version, depth + 1)) if field.is_struct_array() else (lambda: _value(draw, element, version, depth + 1))
        if choice == "some" or depth > 0:
            return [draw_one() for _ in range(draw(st.integers(1, 3)))]
        # Many entries: a few drawn ones, repeated (drawing hundreds each time makes Hypothesis
        # spend minutes generating; the coordinator sees the same sizes and duplicates).
        drawn = [draw_one() for _ in range(draw(st.integers(1, 3)))]
        return drawn * (draw(st.integers(50, 300)) // len(drawn))
    if field.is_struct():
        return None if draw(st.booleans()) and depth else _struct(draw, field, version, depth + 1)
    if kind in _INT_BOUNDS:
        bits = _INT_BOUNDS[kind]
        return draw(st.sampled_from([0, -1, -2, 1, 2**bits - 1, -(2**bits)]) | st.integers(-(2**bits), 2**bits - 1))
    if kind is codec_types.Boolean:
        return draw(st.booleans())
    if kind is codec_types.UUID:
        return draw(st.sampled_from([None, "00000000-0000-0000-0000-000000000001"]) | st.uuids())
    if kind is codec_types.Float64:
        return draw(st.floats(allow_nan=True))
    huge = depth == 0  # huge values only where there is one of them, not in every element of a list
    if kind is codec_types.Bytes:
        return draw(st.sampled_from([None, b"", b"\xff" * (HUGE if huge else 300)]) | st.binary(max_size=64))
    if isinstance(kind, codec_types.String):
        return draw(st.sampled_from([None, "", "x" * (HUGE if huge else 300), "__consumer_offsets", ".*", "(a+)+b", "\n\x1b[2J"]) | st.text(max_size=20))
    return None


def _fields(draw, struct, version: int, depth: int) -> dict:
    return {f.name: _value(draw, f, version, depth) for f in struct.fields.values() if f.for_version_q(version)}


def _struct(draw, struct, version: int, depth: int):
    return struct.data_class(**_fields(draw, struct, version, depth))


@st.composite
def fuzzed_frame(draw) -> bytes:
    spec = draw(st.sampled_from(sorted(SUPPORTED_APIS.values(), key=lambda s: s.api_key)))
    version = draw(st.integers(spec.min_version, spec.max_version) | st.sampled_from([spec.min_version - 1, spec.max_version + 1, 32767]))
    encode_at = min(max(version, spec.min_version), spec.max_version)
    try:
        body = bytes(spec.request_class(**_fields(draw, spec.request_class._struct, encode_at, 0)).encode(version=encode_at))
    except Exception:
        body = draw(st.binary(max_size=200))  # the encoder refused these values: send bytes instead
    header = RequestHeader(
        request_api_key=spec.api_key,
        request_api_version=version,
        correlation_id=draw(st.integers(0, 2**31 - 1)),
        client_id=draw(st.sampled_from(["fuzz", "", "x" * 300])),
    )
    payload = bytes(header.encode(flexible=spec.request_header_version(encode_at) == 2)) + body
    mangling = draw(st.sampled_from(["none", "none", "truncate", "flip", "garbage-tail", "unknown-api", "lying-size", "oversized"]))
    if mangling == "truncate" and payload:
        payload = payload[: draw(st.integers(0, len(payload) - 1))]
    elif mangling == "flip" and payload:
        index = draw(st.integers(0, len(payload) - 1))
        payload = payload[:index] + bytes([payload[index] ^ draw(st.integers(1, 255))]) + payload[index + 1 :]
    elif mangling == "garbage-tail":
        payload += draw(st.binary(min_size=1, max_size=100))
    elif mangling == "unknown-api":
        payload = struct.pack(">h", draw(st.sampled_from([999, 67, 1002, -1, 32767]))) + payload[2:]
    elif mangling == "lying-size":
        return struct.pack(">i", len(payload) + draw(st.integers(1, 1000))) + payload  # never completes: the read deadline
    elif mangling == "oversized":
        return struct.pack(">i", 64 * 1024 * 1024) + payload[:100]
    return struct.pack(">i", len(payload)) + payload


def send_raw(port: int, frame: bytes) -> None:
    """Send one frame on a fresh connection and read whatever comes back (briefly)."""
    (declared,) = struct.unpack_from(">i", frame)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.settimeout(0.2)
        try:
            sock.sendall(frame)
            if declared <= len(frame) - 4:  # a frame that says it is longer never gets an answer
                sock.recv(65536)
        except OSError:
            pass  # closed on us, or nothing to say within the wait: both are fine answers


# --- the test -----------------------------------------------------------------------------------------


def test_hostile_requests_never_harm_the_coordinator_or_a_group(coordinator: tuple[Running, str, Path], kafka_bootstrap: str) -> None:
    running, log_topic, log_path = coordinator
    member = GoodMember(running.port)
    member.start()
    baseline = running.rss_bytes()
    batches = {"count": 0}

    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(st.lists(fuzzed_frame(), min_size=BATCH, max_size=BATCH))
    def batch(frames: list[bytes]) -> None:
        started = time.monotonic()
        for frame in frames:
            send_raw(running.port, frame)
        batches["count"] += 1
        batches["seconds"] = batches.get("seconds", 0) + time.monotonic() - started
        assert running.process.poll() is None, "the coordinator died:\n" + log_path.read_text(errors="replace")[-3000:]
        assert not member.problems, f"the well-behaved member saw: {member.problems[:3]}"
        assert running.rss_bytes() - baseline < MEMORY_GROWTH_LIMIT

    try:
        batch()
    finally:
        member.stop()
    assert member.beats > 0
    assert batches["count"] > 0
    served = log_path.read_text(errors="replace").split("coordinator ready")[-1]
    assert "Traceback" not in served, served[served.index("Traceback") - 2000 :][:6000]  # no handler failed, nothing crashed

    running.process.kill()
    running.process.wait(10)
    restarted = start_coordinator(kafka_bootstrap, log_topic, running.port, log_path)  # waits for every shard
    try:
        assert "quarantined" not in log_path.read_text(errors="replace").split("coordinator ready")[-1]
        response = member.heartbeat()
        assert response.error_code == 0 and response.member_epoch == member.epoch
    finally:
        restarted.process.kill()
        restarted.process.wait(10)
