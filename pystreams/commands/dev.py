"""``pystreams dev``: the embedded Kafka broker and a coordinator together, for local work.

Starts the broker (Tansu, memory storage: everything is gone when it stops), then a coordinator
whose record log is a topic of that broker, prints both addresses, and stops both cleanly on
Ctrl-C or SIGTERM. Everything a local run needs is started inside :func:`_serve_dev`, one
component after another in a single ``AsyncExitStack``; more components (workers running an
app) slot in there.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys

from pystreams.commands import coordinator as coordinator_command

HELP = "start the embedded Kafka broker and a coordinator together for local development"

BROKER_PORT_ENV = "PYSTREAMS_BROKER_PORT"
DEFAULT_BROKER_PORT = 9092

#: The line that announces the broker; the coordinator's lines follow coordinator_command's.
BROKER_LINE_PREFIX = "broker: "


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--broker-port",
        type=coordinator_command._port,
        default=os.environ.get(BROKER_PORT_ENV, str(DEFAULT_BROKER_PORT)),
        help=f"port of the embedded broker; 0 picks a free port (default: {DEFAULT_BROKER_PORT}, env {BROKER_PORT_ENV})",
    )
    coordinator_command.add_coordinator_options(parser, cluster=False)


def run(args: argparse.Namespace) -> int:
    from pystreams.broker import BrokerStartError, EmbeddedBroker

    coordinator_command._configure_logging(args.log_level)
    broker = EmbeddedBroker(port=args.broker_port or None)
    try:
        try:
            broker.start()
        except BrokerStartError as error:
            print(f"pystreams dev: {error}", file=sys.stderr)
            return 1
        print(f"{BROKER_LINE_PREFIX}{broker.bootstrap_servers}", flush=True)
        try:
            settings = coordinator_command.settings_from_args(args, bootstrap_servers=broker.bootstrap_servers, log="kafka")
        except ValueError as error:
            print(f"pystreams dev: {error}", file=sys.stderr)
            return 2
        try:
            return asyncio.run(_serve_dev(settings))
        except KeyboardInterrupt:
            return 130
    finally:
        print("stopping the broker", flush=True)
        broker.stop()


async def _serve_dev(settings: coordinator_command.CoordinatorSettings) -> int:
    from pystreams.coordinator.log import LogError

    stop = asyncio.Event()
    coordinator_command._install_stop_signals(stop)
    try:
        async with contextlib.AsyncExitStack() as components:
            running = await components.enter_async_context(coordinator_command.running_coordinator(settings))
            print(f"{coordinator_command.LISTEN_LINE_PREFIX}{running.address}")
            if running.metrics_url:
                print(f"{coordinator_command.METRICS_LINE_PREFIX}{running.metrics_url}")
            sys.stdout.flush()
            if not await coordinator_command.wait_loaded_or_stopped(running, stop):
                return 0
            # Later: workers for an app join here, bootstrapped at running.address.
            print(f"{coordinator_command.READY_LINE}; clients bootstrap at {running.address} "
                  f"(the group coordinator), data lives at {settings.bootstrap_servers}; Ctrl-C stops both", flush=True)
            await stop.wait()
            print("stopping the coordinator", flush=True)
    except (LogError, RuntimeError, OSError) as error:
        print(f"pystreams dev: {error}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pystreams dev", description=HELP)
    configure(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
