"""A local broker's nodes as processes: each one's files and ports, and how its JVM is formatted, run and stopped.

``Node`` is what the broker knows of one node; ``Launcher`` writes its ``server.properties``, formats its log
directory and starts its JVM in the broker's ``ProcessGroup`` (through the placement's command prefix, so a
node of a namespace is started inside it), and stops nodes with SIGTERM or SIGKILL.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from sotw.broker.config import (
    LOG4J2,
    KafkaBrokerConfig,
    NodePorts,
    argfile_text,
    jvm_args,
    node_properties,
    properties_text,
)
from sotw.errors import BrokerError
from sotw.processgroup import ProcessGroup
from sotw.proxy import TcpProxy
from sotw.tls import write_private

log = logging.getLogger(__name__)

#: How many lines of a node's log an error message quotes.
LOG_TAIL = 25


def log_tail(path: Path, lines: int = LOG_TAIL) -> str:
    """The last ``lines`` lines of ``path`` (empty if it cannot be read)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


@dataclass
class Node:
    """One node's address, files, ports and process (None while it is down)."""

    id: int
    host: str
    dir: Path
    log_path: Path
    ports: NodePorts
    process: subprocess.Popen[bytes] | None = None
    proxy: TcpProxy | None = None
    down_on_purpose: bool = False

    @property
    def data(self) -> Path:
        """The node's ``log.dirs`` (its records and its copy of the cluster's metadata)."""
        return self.dir / "data"

    @property
    def properties(self) -> Path:
        """Its ``server.properties``."""
        return self.dir / "server.properties"

    @property
    def listen_address(self) -> str:
        """``HOST:PORT`` of its own client listener (past any proxy)."""
        return f"{self.host}:{self.ports.listen}"

    @property
    def client_address(self) -> str:
        """``HOST:PORT`` clients are told (its proxy's port when proxied)."""
        return f"{self.host}:{self.ports.client}"

    def alive(self) -> bool:
        """True while its process runs."""
        return self.process is not None and self.process.poll() is None


#: Turns a node's command into the one that runs it where it lives (``ip netns exec ...`` for a namespace).
CommandPrefix = Callable[[int, Sequence[str]], list[str]]


class Launcher:
    """Writes, formats, starts and stops nodes' JVMs in one process group.

    Parameters
    ----------
    config
        The broker's configuration (heap, overrides, timeouts).
    java, classpath
        The Java runtime and Kafka's class path.
    group
        The process group every JVM joins, so none outlives the broker's process.
    place
        Where a node's JVM runs: the node's command in, the command to spawn out.
    """

    def __init__(
        self, config: KafkaBrokerConfig, java: str, classpath: str, group: ProcessGroup, place: CommandPrefix
    ) -> None:
        self.config = config
        self.java = java
        self.classpath = classpath
        self.group = group
        self.place = place

    def write_config(self, node: Node, nodes: Mapping[int, Node], security: Mapping[str, str] | None) -> None:
        """Write ``node``'s ``server.properties`` (wired to ``nodes``) and log4j configuration."""
        node.dir.mkdir(parents=True, exist_ok=True)
        node.log_path.parent.mkdir(parents=True, exist_ok=True)
        props = node_properties(
            self.config,
            node.id,
            {n.id: n.ports for n in nodes.values()},
            node.data,
            security,
            {n.id: n.host for n in nodes.values()},
        )
        # A secured node's settings hold its keystore's and the admin's passwords: its owner's alone.
        write_private(node.properties, properties_text(props))
        (node.dir / "log4j2.properties").write_text(LOG4J2)

    def java_command(self, node: Node, main: Sequence[str]) -> list[str]:
        """The JVM command running ``main`` with ``node``'s JVM options."""
        return [
            self.java,
            *jvm_args(self.config, node.dir / "log4j2.properties"),
            "-cp",
            self.classpath,
            *main,
        ]

    def format(self, nodes: Sequence[Node], cluster_id: str, scram: Sequence[str]) -> None:
        """Format the log directories of ``nodes`` for ``cluster_id``, in parallel (one short JVM each).

        The tool only writes files, so it runs where the broker runs, whatever the nodes' namespaces.
        ``scram`` are the arguments creating the admin's SCRAM credential (none for plaintext).

        Raises
        ------
        BrokerError
            If a node's formatting fails, with the end of its log.
        """
        running = []
        for node in nodes:
            node.data.mkdir(parents=True, exist_ok=True)
            tool = ["kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(node.properties)]
            if scram:
                # The admin's SCRAM credential holds its password: in a 0600 argument file the launcher
                # reads (the main class too, as it stops expanding @files at the first application argument).
                tool = ["@" + str(write_private(node.dir / "format.args", argfile_text([*tool, *scram])))]
            cmd = self.java_command(node, tool)
            # The tool needs no more heap than the default's start; the node's fixed heap would be waste.
            cmd = [a for a in cmd if not a.startswith(("-Xms", "-Xmx"))]
            running.append((node, self.group.spawn(cmd, {}, node.log_path)))
        for node, proc in running:
            try:
                code = proc.wait(max(30.0, self.config.start_timeout))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                code = None
            (node.dir / "format.args").unlink(missing_ok=True)
            if code != 0:
                raise BrokerError(
                    f"formatting node {node.id}'s storage {node.data} failed (exit code {code}); "
                    f"the end of {node.log_path}:\n{log_tail(node.log_path)}"
                )

    def spawn(self, node: Node) -> None:
        """Start ``node``'s JVM where it lives.

        ``ip netns exec`` replaces itself with the JVM, so the process's pid is the JVM's: signals (pause,
        stop, kill) and resource sampling reach it as on loopback.
        """
        cmd = self.place(node.id, self.java_command(node, ["kafka.Kafka", str(node.properties)]))
        node.process = self.group.spawn(cmd, {}, node.log_path)
        node.down_on_purpose = False

    @staticmethod
    def terminate(nodes: Sequence[Node], grace_s: float, kill: bool = False) -> None:
        """SIGTERM (or SIGKILL) ``nodes`` at once and reap them; SIGKILL what is left after ``grace_s``."""
        procs = [n.process for n in nodes if n.process is not None]
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
                if not kill:
                    proc.send_signal(signal.SIGCONT)  # a paused node handles its SIGTERM only once it runs
        deadline = time.monotonic() + grace_s
        for proc in procs:
            try:
                proc.wait(None if kill else max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("Kafka pid %d did not stop within %g s of SIGTERM: killed", proc.pid, grace_s)
                proc.kill()
                proc.wait()
        for node in nodes:
            node.process = None
