"""``pystreams credentials``: the SCRAM credentials file a SASL listener checks.

``--file F --add USER`` salts the password (from ``--password-env VAR``, or typed at the prompt)
into SCRAM-SHA-256 and SCRAM-SHA-512 credentials, as ``kafka-configs --alter --add-config
'SCRAM-SHA-256=[password=...]'`` does for Kafka, and writes the file (created if missing, only
readable by its owner). ``--remove USER`` takes a user out; ``--list`` names the users. The
password itself is never stored. Give the file to ``pystreams coordinator
--sasl-credentials-file``, or its contents to PYSTREAMS_SASL_CREDENTIALS.
"""

from __future__ import annotations

import argparse
import getpass
import os
import sys
from pathlib import Path

from pystreams.commands import options

HELP = "add, remove or list the SCRAM credentials a SASL listener checks"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--file", required=True, help="the credentials file (JSON)")
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--add", metavar="USER", help="add or replace a user")
    action.add_argument("--remove", metavar="USER", help="remove a user")
    action.add_argument("--list", action="store_true", help="list the users and their mechanisms")
    parser.add_argument("--password-env", metavar="VAR", help="read the password from this environment variable instead of a prompt")
    parser.add_argument("--iterations", type=options.positive_int, default=4096, help="SCRAM iterations (default and minimum 4096)")


def run(args: argparse.Namespace) -> int:
    from pystreams.protocol.sasl import CredentialError, CredentialStore

    path = Path(args.file)
    try:
        store = CredentialStore.load(path) if path.exists() else CredentialStore()
        if args.list:
            for user, mechanisms in sorted(store.users.items()):
                print(f"{user}: {', '.join(sorted(mechanisms))}")
            return 0
        if args.remove:
            if args.remove not in store.users:
                print(f"pystreams credentials: no user {args.remove!r} in {path}", file=sys.stderr)
                return 1
            store = CredentialStore({u: m for u, m in store.users.items() if u != args.remove})
        else:
            password = os.environ.get(args.password_env) if args.password_env else getpass.getpass(f"password for {args.add}: ")
            if not password:
                print("pystreams credentials: the password is empty" + (f" ({args.password_env} is unset)" if args.password_env else ""), file=sys.stderr)
                return 2
            store = store.with_user(args.add, password, iterations=args.iterations)
    except CredentialError as error:
        print(f"pystreams credentials: {error}", file=sys.stderr)
        return 2
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as file:
        file.write(store.dumps())
    print(f"{'removed' if args.remove else 'saved'} {args.remove or args.add} in {path}")
    return 0
