"""Hosts on one machine, each in a network namespace on a shared bridge, with faults between them.

``Network`` (``sotw.network.hosts``) makes the bridge and the namespaces, runs commands inside them and removes
everything on exit, Ctrl-C, SIGTERM, or at the next start after a SIGKILL (``sotw.network.names``). Its faults
(``sotw.network.faults``) are silent partitions (one-way or both ways) and random loss with nftables, and
bandwidth caps with ``tc tbf``; each returns a ``Fault`` to heal. Building a network needs root, iproute2 and
nftables (``sotw.network.system.require`` says what is missing; ``make setup`` installs nftables).
"""

from sotw.errors import NetworkError
from sotw.network.faults import Fault, parse_rate
from sotw.network.hosts import GATEWAY, HOST_INTERFACE, Host, Network, NetworkConfig
from sotw.network.lifetime import close_all
from sotw.network.names import PREFIX, Names, remove_leftovers
from sotw.network.system import missing, require

__all__ = [
    "GATEWAY",
    "HOST_INTERFACE",
    "PREFIX",
    "Fault",
    "Host",
    "Names",
    "Network",
    "NetworkConfig",
    "NetworkError",
    "close_all",
    "missing",
    "parse_rate",
    "remove_leftovers",
    "require",
]
