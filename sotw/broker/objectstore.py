"""A local S3 server (moto's) that gives the embedded broker storage surviving its own restarts.

Tansu's ``s3://`` engine keeps every batch and every bit of metadata as an object. Served by a separate
process on loopback, those objects outlive the Tansu process, so a broker restarted on the same bucket comes
back with every acknowledged record. They live in moto's memory: they are lost when moto stops, which happens
only when the broker is closed.
"""

from __future__ import annotations

import http.client
import importlib.util
import logging
import subprocess
import sys
import time
from pathlib import Path

from sotw.errors import BrokerError
from sotw.processgroup import ProcessGroup, stop_process

log = logging.getLogger(__name__)

#: Credentials and region for the local server: moto checks neither, Tansu's S3 client needs some.
_DUMMY_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "sotw",
    "AWS_SECRET_ACCESS_KEY": "sotw-local-only",
    "AWS_REGION": "us-east-1",
}


class LocalS3:
    """moto's S3 server as a child process on a loopback port.

    Parameters
    ----------
    group
        The process group the server joins, so it dies with the broker's owner.
    host
        Loopback address to bind.
    port
        TCP port; a free one is picked by the caller.
    log_path
        Where the server's own output goes.
    start_timeout
        Seconds to wait for it to answer HTTP.
    """

    def __init__(
        self, group: ProcessGroup, host: str, port: int, log_path: Path, start_timeout: float = 20.0
    ) -> None:
        self.host = host
        self.port = port
        self.log_path = log_path
        self.process = self._start(group, start_timeout)

    @property
    def endpoint(self) -> str:
        """The server's HTTP address, as ``AWS_ENDPOINT`` takes it."""
        return f"http://{self.host}:{self.port}"

    def _start(self, group: ProcessGroup, timeout: float) -> subprocess.Popen[bytes]:
        if importlib.util.find_spec("moto") is None or importlib.util.find_spec("flask_cors") is None:
            raise BrokerError(
                "the durable broker needs moto's S3 server: run `make setup`, or "
                "`pip install 'moto[s3]' flask flask-cors`; or drop --durable"
            )
        proc = group.spawn(
            [sys.executable, "-m", "moto.server", "-H", self.host, "-p", str(self.port)], {}, self.log_path
        )
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise BrokerError(
                    f"the local S3 server (moto) exited with code {proc.returncode} while starting on "
                    f"{self.host}:{self.port} (port in use?); see {self.log_path}"
                )
            try:
                self._request("GET", "/")
                break  # any HTTP answer means it is serving
            except OSError:
                if time.monotonic() > deadline:
                    stop_process(proc, kill=True)
                    raise BrokerError(
                        f"the local S3 server (moto) did not answer on {self.endpoint} within {timeout:g} s; "
                        f"see {self.log_path}"
                    ) from None
                time.sleep(0.05)
        log.info("local S3 server on %s (log %s)", self.endpoint, self.log_path)
        return proc

    def create_bucket(self, name: str) -> None:
        """Create bucket ``name``; raise ``BrokerError`` naming the server's answer if it refuses."""
        try:
            status, reason = self._request("PUT", f"/{name}")
        except OSError as exc:
            raise BrokerError(
                f"could not create bucket {name!r} on the local S3 server at {self.endpoint}: {exc}"
            ) from None
        if status != 200:
            raise BrokerError(
                f"the local S3 server refused to create bucket {name!r}: HTTP {status} {reason}; "
                f"see {self.log_path}"
            )

    def _request(self, method: str, path: str) -> tuple[int, str]:
        """Send one unsigned request (moto does not check signatures); return its status and reason."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=10.0)
        try:
            conn.request(method, path)
            response = conn.getresponse()
            response.read()
            return response.status, response.reason
        finally:
            conn.close()

    def tansu_env(self) -> dict[str, str]:
        """The environment Tansu's ``s3://`` engine needs to use this server (plain HTTP, dummy keys)."""
        return {"AWS_ENDPOINT": self.endpoint, "AWS_ALLOW_HTTP": "true", **_DUMMY_CREDENTIALS}

    def stop(self) -> None:
        """Stop the server; every object it held is gone."""
        stop_process(self.process)
