"""A coordinator process for the benchmarks that run real processes (``first_output``,
``rebalance_speed``): started on the Kafka log of a broker, on loopback, waited for."""

from __future__ import annotations

import socket
import subprocess
import sys
import time


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
