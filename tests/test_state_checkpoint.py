"""The checkpoint file: format, atomic replacement, rejection of untrustworthy contents."""

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pystreams.state import CheckpointCorruptedError, TopicPartition, read_checkpoint, write_checkpoint

offsets_strategy = st.dictionaries(
    st.builds(TopicPartition, st.text(min_size=1, max_size=20), st.integers(0, 1_000)),
    st.integers(0, 2**62),
    max_size=10,
)


@given(offsets_strategy)
def test_round_trip(offsets):
    import tempfile

    with tempfile.TemporaryDirectory() as directory:
        path = f"{directory}/.checkpoint"
        write_checkpoint(path, offsets)
        assert read_checkpoint(path) == offsets


def test_missing_file_means_no_checkpoint(tmp_path):
    assert read_checkpoint(tmp_path / ".checkpoint") is None


def test_rewrite_replaces_the_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / ".checkpoint"
    write_checkpoint(path, {TopicPartition("t", 0): 5})
    write_checkpoint(path, {TopicPartition("t", 0): 9, TopicPartition("t", 1): 2})
    assert read_checkpoint(path) == {TopicPartition("t", 0): 9, TopicPartition("t", 1): 2}
    assert [p.name for p in tmp_path.iterdir()] == [".checkpoint"]


def test_stale_temporary_from_a_crash_is_ignored_and_overwritten(tmp_path):
    path = tmp_path / ".checkpoint"
    write_checkpoint(path, {TopicPartition("t", 0): 5})
    (tmp_path / ".checkpoint.tmp").write_bytes(b"half a checkp")
    assert read_checkpoint(path) == {TopicPartition("t", 0): 5}
    write_checkpoint(path, {TopicPartition("t", 0): 6})
    assert read_checkpoint(path) == {TopicPartition("t", 0): 6}


@pytest.mark.parametrize(
    "content",
    [
        b"\x00\x01garbage",
        b"{}",
        b'{"version": 2}',
        b'{"version": 3, "offsets": []}',
        b'{"version": 2, "offsets": [{"topic": "t", "partition": 0, "offset": 1}, {"topic": "t", "partition": 0, "offset": 2}]}',
        b'{"version": 2, "offsets": [{"topic": "", "partition": 0, "offset": 1}]}',
        b'{"version": 2, "offsets": [{"topic": "t", "partition": -1, "offset": 1}]}',
        b'{"version": 2, "offsets": [{"topic": "t", "partition": 0, "offset": "1"}]}',
        b'{"version": 2, "offsets": [{"topic": "t", "partition": 0, "offset": 1, "extra": 0}]}',
    ],
)
def test_untrustworthy_contents_are_rejected(tmp_path, content):
    path = tmp_path / ".checkpoint"
    path.write_bytes(content)
    with pytest.raises(CheckpointCorruptedError):
        read_checkpoint(path)


def test_a_checkpoint_of_an_older_store_layout_is_refused_so_the_stores_are_rebuilt(tmp_path):
    """Version 1 stores kept table rows without timestamps; their changelogs are the same, so
    the task rebuilds them from there (the storage wipes on this error)."""
    path = tmp_path / ".checkpoint"
    path.write_bytes(b'{"version": 1, "offsets": [{"topic": "t", "partition": 0, "offset": 1}]}')
    with pytest.raises(CheckpointCorruptedError, match="older pystreams"):
        read_checkpoint(path)
