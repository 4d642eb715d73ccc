"""The tools a network of namespaces needs (root, ``ip``, ``tc``, ``nft``), checked once, and how they are run.

Every change to the machine's network goes through ``run``, so a failure names the command and what the tool
said, and ``require`` names everything missing at once, with the way to get it.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from collections.abc import Sequence

# Defined with the project's other error types; imported here too, where the network's code has always found it.
from sotw.errors import NetworkError as NetworkError

log = logging.getLogger(__name__)

#: Where the tools live on Debian; a non-root PATH often lacks the sbin directories.
_SBIN = "/usr/local/sbin:/usr/sbin:/sbin"

#: Each tool, and how to get it.
TOOLS = {
    "ip": "iproute2 (as root: apt-get install iproute2)",
    "tc": "iproute2 (as root: apt-get install iproute2)",
    "nft": "nftables (`make setup` installs it when run as root; or as root: apt-get install nftables)",
}


def tool(name: str) -> str:
    """The path of ``name`` on PATH or in the sbin directories (``name`` itself when not found)."""
    return shutil.which(name, path=f"{os.environ.get('PATH', '')}:{_SBIN}") or name


def missing() -> list[str]:
    """What this process lacks to build a network: root, then each tool not found, as the way to get it."""
    lacks = []
    if os.geteuid() != 0:
        lacks.append("root (network namespaces, bridges and nftables need CAP_NET_ADMIN: run as root)")
    for name, package in TOOLS.items():
        if tool(name) == name:
            lacks.append(f"`{name}` from {package}")
    return lacks


def require() -> None:
    """Raise ``NetworkError`` naming everything missing to build a network of namespaces, if anything is.

    Raises
    ------
    NetworkError
        One message listing root, ``ip``/``tc`` and ``nft`` as they are missing, each with the way to get it.
    """
    lacks = missing()
    if lacks:
        raise NetworkError("a network of namespaces needs " + "; ".join(lacks))


def run(argv: Sequence[str], stdin: str | None = None, check: bool = True) -> str:
    """Run ``argv`` (its first item a tool name from ``TOOLS``) and return its standard output.

    Parameters
    ----------
    argv
        The command; its first item is resolved with ``tool``.
    stdin
        Text for its standard input (``nft -f -`` scripts).
    check
        Raise ``NetworkError`` on a non-zero exit; otherwise log it at debug level (clean-up of what may
        already be gone).

    Raises
    ------
    NetworkError
        If the command fails and ``check``, naming it and quoting what it wrote to standard error.
    """
    cmd = [tool(argv[0]), *argv[1:]]
    done = subprocess.run(cmd, input=stdin, capture_output=True, text=True, check=False)  # noqa: S603
    if done.returncode != 0:
        said = done.stderr.strip() or done.stdout.strip()
        if check:
            raise NetworkError(f"`{' '.join(argv)}` failed (exit code {done.returncode}): {said}")
        log.debug("`%s` failed (exit code %d): %s", " ".join(argv), done.returncode, said)
    return done.stdout
