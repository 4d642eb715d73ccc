"""What the pipeline has written, as a run samples it: its output's committed batches (Parquet, Delta or a team's files) and its progress log."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from loadtest.correctness.delta import read_commits
from loadtest.correctness.tables import parquet_files
from pipeline.progress import input_messages


class OutputProbe:
    """Rows committed to the pipeline's output, from its ``_commits`` markers (read once each)."""

    def __init__(self, output: Path) -> None:
        self._commits = output / "_commits"
        self._seen: set[str] = set()
        self.rows: dict[str, int] = {}
        self.batches = 0

    def sample(self) -> dict[str, Any]:
        """Cumulative rows written per dataset."""
        if self._commits.is_dir():
            for path in self._commits.glob("*.json"):
                if path.name in self._seen:
                    continue
                try:
                    marker = json.loads(path.read_text())
                except (OSError, ValueError):
                    continue  # being renamed into place; next second
                self._seen.add(path.name)
                self.batches += 1
                for name, n in marker.get("rows", {}).items():
                    self.rows[name] = self.rows.get(name, 0) + int(n)
        return {"written_" + k: v for k, v in self.rows.items()} | {"batches": self.batches}


class CheckpointProbe:
    """Batches and the last batch's duration of any Structured Streaming query, from its checkpoint.

    Spark writes ``offsets/<batch>`` when a batch is planned and ``commits/<batch>`` when it is done, so
    the time between the two files is the batch's duration, read without the job's cooperation.
    """

    def __init__(self, checkpoint: Path) -> None:
        self._checkpoint = checkpoint

    def sample(self) -> dict[str, Any]:
        """Batches committed so far and the last one's duration."""
        commits = self._checkpoint / "commits"
        done = [int(p.name) for p in commits.iterdir() if p.name.isdigit()] if commits.is_dir() else []
        if not done:
            return {"batches": 0}
        last = max(done)
        try:
            took = (commits / str(last)).stat().st_mtime - (
                self._checkpoint / "offsets" / str(last)
            ).stat().st_mtime
        except OSError:
            took = 0.0
        return {"batches": last + 1, "batch_duration_ms": max(0, int(took * 1000))}


class DeltaOutputProbe:
    """Rows committed to Delta tables, from their commit files (each read once).

    Parameters
    ----------
    tables
        ``{dataset: table path}``; each dataset's rows are reported as ``written_<dataset>``.
    """

    def __init__(self, tables: Mapping[str, Path]) -> None:
        self._tables = dict(tables)
        self._version = dict.fromkeys(self._tables, -1)
        self.rows = dict.fromkeys(self._tables, 0)

    def sample(self) -> dict[str, Any]:
        """Cumulative rows written per dataset."""
        for name, table in self._tables.items():
            for commit in read_commits(table, after=self._version[name]):
                self._version[name] = commit.version
                self.rows[name] += commit.rows
        return {"written_" + k: v for k, v in self.rows.items()}


class FilesOutputProbe:
    """Rows in a directory of Parquet files, and when each file was first seen (the commit time of last resort).

    ``close`` writes ``{file: first seen, epoch ms}`` to ``seen_path`` for the verifier's latency figures. A
    file written again in place (a job that rewrites its whole table into one file) is left out of it: when
    its rows became visible is not known, so their latency is not measured rather than dated by the file's
    first version, which would make it come out before the messages were even sent.
    """

    def __init__(self, root: Path, seen_path: Path, dataset: str = "changes") -> None:
        self._root = root
        self._seen_path = seen_path
        self._dataset = dataset
        self.first_seen: dict[str, int] = {}
        self._versions: dict[str, tuple[int, int, int]] = {}
        self._rows: dict[str, int] = {}
        self.rewritten: set[str] = set()

    @property
    def rows(self) -> int:
        """Rows in the files as last seen."""
        return sum(self._rows.values())

    def sample(self) -> dict[str, Any]:
        """Rows in the files seen so far, each file as last seen."""
        now = int(time.time() * 1000)
        for path in parquet_files(self._root):
            name = str(path.relative_to(self._root))
            try:
                stat = path.stat()
                version = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
                if self._versions.get(name) == version:
                    continue
                rows = pq.ParquetFile(path).metadata.num_rows
            except (OSError, ValueError, pa.ArrowException):
                continue  # still being written; next second
            if name in self._versions:
                self.rewritten.add(name)
            else:
                self.first_seen[name] = now
            self._versions[name] = version
            self._rows[name] = int(rows)
        return {f"written_{self._dataset}": self.rows}

    def close(self) -> None:
        """Write the first-seen times of the files never written again."""
        self._seen_path.parent.mkdir(parents=True, exist_ok=True)
        kept = {name: ms for name, ms in self.first_seen.items() if name not in self.rewritten}
        self._seen_path.write_text(json.dumps(kept))


class ProgressProbe:
    """The pipeline's consumed rows and last batch duration, tailing its progress log."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._pos = 0
        self.consumed = 0
        self.last_duration_ms = 0
        self.state_rows = 0

    def sample(self) -> dict[str, Any]:
        """Cumulative input rows consumed by the pipeline."""
        if self._path.is_file():
            with self._path.open() as f:
                f.seek(self._pos)
                for line in f:
                    if not line.endswith("\n"):
                        break  # partial line: read it next time
                    self._pos += len(line.encode())
                    try:
                        rec = json.loads(line)
                    except ValueError:
                        continue
                    self.consumed += input_messages(rec)
                    self.last_duration_ms = int((rec.get("durationMs") or {}).get("triggerExecution", 0))
                    ops = rec.get("stateOperators") or [{}]
                    self.state_rows = int(ops[0].get("numRowsTotal", 0))
        return {
            "consumed": self.consumed,
            "batch_duration_ms": self.last_duration_ms,
            "state_rows": self.state_rows,
        }
