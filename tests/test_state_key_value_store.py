"""Key-value store semantics, and the record cache folding writes between flushes."""

import pytest
from pystreams.state import (
    CacheLimits,
    ChangelogRecord,
    InMemoryChangelog,
    KeyValueChange,
    StateError,
    TaskState,
    TopicPartition,
)

CHANGELOG = TopicPartition("app-counts-changelog", 0)


@pytest.fixture
def changelog():
    return InMemoryChangelog()


@pytest.fixture
def forwarded():
    return []


@pytest.fixture
def task(tmp_path, changelog):
    state = TaskState(tmp_path, "app", "0_0", 0, changelog)
    yield state
    state.close()


@pytest.fixture
def store(task, forwarded):
    return task.key_value_store("counts", forward=forwarded.extend)


def test_reads_see_unflushed_writes_and_flushed_ones(store):
    store.put(b"a", b"1")
    assert store.get(b"a") == b"1"
    assert store.get(b"missing") is None
    store.flush()
    assert len(store.cache) == 0
    assert store.get(b"a") == b"1"
    store.put(b"a", b"2")
    assert store.get(b"a") == b"2"


def test_many_updates_of_one_key_become_one_changelog_record_and_one_forward(store, changelog, forwarded):
    for count in range(1000):
        store.put(b"word", str(count).encode())
    store.flush()
    assert changelog.records(CHANGELOG) == [ChangelogRecord(0, b"word", b"999")]
    assert forwarded == [KeyValueChange(b"word", b"999", None)]
    for count in range(5):
        store.put(b"word", str(count).encode())
    store.put(b"other", b"x")
    store.flush()
    assert [(r.key, r.value) for r in changelog.records(CHANGELOG)] == [
        (b"word", b"999"),
        (b"word", b"4"),
        (b"other", b"x"),
    ]
    assert len(forwarded) == 3


def test_a_flush_with_nothing_cached_sends_nothing(store, changelog, forwarded):
    store.flush()
    store.put(b"a", b"1")
    store.flush()
    store.flush()
    assert len(changelog.records(CHANGELOG)) == 1
    assert len(forwarded) == 1


def test_delete_becomes_a_tombstone_and_hides_the_stored_value(store, changelog, forwarded):
    store.put(b"a", b"1")
    store.flush()
    store.delete(b"a")
    assert store.get(b"a") is None
    assert list(store.all()) == []
    store.flush()
    assert store.get(b"a") is None
    assert changelog.records(CHANGELOG)[-1] == ChangelogRecord(1, b"a", None)
    assert forwarded[-1] == KeyValueChange(b"a", None, None)


def test_put_none_deletes(store):
    store.put(b"a", b"1")
    store.flush()
    store.put(b"a", None)
    store.flush()
    assert store.get(b"a") is None


def test_put_then_delete_within_one_interval_folds_to_one_tombstone(store, changelog):
    store.put(b"a", b"1")
    store.put(b"a", b"2")
    store.delete(b"a")
    store.flush()
    assert changelog.records(CHANGELOG) == [ChangelogRecord(0, b"a", None)]


def test_put_if_absent(store):
    assert store.put_if_absent(b"a", b"1") is None
    assert store.put_if_absent(b"a", b"2") == b"1"
    assert store.get(b"a") == b"1"


def test_range_is_inclusive_and_merges_cache_over_rocksdb(store):
    for key in (b"a", b"b", b"c", b"d", b"e"):
        store.put(key, b"stored-" + key)
    store.flush()
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


def test_prefix_scan_including_keys_of_0xff_bytes(store):
    for key in (b"ab", b"ab\x00", b"ab\xff", b"ac", b"\xff", b"\xff\xff", b"a"):
        store.put(key, key)
    store.flush()
    store.put(b"ab\x01", b"cached")
    assert [key for key, _ in store.prefix_scan(b"ab")] == [b"ab", b"ab\x00", b"ab\x01", b"ab\xff"]
    assert [key for key, _ in store.prefix_scan(b"\xff")] == [b"\xff", b"\xff\xff"]
    assert len(list(store.prefix_scan(b""))) == 8


def test_approximate_count_counts_flushed_and_cached(store):
    for index in range(100):
        store.put(b"k%03d" % index, b"v")
    store.flush()
    store.put(b"new", b"v")
    assert 90 <= store.approximate_count() <= 110


def test_eviction_writes_out_the_oldest_entries_through_changelog_and_forward(task, changelog):
    forwarded = []
    store = task.key_value_store("counts", cache_limits=CacheLimits(max_entries=10, evict_to_fraction=0.5), forward=forwarded.extend)
    for index in range(10):
        store.put(b"k%d" % index, b"v")
    store.put(b"k0", b"v2")  # rewriting k0 makes it the youngest entry
    assert forwarded == []
    store.put(b"k10", b"v")  # 11 entries > 10: evict down to 5
    assert [change.key for change in forwarded] == [b"k1", b"k2", b"k3", b"k4", b"k5", b"k6"]
    assert [record.key for record in changelog.records(CHANGELOG)] == [change.key for change in forwarded]
    assert len(store.cache) == 5
    assert store.cache.evicted_entries == 6
    # Evicted entries are readable from RocksDB; the rest are still cached.
    assert store.get(b"k1") == b"v" and store.get(b"k0") == b"v2"
    store.flush()
    assert sorted(change.key for change in forwarded[6:]) == [b"k0", b"k10", b"k7", b"k8", b"k9"]


def test_eviction_by_bytes(task, changelog):
    store = task.key_value_store("counts", cache_limits=CacheLimits(max_bytes=10_000, evict_to_fraction=0.5))
    store.put(b"small", b"x")
    store.put(b"big", b"y" * 10_000)
    assert store.cache.size_bytes <= 5_000
    assert {record.key for record in changelog.records(CHANGELOG)} >= {b"small"}
    assert store.get(b"big") == b"y" * 10_000


def test_send_old_values_forwards_the_value_replaced(task):
    forwarded = []
    store = task.key_value_store("counts", forward=forwarded.extend, send_old_values=True)
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


def test_changelog_records_cannot_be_applied_over_unflushed_writes(store):
    store.put(b"a", b"1")
    with pytest.raises(StateError):
        store.apply_changelog([ChangelogRecord(0, b"a", b"0")])


def test_apply_changelog_advances_the_position(store):
    assert store.apply_changelog([ChangelogRecord(5, b"a", b"1"), ChangelogRecord(9, b"b", None)]) == 2
    assert store.changelog_position == 10
    assert store.get(b"a") == b"1"


def test_data_survives_close_and_reopen(tmp_path, changelog):
    with TaskState(tmp_path, "app", "0_0", 0, changelog) as state:
        store = state.key_value_store("counts")
        state.restore(changelog)
        for index in range(100):
            store.put(b"k%03d" % index, b"v%d" % index)
        state.flush()
        state.checkpoint(changelog.take_written_offsets())
        before = list(store.all())
    with TaskState(tmp_path, "app", "0_0", 0, changelog) as state:
        store = state.key_value_store("counts")
        assert state.wipes == []
        assert list(store.all()) == before
        assert store.changelog_position == 100
