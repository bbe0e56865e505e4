"""Window store: fetches by key and time, retention, time-ordered scans, folding."""

import pytest
from pystreams.state import InMemoryChangelog, TaskState, TopicPartition, WindowChange, WindowedValue
from pystreams.state.keys import MAX_TIMESTAMP, MIN_TIMESTAMP, window_key

CHANGELOG = TopicPartition("app-windows-changelog", 2)


@pytest.fixture
def changelog():
    return InMemoryChangelog()


@pytest.fixture
def task(tmp_path, changelog):
    state = TaskState(tmp_path, "app", "0_2", 2, changelog)
    yield state
    state.close()


@pytest.fixture
def forwarded():
    return []


@pytest.fixture
def store(task, forwarded):
    return task.window_store("windows", retention_ms=1_000, forward=forwarded.extend)


def test_get_and_fetch_with_inclusive_time_bounds(store):
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
def test_fetch_never_sees_keys_that_share_a_prefix(store, flush_first):
    for key in (b"k", b"k\x00", b"k\x00\x00", b"ka", b"", b"\xff"):
        store.put(key, 50, key + b"!")
    if flush_first:
        store.flush()
    assert list(store.fetch(b"k", 0, 100)) == [(50, b"k!")]
    assert list(store.fetch(b"k\x00", 0, 100)) == [(50, b"k\x00!")]
    assert list(store.fetch(b"", 0, 100)) == [(50, b"!")]
    assert [w.key for w in store.all()] == [b"", b"k", b"k\x00", b"k\x00\x00", b"ka", b"\xff"]


def test_cached_writes_overlay_stored_windows(store):
    store.put(b"k", 10, b"stored-10")
    store.put(b"k", 20, b"stored-20")
    store.put(b"k", 30, b"stored-30")
    store.flush()
    store.put(b"k", 20, b"cached-20")
    store.put(b"k", 30, None)
    store.put(b"k", 25, b"cached-25")
    assert list(store.fetch(b"k", 0, 100)) == [(10, b"stored-10"), (20, b"cached-20"), (25, b"cached-25")]
    assert store.get(b"k", 30) is None
    store.flush()
    assert list(store.fetch(b"k", 0, 100)) == [(10, b"stored-10"), (20, b"cached-20"), (25, b"cached-25")]


def test_fetch_key_range_and_fetch_all(store):
    store.put(b"a", 300, b"a300")
    store.put(b"b", 100, b"b100")
    store.flush()
    store.put(b"c", 200, b"c200")
    store.put(b"a", 100, b"a100")
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
    assert [(w.key, w.window_start) for w in store.fetch_key_range(b"a", b"b", 0, 1000)] == [
        (b"a", 100),
        (b"a", 300),
        (b"b", 100),
    ]


def test_retention_hides_drops_and_then_deletes_old_windows(store):
    store.put(b"k", 0, b"old")
    store.put(b"k", 500, b"mid")
    store.flush()
    assert store.put(b"k", 1_500, b"new")  # stream time 1500: windows before 501 expire
    assert store.min_live_time == 501
    assert store.get(b"k", 0) is None
    assert list(store.fetch(b"k", MIN_TIMESTAMP, MAX_TIMESTAMP)) == [(1_500, b"new")]
    assert not store.put(b"k", 400, b"too late")
    assert list(store.fetch_all(MIN_TIMESTAMP, MAX_TIMESTAMP)) == [WindowedValue(b"k", 1_500, b"new")]
    store.flush()
    # Physically gone: a raw scan of the database finds only the live window and its index entry.
    raw = list(store._db.scan())
    assert len(raw) == 2
    assert store.expire() == 0


def test_flush_folds_per_window_and_forwards(store, changelog, forwarded):
    for value in range(10):
        store.put(b"k", 0, b"%d" % value)
    store.put(b"k", 100, b"x")
    store.put(b"k", 100, None)
    store.flush()
    assert [(r.key, r.value) for r in changelog.records(CHANGELOG)] == [
        (window_key(b"k", 0), b"9"),
        (window_key(b"k", 100), None),
    ]
    assert forwarded == [WindowChange(b"k", 0, b"9", None), WindowChange(b"k", 100, None, None)]


def test_observed_stream_time_survives_reopen(tmp_path, changelog):
    with TaskState(tmp_path, "app", "0_2", 2, changelog) as state:
        store = state.window_store("windows", retention_ms=1_000)
        state.restore(changelog)
        store.put(b"k", 0, b"a")
        store.put(b"k", 900, b"b")
        state.flush()
        state.checkpoint(changelog.take_written_offsets())
    with TaskState(tmp_path, "app", "0_2", 2, changelog) as state:
        store = state.window_store("windows", retention_ms=1_000)
        assert store.observed_stream_time == 900
        assert list(store.fetch(b"k", 0, 1000)) == [(0, b"a"), (900, b"b")]
        assert not store.put(b"k", -200, b"expired")


def test_restore_rebuilds_identical_windows_and_applies_retention(tmp_path):
    changelog = InMemoryChangelog(read_batch_size=7)
    with TaskState(tmp_path / "a", "app", "0_2", 2, changelog) as state:
        store = state.window_store("windows", retention_ms=1_000)
        state.restore(changelog)
        for time in range(0, 3_000, 37):
            store.put(b"key-%d" % (time % 5), time, b"v%d" % time)
            if time % 5 == 0:
                store.put(b"key-%d" % (time % 3), time - 10, None)
            if time % 11 == 0:
                state.flush()
        state.flush()
        expected = list(store.all())
    with TaskState(tmp_path / "b", "app", "0_2", 2, changelog) as state:
        store = state.window_store("windows", retention_ms=1_000)
        state.restore(changelog)
        assert list(store.all()) == expected
        assert list(store.fetch_all(MIN_TIMESTAMP, MAX_TIMESTAMP)) == sorted(expected, key=lambda w: (w.window_start, w.key))


def test_retention_boundary_is_observed_time_minus_retention_plus_one(store):
    store.put(b"k", 1_500, b"now")
    assert store.put(b"k", 501, b"oldest live")
    assert not store.put(b"k", 500, b"just expired")
    assert store.get(b"k", 501) == b"oldest live"
    assert list(store.fetch(b"k", 0, 2_000)) == [(501, b"oldest live"), (1_500, b"now")]
