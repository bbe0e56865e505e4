"""``pystreams topics``: list topics, or create the ones an app reads (as ``kafka-topics.sh`` does).

Kafka Streams never creates its source topics — the app's owner does — and so does pystreams:
``pystreams worker`` stops with a clear error while a source topic is missing. This command is
the small tool to create them (``--create NAME --partitions N``, idempotent: an existing topic
with that partition count is left alone); the Kubernetes dev overlay runs it as a Job.
"""

from __future__ import annotations

import argparse
import os
import sys

from pystreams.commands import options

HELP = "list topics, or create topics (idempotent) on a Kafka cluster"


def configure(parser: argparse.ArgumentParser) -> None:
    env = os.environ.get
    parser.add_argument("--bootstrap-servers", default=env("PYSTREAMS_BOOTSTRAP_SERVERS"), help="the Kafka cluster (env PYSTREAMS_BOOTSTRAP_SERVERS)")
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--list", action="store_true", help="print every topic with its partition count")
    action.add_argument("--create", action="append", metavar="TOPIC", default=[], help="create TOPIC unless it exists; repeatable")
    parser.add_argument("--partitions", type=options.positive_int, default=1, help="partitions of the topics created (default 1)")
    parser.add_argument(
        "--config",
        action="append",
        type=options.key_value,
        metavar="KEY=VALUE",
        default=[],
        help="a topic config of the topics created, e.g. retention.ms=604800000; repeatable",
    )
    parser.add_argument("--timeout-s", type=options.positive_seconds, default=30.0, help="give up after this long (default 30)")


def run(args: argparse.Namespace) -> int:
    from kafka.errors import KafkaError

    from pystreams.cluster import ClusterMetadata, TopicMismatchError, TopicSpec

    if not args.bootstrap_servers:
        print("pystreams topics: --bootstrap-servers (or PYSTREAMS_BOOTSTRAP_SERVERS) is required", file=sys.stderr)
        return 2
    try:
        with ClusterMetadata(args.bootstrap_servers) as cluster:
            if args.list:
                for name, meta in sorted(cluster.fetch_topics().items()):
                    print(f"{name}\t{meta.num_partitions}")
                return 0
            specs = [TopicSpec(name, args.partitions, configs=dict(args.config)) for name in args.create]
            cluster.ensure_topics(specs, timeout_ms=int(args.timeout_s * 1000))
    except TopicMismatchError as error:
        print(f"pystreams topics: {error}", file=sys.stderr)
        return 1
    except (KafkaError, OSError) as error:
        print(f"pystreams topics: cannot reach {args.bootstrap_servers}: {error!r}", file=sys.stderr)
        return 1
    for name in args.create:
        print(f"topic {name}: ready with {args.partitions} partition(s)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pystreams topics", description=HELP)
    configure(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
