"""Apache Kafka on this machine: one KRaft node, or a cluster of them, with the incidents of game days.

Each node is one JVM (``kafka.Kafka``) that is both broker and controller, run from the jars ``make setup``
fetched (``sotw.jars``), with its data under a directory the broker owns. ``KafkaBroker`` starts and stops
them, and offers the incidents of game days (pause, restart keeping or losing data, the proxy's network cuts),
plus what a cluster adds: a node killed, stopped or started on its own, leadership and replication looked up
through the admin API. docs/broker.md says what clients see in each. Its parts live beside it: where the
nodes live (``sotw.broker.placement``: loopback, or a network namespace each), their processes
(``sotw.broker.nodes``) and the cluster's look-ups (``sotw.broker.lookups``). A secured broker
(``security``) gets its TLS material, SCRAM admin and authorizer from ``sotw.broker.security`` and its run
users from ``sotw.broker.users``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import signal
import threading
import time
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import Any

from confluent_kafka.admin import AdminClient, ClusterMetadata

from sotw.broker.config import KafkaBrokerConfig
from sotw.broker.lookups import ClusterLookups, PartitionState, admin_on, agreed_metadata
from sotw.broker.net import port_in_use
from sotw.broker.nodes import Launcher, Node, log_tail
from sotw.broker.placement import Placement, host_name, placement
from sotw.broker.security import BrokerSecrets
from sotw.broker.storage import DataDir
from sotw.broker.users import RunUser, add_run_user
from sotw.errors import BrokerError, SetupError
from sotw.jars import classpath
from sotw.java import find_java
from sotw.kafka import KafkaConfig
from sotw.network import Network
from sotw.outage import Outage, now_ms
from sotw.processgroup import ProcessGroup, wait_stopped
from sotw.proxy import TcpProxy

log = logging.getLogger(__name__)

__all__ = ["KafkaBroker", "PartitionState"]


class KafkaBroker(ClusterLookups, contextlib.AbstractContextManager["KafkaBroker"]):
    """Apache Kafka nodes, started on enter and stopped on exit, with incidents for drills.

    Every node is broker and controller (KRaft combined mode) and runs in one ``ProcessGroup``: the JVMs stop
    with the broker and are killed if the process that started them dies. Data lives on disk, so ``restart``
    keeps every acknowledged record; ``restart(lose_data=True)`` wipes the nodes' log directories while they
    are down. The methods are thread-safe, so a drill thread can call them while others produce and consume.

    The nodes share one loopback address, or with ``netns`` each lives in a network namespace of its own,
    host ``nN`` of ``network``, so that ``network.partition`` cuts links between nodes, or between a node and
    the clients of the root namespace (``sotw.network.GATEWAY``).

    Parameters
    ----------
    config
        What to start; keyword arguments change single fields of it (``KafkaBroker(nodes=3)``).
    network
        A started ``sotw.network.Network`` holding hosts ``n1``...``nN`` to put the nodes in (implies
        ``netns``); it stays open when the broker stops. None with ``netns``: the broker makes its own,
        and removes it when it stops.

    Attributes
    ----------
    outages
        Every finished incident, oldest first (proxies keep their own in ``proxy.outages``).
    """

    def __init__(
        self, config: KafkaBrokerConfig | None = None, /, *, network: Network | None = None, **changes: Any
    ) -> None:
        if network is not None:
            changes["netns"] = True
        self.config = replace(config or KafkaBrokerConfig(), **changes)
        self.outages: list[Outage] = []
        self._nodes: dict[int, Node] = {}
        self._placement: Placement = placement(self.config, network)
        self._storage: DataDir | None = None
        self._secrets: BrokerSecrets | None = None
        self._launcher: Launcher | None = None
        self._paused_ms: int | None = None
        self._frozen: set[int] = set()
        self._admin: AdminClient | None = None
        self._lock = threading.RLock()

    # ---- what clients and samplers see ---------------------------------------------------------------

    @property
    def host(self) -> str:
        """The loopback address every listener binds (with ``netns``, the first node's own address)."""
        return self._nodes[1].host if self._nodes else self.config.host

    @property
    def network(self) -> Network | None:
        """The network whose hosts the nodes are (``netns``; None on loopback, and before ``start``)."""
        return self._placement.network

    @property
    def addresses(self) -> dict[int, str]:
        """Each node's address, by node id (all ``host`` on loopback)."""
        return {n.id: n.host for n in self._nodes.values()}

    def host_name(self, node: int) -> str:
        """Node ``node``'s host in ``network`` (``n1``...), for its faults: ``network.partition([...], [...])``.

        Raises
        ------
        BrokerError
            If the broker has no such node, or its nodes are not in a network.
        """
        self._node(node)
        if self.network is None:
            raise BrokerError("the broker's nodes share loopback: start it with netns to give them hosts")
        return host_name(node)

    @property
    def port(self) -> int:
        """The first node's client port (0 before ``start`` when a free one is to be picked)."""
        return self._nodes[1].ports.client if self._nodes else self.config.port

    @property
    def bootstrap(self) -> str:
        """``HOST:PORT[,HOST:PORT...]``: every node's client address (its proxy's when proxied)."""
        return ",".join(n.client_address for n in self._nodes.values())

    @property
    def node_ids(self) -> list[int]:
        """The nodes' ids, 1 to ``nodes``."""
        return sorted(self._nodes)

    @property
    def cluster_id(self) -> str | None:
        """The KRaft cluster id (None before ``start``)."""
        return self._storage.cluster_id if self._storage is not None else None

    @property
    def data_dir(self) -> Path | None:
        """The directory the nodes keep their data in (None before ``start``)."""
        return self._storage.path if self._storage is not None else None

    @property
    def pids(self) -> dict[str, int]:
        """Process ids of the running nodes, ``kafka`` (one node) or ``kafka-N``, for resource sampling."""
        one = len(self._nodes) == 1
        return {
            "kafka" if one else f"kafka-{n.id}": n.process.pid
            for n in self._nodes.values()
            if n.process is not None and n.alive()
        }

    @property
    def proxy(self) -> TcpProxy | None:
        """The proxy in front of a one-node broker when ``proxied`` (a cluster has ``proxies``)."""
        return self._nodes[1].proxy if len(self._nodes) == 1 else None

    @property
    def proxies(self) -> dict[int, TcpProxy]:
        """Each node's proxy when ``proxied``, by node id."""
        return {n.id: n.proxy for n in self._nodes.values() if n.proxy is not None}

    @property
    def paused(self) -> bool:
        """True between ``pause`` and ``resume``."""
        return self._paused_ms is not None

    @property
    def down_nodes(self) -> list[int]:
        """Nodes stopped on purpose (``stop_node``, ``kill_node``) and not started again."""
        return [n.id for n in self._nodes.values() if n.down_on_purpose and not n.alive()]

    @property
    def secrets(self) -> BrokerSecrets | None:
        """A secured broker's CA, keystores and admin (None for plaintext, and before ``start``)."""
        return self._secrets

    @property
    def client_settings(self) -> dict[str, str]:
        """The admin's librdkafka settings (empty for plaintext): ``security.protocol``, ``sasl.*``, ``ssl.*``."""
        return self._secrets.admin_settings if self._secrets is not None else {}

    @property
    def admin_config_path(self) -> Path | None:
        """The admin's client settings file (mode 0600) of a secured broker, for ``--kafka-config``."""
        return self._secrets.admin_config_path if self._secrets is not None else None

    def kafka_config(self) -> KafkaConfig:
        """A ``KafkaConfig`` for this broker as its admin (a super user when secured)."""
        return KafkaConfig(self.bootstrap, self.client_settings)

    def add_user(self, name: str, topic_prefix: str, group_prefix: str | None = None) -> RunUser:
        """Make a user of this secured broker that holds only a run's ACLs (``sotw.broker.users.add_run_user``).

        Raises
        ------
        BrokerError
            If the broker is plaintext (it has no users), or the user cannot be made.
        """
        if self._secrets is None:
            raise BrokerError("a plaintext broker has no users: start it with security sasl_ssl, ssl, ...")
        return add_run_user(self.kafka_config(), self._secrets, name, topic_prefix, group_prefix)

    def log_path(self, node: int = 1) -> Path:
        """Where ``node``'s output goes."""
        return self._node(node).log_path

    # ---- start and stop ------------------------------------------------------------------------------

    def start(self) -> KafkaBroker:
        """Start every node and wait until all of them answer; nothing is left running if that fails.

        Raises
        ------
        BrokerError
            Naming the fix: Java missing or older than 17, the jars missing or damaged (``make setup``), a
            port taken, a data directory of another cluster, or a node that never became ready (with the end
            of its log).
        NetworkError
            With ``netns``: naming what is missing to make the network (root, ``ip``, ``tc``, ``nft``).
        """
        with self._lock:
            cfg = self.config
            try:
                # The network first: a refusal for want of root or nftables names that, whatever else lacks.
                self._placement.open()
                java, jars = self._java()
                self._storage = DataDir.open(cfg.data_dir, cfg.nodes, cfg.cluster_id)
                self._launcher = Launcher(cfg, java, jars, ProcessGroup(), self._placement.command)
                self._layout()
                if cfg.mode.secured:
                    hosts = [n.host for n in self._nodes.values()]
                    self._secrets = BrokerSecrets(cfg.mode, self._storage.path, hosts)
                    self._secrets.prepare()
                for node in self._nodes.values():
                    self._write_config(node)
                self._format([n for n in self._nodes.values() if not self._storage.formatted(n.data)])
                for node in self._nodes.values():
                    self._spawn(node)
                self._wait_ready(self._nodes.values(), time.monotonic() + cfg.start_timeout)
            except BaseException:
                self.stop()
                raise
            log.info(
                "Apache Kafka (%d node%s%s) listening on %s, data in %s",
                cfg.nodes,
                "" if cfg.nodes == 1 else "s",
                f", network {self.network.tag}" if self.network is not None else "",
                self.bootstrap,
                self.data_dir,
            )
            return self

    def _java(self) -> tuple[str, str]:
        """The Java runtime and Kafka's class path, or ``BrokerError`` naming the fix (``make setup``)."""
        try:
            return find_java(self.config.java), ":".join(str(p) for p in classpath("kafka"))
        except SetupError as exc:
            raise BrokerError(str(exc)) from None

    def _layout(self) -> None:
        """Choose every node's address, ports and files, and start the proxies."""
        cfg = self.config
        assert self._storage is not None
        for node, p in self._placement.ports(cfg.nodes).items():
            folder = self._storage.node_dir(node)
            if cfg.log_path is None:
                log_path = folder / "server.log"
            elif cfg.nodes == 1:
                log_path = cfg.log_path
            else:
                log_path = cfg.log_path.with_name(f"{cfg.log_path.stem}-{node}{cfg.log_path.suffix}")
            self._nodes[node] = Node(node, self._placement.address(node), folder, log_path, p)
        if cfg.proxied:
            for n in self._nodes.values():
                n.proxy = TcpProxy(n.host, n.ports.listen, n.host, n.ports.client).start()

    def _write_config(self, node: Node) -> None:
        assert self._launcher is not None
        node.dir.mkdir(parents=True, exist_ok=True)  # the node's keystore is written there first
        security = None
        if self._secrets is not None:
            security = self._secrets.node_properties(node.id, node.dir, self.node_ids)
        self._launcher.write_config(node, self._nodes, security)

    def _format(self, nodes: list[Node]) -> None:
        """Format the log directories of ``nodes`` for the cluster id."""
        assert self._launcher is not None and self._storage is not None
        scram = self._secrets.format_arguments() if self._secrets is not None else []
        self._launcher.format(nodes, self._storage.cluster_id, scram)

    def _spawn(self, node: Node) -> None:
        assert self._launcher is not None
        for port in (node.ports.listen, node.ports.internal, node.ports.controller):
            if port_in_use(node.host, port):
                raise BrokerError(f"port {port} on {node.host} (node {node.id}) is taken by another process")
        self._launcher.spawn(node)

    def _wait_ready(self, nodes: Iterable[Node], deadline: float) -> None:
        """Block until each of ``nodes`` is registered and serving, as the metadata of every node shows it."""
        waiting = {n.id: n for n in nodes}
        admin: AdminClient | None = None
        while waiting:
            for node in waiting.values():
                if node.process is None or node.process.poll() is not None:
                    code = None if node.process is None else node.process.returncode
                    raise BrokerError(
                        f"Kafka node {node.id} exited with code {code} while starting; "
                        f"the end of {node.log_path}:\n{log_tail(node.log_path)}"
                    )
            if admin is None and all(port_in_use(n.host, n.ports.listen) for n in waiting.values()):
                # Only once the listeners accept: before, librdkafka logs every refused connection.
                admin = admin_on([n.listen_address for n in waiting.values()], self.client_settings)
            if admin is not None:
                with contextlib.suppress(Exception):  # KafkaException while the nodes are still coming up
                    brokers = admin.list_topics(timeout=1.0).brokers
                    for node_id in list(waiting):
                        if node_id in brokers:
                            del waiting[node_id]
            if not waiting:
                return
            if time.monotonic() > deadline:
                node = next(iter(waiting.values()))
                raise BrokerError(
                    f"Kafka node {node.id} did not become ready within {self.config.start_timeout:g} s; "
                    f"the end of {node.log_path}:\n{log_tail(node.log_path)}"
                )
            time.sleep(0.1)

    def stop(self, timeout: float | None = None) -> None:
        """Stop every node and the proxies; remove a temporary data directory and a network the broker made.

        Nodes with data to keep get SIGTERM all at once (stopped one by one, the last ones would wait in
        controlled shutdown for a controller quorum already gone), and SIGKILL after ``timeout`` seconds
        (``stop_grace_s`` by default). Nodes of a temporary directory are killed at once: there is nothing to
        keep, and a cluster's controlled shutdown still waits about 5 s for its quorum. A paused broker is
        resumed first.
        """
        with self._lock:
            self.resume()
            self._admin = None
            nodes = list(self._nodes.values())
            if self._storage is not None and self._storage.temporary:
                Launcher.terminate(nodes, 0.0, kill=True)
            else:
                Launcher.terminate(nodes, self.config.stop_grace_s if timeout is None else timeout)
            for node in self._nodes.values():
                if node.proxy is not None:
                    node.proxy.stop()
                    node.proxy = None
            launcher, self._launcher = self._launcher, None
            if launcher is not None:
                launcher.group.close()
            self._placement.close()
            storage, self._storage = self._storage, None
            self._secrets = None
            if storage is not None:
                storage.close()

    def __enter__(self) -> KafkaBroker:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # ---- incidents -----------------------------------------------------------------------------------

    def _node(self, node_id: int) -> Node:
        try:
            return self._nodes[node_id]
        except KeyError:
            raise BrokerError(
                f"no node {node_id}: the broker's nodes are {self.node_ids or 'not started'}"
            ) from None

    def _targets(self, node: int | None) -> list[Node]:
        return list(self._nodes.values()) if node is None else [self._node(node)]

    def check_alive(self) -> None:
        """Raise ``BrokerError`` if a node that should be running has gone away."""
        with self._lock:
            if not self._nodes:
                raise BrokerError("the Kafka broker is not running")
            for node in self._nodes.values():
                if not node.down_on_purpose and not node.alive():
                    code = None if node.process is None else node.process.returncode
                    raise BrokerError(
                        f"Kafka node {node.id} at {node.client_address} is gone "
                        f"(exit code {code}); see {node.log_path}"
                    )

    def pause(self, node: int | None = None) -> None:
        """Freeze the nodes (or one node) with SIGSTOP, as a hung broker or a long GC pause; no-op if paused.

        Connections stay open and nothing is answered: clients' requests wait until ``resume``, or fail when
        their own timeouts (``request.timeout.ms``, ``message.timeout.ms``) run out first. Returns once every
        thread of every frozen JVM has stopped, so nothing is answered after it returns.
        """
        with self._lock:
            self.check_alive()
            if self._paused_ms is None:
                self._paused_ms = now_ms()
            targets = [n for n in self._targets(node) if n.process is not None and n.alive()]
            self._frozen.update(n.id for n in targets)
            frozen = [n.process for n in targets if n.process is not None]
            for proc in frozen:
                proc.send_signal(signal.SIGSTOP)
            for proc in frozen:
                wait_stopped(proc.pid)

    def resume(self) -> Outage | None:
        """Let every paused node run again (SIGCONT); return the pause as an ``Outage`` (None if none was)."""
        with self._lock:
            if self._paused_ms is None:
                return None
            for n in self._nodes.values():
                if n.alive():
                    assert n.process is not None
                    n.process.send_signal(signal.SIGCONT)
            outage = Outage("pause", self._paused_ms, now_ms())
            self._paused_ms = None
            self._frozen.clear()
            self.outages.append(outage)
            return outage

    def restart(
        self, downtime_s: float = 0.0, kill: bool = False, lose_data: bool = False, node: int | None = None
    ) -> Outage:
        """Stop the nodes (or one node) and start them again on the same addresses; return the ``Outage``.

        Clients see their connections closed and new ones refused for the downtime, then reconnect to the same
        bootstrap address on their own. Returns once every restarted node is registered and serving again.

        Parameters
        ----------
        downtime_s
            Seconds to stay down after the processes exited.
        kill
            SIGKILL at once, as a crash; otherwise SIGTERM (a controlled shutdown), and SIGKILL after
            ``stop_grace_s``.
        lose_data
            Wipe the log directories while down: the nodes come back formatted afresh for the same cluster id,
            without topics, records, committed offsets or producer ids (the nodes that kept theirs copy the
            cluster's metadata back to a wiped node of a cluster).
        node
            One node of a cluster; None restarts all of them together.

        Raises
        ------
        BrokerError
            If a node does not come back within ``start_timeout``.
        """
        with self._lock:
            self.check_alive()
            self.resume()
            down_ms = now_ms()
            self.stop_node(node, kill=kill)
            time.sleep(downtime_s)
            self.start_node(node, lose_data=lose_data)
            outage = Outage("kill" if kill else "restart", down_ms, now_ms(), kept_data=not lose_data)
            self.outages.append(outage)
            log.info("Kafka back on %s after %.2f s (%s)", self.bootstrap, outage.duration_s, outage)
            return outage

    def stop_node(self, node: int | None = None, kill: bool = False) -> None:
        """Stop one node (or all): SIGTERM, or SIGKILL with ``kill``; it stays down until ``start_node``.

        SIGTERM is a controlled shutdown: the node hands its leaderships over before it exits. ``check_alive``
        does not count a node stopped here as gone.
        """
        with self._lock:
            targets = self._targets(node)
            for n in targets:
                n.down_on_purpose = True
            Launcher.terminate(targets, self.config.stop_grace_s, kill=kill)

    def kill_node(self, node: int) -> None:
        """SIGKILL one node, as a crash (``stop_node(node, kill=True)``)."""
        self.stop_node(node, kill=True)

    def start_node(self, node: int | None = None, lose_data: bool = False) -> None:
        """Start a stopped node (or every stopped one) and wait until it serves; ``lose_data`` wipes it first.

        Raises
        ------
        BrokerError
            If it is running, or does not become ready within ``start_timeout``.
        """
        with self._lock:
            assert self._storage is not None
            targets = [n for n in self._targets(node) if node is not None or not n.alive()]
            for n in targets:
                if n.alive():
                    raise BrokerError(f"Kafka node {n.id} is running: stop it first")
            if lose_data:
                for n in targets:
                    shutil.rmtree(n.data, ignore_errors=True)
                self._format(targets)
            try:
                for n in targets:
                    self._spawn(n)
                self._wait_ready(targets, time.monotonic() + self.config.start_timeout)
            except BaseException:
                Launcher.terminate(targets, 0.0, kill=True)
                for n in targets:
                    n.down_on_purpose = True
                raise

    # ---- the cluster as the admin API shows it -------------------------------------------------------

    def active_controller(self) -> int | None:
        """The node leading the KRaft controller quorum, as the nodes last wrote it; None during an election.

        Read from each node's ``quorum-state`` file, which KRaft rewrites on every change of epoch or leader:
        confluent-kafka has no DescribeQuorum call, and in KRaft a broker answers a client's metadata request
        with some live broker as the controller, not the quorum's leader. The highest epoch decides, since a
        node cut off keeps naming the leader of an older one; at that epoch a node may only have voted so far.
        """
        with self._lock:
            files = [n.data / "__cluster_metadata-0" / "quorum-state" for n in self._nodes.values()]
        best: tuple[int, int] | None = None
        for path in files:
            try:
                state = json.loads(path.read_text())
                epoch, leader = int(state["leaderEpoch"]), int(state["leaderId"])
            except (OSError, ValueError, KeyError, TypeError):
                continue  # not written yet, or caught mid-write: the others decide
            if best is None or (epoch, leader) > best:
                best = (epoch, leader)
        return best[1] if best is not None and best[1] >= 0 else None

    def admin(self) -> AdminClient:
        """The broker's admin client on the nodes' own listeners (past any proxy), made on first use."""
        with self._lock:
            if self._admin is None:
                self._admin = admin_on([n.listen_address for n in self._nodes.values()], self.client_settings)
            return self._admin

    def metadata(self) -> ClusterMetadata:
        """The cluster's metadata from nodes that answer.

        While a node is frozen, librdkafka may send the request down its open connection to that node, which
        never answers: an incident waiting for the ISR to shrink then sees nothing until the node is thawed.
        So a client bootstrapped on the running, unfrozen nodes alone asks instead. Nodes in namespaces can be
        cut from each other, and one cut from the controllers answers from a copy that stopped changing: each
        node is asked on its own and most of them decide (``agreed_metadata``).
        """
        with self._lock:
            frozen = set(self._frozen)
            answering = [n for n in self._nodes.values() if n.id not in frozen and n.alive()]
        if self.network is not None and answering:
            return agreed_metadata({n.id: n.listen_address for n in answering}, self.client_settings, 5.0)
        if not frozen or not answering:
            return self.admin().list_topics(timeout=10)
        return admin_on([n.listen_address for n in answering], self.client_settings).list_topics(timeout=10)
