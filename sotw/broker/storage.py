"""The directory a local Kafka broker owns: one ``node-N`` per node and a note of the cluster it belongs to.

Kafka refuses to start on a log directory formatted for another cluster id, deep in its log. ``DataDir`` keeps
the cluster id and node count in ``sotw-kafka.json`` and checks every node's ``meta.properties`` against it
before any JVM starts, so a reused directory either comes back with its data or is refused with the reason.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from sotw.broker.config import new_cluster_id
from sotw.errors import BrokerError

STATE = "sotw-kafka.json"


def meta_cluster_id(data: Path) -> str | None:
    """The ``cluster.id`` in a formatted log directory's ``meta.properties`` (None if not formatted)."""
    try:
        text = (data / "meta.properties").read_text()
    except FileNotFoundError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "cluster.id":
            return value.strip()
    return None


class DataDir:
    """A broker's data directory, checked and claimed (``open``), removed at ``close`` if temporary.

    Parameters
    ----------
    path
        The directory.
    cluster_id
        The cluster's id, kept in ``sotw-kafka.json``.
    nodes
        How many nodes the cluster has.
    temporary
        Remove the directory at ``close``.
    """

    def __init__(self, path: Path, cluster_id: str, nodes: int, temporary: bool) -> None:
        self.path = path
        self.cluster_id = cluster_id
        self.nodes = nodes
        self.temporary = temporary

    @classmethod
    def open(cls, path: Path | None, nodes: int, cluster_id: str | None = None) -> DataDir:
        """Claim ``path`` (a new temporary directory when None) for a cluster of ``nodes``.

        Raises
        ------
        BrokerError
            If ``path`` holds something else, a cluster of another size, or a cluster of another id.
        """
        if path is None:
            tmp = Path(tempfile.mkdtemp(prefix="sotw-kafka-"))
            return cls._claim(tmp, cluster_id or new_cluster_id(), nodes, temporary=True)
        path = path.expanduser().resolve()
        state = path / STATE
        fix = f"use another --data-dir, or delete {path} to start afresh"
        if state.exists():
            try:
                saved = json.loads(state.read_text())
                saved_id, saved_nodes = str(saved["cluster_id"]), int(saved["nodes"])
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise BrokerError(f"{state} is unreadable ({exc}); {fix}") from None
            if saved_nodes != nodes:
                raise BrokerError(
                    f"{path} holds a cluster of {saved_nodes} node(s), not {nodes}: start it with "
                    f"--nodes {saved_nodes}, or {fix}"
                )
            if cluster_id is not None and cluster_id != saved_id:
                raise BrokerError(f"{path} is formatted for cluster id {saved_id}, not {cluster_id}; {fix}")
            claimed = cls(path, saved_id, nodes, temporary=False)
        elif path.exists() and any(path.iterdir()):
            raise BrokerError(f"{path} is not empty and not a sotw Kafka data directory (no {STATE}); {fix}")
        else:
            return cls._claim(path, cluster_id or new_cluster_id(), nodes, temporary=False)
        for node in range(1, nodes + 1):
            found = meta_cluster_id(claimed.node_dir(node) / "data")
            if found is not None and found != claimed.cluster_id:
                raise BrokerError(
                    f"node {node}'s storage in {claimed.node_dir(node)} is formatted for cluster id {found}, "
                    f"not {claimed.cluster_id}; {fix}"
                )
        return claimed

    @classmethod
    def _claim(cls, path: Path, cluster_id: str, nodes: int, temporary: bool) -> DataDir:
        path.mkdir(parents=True, exist_ok=True)
        (path / STATE).write_text(json.dumps({"cluster_id": cluster_id, "nodes": nodes}) + "\n")
        return cls(path, cluster_id, nodes, temporary)

    def node_dir(self, node: int) -> Path:
        """Node ``node``'s directory: its ``server.properties``, ``data/`` and (by default) its log."""
        return self.path / f"node-{node}"

    def formatted(self, data: Path) -> bool:
        """Whether the log directory ``data`` is formatted (for this cluster: ``open`` checked the others)."""
        return meta_cluster_id(data) is not None

    def close(self) -> None:
        """Remove the directory if it is temporary."""
        if self.temporary:
            shutil.rmtree(self.path, ignore_errors=True)
