"""Resolving subscriptions (topic names and RE2 patterns) against topic metadata.

The coordinator evaluates every regex with RE2 so all clients, whatever their language, see
one dialect (KIP-848 "Regex Based Subscription"). A pattern must match the whole topic name,
as Kafka's RE2/J ``matches()``; internal topics (``__`` prefix) never match a pattern.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from functools import lru_cache
from uuid import UUID

import re2


class InvalidRegex(ValueError):
    pass


_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # a bad pattern is the client's error, reported in the response


@lru_cache(maxsize=4096)
def compile_regex(pattern: str):
    try:
        return re2.compile(pattern, options=_OPTIONS)
    except re2.error as exc:
        reason = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        raise InvalidRegex(f"SubscribedTopicRegex {pattern!r} is not a valid RE2 regular expression: {reason}") from None


def validate_regex(pattern: str) -> None:
    compile_regex(pattern)


def matching_topics(pattern: str, topic_names: Iterable[str]) -> list[str]:
    regex = compile_regex(pattern)
    return [name for name in topic_names if not name.startswith("__") and regex.fullmatch(name)]


def subscribed_names(names: Iterable[str], pattern: str | None, available: Mapping[str, object]) -> set[str]:
    """The topics of one subscription that exist in ``available`` (name -> metadata)."""
    subscribed = {name for name in names if name in available}
    if pattern:
        subscribed.update(matching_topics(pattern, available))
    return subscribed


def subscribed_topic_ids(names: Iterable[str], pattern: str | None, topics: Mapping[str, object]) -> frozenset[UUID]:
    return frozenset(topics[name].topic_id for name in subscribed_names(names, pattern, topics))
