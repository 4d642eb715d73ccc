"""Loopback ports and the first answer of a Kafka API: what a local broker needs before clients connect."""

from __future__ import annotations

import socket
import time
from collections.abc import Mapping

from confluent_kafka.admin import AdminClient

from sotw.errors import BrokerError


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


def wait_for_kafka(bootstrap: str, timeout: float, settings: Mapping[str, str] | None = None) -> None:
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
