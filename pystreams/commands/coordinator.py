"""``pystreams coordinator``: run the KIP-848 group coordinator as a server.

It speaks the Kafka protocol on ``--listen`` (clients bootstrap at it: it answers Metadata and
FindCoordinator as a one-broker cluster that coordinates every group), keeps its records in
the compacted topic ``__pystreams_groups`` of the Kafka cluster at ``--bootstrap-servers``
(``--log kafka``) or in memory (``--log memory``: nothing survives a restart), reads topic
metadata from that cluster, and serves Prometheus metrics on ``--metrics-port``.

Every option can also come from a ``PYSTREAMS_*`` environment variable (listed in ``--help``);
a command-line option wins. SIGTERM or SIGINT stop it cleanly: new requests are refused with
NOT_COORDINATOR, queued requests and in-flight appends finish, the producers close.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import logging
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pystreams.commands import options
from pystreams.commands.logs import configure_logging
from pystreams.commands.options import EnvOption

HELP = "run the KIP-848 group coordinator server (Kafka protocol, record log, metrics)"

DEFAULT_LISTEN = "127.0.0.1:9093"
DEFAULT_SHARDS = 4
DEFAULT_LOG_TOPIC = "__pystreams_groups"

#: Lines scripts and tests look for on standard output.
LISTEN_LINE_PREFIX = "coordinator: "
METRICS_LINE_PREFIX = "metrics: "
READY_LINE = "coordinator ready"

# KIP-848 broker defaults; a value given outside them widens the bounds to include it.
_SESSION_DEFAULTS = (45_000, 45_000, 60_000)  # default, min, max
_HEARTBEAT_DEFAULTS = (5_000, 5_000, 15_000)


_CLUSTER_OPTIONS = [
    EnvOption(
        "--bootstrap-servers",
        "PYSTREAMS_BOOTSTRAP_SERVERS",
        None,
        "the Kafka cluster holding the record log and the topics (HOST:PORT[,HOST:PORT...]); required with --log kafka",
        {"metavar": "SERVERS"},
    ),
    EnvOption(
        "--log",
        "PYSTREAMS_LOG",
        "kafka",
        "where group records live: kafka (the compacted log topic) or memory (lost on exit)",
        {"choices": ["kafka", "memory"]},
    ),
    EnvOption("--log-topic", "PYSTREAMS_LOG_TOPIC", DEFAULT_LOG_TOPIC, "the compacted topic of the record log; one partition per shard", {"metavar": "TOPIC"}),
    EnvOption(
        "--cluster",
        "PYSTREAMS_CLUSTER",
        None,
        "share the shards with the other coordinators started with --cluster on the same log: each node serves the "
        "shards the brokers' group membership gives it, and FindCoordinator on any node names a group's owner "
        "(needs --log kafka and a distinct --node-id per node)",
        {"action": "store_true"},
    ),
    EnvOption(
        "--node-id", "PYSTREAMS_NODE_ID", "0", "this node's id in Metadata and FindCoordinator answers", {"type": options.non_negative_int, "metavar": "N"}
    ),
    EnvOption(
        "--cluster-session-timeout-ms",
        "PYSTREAMS_CLUSTER_SESSION_TIMEOUT_MS",
        "10000",
        "with --cluster: how long the brokers wait for a silent node before its shards move to the others",
        {"type": options.positive_int, "metavar": "MS"},
    ),
    EnvOption(
        "--no-hot-standby",
        "PYSTREAMS_NO_HOT_STANDBY",
        None,
        "with --cluster: do not follow the shards other nodes serve (by default each node replays them as they are "
        "written, so that taking one over replays only its tail; this costs each node the others' replay work)",
        {"action": "store_true"},
    ),
]

_SERVER_OPTIONS = [
    EnvOption(
        "--listen",
        "PYSTREAMS_LISTEN",
        DEFAULT_LISTEN,
        "[PROTOCOL://]HOST:PORT to serve the Kafka protocol on (Kafka's listeners; PROTOCOL is PLAINTEXT, SSL, "
        "SASL_PLAINTEXT or SASL_SSL); port 0 picks a free port",
        {"metavar": "[PROTOCOL://]HOST:PORT"},
    ),
    EnvOption(
        "--advertised-listener",
        "PYSTREAMS_ADVERTISED_LISTENER",
        None,
        "address clients are told to connect to (needed when --listen binds 0.0.0.0)",
        {"type": options.host_port, "metavar": "HOST:PORT"},
    ),
    EnvOption(
        "--shards",
        "PYSTREAMS_SHARDS",
        str(DEFAULT_SHARDS),
        "number of shards = partitions of the log topic; cannot change once the topic exists",
        {"type": options.positive_int, "metavar": "N"},
    ),
    EnvOption(
        "--metrics-port",
        "PYSTREAMS_METRICS_PORT",
        None,
        "serve Prometheus metrics (GET /metrics, GET /ready) on this port; 0 picks one; off by default",
        {"type": options.port, "metavar": "PORT"},
    ),
    EnvOption("--metrics-host", "PYSTREAMS_METRICS_HOST", None, "address for the metrics endpoint (default: the --listen host)", {"metavar": "HOST"}),
    EnvOption(
        "--session-timeout-ms",
        "PYSTREAMS_SESSION_TIMEOUT_MS",
        str(_SESSION_DEFAULTS[0]),
        "group.consumer.session.timeout.ms",
        {"type": options.positive_int, "metavar": "MS"},
    ),
    EnvOption(
        "--min-session-timeout-ms",
        "PYSTREAMS_MIN_SESSION_TIMEOUT_MS",
        None,
        "group.consumer.min.session.timeout.ms (default: 45000, or the session timeout if lower)",
        {"type": options.positive_int, "metavar": "MS"},
    ),
    EnvOption(
        "--max-session-timeout-ms",
        "PYSTREAMS_MAX_SESSION_TIMEOUT_MS",
        None,
        "group.consumer.max.session.timeout.ms (default: 60000, or the session timeout if higher)",
        {"type": options.positive_int, "metavar": "MS"},
    ),
    EnvOption(
        "--heartbeat-interval-ms",
        "PYSTREAMS_HEARTBEAT_INTERVAL_MS",
        str(_HEARTBEAT_DEFAULTS[0]),
        "group.consumer.heartbeat.interval.ms",
        {"type": options.positive_int, "metavar": "MS"},
    ),
    EnvOption(
        "--min-heartbeat-interval-ms",
        "PYSTREAMS_MIN_HEARTBEAT_INTERVAL_MS",
        None,
        "group.consumer.min.heartbeat.interval.ms (default: 5000, or the interval if lower)",
        {"type": options.positive_int, "metavar": "MS"},
    ),
    EnvOption(
        "--max-heartbeat-interval-ms",
        "PYSTREAMS_MAX_HEARTBEAT_INTERVAL_MS",
        None,
        "group.consumer.max.heartbeat.interval.ms (default: 15000, or the interval if higher)",
        {"type": options.positive_int, "metavar": "MS"},
    ),
    EnvOption(
        "--rebalance-heartbeat-interval-ms",
        "PYSTREAMS_REBALANCE_HEARTBEAT_INTERVAL_MS",
        "100",
        "group.consumer.rebalance.heartbeat.interval.ms: the interval a KIP-848 member is told while it has work in a rebalance "
        "(a target being computed, partitions to revoke or receive); the group's interval once it is stable",
        {"type": options.positive_int, "metavar": "MS"},
    ),
    EnvOption(
        "--metadata-refresh-ms",
        "PYSTREAMS_METADATA_REFRESH_MS",
        "5000",
        "how often topic metadata is read from the cluster",
        {"type": options.positive_int, "metavar": "MS"},
    ),
    EnvOption(
        "--event-queue-size", "PYSTREAMS_EVENT_QUEUE_SIZE", "1024", "events a shard queues before callers wait", {"type": options.positive_int, "metavar": "N"}
    ),
    EnvOption(
        "--log-level",
        "PYSTREAMS_LOG_LEVEL",
        "INFO",
        "logging level of the coordinator's own log (stderr)",
        {"choices": ["DEBUG", "INFO", "WARNING", "ERROR"], "type": str.upper},
    ),
]


_CLASSIC_OPTIONS = [
    EnvOption(
        "--migration-policy",
        "PYSTREAMS_MIGRATION_POLICY",
        "bidirectional",
        "group.consumer.migration.policy: which online conversions between classic and consumer groups happen "
        "(a group may override it through `pystreams configs`)",
        {"choices": ["bidirectional", "upgrade", "downgrade", "disabled"], "type": str.lower},
    ),
    EnvOption(
        "--group-min-session-timeout-ms",
        "PYSTREAMS_GROUP_MIN_SESSION_TIMEOUT_MS",
        "6000",
        "group.min.session.timeout.ms: the shortest session timeout a classic member may ask for",
        {"type": options.positive_int, "metavar": "MS"},
    ),
    EnvOption(
        "--group-max-session-timeout-ms",
        "PYSTREAMS_GROUP_MAX_SESSION_TIMEOUT_MS",
        "1800000",
        "group.max.session.timeout.ms: the longest session timeout a classic member may ask for",
        {"type": options.positive_int, "metavar": "MS"},
    ),
    EnvOption(
        "--group-max-size",
        "PYSTREAMS_GROUP_MAX_SIZE",
        str(2**31 - 1),
        "group.max.size: members of one classic group",
        {"type": options.positive_int, "metavar": "N"},
    ),
    EnvOption(
        "--group-initial-rebalance-delay-ms",
        "PYSTREAMS_GROUP_INITIAL_REBALANCE_DELAY_MS",
        "3000",
        "group.initial.rebalance.delay.ms: how long an empty classic group waits for more members before its first assignment",
        {"type": options.non_negative_int, "metavar": "MS"},
    ),
]

_SECURITY_OPTIONS = [
    EnvOption(
        "--ssl-certfile",
        "PYSTREAMS_SSL_CERTFILE",
        None,
        "the listener's certificate chain (PEM; may hold the key too) for SSL and SASL_SSL",
        {"metavar": "FILE"},
    ),
    EnvOption("--ssl-keyfile", "PYSTREAMS_SSL_KEYFILE", None, "the certificate's private key (PEM)", {"metavar": "FILE"}),
    EnvOption("--ssl-cafile", "PYSTREAMS_SSL_CAFILE", None, "CAs that client certificates must chain to (with --ssl-client-auth)", {"metavar": "FILE"}),
    EnvOption(
        "--ssl-client-auth",
        "PYSTREAMS_SSL_CLIENT_AUTH",
        "none",
        "ssl.client.auth: none, requested or required (mTLS: the certificate's DN is the principal)",
        {"choices": ["none", "requested", "required"]},
    ),
    EnvOption(
        "--sasl-enabled-mechanisms",
        "PYSTREAMS_SASL_ENABLED_MECHANISMS",
        "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
        "sasl.enabled.mechanisms, comma-separated",
        {"metavar": "MECHANISMS"},
    ),
    EnvOption(
        "--sasl-credentials-file",
        "PYSTREAMS_SASL_CREDENTIALS_FILE",
        None,
        "SCRAM credentials written by `pystreams credentials` (or put the JSON itself in PYSTREAMS_SASL_CREDENTIALS)",
        {"metavar": "FILE"},
    ),
    EnvOption("--acl-file", "PYSTREAMS_ACL_FILE", None, "ACLs (JSON, re-read when it changes); without it every client may do everything", {"metavar": "FILE"}),
    EnvOption(
        "--super-users",
        "PYSTREAMS_SUPER_USERS",
        "",
        "super.users: principals ACLs do not restrict, ;-separated (User:admin;User:ops)",
        {"metavar": "PRINCIPALS"},
    ),
]

_LIMIT_OPTIONS = [
    EnvOption(
        "--socket-request-max-bytes",
        "PYSTREAMS_SOCKET_REQUEST_MAX_BYTES",
        str(100 * 1024 * 1024),
        "socket.request.max.bytes: the largest request accepted",
        {"type": options.positive_int, "metavar": "BYTES"},
    ),
    EnvOption(
        "--queued-max-request-bytes",
        "PYSTREAMS_QUEUED_MAX_REQUEST_BYTES",
        str(256 * 1024 * 1024),
        "queued.max.request.bytes: bytes of large requests read or served at once",
        {"type": options.positive_int, "metavar": "BYTES"},
    ),
    EnvOption(
        "--connections-max-idle-ms",
        "PYSTREAMS_CONNECTIONS_MAX_IDLE_MS",
        str(10 * 60 * 1000),
        "connections.max.idle.ms: close connections idle this long",
        {"type": options.positive_int, "metavar": "MS"},
    ),
    EnvOption(
        "--request-read-timeout-ms",
        "PYSTREAMS_REQUEST_READ_TIMEOUT_MS",
        "30000",
        "a request that has started must arrive whole within this time",
        {"type": options.positive_int, "metavar": "MS"},
    ),
    EnvOption(
        "--max-connections", "PYSTREAMS_MAX_CONNECTIONS", "4096", "max.connections: client connections at once", {"type": options.positive_int, "metavar": "N"}
    ),
    EnvOption("--max-connections-per-ip", "PYSTREAMS_MAX_CONNECTIONS_PER_IP", "1024", "max.connections.per.ip", {"type": options.positive_int, "metavar": "N"}),
    EnvOption(
        "--group-consumer-max-size",
        "PYSTREAMS_GROUP_CONSUMER_MAX_SIZE",
        str(2**31 - 1),
        "group.consumer.max.size: members of one consumer group",
        {"type": options.positive_int, "metavar": "N"},
    ),
    EnvOption(
        "--max-groups",
        "PYSTREAMS_MAX_GROUPS",
        "100000",
        "groups this coordinator holds at most (spread over the shards)",
        {"type": options.positive_int, "metavar": "N"},
    ),
    EnvOption(
        "--offset-metadata-max-bytes",
        "PYSTREAMS_OFFSET_METADATA_MAX_BYTES",
        "4096",
        "offset.metadata.max.bytes: commit metadata per partition",
        {"type": options.positive_int, "metavar": "BYTES"},
    ),
    EnvOption(
        "--assignor-metadata-max-bytes",
        "PYSTREAMS_ASSIGNOR_METADATA_MAX_BYTES",
        str(256 * 1024),
        "a client assignor's metadata per member (heartbeat and install)",
        {"type": options.positive_int, "metavar": "BYTES"},
    ),
    EnvOption(
        "--regex-max-bytes",
        "PYSTREAMS_REGEX_MAX_BYTES",
        "4096",
        "the longest SubscribedTopicRegex accepted",
        {"type": options.positive_int, "metavar": "BYTES"},
    ),
    EnvOption(
        "--regex-cache-bytes",
        "PYSTREAMS_REGEX_CACHE_BYTES",
        str(32 * 1024 * 1024),
        "memory for compiled regexes (an LRU cache bounded by size)",
        {"type": options.positive_int, "metavar": "BYTES"},
    ),
]


def add_coordinator_options(parser: argparse.ArgumentParser, *, cluster: bool = True) -> None:
    """The server options (and, with ``cluster``, where the log and topics live)."""
    listed = (_CLUSTER_OPTIONS if cluster else []) + _SERVER_OPTIONS + _CLASSIC_OPTIONS + _SECURITY_OPTIONS + _LIMIT_OPTIONS
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = (parser.epilog or "") + options.env_epilog(listed) + "\nStops cleanly on SIGTERM or Ctrl-C (SIGINT).\n"
    options.add_env_options(parser, listed)
    if cluster:
        options.add_client_security_options(parser, prefix="broker-", what="the Kafka cluster (record log and topic metadata)")


def configure(parser: argparse.ArgumentParser) -> None:
    add_coordinator_options(parser, cluster=True)
    repair = parser.add_argument_group(
        "repair",
        "instead of serving, find records of the log that a load cannot replay (their groups are "
        "quarantined) and, with --skip-unreadable, append the tombstones that release them; safe beside a "
        "running coordinator, which serves the released groups after its next restart",
    )
    repair.add_argument("--repair", action="store_true", help="list the unreadable records of the log and exit")
    repair.add_argument(
        "--skip-unreadable", action="store_true", help="with --repair: tombstone every unreadable record's key (its group then loads without it)"
    )


# --- settings ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class CoordinatorSettings:
    bootstrap_servers: str | None
    log: str
    log_topic: str
    listen: tuple[str, int]
    advertised: tuple[str, int] | None
    shards: int
    metrics_port: int | None
    metrics_host: str | None
    config: Any  # CoordinatorConfig
    metadata_refresh_ms: int
    event_queue_size: int
    limits: Any = None  # ServerLimits
    security: Any = None  # ListenerSecurity
    authorizer: Any = None  # Authorizer | None
    broker_security: Any = None  # ClientSecurity
    regex_max_bytes: int = 4096
    regex_cache_bytes: int = 32 * 1024 * 1024
    cluster: bool = False
    node_id: int = 0
    cluster_session_timeout_ms: int = 10_000
    hot_standby: bool = True


def _parse(value: Any, convert: Any) -> Any:
    # Environment defaults arrive as strings when argparse did not convert them.
    return convert(value) if isinstance(value, str) else value


def _flag(value: Any, name: str) -> bool:
    """A switch given on the command line (True) or in the environment (a word)."""
    if value is None or isinstance(value, bool):
        return bool(value)
    word = str(value).strip().lower()
    if word in ("1", "true", "yes", "on"):
        return True
    if word in ("", "0", "false", "no", "off"):
        return False
    raise ValueError(f"{name} must be true or false, got {value!r}")


def settings_from_args(
    args: argparse.Namespace, *, bootstrap_servers: str | None = None, log: str | None = None, log_topic: str | None = None
) -> CoordinatorSettings:
    """Validated settings; raises ValueError with a message for the user."""
    from pystreams.coordinator.authorizer import Authorizer
    from pystreams.coordinator.config import CoordinatorConfig
    from pystreams.protocol.security import ClientSecurity, Listener, ListenerSecurity, credentials_from, uses_sasl
    from pystreams.protocol.server import ServerLimits

    bootstrap = bootstrap_servers or getattr(args, "bootstrap_servers", None)
    log_kind = log or args.log
    if log_kind not in ("kafka", "memory"):
        raise ValueError(f"--log must be kafka or memory, got {log_kind!r}")
    if log_kind == "kafka" and not bootstrap:
        raise ValueError("--log kafka needs --bootstrap-servers (or PYSTREAMS_BOOTSTRAP_SERVERS)")
    cluster = _flag(getattr(args, "cluster", None), "--cluster (PYSTREAMS_CLUSTER)")
    if cluster and log_kind != "kafka":
        raise ValueError("--cluster shares the shards of a Kafka log: it needs --log kafka")
    session = _parse(args.session_timeout_ms, int)
    heartbeat = _parse(args.heartbeat_interval_ms, int)

    def bound(value: Any, fallback: int) -> int:
        return _parse(value, int) if value is not None else fallback

    shards = _parse(args.shards, options.positive_int)
    listener = Listener.parse(args.listen)
    security = ListenerSecurity(
        protocol=listener.protocol,
        ssl_certfile=args.ssl_certfile,
        ssl_keyfile=args.ssl_keyfile,
        ssl_cafile=args.ssl_cafile,
        ssl_client_auth=args.ssl_client_auth,
        sasl_enabled_mechanisms=tuple(m.strip().upper() for m in args.sasl_enabled_mechanisms.split(",") if m.strip()),
        credentials=credentials_from(args.sasl_credentials_file) if uses_sasl(listener.protocol) else None,
    )
    super_users = [u.strip() for u in (args.super_users or "").split(";") if u.strip()]
    authorizer = Authorizer(args.acl_file, super_users) if args.acl_file else None
    config = CoordinatorConfig(
        max_group_size=_parse(args.group_consumer_max_size, options.positive_int),
        max_groups=-(-_parse(args.max_groups, options.positive_int) // shards),  # per shard, rounded up
        offset_metadata_max_bytes=_parse(args.offset_metadata_max_bytes, options.positive_int),
        max_assignor_metadata_bytes=_parse(args.assignor_metadata_max_bytes, options.positive_int),
        session_timeout_ms=session,
        min_session_timeout_ms=bound(args.min_session_timeout_ms, min(_SESSION_DEFAULTS[1], session)),
        max_session_timeout_ms=bound(args.max_session_timeout_ms, max(_SESSION_DEFAULTS[2], session)),
        heartbeat_interval_ms=heartbeat,
        min_heartbeat_interval_ms=bound(args.min_heartbeat_interval_ms, min(_HEARTBEAT_DEFAULTS[1], heartbeat)),
        max_heartbeat_interval_ms=bound(args.max_heartbeat_interval_ms, max(_HEARTBEAT_DEFAULTS[2], heartbeat)),
        rebalance_heartbeat_interval_ms=_parse(args.rebalance_heartbeat_interval_ms, options.positive_int),
        migration_policy=str(args.migration_policy).lower(),
        classic_min_session_timeout_ms=_parse(args.group_min_session_timeout_ms, options.positive_int),
        classic_max_session_timeout_ms=_parse(args.group_max_session_timeout_ms, options.positive_int),
        classic_max_group_size=_parse(args.group_max_size, options.positive_int),
        initial_rebalance_delay_ms=_parse(args.group_initial_rebalance_delay_ms, options.non_negative_int),
    )
    metrics_port = args.metrics_port
    return CoordinatorSettings(
        bootstrap_servers=bootstrap,
        log=log_kind,
        log_topic=log_topic or getattr(args, "log_topic", None) or DEFAULT_LOG_TOPIC,
        listen=(listener.host, listener.port),
        security=security,
        authorizer=authorizer,
        broker_security=options.client_security_from_args(args, prefix="broker-") if hasattr(args, "broker_security_protocol") else ClientSecurity(),
        advertised=_parse(args.advertised_listener, options.host_port) if args.advertised_listener else None,
        shards=shards,
        metrics_port=_parse(metrics_port, options.port) if metrics_port not in (None, "") else None,
        metrics_host=args.metrics_host,
        config=config,
        metadata_refresh_ms=_parse(args.metadata_refresh_ms, int),
        event_queue_size=_parse(args.event_queue_size, int),
        limits=ServerLimits(
            max_request_bytes=_parse(args.socket_request_max_bytes, options.positive_int),
            queued_max_request_bytes=_parse(args.queued_max_request_bytes, options.positive_int),
            connections_max_idle_ms=_parse(args.connections_max_idle_ms, options.positive_int),
            request_read_timeout_ms=_parse(args.request_read_timeout_ms, options.positive_int),
            max_connections=_parse(args.max_connections, options.positive_int),
            max_connections_per_ip=_parse(args.max_connections_per_ip, options.positive_int),
        ),
        regex_max_bytes=_parse(args.regex_max_bytes, options.positive_int),
        regex_cache_bytes=_parse(args.regex_cache_bytes, options.positive_int),
        cluster=cluster,
        node_id=_parse(getattr(args, "node_id", 0), options.non_negative_int),
        cluster_session_timeout_ms=_parse(getattr(args, "cluster_session_timeout_ms", 10_000), options.positive_int),
        hot_standby=not _flag(getattr(args, "no_hot_standby", None), "--no-hot-standby (PYSTREAMS_NO_HOT_STANDBY)"),
    )


# --- running -----------------------------------------------------------------------------------


@dataclass
class RunningCoordinator:
    coordinator: Any  # pystreams.coordinator.runtime.Coordinator
    address: str  # HOST:PORT clients bootstrap at
    metrics_url: str | None
    #: Returns once the shards this node serves are loaded (a node of a cluster: once it was
    #: given its shards and loaded them); raises if one failed for good.
    wait_until_loaded: Callable[[], Awaitable[None]] | None = None


@contextlib.asynccontextmanager
async def running_coordinator(settings: CoordinatorSettings) -> AsyncIterator[RunningCoordinator]:
    """Start the coordinator, its Kafka-protocol server and metrics; stop them all on exit.

    Yields as soon as the server listens (shards may still be loading; they answer
    COORDINATOR_LOAD_IN_PROGRESS until ``coordinator.wait_until_loaded()`` returns).
    """
    from pystreams.cluster import ClusterMetadata
    from pystreams.coordinator import subscriptions
    from pystreams.coordinator.log import KafkaLog, MemoryLog
    from pystreams.coordinator.metrics import MetricsHttpServer, coordinator_registry
    from pystreams.coordinator.runtime import Coordinator, StaticTopics
    from pystreams.protocol.server import KafkaProtocolServer

    loop = asyncio.get_running_loop()
    topic_source: Any
    broker_config = settings.broker_security.kafka_python_config() if settings.broker_security is not None else {}
    if settings.bootstrap_servers:
        topic_source = ClusterMetadata(settings.bootstrap_servers, client_id="pystreams-coordinator-metadata", **broker_config)
    else:
        topic_source = StaticTopics()
    if settings.log == "kafka":
        assert settings.bootstrap_servers
        record_log: Any = KafkaLog(settings.bootstrap_servers, settings.shards, topic=settings.log_topic, **broker_config)
    else:
        record_log = MemoryLog(settings.shards)
    coordinator = Coordinator(
        record_log,
        config=settings.config,
        topic_source=topic_source,
        metadata_refresh_ms=settings.metadata_refresh_ms,
        queue_size=settings.event_queue_size,
        authorizer=settings.authorizer,
        owned_shards=() if settings.cluster else None,  # a cluster node serves what the group gives it
    )
    host, port = settings.listen
    advertised_host, advertised_port = settings.advertised or (None, None)
    subscriptions.configure(max_bytes=settings.regex_cache_bytes, max_pattern_bytes=settings.regex_max_bytes)
    server = KafkaProtocolServer(
        host,
        port,
        coordinator.handle,
        limits=settings.limits,
        security=settings.security,
        advertised_host=advertised_host,
        advertised_port=advertised_port,
        node_id=settings.node_id,
        locate_group=lambda group_id: coordinator.unavailable_reason(group_id) or server.address,
    )
    _warn_if_open(settings)
    metrics = None
    cluster_node: _ClusterNode | None = None
    try:
        await coordinator.start()
        await server.start()
        ready: Callable[[], bool] = coordinator.is_ready
        wait_until_loaded = coordinator.wait_until_loaded
        if settings.cluster:
            cluster_node = await _join_cluster(settings, coordinator, server, broker_config)
            ready = functools.partial(cluster_node.ready, coordinator)
            wait_until_loaded = functools.partial(_wait_for_shards, coordinator, cluster_node)
        if settings.metrics_port is not None:
            registry = coordinator_registry(coordinator, refusals=lambda: server.refusals, connections=lambda: server.connection_count)
            metrics = MetricsHttpServer(settings.metrics_host or host, settings.metrics_port, registry, ready)
            await metrics.start()
        address = server.address
        metrics_url = None
        if metrics is not None:
            metrics_host = settings.metrics_host or advertised_host or host
            metrics_url = f"http://{metrics_host}:{metrics.port}/metrics"
        yield RunningCoordinator(coordinator, f"{address.host}:{address.port}", metrics_url, wait_until_loaded)
    finally:
        if cluster_node is not None:
            await cluster_node.stop()
        # Refuse new work and finish queued requests and appends while connections are still
        # open, so their answers go out; then close the sockets and the log.
        await coordinator.close()
        await asyncio.sleep(0.1)  # let the connections write the answers just resolved
        await server.close()
        if metrics is not None:
            await metrics.close()
        if isinstance(topic_source, ClusterMetadata):
            await loop.run_in_executor(None, topic_source.close)


@dataclass
class _ClusterNode:
    """A node's part in a coordinator cluster: its group membership, its view of the shard
    map and the task that serves what the map gives it."""

    ownership: Any  # ShardOwnership
    view: Any  # ClusterView
    keeper: asyncio.Task[None]

    def ready(self, coordinator: Any) -> bool:
        return self.ownership.serving() and self.view.settled_here(coordinator.serves)

    async def stop(self) -> None:
        # Release the shards and leave the group first: the other nodes take them over now
        # rather than after a session timeout.
        self.keeper.cancel()
        await asyncio.gather(self.keeper, return_exceptions=True)
        await self.ownership.stop()


async def _join_cluster(settings: CoordinatorSettings, coordinator: Any, server: Any, broker_config: dict[str, Any]) -> _ClusterNode:
    """Join the coordinators' group. FindCoordinator and Metadata answer from the shard map
    from then on, and the node serves the shards the map gives it."""
    from pystreams.coordinator.cluster import ClusterView, NodeInfo, ShardOwnership, keep_serving

    await coordinator.log.open()  # the log topic exists before the group subscribes to it
    view = ClusterView(coordinator.shard_for, lambda: server.address, coordinator.unavailable_reason)
    server.set_cluster(locate_group=view.locate, cluster_nodes=view.nodes)
    me = server.address
    assert settings.bootstrap_servers
    ownership = ShardOwnership(
        settings.bootstrap_servers,
        settings.log_topic,
        NodeInfo(me.node_id, me.host, me.port),
        loop=asyncio.get_running_loop(),
        release=coordinator.release,
        served=lambda: coordinator.served_shards,
        on_map=view.update,
        session_timeout_ms=settings.cluster_session_timeout_ms,
        heartbeat_interval_ms=max(100, settings.cluster_session_timeout_ms // 10),
        client_config=broker_config,
    )
    coordinator.serve_only_while(ownership.why_not_serving)
    keeper = asyncio.create_task(
        keep_serving(view, coordinator, lambda: ownership.held, refence_backoff_s=settings.cluster_session_timeout_ms / 1000, hot_standby=settings.hot_standby),
        name="pystreams-coordinator-shards",
    )
    ownership.start()
    return _ClusterNode(ownership, view, keeper)


async def _wait_for_shards(coordinator: Any, node: _ClusterNode) -> None:
    """A node of a cluster is loaded once it has a map in which every shard has an owner and it
    serves its own (a node that joins gets its shards only in a second round)."""
    while not node.ready(coordinator):
        if node.ownership.failure is not None:
            raise RuntimeError(f"this node cannot take part in the coordinator cluster: {node.ownership.failure}")
        await asyncio.sleep(0.1)


def _warn_if_open(settings: CoordinatorSettings) -> None:
    """Open on loopback is the dev experience; open to a network is everyone's group coordinator."""
    from pystreams.protocol.security import is_loopback

    host = settings.listen[0]
    if settings.security is not None and not settings.security.authenticates and not is_loopback(host):
        logging.getLogger("pystreams.coordinator").warning(
            "listening on %s without authentication: any client that reaches it can join, commit and alter any group. "
            "Use a SASL_SSL listener (--listen SASL_SSL://HOST:PORT) and --acl-file.",
            host,
        )
    if settings.authorizer is not None and settings.security is not None and not settings.security.authenticates:
        logging.getLogger("pystreams.coordinator").warning("ACLs are enforced but clients do not authenticate: every client is User:ANONYMOUS")


def _install_stop_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):  # not the main thread
            loop.add_signal_handler(signum, stop.set)


async def wait_loaded_or_stopped(running: RunningCoordinator, stop: asyncio.Event) -> bool:
    """True once every shard is loaded; False if asked to stop first. Raises if a shard failed."""
    loaded = asyncio.ensure_future((running.wait_until_loaded or running.coordinator.wait_until_loaded)())
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({loaded, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    if loaded.done():
        loaded.result()  # raises if a shard failed for good
        return True
    loaded.cancel()
    return False


async def serve(settings: CoordinatorSettings, *, stop: asyncio.Event | None = None) -> int:
    """Run until SIGTERM/SIGINT (or ``stop``); the exit status."""
    from pystreams.coordinator.log import LogError

    stop = stop or asyncio.Event()
    _install_stop_signals(stop)
    try:
        async with running_coordinator(settings) as running:
            where = "memory (lost on exit)" if settings.log == "memory" else f"topic {settings.log_topic!r} at {settings.bootstrap_servers}"
            print(f"record log: {where}, {settings.shards} shards")
            print(f"{LISTEN_LINE_PREFIX}{running.address}")
            if running.metrics_url:
                print(f"{METRICS_LINE_PREFIX}{running.metrics_url}")
            sys.stdout.flush()
            try:
                if await wait_loaded_or_stopped(running, stop):
                    print(READY_LINE, flush=True)
            except RuntimeError as error:
                print(f"pystreams coordinator: {error}", file=sys.stderr)
                return 1
            await stop.wait()
            print("stopping the coordinator", flush=True)
    except LogError as error:
        print(f"pystreams coordinator: {error}", file=sys.stderr)
        return 1
    except OSError as error:
        print(f"pystreams coordinator: cannot listen: {error}", file=sys.stderr)
        return 1
    return 0


async def repair_log(settings: CoordinatorSettings, skip_unreadable: bool) -> int:
    """``--repair``: 0 when the log is clean (or was just repaired), 1 when unreadable records remain."""
    from pystreams.coordinator import repair
    from pystreams.coordinator.log import KafkaLog

    if settings.log != "kafka" or not settings.bootstrap_servers:
        print("pystreams coordinator: --repair reads the Kafka log: give --bootstrap-servers (and --log-topic, --shards)", file=sys.stderr)
        return 2
    log = KafkaLog(settings.bootstrap_servers, settings.shards, topic=settings.log_topic)
    await log.open()
    findings = await repair.find_unreadable(log)
    if not findings:
        print(f"log {settings.log_topic!r}: every record can be replayed")
        return 0
    print(f"log {settings.log_topic!r}: {len(findings)} record(s) cannot be replayed:")
    for finding in findings:
        print(f"  {finding.describe()}")
    if not skip_unreadable:
        print("run again with --skip-unreadable to tombstone them; their groups then load from their other records")
        return 1
    await repair.skip(log, findings)
    print(f"tombstoned {len(findings)} key(s); restart the coordinator to serve the groups again")
    return 0


def run(args: argparse.Namespace) -> int:
    try:
        settings = settings_from_args(args)
    except (ValueError, argparse.ArgumentTypeError) as error:
        print(f"pystreams coordinator: {error}", file=sys.stderr)
        return 2
    configure_logging(args.log_level)
    if getattr(args, "repair", False):
        return asyncio.run(repair_log(settings, args.skip_unreadable))
    if getattr(args, "skip_unreadable", False):
        print("pystreams coordinator: --skip-unreadable needs --repair", file=sys.stderr)
        return 2
    try:
        return asyncio.run(serve(settings))
    except KeyboardInterrupt:
        return 130


def main(argv: list[str] | None = None) -> int:
    """Run without the ``pystreams`` CLI (``python -m pystreams.commands.coordinator``)."""
    parser = argparse.ArgumentParser(prog="pystreams coordinator", description=HELP)
    configure(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
