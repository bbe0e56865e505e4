"""The record cache on its own: folding, least-recently-written eviction, size accounting."""

import pytest
from pystreams.state.cache import ABSENT, ENTRY_OVERHEAD_BYTES, CacheLimits, RecordCache


def make_cache(**limits):
    evicted = []
    cache = RecordCache(CacheLimits(**limits), lambda changes, stamps: evicted.append(changes))
    return cache, evicted


def test_updates_fold_and_deletes_are_cached_as_none():
    cache, evicted = make_cache()
    for value in range(100):
        cache.put(b"k", b"%d" % value)
    cache.put(b"gone", None)
    assert cache.get(b"k") == b"99"
    assert cache.get(b"gone") is None
    assert cache.get(b"other") is ABSENT
    assert list(cache.drain().items()) == [(b"k", b"99"), (b"gone", None)]
    assert len(cache) == 0 and cache.size_bytes == 0
    assert evicted == []


def test_eviction_takes_the_least_recently_written_entries():
    cache, evicted = make_cache(max_entries=4, evict_to_fraction=0.5)
    for key in (b"a", b"b", b"c", b"d"):
        cache.put(key, b"v")
    cache.put(b"a", b"v2")
    cache.put(b"e", b"v")
    assert evicted == [{b"b": b"v", b"c": b"v", b"d": b"v"}]
    assert list(cache.drain()) == [b"a", b"e"]


def test_byte_accounting_follows_value_sizes():
    cache, evicted = make_cache()
    cache.put(b"k", b"12345")
    assert cache.size_bytes == 1 + 5 + ENTRY_OVERHEAD_BYTES
    cache.put(b"k", b"1")
    assert cache.size_bytes == 1 + 1 + ENTRY_OVERHEAD_BYTES
    cache.put(b"k", None)
    assert cache.size_bytes == 1 + ENTRY_OVERHEAD_BYTES


def test_growing_a_value_past_max_bytes_evicts():
    cache, evicted = make_cache(max_bytes=1_000, evict_to_fraction=0.0)
    cache.put(b"a", b"x")
    cache.put(b"b", b"x")
    cache.put(b"b", b"x" * 2_000)
    assert [key for batch in evicted for key in batch] == [b"a", b"b"]
    assert len(cache) == 0 and cache.size_bytes == 0


def test_range_and_group_lookups_are_sorted():
    evicted = []
    cache = RecordCache(CacheLimits(), lambda changes, stamps: evicted.append(changes), group_suffix_bytes=2)
    for key in (b"b\x00\x02", b"a\x00\x09", b"b\x00\x01", b"bb\x00\x01"):
        cache.put(key, key)
    assert [k for k, _ in cache.in_range(b"b", None)] == [b"b\x00\x01", b"b\x00\x02", b"bb\x00\x01"]
    assert [k for k, _ in cache.in_group(b"b", b"b", b"c")] == [b"b\x00\x01", b"b\x00\x02"]
    assert [k for k, _ in cache.in_group(b"b", b"b\x00\x02", b"c")] == [b"b\x00\x02"]
    cache.drain()
    assert cache.in_group(b"b", b"", b"\xff") == []


class Clock:
    timestamp = 0
    headers: tuple = ()


def test_a_clocked_cache_stamps_each_entry_with_its_last_writers_timestamp_in_write_order():
    clock, evicted = Clock(), []
    cache = RecordCache(CacheLimits(max_entries=2, evict_to_fraction=0.0), lambda changes, stamps: evicted.append((list(changes), stamps.times)), clock=clock)
    for key, timestamp in ((b"a", 5), (b"b", 9), (b"a", 7)):
        clock.timestamp = timestamp
        cache.put(key, b"v")
    entries, stamps = cache.drain_stamped()
    assert stamps is not None and (list(entries), stamps.times) == ([b"b", b"a"], {b"b": 9, b"a": 7})
    for key, timestamp in ((b"c", 1), (b"d", 2), (b"c", 3), (b"e", 4)):  # the third key evicts all
        clock.timestamp = timestamp
        cache.put(key, b"v")
    assert evicted == [([b"d", b"c", b"e"], {b"d": 2, b"c": 3, b"e": 4})]
    entries, stamps = cache.drain_stamped()
    assert entries == {} and stamps is not None and stamps.times == {}
    assert RecordCache(CacheLimits(), lambda changes, stamps: None).drain_stamped() == ({}, None)  # no clock: no stamps


def test_a_clocked_cache_keeps_the_headers_of_each_entrys_last_writer_through_eviction():
    clock, evicted = Clock(), []
    cache = RecordCache(CacheLimits(max_entries=2, evict_to_fraction=0.0), lambda changes, stamps: evicted.append(dict(stamps.headers)), clock=clock)
    traced = (("trace-id", b"t-1"),)
    for key, headers in ((b"a", traced), (b"b", traced), (b"b", ())):  # b's last writer had none
        clock.headers = headers
        cache.put(key, b"v")
    _, stamps = cache.drain_stamped()
    assert stamps is not None and stamps.headers == {b"a": traced}
    for key, headers in ((b"c", traced), (b"d", ()), (b"e", ())):  # the third key evicts all
        clock.headers = headers
        cache.put(key, b"v")
    assert evicted == [{b"c": traced}]
    _, stamps = cache.drain_stamped()
    assert stamps is not None and stamps.headers == {}


@pytest.mark.parametrize("limits", [dict(max_entries=0), dict(max_bytes=0), dict(evict_to_fraction=1.0)])
def test_invalid_limits(limits):
    with pytest.raises(ValueError):
        CacheLimits(**limits)
