"""The names a network gives what it makes, which carry its owner's pid, and the removal of a dead owner's.

Every network is tagged ``sotw<pid><letter>``: the prefix, the owning process's pid and a letter per network
of that process. Its bridge is ``<tag>br``, the root ends of its veth pairs ``<tag>v<N>`` (Linux allows 15
characters: 4 + 7 pid digits + 1 + 3 fit), its namespaces ``<tag>-<host>`` and its nftables table
``bridge <tag>``. A process killed with SIGKILL cannot remove them; the next network started on the machine
removes every such name whose pid is no longer alive (``remove_leftovers``).
"""

from __future__ import annotations

import logging
import os
import re
import signal
from dataclasses import dataclass

from sotw.network.system import run

log = logging.getLogger(__name__)

#: The first characters of every name a network makes.
PREFIX = "sotw"

_TAG = re.compile(rf"{PREFIX}(\d+)([a-z])")


@dataclass(frozen=True)
class Tag:
    """The owner of a network's names: a pid and a letter telling that process's networks apart."""

    pid: int
    letter: str

    def __str__(self) -> str:
        return f"{PREFIX}{self.pid}{self.letter}"

    @property
    def bridge(self) -> str:
        """The bridge's interface name."""
        return f"{self}br"

    @property
    def table(self) -> str:
        """The nftables table (family ``bridge``) holding the network's faults."""
        return str(self)

    def veth(self, index: int) -> str:
        """The root end of host ``index``'s veth pair."""
        return f"{self}v{index}"

    def peer(self, index: int) -> str:
        """The namespace end of host ``index``'s veth pair, before it is renamed ``eth0`` inside."""
        return f"{self}p{index}"

    def namespace(self, host: str) -> str:
        """The network namespace of ``host``."""
        return f"{self}-{host}"

    def owns(self, name: str) -> bool:
        """True if ``name`` was made for this tag."""
        return owner(name) == self


def owner(name: str) -> Tag | None:
    """The ``Tag`` a name was made for, or None for a name no network made."""
    match = _TAG.match(name)
    return Tag(int(match.group(1)), match.group(2)) if match else None


def alive(pid: int) -> bool:
    """True if a process ``pid`` exists (a reused pid counts as alive: its names wait for the next start)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass(frozen=True)
class Names:
    """What a network can leave on the machine, as found now: namespaces, links and nftables tables."""

    namespaces: tuple[str, ...]
    links: tuple[str, ...]
    tables: tuple[str, ...]

    @classmethod
    def found(cls) -> Names:
        """Every namespace, link and ``bridge`` table of the root namespace that starts with ``PREFIX``."""
        namespaces = [line.split()[0] for line in run(["ip", "netns", "list"]).splitlines() if line.strip()]
        links = [
            # "3: name@peer: <FLAGS> ...": the name, without the peer a veth shows
            line.split(":", 2)[1].strip().split("@")[0]
            for line in run(["ip", "-o", "link", "show"]).splitlines()
            if ":" in line
        ]
        tables = [
            line.split()[2]
            for line in run(["nft", "list", "tables", "bridge"]).splitlines()
            if line.startswith("table bridge ")
        ]
        return cls(_ours(namespaces), _ours(links), _ours(tables))

    def of(self, tag: Tag) -> Names:
        """Only the names made for ``tag``."""
        return Names(
            tuple(n for n in self.namespaces if tag.owns(n)),
            tuple(n for n in self.links if tag.owns(n)),
            tuple(n for n in self.tables if tag.owns(n)),
        )

    def __bool__(self) -> bool:
        return bool(self.namespaces or self.links or self.tables)


def _ours(names: list[str]) -> tuple[str, ...]:
    return tuple(n for n in names if n.startswith(PREFIX))


def remove(names: Names) -> None:
    """Remove ``names``: kill the processes left in each namespace, then the table, links and namespaces.

    Deleting a namespace only unmounts it while a process still runs inside, so those are killed first.
    Each removal is tried on its own; what is already gone is not an error.
    """
    for namespace in names.namespaces:
        for pid in run(["ip", "netns", "pids", namespace], check=False).split():
            try:
                os.kill(int(pid), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
    for table in names.tables:
        run(["nft", "delete", "table", "bridge", table], check=False)
    # Root ends first (each takes its peer along), the bridge last.
    for link in sorted(names.links, key=lambda n: n.endswith("br")):
        run(["ip", "link", "delete", link], check=False)
    for namespace in names.namespaces:
        run(["ip", "netns", "delete", namespace], check=False)


def remove_leftovers() -> Names:
    """Remove every name whose owner's pid is no longer alive; return what was removed.

    Raises
    ------
    NetworkError
        If the namespaces, links or tables cannot be listed.
    """
    found = Names.found()
    dead = {tag for n in (*found.namespaces, *found.links, *found.tables) if (tag := owner(n)) is not None}
    dead = {tag for tag in dead if tag.pid != os.getpid() and not alive(tag.pid)}
    left = Names(
        tuple(n for n in found.namespaces if owner(n) in dead),
        tuple(n for n in found.links if owner(n) in dead),
        tuple(n for n in found.tables if owner(n) in dead),
    )
    if left:
        log.warning(
            "removing what dead owners left: namespaces %s, links %s, nftables tables %s",
            list(left.namespaces),
            list(left.links),
            list(left.tables),
        )
        remove(left)
    return left
