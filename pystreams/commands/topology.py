"""``pystreams topology APP.py``: print an app's sub-topologies, tasks, stores and topics.

Without partition counts the tasks are stated as a rule ("one per partition of ..."); give
``--partitions TOPIC=N`` (repeatable) and/or ``--default-partitions N`` to see concrete tasks
and internal topic sizes. ``--mermaid`` prints a Mermaid flowchart instead.
"""

from __future__ import annotations

import argparse
import sys

HELP = "describe an app's topology: sub-topologies, tasks, stores and topics (or Mermaid)"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("app", help="the app: path/to/app.py or package.module, optionally :ATTRIBUTE")
    parser.add_argument("--mermaid", action="store_true", help="print a Mermaid flowchart instead of text")
    parser.add_argument(
        "--partitions",
        action="append",
        default=[],
        metavar="TOPIC=N",
        help="partition count of a source topic (repeatable); resolves tasks",
    )
    parser.add_argument(
        "--default-partitions",
        type=int,
        metavar="N",
        help="partition count of every named source topic not given with --partitions",
    )


def _parse_partitions(entries: list[str]) -> dict[str, int]:
    counts = {}
    for entry in entries:
        topic, separator, count = entry.rpartition("=")
        if not separator or not topic or not count.isdigit() or int(count) < 1:
            raise ValueError(f"--partitions wants TOPIC=N with N >= 1, got {entry!r}")
        counts[topic] = int(count)
    return counts


def run(args: argparse.Namespace) -> int:
    from pystreams.app_loader import load_app
    from pystreams.topology.describe import describe, to_mermaid
    from pystreams.topology.errors import TopologyError
    from pystreams.topology.resolve import resolve

    try:
        counts = _parse_partitions(args.partitions)
        topology = load_app(args.app).topology()
        if args.mermaid:
            sys.stdout.write(to_mermaid(topology))
            return 0
        resolved = None
        if counts or args.default_partitions:
            if args.default_partitions:
                for topic in (*topology.external_source_topics, *topology.global_topics):
                    counts.setdefault(topic, args.default_partitions)
            resolved = resolve(topology, counts)
        sys.stdout.write(describe(topology, resolved))
        return 0
    except (TopologyError, ValueError, LookupError, OSError) as error:
        print(f"pystreams topology: error: {error}", file=sys.stderr)
        return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pystreams topology", description=HELP)
    configure(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
