"""Emit-final with real processes under exactly-once: a windowed count whose workers are
SIGKILLed mid-stream and replaced (on the same state directory, and on a wiped one) writes
every closed window's final count exactly once, and right, as ``read_committed`` readers see
it — the final results and the stream time that says which are out commit together."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from worker_support import CLICK_GRACE_MS, CLICK_WINDOW_MS, Cluster, check_each_closed_windows_count_appears_once_through_kills

pytestmark = pytest.mark.integration

APP_TEMPLATE = """
import pystreams as ps

app = ps.App({app_id!r})
clicks = app.topic({source!r}, value=ps.serdes.Text())
app.count(clicks, store="clicks-per-window", window=ps.TumblingWindow(size={window}, grace={grace}), emit="final").to({sink!r})
"""


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    running = Cluster(tmp_path, log="kafka")
    try:
        yield running
    finally:
        running.stop()


@pytest.mark.slow
def test_each_closed_windows_final_count_appears_once_and_right_through_worker_kills(cluster: Cluster, tmp_path: Path) -> None:
    run = uuid.uuid4().hex[:8]
    app_id, source, sink = f"emit-final-{run}", f"clicks-{run}", f"final-counts-{run}"
    app = tmp_path / "emit_final_app.py"
    app.write_text(APP_TEMPLATE.format(app_id=app_id, source=source, sink=sink, window=CLICK_WINDOW_MS, grace=CLICK_GRACE_MS))
    check_each_closed_windows_count_appears_once_through_kills(cluster, tmp_path, app, source, sink)
