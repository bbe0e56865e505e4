"""``pystreams query APP STORE [KEY]``: read an app's state store from the workers that host it
(interactive queries, routed by the assignment's PartitionsByHost), with Kafka Streams'
read-only operations for each kind of store:

* key-value store: ``KEY`` reads one key (``get``); ``--from K --to K`` a range (both
  inclusive, either optional), ``--prefix P`` a prefix scan, ``--all`` every entry — from
  every task, ordered by serialized key;
* window store: ``KEY`` (the grouping key) reads its windows whose start lies in
  ``[--from-time, --to-time]`` (epoch ms, either optional), oldest first (``fetch``);
* session store: ``KEY`` (the grouping key) reads all its sessions (``fetch``).

Keys (and --from/--to/--prefix) are text, read the way the store's key serde expects: as is for
Text, a number for Int, JSON for Json (plain text if it is not JSON). One key's value is printed
as JSON when it can be; windows, sessions and scans print one JSON object per line.
Exit status: 0 found, 1 nothing for the key (or the scan), 3 not available yet (restoring or
moving), 2 bad usage or an unanswerable query.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import msgspec

from pystreams import serdes


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("app", help="path/to/app.py or module[:attribute]")
    parser.add_argument("store", help="the store's name")
    parser.add_argument("key", nargs="?", default=None, help="the key (a window or session store's grouping key), as text (see the command's help)")
    parser.add_argument("--from", dest="key_from", metavar="KEY", help="key-value store: range scan from KEY (inclusive)")
    parser.add_argument("--to", dest="key_to", metavar="KEY", help="key-value store: range scan to KEY (inclusive)")
    parser.add_argument("--prefix", metavar="P", help="key-value store: the keys starting with P")
    parser.add_argument("--all", action="store_true", help="key-value store: every entry")
    parser.add_argument("--from-time", type=int, metavar="MS", help="window store: windows starting at or after MS")
    parser.add_argument("--to-time", type=int, metavar="MS", help="window store: windows starting at or before MS")
    parser.add_argument(
        "--endpoint",
        action="append",
        default=None,
        metavar="HOST:PORT",
        help="a worker's user endpoint; repeatable (env PYSTREAMS_QUERY_ENDPOINTS, comma-separated)",
    )
    parser.add_argument("--stale", action="store_true", help="standby replicas may answer (possibly behind)")
    parser.add_argument("--timeout-s", type=float, default=10.0, metavar="S", help="how long a restoring or moving task may be waited for (default 10)")


def parse_key(serde: serdes.Serde, text: str) -> Any:
    if isinstance(serde, serdes.Int):
        return int(text)
    if isinstance(serde, serdes.Json):
        try:
            return json.loads(text)
        except ValueError:
            return text
    if isinstance(serde, serdes.Bytes):
        return text.encode()
    return text


def run(args: argparse.Namespace) -> int:
    from pystreams.app_loader import load_app
    from pystreams.queries import NotAvailableYet, QueryError, endpoints_from
    from pystreams.topology.ir import StoreKind

    endpoints = endpoints_from(args.endpoint)
    if not endpoints:
        print("pystreams query: give --endpoint HOST:PORT (or PYSTREAMS_QUERY_ENDPOINTS)", file=sys.stderr)
        return 2
    app = load_app(args.app)
    spec = app.topology().store_spec(args.store)
    if spec is None:
        print(f"pystreams query: app {app.app_id!r} has no store named {args.store!r}", file=sys.stderr)
        return 2
    scan = args.key_from is not None or args.key_to is not None or args.prefix is not None or args.all
    usage = _usage_error(spec.kind, args, scan)
    if usage:
        print(f"pystreams query: store {args.store!r} is a {spec.kind} store: {usage}", file=sys.stderr)
        return 2
    try:
        key, key_from, key_to, prefix = (None if text is None else _key(spec.key_serde, text) for text in (args.key, args.key_from, args.key_to, args.prefix))
    except (ValueError, TypeError, msgspec.MsgspecError) as error:
        print(f"pystreams query: {error}", file=sys.stderr)
        return 2
    options = {"endpoints": endpoints, "timeout_s": args.timeout_s, "stale": args.stale}
    try:
        if spec.kind is StoreKind.WINDOW:
            windows = app.query_windows(args.store, key, args.from_time, args.to_time, **options)
            return _print_lines({"start": start, "value": value} for start, value in windows)
        if spec.kind is StoreKind.SESSION:
            sessions = app.query_sessions(args.store, key, **options)
            return _print_lines({"start": s.start_ms, "end": s.end_ms, "value": value} for s, value in sessions)
        if scan:
            entries = app.query_prefix(args.store, prefix, **options) if prefix is not None else app.query_range(args.store, key_from, key_to, **options)
            return _print_lines({"key": k, "value": v} for k, v in entries)
        value = app.query(args.store, key, **options)
    except NotAvailableYet as error:
        print(f"pystreams query: {error}", file=sys.stderr)
        return 3
    except QueryError as error:
        print(f"pystreams query: {error}", file=sys.stderr)
        return 2
    if value is None:  # stores hold no None values: None means the key has none
        print(f"no value for key {args.key!r} in store {args.store!r}")
        return 1
    print(_json(value))
    return 0


def _usage_error(kind: Any, args: argparse.Namespace, scan: bool) -> str:
    """What is wrong with the options for this kind of store ('' if nothing)."""
    from pystreams.topology.ir import StoreKind

    timed = args.from_time is not None or args.to_time is not None
    if kind is StoreKind.KEY_VALUE:
        if timed:
            return "--from-time/--to-time are for window stores"
        if scan and args.key is not None:
            return "give a KEY or a scan (--from/--to, --prefix, --all), not both"
        if args.prefix is not None and (args.key_from is not None or args.key_to is not None):
            return "give --prefix or --from/--to, not both"
        if not scan and args.key is None:
            return "give a KEY, or a scan: --from K --to K, --prefix P or --all"
        return ""
    if scan:
        return f"--from/--to/--prefix/--all scan key-value stores; a {kind} store is read by KEY"
    if timed and kind is StoreKind.SESSION:
        return "--from-time/--to-time are for window stores; a session store gives all of a key's sessions"
    if args.key is None:
        return "give the KEY (the grouping key) whose " + ("windows" if kind is StoreKind.WINDOW else "sessions") + " to read"
    return ""


def _key(serde: serdes.Serde, text: str) -> Any:
    try:
        key = parse_key(serde, text)
        serde.serialize(key)  # fail here, with the reason, not inside the query
    except (ValueError, TypeError, msgspec.MsgspecError) as error:
        raise ValueError(f"key {text!r} does not fit the store's key serde: {error}") from None
    return key


def _json(value: Any) -> str:
    try:
        return msgspec.json.encode(value).decode()
    except (TypeError, msgspec.EncodeError):
        return repr(value)


def _print_lines(rows: Any) -> int:
    printed = 0
    for row in rows:
        print(_json(row))
        printed += 1
    return 0 if printed else 1
