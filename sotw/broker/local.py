"""The broker a command starts when it is not given ``--bootstrap``, chosen once by name.

``local_broker("kafka")`` (the default) is Apache Kafka; ``"tansu"`` and ``"tansu-durable"`` are the embedded
Tansu broker on memory or on a local S3 server. Whatever is chosen, the harness drives it through the same
``LocalBroker`` methods.
"""

from __future__ import annotations

from pathlib import Path
from types import TracebackType
from typing import Protocol, Self

from sotw.errors import BrokerError
from sotw.outage import Outage

#: The local brokers by name, the default first.
BROKERS = ("kafka", "tansu", "tansu-durable")

#: Names older versions took, and what to say instead.
_RENAMED = {
    "memory": "the default broker is now Apache Kafka ('kafka'); the old in-memory one is 'tansu'",
    "durable": "Apache Kafka ('kafka', the default) keeps its data on disk; the old durable one is 'tansu-durable'",
}


class LocalBroker(Protocol):
    """What the harness, the tests and ``sotw broker`` use of a broker they started."""

    @property
    def bootstrap(self) -> str:
        """``HOST:PORT[,...]`` clients connect to."""

    @property
    def pids(self) -> dict[str, int]:
        """The broker's processes by name, for resource sampling."""

    @property
    def paused(self) -> bool:
        """True between ``pause`` and ``resume``."""

    @property
    def outages(self) -> list[Outage]:
        """Every finished incident, oldest first."""

    def check_alive(self) -> None:
        """Raise ``BrokerError`` if the broker is gone."""

    def pause(self) -> None:
        """SIGSTOP the broker."""

    def resume(self) -> Outage | None:
        """SIGCONT it; the pause as an ``Outage``."""

    def restart(self, downtime_s: float = 0.0, kill: bool = False, lose_data: bool = False) -> Outage:
        """Stop and start it again; the restart as an ``Outage``."""

    def start(self) -> Self:
        """Start it and wait until it answers."""

    def stop(self, timeout: float | None = None) -> None:
        """Stop every process it started."""

    def __enter__(self) -> Self:
        """``start``."""

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """``stop``."""


def check_broker(name: str) -> str:
    """``name`` if it is one of ``BROKERS``.

    Raises
    ------
    BrokerError
        Naming the choices (and what an old name became).
    """
    if name in BROKERS:
        return name
    hint = f"; {_RENAMED[name]}" if name in _RENAMED else ""
    raise BrokerError(f"broker must be one of {', '.join(BROKERS)}, got {name!r}{hint}")


def local_broker(
    name: str = "kafka", log_path: Path | None = None, nodes: int = 1, proxied: bool = False
) -> LocalBroker:
    """A broker of kind ``name`` (not started yet: use it as a context manager, or call ``start``).

    Parameters
    ----------
    name
        One of ``BROKERS``.
    log_path
        Where the broker's output goes (per node ``<stem>-N<suffix>`` for a Kafka cluster).
    nodes
        Kafka nodes; Tansu has one.
    proxied
        Clients reach the broker through a ``sotw.proxy.TcpProxy`` (network incidents).
    """
    from sotw.broker.kafka import KafkaBroker
    from sotw.broker.tansu import TansuBroker

    check_broker(name)
    if name == "kafka":
        return KafkaBroker(nodes=nodes, log_path=log_path, proxied=proxied)
    if nodes != 1:
        raise BrokerError(
            f"the embedded Tansu broker has one node, not {nodes}: use --broker kafka for a cluster"
        )
    return TansuBroker(log_path=log_path, durable=name == "tansu-durable", proxied=proxied)
