"""One final result per window with real processes under exactly-once: a windowed count with
``emit="final"``, and one held back by ``suppress(until_window_closes())``, whose workers are
SIGKILLed mid-stream and replaced (on the same state directory, on a wiped one, on a new one),
write every closed window's count exactly once, and right, as ``read_committed`` readers see it.
Emit-final's outputs commit with the stream time that says which windows are out; a
suppression's with the buffer's deletions of the keys it emitted: a new owner neither repeats
nor loses one."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from worker_support import CLICK_GRACE_MS, CLICK_WINDOW_MS, Cluster, check_each_closed_windows_count_appears_once_through_kills

pytestmark = pytest.mark.integration

_APP_HEAD = """
import pystreams as ps

app = ps.App({app_id!r})
clicks = app.topic({source!r}, value=ps.serdes.Text())
"""

#: How each app reaches one result per window: kind -> the app's last lines.
FINAL_RESULTS = {
    "emit-final": """
app.count(clicks, store="clicks-per-window", window=ps.TumblingWindow(size={window}, grace={grace}), emit="final").to({sink!r})
""",
    "suppress": """
counts = app.count(clicks, store="clicks-per-window", window=ps.TumblingWindow(size={window}, grace={grace}))
counts.suppress(ps.until_window_closes(), name="until-closed").to({sink!r})
""",
}


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    running = Cluster(tmp_path, log="kafka")
    try:
        yield running
    finally:
        running.stop()


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(FINAL_RESULTS))
def test_each_closed_windows_count_appears_once_and_right_through_worker_kills(kind: str, cluster: Cluster, tmp_path: Path) -> None:
    run = uuid.uuid4().hex[:8]
    app_id, source, sink = f"{kind}-{run}", f"clicks-{run}", f"final-counts-{run}"
    app = tmp_path / f"{kind.replace('-', '_')}_app.py"
    app.write_text((_APP_HEAD + FINAL_RESULTS[kind]).format(app_id=app_id, source=source, sink=sink, window=CLICK_WINDOW_MS, grace=CLICK_GRACE_MS))
    check_each_closed_windows_count_appears_once_through_kills(cluster, tmp_path, app, source, sink)
