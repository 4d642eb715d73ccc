"""What a local Apache Kafka broker is asked to be, and the ``server.properties`` each of its nodes gets.

``KafkaBrokerConfig`` is the one description of a local broker (one node or a cluster), validated when made.
``node_properties`` turns it into one node's settings: the addresses that differ per node, then ``TUNED``, the
settings chosen for a 2-core machine shared with Spark and the load generator, then the caller's overrides.
docs/broker.md lists every setting with its reason; the comments here say it in short.
"""

from __future__ import annotations

import base64
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sotw.broker.security import SECURED_OWNED, SecurityMode, security_mode
from sotw.errors import BrokerError

#: The settings sotw chooses for every node, as Kafka takes them (strings). Addresses, ids and replication are
#: set per node by ``node_properties``.
TUNED: dict[str, str] = {
    # Threads: Kafka's defaults (3 network, 8 I/O, 10 background) are sized for servers; 2 cores serve a few.
    "num.network.threads": "2",
    "num.io.threads": "2",
    "background.threads": "2",
    "num.recovery.threads.per.data.dir": "1",
    "num.replica.fetchers": "1",
    "log.cleaner.threads": "1",
    # The cleaner allocates its dedupe buffer on the heap at start (128 MiB by default, a quarter of a 512 MiB
    # heap); only the small internal compacted topics (__consumer_offsets) are cleaned here.
    "log.cleaner.dedupe.buffer.size": str(16 * 2**20),
    # A consumer group's first join waits this long for more members (3 s by default): tests and the lag
    # probe's group joins would each pay it.
    "group.initial.rebalance.delay.ms": "0",
    # The internal topics are created with 50 partitions each by default: that many partitions of a few
    # groups' offsets cost start-up time and files for nothing on one machine.
    "offsets.topic.num.partitions": "3",
    "transaction.state.log.num.partitions": "3",
    "share.coordinator.state.topic.num.partitions": "3",
    # The simulator creates every topic it writes with its partition count (sotw.kafka.ensure_topics). A topic
    # created by a producer's metadata request would get num.partitions (1) instead, and after the broker lost
    # its data a producer still sending would re-create its topics with 1 partition before anyone could make
    # them right: so no topic appears unless asked for.
    "auto.create.topics.enable": "false",
    # KRaft's controller timeouts assume a calm machine (election 1 s, fetch 2 s). With Spark and the load
    # generator on the same 2 cores a controller can be late without being dead: doubled, a busy machine
    # does not hold elections by mistake. The broker session keeps its 9 s: a dead node is fenced, and its
    # partitions' leadership moves, that long after its last heartbeat.
    "controller.quorum.election.timeout.ms": "2000",
    "controller.quorum.fetch.timeout.ms": "4000",
    "broker.session.timeout.ms": "9000",
    "broker.heartbeat.interval.ms": "2000",
    # Retention is on and bounded, so a long soak's disk use levels off: small segments (the active one is
    # never deleted; 1 GiB by default would never close in a soak), rolled at least every 5 minutes, kept
    # 10 minutes or 128 MiB per partition, checked every 30 s (5 min by default) and removed 10 s later
    # (60 s). A pipeline lagging more than 10 minutes loses records (and says so): raise them with --override.
    "log.segment.bytes": str(16 * 2**20),
    "log.roll.ms": str(5 * 60_000),
    "log.retention.ms": str(10 * 60_000),
    "log.retention.bytes": str(128 * 2**20),
    "log.retention.check.interval.ms": "30000",
    "log.segment.delete.delay.ms": "10000",
}

#: Settings sotw owns per node: an override of one of them would break the cluster's wiring.
OWNED = (
    "process.roles",
    "node.id",
    "controller.quorum.voters",
    "controller.quorum.bootstrap.servers",
    "listeners",
    "advertised.listeners",
    "listener.security.protocol.map",
    "inter.broker.listener.name",
    "controller.listener.names",
    "log.dirs",
    "log.dir",
    "metadata.log.dir",
)

#: Each node's client port in a namespace of its own (``netns``) when ``port`` is 0; its internal and controller
#: listeners take the next two. Fixed, since a free-port check in the root namespace says nothing of a namespace.
NETNS_PORT = 9092

#: Heap per node (MiB) when not given: 512 for one node; three share the machine with Spark, so less each.
DEFAULT_HEAP_MB = {1: 512, 2: 384, 3: 320}

_CLUSTER_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]{21}")


def new_cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes as 22 URL-safe base64 characters, never starting with ``-``."""
    while True:
        text = base64.urlsafe_b64encode(secrets.token_bytes(16)).decode().rstrip("=")
        if not text.startswith("-"):  # Kafka's tools read a leading '-' as an option
            return text


@dataclass(frozen=True)
class KafkaBrokerConfig:
    """A local Apache Kafka broker: one node, or a cluster of nodes that are each broker and controller.

    Parameters
    ----------
    nodes
        How many nodes. With three or more, topics get replication factor 3 and ``min.insync.replicas=2`` by
        default, so one node can die without losing an acknowledged record or refusing ``acks=all``.
    host
        Loopback address every listener binds (unused with ``netns``: each node binds its own address).
    port
        The client port of the first node (0 picks a free one); other nodes and listeners take free ports.
        With ``netns``, every node's client port (0: ``NETNS_PORT``), the next two its other listeners'.
    data_dir
        The directory the broker owns (one ``node-N`` inside per node). None: a temporary directory, removed
        when the broker stops. A given one is kept, and the broker started on it again comes back with its
        topics, records and committed offsets.
    cluster_id
        The KRaft cluster id (22 URL-safe base64 characters). None: the data directory's, or a new one.
    heap_mb
        Each node's Java heap in MiB; None for ``DEFAULT_HEAP_MB``.
    start_timeout
        Seconds to wait for the nodes to answer, at start and after each restart.
    stop_grace_s
        Seconds a SIGTERM gets before SIGKILL, on ``stop`` and graceful restarts.
    proxied
        Put a ``sotw.proxy.TcpProxy`` in front of each node's client port, advertised to clients, so that
        ``proxy.cut``/``proxy.freeze`` reach every client (replication between nodes bypasses it).
    log_path
        Where a node's output goes: this file for one node; ``<stem>-N<suffix>`` beside it for node N of a
        cluster. None: ``node-N/server.log`` in the data directory.
    java
        The Java runtime (17 or newer), a name on PATH or a path.
    overrides
        ``server.properties`` settings applied after sotw's own (``TUNED``), for every node.
    security
        One of ``sotw.broker.security.SECURITY_MODES``: ``plaintext`` (no TLS, no login, no ACLs), ``ssl``,
        ``sasl_plaintext`` or ``sasl_ssl`` (a CA, node keystores, SCRAM-SHA-512 users and an authorizer).
    netns
        Put node N in a network namespace of its own, host ``nN`` of a ``sotw.network.Network``, listening
        and advertising on its address there, so that faults can cut links between nodes (partitions) as
        ``proxied`` cannot. Needs root, iproute2 and nftables; clients in the root namespace reach the nodes
        through the network's bridge.
    """

    nodes: int = 1
    host: str = "127.0.0.1"
    port: int = 0
    data_dir: Path | None = None
    cluster_id: str | None = None
    heap_mb: int | None = None
    start_timeout: float = 60.0
    stop_grace_s: float = 15.0
    proxied: bool = False
    log_path: Path | None = None
    java: str = "java"
    overrides: Mapping[str, str] = field(default_factory=dict)
    security: str = "plaintext"
    netns: bool = False

    def __post_init__(self) -> None:
        secured = security_mode(self.security).secured
        if isinstance(self.nodes, bool) or not isinstance(self.nodes, int) or not 1 <= self.nodes <= 9:
            raise BrokerError(f"nodes must be a whole number from 1 to 9, got {self.nodes!r}")
        if isinstance(self.port, bool) or not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise BrokerError(f"port must be from 0 (a free one) to 65535, got {self.port!r}")
        if self.netns and self.proxied:
            raise BrokerError(
                "netns and proxied cannot be combined: cut a namespaced node's links with its Network's "
                "partition instead of a proxy"
            )
        if self.netns and self.port > 65533:
            raise BrokerError(f"port must leave room for two more listeners with netns, got {self.port!r}")
        if self.cluster_id is not None and not _CLUSTER_ID.fullmatch(self.cluster_id):
            raise BrokerError(
                "cluster_id must be 22 URL-safe base64 characters not starting with '-', "
                f"got {self.cluster_id!r}"
            )
        if self.heap_mb is not None and (not isinstance(self.heap_mb, int) or self.heap_mb < 128):
            raise BrokerError(f"heap_mb must be a whole number of MiB >= 128, got {self.heap_mb!r}")
        for name in ("start_timeout", "stop_grace_s"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or value <= 0:
                raise BrokerError(f"{name} must be a number of seconds > 0, got {value!r}")
        owned = sorted(set(self.overrides) & set(OWNED))
        if owned:
            raise BrokerError(
                f"overrides may not set {owned[0]!r}: "
                "sotw sets it per node (listeners, ids and log directories)"
            )
        kept = sorted(set(self.overrides) & set(SECURED_OWNED)) if secured else []
        if kept:
            raise BrokerError(
                f"overrides may not set {kept[0]!r} on a {self.security} broker: "
                "sotw sets it for the nodes' TLS, logins and authorizer"
            )
        object.__setattr__(self, "overrides", {str(k): str(v) for k, v in self.overrides.items()})
        for name in ("data_dir", "log_path"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, Path(value))

    @property
    def mode(self) -> SecurityMode:
        """The ``SecurityMode`` named by ``security``."""
        return security_mode(self.security)

    @property
    def heap(self) -> int:
        """Each node's heap in MiB."""
        return self.heap_mb or DEFAULT_HEAP_MB.get(self.nodes, 320)

    @property
    def replication_factor(self) -> int:
        """Replicas of every topic by default: 3 (or every node of a smaller cluster)."""
        return min(3, self.nodes)

    @property
    def min_insync_replicas(self) -> int:
        """Replicas that must have a record before ``acks=all`` acknowledges it: 2 of 3, else 1."""
        return 2 if self.nodes >= 3 else 1


@dataclass(frozen=True)
class NodePorts:
    """The ports of one node (on loopback, or on its own address with ``netns``).

    Attributes
    ----------
    client
        The port clients are told (advertised): the node's own client port, or its proxy's.
    listen
        The node's own client listener (the proxy's target when proxied, else ``client``).
    internal
        Replication between nodes.
    controller
        The KRaft controller listener (quorum votes and metadata).
    """

    client: int
    listen: int
    internal: int
    controller: int


def voters(hosts: Mapping[int, str], ports: Mapping[int, NodePorts]) -> str:
    """``controller.quorum.voters`` for the nodes: ``1@HOST:PORT,2@HOST:PORT,...``, each at its own host."""
    return ",".join(f"{node}@{hosts[node]}:{p.controller}" for node, p in sorted(ports.items()))


def node_properties(
    config: KafkaBrokerConfig,
    node: int,
    ports: Mapping[int, NodePorts],
    data: Path,
    security: Mapping[str, str] | None = None,
    hosts: Mapping[int, str] | None = None,
) -> dict[str, str]:
    """The ``server.properties`` of ``node``: its wiring, ``TUNED``, replication, ``security``, the overrides.

    ``security`` holds the node's TLS, SASL and authorizer settings (``BrokerSecrets.node_properties``);
    ``hosts`` each node's address (``config.host`` for every node by default; their own with ``netns``).
    """
    own = ports[node]
    hosts = hosts or {n: config.host for n in ports}
    host = hosts[node]
    rf, isr = str(config.replication_factor), str(config.min_insync_replicas)
    props = {
        "process.roles": "broker,controller",
        "node.id": str(node),
        # Static voters: every node knows the quorum from its configuration, so formatting needs no
        # --standalone (which would make each node a quorum of its own).
        "controller.quorum.voters": voters(hosts, ports),
        "listeners": ",".join(
            (
                f"CLIENT://{host}:{own.listen}",
                f"INTERNAL://{host}:{own.internal}",
                f"CONTROLLER://{host}:{own.controller}",
            )
        ),
        # Clients are told the proxy's port when proxied; nodes replicate over INTERNAL, never through it.
        "advertised.listeners": f"CLIENT://{host}:{own.client},INTERNAL://{host}:{own.internal}",
        "listener.security.protocol.map": config.mode.listener_map,
        "inter.broker.listener.name": "INTERNAL",
        "controller.listener.names": "CONTROLLER",
        "log.dirs": str(data),
        **TUNED,
        "default.replication.factor": rf,
        "min.insync.replicas": isr,
        "offsets.topic.replication.factor": rf,
        "transaction.state.log.replication.factor": rf,
        "transaction.state.log.min.isr": isr,
        "share.coordinator.state.topic.replication.factor": rf,
        "share.coordinator.state.topic.min.isr": isr,
        **(security or {}),
        **config.overrides,
    }
    return props


def properties_text(props: Mapping[str, str]) -> str:
    """``props`` as a ``.properties`` file (backslashes escaped, one ``key=value`` per line)."""
    return "".join(f"{k}={v.replace(chr(92), chr(92) * 2)}\n" for k, v in props.items())


#: Kafka's log4j2 configuration: everything to standard output (the node's log file), at INFO, except the
#: full configuration dump at each start (a thousand lines per node), the request and state-change logs.
LOG4J2 = """\
status = warn
# Kafka's own shutdown hook logs its controlled shutdown: log4j must not stop first.
shutdownHook = disable
appender.out.type = Console
appender.out.name = STDOUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = STDOUT
logger.config.name = org.apache.kafka.common.config.AbstractConfig
logger.config.level = WARN
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.state.name = state.change.logger
logger.state.level = WARN
"""


def argfile_text(args: Sequence[str]) -> str:
    """``args`` as a Java launcher argument file (``java @FILE``): one quoted argument a line.

    Arguments that hold a secret go to the JVM this way, in a 0600 file, so ``ps`` does not show them.
    """
    quoted = (a.replace("\\", "\\\\").replace('"', '\\"') for a in args)
    return "".join(f'"{a}"\n' for a in quoted)


def jvm_args(config: KafkaBrokerConfig, log4j: Path) -> list[str]:
    """The JVM options of a node: a fixed heap and Kafka's own GC choices (``kafka-run-class.sh``)."""
    return [
        f"-Xms{config.heap}m",
        f"-Xmx{config.heap}m",
        "-XX:+UseG1GC",
        "-XX:MaxGCPauseMillis=20",
        "-XX:InitiatingHeapOccupancyPercent=35",
        "-XX:+ExplicitGCInvokesConcurrent",
        # No /tmp/hsperfdata_* file per JVM (jps is not used).
        "-XX:-UsePerfData",
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={log4j}",
    ]
