"""The usual mistakes, said in one or two lines: what is wrong, the option or file involved, and
the fix — never a raw traceback (``--verbose``, or a DEBUG log level, adds it).

Commands raise :class:`CommandError` for what they detect themselves (an unwritable
``--state-dir``, a missing topic, no Java); :func:`explain` also words the errors that arrive
from below (an app file that does not load, pyspark not installed). ``pystreams.cli`` prints
either, and exits 1.
"""

from __future__ import annotations

import argparse
import os
import shutil
import traceback
from pathlib import Path
from typing import Any

from pystreams.app_loader import AppLoadError
from pystreams.topology.errors import MissingSourceError, TopologyError

#: What to install for the Spark runtime.
SPARK_EXTRA_HINT = "pip install 'pystreams[spark]'"


class CommandError(Exception):
    """A mistake the user can fix; the message names the cause, the option or file, the fix."""


def explain(error: BaseException) -> str | None:
    """One or two lines for a known mistake; None for anything else (a bug: its traceback
    is printed as usual)."""
    if isinstance(error, (CommandError, AppLoadError)):
        return str(error)
    if isinstance(error, ModuleNotFoundError) and (error.name or "").split(".")[0] in ("pyspark", "pyarrow", "pandas"):
        return f"the Spark runtime is not installed ({error}): {SPARK_EXTRA_HINT}"
    if isinstance(error, MissingSourceError) and error.topics:
        return missing_topics_message(error.topics, None)
    if isinstance(error, TopologyError):
        return f"the app cannot run: {error}"
    return None


def missing_topics_message(topics: Any, bootstrap_servers: str | None, *, role: str = "source topic") -> str:
    names = sorted(topics)
    where = f" on {bootstrap_servers}" if bootstrap_servers else ""
    plural = "s" if len(names) > 1 else ""
    server = f" --bootstrap-servers {bootstrap_servers}" if bootstrap_servers else ""
    return (
        f"{role}{plural} {', '.join(repr(n) for n in names)} do{'' if plural else 'es'} not exist{where}; "
        f"create {'them' if plural else 'it'} first: pystreams topics --create {' --create '.join(names)}"
        f" --partitions N{server}"
    )


def verbose(args: argparse.Namespace) -> bool:
    """Tracebacks wanted: ``--verbose``, or a DEBUG log level."""
    return bool(getattr(args, "verbose", False)) or str(getattr(args, "log_level", "")).upper() == "DEBUG"


def report(command: str, error: BaseException, message: str, *, show_traceback: bool) -> None:
    import sys

    if show_traceback:
        traceback.print_exception(error, file=sys.stderr)
    print(f"pystreams {command}: error: {message}", file=sys.stderr)
    if not show_traceback:
        print(f"pystreams {command}: (--verbose shows the traceback)", file=sys.stderr)


def check_writable_directory(path: str | os.PathLike[str], option: str) -> Path:
    """``path`` exists (created if needed) and this process can write in it."""
    directory = Path(path)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / f".pystreams-write-check-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:
        reason = error.strerror or str(error)
        raise CommandError(
            f"{option} {path}: cannot write there ({reason}); choose a directory this user can write"
            + (" (or leave it unset for a temporary one)" if option == "--state-dir" else "")
        ) from None
    return directory


def check_java() -> None:
    """Spark's JVM needs Java (17): JAVA_HOME or ``java`` on PATH."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        java = Path(java_home) / "bin" / "java"
        if not java.exists():
            raise CommandError(f"JAVA_HOME={java_home} has no bin/java; point JAVA_HOME at a Java 17 installation")
        return
    if shutil.which("java") is None:
        raise CommandError(
            "Spark needs Java 17, and none was found (JAVA_HOME is unset and no java is on PATH); "
            "install a JDK 17 (e.g. apt-get install openjdk-17-jdk-headless) or set JAVA_HOME"
        )
