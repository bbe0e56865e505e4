"""Naming rules: legal names, and the names of the internal topics a topology creates.

Internal topics are prefixed with the application id so that two apps never share one:

* ``<app>-<node>-repartition``: records of ``<node>`` re-keyed and written so that each
  key lands in the partition its stateful consumer reads;
* ``<app>-<store>-changelog``: the log a store is restored from.
"""

from __future__ import annotations

import re

from .errors import InvalidNameError

#: Kafka's legal topic characters; node, store and app names build topic names, so they obey it too.
_LEGAL = re.compile(r"[A-Za-z0-9._-]+")
#: Kafka's limit on a topic name's length.
MAX_TOPIC_NAME_LENGTH = 249


def check_name(what: str, name: str) -> str:
    """Return ``name`` if Kafka could use it in a topic name, else raise naming ``what``."""
    if not isinstance(name, str) or not _LEGAL.fullmatch(name) or name in (".", ".."):
        raise InvalidNameError(
            f"{what} name {name!r} is not usable: use letters, digits, '.', '_' and '-' only (pass name= to choose another)",
            nodes=[name] if isinstance(name, str) else [],
        )
    if len(name) > MAX_TOPIC_NAME_LENGTH:
        raise InvalidNameError(f"{what} name {name[:40]!r}... is longer than {MAX_TOPIC_NAME_LENGTH} characters")
    return name


def repartition_topic(app_id: str, base: str) -> str:
    return check_name("repartition topic", f"{app_id}-{base}-repartition")


def changelog_topic(app_id: str, store: str) -> str:
    return check_name("changelog topic", f"{app_id}-{store}-changelog")


def repartition_sink_node(base: str) -> str:
    return f"{base}-repartition-sink"


def repartition_source_node(base: str) -> str:
    return f"{base}-repartition-source"
