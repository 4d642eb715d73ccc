"""Where a local broker's nodes live: all on one loopback address, or each in a network namespace of its own.

A placement gives each node its address and ports and the command prefix that starts a process there; it is
chosen once, from ``KafkaBrokerConfig.netns``, and the rest of the broker does not ask which one it has.
``Loopback`` picks free ports on one address; ``Namespaces`` puts node N on host ``nN`` of a
``sotw.network.Network`` (made and removed with the broker unless one is given), where every node can use the
same fixed ports on its own address.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from sotw.broker.config import NETNS_PORT, KafkaBrokerConfig, NodePorts
from sotw.broker.net import free_port, port_in_use
from sotw.errors import BrokerError
from sotw.network import Network, require


def host_name(node: int) -> str:
    """The network host of node ``node`` in a namespace: ``n1``, ``n2``, ..."""
    return f"n{node}"


class Placement(Protocol):
    """Where the nodes of a broker live."""

    @property
    def network(self) -> Network | None:
        """The network the nodes are hosts of (None on loopback)."""

    def open(self) -> None:
        """Make what the nodes need before their ports are chosen (a network), or refuse saying why."""

    def address(self, node: int) -> str:
        """The address node ``node`` listens and is reached on."""

    def ports(self, nodes: int) -> dict[int, NodePorts]:
        """Every node's ports, by node id (1 to ``nodes``)."""

    def command(self, node: int, argv: Sequence[str]) -> list[str]:
        """``argv`` as a command run where node ``node`` lives."""

    def close(self) -> None:
        """Remove what ``open`` made (idempotent)."""


class Loopback:
    """Every node on ``config.host``, each listener on a port of its own (free ones unless ``config.port``)."""

    network = None

    def __init__(self, config: KafkaBrokerConfig) -> None:
        self.config = config

    def open(self) -> None:
        """Refuse a taken ``config.port``.

        Raises
        ------
        BrokerError
            If something already accepts connections on it.
        """
        cfg = self.config
        if cfg.port and port_in_use(cfg.host, cfg.port):
            raise BrokerError(f"port {cfg.port} on {cfg.host} is taken; choose another with --port or use 0")

    def address(self, node: int) -> str:
        """``config.host``, for every node."""
        return self.config.host

    def ports(self, nodes: int) -> dict[int, NodePorts]:
        """Free ports for every listener (and a proxy's listener when proxied), none picked twice."""
        cfg = self.config
        taken: set[int] = {cfg.port} if cfg.port else set()

        def pick() -> int:
            while (port := free_port(cfg.host)) in taken:
                pass
            taken.add(port)
            return port

        ports = {}
        for node in range(1, nodes + 1):
            client = cfg.port if node == 1 and cfg.port else pick()
            listen = pick() if cfg.proxied else client
            ports[node] = NodePorts(client=client, listen=listen, internal=pick(), controller=pick())
        return ports

    def command(self, node: int, argv: Sequence[str]) -> list[str]:
        """``argv`` as it is."""
        return list(argv)

    def close(self) -> None:
        """Nothing to remove."""


class Namespaces:
    """Node N in host ``nN``'s namespace of a network, on its address there, with the same fixed ports each.

    Parameters
    ----------
    config
        The broker's configuration: ``port`` (or ``NETNS_PORT``) is every node's client port.
    network
        A started network holding hosts ``n1``...``nN``, left open at ``close``; None makes one at ``open``
        and removes it at ``close``.
    """

    def __init__(self, config: KafkaBrokerConfig, network: Network | None = None) -> None:
        self.config = config
        self._network = network
        self._owned = network is None

    @property
    def network(self) -> Network | None:
        """The nodes' network (None before ``open`` when the broker makes its own)."""
        return self._network

    def open(self) -> None:
        """Make and start the network of hosts ``n1``...``nN``, or check the one given holds them.

        Raises
        ------
        NetworkError
            Naming what is missing (root, ``ip``, ``tc``, ``nft``) and how to get it, or what failed to be made.
        BrokerError
            If the given network is not started, or lacks a node's host.
        """
        hosts = tuple(host_name(n) for n in range(1, self.config.nodes + 1))
        if self._network is None:
            require()
            self._network = Network(hosts=hosts).start()
            return
        lacking = [h for h in hosts if h not in self._network.hosts]
        if lacking:
            raise BrokerError(
                f"the network given to the broker lacks hosts {lacking} (it has "
                f"{sorted(self._network.hosts) or 'none: start it first'}); node N lives on host nN"
            )

    def _started(self) -> Network:
        if self._network is None:
            raise BrokerError("the broker's network is not made yet: start the broker first")
        return self._network

    def address(self, node: int) -> str:
        """Host ``nN``'s address on the network's bridge."""
        return self._started().address(host_name(node))

    def ports(self, nodes: int) -> dict[int, NodePorts]:
        """The same fixed ports for every node: client, internal and controller in a row."""
        client = self.config.port or NETNS_PORT
        same = NodePorts(client=client, listen=client, internal=client + 1, controller=client + 2)
        return dict.fromkeys(range(1, nodes + 1), same)

    def command(self, node: int, argv: Sequence[str]) -> list[str]:
        """``ip netns exec <host nN's namespace> ARGV...``."""
        return self._started().command(host_name(node), argv)

    def close(self) -> None:
        """Remove the network if the broker made it; a given one stays with its owner."""
        if self._owned and self._network is not None:
            network, self._network = self._network, None
            network.close()


def placement(config: KafkaBrokerConfig, network: Network | None = None) -> Placement:
    """The placement ``config`` asks for: ``Namespaces`` with ``netns`` (or a given network), else ``Loopback``."""
    if config.netns or network is not None:
        return Namespaces(config, network)
    return Loopback(config)
