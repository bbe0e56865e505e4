"""The global tables' state on RocksDB: records applied as written (tombstones delete, null
keys skipped), positions per partition checkpointed with the data on disk, a reopen resumes
from the checkpoint, a database the checkpoint does not vouch for is wiped, one process at a
time holds the directory, and the store is read-only to everything but its topic."""

from __future__ import annotations

from pathlib import Path

import pytest
from pystreams.state import ChangelogRecord, GlobalState, StateError, TaskDirectoryLockedError, TopicPartition
from pystreams.state.global_store import GLOBAL_DIRECTORY


def records(start: int, *pairs: tuple[bytes | None, bytes | None]) -> list[ChangelogRecord]:
    return [ChangelogRecord(start + n, key, value) for n, (key, value) in enumerate(pairs)]  # type: ignore[arg-type]


def open_state(state_dir: Path, **options: int) -> GlobalState:
    return GlobalState(state_dir, "app", {"customers": "customers-topic"}, **options)


def test_records_apply_as_written_and_positions_follow_each_partition(tmp_path: Path) -> None:
    state = open_state(tmp_path)
    store = state.stores["customers"]
    assert store.apply(0, records(0, (b"a", b"1"), (b"b", b"2"), (None, b"x"))) == 2
    assert store.apply(2, records(5, (b"c", b"3"))) == 1
    assert store.apply(0, records(3, (b"a", None))) == 1
    assert store.get(b"a") is None and store.get(b"b") == b"2" and store.get(b"c") == b"3"
    assert store.null_keys_skipped == 1
    assert state.positions() == {TopicPartition("customers-topic", 0): 4, TopicPartition("customers-topic", 2): 6}
    # A restore read to an end past its last record (markers, compaction) ends there.
    store.apply(1, [], end_offset=9)
    assert store.position(1) == 9
    assert list(store.range(b"b", b"c")) == [(b"b", b"2"), (b"c", b"3")]
    assert list(store.prefix_scan(b"c")) == [(b"c", b"3")]
    with pytest.raises(StateError, match="read-only"):
        store.put(b"a", b"1")
    with pytest.raises(StateError, match="read-only"):
        store.delete(b"a")
    state.close()


def test_a_reopen_resumes_from_the_checkpoint_with_the_data_it_names(tmp_path: Path) -> None:
    state = open_state(tmp_path)
    state.stores["customers"].apply(0, records(0, (b"a", b"1"), (b"b", b"2")))
    state.close()  # checkpoints
    reopened = open_state(tmp_path)
    store = reopened.stores["customers"]
    assert store.position(0) == 2
    assert store.get(b"a") == b"1"
    assert reopened.wipes == []
    reopened.close()


def test_one_process_at_a_time_holds_the_directory(tmp_path: Path) -> None:
    state = open_state(tmp_path)
    with pytest.raises(TaskDirectoryLockedError):
        open_state(tmp_path)
    state.close()
    open_state(tmp_path).close()


def test_a_database_the_checkpoint_does_not_vouch_for_is_wiped_and_read_again(tmp_path: Path) -> None:
    """Applied but never checkpointed (a crash before the first checkpoint): the data may be
    half on disk, so it is rebuilt from the topic's beginning."""
    state = open_state(tmp_path)
    state.stores["customers"].apply(0, records(0, (b"a", b"1")))
    state.stores["customers"].flush_to_disk()
    state.close(checkpoint=False)  # the process died: no checkpoint was written
    assert not (tmp_path / "app" / GLOBAL_DIRECTORY / ".checkpoint").exists()
    reopened = open_state(tmp_path)
    assert reopened.stores["customers"].position(0) is None
    assert reopened.stores["customers"].get(b"a") is None
    assert [w.store_name for w in reopened.wipes] == ["customers"]
    reopened.close()


def test_a_crash_while_rebuilding_a_wiped_table_rebuilds_it_again(tmp_path: Path) -> None:
    state = open_state(tmp_path)
    state.stores["customers"].apply(0, records(0, *[(b"k%02d" % n, b"v") for n in range(20)]))
    state.close()
    import shutil

    shutil.rmtree(tmp_path / "app" / GLOBAL_DIRECTORY / "customers")  # the database is lost
    state = open_state(tmp_path)
    assert [w.store_name for w in state.wipes] == ["customers"]
    state.stores["customers"].apply(0, records(0, *[(b"k%02d" % n, b"v") for n in range(5)]))  # part of the restore
    state.stores["customers"].flush_to_disk()
    state.close(checkpoint=False)  # the process dies before the restore ends
    state = open_state(tmp_path)
    assert [w.store_name for w in state.wipes] == ["customers"]  # rebuilt again, not trusted at offset 20
    assert state.stores["customers"].position(0) is None
    state.close()


def test_checkpoints_wait_for_enough_progress_unless_forced(tmp_path: Path) -> None:
    state = open_state(tmp_path, checkpoint_min_records=10)
    state.stores["customers"].apply(0, records(0, (b"a", b"1")))
    assert state.checkpoint() is False
    state.stores["customers"].apply(0, records(1, *[(b"k%d" % n, b"v") for n in range(10)]))
    assert state.checkpoint() is True
    assert state.checkpoint() is False  # nothing moved since
    state.close()


def test_in_memory_state_has_no_directory(tmp_path: Path) -> None:
    state = GlobalState(None, "app", {"t": "topic"})
    state.stores["t"].apply(0, records(0, (b"k", b"v")))
    assert state.stores["t"].get(b"k") == b"v"
    state.close()
    assert not (tmp_path / "app").exists()


def test_scans_beside_the_thread_applying_records_never_look_cut_short(tmp_path: Path) -> None:
    """The global thread writes while queries scan: a scan sees a consistent prefix of writes
    and never mistakes a row written past its end for a scan stopped early."""
    import threading

    state = open_state(tmp_path)
    store = state.stores["customers"]
    store.apply(0, records(0, *[(b"k%03d" % n, b"v") for n in range(10)]))
    failures: list[BaseException] = []

    def write() -> None:
        for n in range(5000):
            store.apply(0, records(10 + n, (b"z%06d" % n, b"v")))

    def scan() -> None:
        for _ in range(200):
            try:
                rows = list(store.all())
                assert rows[:10] == [(b"k%03d" % n, b"v") for n in range(10)]
            except BaseException as error:
                failures.append(error)

    threads = [threading.Thread(target=write), threading.Thread(target=scan)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    state.close()
