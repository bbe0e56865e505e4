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
    """kafka-python logs ``ERROR kafka.cluster: Metadata refresh: failed Cancelled`` when one of
    its clients is closed with a metadata request in flight: the close cancelled the request,
    which is no error (operators grep for ERROR). Such a record is DEBUG, shown only when its
    logger shows DEBUG."""
    if record.levelno < logging.ERROR or not record.name.startswith("kafka.") or not isinstance(record.args, tuple):
        return True
    from kafka.errors import Cancelled

    if not any(isinstance(arg, Cancelled) for arg in record.args):
        return True
    record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
    return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
