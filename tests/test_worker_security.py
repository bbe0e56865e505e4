"""A worker fleet over SASL_SSL: real processes, word count end to end.

The coordinator listens on SASL_SSL with a certificate from a throwaway CA, SCRAM credentials
written by ``pystreams credentials`` and an ACL file; the embedded broker stays PLAINTEXT (it
has no TLS), which is exactly what ``--broker-security-protocol`` is for. Workers authenticate
with SCRAM-SHA-512, their password in the environment, never on the command line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme
from worker_support import Workers, fleet_of, listening, wait_for

from pystreams.broker import EmbeddedBroker, free_port
from pystreams.commands.dev import LatestValueReader, count_words, ensure_input_topics, produce_lines

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "examples" / "wordcount.py"
CORPUS = (ROOT / "examples" / "data" / "corpus.txt").read_text(encoding="utf-8").splitlines()
PASSWORD = "wordcount-secret"


@pytest.fixture
def secured_cluster(tmp_path: Path) -> Iterator[tuple[str, str, dict[str, str]]]:
    """(bootstrap servers, coordinator address, the workers' security environment)."""
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "server.pem"))
    credentials = tmp_path / "credentials.json"
    made = subprocess.run(
        [sys.executable, "-m", "pystreams", "credentials", "--file", str(credentials), "--add", "wordcount", "--password-env", "WORKER_PASSWORD"],
        env=dict(os.environ, WORKER_PASSWORD=PASSWORD),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert made.returncode == 0, made.stderr
    acls = tmp_path / "acls.json"
    acls.write_text(
        json.dumps(
            {
                "acls": [
                    {"principal": "User:wordcount", "operation": "Read", "resource_type": "Group", "resource_name": "wordcount"},
                ]
            }
        )
    )
    broker = EmbeddedBroker(port=None)
    broker.start()
    port = free_port()
    log = (tmp_path / "coordinator.log").open("wb")
    coordinator = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pystreams",
            "coordinator",
            "--log",
            "memory",
            "--bootstrap-servers",
            broker.bootstrap_servers,
            "--listen",
            f"SASL_SSL://127.0.0.1:{port}",
            "--ssl-certfile",
            str(tmp_path / "server.pem"),
            "--sasl-credentials-file",
            str(credentials),
            "--acl-file",
            str(acls),
            "--heartbeat-interval-ms",
            "300",
            "--session-timeout-ms",
            "3000",
            "--metadata-refresh-ms",
            "500",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    environment = {
        "PYSTREAMS_SECURITY_PROTOCOL": "SASL_SSL",
        "PYSTREAMS_SSL_CAFILE": str(tmp_path / "ca.pem"),
        "PYSTREAMS_SASL_MECHANISM": "SCRAM-SHA-512",
        "PYSTREAMS_SASL_PLAIN_USERNAME": "wordcount",
        "PYSTREAMS_SASL_PLAIN_PASSWORD": PASSWORD,
        "PYSTREAMS_BROKER_SECURITY_PROTOCOL": "PLAINTEXT",
    }
    try:
        wait_for(lambda: listening(port), 20, "the coordinator to listen")
        ensure_input_topics(broker.bootstrap_servers, ["text-lines"], partitions=4)
        yield broker.bootstrap_servers, f"127.0.0.1:{port}", environment
    finally:
        coordinator.terminate()
        coordinator.wait(10)
        log.close()
        broker.stop()


def test_a_worker_fleet_counts_words_over_sasl_ssl(secured_cluster: tuple[str, str, dict[str, str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bootstrap, coordinator, environment = secured_cluster
    for name, value in environment.items():
        monkeypatch.setenv(name, value)  # the workers inherit it
    expected = dict(count_words(CORPUS))
    for workers in fleet_of(Workers(bootstrap, coordinator, tmp_path, APP)):
        workers.start()
        workers.start()
        produce_lines(bootstrap, "text-lines", CORPUS)
        reader = LatestValueReader(bootstrap, "word-counts")
        latest: dict[str, int] = {}

        def counted(reader: LatestValueReader = reader, latest: dict[str, int] = latest) -> bool:
            latest.update(reader.read_more(0.3))
            return latest == expected

        try:
            wait_for(counted, 60, "the exact counts")
        finally:
            reader.close()
        assert latest == expected, workers.log_tails()
        assert workers.stop_all() == [0, 0]
    coordinator_log = (tmp_path / "coordinator.log").read_text(errors="replace")
    assert "authenticated as User:wordcount" in coordinator_log
