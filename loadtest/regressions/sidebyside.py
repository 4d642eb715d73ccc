"""The two sides of a nightly run: the candidate (this checkout) and its baseline, installed beside it.

The baseline is a commit checked out in a git worktree of its own under the history root
(``baselines/<commit>``), so its code runs exactly as it was, and run by a Python environment of its own:
when its ``pyproject.toml`` is the candidate's, the candidate's environment with the baseline's tree first on
``PYTHONPATH`` (the same libraries, the baseline's code, also in Spark's Python workers, which inherit the
variable); otherwise its own ``.venv``, made by its own ``make setup``. Both stay for the next night.
"""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from loadtest.errors import HarnessError

log = logging.getLogger(__name__)

BASELINE, CANDIDATE = "baseline", "candidate"


@dataclass(frozen=True)
class Side:
    """Where one side's code is and how to run it.

    Parameters
    ----------
    name
        ``baseline`` or ``candidate``.
    commit
        The commit it runs (the candidate may have uncommitted changes on top).
    tree
        The checkout: scripts (``benchmarks/...``) are run from it and it is the working directory.
    python
        The interpreter that runs its benchmarks.
    env
        Variables set for its processes on top of the harness's own.
    """

    name: str
    commit: str
    tree: Path
    python: str
    env: Mapping[str, str] = field(default_factory=dict)

    def environment(self) -> dict[str, str]:
        """The environment of this side's processes."""
        return {**os.environ, **self.env}


def git(repo: Path, *args: str, check: bool = True) -> str:
    """Git's output in ``repo``, stripped.

    Raises
    ------
    HarnessError
        If git fails and ``check``, with its message.
    """
    try:
        done = subprocess.run(
            ["git", *args], capture_output=True, text=True, cwd=repo, check=False, timeout=300
        )
    except OSError as exc:
        raise HarnessError(f"git {' '.join(args)} failed: {exc}") from None
    if done.returncode != 0 and check:
        raise HarnessError(f"git {' '.join(args)} failed: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout.strip()


def resolve(repo: Path, ref: str) -> str:
    """The full commit hash ``ref`` names in ``repo``.

    Raises
    ------
    HarnessError
        If it names no commit.
    """
    sha = git(repo, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", check=False)
    if not sha:
        raise HarnessError(
            f"--baseline {ref!r} names no commit in {repo}: give a commit, tag or branch (git rev-parse)"
        )
    return sha


def install_baseline(
    repo: Path, root: Path, commit: str, python: str, say: Callable[[str], None] = lambda _: None
) -> Side:
    """The baseline side at ``commit``: its worktree under ``root/baselines`` and its environment.

    Parameters
    ----------
    repo
        The candidate's repository.
    root
        The history root.
    commit
        A full commit hash (``resolve``).
    python
        The candidate's interpreter, shared when the baseline's dependencies are the candidate's.
    say
        Progress lines.
    """
    tree = (root / "baselines" / commit[:12]).resolve()
    if not (tree / ".git").exists():
        if tree.exists():
            raise HarnessError(f"{tree} exists but is no git worktree: remove it and run again")
        say(f"nightly: checking out the baseline {commit[:12]} in {tree}")
        tree.parent.mkdir(parents=True, exist_ok=True)
        git(repo, "worktree", "prune")
        git(repo, "worktree", "add", "--detach", str(tree), commit)
    elif git(tree, "rev-parse", "HEAD") != commit:
        git(tree, "checkout", "--detach", commit)
    if (tree / "pyproject.toml").read_bytes() == (repo / "pyproject.toml").read_bytes():
        return Side(BASELINE, commit, tree, python, {"PYTHONPATH": str(tree)})
    own = tree / ".venv" / "bin" / "python"
    say(f"nightly: the baseline's dependencies differ from the candidate's: make setup in {tree}")
    done = subprocess.run(["make", "setup"], cwd=tree, capture_output=True, text=True, check=False)
    if done.returncode != 0 or not own.exists():
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-15:])
        raise HarnessError(f"make setup of the baseline {commit[:12]} in {tree} failed:\n{tail}")
    return Side(BASELINE, commit, tree, str(own))
