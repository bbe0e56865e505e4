"""``suppress(until_window_closes())`` with real processes under exactly-once: a windowed count
held back by a changelogged suppression buffer, its workers SIGKILLed mid-stream and replaced
(on the same state directory, on a wiped one, on a new one), writes every closed window's
count exactly once, and right, as ``read_committed`` readers see it — the buffer's deletions of
emitted keys and the emitted records commit together, so a new owner neither repeats nor loses
one."""

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
counts = app.count(clicks, store="clicks-per-window", window=ps.TumblingWindow(size={window}, grace={grace}))
counts.suppress(ps.until_window_closes(), name="until-closed").to({sink!r})
"""


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    running = Cluster(tmp_path, log="kafka")
    try:
        yield running
    finally:
        running.stop()


@pytest.mark.slow
def test_each_closed_windows_suppressed_count_appears_once_and_right_through_worker_kills(cluster: Cluster, tmp_path: Path) -> None:
    run = uuid.uuid4().hex[:8]
    app_id, source, sink = f"suppress-{run}", f"clicks-{run}", f"suppressed-counts-{run}"
    app = tmp_path / "suppress_app.py"
    app.write_text(APP_TEMPLATE.format(app_id=app_id, source=source, sink=sink, window=CLICK_WINDOW_MS, grace=CLICK_GRACE_MS))
    check_each_closed_windows_count_appears_once_through_kills(cluster, tmp_path, app, source, sink)
