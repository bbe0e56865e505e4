"""Resolving subscriptions (topic names and RE2 patterns) against topic metadata.

The coordinator evaluates every regex with RE2 so all clients, whatever their language, see
one dialect (KIP-848 "Regex Based Subscription"). A pattern must match the whole topic name,
as Kafka's RE2/J ``matches()``; internal topics (``__`` prefix) never match a pattern.

Patterns come from clients, so what they can cost is bounded: a pattern is at most
``max_pattern_bytes`` long, RE2 may use at most ``RE2_MAX_MEM`` for one compiled program, and the
compiled patterns are kept in an LRU cache bounded by an estimate of their size in bytes
(``configure``), not by their count: a stream of distinct large patterns evicts, it does not pile
up.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Protocol
from uuid import UUID

import re2


class InvalidRegex(ValueError):
    pass


#: The memory one compiled RE2 program (and its DFA cache) may use; larger ones fail to compile.
RE2_MAX_MEM = 1 << 20
#: Bytes an RE2 instruction costs, for the cache's size estimate (instructions, forward and
#: reverse programs, and the DFA states RE2 keeps per program, measured roughly).
_BYTES_PER_INSTRUCTION = 64
_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # a bad pattern is the client's error, reported in the response
_OPTIONS.max_mem = RE2_MAX_MEM


class RegexCache:
    def __init__(self, max_bytes: int = 32 << 20, max_pattern_bytes: int = 4096) -> None:
        self.max_bytes = max_bytes
        self.max_pattern_bytes = max_pattern_bytes
        self.bytes = 0
        self._compiled: OrderedDict[str, tuple[object, int]] = OrderedDict()

    def compile(self, pattern: str):
        hit = self._compiled.get(pattern)
        if hit is not None:
            self._compiled.move_to_end(pattern)
            return hit[0]
        size = len(pattern.encode("utf-8", "surrogatepass"))
        if size > self.max_pattern_bytes:
            raise InvalidRegex(f"SubscribedTopicRegex is {size} bytes long; this coordinator accepts at most {self.max_pattern_bytes}.")
        try:
            regex = re2.compile(pattern, options=_OPTIONS)
        except re2.error as exc:
            reason = exc.args[0].decode() if exc.args and isinstance(exc.args[0], bytes) else str(exc)
            raise InvalidRegex(f"SubscribedTopicRegex {pattern!r} is not a valid RE2 regular expression: {reason}") from None
        cost = size + (regex.programsize + regex.reverseprogramsize) * _BYTES_PER_INSTRUCTION
        self._compiled[pattern] = (regex, cost)
        self.bytes += cost
        while self.bytes > self.max_bytes and len(self._compiled) > 1:
            _, (_, evicted) = self._compiled.popitem(last=False)
            self.bytes -= evicted
        return regex

    def __len__(self) -> int:
        return len(self._compiled)


_cache = RegexCache()


def configure(*, max_bytes: int, max_pattern_bytes: int) -> None:
    """Bound the process's regex cache (the coordinator command calls this at start)."""
    global _cache
    _cache = RegexCache(max_bytes, max_pattern_bytes)


def regex_cache() -> RegexCache:
    return _cache


def compile_regex(pattern: str):
    return _cache.compile(pattern)


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


class _TopicWithId(Protocol):
    @property
    def topic_id(self) -> UUID: ...


def subscribed_topic_ids(names: Iterable[str], pattern: str | None, topics: Mapping[str, _TopicWithId]) -> frozenset[UUID]:
    return frozenset(topics[name].topic_id for name in subscribed_names(names, pattern, topics))
