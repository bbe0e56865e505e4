"""``pystreams spark APP``: run an app's topology as a Spark Structured Streaming query.

The topology compiles first (nodes Spark cannot run are reported by name, before Spark
starts); then a local Spark session with laptop defaults runs the query, reading and writing
the app's Kafka topics. ``--once`` is a backfill (``availableNow``): it processes what the
input topics hold at start and exits (wall-clock punctuations of processors do not run in a
backfill). Offsets and operator state live in ``--checkpoint``, so rerunning with the same
directory continues where the last run stopped.

Every option can also come from an environment variable: PYSTREAMS_BOOTSTRAP_SERVERS,
PYSTREAMS_SPARK_MASTER, PYSTREAMS_SPARK_CHECKPOINT, PYSTREAMS_SPARK_ONCE (1/true/yes).
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

HELP = "run an app's topology on Spark Structured Streaming (local session; --once backfills and exits)"

BOOTSTRAP_ENV = "PYSTREAMS_BOOTSTRAP_SERVERS"
MASTER_ENV = "PYSTREAMS_SPARK_MASTER"
CHECKPOINT_ENV = "PYSTREAMS_SPARK_CHECKPOINT"
ONCE_ENV = "PYSTREAMS_SPARK_ONCE"
DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
DEFAULT_MASTER = "local[2]"


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("app", help="the app: path/to/app.py or package.module, optionally :ATTRIBUTE")
    parser.add_argument(
        "--bootstrap-servers",
        default=os.environ.get(BOOTSTRAP_ENV, DEFAULT_BOOTSTRAP),
        help=f"Kafka bootstrap servers (env {BOOTSTRAP_ENV}; default {DEFAULT_BOOTSTRAP})",
    )
    parser.add_argument(
        "--master",
        default=os.environ.get(MASTER_ENV, DEFAULT_MASTER),
        help=f"Spark master URL (env {MASTER_ENV}; default {DEFAULT_MASTER})",
    )
    parser.add_argument(
        "--checkpoint",
        default=os.environ.get(CHECKPOINT_ENV),
        help=f"checkpoint directory: offsets and state; reuse it to resume (env {CHECKPOINT_ENV}; "
        "default: .pystreams-spark/APP_ID under the current directory)",
    )
    parser.add_argument(
        "--once",
        action="store_true",
        default=_env_flag(ONCE_ENV),
        help=f"backfill: process what the topics hold now, then exit (env {ONCE_ENV})",
    )


def run(args: argparse.Namespace) -> int:
    from pystreams.app import load_app
    from pystreams.topology.errors import TopologyError

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        app = load_app(args.app)
        topology = app.topology()
        from pystreams.spark.compiler import cluster_pattern_matcher, compile_topology

        # Compile before paying for a Spark session: unsupported nodes fail in milliseconds.
        compile_topology(topology, topics_matching=cluster_pattern_matcher(args.bootstrap_servers))
    except (TopologyError, ValueError, LookupError, OSError, ImportError) as error:
        print(f"pystreams spark: error: {error}", file=sys.stderr)
        return 1

    from pystreams.spark import to_spark
    from pystreams.spark.session import local_session

    checkpoint = args.checkpoint or str(Path(".pystreams-spark") / topology.app_id)
    spark = local_session(args.master, f"pystreams-{topology.app_id}")
    job = None
    try:
        job = to_spark(app, spark, bootstrap_servers=args.bootstrap_servers, checkpoint=checkpoint)
        job.start(available_now=args.once)
        print(
            f"pystreams spark: {topology.app_id} running on {args.master}: {len(job.queries)} queries"
            f" ({'backfill' if args.once else 'streaming'}; checkpoint {checkpoint})",
            file=sys.stderr,
        )
        try:
            job.await_termination()
        except Exception as error:  # a failed query raises StreamingQueryException here
            print(f"pystreams spark: query failed: {error}", file=sys.stderr)
            job.stop()
            return 1
        return 0
    except KeyboardInterrupt:
        if job is not None:
            job.stop()
        return 130
    finally:
        spark.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pystreams spark", description=HELP)
    configure(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
