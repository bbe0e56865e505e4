"""The ``pystreams`` command line: one subcommand per module, imported only when it runs.

Each command module exposes ``configure(parser)`` and ``run(args) -> int``; keep heavy imports
inside ``run`` so ``pystreams --help`` stays fast. The usual mistakes (``commands.explain``)
end a command with one or two lines saying what to do, and exit status 1; ``--verbose`` (or a
DEBUG log level) adds the traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys

#: subcommand -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "broker": ("pystreams.commands.broker", "run the embedded Kafka-compatible broker (Tansu, memory storage) on loopback"),
    "coordinator": ("pystreams.commands.coordinator", "run the KIP-848 group coordinator server (Kafka protocol, record log, metrics)"),
    "dev": ("pystreams.commands.dev", "start the embedded Kafka broker and a coordinator together for local development"),
    "demo": ("pystreams.demo", "replay a scripted KIP-848 rebalance through the coordinator state machine"),
    "groups": ("pystreams.commands.groups", "list and describe groups on a coordinator; validate a regex subscription"),
    "credentials": ("pystreams.commands.credentials", "add, remove or list the SCRAM credentials a SASL listener checks"),
    "configs": ("pystreams.commands.configs", "describe or alter a group's dynamic configs (session timeout, heartbeat interval, ...)"),
    "sim": ("pystreams.commands.sim", "deterministic simulation: real coordinator and members, faults, invariants, many seeds"),
    "worker": ("pystreams.commands.worker", "run an app's stream tasks as a member of its group (KIP-848, client-side task assignment)"),
    "query": ("pystreams.commands.query", "read one key of an app's store from the worker hosting it (interactive queries)"),
    "topics": ("pystreams.commands.topics", "list topics, or create topics (idempotent) on a Kafka cluster"),
    "topology": ("pystreams.commands.topology", "describe an app's topology: sub-topologies, tasks, stores and topics (or Mermaid)"),
    "spark": ("pystreams.commands.spark", "run an app's topology on Spark Structured Streaming (local session; --once backfills and exits)"),
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command, or of command ``only`` alone: a command's module and what
    it imports load only when that command runs (a worker starts without loading the
    simulator, Spark's compiler or the coordinator's server)."""
    parser = argparse.ArgumentParser(prog="pystreams", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module_name, help_text) in COMMANDS.items():
        if only is not None and name != only:
            continue
        module = importlib.import_module(module_name)
        command = sub.add_parser(name, help=help_text, description=help_text)
        module.configure(command)
        command.add_argument("--verbose", action="store_true", help="print the full traceback of an error (also with --log-level DEBUG)")
        command.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else argv
    command = arguments[0] if arguments and arguments[0] in COMMANDS else None
    args = build_parser(only=command).parse_args(arguments)
    try:
        return int(args._run(args) or 0)
    except KeyboardInterrupt:
        return 130
    except Exception as error:
        from pystreams.commands.explain import explain, report, verbose

        message = explain(error)
        if message is None:
            raise  # not a usual mistake: the traceback is what a bug report needs
        report(args.command, error, message, show_traceback=verbose(args))
        return 1


if __name__ == "__main__":
    sys.exit(main())
