"""``pystreams worker APP.py``: run an app's tasks as members of the group ``application.id``.

Every option also reads a ``PYSTREAMS_*`` environment variable (the flag wins), which is how
the Kubernetes manifests configure workers. See :mod:`pystreams.worker.process` for the design
(one asyncio loop for the members, one engine thread per stream thread).
"""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import gc
import logging
import os
import signal
import sys

from pystreams.commands import options
from pystreams.guarantee import ProcessingGuarantee
from pystreams.worker.process import DEFAULT_COMMIT_INTERVAL_MS, GROUP_PROTOCOLS

HELP = "run an app's stream tasks as a member of its group (KIP-848 or classic, client-side task assignment)"


def configure(parser: argparse.ArgumentParser) -> None:
    env = os.environ.get
    parser.add_argument("app", nargs="?", default=env("PYSTREAMS_APP"), help="path/to/app.py or module[:attribute] (env PYSTREAMS_APP)")
    parser.add_argument(
        "--bootstrap-servers", default=env("PYSTREAMS_BOOTSTRAP_SERVERS"), help="the Kafka cluster holding the data (env PYSTREAMS_BOOTSTRAP_SERVERS)"
    )
    parser.add_argument("--coordinator", default=env("PYSTREAMS_COORDINATOR"), help="HOST:PORT of the group coordinator (env PYSTREAMS_COORDINATOR)")
    parser.add_argument(
        "--coordinator-connect-timeout-ms",
        type=options.non_negative_int,
        default=env("PYSTREAMS_COORDINATOR_CONNECT_TIMEOUT_MS", "60000"),
        help="exit when the coordinator was never reached within this long (nothing listens there, "
        "or it is a Kafka broker); 0 retries forever; a worker that once reached it always "
        "retries (env PYSTREAMS_COORDINATOR_CONNECT_TIMEOUT_MS; default 60000)",
    )
    parser.add_argument(
        "--instance-id",
        default=env("PYSTREAMS_INSTANCE_ID") or None,
        help="static membership: leave with -2 and get the same tasks back on restart (env PYSTREAMS_INSTANCE_ID)",
    )
    parser.add_argument(
        "--state-dir", default=env("PYSTREAMS_STATE_DIR") or None, help="where task state lives (env PYSTREAMS_STATE_DIR; default: a temp directory)"
    )
    parser.add_argument(
        "--group-protocol",
        type=str.lower,
        choices=GROUP_PROTOCOLS,
        default=(env("PYSTREAMS_GROUP_PROTOCOL") or "consumer").lower(),
        help="group.protocol: consumer (KIP-848) or classic (JoinGroup/SyncGroup, cooperative); a fleet "
        "migrates online by restarting workers one at a time with the other value "
        "(env PYSTREAMS_GROUP_PROTOCOL; default consumer)",
    )
    parser.add_argument(
        "--session-timeout-ms",
        type=options.positive_int,
        default=env("PYSTREAMS_SESSION_TIMEOUT_MS", "45000"),
        help="session.timeout.ms of a classic member (a KIP-848 group's is the coordinator's) (env PYSTREAMS_SESSION_TIMEOUT_MS; default 45000)",
    )
    parser.add_argument(
        "--heartbeat-interval-ms",
        type=options.positive_int,
        default=env("PYSTREAMS_HEARTBEAT_INTERVAL_MS", "3000"),
        help="heartbeat.interval.ms of a classic member (env PYSTREAMS_HEARTBEAT_INTERVAL_MS; default 3000)",
    )
    parser.add_argument(
        "--threads",
        type=options.positive_int,
        default=env("PYSTREAMS_THREADS", "1"),
        help="stream threads, one group member each (env PYSTREAMS_THREADS; default 1)",
    )
    parser.add_argument(
        "--commit-interval-ms",
        type=options.positive_int,
        default=env("PYSTREAMS_COMMIT_INTERVAL_MS") or None,
        help=f"commit.interval.ms (env PYSTREAMS_COMMIT_INTERVAL_MS; default {DEFAULT_COMMIT_INTERVAL_MS}, "
        f"{ProcessingGuarantee.EXACTLY_ONCE_V2.default_commit_interval_ms} under exactly_once_v2)",
    )
    parser.add_argument(
        "--processing-guarantee",
        type=_guarantee,
        default=env("PYSTREAMS_PROCESSING_GUARANTEE") or None,
        metavar="{at_least_once,exactly_once_v2}",
        help="processing.guarantee: exactly_once_v2 commits outputs, state changes and input positions "
        "in one Kafka transaction (env PYSTREAMS_PROCESSING_GUARANTEE; default: the app's "
        "processing_guarantee, at_least_once unless it says otherwise)",
    )
    parser.add_argument(
        "--user-endpoint", default=env("PYSTREAMS_USER_ENDPOINT", ""), help="HOST:PORT advertised for interactive queries (env PYSTREAMS_USER_ENDPOINT)"
    )
    parser.add_argument(
        "--num-standby-replicas",
        type=options.non_negative_int,
        default=env("PYSTREAMS_NUM_STANDBY_REPLICAS", "0"),
        help="num.standby.replicas per stateful task (env PYSTREAMS_NUM_STANDBY_REPLICAS; default 0)",
    )
    parser.add_argument(
        "--max-warmup-replicas",
        type=options.non_negative_int,
        default=env("PYSTREAMS_MAX_WARMUP_REPLICAS", "2"),
        help="max.warmup.replicas in the whole group (env PYSTREAMS_MAX_WARMUP_REPLICAS; default 2)",
    )
    parser.add_argument(
        "--acceptable-recovery-lag",
        type=options.non_negative_int,
        default=env("PYSTREAMS_ACCEPTABLE_RECOVERY_LAG", "10000"),
        help="acceptable.recovery.lag: records a process may be behind and still take a task's active (env PYSTREAMS_ACCEPTABLE_RECOVERY_LAG; default 10000)",
    )
    parser.add_argument(
        "--client-tag",
        action="append",
        type=options.key_value,
        metavar="KEY=VALUE",
        default=[],
        help="a client tag, e.g. zone=eu-1a; repeatable (env PYSTREAMS_CLIENT_TAGS, comma-separated)",
    )
    parser.add_argument(
        "--rack-aware-assignment-tags",
        default=env("PYSTREAMS_RACK_AWARE_ASSIGNMENT_TAGS", ""),
        metavar="KEY[,KEY...]",
        help="client tags whose values standbys should differ in (env PYSTREAMS_RACK_AWARE_ASSIGNMENT_TAGS)",
    )
    parser.add_argument(
        "--shutdown-application-on-error",
        action="store_true",
        default=env("PYSTREAMS_SHUTDOWN_APPLICATION_ON_ERROR", "") in ("1", "true"),
        help="a fatal error here asks every worker of the app to shut down (env PYSTREAMS_SHUTDOWN_APPLICATION_ON_ERROR)",
    )
    options.add_error_policy_options(parser)
    options.add_client_security_options(parser)
    options.add_client_security_options(parser, prefix="broker-", what="the Kafka brokers (unset: as toward the coordinator)")
    parser.add_argument(
        "--http-port",
        type=options.port,
        default=env("PYSTREAMS_HTTP_PORT") or None,
        help="serve GET /healthz (stream threads alive), /readyz (active tasks restored and running) "
        "and /metrics (Prometheus) on this port; 0 picks one (env PYSTREAMS_HTTP_PORT; default: off)",
    )
    parser.add_argument(
        "--http-host",
        default=env("PYSTREAMS_HTTP_HOST") or None,
        metavar="ADDRESS",
        help="address the HTTP endpoints bind, queries included (env PYSTREAMS_HTTP_HOST; default: every "
        "interface, or loopback for queries on a loopback user endpoint)",
    )
    parser.add_argument(
        "--pod-annotations",
        default=env("PYSTREAMS_POD_ANNOTATIONS") or None,
        metavar="FILE",
        help="a Kubernetes downward-API annotations file read at shutdown: with "
        'pystreams.io/leave-group="true" a static member leaves for good (-1), so its tasks move '
        "at once (env PYSTREAMS_POD_ANNOTATIONS)",
    )
    parser.add_argument(
        "--log-level", default=env("PYSTREAMS_LOG_LEVEL", "INFO"), choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="(env PYSTREAMS_LOG_LEVEL)"
    )


def _guarantee(text: str) -> ProcessingGuarantee:
    try:
        return ProcessingGuarantee.parse(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _client_tags_from_env(text: str) -> dict[str, str]:
    """PYSTREAMS_CLIENT_TAGS, where a tag with no value is left out with a warning: in
    Kubernetes ``zone=$(ZONE)`` is empty when the node has no zone label, and a worker
    without that tag still works (its standbys are just not spread by zone)."""
    tags: dict[str, str] = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip() and not value.strip():
            print(f"pystreams worker: client tag {key.strip()!r} has no value in PYSTREAMS_CLIENT_TAGS; not used", file=sys.stderr)
            continue
        if item.strip():
            try:
                tags.update([options.key_value(item)])
            except argparse.ArgumentTypeError as error:
                raise ValueError(f"PYSTREAMS_CLIENT_TAGS: {error}") from None
    return tags


def run(args: argparse.Namespace) -> int:
    from pystreams.assignors.streams.placement import HaConfig
    from pystreams.commands.explain import CommandError, check_writable_directory, missing_topics_message
    from pystreams.topology.errors import MissingSourceError
    from pystreams.worker.errors import MissingDeadLetterTopic
    from pystreams.worker.process import WorkerSettings, run_worker

    # What is loaded by now (every module the worker runs) lives as long as the process: out of
    # the collector's sight it costs neither the full collections while the worker runs nor the
    # one at exit, a quarter of a second of every stop that a rolling restart waits for.
    gc.freeze()

    if not args.app:
        print("pystreams worker: an app is required (APP argument or PYSTREAMS_APP)", file=sys.stderr)
        return 2
    if not args.bootstrap_servers or not args.coordinator:
        print(
            "pystreams worker: --bootstrap-servers and --coordinator are required (or PYSTREAMS_BOOTSTRAP_SERVERS and PYSTREAMS_COORDINATOR)", file=sys.stderr
        )
        return 2
    try:
        client_tags = _client_tags_from_env(os.environ.get("PYSTREAMS_CLIENT_TAGS", ""))
        client_tags.update(args.client_tag)  # the command line wins over the environment
        coordinator_security = options.client_security_from_args(args)
        settings = WorkerSettings(
            app=args.app,
            bootstrap_servers=args.bootstrap_servers,
            coordinator=args.coordinator,
            coordinator_connect_timeout_ms=int(args.coordinator_connect_timeout_ms) or None,
            instance_id=args.instance_id,
            state_dir=args.state_dir,
            threads=int(args.threads),
            commit_interval_ms=None if args.commit_interval_ms is None else int(args.commit_interval_ms),
            processing_guarantee=None if args.processing_guarantee is None else _guarantee(str(args.processing_guarantee)),
            group_protocol=args.group_protocol,
            session_timeout_ms=int(args.session_timeout_ms),
            heartbeat_interval_ms=int(args.heartbeat_interval_ms),
            user_endpoint=args.user_endpoint,
            ha=HaConfig(
                num_standby_replicas=int(args.num_standby_replicas),
                max_warmup_replicas=int(args.max_warmup_replicas),
                acceptable_recovery_lag=int(args.acceptable_recovery_lag),
                rack_aware_assignment_tags=tuple(t.strip() for t in args.rack_aware_assignment_tags.split(",") if t.strip()),
            ),
            client_tags=client_tags,
            shutdown_application_on_error=args.shutdown_application_on_error,
            coordinator_security=coordinator_security,
            broker_security=options.client_security_from_args(args, prefix="broker-", fallback=coordinator_security),
            http_port=None if args.http_port is None else int(args.http_port),
            http_host=args.http_host,
            pod_annotations=args.pod_annotations,
            deserialization_errors=args.deserialization_errors,
            processing_errors=args.processing_errors,
            dead_letter_topic=args.dead_letter_topic,
        )
    except ValueError as error:
        print(f"pystreams worker: {error}", file=sys.stderr)
        return 2
    if args.state_dir:
        check_writable_directory(args.state_dir, "--state-dir")
    logging.basicConfig(level=getattr(logging, args.log_level), stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("kafka").setLevel(logging.WARNING)
    # `kill -USR1 PID` prints every thread's stack: how to see where a stuck worker waits.
    faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)

    async def main() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        return await run_worker(settings, stop, announce=lambda line: print(line, flush=True))

    try:
        return asyncio.run(main())
    except KeyboardInterrupt:
        return 130
    except MissingSourceError as error:
        raise CommandError(missing_topics_message(error.topics, args.bootstrap_servers)) from error
    except MissingDeadLetterTopic as error:
        raise CommandError(missing_topics_message([error.topic], args.bootstrap_servers, role="dead-letter topic")) from error


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pystreams worker", description=HELP)
    configure(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
