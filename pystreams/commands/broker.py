"""``pystreams broker``: run the embedded Kafka-compatible broker in the foreground (loopback by default).

Memory storage only: every topic is gone when it stops. Meant for development and tests, not
for production data.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType

from pystreams.commands import options

HELP = "run the embedded Kafka-compatible broker (Tansu, memory storage) on 127.0.0.1"

PORT_ENV = "PYSTREAMS_BROKER_PORT"
HOST_ENV = "PYSTREAMS_BROKER_HOST"
ADVERTISED_HOST_ENV = "PYSTREAMS_BROKER_ADVERTISED_HOST"
LOG_FILE_ENV = "PYSTREAMS_BROKER_LOG_FILE"
STARTUP_TIMEOUT_ENV = "PYSTREAMS_BROKER_STARTUP_TIMEOUT"

DEFAULT_PORT = 9092
DEFAULT_STARTUP_TIMEOUT = 15.0

#: The line that announces the address; scripts and tests look for this prefix.
BOOTSTRAP_LINE_PREFIX = "bootstrap servers: "

_EPILOG = f"""\
environment variables (a command-line option wins over its variable):
  {PORT_ENV:<34} default for --port
  {HOST_ENV:<34} default for --host
  {ADVERTISED_HOST_ENV:<34} default for --advertised-host
  {LOG_FILE_ENV:<34} default for --log-file
  {STARTUP_TIMEOUT_ENV:<34} default for --startup-timeout

Stops cleanly on Ctrl-C (SIGINT) or SIGTERM.
"""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = _EPILOG
    # String defaults go through ``type`` like command-line values, so a bad environment
    # variable is reported as a usage error of this command only, at parse time.
    parser.add_argument(
        "--port",
        type=options.port,
        default=os.environ.get(PORT_ENV, str(DEFAULT_PORT)),
        help=f"TCP port to listen on; 0 picks a free port (default: {DEFAULT_PORT}, env {PORT_ENV})",
    )
    parser.add_argument(
        "--host",
        default=os.environ.get(HOST_ENV, "127.0.0.1"),
        help=f"address to listen on (default: 127.0.0.1; a pod IP or 0.0.0.0 in a container; env {HOST_ENV})",
    )
    parser.add_argument(
        "--advertised-host",
        default=os.environ.get(ADVERTISED_HOST_ENV) or None,
        help=f"host name clients are told to connect to (default: --host; env {ADVERTISED_HOST_ENV})",
    )
    parser.add_argument(
        "--log-file",
        default=os.environ.get(LOG_FILE_ENV),
        metavar="PATH",
        help=f"append the broker's own log to PATH (default: a temporary file removed on exit; env {LOG_FILE_ENV})",
    )
    parser.add_argument(
        "--startup-timeout",
        type=options.positive_seconds,
        default=os.environ.get(STARTUP_TIMEOUT_ENV, str(DEFAULT_STARTUP_TIMEOUT)),
        metavar="SECONDS",
        help=f"give up if the broker does not answer Kafka requests by then (default: {DEFAULT_STARTUP_TIMEOUT:g}, env {STARTUP_TIMEOUT_ENV})",
    )


def run(args: argparse.Namespace) -> int:
    from pystreams.broker import BrokerStartError, EmbeddedBroker

    stop_requested = threading.Event()
    previous_handlers = _install_stop_handlers(stop_requested)
    broker = EmbeddedBroker(
        port=args.port or None,
        host=args.host,
        advertised_host=args.advertised_host,
        log_path=args.log_file,
        startup_timeout=args.startup_timeout,
    )
    try:
        try:
            broker.start()
        except BrokerStartError as error:
            print(f"pystreams broker: {error}", file=sys.stderr)
            return 1
        print("embedded Kafka broker (Tansu, memory storage) is ready")
        print(f"{BOOTSTRAP_LINE_PREFIX}{broker.bootstrap_servers}")
        print(f"broker log: {broker.log_path}")
        print("press Ctrl-C to stop", flush=True)
        while not stop_requested.wait(0.25):
            if not broker.is_running():
                print(
                    f"pystreams broker: the broker exited unexpectedly with status {broker.returncode()}:\n{broker.log_tail(20)}",
                    file=sys.stderr,
                )
                return 1
        print("stopping the broker", flush=True)
        return 0
    finally:
        broker.stop()
        _restore_handlers(previous_handlers)


#: What ``signal.signal`` returns and accepts (``signal.Handlers`` members are ints).
_Handler = Callable[[int, FrameType | None], object] | int | None


def _install_stop_handlers(stop_requested: threading.Event) -> dict[int, _Handler]:
    """Turn SIGINT/SIGTERM into a stop request; only possible from the main thread."""

    def request_stop(signum: int, frame: FrameType | None) -> None:
        stop_requested.set()

    previous: dict[int, _Handler] = {}
    if threading.current_thread() is not threading.main_thread():
        return previous  # Ctrl-C then arrives as KeyboardInterrupt; ``finally`` still stops
    for signum in (signal.SIGINT, signal.SIGTERM):
        previous[signum] = signal.signal(signum, request_stop)
    return previous


def _restore_handlers(previous: dict[int, _Handler]) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler)


def main(argv: list[str] | None = None) -> int:
    """Run this command without the ``pystreams`` CLI (``python -m pystreams.commands.broker``)."""
    parser = argparse.ArgumentParser(prog="pystreams broker", description=HELP)
    configure(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
