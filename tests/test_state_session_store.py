"""Session store: finding mergeable sessions, removal, retention on session end."""

import pytest
from pystreams.state import InMemoryChangelog, Session, SessionChange, TaskState, TopicPartition
from pystreams.state.keys import session_key

CHANGELOG = TopicPartition("app-sessions-changelog", 0)


@pytest.fixture
def changelog():
    return InMemoryChangelog()


@pytest.fixture
def forwarded():
    return []


@pytest.fixture
def store(tmp_path, changelog, forwarded):
    state = TaskState(tmp_path, "app", "0_0", 0, changelog)
    yield state.session_store("sessions", retention_ms=10_000, forward=forwarded.extend)
    state.close()


@pytest.mark.parametrize("flush_first", [False, True])
def test_find_sessions_overlapping_a_gap_around_a_record(store, flush_first):
    store.put(b"user", 0, 10, b"s1")
    store.put(b"user", 20, 30, b"s2")
    store.put(b"user", 50, 55, b"s3")
    store.put(b"user\x00", 20, 30, b"other key")
    store.put(b"use", 20, 30, b"other key")
    if flush_first:
        store.flush()
    # A record at t=35 with gap 10 merges with sessions ending >= 25 and starting <= 45.
    assert list(store.find_sessions(b"user", 25, 45)) == [Session(b"user", 20, 30, b"s2")]
    assert [s.value for s in store.find_sessions(b"user", 10, 50)] == [b"s1", b"s2", b"s3"]
    assert list(store.find_sessions(b"user", 56, 100)) == []
    assert [s.value for s in store.fetch(b"user")] == [b"s1", b"s2", b"s3"]


def test_sessions_are_ordered_by_end_then_start(store):
    store.put(b"k", 5, 20, b"b")
    store.put(b"k", 0, 20, b"a")
    store.put(b"k", 0, 10, b"first")
    assert [(s.start, s.end) for s in store.fetch(b"k")] == [(0, 10), (0, 20), (5, 20)]


def test_merging_removes_old_sessions_with_tombstones(store, changelog, forwarded):
    store.put(b"k", 0, 10, b"one")
    store.put(b"k", 20, 30, b"two")
    store.flush()
    store.remove(b"k", 0, 10)
    store.remove(b"k", 20, 30)
    store.put(b"k", 0, 30, b"merged")
    assert list(store.fetch(b"k")) == [Session(b"k", 0, 30, b"merged")]
    assert store.fetch_session(b"k", 0, 10) is None
    store.flush()
    assert list(store.fetch(b"k")) == [Session(b"k", 0, 30, b"merged")]
    assert [(r.key, r.value) for r in changelog.records(CHANGELOG)[2:]] == [
        (session_key(b"k", 0, 10), None),
        (session_key(b"k", 20, 30), None),
        (session_key(b"k", 0, 30), b"merged"),
    ]
    assert forwarded[2:] == [
        SessionChange(b"k", 0, 10, None, None),
        SessionChange(b"k", 20, 30, None, None),
        SessionChange(b"k", 0, 30, b"merged", None),
    ]


def test_retention_is_on_session_end(store):
    store.put(b"k", 0, 100, b"old")
    store.put(b"k", 0, 5_000, b"long")
    store.flush()
    store.put(b"j", 10_050, 10_050, b"new")  # stream time 10050: sessions ending before 51 expire
    assert [s.value for s in store.all()] == [b"new", b"old", b"long"]
    store.put(b"j", 10_200, 15_000, b"newer")  # horizon 5001
    assert [s.value for s in store.all()] == [b"new", b"newer"]
    assert not store.put(b"k", 0, 4_000, b"too late")
    store.flush()
    assert [s.value for s in store.all()] == [b"new", b"newer"]
    assert list(store.find_sessions_in_key_range(b"a", b"z", 0, 20_000)) == [
        Session(b"j", 10_050, 10_050, b"new"),
        Session(b"j", 10_200, 15_000, b"newer"),
    ]


def test_start_after_end_is_rejected(store):
    with pytest.raises(ValueError):
        store.put(b"k", 10, 5, b"x")
