"""Incidents of the network, for a run with ``--netns``: a partition between groups of hosts, a flaky link, a capped link.

Each broker node is host ``nN``, the pipeline host ``pipeline``, and the harness with the simulator the root
namespace (``loadtest.run.hostnet`` says why the simulator stays there). A side of a partition is a list of
groups, each one of:

- ``leader``: the node leading the most of the run's partitions when the incident begins;
- ``controller``: the node leading the KRaft controller quorum then (every node is a broker and a controller);
- a node id (``1``, ``2``, ...) or a host name (``n1``, ...); ``brokers``: every node not on the other side;
- ``pipeline``; ``simulator`` (the root namespace: the simulator, the lag sampler, the verifier's look-ups);
- ``rest``: every host not on the other side (the root namespace included); not on both sides.

Each incident heals at its end, and whatever it left in force is healed if the run ends first.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from loadtest.errors import HarnessError
from loadtest.gameday.broker_incidents import REPLICATED_TIMEOUT_S, choose_node, served_without, wait_for
from loadtest.gameday.incident import ClusterControl, Incident, Stage, Step, now_ms, number
from loadtest.run.hostnet import PIPELINE, SIMULATOR
from sotw.broker.placement import host_name
from sotw.errors import NetworkError
from sotw.network import Fault, Network, parse_rate

#: The group names a side of a partition can use, besides node ids and host names.
GROUPS = ("leader", "controller", "brokers", "pipeline", "simulator", "rest")

#: How long a side naming ``controller`` waits for the quorum to have a leader (an election can be running).
CONTROLLER_WAIT_S = 30.0


def network_of(stage: Stage, kind: str) -> Network:
    """The run's network, refused naming the incident when the run has none."""
    network = stage.broker.network if stage.broker is not None else None
    if network is None:
        raise HarnessError(
            f"incident {kind} needs the run on a network of hosts: netns = true in the drill file (or --netns), "
            "with the local broker"
        )
    return network


def _side(kind: str, name: str, value: Any) -> tuple[str | int, ...]:
    items = tuple(value) if isinstance(value, list | tuple) else (value,)
    if not items:
        raise HarnessError(f"{kind}: {name} needs at least one group ({', '.join(GROUPS)}, or a node id)")
    for item in items:
        ok = (isinstance(item, int) and not isinstance(item, bool) and item >= 1) or (
            isinstance(item, str) and (item in GROUPS or (item[:1] == "n" and item[1:].isdigit()))
        )
        if not ok:
            raise HarnessError(
                f"{kind}: {name} must name groups ({', '.join(GROUPS)}), node ids (1, 2, ...) or hosts "
                f"(n1, ...), got {item!r}"
            )
    return items


@dataclass(frozen=True)
class Chosen:
    """The hosts a side named when the incident began, and the node ``leader`` stood for."""

    hosts: list[str]
    leader: int | None = None
    controller: int | None = None


#: Groups that stand for "whatever the other side does not hold".
_WIDE = ("brokers", "rest")


def _named(stage: Stage, network: Network, side: Sequence[str | int]) -> Chosen:
    """The hosts of ``side``'s groups other than ``brokers`` and ``rest``."""
    hosts: list[str] = []
    leader = controller = None
    cluster = stage.broker.cluster if stage.broker is not None else None
    for group in side:
        if group == "leader":
            leader = 1 if cluster is None else choose_node(cluster, stage, "busiest")[0]
            hosts.append(host_name(leader))
        elif group == "controller":
            controller = 1 if cluster is None else _controller(cluster)
            hosts.append(host_name(controller))
        elif group == "pipeline":
            hosts.append(PIPELINE)
        elif group == "simulator":
            hosts.append(SIMULATOR)
        elif group not in _WIDE:
            hosts.append(host_name(group) if isinstance(group, int) else str(group))
    unknown = [h for h in hosts if h != SIMULATOR and h not in network.hosts]
    if unknown:
        raise HarnessError(
            f"there is no host {unknown[0]!r} on the run's network: it has {sorted(network.hosts)}"
        )
    return Chosen(hosts, leader, controller)


def _controller(cluster: ClusterControl) -> int:
    """The active controller, waited for while an election runs."""
    found: list[int] = []

    def known() -> bool:
        node = cluster.active_controller()
        found[:] = [] if node is None else [node]
        return bool(found)

    if not math.isfinite(wait_for(known, CONTROLLER_WAIT_S)):
        raise HarnessError(f"the controller quorum had no leader for {CONTROLLER_WAIT_S:g} s")
    return found[0]


def _widen(network: Network, side: Sequence[str | int], named: Chosen, other: Sequence[str]) -> Chosen:
    """``named`` with ``brokers`` (the nodes) and ``rest`` (every host and the root namespace) not in ``other``."""
    hosts = list(named.hosts)
    nodes = [h for h in network.hosts if h != PIPELINE]
    if "brokers" in side:
        hosts += [h for h in nodes if h not in other]
    if "rest" in side:
        hosts += [h for h in (*network.hosts, SIMULATOR) if h not in other]
    return Chosen(list(dict.fromkeys(hosts)), named.leader, named.controller)


def resolve_sides(
    stage: Stage, network: Network, side_a: Sequence[str | int], side_b: Sequence[str | int]
) -> tuple[Chosen, Chosen]:
    """Both sides' hosts: the named groups first, then ``brokers`` and ``rest`` as what the other side lacks.

    Raises
    ------
    HarnessError
        If a host is not on the network, the sides share a host, or one is empty.
    """
    a, b = _named(stage, network, side_a), _named(stage, network, side_b)
    a = _widen(network, side_a, a, b.hosts)
    b = _widen(network, side_b, b, a.hosts)
    shared = sorted(set(a.hosts) & set(b.hosts))
    if shared:
        raise HarnessError(f"both sides of the partition hold {shared}")
    if not a.hosts or not b.hosts:
        raise HarnessError(f"a side of the partition holds no host: {a.hosts} | {b.hosts}")
    return a, b


def _after(seconds: float, done: str, not_done: str) -> str:
    """``done after N s``, or ``not_done`` when it never happened (NaN)."""
    return f"{done} after {seconds:.1f} s" if math.isfinite(seconds) else not_done


class _Healing:
    """The fault an incident put in force, kept outside the frozen dataclass so ``end`` and ``close`` heal it."""

    def __init__(self) -> None:
        self.fault: Fault | None = None

    def heal(self) -> bool:
        fault, self.fault = self.fault, None
        if fault is None or not fault.active:
            return False
        fault.heal()
        return True


@dataclass(frozen=True)
class NetworkIncident(Incident):
    """A network fault in force for ``duration_s``, healed at the end (or when the run ends first)."""

    duration_s: float = 30.0
    _healing: ClassVar[_Healing]

    def __post_init__(self) -> None:
        super().__post_init__()
        number(f"{self.kind}: duration_s", self.duration_s)
        # Not a field: the fault in force is no parameter, and the incident's dict (results.json) leaves it out.
        object.__setattr__(self, "_healing", _Healing())

    def check(self, nodes: int) -> None:
        """Refuse, before the run starts, a host the run's network will not have (``nodes`` broker nodes)."""
        for name in ("side_a", "side_b", "hosts", "host"):
            value = getattr(self, name, None)
            if value is None or value == "all":
                continue
            for item in _side(self.kind, name, value):
                node = item if isinstance(item, int) else None
                if isinstance(item, str) and item[:1] == "n" and item[1:].isdigit():
                    node = int(item[1:])
                if node is not None and not 1 <= node <= nodes:
                    raise HarnessError(
                        f"{self.kind}: {name} names node {item!r}, but the broker has nodes 1 to {nodes}"
                    )

    @property
    def duration(self) -> float:
        """How long the fault is in force."""
        return self.duration_s

    def put(self, fault: Fault) -> None:
        """Keep ``fault`` to heal."""
        self._healing.fault = fault

    def end(self, stage: Stage) -> str | Step:
        """Heal the fault."""
        return "healed" if self._healing.heal() else "nothing was in force to heal"

    def close(self, stage: Stage) -> None:
        """Never leave a fault in force."""
        self._healing.heal()


@dataclass(frozen=True)
class Partition(NetworkIncident):
    """Every packet between the hosts of ``side_a`` and those of ``side_b`` dropped silently (``one_way``: a to b only).

    Drops, not refusals: a client sees timeouts, as on a real partition. With the leader on ``side_a``, the
    incident's window lasts until every partition of the run is led by a node of the majority (as the
    root namespace's metadata shows it, when the root namespace is not cut off itself); with the controller
    there, until another node leads the quorum. At the heal, the cut node's replicas are waited for until every
    partition is in sync again. Figures: ``node`` (the leader cut off), ``leaders_moved_s``, ``controller`` and
    ``controller_moved_s`` (from the cut), ``replicated_s`` (the heal until nothing is under-replicated).
    """

    kind: ClassVar[str] = "partition"
    side_a: Any = "leader"
    side_b: Any = "rest"
    one_way: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        a, b = _side(self.kind, "side_a", self.side_a), _side(self.kind, "side_b", self.side_b)
        if set(a) & set(b) or all(g in _WIDE for g in (*a, *b)):
            raise HarnessError(
                f"partition: side_a {list(a)} and side_b {list(b)} must name different hosts, and at least one "
                "side a host or group other than brokers and rest"
            )
        if not isinstance(self.one_way, bool):
            raise HarnessError(f"partition: one_way must be true or false, got {self.one_way!r}")

    def begin(self, stage: Stage) -> Step:
        """Cut the link; with the leader cut off, wait until the others lead its partitions."""
        network = network_of(stage, self.kind)
        a, b = resolve_sides(
            stage, network, _side(self.kind, "side_a", self.side_a), _side(self.kind, "side_b", self.side_b)
        )
        try:
            self.put(network.partition(a.hosts, b.hosts, one_way=self.one_way))
        except NetworkError as exc:
            raise HarnessError(f"partition: {exc}") from None
        cut = time.monotonic()
        arrow = "->" if self.one_way else "|"
        notes = [f"network cut {a.hosts} {arrow} {b.hosts} (packets dropped)"]
        figures: dict[str, float] = {}
        cluster = stage.broker.cluster if stage.broker is not None else None
        if a.leader is not None and cluster is not None and SIMULATOR not in a.hosts:
            gone = a.leader
            moved = wait_for(lambda: served_without(cluster, stage, gone), self.duration_s)
            figures |= {"node": float(gone), "leaders_moved_s": moved}
            notes.append(
                f"node {gone} led the most partitions; "
                + _after(moved, "the others lead them all", "leadership not moved")
            )
        if a.controller is not None and cluster is not None:
            old = a.controller
            left = max(0.0, self.duration_s - (time.monotonic() - cut))
            elected = wait_for(lambda: cluster.active_controller() not in (None, old), left)
            moved = time.monotonic() - cut if math.isfinite(elected) else math.nan
            figures |= {"controller": float(old), "controller_moved_s": moved}
            notes.append(
                f"node {old} was the active controller; "
                + _after(moved, f"node {cluster.active_controller()} took over", "no other node took over")
            )
        return Step("; ".join(notes), figures, outage_end_ms=now_ms() if figures else None)

    def end(self, stage: Stage) -> Step:
        """Heal; measure until every partition is in sync again (on a cluster of several nodes)."""
        healed = self._healing.heal()
        cluster = stage.broker.cluster if stage.broker is not None else None
        if not healed or cluster is None:
            return Step("healed")
        replicated = wait_for(lambda: cluster.under_replicated() == 0, REPLICATED_TIMEOUT_S)
        return Step(
            "healed; "
            + (
                f"every partition in sync again {replicated:.1f} s after the heal"
                if math.isfinite(replicated)
                else f"still under-replicated {REPLICATED_TIMEOUT_S:g} s after it"
            ),
            {"replicated_s": replicated},
        )


@dataclass(frozen=True)
class FlakyLink(NetworkIncident):
    """``percent`` % of the packets to and from ``hosts`` dropped at random (``all``: on every link)."""

    kind: ClassVar[str] = "flaky_link"
    percent: int = 5
    hosts: Any = "all"

    def __post_init__(self) -> None:
        super().__post_init__()
        if (
            isinstance(self.percent, bool)
            or not isinstance(self.percent, int)
            or not 0 <= self.percent <= 100
        ):
            raise HarnessError(
                f"flaky_link: percent must be a whole number from 0 to 100, got {self.percent!r}"
            )
        if self.hosts != "all":
            _side(self.kind, "hosts", self.hosts)

    def begin(self, stage: Stage) -> str:
        """Start dropping."""
        network = network_of(stage, self.kind)
        hosts = None
        if self.hosts != "all":
            side = _side(self.kind, "hosts", self.hosts)
            hosts = _widen(network, side, _named(stage, network, side), []).hosts
        try:
            self.put(network.flaky(hosts, self.percent))
        except NetworkError as exc:
            raise HarnessError(f"flaky_link: {exc}") from None
        return f"{self.percent}% of packets dropped at random on {hosts or 'every link'}"


@dataclass(frozen=True)
class LinkCap(NetworkIncident):
    """The link of ``host`` (a node or the pipeline) capped at ``rate`` each way (``tc`` units: ``2mbit``)."""

    kind: ClassVar[str] = "link_cap"
    host: Any = "pipeline"
    rate: str = "2mbit"

    def __post_init__(self) -> None:
        super().__post_init__()
        host = _side(self.kind, "host", self.host)
        if len(host) != 1 or host[0] in ("simulator", "rest", "brokers"):
            raise HarnessError(
                f"link_cap: host must be one host (pipeline, leader, a node), got {self.host!r}: the root "
                "namespace has no link of its own to cap"
            )
        try:
            parse_rate(self.rate)
        except NetworkError as exc:
            raise HarnessError(f"link_cap: {exc}") from None

    def begin(self, stage: Stage) -> str:
        """Cap the link."""
        network = network_of(stage, self.kind)
        (host,) = _named(stage, network, _side(self.kind, "host", self.host)).hosts
        started = time.monotonic()
        try:
            self.put(network.cap(host, self.rate))
        except NetworkError as exc:
            raise HarnessError(f"link_cap: {exc}") from None
        return f"{host}'s link capped at {self.rate} each way ({time.monotonic() - started:.2f} s to apply)"
