"""One RocksDB database (through rocksdict, raw bytes) with options for write-heavy stores: the
workers' ``OrderedBytesDatabase``.

The write-ahead log is disabled: the changelog topic is the durable log of every store, and
``flush_memtables()`` runs before each checkpoint so that a checkpointed offset is always
covered by data on disk (Kafka Streams does the same)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from rocksdict import (
    BlockBasedOptions,
    Cache,
    DBCompressionType,
    Options,
    Rdict,
    ReadOptions,
    WriteBatch,
    WriteOptions,
)

from . import database
from .errors import StateError, StoreCorruptedError


@dataclass(frozen=True, slots=True)
class RocksDBSettings:
    """A few knobs, defaults close to Kafka Streams' RocksDB defaults."""

    write_buffer_bytes: int = 16 * 1024 * 1024
    max_write_buffers: int = 3
    # One LRU block cache shared by every store of the process, so memory does not grow
    # with the number of tasks.
    shared_block_cache_bytes: int = 64 * 1024 * 1024
    block_size_bytes: int = 4 * 1024
    bloom_bits_per_key: int = 10
    background_jobs: int = 2
    compression: str = "lz4"  # cheap on CPU; "none", "snappy", "zstd" also accepted


class DatabaseOpenError(StateError):
    """The database directory exists but RocksDB refuses to open it (corrupt or missing files)."""


_block_caches: dict[int, Cache] = {}
_block_caches_lock = threading.Lock()


def _shared_block_cache(capacity: int) -> Cache:
    with _block_caches_lock:
        cache = _block_caches.get(capacity)
        if cache is None:
            cache = _block_caches[capacity] = Cache(capacity)
        return cache


_COMPRESSIONS = {
    "none": DBCompressionType.none,
    "lz4": DBCompressionType.lz4,
    "snappy": DBCompressionType.snappy,
    "zstd": DBCompressionType.zstd,
}


def build_options(settings: RocksDBSettings, *, create_if_missing: bool) -> Options:
    options = Options(raw_mode=True)
    options.create_if_missing(create_if_missing)
    options.set_paranoid_checks(True)
    options.set_write_buffer_size(settings.write_buffer_bytes)
    options.set_max_write_buffer_number(settings.max_write_buffers)
    options.set_max_background_jobs(settings.background_jobs)
    options.set_level_compaction_dynamic_level_bytes(True)
    options.set_compression_type(_COMPRESSIONS[settings.compression]())
    options.set_keep_log_file_num(2)
    options.set_max_log_file_size(1024 * 1024)
    table = BlockBasedOptions()
    table.set_block_cache(_shared_block_cache(settings.shared_block_cache_bytes))
    table.set_block_size(settings.block_size_bytes)
    table.set_bloom_filter(settings.bloom_bits_per_key, False)
    # Index and filter blocks stay outside the block cache (RocksDB's default): a filter
    # bigger than a cache shard would otherwise be re-read from disk on every lookup.
    options.set_block_based_table_factory(table)
    return options


def database_exists(path: str | os.PathLike[str]) -> bool:
    return os.path.exists(os.path.join(path, "CURRENT"))


def _is_lock_conflict(error: Exception) -> bool:
    message = str(error)
    return "lock hold" in message or "/LOCK" in message


def _translate(error: Exception) -> Exception:
    if "Corruption" in str(error):
        return StoreCorruptedError(str(error))
    return error


class RocksDatabase:
    """A raw-bytes RocksDB handle with bounded scans that surface corruption."""

    __slots__ = ("path", "_db", "_write_options")

    def __init__(self, path: str | os.PathLike[str], settings: RocksDBSettings) -> None:
        self.path = os.fspath(path)
        try:
            self._db = Rdict(self.path, build_options(settings, create_if_missing=True))
        except Exception as error:  # rocksdict raises bare Exception
            if _is_lock_conflict(error):
                raise StateError(f"database {self.path} is already open: {error}") from error
            raise DatabaseOpenError(f"cannot open {self.path}: {error}") from error
        self._write_options = WriteOptions()
        # A property at runtime although rocksdict's stub declares a method.
        self._write_options.disable_wal = True  # type: ignore[method-assign,assignment]  # rocksdict's stub: a method
        self._verify_ends()

    def _verify_ends(self) -> None:
        """Touch the first and last blocks so that a damaged table surfaces at open time."""
        iterator = self._db.iter(ReadOptions())
        try:
            iterator.seek_to_first()
            iterator.status()
            iterator.seek_to_last()
            iterator.status()
        except Exception as error:
            del iterator
            self._db.close()
            raise DatabaseOpenError(f"cannot read {self.path}: {error}") from error

    def new_batch(self) -> WriteBatch:
        return WriteBatch(raw_mode=True)

    def get(self, key: bytes) -> bytes | None:
        try:
            return self._db.get(key)
        except Exception as error:
            raise _translate(error) from error

    def multi_get(self, keys: list[bytes]) -> list[bytes | None]:
        if not keys:
            return []
        try:
            return self._db.get(keys)  # type: ignore[arg-type,return-value]  # rocksdict's stub omits the list form
        except Exception as error:
            raise _translate(error) from error

    def write(self, batch: database.WriteBatch) -> None:
        assert isinstance(batch, WriteBatch), "a batch of new_batch()"
        if batch.is_empty():
            return
        try:
            self._db.write(batch, self._write_options)
        except Exception as error:
            raise _translate(error) from error

    def scan(self, lower: bytes | None = None, upper: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        """Entries with ``lower <= key < upper`` in key order (None: unbounded)."""
        read_options = ReadOptions()
        if upper is not None:
            read_options.set_iterate_upper_bound(upper)
        last_key = None
        try:
            # Raw mode: keys and values are bytes (the stub types them loosely).
            for key, value in self._db.items(from_key=lower, read_opt=read_options):
                last_key = key
                yield key, value  # type: ignore[misc]  # rocksdict's stub: keys and values are any type
        except Exception as error:
            raise _translate(error) from error
        self._check_scan_finished(last_key, lower, upper)  # type: ignore[arg-type]  # bytes, as above

    def _check_scan_finished(self, last_key: bytes | None, lower: bytes | None, upper: bytes | None) -> None:
        # rocksdict's item iterator stops silently on a read error; re-seek just past the
        # last key returned: at a genuine end the iterator is simply invalid, after a
        # corrupt block status() raises.
        read_options = ReadOptions()
        if upper is not None:
            read_options.set_iterate_upper_bound(upper)
        iterator = self._db.iter(read_options)
        if last_key is not None:
            iterator.seek(last_key + b"\x00")
        elif lower is not None:
            iterator.seek(lower)
        else:
            iterator.seek_to_first()
        try:
            iterator.status()
        except Exception as error:
            raise _translate(error) from error
        if iterator.valid():
            raise StoreCorruptedError(f"scan of {self.path} stopped early at {last_key!r}")

    def last_key(self, lower: bytes, upper: bytes) -> bytes | None:
        """Greatest key in ``[lower, upper)``, or None."""
        read_options = ReadOptions()
        read_options.set_iterate_upper_bound(upper)
        iterator = self._db.iter(read_options)
        try:
            iterator.seek_to_last()
            iterator.status()
        except Exception as error:
            raise _translate(error) from error
        if iterator.valid():
            key = iterator.key()
            if key >= lower:
                return key
        return None

    def estimate_num_keys(self) -> int:
        return self._db.property_int_value("rocksdb.estimate-num-keys") or 0

    def flush_memtables(self) -> None:
        self._db.flush(wait=True)

    def close(self) -> None:
        self._db.close()
