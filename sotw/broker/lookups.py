"""The cluster as its metadata shows it: partitions' leaders, replicas and in-sync replicas, asked of the nodes.

``ClusterLookups`` holds the look-ups ``KafkaBroker`` offers (partitions, leader counts, under-replicated
partitions, waiting for full replication) over one ``metadata`` source the broker supplies. ``agreed_metadata``
is that source when nodes can be cut off from each other: it asks each node on its own and keeps the view most
of them share, since a node cut from the controllers answers from a copy that stopped changing.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, ClusterMetadata

from sotw.errors import BrokerError


@dataclass(frozen=True, order=True)
class PartitionState:
    """One partition as the cluster's metadata shows it: its leader (-1: none), replicas and those in sync."""

    topic: str
    partition: int
    leader: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]

    @property
    def under_replicated(self) -> bool:
        """Fewer replicas in sync than assigned."""
        return len(self.isr) < len(self.replicas)


def admin_on(addresses: Iterable[str], settings: Mapping[str, str]) -> AdminClient:
    """An admin client bootstrapped on ``addresses`` (``HOST:PORT`` each), quiet.

    Quiet: while a node is down, librdkafka logs each refused connection (errors still raise).
    """
    return AdminClient({"bootstrap.servers": ",".join(addresses), "log_level": 0, **settings})


def partition_states(meta: ClusterMetadata, topics: Iterable[str] | None = None) -> list[PartitionState]:
    """Every partition of ``topics`` in ``meta`` (all but the internal ones when None), sorted."""
    wanted = None if topics is None else set(topics)
    return sorted(
        PartitionState(name, p.id, p.leader, tuple(p.replicas), tuple(p.isrs))
        for name, t in meta.topics.items()
        if (wanted is None and not name.startswith("__")) or (wanted is not None and name in wanted)
        for p in t.partitions.values()
    )


def _view(meta: ClusterMetadata) -> tuple[Any, ...]:
    """What two nodes' answers must share to agree: the registered brokers and every partition's state."""
    parts = sorted(
        (name, p.id, p.leader, tuple(p.replicas), tuple(p.isrs))
        for name, t in meta.topics.items()
        for p in t.partitions.values()
    )
    return (tuple(sorted(meta.brokers)), tuple(parts))


def agreed_metadata(
    nodes: Mapping[int, str], settings: Mapping[str, str], timeout: float = 5.0
) -> ClusterMetadata:
    """The metadata most of ``nodes`` (node id to ``HOST:PORT``) agree on, each asked on its own at once.

    A client bootstrapped on one address sends its first request there, so a fresh client per node reads
    that node's own copy. A node cut from the controllers answers from its last copy, which shows a full ISR
    long after the others removed it: the majority's view wins. Ties go to the view naming fewer brokers (the
    controllers unregister a node they fenced; a cut-off node still lists itself), then to the lowest node.
    Once a majority agrees, the others are not waited for.

    Raises
    ------
    KafkaException
        If no node answers within ``timeout`` seconds.
    """

    def ask(address: str) -> ClusterMetadata | None:
        with contextlib.suppress(KafkaException):
            return admin_on([address], settings).list_topics(timeout=timeout)
        return None

    got: list[tuple[int, ClusterMetadata]] = []
    votes: Counter[tuple[Any, ...]] = Counter()
    pool = ThreadPoolExecutor(max_workers=max(1, len(nodes)))
    try:
        asked = {pool.submit(ask, address): node for node, address in nodes.items()}
        for done in as_completed(asked):
            meta = done.result()
            if meta is None:
                continue
            got.append((asked[done], meta))
            votes[_view(meta)] += 1
            if votes[_view(meta)] * 2 > len(nodes):
                # A majority agrees: a node that does not answer (cut from the root namespace) is not waited for.
                return meta
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    if not got:
        # One more try, raising what librdkafka says.
        return admin_on(nodes.values(), settings).list_topics(timeout=timeout)
    best = min(got, key=lambda nm: (-votes[_view(nm[1])], len(nm[1].brokers), nm[0]))
    return best[1]


class ClusterLookups:
    """The look-ups of a broker over the metadata its ``metadata`` method returns (``KafkaBroker``'s)."""

    @property
    def node_ids(self) -> list[int]:
        """The nodes' ids."""
        raise NotImplementedError

    def metadata(self) -> ClusterMetadata:
        """The cluster's metadata now, from nodes that answer."""
        raise NotImplementedError

    def partitions(self, topics: Iterable[str] | None = None) -> list[PartitionState]:
        """Every partition of ``topics`` (all but the internal ones by default) as the metadata shows it now.

        Raises
        ------
        confluent_kafka.KafkaException
            If no node answers within 10 s.
        """
        return partition_states(self.metadata(), topics)

    def leader_counts(self, topics: Iterable[str] | None = None) -> dict[int, int]:
        """How many partitions of ``topics`` (all but the internal ones by default) each node leads."""
        counts = Counter(p.leader for p in self.partitions(topics) if p.leader >= 0)
        return {n: counts.get(n, 0) for n in self.node_ids}

    def busiest_leader(self, topics: Iterable[str] | None = None) -> int:
        """The node leading the most partitions of ``topics`` (the lowest id of a tie)."""
        counts = self.leader_counts(topics)
        return max(sorted(counts), key=lambda n: counts[n])

    def under_replicated(self, topics: Iterable[str] | None = None) -> list[tuple[str, int]]:
        """Partitions of ``topics`` with fewer replicas in sync than assigned (by default of every topic)."""
        meta = self.metadata()
        wanted = None if topics is None else set(topics)
        return sorted(
            (name, p.id)
            for name, t in meta.topics.items()
            if wanted is None or name in wanted
            for p in t.partitions.values()
            if len(p.isrs) < len(p.replicas)
        )

    def wait_replicated(self, timeout: float = 60.0, topics: Iterable[str] | None = None) -> float:
        """Block until no partition is under-replicated; return the seconds it took.

        Raises
        ------
        BrokerError
            Naming the first partition still under-replicated after ``timeout`` seconds.
        """
        started = time.monotonic()
        wanted = None if topics is None else list(topics)
        while True:
            try:
                left = self.under_replicated(wanted)
            except Exception as exc:  # KafkaException while a node is still coming up
                left, error = [("?", -1)], str(exc)
            else:
                error = ""
            if not left:
                return time.monotonic() - started
            if time.monotonic() - started > timeout:
                topic, partition = left[0]
                raise BrokerError(
                    f"{len(left)} partitions still under-replicated after {timeout:g} s "
                    f"({topic}/{partition} first){': ' + error if error else ''}"
                )
            time.sleep(0.2)
