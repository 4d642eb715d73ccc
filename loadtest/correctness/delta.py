"""Reading Delta Lake tables without a JVM: their rows, and when each row became visible.

The verifier reads a team's Delta output with the ``deltalake`` package (delta-rs), never with Spark, so the
verdict does not share the machinery of the job under test. A Delta table dates its own writes: every commit
in ``_delta_log/<version>.json`` carries a ``commitInfo`` timestamp, the files it added and, for an
idempotent streaming writer, the ``txn`` (application id and version, the batch id) it recorded. That is the
commit time end-to-end latency is measured against, as sotw's ``_commits`` markers are for its Parquet output.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote

import pandas as pd

log = logging.getLogger(__name__)

LOG_DIR = "_delta_log"
FILE_COLUMN = "_file"
"""The column ``read_table(with_files=True)`` adds: the data file (relative to the table) a row is in."""


def is_delta_table(path: Path) -> bool:
    """True if ``path`` is the root of a Delta table (it has a ``_delta_log`` with at least one commit)."""
    log_dir = path / LOG_DIR
    return log_dir.is_dir() and any(log_dir.glob("*.json"))


@dataclass(frozen=True)
class DeltaCommit:
    """One version of a Delta table, from its commit file.

    Parameters
    ----------
    version
        The table version.
    timestamp_ms
        ``commitInfo.timestamp``: when the writer committed it (epoch ms).
    transactions
        ``{app_id: version}`` of the ``txn`` actions (an idempotent streaming writer's batch ids).
    files
        Paths (relative to the table) of the data files it added.
    rows
        Rows it added, from the ``numRecords`` statistics of its files (0 where a writer gave none).
    """

    version: int
    timestamp_ms: int
    transactions: dict[str, int] = field(default_factory=dict)
    files: tuple[str, ...] = ()
    rows: int = 0


def read_commit(path: Path) -> DeltaCommit | None:
    """One ``_delta_log/<version>.json`` commit file, or None if it cannot be read (being written)."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    timestamp, txns, files, rows = 0, {}, [], 0
    for line in lines:
        try:
            action = json.loads(line)
        except ValueError:
            return None  # a commit file is written whole by a put-if-absent; a broken one is not ours to read
        if "commitInfo" in action:
            timestamp = int(action["commitInfo"].get("timestamp") or 0)
        elif "txn" in action:
            txns[str(action["txn"]["appId"])] = int(action["txn"]["version"])
        elif "add" in action:
            add = action["add"]
            files.append(unquote(str(add["path"])))  # a URI-encoded relative path in the log
            if not timestamp:
                timestamp = int(add.get("modificationTime") or 0)
            try:
                rows += int(json.loads(add.get("stats") or "{}").get("numRecords", 0))
            except (ValueError, AttributeError):
                pass
    return DeltaCommit(int(path.stem), timestamp, txns, tuple(files), rows)


def read_commits(table: Path, after: int = -1) -> list[DeltaCommit]:
    """The table's commits with a version above ``after``, in version order.

    Versions whose commit file was removed by log clean-up (``sotw pipeline compact``) are not listed; the
    table's rows are still read through its checkpoint.
    """
    log_dir = table / LOG_DIR
    if not log_dir.is_dir():
        return []
    commits = []
    for path in sorted(log_dir.glob("*.json")):
        if not path.stem.isdigit() or int(path.stem) <= after:
            continue
        commit = read_commit(path)
        if commit is not None:
            commits.append(commit)
    return commits


def file_times(table: Path) -> dict[str, int]:
    """``{data file: commit time (epoch ms)}`` of every file the table's readable commit files added."""
    return {name: c.timestamp_ms for c in read_commits(table) for name in c.files}


def transaction_times(table: Path, app_id: str | None = None) -> dict[int, int]:
    """``{txn version: commit time}``: when each batch of an idempotent writer became visible.

    ``app_id`` None takes every application's transactions (a table written by one query).
    """
    times: dict[int, int] = {}
    for commit in read_commits(table):
        for app, version in commit.transactions.items():
            if app_id is None or app == app_id:
                times.setdefault(version, commit.timestamp_ms)
    return times


def read_table(table: Path, with_files: bool = False) -> pd.DataFrame:
    """The table's current rows (its latest version) as a DataFrame; partition columns as written.

    ``with_files`` adds ``FILE_COLUMN``, the data file each row is in, so a row can be dated by the commit
    that added its file.
    """
    from deltalake import DeltaTable

    dt = DeltaTable(str(table))
    if not with_files:
        frame: pd.DataFrame = dt.to_pyarrow_table().to_pandas()
        return frame
    dataset = dt.to_pyarrow_dataset()
    parts = []
    for fragment in dataset.get_fragments():
        part = fragment.to_table(schema=dataset.schema).to_pandas()
        part[FILE_COLUMN] = str(fragment.path)
        parts.append(part)
    if not parts:
        return pd.DataFrame(columns=[f.name for f in dataset.schema] + [FILE_COLUMN])
    frame = pd.concat(parts, ignore_index=True)
    return frame
