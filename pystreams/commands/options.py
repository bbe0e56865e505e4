"""Value parsers the commands share for argparse options and PYSTREAMS_* variables."""
from __future__ import annotations

import argparse
import re

#: A decimal integer as Kafka's config parser reads one (Python's int() also takes "5_000", "٣").
_DECIMAL = re.compile(r"[+-]?[0-9]+")


def decimal(text: str, what: str = "an integer") -> int:
    if not _DECIMAL.fullmatch(text.strip()):
        raise argparse.ArgumentTypeError(f"not {what}: {text!r}")
    return int(text.strip())


def port(text: str) -> int:
    """0-65535; 0 asks for a free port."""
    value = decimal(text, "a port number")
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port out of range 0-65535: {value}")
    return value


def host_port(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (IPv6 hosts in brackets); an empty host means every interface."""
    host, sep, number = text.strip().rpartition(":")
    if not sep or not _DECIMAL.fullmatch(number) or number[0] in "+-" or not 0 <= int(number) <= 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]") or "0.0.0.0", int(number)


def _int_at_least(text: str, minimum: int) -> int:
    value = decimal(text)
    if value < minimum:
        raise argparse.ArgumentTypeError(f"must be >= {minimum}: {value}")
    return value


def positive_int(text: str) -> int:
    return _int_at_least(text, 1)


def non_negative_int(text: str) -> int:
    return _int_at_least(text, 0)


def key_value(text: str) -> tuple[str, str]:
    """``KEY=VALUE`` (client tags)."""
    key, sep, value = text.strip().partition("=")
    if not sep or not key.strip() or not value.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value.strip()


def key_values(text: str) -> list[tuple[str, str]]:
    """Comma-separated ``KEY=VALUE`` pairs, as an environment variable holds them."""
    return [key_value(item) for item in text.split(",") if item.strip()]


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {value:g}")
    return value
