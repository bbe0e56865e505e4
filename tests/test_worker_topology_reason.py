"""A worker restarted on the same state directory with a different topology says
TopologyChanged when it joins (a rolling deploy of new code); otherwise no reason."""

from __future__ import annotations

from pathlib import Path

from pystreams.assignors.streams import MemberReason

from pystreams.app import App
from pystreams.worker.process import topology_change_reason


def _topology(with_filter: bool):
    app = App("rolling")
    stream = app.topic("in")
    if with_filter:
        stream = stream.filter(lambda key, value: value is not None)
    stream.to("out")
    return app.topology()


def test_first_run_and_same_topology_send_no_reason(tmp_path: Path) -> None:
    assert topology_change_reason(tmp_path, _topology(False)) is MemberReason.NONE
    assert topology_change_reason(tmp_path, _topology(False)) is MemberReason.NONE


def test_a_new_topology_on_the_same_state_directory_sends_topology_changed(tmp_path: Path) -> None:
    old, new = _topology(False), _topology(True)
    assert old.hash != new.hash
    topology_change_reason(tmp_path, old)
    assert topology_change_reason(tmp_path, new) is MemberReason.TOPOLOGY_CHANGED
    # Said once: the next start with the same new code has nothing to report.
    assert topology_change_reason(tmp_path, new) is MemberReason.NONE
