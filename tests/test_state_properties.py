"""Properties: a store always reads like a plain model of its writes, and its changelog,
replayed into an empty store, reproduces it exactly — whatever the flush points and however
small the cache — on every backend that keeps a changelog (RocksDB and memory)."""

import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pystreams.state import CacheLimits, InMemoryChangelog, TaskState

KEYS = st.sampled_from([b"", b"a", b"a\x00", b"ab", b"b", b"\xff", b"\x00"])
VALUES = st.binary(max_size=4)
cache_limits = st.builds(
    CacheLimits,
    max_entries=st.integers(min_value=1, max_value=8),
    max_bytes=st.sampled_from([100, 300, 10_000_000]),
    evict_to_fraction=st.sampled_from([0.0, 0.5, 0.9]),
)
property_settings = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

kv_operations = st.lists(
    st.one_of(
        st.tuples(st.just("put"), KEYS, VALUES),
        st.tuples(st.just("delete"), KEYS, st.none()),
        st.tuples(st.just("flush"), st.none(), st.none()),
    ),
    max_size=60,
)


BACKENDS = pytest.mark.parametrize("backend", ["rocksdb", "memory"])


def open_state(directory, changelog, backend="rocksdb"):
    return TaskState(directory if backend == "rocksdb" else None, "app", "0_0", 0, changelog)


@BACKENDS
@property_settings
@given(kv_operations, cache_limits, st.integers(min_value=1, max_value=5))
def test_key_value_changelog_replay_reproduces_the_store(backend, operations, limits, read_batch_size):
    changelog = InMemoryChangelog(read_batch_size=read_batch_size)
    forwarded = {}
    model: dict[bytes, bytes] = {}
    with tempfile.TemporaryDirectory() as directory:
        with open_state(f"{directory}/live", changelog, backend) as state:
            store = state.key_value_store(
                "kv",
                cache_limits=limits,
                forward=lambda changes: forwarded.update((c.key, c.value) for c in changes),
            )
            state.restore(changelog)
            for operation, key, value in operations:
                if operation == "put":
                    store.put(key, value)
                    model[key] = value
                elif operation == "delete":
                    store.delete(key)
                    model.pop(key, None)
                else:
                    state.flush()
                    state.checkpoint(changelog.take_written_offsets())
                assert list(store.all()) == sorted(model.items())
                assert all(store.get(key) == model.get(key) for key in (b"a", b"\xff", b"zz"))
            state.flush()
            state.checkpoint(changelog.take_written_offsets())
            live = list(store.all())
        assert {key: value for key, value in forwarded.items() if value is not None} == model
        with open_state(f"{directory}/replayed", changelog, backend) as state:
            store = state.key_value_store("kv")
            state.restore(changelog)
            assert list(store.all()) == live
        if backend == "memory":
            return  # memory state ends with its close: nothing to reopen
        # Reopening the live state needs nothing from the changelog and reads the same.
        with open_state(f"{directory}/live", changelog, backend) as state:
            store = state.key_value_store("kv")
            assert state.restore(changelog) == {"kv": 0}
            assert list(store.all()) == live


@BACKENDS
def test_one_changelog_record_per_key_per_flush_without_eviction(tmp_path, backend):
    changelog = InMemoryChangelog()
    with open_state(tmp_path, changelog, backend) as state:
        store = state.key_value_store("kv")
        for index in range(10_000):
            store.put(b"k%d" % (index % 10), b"%d" % index)
            if index % 1_000 == 999:
                state.flush()
    assert sum(len(changelog.records(p)) for p in changelog.partitions()) == 10 * 10


RETENTION = 50
window_operations = st.lists(
    st.one_of(
        st.tuples(st.just("put"), KEYS, st.integers(0, 200), st.one_of(st.none(), VALUES)),
        st.tuples(st.just("flush"), st.none(), st.none(), st.none()),
    ),
    max_size=50,
)


@BACKENDS
@property_settings
@given(window_operations, cache_limits)
def test_window_store_reads_like_its_model_and_replays_exactly(backend, operations, limits):
    changelog = InMemoryChangelog(read_batch_size=3)
    model: dict[tuple[bytes, int], bytes] = {}
    observed = None
    with tempfile.TemporaryDirectory() as directory:
        with open_state(f"{directory}/live", changelog, backend) as state:
            store = state.window_store("w", retention_ms=RETENTION, cache_limits=limits)
            state.restore(changelog)
            for operation, key, start, value in operations:
                if operation == "flush":
                    state.flush()
                    continue
                observed = start if observed is None else max(observed, start)
                accepted = store.put(key, start, value)
                assert accepted == (start > observed - RETENTION)
                if accepted:
                    if value is None:
                        model.pop((key, start), None)
                    else:
                        model[(key, start)] = value
                live_model = sorted((k, s, v) for (k, s), v in model.items() if s > observed - RETENTION)
                assert [tuple(w) for w in store.all()] == live_model
                assert list(store.fetch(b"a", 0, 200)) == [(s, v) for k, s, v in live_model if k == b"a"]
            state.flush()
            live = list(store.all())
        with open_state(f"{directory}/replayed", changelog, backend) as state:
            store = state.window_store("w", retention_ms=RETENTION)
            state.restore(changelog)
            assert list(store.all()) == live


session_operations = st.lists(
    st.one_of(
        st.tuples(st.just("put"), KEYS, st.integers(0, 100), st.integers(0, 100), st.one_of(st.none(), VALUES)),
        st.tuples(st.just("flush"), st.none(), st.none(), st.none(), st.none()),
    ),
    max_size=50,
)


@BACKENDS
@property_settings
@given(session_operations, cache_limits, st.integers(0, 120), st.integers(0, 120))
def test_session_store_finds_what_its_model_finds_and_replays_exactly(backend, operations, limits, earliest_end, latest_start):
    changelog = InMemoryChangelog(read_batch_size=4)
    model: dict[tuple[bytes, int, int], bytes] = {}
    observed = None
    with tempfile.TemporaryDirectory() as directory:
        with open_state(f"{directory}/live", changelog, backend) as state:
            store = state.session_store("s", retention_ms=RETENTION, cache_limits=limits)
            state.restore(changelog)
            for operation, key, start, length, value in operations:
                if operation == "flush":
                    state.flush()
                    continue
                end = start + length
                observed = end if observed is None else max(observed, end)
                if store.put(key, start, end, value):
                    if value is None:
                        model.pop((key, start, end), None)
                    else:
                        model[(key, start, end)] = value
                live = {k: v for k, v in model.items() if k[2] > observed - RETENTION}
                expected = sorted(
                    ((k, s, e, v) for (k, s, e), v in live.items() if k == b"a" and e >= earliest_end and s <= latest_start),
                    key=lambda session: (session[2], session[1]),
                )
                assert [tuple(s) for s in store.find_sessions(b"a", earliest_end, latest_start)] == expected
            state.flush()
            sessions = list(store.all())
        with open_state(f"{directory}/replayed", changelog, backend) as state:
            store = state.session_store("s", retention_ms=RETENTION)
            state.restore(changelog)
            assert list(store.all()) == sessions


versioned_operations = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.sampled_from([b"a", b"b", b"\xff"]), st.integers(0, 60), st.one_of(st.none(), st.binary(min_size=1, max_size=3))),
        st.tuples(st.just("flush"), st.none(), st.none(), st.none()),
    ),
    max_size=50,
)


@BACKENDS
@property_settings
@given(versioned_operations, st.integers(0, 25))
def test_versioned_store_answers_every_as_of_read_like_a_log_of_its_writes_and_replays_exactly(backend, operations, history_ms):
    """Whatever it prunes, a versioned store answers as a plain log of its accepted writes
    would, within its history (and the latest version always); its changelog replays it."""
    changelog = InMemoryChangelog()
    writes: dict[bytes, dict[int, bytes | None]] = {}
    observed: int | None = None

    def model_as_of(key: bytes, at: int) -> bytes | None:
        versions = sorted(writes.get(key, {}).items())
        if not versions:
            return None
        if versions[-1][0] <= at:
            return versions[-1][1]
        if observed is not None and at < observed - history_ms:
            return None
        older = [value for valid_from, value in versions if valid_from <= at]
        return older[-1] if older else None

    with tempfile.TemporaryDirectory() as directory:
        with open_state(f"{directory}/live", changelog, backend) as state:
            store = state.versioned_store("versioned", history_ms=history_ms)
            for operation, key, timestamp, value in operations:
                if operation == "flush":
                    state.flush()
                    state.checkpoint(changelog.take_written_offsets())
                    continue
                accepted = observed is None or timestamp >= observed - history_ms
                store.put_version(key, value, timestamp)
                if accepted:
                    writes.setdefault(key, {})[timestamp] = value
                    observed = timestamp if observed is None else max(observed, timestamp)
                for probe in (b"a", b"b", b"\xff"):
                    assert store.get(probe) == model_as_of(probe, 2**62)
                    for at in range(-1, 62, 7):
                        assert store.get_as_of(probe, at) == model_as_of(probe, at), (probe, at)
            state.flush()
            state.checkpoint(changelog.take_written_offsets())
            live = [(key, store.history(key)) for key in (b"a", b"b", b"\xff")], store.observed_stream_time
        with open_state(f"{directory}/replayed", changelog, backend) as state:
            store = state.versioned_store("versioned", history_ms=history_ms)
            state.restore(changelog)
            assert ([(key, store.history(key)) for key in (b"a", b"b", b"\xff")], store.observed_stream_time) == live
