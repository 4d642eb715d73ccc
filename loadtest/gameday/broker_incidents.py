"""Incidents of the broker: frozen, restarted, its data lost; on a three-node cluster a node killed or restarted, and an unclean leader election that loses acknowledged records."""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from loadtest.errors import HarnessError
from loadtest.gameday.incident import ClusterControl, Incident, Stage, Step, broker_of, now_ms, number
from sotw.broker import PartitionState

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BrokerPause(Incident):
    """The broker freezes (SIGSTOP) and thaws (SIGCONT): a hung broker, a long GC pause, a partition."""

    kind: ClassVar[str] = "broker_pause"
    duration_s: float = 10.0

    def __post_init__(self) -> None:
        super().__post_init__()
        number("broker_pause: duration_s", self.duration_s)

    @property
    def duration(self) -> float:
        """How long the broker stays frozen."""
        return self.duration_s

    def begin(self, stage: Stage) -> str:
        """Freeze the broker."""
        broker_of(stage, self.kind).pause()
        return "broker frozen (SIGSTOP)"

    def end(self, stage: Stage) -> str:
        """Thaw it."""
        broker_of(stage, self.kind).resume()
        return "broker thawed (SIGCONT)"

    def close(self, stage: Stage) -> None:
        """Never leave the broker frozen."""
        if stage.broker is not None:
            stage.broker.resume()


@dataclass(frozen=True)
class BrokerRestart(Incident):
    """The broker stops and starts again keeping its data (Kafka keeps it on disk).

    ``begin`` returns once the broker answers again, so the incident's window is the outage itself.
    """

    kind: ClassVar[str] = "broker_restart"
    downtime_s: float = 5.0

    def __post_init__(self) -> None:
        super().__post_init__()
        number("broker_restart: downtime_s", self.downtime_s)

    def begin(self, stage: Stage) -> str:
        """Stop the broker and start it again with its data (returns once it answers)."""
        broker_of(stage, self.kind).restart(self.downtime_s, lose_data=False)
        return f"broker stopped, down {self.downtime_s:g} s, answering again with its data"


@dataclass(frozen=True)
class BrokerDataLoss(Incident):
    """The broker comes back without the records it acknowledged (its data wiped while it was down).

    ``begin`` returns once the broker answers again, so the incident's window is the outage itself.
    """

    kind: ClassVar[str] = "broker_data_loss"
    downtime_s: float = 2.0

    def __post_init__(self) -> None:
        super().__post_init__()
        number("broker_data_loss: downtime_s", self.downtime_s)

    def begin(self, stage: Stage) -> str:
        """Kill the broker and start it again without its data (returns once it answers)."""
        broker_of(stage, self.kind).restart(self.downtime_s, lose_data=True)
        # The broker came back without topics and creates none itself: the simulator makes its own again.
        stage.recreate_topics()
        return (
            f"broker killed, down {self.downtime_s:g} s, answering again without its data; "
            "topics created again"
        )


def _node_param(kind: str, node: Any) -> None:
    if node != "busiest" and (isinstance(node, bool) or not isinstance(node, int) or node < 1):
        raise HarnessError(f'{kind}: node must be a node id (1, 2, ...) or "busiest", got {node!r}')


def _cluster(stage: Stage, kind: str) -> ClusterControl:
    cluster = stage.broker.cluster if stage.broker is not None else None
    if cluster is None:
        raise HarnessError(
            f'incident {kind} needs a local cluster of several nodes: broker = "kafka-3" in the drill file '
            "(or --broker kafka-3)"
        )
    return cluster


def _run_partitions(cluster: ClusterControl, stage: Stage) -> list[PartitionState]:
    return [p for p in cluster.partitions() if p.topic.startswith(stage.topic_prefix)]


def choose_node(cluster: ClusterControl, stage: Stage, node: int | str) -> tuple[int, int]:
    """The node to act on (``busiest``: the one leading the most of the run's partitions) and how many it leads."""
    counts = Counter(p.leader for p in _run_partitions(cluster, stage) if p.leader >= 0)
    chosen = max(sorted(cluster.node_ids), key=lambda n: counts[n]) if node == "busiest" else int(node)
    if chosen not in cluster.node_ids:
        raise HarnessError(f"there is no node {chosen}: the cluster's nodes are {cluster.node_ids}")
    return chosen, counts[chosen]


def wait_for(check: Callable[[], bool], timeout_s: float, poll_s: float = 0.2) -> float:
    """Seconds until ``check()`` held (NaN if it did not within ``timeout_s``; an error counts as not yet)."""
    started = time.monotonic()
    while True:
        try:
            if check():
                return time.monotonic() - started
        except Exception as exc:  # KafkaException while the cluster is changing: ask again
            log.debug("cluster not ready yet: %s", exc)
        if time.monotonic() - started > timeout_s:
            return math.nan
        time.sleep(poll_s)


def served_without(cluster: ClusterControl, stage: Stage, gone: int) -> bool:
    """Every partition of the run has a leader, and none is ``gone``."""
    return all(p.leader >= 0 and p.leader != gone for p in _run_partitions(cluster, stage))


def _start_again(cluster: ClusterControl, node: int) -> Step:
    """Start ``node`` again, measured: until it is registered (``outage_end_ms``) and until it is in sync.

    In sync: no partition under-replicated, waited for ``REPLICATED_TIMEOUT_S`` at most.
    """
    started = time.monotonic()
    cluster.start_node(node)
    registered_ms = now_ms()
    rejoined = time.monotonic() - started
    replicated = rejoined + wait_for(lambda: cluster.under_replicated() == 0, REPLICATED_TIMEOUT_S)
    caught_up = (
        f"every partition in sync again {replicated:.1f} s after its start"
        if math.isfinite(replicated)
        else f"still under-replicated {REPLICATED_TIMEOUT_S:g} s after it"
    )
    return Step(
        f"node {node} started again: registered after {rejoined:.1f} s, {caught_up}",
        {"rejoined_s": rejoined, "replicated_s": replicated},
        outage_end_ms=registered_ms,
    )


def _start_the_down_node(cluster: ClusterControl) -> Step:
    """Start the node the incident took down again, measured; the outage ended before (not at its return)."""
    down = cluster.down_nodes
    if not down:
        return Step("no node was down")
    return dataclasses.replace(_start_again(cluster, down[0]), outage_end_ms=None)


@dataclass(frozen=True)
class NodeIncident(Incident):
    """An incident on single nodes of a local cluster: whatever it stopped or froze is restored at the end."""

    def close(self, stage: Stage) -> None:
        """Never leave a node frozen or down."""
        if stage.broker is not None and stage.broker.cluster is not None:
            stage.broker.cluster.restore()


@dataclass(frozen=True)
class NodeOutage(NodeIncident):
    """A node taken down by ``begin`` and started again by ``end``, its return and catching up measured."""

    def end(self, stage: Stage) -> Step:
        """Start the node again; measure its return and its replicas catching up."""
        return _start_the_down_node(_cluster(stage, self.kind))


@dataclass(frozen=True)
class BrokerNodeKill(NodeOutage):
    """SIGKILL of one node of the cluster (by default the node leading the most of the run's partitions).

    The other nodes take over its partitions once the controller fences it (``broker.session.timeout.ms``
    after its last heartbeat): the outage, and the incident's window for recovery, lasts until every
    partition of the run is led by a live node again. ``restart_after_s`` after the kill it is started
    again; it rejoins and its replicas catch up. Figures: ``led`` (partitions of the run it led),
    ``leaders_moved_s``, ``rejoined_s`` (its start until registered), ``replicated_s`` (its start until no
    partition is under-replicated).
    """

    kind: ClassVar[str] = "broker_node_kill"
    node: int | str = "busiest"
    restart_after_s: float = 30.0

    def __post_init__(self) -> None:
        super().__post_init__()
        _node_param(self.kind, self.node)
        number("broker_node_kill: restart_after_s", self.restart_after_s)

    @property
    def duration(self) -> float:
        """Until the node is started again."""
        return self.restart_after_s

    def begin(self, stage: Stage) -> Step:
        """Kill the node and wait until its partitions are led by the others."""
        cluster = _cluster(stage, self.kind)
        node, led = choose_node(cluster, stage, self.node)
        cluster.stop_node(node, kill=True)
        moved = wait_for(lambda: served_without(cluster, stage, node), self.restart_after_s)
        return Step(
            f"node {node} killed (SIGKILL; it led {led} of the run's partitions); "
            + (
                f"the others lead them all after {moved:.1f} s"
                if math.isfinite(moved)
                else "leadership not moved"
            ),
            {"node": float(node), "led": float(led), "leaders_moved_s": moved},
            outage_end_ms=now_ms(),
        )


@dataclass(frozen=True)
class BrokerNodeRestart(NodeIncident):
    """One node stopped gracefully and started again, as each node in turn in a rolling restart (an upgrade).

    As an operator would, it first waits (up to ``settle_s``) until no partition is under-replicated, so
    that stopping the node cannot take a partition below ``min.insync.replicas``. SIGTERM is Kafka's
    controlled shutdown: the node hands its leaderships over before it exits. Down ``downtime_s``, then
    started; the window is from the SIGTERM until it is registered again. Figures: ``waited_s``, ``stop_s``
    (the controlled shutdown), ``rejoined_s`` and ``replicated_s``.
    """

    kind: ClassVar[str] = "broker_node_restart"
    node: int | str = "busiest"
    downtime_s: float = 5.0
    settle_s: float = 120.0

    def __post_init__(self) -> None:
        super().__post_init__()
        _node_param(self.kind, self.node)
        number("broker_node_restart: downtime_s", self.downtime_s)
        number("broker_node_restart: settle_s", self.settle_s)

    def begin(self, stage: Stage) -> Step:
        """Wait for a healthy cluster, stop the node gracefully, start it again; measure each step."""
        cluster = _cluster(stage, self.kind)
        waited = wait_for(lambda: cluster.under_replicated() == 0, self.settle_s)
        if not math.isfinite(waited):
            raise HarnessError(
                f"broker_node_restart: partitions were still under-replicated after {self.settle_s:g} s; "
                "a node was not stopped (it could take a partition below min.insync.replicas)"
            )
        node, led = choose_node(cluster, stage, self.node)
        began = time.monotonic()
        cluster.stop_node(node, kill=False)
        stopped = time.monotonic() - began
        time.sleep(self.downtime_s)
        back = _start_again(cluster, node)
        return Step(
            f"node {node} (leading {led} of the run's partitions) stopped gracefully in {stopped:.1f} s, "
            f"down {self.downtime_s:g} s; {back.note.removeprefix(f'node {node} ')}",
            {"node": float(node), "led": float(led), "waited_s": waited, "stop_s": stopped, **back.figures},
            outage_end_ms=back.outage_end_ms,
        )


@dataclass(frozen=True)
class UncleanElection(NodeOutage):
    """A lagging follower made leader: acknowledged records the old leader alone had are gone.

    Needs a cluster set up for it: partitions with two replicas, ``min.insync.replicas=1`` and
    ``unclean.leader.election.enable=true`` (a drill's ``broker_settings``). The follower of the busiest
    leader's partitions is frozen (SIGSTOP): it is fenced and drops out of their ISR, and the leader goes on
    acknowledging alone. ``lag_s`` after the freeze (and at least ``ALONE_S`` after the follower left the
    ISR, which is waited for up to ``SHRINK_TIMEOUT_S`` longer) the leader is killed and the follower thawed; once the
    controller fences the dead leader it elects the follower, out of sync, whose log ends where it stopped:
    everything acknowledged since is lost. The window lasts until every partition of the run has a leader
    again; ``restart_after_s`` after the kill the old leader is started, truncates its log to the new
    leader's and catches up. Figures: ``led``, ``at_risk`` (partitions whose only other replica is the
    follower), ``isr_shrunk_s`` (the freeze until the follower is out of their ISR), ``elected_s`` (the kill
    until every partition has a leader), ``rejoined_s``, ``replicated_s``.
    """

    kind: ClassVar[str] = "unclean_election"
    lag_s: float = 20.0
    restart_after_s: float = 20.0

    def __post_init__(self) -> None:
        super().__post_init__()
        number("unclean_election: lag_s", self.lag_s, 1.0)
        number("unclean_election: restart_after_s", self.restart_after_s)

    @property
    def duration(self) -> float:
        """The follower's lag, then the old leader down."""
        return self.lag_s + self.restart_after_s

    def begin(self, stage: Stage) -> Step:
        """Freeze the follower, let it fall behind, kill the leader, thaw the follower; wait for the election."""
        cluster = _cluster(stage, self.kind)
        began = time.monotonic()
        leader, led = choose_node(cluster, stage, "busiest")
        mine = [p for p in _run_partitions(cluster, stage) if p.leader == leader]
        followers = Counter(r for p in mine for r in p.replicas if r != leader)
        at_risk = [p for p in mine if len(p.replicas) == 2]
        if not followers or not at_risk:
            raise HarnessError(
                "unclean_election needs partitions with two replicas: broker_settings = "
                '{ "default.replication.factor" = 2, "min.insync.replicas" = 1, '
                '"unclean.leader.election.enable" = true } in the drill file'
            )
        follower = followers.most_common(1)[0][0]
        exposed = {(p.topic, p.partition) for p in at_risk if follower in p.replicas}
        cluster.pause_node(follower)

        def shrunk() -> bool:
            return all(
                follower not in p.isr
                for p in _run_partitions(cluster, stage)
                if (p.topic, p.partition) in exposed
            )

        # Fencing the frozen node takes the controller its session timeout and more on a busy machine: wait for
        # it past lag_s if need be, then let the leader acknowledge alone a while, as what it takes then is what
        # the election loses.
        out_of_sync = wait_for(shrunk, self.lag_s + SHRINK_TIMEOUT_S)
        time.sleep(max(ALONE_S, self.lag_s - (time.monotonic() - began)))
        cluster.stop_node(leader, kill=True)
        cluster.resume_nodes()
        elected = wait_for(lambda: served_without(cluster, stage, leader), max(60.0, self.restart_after_s))
        return Step(
            f"node {follower} frozen {self.lag_s:g} s (out of the ISR of the {len(exposed)} partitions it alone "
            f"followed for node {leader} after {out_of_sync:.1f} s), then node {leader} killed and node "
            f"{follower} thawed; "
            + (
                f"every partition led again after {elected:.1f} s"
                if math.isfinite(elected)
                else "no new leader"
            ),
            {
                "node": float(leader),
                "follower": float(follower),
                "led": float(led),
                "at_risk": float(len(exposed)),
                "isr_shrunk_s": out_of_sync,
                "elected_s": elected,
            },
            outage_end_ms=now_ms(),
        )


#: How long past its lag an unclean election waits for the frozen follower to drop out of the ISR.
SHRINK_TIMEOUT_S = 60.0


#: How long at least the leader acknowledges alone before it is killed.
ALONE_S = 5.0


#: How long a node's replicas get to catch up after it is back before the figure says they never did.
REPLICATED_TIMEOUT_S = 120.0
