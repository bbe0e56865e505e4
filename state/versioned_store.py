"""A versioned key-value store (Kafka Streams' ``VersionedKeyValueStore``, KIP-889): every
value a key held within the store's history retention, each valid from its record's
timestamp until the next version's, so a lookup can ask for the value *as of* a time.

Rules (``put_version``, ``version_as_of``), as Kafka Streams' store has them:

* the store observes stream time (the newest timestamp put); a write older than stream time
  minus the history retention is not accepted (``NOT_PUT``): the history retention is also
  the store's grace period;
* a write at a timestamp a version already has replaces that version; a ``None`` value is a
  tombstone version (the key has no value from then on);
* ``get`` is the latest version's value; ``get_as_of(t)`` the value of the version with the
  largest timestamp not after ``t`` — None when ``t`` is older than the retention, unless the
  latest version is that old already;
* versions no as-of read within the retention can reach are dropped as the key is written.

Layout: one key-value store whose database key is ``b"\\x01" + key`` and whose value is the
key's history, MessagePack ``[[valid_from, value bytes | nil], ...]`` oldest first; the
observed stream time sits under ``b"\\x00"``. Both go through the cache and the compacted
changelog like any key-value entry, so restore and standbys need nothing of their own.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Iterable, Iterator
from typing import Any

import msgspec

from pystreams.serdes import UNDECODABLE

from .errors import StateError
from .key_value_store import KeyValueStore, _prefix_end, _successor

log = logging.getLogger(__name__)

_META = b"\x00"
_KEYS = b"\x01"
_KEYS_END = b"\x02"
#: A key's history is one value (and one changelog record): past this size, say so once. The
#: producer's request cap is 1 MiB.
LARGE_HISTORY_BYTES = 256 * 1024
_TIME = msgspec.msgpack.Encoder()
_decode_time = msgspec.msgpack.Decoder(int).decode

History = list[tuple[int, bytes | None]]
_encode_history = msgspec.msgpack.Encoder().encode
_decode_history = msgspec.msgpack.Decoder(list[tuple[int, bytes | None]]).decode


class VersionedPut(enum.StrEnum):
    """What ``put_version`` did with a write (a str, so runtimes compare without importing)."""

    LATEST = "latest"  # the key's newest version now: the table's current value changed
    HISTORY = "history"  # an older version (out of order): the current value is unchanged
    NOT_PUT = "not-put"  # older than the history retention allows: dropped


def put_version(history: History, timestamp: int, value: bytes | None, observed: int | None, history_ms: int) -> tuple[History, VersionedPut]:
    """``history`` with the version ``(timestamp, value)`` put, pruned to what the retention
    still needs, and what the put was; ``observed`` is the store's stream time before it."""
    if observed is not None and timestamp < observed - history_ms:
        return history, VersionedPut.NOT_PUT
    versions = [version for version in history if version[0] != timestamp]
    position = next((i for i, (valid_from, _) in enumerate(versions) if valid_from > timestamp), len(versions))
    versions.insert(position, (timestamp, value))
    outcome = VersionedPut.LATEST if position == len(versions) - 1 else VersionedPut.HISTORY
    oldest_needed = max(timestamp, observed if observed is not None else timestamp) - history_ms
    # A version is needed while the next one starts after the oldest time a read may ask for.
    first = 0
    while first + 1 < len(versions) and versions[first + 1][0] <= oldest_needed:
        first += 1
    versions = versions[first:]
    if len(versions) == 1 and versions[0][1] is None and versions[0][0] <= oldest_needed:
        versions = []  # only a tombstone no read can reach: the key is gone
    return versions, outcome


def version_as_of(history: History, timestamp: int, observed: int | None, history_ms: int) -> bytes | None:
    """The value valid at ``timestamp`` (None: no version, a tombstone, or beyond retention)."""
    if not history:
        return None
    latest_from, latest_value = history[-1]
    if latest_from <= timestamp:
        return latest_value
    if observed is not None and timestamp < observed - history_ms:
        return None
    found: bytes | None = None
    for valid_from, value in history:
        if valid_from > timestamp:
            break
        found = value
    return found


class VersionedHistories:
    """The versioned store's rows over any key-value rows (``_read_row``/``_write_row``, in
    the layout above): the worker's RocksDB store and the Spark runtime's share it."""

    name: str
    history_ms: int
    _warned_large: bool = False

    def _read_row(self, key: bytes) -> bytes | None:
        raise NotImplementedError

    def _write_row(self, key: bytes, value: bytes | None) -> None:
        raise NotImplementedError

    @property
    def observed_stream_time(self) -> int | None:
        stored = self._read_row(_META)
        return None if stored is None else _decode_time(stored)

    def history(self, key: bytes) -> History:
        stored = self._read_row(_KEYS + key)
        if stored is None:
            return []
        try:
            return _decode_history(stored)
        except UNDECODABLE as error:
            raise StateError(f"versioned store {self.name!r}: the history of key {key[:32]!r} is unreadable ({error})") from None

    def put_version(self, key: bytes, value: bytes | None, timestamp: int) -> VersionedPut:
        observed = self.observed_stream_time
        history, outcome = put_version(self.history(key), timestamp, value, observed, self.history_ms)
        if outcome is VersionedPut.NOT_PUT:
            return outcome
        encoded = _encode_history(history) if history else None
        if encoded is not None and len(encoded) > LARGE_HISTORY_BYTES and not self._warned_large:
            self._warned_large = True
            log.warning(
                "versioned store %s: key %r keeps %d versions (%d bytes, one value and changelog record); "
                "every write of it rewrites them all: a shorter history, or fewer updates per key, keeps it small",
                self.name,
                key[:32],
                len(history),
                len(encoded),
            )
        self._write_row(_KEYS + key, encoded)
        if observed is None or timestamp > observed:
            self._write_row(_META, _TIME.encode(timestamp))
        return outcome

    def get(self, key: bytes) -> bytes | None:
        history = self.history(key)
        return history[-1][1] if history else None

    def get_as_of(self, key: bytes, timestamp: int) -> bytes | None:
        return version_as_of(self.history(key), timestamp, self.observed_stream_time, self.history_ms)

    @staticmethod
    def _latest(entries: Iterable[tuple[bytes, bytes]]) -> Iterator[tuple[bytes, bytes]]:
        """Each key's latest value, for rows under ``_KEYS`` (a deleted key has none)."""
        for composite, stored in entries:
            value = _decode_history(stored)[-1][1]
            if value is not None:
                yield composite[1:], value


class VersionedStore(VersionedHistories, KeyValueStore):
    """A key-value store of histories: write with ``put_version``, read the latest with
    ``get`` (and ``range``/``prefix_scan``/``all``, which skip deleted keys) or a past value
    with ``get_as_of``."""

    def __init__(self, *args: Any, history_ms: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if history_ms < 0:
            raise ValueError("history_ms must not be negative")
        self.history_ms = history_ms
        self._warned_large = False
        self._write = self._cache.put
        self.put = self._refuse_plain_write

    def _read_row(self, key: bytes) -> bytes | None:
        return KeyValueStore.get(self, key)

    def _write_row(self, key: bytes, value: bytes | None) -> None:
        self._write(key, value)

    def range(self, key_from: bytes | None, key_to: bytes | None) -> Iterator[tuple[bytes, bytes]]:
        lower = _KEYS + key_from if key_from is not None else _KEYS
        upper = _successor(_KEYS + key_to) if key_to is not None else _KEYS_END
        return self._latest(self._merged_scan(lower, upper, self._cache.in_range(lower, upper)))

    def prefix_scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        lower = _KEYS + prefix
        upper = _prefix_end(lower) or _KEYS_END
        return self._latest(self._merged_scan(lower, upper, self._cache.in_range(lower, upper)))

    def _refuse_plain_write(self, key: bytes, value: bytes | None = None) -> None:
        raise StateError(f"versioned store {self.name!r} takes writes with a timestamp (put_version), not plain puts")

    put_if_absent = delete = _refuse_plain_write
