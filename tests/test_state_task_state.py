"""Task state on disk (RocksDB): checkpoints, restore from the changelog, persistence across
reopen, wiping untrustworthy state, the lock — and the memory backend's lack of any of it."""

import json
import subprocess
import sys
import textwrap

import pytest
from pystreams.state import (
    InMemoryChangelog,
    StateError,
    StoreCorruptedError,
    TaskDirectoryLockedError,
    TaskState,
    TopicPartition,
    read_checkpoint,
    read_local_task_offsets,
)

APP = "wordcount"
TASK = "1_3"
PARTITION = 3
COUNTS = TopicPartition(f"{APP}-counts-changelog", PARTITION)
WINDOWS = TopicPartition(f"{APP}-windows-changelog", PARTITION)


def open_task(state_dir, changelog, **options):
    state = TaskState(state_dir, APP, TASK, PARTITION, changelog, **options)
    counts = state.key_value_store("counts")
    windows = state.window_store("windows", retention_ms=10_000)
    return state, counts, windows


def contents(counts, windows):
    return list(counts.all()), list(windows.all())


def run_active(state_dir, changelog, rounds, *, first_key=0, close=True):
    """Process some 'records' with commits: flush, deliver, checkpoint."""
    state, counts, windows = open_task(state_dir, changelog)
    state.restore(changelog)
    for round_number in range(rounds):
        for index in range(first_key, first_key + 50):
            word = b"w%03d" % (index % 37)
            counts.put(word, b"%d-%d" % (round_number, index))
            if index % 7 == 0:
                counts.delete(b"w%03d" % (index % 11))
            windows.put(word, (round_number * 50 + index) * 10, b"%d" % index)
        state.flush()
        state.checkpoint(changelog.take_written_offsets())
    result = contents(counts, windows)
    if close:
        state.close()
        return result
    return result, state


def rebuilt_from_scratch(tmp_path, changelog):
    state, counts, windows = open_task(tmp_path / "fresh", changelog)
    state.restore(changelog)
    try:
        return contents(counts, windows)
    finally:
        state.close()


def test_checkpoint_is_written_at_commit_and_read_back(tmp_path):
    changelog = InMemoryChangelog()
    run_active(tmp_path, changelog, rounds=1, close=False)[1].close()
    checkpoint = read_checkpoint(tmp_path / APP / TASK / ".checkpoint")
    assert checkpoint == {COUNTS: changelog.end_offset(COUNTS), WINDOWS: changelog.end_offset(WINDOWS)}
    assert checkpoint[COUNTS] > 0
    raw = json.loads((tmp_path / APP / TASK / ".checkpoint").read_bytes())
    assert raw["version"] == 2
    state, counts, windows = open_task(tmp_path, changelog)
    assert state.restore_positions() == checkpoint
    assert state.wipes == []
    state.close()


def test_checkpoint_follows_each_commit_and_skips_when_nothing_changed(tmp_path):
    changelog = InMemoryChangelog()
    state, counts, windows = open_task(tmp_path, changelog)
    state.restore(changelog)
    path = tmp_path / APP / TASK / ".checkpoint"
    assert read_checkpoint(path) == {COUNTS: 0, WINDOWS: 0}
    counts.put(b"a", b"1")
    state.flush()
    assert state.checkpoint(changelog.take_written_offsets())
    assert read_checkpoint(path)[COUNTS] == 1
    state.flush()
    assert not state.checkpoint(changelog.take_written_offsets())
    counts.put(b"a", b"2")
    state.flush()
    assert state.checkpoint(changelog.take_written_offsets())
    assert read_checkpoint(path)[COUNTS] == 2
    state.close()


def test_checkpoint_min_records_defers_checkpoints_until_enough_progress(tmp_path):
    changelog = InMemoryChangelog()
    state, counts, windows = open_task(tmp_path, changelog, checkpoint_min_records=10)
    state.restore(changelog)
    path = tmp_path / APP / TASK / ".checkpoint"
    for index in range(9):
        counts.put(b"k%d" % index, b"v")
    state.flush()
    assert not state.checkpoint(changelog.take_written_offsets())
    assert read_checkpoint(path)[COUNTS] == 0
    counts.put(b"k9", b"v")
    state.flush()
    assert state.checkpoint(changelog.take_written_offsets())
    assert read_checkpoint(path)[COUNTS] == 10
    state.close()


def test_reopen_restores_only_from_the_checkpoint_to_the_end(tmp_path):
    changelog = InMemoryChangelog(read_batch_size=10)
    run_active(tmp_path / "a", changelog, rounds=3)
    checkpointed = read_checkpoint(tmp_path / "a" / APP / TASK / ".checkpoint")
    # Another instance owned the task meanwhile and wrote more changelog records.
    run_active(tmp_path / "b", changelog, rounds=2, first_key=1000)
    progress = []
    state, counts, windows = open_task(tmp_path / "a", changelog, on_restore_progress=progress.append)
    restored = state.restore(changelog)
    assert restored == {
        "counts": changelog.end_offset(COUNTS) - checkpointed[COUNTS],
        "windows": changelog.end_offset(WINDOWS) - checkpointed[WINDOWS],
    }
    first_report = next(p for p in progress if p.store_name == "counts")
    assert first_report.position == checkpointed[COUNTS] and not first_report.done
    assert contents(counts, windows) == rebuilt_from_scratch(tmp_path, changelog)
    state.close()


def test_restore_reports_progress_as_it_goes_until_caught_up(tmp_path):
    changelog = InMemoryChangelog(read_batch_size=1_000)
    for index in range(25_000):
        changelog.send(COUNTS.topic, PARTITION, b"k%d" % (index % 300), b"%d" % index)
    progress = []
    state, counts, windows = open_task(tmp_path, changelog, on_restore_progress=progress.append)
    state.restore(changelog)
    reports = [p for p in progress if p.store_name == "counts"]
    # Fetched batches of 1,000 are applied in WriteBatches of 10,000 or more.
    assert [p.restored_records for p in reports] == [0, 10_000, 20_000, 25_000, 25_000]
    assert [p.lag for p in reports] == [25_000, 15_000, 5_000, 0, 0]
    assert reports[-1].done and reports[-1].position == 25_000
    assert not any(p.done for p in reports[:-1])
    assert counts.get(b"k0") == b"24900"
    state.close()


def test_restore_after_compaction_ends_at_the_changelog_end(tmp_path):
    changelog = InMemoryChangelog()
    expected = run_active(tmp_path / "a", changelog, rounds=3)
    changelog.compact(COUNTS)
    changelog.compact(WINDOWS)
    state, counts, windows = open_task(tmp_path / "b", changelog)
    state.restore(changelog)
    assert state.restore_positions() == {COUNTS: changelog.end_offset(COUNTS), WINDOWS: changelog.end_offset(WINDOWS)}
    assert contents(counts, windows) == expected
    state.close()


@pytest.mark.parametrize(
    "damage",
    [
        b"not json at all",
        b'{"version": 1, "offsets": [{"topic": "x", "partition": 0, "off',
        b'{"version": 7, "offsets": []}',
        b'{"version": 1, "offsets": [{"topic": "x", "partition": 0, "offset": -5}]}',
        b"",
    ],
)
def test_a_corrupt_checkpoint_wipes_the_task_and_rebuilds_it_identically(tmp_path, damage):
    changelog = InMemoryChangelog()
    expected = run_active(tmp_path, changelog, rounds=3)
    (tmp_path / APP / TASK / ".checkpoint").write_bytes(damage)
    wipes = []
    state, counts, windows = open_task(tmp_path, changelog, on_wipe=wipes.append)
    assert [w.store_name for w in wipes] == [None]
    assert "checkpoint" in wipes[0].reason
    assert state.restore_positions() == {COUNTS: None, WINDOWS: None}
    assert list(counts.all()) == []  # the old database went with the wipe
    state.restore(changelog)
    assert contents(counts, windows) == expected
    state.close()


def _corrupt_current(store_dir):
    (store_dir / "CURRENT").write_text("garbage\n")


def _truncate_tables(store_dir):
    tables = list(store_dir.glob("*.sst"))
    assert tables
    for table in tables:
        with open(table, "r+b") as file:
            file.truncate(100)


def _delete_manifests(store_dir):
    for manifest in store_dir.glob("MANIFEST-*"):
        manifest.unlink()


@pytest.mark.parametrize("damage", [_corrupt_current, _truncate_tables, _delete_manifests])
def test_a_corrupt_database_is_wiped_and_rebuilt_identically(tmp_path, damage):
    changelog = InMemoryChangelog()
    expected = run_active(tmp_path, changelog, rounds=3)
    damage(tmp_path / APP / TASK / "counts")
    state, counts, windows = open_task(tmp_path, changelog)
    assert [w.store_name for w in state.wipes] == ["counts"]
    assert "corrupt" in state.wipes[0].reason
    assert state.restore_positions()[COUNTS] is None
    assert state.restore_positions()[WINDOWS] is not None  # the healthy store keeps its state
    restored = state.restore(changelog)
    assert restored["counts"] == changelog.end_offset(COUNTS)
    assert restored["windows"] == 0
    assert contents(counts, windows) == expected
    state.close()


def test_a_missing_database_is_rebuilt_identically(tmp_path):
    changelog = InMemoryChangelog()
    expected = run_active(tmp_path, changelog, rounds=3)
    import shutil

    shutil.rmtree(tmp_path / APP / TASK / "windows")
    state, counts, windows = open_task(tmp_path, changelog)
    assert [w.store_name for w in state.wipes] == ["windows"]
    assert "missing" in state.wipes[0].reason
    state.restore(changelog)
    assert contents(counts, windows) == expected
    state.close()


def test_a_crash_while_rebuilding_a_wiped_store_rebuilds_it_again_not_trusts_it(tmp_path):
    """The checkpoint stops vouching for a wiped store as soon as it is wiped: a crash during
    its rebuild leaves a partial database the next open must not take for the old one."""
    changelog = InMemoryChangelog()
    expected = run_active(tmp_path, changelog, rounds=3)
    import shutil

    shutil.rmtree(tmp_path / APP / TASK / "windows")
    state, counts, windows = open_task(tmp_path, changelog)
    assert [w.store_name for w in state.wipes] == ["windows"]
    windows.apply_changelog(next(changelog.read(WINDOWS, None, 3)))  # part of the rebuild
    windows.flush_to_disk()
    state._storage.release(wipe=False)  # the process dies: no close, no checkpoint
    for store in state.stores.values():
        store.close()
    state, counts, windows = open_task(tmp_path, changelog)
    assert [w.store_name for w in state.wipes] == ["windows"]  # not trusted: rebuilt again
    state.restore(changelog)
    assert contents(counts, windows) == expected
    state.close()


def test_a_database_without_a_checkpointed_offset_is_rebuilt(tmp_path):
    changelog = InMemoryChangelog()
    expected = run_active(tmp_path, changelog, rounds=2)
    (tmp_path / APP / TASK / ".checkpoint").unlink()
    state, counts, windows = open_task(tmp_path, changelog)
    assert sorted(w.store_name for w in state.wipes) == ["counts", "windows"]
    state.restore(changelog)
    assert contents(counts, windows) == expected
    state.close()


def test_corruption_found_while_reading_raises_and_close_with_wipe_recovers(tmp_path):
    changelog = InMemoryChangelog()
    state, counts, windows = open_task(tmp_path, changelog)
    state.restore(changelog)
    for index in range(20_000):
        counts.put(b"key-%06d" % index, bytes([index % 251]) * 100)
    state.flush()
    state.checkpoint(changelog.take_written_offsets())
    expected = contents(counts, windows)
    state.close()
    # Damage the middle of the largest table, away from the blocks checked at open.
    table = max((tmp_path / APP / TASK / "counts").glob("*.sst"), key=lambda path: path.stat().st_size)
    data = bytearray(table.read_bytes())
    middle = len(data) // 3
    data[middle : middle + 4096] = bytes(4096)
    table.write_bytes(bytes(data))
    state, counts, windows = open_task(tmp_path, changelog)
    with pytest.raises(StoreCorruptedError):
        list(counts.all())
    state.close(wipe=True)
    state, counts, windows = open_task(tmp_path, changelog)
    state.restore(changelog)
    assert contents(counts, windows) == expected
    state.close()


def test_a_second_open_of_the_same_task_is_refused(tmp_path):
    changelog = InMemoryChangelog()
    state, counts, windows = open_task(tmp_path, changelog)
    with pytest.raises(TaskDirectoryLockedError, match=TASK):
        TaskState(tmp_path, APP, TASK, PARTITION, changelog)
    state.close()
    TaskState(tmp_path, APP, TASK, PARTITION, changelog).close()  # free again after close


def test_another_process_cannot_open_a_locked_task(tmp_path):
    changelog = InMemoryChangelog()
    state, counts, windows = open_task(tmp_path, changelog)
    script = textwrap.dedent(
        f"""
        import sys
        from pystreams.state import InMemoryChangelog, TaskDirectoryLockedError, TaskState
        try:
            TaskState({str(tmp_path)!r}, {APP!r}, {TASK!r}, {PARTITION}, InMemoryChangelog())
        except TaskDirectoryLockedError as error:
            print(error)
            sys.exit(3)
        """
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 3, result.stderr
    assert "in use" in result.stdout
    state.close()


def test_standby_applies_the_changelog_continuously_and_promotes_without_a_full_restore(tmp_path):
    changelog = InMemoryChangelog(read_batch_size=25)
    standby, standby_counts, standby_windows = open_task(tmp_path / "standby", changelog)
    standby.restore(changelog)
    active, counts, windows = open_task(tmp_path / "active", changelog)
    active.restore(changelog)
    applied_up_to = {COUNTS: 0, WINDOWS: 0}
    for round_number in range(5):
        for index in range(40):
            counts.put(b"k%d" % (index % 13), b"%d" % (round_number * 40 + index))
            windows.put(b"k%d" % (index % 3), round_number * 1000 + index, b"x")
        active.flush()
        active.checkpoint(changelog.take_written_offsets())
        lags = standby.changelog_lags({c: changelog.end_offset(c) for c in (COUNTS, WINDOWS)})
        assert lags[COUNTS] == changelog.end_offset(COUNTS) - applied_up_to[COUNTS] > 0
        if round_number < 4:  # the standby falls behind in the last round
            for changelog_partition in (COUNTS, WINDOWS):
                end = changelog.end_offset(changelog_partition)
                for batch in changelog.read(changelog_partition, applied_up_to[changelog_partition], end):
                    standby.apply_changelog(changelog_partition, batch)
                applied_up_to[changelog_partition] = end
            standby.checkpoint()
    expected = contents(counts, windows)
    active.close()
    lag_at_promotion = sum(standby.changelog_lags({c: changelog.end_offset(c) for c in (COUNTS, WINDOWS)}).values())
    restored = standby.restore(changelog)  # promotion: only the tail is read
    assert sum(restored.values()) == lag_at_promotion < changelog.end_offset(COUNTS)
    assert contents(standby_counts, standby_windows) == expected
    assert standby.offset_sum() == changelog.end_offset(COUNTS) + changelog.end_offset(WINDOWS)
    standby.close()


def test_local_task_offsets_are_read_from_checkpoints(tmp_path):
    changelog = InMemoryChangelog()
    run_active(tmp_path, changelog, rounds=1)
    other = TaskState(tmp_path, APP, "0_0", 0, changelog)
    other.close()  # no stores: an empty checkpoint
    assert read_local_task_offsets(tmp_path, APP) == {TASK: {COUNTS: changelog.end_offset(COUNTS), WINDOWS: changelog.end_offset(WINDOWS)}}
    assert read_local_task_offsets(tmp_path, "other-app") == {}


def test_close_with_wipe_removes_the_state(tmp_path):
    changelog = InMemoryChangelog()
    run_active(tmp_path, changelog, rounds=1)
    state, counts, windows = open_task(tmp_path, changelog)
    state.close(wipe=True)
    assert [path.name for path in (tmp_path / APP / TASK).iterdir()] == [".lock"]


def test_unknown_changelogs_and_closed_state_are_errors(tmp_path):
    changelog = InMemoryChangelog()
    state, counts, windows = open_task(tmp_path, changelog)
    with pytest.raises(StateError):
        state.checkpoint({TopicPartition("nope", 0): 5})
    with pytest.raises(StateError):
        state.key_value_store("counts")
    state.close()
    with pytest.raises(StateError):
        state.flush()
    with pytest.raises(ValueError):
        TaskState(tmp_path, APP, "../escape", 0, changelog)


CRASHING_WORKER = f"""
import os, sys
from pystreams.state import InMemoryChangelog, TaskState
state_dir, writes_after_checkpoint = sys.argv[1], int(sys.argv[2])
changelog = InMemoryChangelog()
state = TaskState(state_dir, {APP!r}, {TASK!r}, {PARTITION}, changelog)
counts = state.key_value_store("counts")
state.restore(changelog)
for index in range(500):
    counts.put(b"k%03d" % index, b"v%d" % index)
state.flush()
state.checkpoint(changelog.take_written_offsets())
for index in range(writes_after_checkpoint):
    counts.put(b"k%03d" % index, b"late")
state.flush()
os._exit(0)  # crash: no close, no final checkpoint, nothing flushed to disk by us
"""


def test_a_crash_right_after_a_checkpoint_loses_nothing_the_checkpoint_covers(tmp_path):
    # The WAL is off, so this holds only because checkpoint() persists memtables first.
    result = subprocess.run([sys.executable, "-c", CRASHING_WORKER, str(tmp_path), "0"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    changelog = InMemoryChangelog()  # empty: nothing may need restoring
    state = TaskState(tmp_path, APP, TASK, PARTITION, changelog)
    counts = state.key_value_store("counts")
    assert state.wipes == []
    assert counts.changelog_position == 500
    assert len(list(counts.all())) == 500
    assert counts.get(b"k499") == b"v499"
    state.close()


def test_a_crash_after_more_writes_restores_the_tail_from_the_checkpoint(tmp_path):
    result = subprocess.run([sys.executable, "-c", CRASHING_WORKER, str(tmp_path), "100"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    changelog = InMemoryChangelog()
    for index in range(500):  # what the crashed worker's changelog holds
        changelog.send(COUNTS.topic, PARTITION, b"k%03d" % index, b"v%d" % index)
    for index in range(100):
        changelog.send(COUNTS.topic, PARTITION, b"k%03d" % index, b"late")
    state = TaskState(tmp_path, APP, TASK, PARTITION, changelog)
    counts = state.key_value_store("counts")
    assert state.restore(changelog) == {"counts": 100}
    assert counts.get(b"k000") == b"late" and counts.get(b"k499") == b"v499"
    state.close()


def test_changelog_topic_configs(tmp_path):
    changelog = InMemoryChangelog()
    state, counts, windows = open_task(tmp_path, changelog)
    assert counts.changelog_config == {"cleanup.policy": "compact"}
    assert windows.changelog_config == {"cleanup.policy": "compact,delete", "retention.ms": str(10_000 + 86_400_000)}
    state.close()


def test_flush_repeats_until_a_store_written_by_another_stores_forward_is_flushed_too(tmp_path):
    """A suppression buffer behind a table is written while the table's cache flushes; a commit
    must carry that write too (under exactly-once, in the same transaction as the outputs),
    whatever order the stores were opened in."""
    changelog = InMemoryChangelog()
    state = TaskState(tmp_path, APP, TASK, PARTITION, changelog)
    buffer = state.key_value_store("a-buffer")  # opened (and flushed) first
    state.key_value_store("b-table", forward=lambda changes: [buffer.put(change.key, change.value) for change in changes])
    state.store("b-table").put(b"k", b"v")
    state.flush()
    assert len(buffer.cache) == 0
    assert buffer.get(b"k") == b"v"
    assert [(key, value) for _, key, value, _ in changelog.records(TopicPartition(f"{APP}-a-buffer-changelog", PARTITION))] == [(b"k", b"v")]
    state.close()


def test_stores_and_a_window_stores_stream_time_survive_close_and_reopen(tmp_path):
    changelog = InMemoryChangelog()
    state, counts, windows = open_task(tmp_path, changelog)
    state.restore(changelog)
    for index in range(100):
        counts.put(b"k%03d" % index, b"v%d" % index)
    windows.put(b"k", 0, b"a")
    windows.put(b"k", 9_900, b"b")
    state.flush()
    state.checkpoint(changelog.take_written_offsets())
    before = contents(counts, windows)
    state.close()
    state, counts, windows = open_task(tmp_path, changelog)
    try:
        assert state.wipes == []
        assert contents(counts, windows) == before
        assert counts.changelog_position == 100
        assert windows.observed_stream_time == 9_900
        assert list(windows.fetch(b"k", 0, 10_000)) == [(0, b"a"), (9_900, b"b")]
        assert not windows.put(b"k", -200, b"expired")  # 10,000 ms behind 9,900
    finally:
        state.close()


def test_memory_state_writes_no_files_and_loses_its_data_on_close(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    changelog = InMemoryChangelog()
    with TaskState(None, "app", "0_0", 0, changelog) as state:
        store = state.key_value_store("counts")
        store.put(b"a", b"1")
        state.flush()
        assert state.checkpoint(changelog.take_written_offsets(), force=True)
        assert state.changelog_offsets() == {TopicPartition("app-counts-changelog", 0): 1}
    assert list(tmp_path.iterdir()) == []
    with TaskState(None, "app", "0_0", 0, changelog) as state:
        store = state.key_value_store("counts")
        assert state.restore_positions() == {TopicPartition("app-counts-changelog", 0): None}
        assert state.restore(changelog) == {"counts": 1}
        assert store.get(b"a") == b"1"
