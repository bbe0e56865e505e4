"""Value parsers the commands share for argparse options and PYSTREAMS_* variables."""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

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


# --- error policies (Kafka Streams' exception handlers) ------------------------------------------

ERROR_POLICIES = ("fail", "log-and-continue", "dead-letter")


def error_policy(text: str) -> str:
    if text not in ERROR_POLICIES:
        raise argparse.ArgumentTypeError(f"not an error policy: {text!r} (choose from {', '.join(ERROR_POLICIES)})")
    return text


@dataclass(frozen=True)
class EnvOption:
    """One command-line option and the ``PYSTREAMS_*`` variable that sets it when the flag is
    not given, declared once: ``add_env_options`` makes the argparse option, its default and
    its help (which names the variable and the default) from it."""

    flags: str
    env: str
    #: As the command line would give it (argparse applies ``type`` to it); None: unset.
    default: str | None
    help: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    #: Turns the variable's (or the default's) text into the option's value, for options whose
    #: argparse ``type`` does not apply to a default (flags).
    from_env: Callable[[str], Any] | None = None
    #: False: the command reads the variable itself (it merges with repeated flags).
    env_sets_default: bool = True


def env_default(option: EnvOption) -> Any:
    """The option's value when its flag is not given: its variable's, else its default. An
    empty variable counts as unset (Kubernetes gives ``$(NAME)`` of a missing field as "")."""
    text = (os.environ.get(option.env) if option.env_sets_default else None) or option.default
    return option.from_env(text) if option.from_env is not None and text is not None else text


def add_env_options(parser: argparse.ArgumentParser | Any, listed: Iterable[EnvOption]) -> None:
    """Add each option with its environment default and a help that names both."""
    for option in listed:
        shown = f"default: {option.default}, " if option.default is not None else ""
        parser.add_argument(option.flags, default=env_default(option), help=f"{option.help} ({shown}env {option.env})", **option.kwargs)


def env_epilog(listed: Iterable[EnvOption]) -> str:
    """The ``--help`` table of variables and the options they set."""
    lines = ["environment variables (a command-line option wins over its variable):"]
    lines += [f"  {option.env:<38} {option.flags}" for option in listed]
    return "\n".join(lines) + "\n"


def add_error_policy_options(parser: argparse.ArgumentParser) -> None:
    """``--deserialization-errors``, ``--processing-errors`` and ``--dead-letter-topic``; each
    also reads ``PYSTREAMS_*``. Unset: the app's own (``App(...)``, default ``fail``)."""
    import os

    group = parser.add_argument_group(
        "bad records",
        "what a record that cannot be deserialized or processed does (Kafka Streams' "
        "exception handlers): fail stops (the record is met again by the task's next owner), "
        "log-and-continue skips it with a warning, dead-letter writes it to --dead-letter-topic and skips it; "
        "unset: the app's own (App(...), default fail); a source's own policy wins over these",
    )
    group.add_argument(
        "--deserialization-errors",
        type=error_policy,
        metavar="{" + ",".join(ERROR_POLICIES) + "}",
        default=os.environ.get("PYSTREAMS_DESERIALIZATION_ERRORS") or None,
        help="default.deserialization.exception.handler (env PYSTREAMS_DESERIALIZATION_ERRORS)",
    )
    group.add_argument(
        "--processing-errors",
        type=error_policy,
        metavar="{" + ",".join(ERROR_POLICIES) + "}",
        default=os.environ.get("PYSTREAMS_PROCESSING_ERRORS") or None,
        help="processing.exception.handler: exceptions of the app's functions (env PYSTREAMS_PROCESSING_ERRORS)",
    )
    group.add_argument(
        "--dead-letter-topic",
        default=os.environ.get("PYSTREAMS_DEAD_LETTER_TOPIC") or None,
        metavar="TOPIC",
        help="errors.dead.letter.queue.topic.name: where dead letters go, with "
        "headers pystreams.error.* saying where from and why; it must exist "
        "(env PYSTREAMS_DEAD_LETTER_TOPIC)",
    )


# --- client security (kafka-python's names) -------------------------------------------------------

_SECURITY_FIELDS = (
    # (flag suffix, ClientSecurity field, environment suffix, help)
    ("security-protocol", "security_protocol", "SECURITY_PROTOCOL", "PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL"),
    ("ssl-cafile", "ssl_cafile", "SSL_CAFILE", "CA bundle (PEM) to verify the server's certificate"),
    ("ssl-certfile", "ssl_certfile", "SSL_CERTFILE", "client certificate (PEM) for mutual TLS"),
    ("ssl-keyfile", "ssl_keyfile", "SSL_KEYFILE", "the client certificate's private key (PEM)"),
    ("sasl-mechanism", "sasl_mechanism", "SASL_MECHANISM", "PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512"),
    ("sasl-plain-username", "sasl_plain_username", "SASL_PLAIN_USERNAME", "SASL user"),
    ("sasl-plain-password", "sasl_plain_password", "SASL_PLAIN_PASSWORD", "SASL password (prefer the environment variable)"),
)


def add_client_security_options(parser: argparse.ArgumentParser, *, prefix: str = "", what: str = "the coordinator") -> None:
    """``--[PREFIX]security-protocol`` and friends; each also reads ``PYSTREAMS_[PREFIX]...``.
    With a prefix (``broker-``), an option left unset falls back to the unprefixed one."""
    import os

    group = parser.add_argument_group(f"security toward {what}")
    env_prefix = "PYSTREAMS_" + prefix.upper().replace("-", "_")
    for flag, name, env, help_text in _SECURITY_FIELDS:
        group.add_argument(
            f"--{prefix}{flag}",
            dest=f"{prefix.replace('-', '_')}{name}",
            default=os.environ.get(env_prefix + env),
            metavar=name.upper().split("_", 1)[-1],
            help=f"{help_text} (env {env_prefix + env})",
        )
    group.add_argument(
        f"--{prefix}no-ssl-check-hostname",
        dest=f"{prefix.replace('-', '_')}no_ssl_check_hostname",
        action="store_true",
        default=os.environ.get(env_prefix + "SSL_CHECK_HOSTNAME", "").lower() in ("0", "false", "no"),
        help=f"do not check the server certificate's host name (env {env_prefix}SSL_CHECK_HOSTNAME=false)",
    )


def client_security_from_args(args: argparse.Namespace, *, prefix: str = "", fallback: Any = None) -> Any:
    """The ClientSecurity the options describe (ValueError with the reason if inconsistent)."""
    from pystreams.protocol.security import ClientSecurity

    dest = prefix.replace("-", "_")
    values: dict[str, Any] = {}
    for _, name, _, _ in _SECURITY_FIELDS:
        value = getattr(args, dest + name, None)
        if value is None and fallback is not None:
            value = getattr(fallback, name)
        if value is not None:
            values[name] = value.upper() if name in ("security_protocol", "sasl_mechanism") else value
    no_check = getattr(args, dest + "no_ssl_check_hostname", False)
    values["ssl_check_hostname"] = not no_check if (no_check or fallback is None) else fallback.ssl_check_hostname
    return ClientSecurity(**values)
