"""One set of store semantics, tested once against every backend of the store interface
(pystreams.state.interface) that runs without Spark:

* ``rocksdb`` and ``memory``: the stores over an ordered bytes database, with record cache,
  changelog and forwarding — every test here;
* ``spark``: the Spark runtime's stores over a dict standing in for Spark's ``MapState`` —
  the interface's reads, writes, ranges and retention (tests taking ``store_backend``).

Tests taking ``logged_backend`` cover what only the changelog-backed stores have: folding in
the record cache, changelog records, forwards, eviction and restore.
What only RocksDB has (persistence across reopen, checkpoints, corruption) is in
test_state_task_state.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pystreams.state import (
    CacheLimits,
    ChangelogRecord,
    InMemoryChangelog,
    KeyValueChange,
    Session,
    SessionChange,
    StateError,
    TaskState,
    TopicPartition,
    WindowChange,
    WindowedValue,
)
from pystreams.state.keys import MAX_TIMESTAMP, MIN_TIMESTAMP, session_key, window_key

from pystreams.spark.state import SparkKeyValueStore, SparkSessionStore, SparkWindowStore

KEY_VALUE_CHANGELOG = TopicPartition("app-counts-changelog", 0)
WINDOW_CHANGELOG = TopicPartition("app-windows-changelog", 0)
SESSION_CHANGELOG = TopicPartition("app-sessions-changelog", 0)

LOGGED_BACKENDS = ["rocksdb", "memory"]


class DictMapState(dict[bytes, bytes]):
    """Spark's MapState for a store, as the Spark stores use it."""

    def put(self, key: bytes, value: bytes) -> None:
        self[key] = value

    def delete(self, key: bytes) -> None:
        self.pop(key, None)


class Backend:
    """Opens stores of one backend; ``flush`` is a commit (caches or batch changes written
    back), ``state`` the task state of a logged backend."""

    def __init__(self, kind: str, tmp_path: Any, changelog: InMemoryChangelog) -> None:
        self.kind = kind
        self._spark_stores: list[Any] = []
        self.state: TaskState | None = None
        if kind != "spark":
            self.state = TaskState(tmp_path if kind == "rocksdb" else None, "app", "0_0", 0, changelog)

    def key_value_store(self, name: str = "counts", **options: Any) -> Any:
        if self.state is not None:
            return self.state.key_value_store(name, **options)
        return self._spark(SparkKeyValueStore(name, DictMapState()))

    def window_store(self, name: str = "windows", *, retention_ms: int, **options: Any) -> Any:
        if self.state is not None:
            return self.state.window_store(name, retention_ms=retention_ms, **options)
        return self._spark(SparkWindowStore(name, DictMapState(), retention_ms, None))

    def session_store(self, name: str = "sessions", *, retention_ms: int, **options: Any) -> Any:
        if self.state is not None:
            return self.state.session_store(name, retention_ms=retention_ms, **options)
        return self._spark(SparkSessionStore(name, DictMapState(), retention_ms, None))

    def _spark(self, store: Any) -> Any:
        self._spark_stores.append(store)
        return store

    def flush(self) -> None:
        if self.state is not None:
            self.state.flush()
        for store in self._spark_stores:
            store.flush()

    def close(self) -> None:
        if self.state is not None:
            self.state.close()


@pytest.fixture
def changelog() -> InMemoryChangelog:
    return InMemoryChangelog()


@pytest.fixture
def forwarded() -> list[Any]:
    return []


def _backend(kind: str, tmp_path: Any, changelog: InMemoryChangelog) -> Iterator[Backend]:
    backend = Backend(kind, tmp_path, changelog)
    yield backend
    backend.close()


@pytest.fixture(params=[*LOGGED_BACKENDS, "spark"])
def store_backend(request: Any, tmp_path: Any, changelog: InMemoryChangelog) -> Iterator[Backend]:
    yield from _backend(request.param, tmp_path, changelog)


@pytest.fixture(params=LOGGED_BACKENDS)
def logged_backend(request: Any, tmp_path: Any, changelog: InMemoryChangelog) -> Iterator[Backend]:
    yield from _backend(request.param, tmp_path, changelog)


# -- key-value stores ---------------------------------------------------------------------


def test_reads_see_unflushed_writes_and_flushed_ones(store_backend):
    store = store_backend.key_value_store()
    store.put(b"a", b"1")
    assert store.get(b"a") == b"1"
    assert store.get(b"missing") is None
    store_backend.flush()
    assert store.get(b"a") == b"1"
    store.put(b"a", b"2")
    assert store.get(b"a") == b"2"


def test_a_flush_empties_the_cache(logged_backend):
    store = logged_backend.key_value_store()
    store.put(b"a", b"1")
    store.flush()
    assert len(store.cache) == 0
    assert store.get(b"a") == b"1"


def test_many_updates_of_one_key_become_one_changelog_record_and_one_forward(logged_backend, changelog, forwarded):
    store = logged_backend.key_value_store(forward=forwarded.extend)
    for count in range(1000):
        store.put(b"word", str(count).encode())
    store.flush()
    assert changelog.records(KEY_VALUE_CHANGELOG) == [ChangelogRecord(0, b"word", b"999")]
    assert forwarded == [KeyValueChange(b"word", b"999", None)]
    for count in range(5):
        store.put(b"word", str(count).encode())
    store.put(b"other", b"x")
    store.flush()
    assert [(r.key, r.value) for r in changelog.records(KEY_VALUE_CHANGELOG)] == [
        (b"word", b"999"),
        (b"word", b"4"),
        (b"other", b"x"),
    ]
    assert len(forwarded) == 3


def test_a_flush_with_nothing_cached_sends_nothing(logged_backend, changelog, forwarded):
    store = logged_backend.key_value_store(forward=forwarded.extend)
    store.flush()
    store.put(b"a", b"1")
    store.flush()
    store.flush()
    assert len(changelog.records(KEY_VALUE_CHANGELOG)) == 1
    assert len(forwarded) == 1


def test_delete_hides_the_stored_value(store_backend):
    store = store_backend.key_value_store()
    store.put(b"a", b"1")
    store_backend.flush()
    store.delete(b"a")
    assert store.get(b"a") is None
    assert list(store.all()) == []
    store_backend.flush()
    assert store.get(b"a") is None
    assert list(store.all()) == []


def test_delete_becomes_a_tombstone_in_the_changelog_and_downstream(logged_backend, changelog, forwarded):
    store = logged_backend.key_value_store(forward=forwarded.extend)
    store.put(b"a", b"1")
    store.flush()
    store.delete(b"a")
    store.flush()
    assert changelog.records(KEY_VALUE_CHANGELOG)[-1] == ChangelogRecord(1, b"a", None)
    assert forwarded[-1] == KeyValueChange(b"a", None, None)


def test_put_none_deletes(store_backend):
    store = store_backend.key_value_store()
    store.put(b"a", b"1")
    store_backend.flush()
    store.put(b"a", None)
    store_backend.flush()
    assert store.get(b"a") is None


def test_put_then_delete_within_one_interval_folds_to_one_tombstone(logged_backend, changelog):
    store = logged_backend.key_value_store()
    store.put(b"a", b"1")
    store.put(b"a", b"2")
    store.delete(b"a")
    store.flush()
    assert changelog.records(KEY_VALUE_CHANGELOG) == [ChangelogRecord(0, b"a", None)]


def test_put_if_absent(store_backend):
    store = store_backend.key_value_store()
    assert store.put_if_absent(b"a", b"1") is None
    assert store.put_if_absent(b"a", b"2") == b"1"
    assert store.get(b"a") == b"1"


def test_range_is_inclusive_in_key_byte_order_and_merges_unflushed_writes_over_stored_ones(store_backend):
    store = store_backend.key_value_store()
    for key in (b"a", b"b", b"c", b"d", b"e"):
        store.put(key, b"stored-" + key)
    store_backend.flush()
    store.put(b"b", b"cached-b")  # overrides a stored value
    store.delete(b"c")  # hides a stored value
    store.put(b"bb", b"cached-bb")  # only in the cache
    store.put(b"f", b"cached-f")
    assert list(store.range(b"b", b"d")) == [
        (b"b", b"cached-b"),
        (b"bb", b"cached-bb"),
        (b"d", b"stored-d"),
    ]
    assert [key for key, _ in store.range(None, b"bb")] == [b"a", b"b", b"bb"]
    assert [key for key, _ in store.range(b"d", None)] == [b"d", b"e", b"f"]
    assert [key for key, _ in store.all()] == [b"a", b"b", b"bb", b"d", b"e", b"f"]
    assert list(store.range(b"x", b"z")) == []


@pytest.mark.parametrize("flush_first", [False, True])
def test_key_order_is_bytewise_with_a_prefix_before_its_extensions(store_backend, flush_first):
    store = store_backend.key_value_store()
    keys = [b"\xff\xff", b"ab\x00", b"a", b"", b"ab", b"\x00", b"ab\xff", b"b", b"\xff"]
    for key in keys:
        store.put(key, key)
    if flush_first:
        store_backend.flush()
    assert [key for key, _ in store.all()] == sorted(keys)
    assert [key for key, _ in store.range(b"a", b"ab\x00")] == [b"a", b"ab", b"ab\x00"]


def test_prefix_scan_including_keys_of_0xff_bytes(store_backend):
    store = store_backend.key_value_store()
    for key in (b"ab", b"ab\x00", b"ab\xff", b"ac", b"\xff", b"\xff\xff", b"a"):
        store.put(key, key)
    store.flush()
    store.put(b"ab\x01", b"cached")
    assert [key for key, _ in store.prefix_scan(b"ab")] == [b"ab", b"ab\x00", b"ab\x01", b"ab\xff"]
    assert [key for key, _ in store.prefix_scan(b"\xff")] == [b"\xff", b"\xff\xff"]
    assert len(list(store.prefix_scan(b""))) == 8


def test_approximate_count_counts_flushed_and_unflushed(store_backend):
    store = store_backend.key_value_store()
    for index in range(100):
        store.put(b"k%03d" % index, b"v")
    store_backend.flush()
    store.put(b"new", b"v")
    assert 90 <= store.approximate_count() <= 110


def test_eviction_writes_out_the_oldest_entries_through_changelog_and_forward(logged_backend, changelog):
    forwarded: list[KeyValueChange] = []
    store = logged_backend.key_value_store(cache_limits=CacheLimits(max_entries=10, evict_to_fraction=0.5), forward=forwarded.extend)
    for index in range(10):
        store.put(b"k%d" % index, b"v")
    store.put(b"k0", b"v2")  # rewriting k0 makes it the youngest entry
    assert forwarded == []
    store.put(b"k10", b"v")  # 11 entries > 10: evict down to 5
    assert [change.key for change in forwarded] == [b"k1", b"k2", b"k3", b"k4", b"k5", b"k6"]
    assert [record.key for record in changelog.records(KEY_VALUE_CHANGELOG)] == [change.key for change in forwarded]
    assert len(store.cache) == 5
    assert store.cache.evicted_entries == 6
    # Evicted entries are readable from the database; the rest are still cached.
    assert store.get(b"k1") == b"v" and store.get(b"k0") == b"v2"
    store.flush()
    assert sorted(change.key for change in forwarded[6:]) == [b"k0", b"k10", b"k7", b"k8", b"k9"]


def test_eviction_during_a_range_scan_does_not_change_what_the_scan_returns(logged_backend):
    store = logged_backend.key_value_store(cache_limits=CacheLimits(max_entries=4, evict_to_fraction=0.5))
    for index in range(4):
        store.put(b"k%d" % index, b"stored")
    store.flush()
    scanned = []
    for key, value in store.all():
        scanned.append((key, value))
        store.put(key + b"-new", b"cached")  # evicts to the database mid-scan
    assert scanned == [(b"k%d" % index, b"stored") for index in range(4)]


def test_eviction_by_bytes(logged_backend, changelog):
    store = logged_backend.key_value_store(cache_limits=CacheLimits(max_bytes=10_000, evict_to_fraction=0.5))
    store.put(b"small", b"x")
    store.put(b"big", b"y" * 10_000)
    assert store.cache.size_bytes <= 5_000
    assert {record.key for record in changelog.records(KEY_VALUE_CHANGELOG)} >= {b"small"}
    assert store.get(b"big") == b"y" * 10_000


def test_send_old_values_forwards_the_value_replaced(logged_backend):
    forwarded: list[KeyValueChange] = []
    store = logged_backend.key_value_store(forward=forwarded.extend, send_old_values=True)
    store.put(b"a", b"1")
    store.flush()
    store.put(b"a", b"2")
    store.put(b"a", b"3")
    store.delete(b"b")
    store.flush()
    assert forwarded == [
        KeyValueChange(b"a", b"1", None),
        KeyValueChange(b"a", b"3", b"1"),
        KeyValueChange(b"b", None, None),
    ]


def test_changelog_records_cannot_be_applied_over_unflushed_writes(logged_backend):
    store = logged_backend.key_value_store()
    store.put(b"a", b"1")
    with pytest.raises(StateError):
        store.apply_changelog([ChangelogRecord(0, b"a", b"0")])


def test_apply_changelog_advances_the_position(logged_backend):
    store = logged_backend.key_value_store()
    assert store.apply_changelog([ChangelogRecord(5, b"a", b"1"), ChangelogRecord(9, b"b", None)]) == 2
    assert store.changelog_position == 10
    assert store.get(b"a") == b"1"


def test_restore_replays_tombstones_and_rebuilds_identical_contents(logged_backend, changelog, tmp_path):
    live = logged_backend.key_value_store()
    for index in range(20):
        live.put(b"k%02d" % (index % 7), b"v%d" % index)
        if index % 3 == 0:
            live.delete(b"k%02d" % (index % 5))
        if index % 4 == 0:
            live.flush()
    live.flush()
    rebuilt = Backend(logged_backend.kind, tmp_path / "rebuilt", changelog)
    try:
        assert rebuilt.state is not None
        store = rebuilt.key_value_store()
        assert rebuilt.state.restore(changelog) == {"counts": len(changelog.records(KEY_VALUE_CHANGELOG))}
        assert list(store.all()) == list(live.all())
    finally:
        rebuilt.close()


# -- window stores ------------------------------------------------------------------------


def test_window_get_and_fetch_with_inclusive_time_bounds(store_backend):
    store = store_backend.window_store(retention_ms=1_000)
    for start in (0, 100, 200, 300):
        store.put(b"k", start, b"v%d" % start)
    assert store.get(b"k", 100) == b"v100"
    assert store.get(b"k", 150) is None
    assert list(store.fetch(b"k", 100, 200)) == [(100, b"v100"), (200, b"v200")]
    assert list(store.fetch(b"k", 101, 199)) == []
    assert list(store.fetch(b"k", MIN_TIMESTAMP, MAX_TIMESTAMP)) == [
        (0, b"v0"),
        (100, b"v100"),
        (200, b"v200"),
        (300, b"v300"),
    ]
    assert list(store.fetch(b"k", 300, 100)) == []


@pytest.mark.parametrize("flush_first", [False, True])
def test_window_fetch_never_sees_keys_that_share_a_prefix(store_backend, flush_first):
    store = store_backend.window_store(retention_ms=1_000)
    for key in (b"k", b"k\x00", b"k\x00\x00", b"ka", b"", b"\xff"):
        store.put(key, 50, key + b"!")
    if flush_first:
        store_backend.flush()
    assert list(store.fetch(b"k", 0, 100)) == [(50, b"k!")]
    assert list(store.fetch(b"k\x00", 0, 100)) == [(50, b"k\x00!")]
    assert list(store.fetch(b"", 0, 100)) == [(50, b"!")]
    assert [w.key for w in store.all()] == [b"", b"k", b"k\x00", b"k\x00\x00", b"ka", b"\xff"]


def test_unflushed_window_writes_overlay_stored_windows(store_backend):
    store = store_backend.window_store(retention_ms=1_000)
    store.put(b"k", 10, b"stored-10")
    store.put(b"k", 20, b"stored-20")
    store.put(b"k", 30, b"stored-30")
    store_backend.flush()
    store.put(b"k", 20, b"cached-20")
    store.put(b"k", 30, None)
    store.put(b"k", 25, b"cached-25")
    assert list(store.fetch(b"k", 0, 100)) == [(10, b"stored-10"), (20, b"cached-20"), (25, b"cached-25")]
    assert store.get(b"k", 30) is None
    store_backend.flush()
    assert list(store.fetch(b"k", 0, 100)) == [(10, b"stored-10"), (20, b"cached-20"), (25, b"cached-25")]


def windows_of_three_keys(backend: Backend) -> Any:
    """A window store with windows of keys a, b, c, some flushed, some not."""
    store = backend.window_store(retention_ms=1_000)
    store.put(b"a", 300, b"a300")
    store.put(b"b", 100, b"b100")
    backend.flush()
    store.put(b"c", 200, b"c200")
    store.put(b"a", 100, b"a100")
    return store


def test_fetch_all_is_by_time_then_key_and_all_by_key_then_time(store_backend):
    store = windows_of_three_keys(store_backend)
    assert list(store.fetch_all(100, 200)) == [
        WindowedValue(b"a", 100, b"a100"),
        WindowedValue(b"b", 100, b"b100"),
        WindowedValue(b"c", 200, b"c200"),
    ]
    assert [(w.key, w.window_start) for w in store.fetch_all(MIN_TIMESTAMP, MAX_TIMESTAMP)] == [
        (b"a", 100),
        (b"b", 100),
        (b"c", 200),
        (b"a", 300),
    ]
    assert [(w.key, w.window_start) for w in store.all()] == [(b"a", 100), (b"a", 300), (b"b", 100), (b"c", 200)]


def test_fetch_key_range(logged_backend):
    store = windows_of_three_keys(logged_backend)
    assert [(w.key, w.window_start) for w in store.fetch_key_range(b"a", b"b", 0, 1000)] == [
        (b"a", 100),
        (b"a", 300),
        (b"b", 100),
    ]


def test_window_retention_hides_and_drops_old_windows(store_backend):
    store = store_backend.window_store(retention_ms=1_000)
    store.put(b"k", 0, b"old")
    store.put(b"k", 500, b"mid")
    store_backend.flush()
    assert store.put(b"k", 1_500, b"new")  # stream time 1500: windows before 501 expire
    assert store.min_live_time == 501
    assert store.get(b"k", 0) is None
    assert list(store.fetch(b"k", MIN_TIMESTAMP, MAX_TIMESTAMP)) == [(1_500, b"new")]
    assert not store.put(b"k", 400, b"too late")
    assert list(store.fetch_all(MIN_TIMESTAMP, MAX_TIMESTAMP)) == [WindowedValue(b"k", 1_500, b"new")]
    store_backend.flush()
    assert list(store.all()) == [WindowedValue(b"k", 1_500, b"new")]


def test_window_retention_deletes_expired_windows_from_the_database(logged_backend):
    store = logged_backend.window_store(retention_ms=1_000)
    store.put(b"k", 0, b"old")
    store.put(b"k", 500, b"mid")
    store.flush()
    store.put(b"k", 1_500, b"new")
    store.flush()
    # Physically gone: a raw scan of the database finds only the live window and its index entry.
    raw = list(store._db.scan())
    assert len(raw) == 2
    assert store.expire() == 0


def test_window_retention_boundary_is_observed_time_minus_retention_plus_one(store_backend):
    store = store_backend.window_store(retention_ms=1_000)
    store.put(b"k", 1_500, b"now")
    assert store.put(b"k", 501, b"oldest live")
    assert not store.put(b"k", 500, b"just expired")
    assert store.get(b"k", 501) == b"oldest live"
    assert list(store.fetch(b"k", 0, 2_000)) == [(501, b"oldest live"), (1_500, b"now")]


def test_window_flush_folds_per_window_and_forwards(logged_backend, changelog, forwarded):
    store = logged_backend.window_store(retention_ms=1_000, forward=forwarded.extend)
    for value in range(10):
        store.put(b"k", 0, b"%d" % value)
    store.put(b"k", 100, b"x")
    store.put(b"k", 100, None)
    store.flush()
    assert [(r.key, r.value) for r in changelog.records(WINDOW_CHANGELOG)] == [
        (window_key(b"k", 0), b"9"),
        (window_key(b"k", 100), None),
    ]
    assert forwarded == [WindowChange(b"k", 0, b"9", None), WindowChange(b"k", 100, None, None)]


def test_window_restore_rebuilds_identical_windows_and_applies_retention(logged_backend, tmp_path):
    changelog = InMemoryChangelog(read_batch_size=7)
    live = Backend(logged_backend.kind, tmp_path / "a", changelog)
    rebuilt = Backend(logged_backend.kind, tmp_path / "b", changelog)
    try:
        assert live.state is not None and rebuilt.state is not None
        store = live.window_store(retention_ms=1_000)
        live.state.restore(changelog)
        for time in range(0, 3_000, 37):
            store.put(b"key-%d" % (time % 5), time, b"v%d" % time)
            if time % 5 == 0:
                store.put(b"key-%d" % (time % 3), time - 10, None)
            if time % 11 == 0:
                live.flush()
        live.flush()
        expected = list(store.all())
        restored = rebuilt.window_store(retention_ms=1_000)
        rebuilt.state.restore(changelog)
        assert list(restored.all()) == expected
        assert list(restored.fetch_all(MIN_TIMESTAMP, MAX_TIMESTAMP)) == sorted(expected, key=lambda w: (w.window_start, w.key))
    finally:
        live.close()
        rebuilt.close()


# -- session stores -----------------------------------------------------------------------


@pytest.mark.parametrize("flush_first", [False, True])
def test_find_sessions_overlapping_a_gap_around_a_record(store_backend, flush_first):
    store = store_backend.session_store(retention_ms=10_000)
    store.put(b"user", 0, 10, b"s1")
    store.put(b"user", 20, 30, b"s2")
    store.put(b"user", 50, 55, b"s3")
    store.put(b"user\x00", 20, 30, b"other key")
    store.put(b"use", 20, 30, b"other key")
    if flush_first:
        store_backend.flush()
    # A record at t=35 with gap 10 merges with sessions ending >= 25 and starting <= 45.
    assert list(store.find_sessions(b"user", 25, 45)) == [Session(b"user", 20, 30, b"s2")]
    assert [s.value for s in store.find_sessions(b"user", 10, 50)] == [b"s1", b"s2", b"s3"]
    assert list(store.find_sessions(b"user", 56, 100)) == []
    assert [s.value for s in store.fetch(b"user")] == [b"s1", b"s2", b"s3"]


def test_sessions_are_ordered_by_end_then_start(store_backend):
    store = store_backend.session_store(retention_ms=10_000)
    store.put(b"k", 5, 20, b"b")
    store.put(b"k", 0, 20, b"a")
    store.put(b"k", 0, 10, b"first")
    assert [(s.start, s.end) for s in store.fetch(b"k")] == [(0, 10), (0, 20), (5, 20)]


def merge_two_sessions(backend: Backend, store: Any) -> None:
    """Sessions [0, 10] and [20, 30] of key k, flushed, then merged into [0, 30] (what a
    record at 15 with a gap of 10 does)."""
    store.put(b"k", 0, 10, b"one")
    store.put(b"k", 20, 30, b"two")
    backend.flush()
    store.remove(b"k", 0, 10)
    store.remove(b"k", 20, 30)
    store.put(b"k", 0, 30, b"merged")


def test_merging_removes_old_sessions(store_backend):
    store = store_backend.session_store(retention_ms=10_000)
    merge_two_sessions(store_backend, store)
    assert list(store.fetch(b"k")) == [Session(b"k", 0, 30, b"merged")]
    store_backend.flush()
    assert list(store.fetch(b"k")) == [Session(b"k", 0, 30, b"merged")]
    assert list(store.fetch_all_ending(MIN_TIMESTAMP, MAX_TIMESTAMP)) == [Session(b"k", 0, 30, b"merged")]


def test_merging_removes_old_sessions_with_tombstones(logged_backend, changelog, forwarded):
    store = logged_backend.session_store(retention_ms=10_000, forward=forwarded.extend)
    merge_two_sessions(logged_backend, store)
    assert store.fetch_session(b"k", 0, 10) is None
    store.flush()
    assert [(r.key, r.value) for r in changelog.records(SESSION_CHANGELOG)[2:]] == [
        (session_key(b"k", 0, 10), None),
        (session_key(b"k", 20, 30), None),
        (session_key(b"k", 0, 30), b"merged"),
    ]
    assert forwarded[2:] == [
        SessionChange(b"k", 0, 10, None, None),
        SessionChange(b"k", 20, 30, None, None),
        SessionChange(b"k", 0, 30, b"merged", None),
    ]


def test_session_retention_is_on_session_end(store_backend):
    store = store_backend.session_store(retention_ms=10_000)
    store.put(b"k", 0, 100, b"old")
    store.put(b"k", 0, 5_000, b"long")
    store_backend.flush()
    store.put(b"j", 10_050, 10_050, b"new")  # stream time 10050: sessions ending before 51 expire
    assert [s.value for s in store.all()] == [b"new", b"old", b"long"]
    store.put(b"j", 10_200, 15_000, b"newer")  # horizon 5001
    assert [s.value for s in store.all()] == [b"new", b"newer"]
    assert not store.put(b"k", 0, 4_000, b"too late")
    store_backend.flush()
    assert [s.value for s in store.all()] == [b"new", b"newer"]
    assert [s.value for s in store.fetch_all_ending(MIN_TIMESTAMP, MAX_TIMESTAMP)] == [b"new", b"newer"]


def test_find_sessions_in_key_range(logged_backend):
    store = logged_backend.session_store(retention_ms=10_000)
    store.put(b"k", 0, 100, b"old")
    store.put(b"k", 0, 5_000, b"long")
    store.put(b"j", 10_050, 10_050, b"new")
    store.put(b"j", 10_200, 15_000, b"newer")  # horizon 5001: both sessions of k expire
    store.flush()
    assert list(store.find_sessions_in_key_range(b"a", b"z", 0, 20_000)) == [
        Session(b"j", 10_050, 10_050, b"new"),
        Session(b"j", 10_200, 15_000, b"newer"),
    ]


def test_session_start_after_end_is_rejected(store_backend):
    store = store_backend.session_store(retention_ms=10_000)
    with pytest.raises(ValueError):
        store.put(b"k", 10, 5, b"x")


# -- versioned stores ------------------------------------------------------------------------

_VERSION_WRITES = st.lists(st.tuples(st.sampled_from([b"a", b"b", b"c"]), st.one_of(st.none(), st.binary(max_size=3)), st.integers(0, 200)), max_size=30)


@settings(max_examples=60, deadline=None)
@given(writes=_VERSION_WRITES, history_ms=st.integers(0, 80))
def test_a_versioned_store_in_spark_state_answers_as_the_workers_does(tmp_path_factory: Any, writes: list[Any], history_ms: int) -> None:
    """Every write's outcome, then every key's latest value and every as-of read (nulls,
    out-of-order and too-old writes included), alike over RocksDB's layout in memory and over
    Spark's MapState, before and after a flush."""
    from pystreams.spark.state import SparkVersionedStore

    memory = Backend("memory", tmp_path_factory.mktemp("versioned"), InMemoryChangelog())
    try:
        assert memory.state is not None
        worker = memory.state.versioned_store("prices", history_ms=history_ms)
        spark = SparkVersionedStore("prices", DictMapState(), history_ms)
        for key, value, timestamp in writes:
            assert spark.put_version(key, value, timestamp) == worker.put_version(key, value, timestamp)
        for flushed in (False, True):
            if flushed:
                memory.flush()
                spark.flush()
            for key in (b"a", b"b", b"c"):
                assert spark.get(key) == worker.get(key)
                assert [spark.get_as_of(key, t) for t in range(-1, 205, 7)] == [worker.get_as_of(key, t) for t in range(-1, 205, 7)]
            assert list(spark.all()) == list(worker.all())
    finally:
        memory.close()
