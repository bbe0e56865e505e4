"""``pystreams spark APP``: run an app's topology as a Spark Structured Streaming query.

The topology compiles first (nodes Spark cannot run are reported by name, before Spark
starts); then a local Spark session with laptop defaults runs the query, reading and writing
the app's Kafka topics. ``--once`` is a backfill (``availableNow``): it processes what the
input topics hold at start and exits (wall-clock punctuations of processors do not run in a
backfill). Offsets and operator state live in ``--checkpoint``, so rerunning with the same
directory continues where the last run stopped — once the offsets there are checked against the
cluster: a checkpoint left from another broker, or from before a topic was recreated, or
pointing past a log's end or before its start, fails the run before Spark starts, saying what to
do (``--fail-on-data-loss false``, Spark's ``failOnDataLoss``, goes on anyway). Bad records
follow the app's error policies (``--deserialization-errors`` ... replace them, as for
``pystreams worker``); a record that stops the query is named by topic, partition and offset.

Every option can also come from an environment variable: PYSTREAMS_BOOTSTRAP_SERVERS,
PYSTREAMS_SPARK_MASTER, PYSTREAMS_SPARK_CHECKPOINT, PYSTREAMS_SPARK_ONCE (1/true/yes),
PYSTREAMS_SPARK_FAIL_ON_DATA_LOSS, PYSTREAMS_DESERIALIZATION_ERRORS, PYSTREAMS_PROCESSING_ERRORS,
PYSTREAMS_DEAD_LETTER_TOPIC.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import re
import sys
from pathlib import Path

from pystreams.commands import options

HELP = "run an app's topology on Spark Structured Streaming (local session; --once backfills and exits)"

BOOTSTRAP_ENV = "PYSTREAMS_BOOTSTRAP_SERVERS"
MASTER_ENV = "PYSTREAMS_SPARK_MASTER"
CHECKPOINT_ENV = "PYSTREAMS_SPARK_CHECKPOINT"
ONCE_ENV = "PYSTREAMS_SPARK_ONCE"
FAIL_ON_DATA_LOSS_ENV = "PYSTREAMS_SPARK_FAIL_ON_DATA_LOSS"
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
    parser.add_argument(
        "--fail-on-data-loss",
        type=_true_or_false,
        default=os.environ.get(FAIL_ON_DATA_LOSS_ENV, "true"),
        metavar="{true,false}",
        help="Spark's failOnDataLoss: stop when the checkpoint's offsets do not fit the cluster's logs (another "
        "cluster, a recreated topic, offsets past a log's end or before its start); false warns and reads on as "
        f"Spark's Kafka source would (env {FAIL_ON_DATA_LOSS_ENV}; default true)",
    )
    options.add_error_policy_options(parser)


def _true_or_false(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return lowered == "true"


def run(args: argparse.Namespace) -> int:
    from pystreams.app_loader import load_app
    from pystreams.commands.explain import check_java, verbose

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)  # its connection chatter would bury our last line
    app = load_app(args.app)
    topology = app.topology()
    errors = topology.errors.overridden(
        deserialization=args.deserialization_errors, processing=args.processing_errors, dead_letter_topic=args.dead_letter_topic
    )
    errors.check()
    topology = dataclasses.replace(topology, errors=errors)
    from pystreams.spark.compiler import cluster_pattern_matcher, compile_topology

    # Everything that can be checked without a Spark session is, before paying for one: nodes
    # Spark cannot run, the checkpoint's offsets against the cluster, pyspark and Java.
    plan = compile_topology(topology, topics_matching=cluster_pattern_matcher(args.bootstrap_servers))
    check_source_topics(args.bootstrap_servers, plan.source_topics)
    checkpoint = args.checkpoint or str(Path(".pystreams-spark") / topology.app_id)
    if args.fail_on_data_loss:
        # A chained plan's queries also read the app's internal topics.
        read = dict.fromkeys((*plan.source_topics, *(topic for query in plan.chained for topic in query.topics)))
        check_checkpoint(checkpoint, args.bootstrap_servers, tuple(read))
    import pyspark  # noqa: F401  (missing: the CLI says which extra to install)

    check_java()
    from pystreams.spark import to_spark
    from pystreams.spark.session import local_session, quiet_task_failures

    spark = local_session(args.master, f"pystreams-{topology.app_id}")
    if not verbose(args):
        quiet_task_failures(spark)  # a failed query is said once, below, not in three stack traces
    job = None
    try:
        job = to_spark(topology, spark, bootstrap_servers=args.bootstrap_servers, checkpoint=checkpoint, fail_on_data_loss=args.fail_on_data_loss)
        job.start(available_now=args.once)
        print(
            f"pystreams spark: {topology.app_id} running on {args.master}: {len(job.queries)} queries"
            f" ({'backfill' if args.once else 'streaming'}; checkpoint {checkpoint})",
            file=sys.stderr,
        )
        try:
            job.await_termination()
        except Exception as error:  # a failed query raises StreamingQueryException here
            job.stop()
            reason = query_failure(str(error))
            if reason is None or verbose(args):
                print(f"pystreams spark: query failed: {error}", file=sys.stderr)
            if reason is not None:
                print(f"pystreams spark: query failed: {reason}", file=sys.stderr)
            return 1
        return 0
    except KeyboardInterrupt:
        if job is not None:
            job.stop()
        return 130
    finally:
        spark.stop()


#: The failures of our own code a query can end with: their message is the whole story, the
#: JVM and Python stack traces around it are not.
_OWN_FAILURES = re.compile(r"(?:RecordProcessingError|DataLossError): (.*?)(?=\n\s*(?:at |File \"|JVM stacktrace|Traceback|SQLSTATE|===)|\Z)", re.DOTALL)


def query_failure(text: str) -> str | None:
    """The message of a bad record or a data-loss check in a failed query's error text."""
    found = _OWN_FAILURES.search(text)
    if found is None:
        return None
    message = found.group(1).strip()
    if "error on " in message:  # a bad record: say how to skip such records
        from pystreams.topology.kernels import ErrorKind, skip_hint

        kind = ErrorKind.DESERIALIZATION if "deserialization error" in message else ErrorKind.PROCESSING
        message += f" ({skip_hint(kind)})"
    return message


def check_source_topics(bootstrap_servers: str, topics: tuple[str, ...]) -> None:
    """Spark's source would fail on a missing topic only once the session runs, in a stack trace."""
    from pystreams.cluster import ClusterMetadata
    from pystreams.commands.explain import CommandError, missing_topics_message

    with ClusterMetadata(bootstrap_servers) as cluster:
        missing = set(topics) - set(cluster.fetch_topics(topics))
    if missing:
        raise CommandError(missing_topics_message(missing, bootstrap_servers))


def check_checkpoint(checkpoint: str, bootstrap_servers: str, topics: tuple[str, ...]) -> None:
    """Fail before Spark starts when the checkpoint's offsets do not fit the cluster's logs."""
    from kafka import KafkaConsumer

    from pystreams.cluster import ClusterMetadata
    from pystreams.commands.explain import CommandError
    from pystreams.spark.kafka_source import log_view
    from pystreams.spark.source_offsets import (
        DataLossError,
        checkpoint_offsets,
        find_data_loss,
    )

    recorded = checkpoint_offsets(checkpoint)
    if not recorded:
        return
    consumer = KafkaConsumer(bootstrap_servers=bootstrap_servers, group_id=None, enable_auto_commit=False)
    try:
        from kafka import TopicPartition

        partitions = [TopicPartition(t, n) for t in topics for n in sorted(consumer.partitions_for_topic(t) or ())]
        with ClusterMetadata(bootstrap_servers) as cluster:
            view = log_view(cluster, consumer, partitions)
    finally:
        consumer.close()
    for query, offsets in recorded.items():
        losses = find_data_loss(offsets, view)
        if losses:
            raise CommandError(str(DataLossError(losses, f"checkpoint {checkpoint} (query {query})")))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pystreams spark", description=HELP)
    configure(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
