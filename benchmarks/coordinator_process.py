"""A coordinator process for the benchmarks that run real processes (``first_output``,
``rebalance_speed``): started on the Kafka log of a broker, on loopback, waited for; and the
command line of a standalone word-count worker."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

WORDCOUNT = Path(__file__).resolve().parent.parent / "examples" / "wordcount.py"


def wait_listening(port: int, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {port}")


def start_coordinator(bootstrap: str, port: int, *options: str) -> subprocess.Popen[bytes]:
    """``pystreams coordinator`` on ``127.0.0.1:port`` with ``options``, once it listens."""
    process = subprocess.Popen(
        [sys.executable, "-m", "pystreams", "coordinator", "--bootstrap-servers", bootstrap, "--log", "kafka", "--listen", f"127.0.0.1:{port}", *options],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_listening(port)
    except BaseException:
        process.kill()
        process.wait()
        raise
    return process


def wordcount_worker(bootstrap: str, coordinator: str, state_dir: Path) -> list[str]:
    """The command line of a standalone ``pystreams worker examples/wordcount.py``."""
    return [
        sys.executable,
        "-m",
        "pystreams",
        "worker",
        str(WORDCOUNT),
        "--bootstrap-servers",
        bootstrap,
        "--coordinator",
        coordinator,
        "--state-dir",
        str(state_dir),
    ]
