"""A network of hosts on one machine: a bridge, and per host a network namespace with its own address on it.

``Network`` makes them on ``start`` (or ``with``), runs commands inside a host's namespace, applies the faults
of ``sotw.network.faults`` between hosts, and removes everything on ``close``: at the end of the ``with``
block (Ctrl-C included), at exit, and on SIGTERM. What a process killed with SIGKILL left is removed by the
next network started on the machine (``sotw.network.names``).

The root namespace reaches every host through the bridge's own address (the ``gateway``): the harness, its
admin clients and probes can stay there, and ``GATEWAY`` names it in faults.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import re
import subprocess
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from types import TracebackType
from typing import Any

from sotw.errors import NetworkError
from sotw.network.faults import Fault, FaultTable, loss_rules, parse_rate, partition_rules, tbf_args
from sotw.network.lifetime import keep, machine_lock, release
from sotw.network.names import Names, Tag, remove, remove_leftovers
from sotw.network.system import require, run, tool

log = logging.getLogger(__name__)

#: The name of the root namespace (the bridge's address) in faults.
GATEWAY = "gateway"

#: The interface name of each host's veth end inside its namespace.
HOST_INTERFACE = "eth0"

_HOST_NAME = re.compile(r"[a-z][a-z0-9]{0,15}")


@dataclass(frozen=True)
class NetworkConfig:
    """A network of hosts on one machine.

    Parameters
    ----------
    hosts
        The hosts' names (lower-case letters and digits, starting with a letter, at most 16), each given a
        namespace and the next address of the subnet (``.2``, ``.3``, ...; the bridge is ``.1``).
    subnet
        The ``/24`` the hosts share, ``10.77.N.0/24`` style. None: the first ``10.77.N.0/24`` (N from 0)
        that no route of the root namespace overlaps.
    stop_grace_s
        Seconds the processes started in the hosts (``popen``) get after SIGTERM before SIGKILL, on close.
    """

    hosts: tuple[str, ...] = ("a", "b")
    subnet: str | None = None
    stop_grace_s: float = 5.0

    def __post_init__(self) -> None:
        hosts = (self.hosts,) if isinstance(self.hosts, str) else tuple(self.hosts)
        object.__setattr__(self, "hosts", hosts)
        if not 1 <= len(hosts) <= 99:
            raise NetworkError(f"hosts must name 1 to 99 hosts, got {len(hosts)}")
        for name in hosts:
            if not isinstance(name, str) or not _HOST_NAME.fullmatch(name) or name == GATEWAY:
                raise NetworkError(
                    f"hosts: {name!r} is not a host name: lower-case letters and digits, starting with a "
                    f"letter, at most 16, and not {GATEWAY!r}"
                )
        if len(set(hosts)) != len(hosts):
            raise NetworkError(f"hosts must be different names, got {list(hosts)}")
        if self.subnet is not None:
            try:
                net = ipaddress.IPv4Network(self.subnet)
            except ValueError:
                net = None
            if net is None or net.prefixlen != 24 or not net.is_private:
                raise NetworkError(
                    f"subnet must be a private IPv4 /24 such as '10.77.3.0/24', got {self.subnet!r}"
                )
        if not isinstance(self.stop_grace_s, int | float) or self.stop_grace_s < 0:
            raise NetworkError(f"stop_grace_s must be a number of seconds >= 0, got {self.stop_grace_s!r}")


@dataclass(frozen=True)
class Host:
    """One host of a started network.

    Attributes
    ----------
    name
        Its name in the configuration and in faults.
    namespace
        Its network namespace (``ip netns exec NAMESPACE ...``).
    address
        Its IPv4 address on the bridge.
    veth
        The root namespace's end of its veth pair (the end inside is ``HOST_INTERFACE``).
    """

    name: str
    namespace: str
    address: str
    veth: str


class Network(contextlib.AbstractContextManager["Network"]):
    """A bridge and one network namespace per host, with faults between hosts; removed on close.

    Parameters
    ----------
    config
        What to make; keyword arguments change single fields of it (``Network(hosts=("n1", "n2", "sim"))``).

    Raises
    ------
    NetworkError
        From the constructor if this process is not root or ``ip``, ``tc`` or ``nft`` is missing, naming what is
        missing and how to get it.
    """

    def __init__(self, config: NetworkConfig | None = None, /, **changes: Any) -> None:
        require()
        self.config = replace(config or NetworkConfig(), **changes)
        self.hosts: dict[str, Host] = {}
        self.gateway = ""
        self.tag: Tag | None = None
        self._table: FaultTable | None = None
        self._faults: list[Fault] = []
        self._processes: list[subprocess.Popen[Any]] = []
        self._lock = threading.RLock()

    # ---- make and remove ------------------------------------------------------------------------------

    def start(self) -> Network:
        """Remove dead owners' leftovers, then make the bridge, the namespaces and the fault table.

        Raises
        ------
        NetworkError
            If a part cannot be made (what was made is removed again), or the subnet is taken.
        """
        with self._lock, machine_lock():
            if self.tag is not None:
                return self
            remove_leftovers()
            found = Names.found()
            letter = next(
                (c for c in "abcdefghijklmnopqrstuvwxyz" if not found.of(Tag(os.getpid(), c))), None
            )
            if letter is None:
                raise NetworkError("this process already has 26 networks open: close one first")
            self.tag = Tag(os.getpid(), letter)
            keep(self)
            try:
                self._make(_subnet(self.config.subnet))
            except BaseException:
                self.close()
                raise
        log.info("network %s: %s", self.tag, ", ".join(f"{h.name} {h.address}" for h in self.hosts.values()))
        return self

    def _make(self, subnet: ipaddress.IPv4Network) -> None:
        assert self.tag is not None
        tag, addresses = self.tag, list(subnet.hosts())
        self.gateway = str(addresses[0])
        run(["ip", "link", "add", tag.bridge, "type", "bridge"])
        run(["ip", "addr", "add", f"{self.gateway}/24", "dev", tag.bridge])
        run(["ip", "link", "set", tag.bridge, "up"])
        self._table = FaultTable(tag.table)
        self._table.create()
        for index, name in enumerate(self.config.hosts):
            host = Host(name, tag.namespace(name), str(addresses[index + 1]), tag.veth(index))
            self.hosts[name] = host
            ns = host.namespace
            run(["ip", "netns", "add", ns])
            run(["ip", "link", "add", host.veth, "type", "veth", "peer", "name", tag.peer(index)])
            run(["ip", "link", "set", tag.peer(index), "netns", ns])
            run(["ip", "-n", ns, "link", "set", tag.peer(index), "name", HOST_INTERFACE])
            run(["ip", "-n", ns, "addr", "add", f"{host.address}/24", "dev", HOST_INTERFACE])
            run(["ip", "-n", ns, "link", "set", HOST_INTERFACE, "up"])
            run(["ip", "-n", ns, "link", "set", "lo", "up"])
            run(["ip", "link", "set", host.veth, "master", tag.bridge, "up"])

    def close(self) -> None:
        """Heal every fault, stop the processes started in the hosts, and remove every part (idempotent)."""
        with self._lock:
            tag, self.tag = self.tag, None
            if tag is None:
                return
            release(self)
            for fault in self._faults:
                try:
                    fault.heal()
                except NetworkError as exc:  # the table and the namespaces go below anyway
                    log.warning("healing %s failed: %s", fault.description, exc)
            self._faults.clear()
            for proc in self._processes:
                with contextlib.suppress(OSError):
                    proc.terminate()
            for proc in self._processes:
                try:
                    proc.wait(self.config.stop_grace_s)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            self._processes.clear()
            # What is left in the namespaces (children of those processes, others' processes) is killed there.
            remove(Names.found().of(tag))
            self._table = None
            self.hosts, self.gateway = {}, ""
            log.info("network %s removed", tag)

    def __enter__(self) -> Network:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # ---- hosts and what runs on them ------------------------------------------------------------------

    def host(self, name: str) -> Host:
        """The started host ``name``.

        Raises
        ------
        NetworkError
            If the network has no such host (or is not started).
        """
        try:
            return self.hosts[name]
        except KeyError:
            raise NetworkError(
                f"no host {name!r}: the network's hosts are {sorted(self.hosts) or 'not started'}"
            ) from None

    def address(self, name: str) -> str:
        """The IPv4 address of host ``name``, or of the root namespace for ``GATEWAY``."""
        return self.gateway if name == GATEWAY and self.gateway else self.host(name).address

    def command(self, host: str, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside ``host``'s namespace: ``ip netns exec NAMESPACE ARGV...``."""
        return [tool("ip"), "netns", "exec", self.host(host).namespace, *argv]

    def popen(self, host: str, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` inside ``host``'s namespace; it is stopped on close if still running.

        ``kwargs`` go to ``subprocess.Popen`` (``stdout``, ``env``, ``process_group``, ``text``...).
        """
        proc: subprocess.Popen[Any] = subprocess.Popen(self.command(host, argv), **kwargs)  # noqa: S603
        with self._lock:
            self._processes = [p for p in self._processes if p.poll() is None]
            self._processes.append(proc)
        return proc

    def run(self, host: str, argv: Sequence[str], timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside ``host``'s namespace to its end; its output as text."""
        return subprocess.run(  # noqa: S603
            self.command(host, argv), capture_output=True, text=True, timeout=timeout, check=False
        )

    # ---- faults ---------------------------------------------------------------------------------------

    @property
    def faults(self) -> list[Fault]:
        """The faults in force, oldest first."""
        with self._lock:
            return [f for f in self._faults if f.active]

    def partition(self, side_a: Iterable[str], side_b: Iterable[str], one_way: bool = False) -> Fault:
        """Drop every packet between the hosts of ``side_a`` and those of ``side_b``, silently.

        Parameters
        ----------
        side_a, side_b
            Host names (``GATEWAY`` for the root namespace); a single name is one host.
        one_way
            Drop only what ``side_a`` sends to ``side_b``: ``side_b`` still reaches ``side_a``, but a TCP
            connection either side opens fails, since it needs both directions.
        """
        a, b = self._names(side_a), self._names(side_b)
        if set(a) & set(b):
            raise NetworkError(f"a partition's sides must not share hosts: {sorted(set(a) & set(b))}")
        rules = partition_rules([self.address(n) for n in a], [self.address(n) for n in b], one_way)
        arrow = "->" if one_way else "|"
        return self._drop_rules(
            "partition", f"{'one-way cut' if one_way else 'partition'} {a} {arrow} {b}", rules
        )

    def flaky(self, hosts: str | Iterable[str] | None, percent: int) -> Fault:
        """Drop ``percent`` % of the packets to and from ``hosts`` at random (None: on every link).

        Raises
        ------
        NetworkError
            If ``percent`` is not a whole number from 0 to 100.
        """
        if isinstance(percent, bool) or not isinstance(percent, int) or not 0 <= percent <= 100:
            raise NetworkError(f"percent must be a whole number from 0 to 100, got {percent!r}")
        names = None if hosts is None else self._names(hosts)
        rules = loss_rules(None if names is None else [self.address(n) for n in names], percent)
        return self._drop_rules("flaky", f"{percent}% loss on {names or 'every link'}", rules)

    def cap(self, host: str, rate: str) -> Fault:
        """Cap ``host``'s link to ``rate`` (``tc`` bit units: ``500kbit``, ``4mbit``) each way with ``tbf``.

        Raises
        ------
        NetworkError
            If the rate cannot be read, or ``host`` is the gateway (it has no veth of its own).
        """
        bits, target = parse_rate(rate), self.host(host)
        with self._lock:
            self._check_started()
            run(["tc", "qdisc", "replace", "dev", target.veth, *tbf_args(bits)])
            run(["tc", "-n", target.namespace, "qdisc", "replace", "dev", HOST_INTERFACE, *tbf_args(bits)])

        def undo() -> None:
            run(["tc", "qdisc", "del", "dev", target.veth, "root"], check=False)
            run(["tc", "-n", target.namespace, "qdisc", "del", "dev", HOST_INTERFACE, "root"], check=False)

        return self._keep(Fault("cap", f"{host} capped at {rate}", undo))

    def heal(self) -> None:
        """Heal every fault in force."""
        for fault in self.faults:
            fault.heal()

    def _names(self, hosts: str | Iterable[str]) -> list[str]:
        names = [hosts] if isinstance(hosts, str) else list(hosts)
        if not names:
            raise NetworkError("a fault needs at least one host")
        for name in names:
            self.address(name)  # raises naming the hosts when unknown
        return names

    def _check_started(self) -> None:
        if self.tag is None or self._table is None:
            raise NetworkError("the network is not started: use `with Network(...)` or call start()")

    def _drop_rules(self, kind: str, description: str, rules: Sequence[str]) -> Fault:
        with self._lock:
            self._check_started()
            table = self._table
            assert table is not None
            handles = table.add(rules)

        def undo() -> None:
            with self._lock:
                if self._table is table:
                    table.delete(handles)

        return self._keep(Fault(kind, description, undo))

    def _keep(self, fault: Fault) -> Fault:
        with self._lock:
            self._faults = [f for f in self._faults if f.active]
            self._faults.append(fault)
        log.info("network %s: %s", self.tag, fault.description)
        return fault


def _subnet(wanted: str | None) -> ipaddress.IPv4Network:
    """``wanted``, or the first ``10.77.N.0/24`` no route of the root namespace overlaps."""
    used = []
    for line in run(["ip", "-4", "route", "show", "table", "all"]).splitlines():
        with contextlib.suppress(ValueError, IndexError):
            used.append(
                ipaddress.IPv4Network(line.split()[0] if line[0].isdigit() else line.split()[1], False)
            )
    candidates = (
        [ipaddress.IPv4Network(wanted)]
        if wanted
        else (ipaddress.IPv4Network(f"10.77.{n}.0/24") for n in range(256))
    )
    for net in candidates:
        if not any(net.overlaps(u) for u in used if u.prefixlen > 0):
            return net
    raise NetworkError(
        f"subnet {wanted} overlaps a route of this machine: choose another"
        if wanted
        else "every 10.77.N.0/24 is in use: close some networks or pass subnet"
    )
