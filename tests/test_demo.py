"""The README's main example runs end to end as a real process."""

import subprocess
import sys


def test_demo_runs_the_scripted_rebalance_and_replays_to_the_same_state():
    done = subprocess.run([sys.executable, "-m", "pystreams", "demo"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "revoking=[foo-2]" in out  # the incremental revocation is visible
    assert "B - partitions=[foo-0, foo-3, foo-4]" in out  # A's partitions moved after its session expired
    assert "a fresh shard replaying them has the same state: True" in out
