"""Faults between the hosts of a network, each with its heal: partitions, random loss, bandwidth caps.

Partitions and loss are nftables rules in one table of the ``bridge`` family in the root namespace, one table
per network (``bridge <tag>``). Its base chains hook the bridge's ``forward`` (host to host), ``input`` (a host
to the root namespace, the ``gateway``) and ``output`` (the gateway to a host) paths and all jump to one chain,
``faults``, which holds a rule or two per fault; healing deletes those rules by handle, and closing the
network deletes the table. Why there, rather than a table in each namespace:

- one place holds the whole state of the network's faults (``nft list table bridge <tag>``), one ``nft`` call
  applies or heals a fault however many hosts it names, and a partition between groups is one rule per
  direction (sets of addresses), which makes a one-way cut exactly one rule;
- the processes under test (a broker, the pipeline) run as root inside the namespaces, and cannot see,
  flush or outlive the rules cutting them off;
- the rules match IPv4 packets by address only, so ARP still passes: a host sees its peer's packets vanish
  (connects and reads time out, as in a real partition), not an unreachable-host error at once.

With ``br_netfilter`` loaded (``net.bridge.bridge-nf-call-iptables=1``, as here), bridged IPv4 packets also
pass the root namespace's ``ip``/``inet`` forward hooks: a firewall there that drops forwarded packets
(Docker's ``FORWARD`` policy) would cut every host from every other, faults or not.

Bandwidth caps are ``tc`` token-bucket filters (``tbf``) on both ends of a host's veth: the root end shapes
what the host receives, the end inside the namespace what it sends. (``netem`` is not available here, so
there is no added latency, reordering or duplication.)
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Sequence

from sotw.errors import NetworkError
from sotw.network.system import run
from sotw.outage import Outage, now_ms

_RATE = re.compile(r"(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit)")
_UNITS = {"bit": 1, "kbit": 1_000, "mbit": 1_000_000, "gbit": 1_000_000_000}
_HANDLE = re.compile(r"# handle (\d+)")


def parse_rate(rate: str) -> int:
    """Bits per second of a rate in ``tc``'s bit units (``500kbit``, ``4mbit``, ``1gbit``).

    Raises
    ------
    NetworkError
        If ``rate`` has another form (``tc``'s ``bps`` means bytes per second, so it is refused as ambiguous).
    """
    match = _RATE.fullmatch(rate.strip().lower()) if isinstance(rate, str) else None
    bits = int(float(match.group(1)) * _UNITS[match.group(2)]) if match else 0
    if bits < 8_000:
        raise NetworkError(
            f"rate must be at least 8kbit, in bit, kbit, mbit or gbit (e.g. '4mbit'), got {rate!r}"
        )
    return bits


def _addresses(addresses: Sequence[str]) -> str:
    return "{ " + ", ".join(addresses) + " }"


def partition_rules(side_a: Sequence[str], side_b: Sequence[str], one_way: bool = False) -> list[str]:
    """The rules dropping IPv4 packets from ``side_a``'s addresses to ``side_b``'s (and back unless ``one_way``)."""
    rules = [f"ip saddr {_addresses(side_a)} ip daddr {_addresses(side_b)} drop"]
    if not one_way:
        rules.append(f"ip saddr {_addresses(side_b)} ip daddr {_addresses(side_a)} drop")
    return rules


def loss_rules(addresses: Sequence[str] | None, percent: int) -> list[str]:
    """The rules dropping ``percent`` % of IPv4 packets at random, to or from ``addresses`` (None: all).

    A packet between two lossy hosts meets both hosts' rules, so it is lost a little more often.
    """
    # numgen's values are 0-99 and nft refuses to compare them with 100: all is a plain drop.
    chance = "" if percent >= 100 else f"numgen random mod 100 < {percent} "
    if addresses is None:
        return [f"ether type ip {chance}drop"]
    return [
        f"ip saddr {_addresses(addresses)} {chance}drop",
        f"ip daddr {_addresses(addresses)} {chance}drop",
    ]


class Fault:
    """A fault in force until ``heal``; also a context manager that heals it on exit.

    Attributes
    ----------
    kind
        ``"partition"``, ``"flaky"`` or ``"cap"``.
    description
        What it does, for logs (``"partition a | b"``, ``"one-way cut a -> b"``).
    down_ms
        When it took effect (epoch milliseconds).
    outage
        The ``Outage`` it was, once healed (None while in force).
    """

    def __init__(self, kind: str, description: str, undo: Callable[[], None]) -> None:
        self.kind = kind
        self.description = description
        self.down_ms = now_ms()
        self.outage: Outage | None = None
        self._undo = undo
        self._lock = threading.Lock()

    @property
    def active(self) -> bool:
        """True until healed."""
        return self.outage is None

    def heal(self) -> Outage:
        """Undo the fault (once; again returns the same ``Outage``)."""
        with self._lock:
            if self.outage is None:
                self._undo()
                self.outage = Outage(self.kind, self.down_ms, now_ms())
            return self.outage

    def __enter__(self) -> Fault:
        return self

    def __exit__(self, *exc: object) -> None:
        self.heal()

    def __repr__(self) -> str:
        state = "active" if self.active else "healed"
        return f"Fault({self.description!r}, {state})"


class FaultTable:
    """The nftables table (family ``bridge``, root namespace) holding one network's packet-dropping faults."""

    def __init__(self, name: str) -> None:
        self.name = name

    def create(self) -> None:
        """Create the table: base chains on the bridge's forward, input and output hooks, and ``faults``."""
        hooks = "".join(
            f"  chain {hook} {{ type filter hook {hook} priority 0; policy accept; jump faults; }}\n"
            for hook in ("forward", "input", "output")
        )
        run(["nft", "-f", "-"], stdin=f"table bridge {self.name} {{\n  chain faults {{ }}\n{hooks}}}\n")

    def add(self, rules: Sequence[str]) -> list[int]:
        """Add ``rules`` to ``faults`` in one transaction; return their handles."""
        script = "".join(f"add rule bridge {self.name} faults {rule}\n" for rule in rules)
        handles = [
            int(h) for h in _HANDLE.findall(run(["nft", "--echo", "--handle", "-f", "-"], stdin=script))
        ]
        if len(handles) != len(rules):
            raise NetworkError(f"nft added {len(handles)} of {len(rules)} rules to bridge {self.name}")
        return handles

    def delete(self, handles: Sequence[int]) -> None:
        """Delete the rules ``handles`` from ``faults`` in one transaction."""
        script = "".join(f"delete rule bridge {self.name} faults handle {h}\n" for h in handles)
        run(["nft", "-f", "-"], stdin=script)

    def drop(self) -> None:
        """Delete the table and every rule in it (nothing if it is gone)."""
        run(["nft", "delete", "table", "bridge", self.name], check=False)


def tbf_args(bits: int) -> list[str]:
    """``tc qdisc`` arguments of a token bucket of ``bits`` per second.

    The bucket holds 20 ms of the rate (at least two full frames), so a capped link still sends whole frames
    in bursts, and a packet waits at most 200 ms in the queue before it is dropped, as on a congested link.
    """
    burst = max(bits // 8 // 50, 2 * 1514)
    return ["root", "tbf", "rate", f"{bits}bit", "burst", str(burst), "latency", "200ms"]
