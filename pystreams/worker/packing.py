"""Packed repartition records: only our engine reads repartition topics, so their record format
is ours. A sink into a repartition topic buffers ``(key bytes, value bytes, timestamp)`` per
target partition, and the engine sends each buffer as ONE Kafka record (at the end of every
poll batch, and before any commit) whose value is a MessagePack array of those entries.
Format 1 has those three fields; a buffer holding a record with headers is packed as format
2, whose entries add the headers, ``[[name, bytes], ...]`` (so records keep their headers
through a repartition, as in Kafka Streams).
kafka-python's per-record ``send`` is the worker's throughput ceiling, so fewer, larger records
is what makes repartitioning cheap.

The source side unpacks a packed record and processes its entries in order, all with the
packed record's offset: a commit covers a packed record whole or not at all (at-least-once).

Partitions are chosen exactly as kafka-python's default partitioner does (murmur2 of the key
bytes modulo the partition count; a random partition for a null key), so keys land where
unpacked records would.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import msgspec

from pystreams.topology.kernels import partition_for_key

#: Header marking a packed record; its value is the format version.
PACKED_HEADER = "pystreams.packed"
PACKED_FORMAT_VERSION = b"1"
PACKED_HEADERS = [(PACKED_HEADER, PACKED_FORMAT_VERSION)]
#: Entries with their records' headers.
PACKED_WITH_HEADERS_VERSION = b"2"
PACKED_WITH_HEADERS = [(PACKED_HEADER, PACKED_WITH_HEADERS_VERSION)]
#: Upper bound of one packed record's value; below kafka-python's max_request_size (1 MiB)
#: and the broker's default message.max.bytes.
MAX_PACKED_BYTES = 512 * 1024
#: Key bytes → partition memo per topic (murmur2 is pure Python); cleared when this big.
PARTITION_CACHE_SIZE = 100_000

RecordHeaders = Sequence[tuple[str, bytes]]
#: (key, value, timestamp), or with the record's headers as a fourth field.
PackedEntry = tuple[bytes | None, bytes | None, int] | tuple[bytes | None, bytes | None, int, RecordHeaders]
_encode_entries = msgspec.msgpack.Encoder().encode
_decode_entries = msgspec.msgpack.Decoder(list[tuple[bytes | None, bytes | None, int]]).decode
# A header's value may be null, as in Kafka.
_decode_entries_with_headers = msgspec.msgpack.Decoder(list[tuple[bytes | None, bytes | None, int, list[tuple[str, bytes | None]]]]).decode


#: Appends one record to a repartition topic's buffers: (key bytes, value bytes, timestamp,
#: headers).
RepartitionSink = Callable[[bytes | None, bytes | None, int, RecordHeaders], None]


class UnpackedRecord(NamedTuple):
    """One entry of a packed record, shaped like a kafka-python ``ConsumerRecord`` where the
    engine reads one (merging inputs by timestamp, reporting a failed record)."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes]] = ()


class PackedFormatError(ValueError):
    pass


def packed_version(headers: Iterable[tuple[str, bytes]] | None) -> bytes | None:
    """The packed-format version of a record with these headers (None: a plain record)."""
    if headers:
        for name, value in headers:
            if name == PACKED_HEADER:
                return value
    return None


def unpack(record: Any) -> list[PackedEntry]:
    """The entries of a packed record, in the order they were written."""
    version = packed_version(record.headers)
    if version == PACKED_FORMAT_VERSION:
        return _decode_entries(record.value)  # type: ignore[return-value]
    if version == PACKED_WITH_HEADERS_VERSION:
        return _decode_entries_with_headers(record.value)  # type: ignore[return-value]
    raise PackedFormatError(f"unsupported packed repartition format {version!r}")


def expand_packed(records: list[Any], packed_topics: frozenset[str] | Mapping[str, Any]) -> list[Any]:
    """``records`` with every packed record replaced by its entries (each with the packed
    record's offset); used where entries must be ordered individually, e.g. by timestamp."""
    if not any(r.topic in packed_topics and packed_version(r.headers) for r in records):
        return records
    expanded: list[Any] = []
    for record in records:
        if record.topic in packed_topics and packed_version(record.headers):
            topic, partition, offset = record.topic, record.partition, record.offset
            expanded.extend(
                UnpackedRecord(topic, partition, offset, entry[2], entry[0], entry[1], entry[3] if len(entry) == 4 else ()) for entry in unpack(record)
            )
        else:
            expanded.append(record)
    return expanded


class RepartitionBuffers:
    """Per (repartition topic, partition) buffers of records not yet sent."""

    def __init__(self, partition_counts: Mapping[str, int]) -> None:
        self._partition_counts = dict(partition_counts)
        #: topic → one entry list per partition (the sinks append to these lists directly).
        self._buffers: dict[str, list[list[PackedEntry]]] = {}

    @property
    def topics(self) -> frozenset[str]:
        return frozenset(self._partition_counts)

    def sink(self, topic: str) -> RepartitionSink:
        """The append function a sink into ``topic`` calls per record."""
        count = self._partition_counts[topic]
        buffers = self._buffers.get(topic)
        if buffers is None:
            buffers = self._buffers[topic] = [[] for _ in range(count)]
        appenders = [buffer.append for buffer in buffers]
        partition_of: dict[bytes, int] = {}
        cached_partition = partition_of.get
        random_partition = random.randrange

        def append(key: bytes | None, value: bytes | None, timestamp: int, headers: RecordHeaders) -> None:
            if key is None:
                partition = random_partition(count)
            else:
                partition = cached_partition(key)
                if partition is None:
                    if len(partition_of) >= PARTITION_CACHE_SIZE:
                        partition_of.clear()
                    partition = partition_of[key] = partition_for_key(key, count)
            appenders[partition]((key, value, timestamp, headers) if headers else (key, value, timestamp))

        return append

    def drain(self) -> Iterable[tuple[str, int, bytes, list[tuple[str, bytes]]]]:
        """(topic, partition, packed value, its record's headers) for every non-empty buffer,
        emptying it; a buffer bigger than ``MAX_PACKED_BYTES`` packed is split, keeping its
        order."""
        for topic, buffers in self._buffers.items():
            for partition, entries in enumerate(buffers):
                if entries:
                    if any(len(entry) == 4 for entry in entries):
                        with_headers: list[PackedEntry] = [entry if len(entry) == 4 else (*entry, ()) for entry in entries]
                        for value in _pack(with_headers):
                            yield topic, partition, value, PACKED_WITH_HEADERS
                    else:
                        for value in _pack(entries):
                            yield topic, partition, value, PACKED_HEADERS
                    entries.clear()  # in place: the sinks hold this list

    def clear(self) -> None:
        """Drop every buffered entry unsent (their transaction was aborted)."""
        for buffers in self._buffers.values():
            for entries in buffers:
                entries.clear()  # in place: the sinks hold these lists


def _pack(entries: list[PackedEntry]) -> list[bytes]:
    packed = _encode_entries(entries)
    if len(packed) <= MAX_PACKED_BYTES or len(entries) == 1:
        return [packed]
    middle = len(entries) // 2
    return _pack(entries[:middle]) + _pack(entries[middle:])
