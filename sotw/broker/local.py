"""The broker a command starts when it is not given ``--bootstrap``, chosen once by name.

``kafka`` is one Apache Kafka node, ``kafka-3`` a three-node cluster (replication factor 3,
``min.insync.replicas=2``). Whichever is chosen, the harness drives it through the same ``LocalBroker``
methods.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Protocol, Self

from sotw.errors import BrokerError
from sotw.outage import Outage

if TYPE_CHECKING:
    from sotw.broker.kafka import PartitionState
    from sotw.kafka import KafkaConfig
    from sotw.network import Network

#: The local brokers by name (the default first) and their node counts.
BROKERS = ("kafka", "kafka-3")
BROKER_NODES = {"kafka": 1, "kafka-3": 3}

#: Names older versions took (the embedded Tansu broker's storages), and what to say instead.
_GONE = {
    "memory": "the embedded Tansu broker is gone: sotw runs Apache Kafka ('kafka')",
    "durable": "Apache Kafka ('kafka') keeps its data on disk: a restart keeps every acknowledged record",
}


class LocalBroker(Protocol):
    """What the harness, the tests and the benchmarks use of a broker they started."""

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

    @property
    def node_ids(self) -> list[int]:
        """The nodes' ids (``[1]`` for one node)."""

    @property
    def network(self) -> Network | None:
        """The network whose hosts ``n1``... the nodes are (None on loopback)."""

    @property
    def down_nodes(self) -> list[int]:
        """Nodes stopped on purpose and not started again."""

    def kafka_config(self) -> KafkaConfig:
        """A ``KafkaConfig`` for it as its admin (with the admin's settings when secured)."""

    def check_alive(self) -> None:
        """Raise ``BrokerError`` if the broker is gone."""

    def pause(self, node: int | None = None) -> None:
        """SIGSTOP the broker (every node, or one)."""

    def resume(self) -> Outage | None:
        """SIGCONT it; the pause as an ``Outage``."""

    def restart(self, downtime_s: float = 0.0, kill: bool = False, lose_data: bool = False) -> Outage:
        """Stop and start it again; the restart as an ``Outage``."""

    def stop_node(self, node: int | None = None, kill: bool = False) -> None:
        """Stop one node (SIGTERM, or SIGKILL with ``kill``) until ``start_node``."""

    def start_node(self, node: int | None = None, lose_data: bool = False) -> None:
        """Start a stopped node (or every stopped one) and wait until it serves."""

    def partitions(self, topics: Iterable[str] | None = None) -> list[PartitionState]:
        """Every partition of ``topics`` as the cluster's metadata shows it now."""

    def under_replicated(self, topics: Iterable[str] | None = None) -> list[tuple[str, int]]:
        """Partitions of ``topics`` (every topic by default) with fewer replicas in sync than assigned."""

    def active_controller(self) -> int | None:
        """The node leading the KRaft controller quorum now; None during an election."""

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
    hint = f"; {_GONE[name]}" if name in _GONE else ""
    raise BrokerError(f"broker must be one of {', '.join(BROKERS)}, got {name!r}{hint}")


def local_broker(
    name: str = "kafka",
    log_path: Path | None = None,
    proxied: bool = False,
    overrides: Mapping[str, str] | None = None,
    security: str = "plaintext",
    netns: bool = False,
    network: Network | None = None,
) -> LocalBroker:
    """The broker ``name`` (not started yet: use it as a context manager, or call ``start``).

    Parameters
    ----------
    name
        One of ``BROKERS``.
    log_path
        Where the broker's output goes (per node ``<stem>-N<suffix>`` for a cluster).
    proxied
        Clients reach each node through a ``sotw.proxy.TcpProxy`` (network incidents).
    overrides
        ``server.properties`` settings for every node, after sotw's own (a drill's ``broker_settings``).
    security
        ``plaintext``, ``ssl``, ``sasl_plaintext`` or ``sasl_ssl`` (docs/broker.md); a secured broker's admin
        settings are ``KafkaBroker.client_settings`` and its file ``admin_config_path``.
    netns
        Each node in a network namespace of its own (``KafkaBroker.network``, hosts ``n1``...), for faults
        between nodes; needs root, iproute2 and nftables, and ``start`` raises ``NetworkError`` naming what
        is missing. Not with ``proxied``.
    network
        A started network holding hosts ``n1``...``nN`` to put the nodes in (implies ``netns``), left open
        when the broker stops: a run's network, whose other hosts (the pipeline's) share the nodes' bridge.
    """
    from sotw.broker.kafka import KafkaBroker

    return KafkaBroker(
        nodes=BROKER_NODES[check_broker(name)],
        log_path=log_path,
        proxied=proxied,
        overrides=dict(overrides or {}),
        security=security,
        netns=netns,
        network=network,
    )
