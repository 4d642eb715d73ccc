"""The pipeline's output as the verifier reads it.

The changes, sessions, integrity and dead-letter datasets, Parquet or Delta, with the commit time of every batch.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from loadtest.correctness.delta import is_delta_table, read_table, transaction_times
from loadtest.correctness.outputspec import OutputSpec

log = logging.getLogger(__name__)

_PARTITIONS = {
    "changes": ("sensor", "date"),
    "sessions": ("sensor", "date"),
    "integrity": ("sensor", "date"),
    "dead_letters": ("date",),
}


@dataclass(frozen=True)
class PipelineOutput:
    """The visible (committed) content of a pipeline output root."""

    changes: pd.DataFrame
    sessions: pd.DataFrame
    integrity: pd.DataFrame
    dead_letters: pd.DataFrame
    commits: dict[int, int] = field(default_factory=dict)


def read_commits(root: Path) -> dict[int, int]:
    """``{batch_id: committed_ms}`` from the ``_commits/<batch_id>.json`` markers."""
    commits: dict[int, int] = {}
    folder = root / "_commits"
    if not folder.is_dir():
        return commits
    for path in folder.glob("*.json"):
        try:
            batch = int(path.stem)
            commits[batch] = int(json.loads(path.read_text())["committed_ms"])
        except (ValueError, KeyError, OSError) as exc:
            log.warning("ignoring unreadable commit marker %s: %s", path, exc)
    return commits


def read_dataset(
    path: Path,
    partitions: Iterable[str],
    batches: Iterable[int],
    where: ds.Expression | None = None,
    columns: Sequence[str] | None = None,
) -> pd.DataFrame:
    """One hive-partitioned dataset, restricted to committed batches; partition values read as strings.

    ``where`` keeps only the rows it selects; on a partition column it skips the other partitions' files.
    ``columns`` reads only those (with ``batch_id``, which the restriction needs).
    """
    files = (
        sorted(
            p
            for p in path.rglob("*.parquet")
            if not any(part.startswith(("_", ".")) for part in p.relative_to(path).parts)
        )
        if path.is_dir()
        else []
    )
    if not files:
        return pd.DataFrame()
    schema = pa.schema([(name, pa.string()) for name in partitions])
    dataset = ds.dataset(
        [str(f) for f in files],
        format="parquet",
        partitioning=ds.partitioning(schema, flavor="hive"),
        partition_base_dir=str(path),
    )
    wanted = None if columns is None else list(dict.fromkeys([*columns, "batch_id"]))
    frame: pd.DataFrame = dataset.to_table(filter=where, columns=wanted).to_pandas()
    if "batch_id" in frame.columns:
        frame = frame[frame["batch_id"].isin(list(batches))].reset_index(drop=True)
    return frame


def read_output(
    root: Path,
    fmt: str = "auto",
    where: Mapping[str, ds.Expression] | None = None,
    topic_prefix: str | None = None,
) -> PipelineOutput:
    """Read the four datasets and the commit times of an output root (see docs/pipeline-outputs.md).

    ``fmt`` ``parquet`` reads sotw's Parquet layout (only batches with a ``_commits`` marker), ``delta``
    four Delta tables (every committed version; a batch is dated by the commit that recorded its ``txn``),
    ``auto`` whichever is on disk. ``where`` maps a dataset's name to a filter of its rows (the Parquet layout
    only): ``loadtest.correctness.shards`` reads a few sensors at a time. ``topic_prefix`` keeps only the
    rows of topics starting with it: one run's, of an output several runs wrote.
    """
    if OutputSpec(root, "full", fmt).resolved_format() == "delta":
        if where is not None:
            raise ValueError(f"{root} is Delta: read_output filters only the Parquet layout")
        return of_topics(_read_delta_output(root), topic_prefix)
    commits = read_commits(root)
    filters = dict(where or {})
    if topic_prefix is not None:
        mine = pc.starts_with(ds.field("topic"), pattern=topic_prefix)
        filters = {name: mine & filters[name] if name in filters else mine for name in _PARTITIONS}
    frames = {
        name: read_dataset(root / name, parts, commits, filters.get(name))
        for name, parts in _PARTITIONS.items()
    }
    return PipelineOutput(commits=commits, **frames)


def of_topics(output: PipelineOutput, prefix: str | None) -> PipelineOutput:
    """The rows of ``output`` about topics starting with ``prefix`` (all of them when None)."""
    if prefix is None:
        return output

    def mine(frame: pd.DataFrame) -> pd.DataFrame:
        if frame.empty or "topic" not in frame:
            return frame
        return frame[frame["topic"].astype(str).str.startswith(prefix)].reset_index(drop=True)

    return replace(
        output,
        changes=mine(output.changes),
        sessions=mine(output.sessions),
        integrity=mine(output.integrity),
        dead_letters=mine(output.dead_letters),
    )


def read_changes(
    root: Path, columns: Sequence[str], fmt: str = "auto"
) -> tuple[pd.DataFrame, dict[int, int]]:
    """Only ``columns`` of the changes dataset (and ``batch_id``), with the commit times: a long run's latencies.

    The Parquet layout is read column by column; a Delta output is read whole (``read_output``).
    """
    if OutputSpec(root, "full", fmt).resolved_format() == "delta":
        whole = read_output(root, "delta")
        return whole.changes, whole.commits
    commits = read_commits(root)
    return read_dataset(root / "changes", _PARTITIONS["changes"], commits, columns=columns), commits


def _read_delta_output(root: Path) -> PipelineOutput:
    frames: dict[str, pd.DataFrame] = {}
    commits: dict[int, int] = {}
    for name in _PARTITIONS:
        table = root / name
        frames[name] = read_table(table) if is_delta_table(table) else pd.DataFrame()
        for batch, when in transaction_times(table).items():
            commits[batch] = min(when, commits.get(batch, when))
    return PipelineOutput(commits=commits, **frames)
