"""How the long-running commands (coordinator, worker, dev) log: to stderr at the level asked,
kafka-python's own loggers at WARNING or above, and no ERROR for what a clean stop does."""

from __future__ import annotations

import logging
import sys

_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure_logging(level: str) -> None:
    logging.basicConfig(level=getattr(logging, level, logging.INFO), stream=sys.stderr, format=_FORMAT)
    logging.getLogger("kafka").setLevel(max(logging.WARNING, logging.getLogger().level))
    for handler in logging.getLogger().handlers:
        handler.addFilter(cancelled_by_close_is_debug)


def cancelled_by_close_is_debug(record: logging.LogRecord) -> bool:
    """What kafka-python logs as an ERROR when one of its clients is closed mid-request, which
    is no error (operators grep for ERROR), becomes DEBUG, shown only when its logger shows
    DEBUG:

    * ``ERROR kafka.cluster: Metadata refresh: failed Cancelled``: the close cancelled a
      metadata request in flight;
    * ``ERROR kafka.net.transport: <... (closed)>: Error receiving network data``: the close
      shut the socket while the transport's read task was about to read it."""
    if record.levelno < logging.ERROR or not record.name.startswith("kafka.") or not isinstance(record.args, tuple):
        return True
    from kafka.errors import Cancelled

    cancelled = any(isinstance(arg, Cancelled) for arg in record.args)
    read_after_close = record.name == "kafka.net.transport" and any(_is_closed_transport(arg) for arg in record.args)
    if not (cancelled or read_after_close):
        return True
    record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
    return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


def _is_closed_transport(arg: object) -> bool:
    is_closing = getattr(arg, "is_closing", None)
    return callable(is_closing) and is_closing() is True
