"""The usual first-hour mistakes, as a user meets them (real ``pystreams`` processes): each ends
the command with exit status 1 and two lines on stderr — the cause with the file or option
involved and the fix, then where the traceback is — and the traceback only with ``--verbose``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pystreams.broker import EmbeddedBroker
from pystreams.cluster import ClusterMetadata, TopicSpec

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
JSON_EVENTS = ROOT / "tests" / "apps" / "json_events.py"  # reads `events`, which the broker below lacks
WORDCOUNT = ROOT / "examples" / "wordcount.py"


@pytest.fixture(scope="module")
def bootstrap() -> Iterator[str]:
    broker = EmbeddedBroker(port=None)
    broker.start()
    try:
        with ClusterMetadata(broker.bootstrap_servers) as cluster:
            cluster.ensure_topics([TopicSpec("text-lines", 1), TopicSpec("word-counts", 1)])
        yield broker.bootstrap_servers
    finally:
        broker.stop()


def pystreams(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pystreams", *args], cwd=cwd, capture_output=True, text=True, timeout=120, env=None if env is None else {**os.environ, **env}
    )


def said_briefly(done: subprocess.CompletedProcess[str], command: str) -> str:
    """The one error line, after checking the shape every usual mistake has."""
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert "Traceback" not in done.stderr, done.stderr
    assert lines[-1] == f"pystreams {command}: (--verbose shows the traceback)", done.stderr
    (error,) = [line for line in lines if line.startswith(f"pystreams {command}: error: ")]
    return error.removeprefix(f"pystreams {command}: error: ")


@pytest.mark.parametrize("command", ["topology", "worker", "spark"])
def test_an_app_file_with_a_syntax_error_is_named_with_its_line(tmp_path: Path, command: str) -> None:
    (tmp_path / "broken.py").write_text("from pystreams.app import App\napp = App('broken')\nlines = app.topic('t'\n")
    extra = ["--bootstrap-servers", "127.0.0.1:1", "--coordinator", "127.0.0.1:2"] if command == "worker" else []
    done = pystreams(command, "broken.py", *extra, cwd=tmp_path)
    assert said_briefly(done, command) == "broken.py line 3: SyntaxError: '(' was never closed"
    assert "lines = app.topic('t'" in done.stderr and "(fix the app file)" in done.stderr

    verbose = pystreams(command, "broken.py", *extra, "--verbose", cwd=tmp_path)
    assert verbose.returncode == 1 and "Traceback (most recent call last)" in verbose.stderr


def test_a_missing_source_topic_says_how_to_create_it(tmp_path: Path, bootstrap: str) -> None:
    done = pystreams(
        "worker", str(JSON_EVENTS), "--bootstrap-servers", bootstrap, "--coordinator", "127.0.0.1:2", "--state-dir", str(tmp_path / "state"), cwd=tmp_path
    )
    assert said_briefly(done, "worker") == (
        f"source topic 'events' does not exist on {bootstrap}; create it first: pystreams topics --create events --partitions N --bootstrap-servers {bootstrap}"
    )


def test_spark_names_a_missing_source_topic_before_starting_a_session(tmp_path: Path, bootstrap: str) -> None:
    (tmp_path / "counts.py").write_text("from pystreams.app import App\napp = App('counts')\napp.topic('events').count(store='counts').to('event-counts')\n")
    done = pystreams("spark", "counts.py", "--bootstrap-servers", bootstrap, "--once", cwd=tmp_path)
    assert said_briefly(done, "spark") == (
        f"source topic 'events' does not exist on {bootstrap}; create it first: pystreams topics --create events --partitions N --bootstrap-servers {bootstrap}"
    )
    assert "Spark" not in done.stderr.split("error:")[0]  # no session was started


def test_a_state_dir_that_cannot_be_written_is_named(tmp_path: Path, bootstrap: str) -> None:
    (tmp_path / "a-file").write_text("not a directory")
    done = pystreams("worker", str(JSON_EVENTS), "--bootstrap-servers", bootstrap, "--coordinator", "127.0.0.1:2", "--state-dir", "a-file/state", cwd=tmp_path)
    error = said_briefly(done, "worker")
    assert error.startswith("--state-dir a-file/state: cannot write there (Not a directory); choose a directory")


def test_spark_without_pyspark_says_which_extra_to_install(tmp_path: Path, bootstrap: str) -> None:
    # A pyspark that cannot be imported, as on an install without the extra.
    shadow = tmp_path / "no-pyspark"
    shadow.mkdir()
    (shadow / "pyspark.py").write_text("raise ModuleNotFoundError(\"No module named 'pyspark'\", name='pyspark')\n")
    done = pystreams(
        "spark",
        str(WORDCOUNT),
        "--bootstrap-servers",
        bootstrap,
        cwd=tmp_path,
        env={"PYTHONPATH": os.pathsep.join([str(shadow), os.environ.get("PYTHONPATH", "")])},
    )
    assert said_briefly(done, "spark") == "the Spark runtime is not installed (No module named 'pyspark'): pip install 'pystreams[spark]'"


def test_spark_without_java_says_so_before_starting_a_session(tmp_path: Path, bootstrap: str) -> None:
    done = pystreams("spark", str(WORDCOUNT), "--bootstrap-servers", bootstrap, cwd=tmp_path, env={"PATH": str(tmp_path), "JAVA_HOME": ""})
    assert said_briefly(done, "spark").startswith("Spark needs Java 17, and none was found (JAVA_HOME is unset and no java is on PATH); install a JDK 17")
    broken_home = pystreams("spark", str(WORDCOUNT), "--bootstrap-servers", bootstrap, cwd=tmp_path, env={"JAVA_HOME": str(tmp_path)})
    assert said_briefly(broken_home, "spark") == (f"JAVA_HOME={tmp_path} has no bin/java; point JAVA_HOME at a Java 17 installation")
