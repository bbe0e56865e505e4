"""``pystreams query APP STORE KEY``: read one key of an app's key-value store from the worker
that hosts it (interactive queries, routed by the assignment's PartitionsByHost).

KEY is text, read the way the store's key serde expects: as is for Text, a number for Int,
JSON for Json (plain text if it is not JSON). The value is printed as JSON when it can be.
Exit status: 0 found, 1 no value for the key, 3 not available yet (restoring or moving), 2 bad
usage or an unanswerable query.
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
    parser.add_argument("store", help="the key-value store's name")
    parser.add_argument("key", help="the key, as text (see the command's help)")
    parser.add_argument("--endpoint", action="append", default=None, metavar="HOST:PORT",
                        help="a worker's user endpoint; repeatable (env PYSTREAMS_QUERY_ENDPOINTS, comma-separated)")
    parser.add_argument("--stale", action="store_true", help="standby replicas may answer (possibly behind)")
    parser.add_argument("--timeout-s", type=float, default=10.0, metavar="S",
                        help="how long a restoring or moving task may be waited for (default 10)")


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
    from pystreams.app import load_app
    from pystreams.queries import NotAvailableYet, QueryError, endpoints_from

    endpoints = endpoints_from(args.endpoint)
    if not endpoints:
        print("pystreams query: give --endpoint HOST:PORT (or PYSTREAMS_QUERY_ENDPOINTS)", file=sys.stderr)
        return 2
    app = load_app(args.app)
    spec = app.topology().stores.get(args.store)
    if spec is None:
        print(f"pystreams query: app {app.app_id!r} has no store named {args.store!r}", file=sys.stderr)
        return 2
    try:
        key = parse_key(spec.key_serde, args.key)
        spec.key_serde.serialize(key)  # fail here, with the reason, not inside the query
    except (ValueError, TypeError, msgspec.MsgspecError) as error:
        print(f"pystreams query: key {args.key!r} does not fit the store's key serde: {error}", file=sys.stderr)
        return 2
    try:
        value = app.query(args.store, key, endpoints=endpoints, timeout_s=args.timeout_s, stale=args.stale)
    except NotAvailableYet as error:
        print(f"pystreams query: {error}", file=sys.stderr)
        return 3
    except QueryError as error:
        print(f"pystreams query: {error}", file=sys.stderr)
        return 2
    if value is None:  # stores hold no None values: None means the key has none
        print(f"no value for key {args.key!r} in store {args.store!r}")
        return 1
    try:
        print(msgspec.json.encode(value).decode())
    except (TypeError, msgspec.EncodeError):
        print(repr(value))
    return 0
