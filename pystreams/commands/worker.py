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
import os
import signal
import sys

from pystreams.commands import options
from pystreams.commands.logs import configure_logging
from pystreams.commands.options import EnvOption
from pystreams.guarantee import ProcessingGuarantee
from pystreams.worker.process import DEFAULT_COMMIT_INTERVAL_MS, GROUP_PROTOCOLS

HELP = "run an app's stream tasks as a member of its group (KIP-848 or classic, client-side task assignment)"


def _guarantee(text: str) -> ProcessingGuarantee:
    try:
        return ProcessingGuarantee.parse(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _true(text: str) -> bool:
    return text in ("1", "true")


_OPTIONS = [
    EnvOption("app", "PYSTREAMS_APP", None, "path/to/app.py or module[:attribute]", {"nargs": "?"}),
    EnvOption("--bootstrap-servers", "PYSTREAMS_BOOTSTRAP_SERVERS", None, "the Kafka cluster holding the data"),
    EnvOption("--coordinator", "PYSTREAMS_COORDINATOR", None, "HOST:PORT of the group coordinator"),
    EnvOption(
        "--coordinator-connect-timeout-ms",
        "PYSTREAMS_COORDINATOR_CONNECT_TIMEOUT_MS",
        "60000",
        "exit when the coordinator was never reached within this long (nothing listens there, "
        "or it is a Kafka broker); 0 retries forever; a worker that once reached it always retries",
        {"type": options.non_negative_int},
    ),
    EnvOption("--instance-id", "PYSTREAMS_INSTANCE_ID", None, "static membership: leave with -2 and get the same tasks back on restart"),
    EnvOption("--state-dir", "PYSTREAMS_STATE_DIR", None, "where task state lives (unset: a temp directory)"),
    EnvOption(
        "--group-protocol",
        "PYSTREAMS_GROUP_PROTOCOL",
        "consumer",
        "group.protocol: consumer (KIP-848) or classic (JoinGroup/SyncGroup, cooperative); a fleet "
        "migrates online by restarting workers one at a time with the other value",
        {"type": str.lower, "choices": GROUP_PROTOCOLS},
    ),
    EnvOption(
        "--session-timeout-ms",
        "PYSTREAMS_SESSION_TIMEOUT_MS",
        "45000",
        "session.timeout.ms of a classic member (a KIP-848 group's is the coordinator's)",
        {"type": options.positive_int},
    ),
    EnvOption(
        "--heartbeat-interval-ms", "PYSTREAMS_HEARTBEAT_INTERVAL_MS", "3000", "heartbeat.interval.ms of a classic member", {"type": options.positive_int}
    ),
    EnvOption("--threads", "PYSTREAMS_THREADS", "1", "stream threads, one group member each", {"type": options.positive_int}),
    EnvOption(
        "--commit-interval-ms",
        "PYSTREAMS_COMMIT_INTERVAL_MS",
        None,
        f"commit.interval.ms (unset: {DEFAULT_COMMIT_INTERVAL_MS}, {ProcessingGuarantee.EXACTLY_ONCE_V2.default_commit_interval_ms} under exactly_once_v2)",
        {"type": options.positive_int},
    ),
    EnvOption(
        "--processing-guarantee",
        "PYSTREAMS_PROCESSING_GUARANTEE",
        None,
        "processing.guarantee: exactly_once_v2 commits outputs, state changes and input positions "
        "in one Kafka transaction (unset: the app's processing_guarantee, at_least_once unless it says otherwise)",
        {"type": _guarantee, "metavar": "{at_least_once,exactly_once_v2}"},
    ),
    EnvOption("--user-endpoint", "PYSTREAMS_USER_ENDPOINT", "", "HOST:PORT advertised for interactive queries"),
    EnvOption("--num-standby-replicas", "PYSTREAMS_NUM_STANDBY_REPLICAS", "0", "num.standby.replicas per stateful task", {"type": options.non_negative_int}),
    EnvOption("--max-warmup-replicas", "PYSTREAMS_MAX_WARMUP_REPLICAS", "2", "max.warmup.replicas in the whole group", {"type": options.non_negative_int}),
    EnvOption(
        "--acceptable-recovery-lag",
        "PYSTREAMS_ACCEPTABLE_RECOVERY_LAG",
        "10000",
        "acceptable.recovery.lag: records a process may be behind and still take a task's active",
        {"type": options.non_negative_int},
    ),
    EnvOption(
        "--client-tag",
        "PYSTREAMS_CLIENT_TAGS",
        None,
        "a client tag, e.g. zone=eu-1a; repeatable (the variable: comma-separated)",
        {"action": "append", "type": options.key_value, "metavar": "KEY=VALUE"},
        env_sets_default=False,  # ``run`` merges the variable's tags with the flags'
    ),
    EnvOption(
        "--rack-aware-assignment-tags",
        "PYSTREAMS_RACK_AWARE_ASSIGNMENT_TAGS",
        "",
        "client tags whose values standbys should differ in",
        {"metavar": "KEY[,KEY...]"},
    ),
    EnvOption(
        "--shutdown-application-on-error",
        "PYSTREAMS_SHUTDOWN_APPLICATION_ON_ERROR",
        "false",
        "a fatal error here asks every worker of the app to shut down (the variable: 1 or true)",
        {"action": "store_true"},
        from_env=_true,
    ),
]

#: After the error policy and security options in ``--help``.
_ENDPOINT_OPTIONS = [
    EnvOption(
        "--http-port",
        "PYSTREAMS_HTTP_PORT",
        None,
        "serve GET /healthz (stream threads alive), /readyz (active tasks restored and running) "
        "and /metrics (Prometheus) on this port; 0 picks one; unset: off",
        {"type": options.port},
    ),
    EnvOption(
        "--http-host",
        "PYSTREAMS_HTTP_HOST",
        None,
        "address the HTTP endpoints bind, queries included (unset: every interface, or loopback for queries on a loopback user endpoint)",
        {"metavar": "ADDRESS"},
    ),
    EnvOption(
        "--pod-annotations",
        "PYSTREAMS_POD_ANNOTATIONS",
        None,
        "a Kubernetes downward-API annotations file read at shutdown: with "
        'pystreams.io/leave-group="true" a static member leaves for good (-1), so its tasks move at once',
        {"metavar": "FILE"},
    ),
    EnvOption("--log-level", "PYSTREAMS_LOG_LEVEL", "INFO", "logging level (stderr)", {"choices": ["DEBUG", "INFO", "WARNING", "ERROR"]}),
]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = (parser.epilog or "") + options.env_epilog(_OPTIONS + _ENDPOINT_OPTIONS)
    options.add_env_options(parser, _OPTIONS)
    options.add_error_policy_options(parser)
    options.add_client_security_options(parser)
    options.add_client_security_options(parser, prefix="broker-", what="the Kafka brokers (unset: as toward the coordinator)")
    options.add_env_options(parser, _ENDPOINT_OPTIONS)


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
        client_tags.update(args.client_tag or ())  # the command line wins over the environment
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
    configure_logging(args.log_level)
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
