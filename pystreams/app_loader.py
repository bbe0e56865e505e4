"""Loading an app: find the ``App`` in a file or module named on a command line.

``pystreams worker``, ``spark``, ``query``, ``topology`` and ``dev`` all start from
``load_app("path/to/app.py[:NAME]")``; ``pystreams.app`` re-exports it.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pystreams.app import App


class AppLoadError(ImportError):
    """The app could not be loaded: no such file or module, a syntax error, or an exception
    while its module ran. The message names the file and line, and the cause."""


class AppNotFound(AppLoadError, LookupError):
    """The module loaded, but it does not hold the one ``App`` asked for."""


def load_app(target: str) -> App:
    """Load an app from ``path/to/app.py`` or ``package.module``, optionally ``:attribute``.

    Without an attribute: the module's ``app`` if it is an ``App``, else its only ``App``.
    A file's directory goes on ``sys.path`` first, as when Python runs it as a script.
    Raises :class:`AppLoadError` (with the file, line and cause) when it cannot.
    """
    from pystreams.app import App  # here, not above: pystreams.app re-exports load_app

    location, _, attribute = target.partition(":") if not Path(target).exists() else (target, "", "")
    if location.endswith(".py") or Path(location).exists():
        path = Path(location).resolve()
        if not path.is_file():
            raise AppLoadError(f"no app file {location} (give path/to/app.py or package.module[:NAME])")
        module_name = f"pystreams_app_{path.stem}"
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise AppLoadError(f"cannot load {location} as a Python module")
        module = importlib.util.module_from_spec(spec)
        if str(path.parent) not in sys.path:
            sys.path.insert(0, str(path.parent))
        sys.modules[module_name] = module  # so dataclasses, pickling and msgspec can find it
        try:
            spec.loader.exec_module(module)
        except Exception as error:
            sys.modules.pop(module_name, None)
            raise AppLoadError(_load_failure(location, path, error)) from error
    else:
        try:
            module = importlib.import_module(location)
        except ModuleNotFoundError as error:
            if error.name is not None and location.startswith(error.name):
                raise AppLoadError(f"no app file or module {location!r} ({error})") from error
            raise AppLoadError(f"app module {location}: {type(error).__name__}: {error}") from error
        except SyntaxError as error:
            raise AppLoadError(_load_failure(location, Path(error.filename or location), error)) from error
    if attribute:
        found = getattr(module, attribute, None)
        if not isinstance(found, App):
            raise AppNotFound(f"{target}: {attribute!r} is not a pystreams App")
        return found
    named = getattr(module, "app", None)
    if isinstance(named, App):
        return named
    apps = [value for value in vars(module).values() if isinstance(value, App)]
    if len(apps) != 1:
        raise AppNotFound(f"{target}: expected one pystreams App, found {len(apps)}; use {location}:NAME")
    return apps[0]


def _load_failure(location: str, path: Path, error: BaseException) -> str:
    """``APP line N: the cause`` for an app whose module failed to run (the line in the app
    file itself, where the traceback passes through it)."""
    if isinstance(error, SyntaxError):
        where = f"{location} line {error.lineno}" if error.lineno else location
        text = (error.text or "").rstrip("\n")
        pointer = ""
        if text.strip() and error.offset:
            stripped = text.lstrip()
            pointer = f"\n    {stripped}\n    {' ' * max(0, error.offset - 1 - (len(text) - len(stripped)))}^"
        return f"{where}: {type(error).__name__}: {error.msg}{pointer}\n(fix the app file)"
    import traceback

    line = next((frame.lineno for frame in reversed(traceback.extract_tb(error.__traceback__)) if Path(frame.filename).resolve() == path.resolve()), None)
    where = f"{location} line {line}" if line else location
    return f"{where}: loading the app raised {type(error).__name__}: {error}"
