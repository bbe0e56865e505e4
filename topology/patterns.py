"""RE2 source patterns: one regex dialect for every client (the coordinator uses RE2 too).

A pattern must match a topic name in full, as Kafka's pattern subscriptions do.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache
from typing import Any

import re2

from .errors import InvalidPatternError


@lru_cache(maxsize=256)
def _compile(pattern: str) -> Any:
    return re2.compile(pattern)


def compile_pattern(pattern: str, node: str) -> Any:
    """The compiled pattern; a bad one raises ``InvalidPatternError`` naming the source node."""
    if not isinstance(pattern, str) or not pattern:
        raise InvalidPatternError(f"source {node!r}: pattern must be a non-empty string", nodes=[node])
    try:
        return _compile(pattern)
    except re2.error as error:
        reason = error.args[0] if error.args else error
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        raise InvalidPatternError(f"source {node!r}: invalid RE2 pattern {pattern!r}: {reason}", nodes=[node]) from None


def matching_topics(pattern: str, node: str, topics: Iterable[str]) -> tuple[str, ...]:
    """The topics the pattern matches in full, sorted."""
    compiled = compile_pattern(pattern, node)
    return tuple(sorted(topic for topic in topics if compiled.fullmatch(topic)))
