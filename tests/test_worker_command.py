"""``pystreams worker`` refuses bad high-availability settings with the reason, before it
connects to anything."""

from __future__ import annotations

import argparse

import pytest

from pystreams.commands import worker

APP = "tests/apps/ha_keys.py"
REQUIRED = ["--bootstrap-servers", "127.0.0.1:1", "--coordinator", "127.0.0.1:1"]


def test_a_client_tag_without_a_value_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        worker.main([APP, *REQUIRED, "--client-tag", "zone"])
    assert exited.value.code == 2
    assert "expected KEY=VALUE, got 'zone'" in capsys.readouterr().err


def test_a_negative_standby_count_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        worker.main([APP, *REQUIRED, "--num-standby-replicas", "-1"])
    assert exited.value.code == 2
    assert "must be >= 0: -1" in capsys.readouterr().err


def test_bad_client_tags_in_the_environment_name_the_variable(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("PYSTREAMS_CLIENT_TAGS", "zone=a,rack")
    assert worker.main([APP, *REQUIRED]) == 2
    assert "PYSTREAMS_CLIENT_TAGS: expected KEY=VALUE, got 'rack'" in capsys.readouterr().err


def test_duplicate_rack_aware_tags_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert worker.main([APP, *REQUIRED, "--rack-aware-assignment-tags", "zone,zone"]) == 2
    assert "rack.aware.assignment.tags has duplicates" in capsys.readouterr().err


def parsed(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    worker.configure(parser)
    return parser.parse_args(list(argv))


def test_options_keep_their_names_variables_and_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Kubernetes manifests and scripts set these: names, variables and defaults are pinned."""
    for name in ("PYSTREAMS_THREADS", "PYSTREAMS_GROUP_PROTOCOL", "PYSTREAMS_SHUTDOWN_APPLICATION_ON_ERROR", "PYSTREAMS_STATE_DIR"):
        monkeypatch.delenv(name, raising=False)
    defaults = parsed()
    assert (defaults.threads, defaults.coordinator_connect_timeout_ms, defaults.session_timeout_ms, defaults.heartbeat_interval_ms) == (1, 60000, 45000, 3000)
    assert (defaults.group_protocol, defaults.log_level, defaults.user_endpoint, defaults.max_warmup_replicas) == ("consumer", "INFO", "", 2)
    assert (defaults.state_dir, defaults.commit_interval_ms, defaults.processing_guarantee, defaults.http_port) == (None, None, None, None)
    assert defaults.shutdown_application_on_error is False
    assert defaults.client_tag is None

    monkeypatch.setenv("PYSTREAMS_THREADS", "3")
    monkeypatch.setenv("PYSTREAMS_GROUP_PROTOCOL", "CLASSIC")
    monkeypatch.setenv("PYSTREAMS_SHUTDOWN_APPLICATION_ON_ERROR", "true")
    monkeypatch.setenv("PYSTREAMS_STATE_DIR", "")  # empty: unset
    from_env = parsed()
    assert (from_env.threads, from_env.group_protocol, from_env.shutdown_application_on_error, from_env.state_dir) == (3, "classic", True, None)
    assert parsed("--threads", "2").threads == 2  # the flag wins


def test_help_names_every_options_variable_and_default(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser(prog="pystreams worker")
    worker.configure(parser)
    for action in parser._actions:
        if action.dest in ("help", "verbose"):
            continue
        assert action.help is not None and "env PYSTREAMS_" in action.help, action.dest
    with pytest.raises(SystemExit):
        parser.parse_args(["--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "(default: 1, env PYSTREAMS_THREADS)" in shown
    assert "(default: 60000, env PYSTREAMS_COORDINATOR_CONNECT_TIMEOUT_MS)" in shown
    assert "PYSTREAMS_CLIENT_TAGS --client-tag" in shown  # the table of variables


def test_a_worker_loads_no_module_it_does_not_run() -> None:
    """Every module a worker imports delays its start (and a rolling restart's pause): what
    it needs only with an option (HTTP, SCRAM on the server side) or never (Spark, the
    coordinator's server) stays unloaded until then."""
    import subprocess
    import sys

    code = (
        "import sys, pystreams.commands.worker, pystreams.worker.process, pystreams.worker.engine; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'scramp', 'asn1crypto', 'aiohttp', 'prometheus_client', 'pyspark'}) "
        "+ sorted(m for m in sys.modules if m.startswith(('pystreams.coordinator', 'pystreams.spark', 'pystreams.sim'))))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "[]"


def test_a_worker_hides_its_modules_from_the_garbage_collector() -> None:
    """Frozen, the objects of every module a worker loaded are skipped by the collection at
    exit (a quarter of a second of each stop) and by the full collections while it runs."""
    import subprocess
    import sys

    code = (
        "import gc; from pystreams.commands import worker; "
        f"status = worker.main([{APP!r}, *{REQUIRED!r}, '--rack-aware-assignment-tags', 'zone,zone']); "
        "print(status, gc.get_freeze_count() > 1000)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["2", "True"]
