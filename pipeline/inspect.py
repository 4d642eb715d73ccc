"""``sotw pipeline inspect OUTPUT``: what a pipeline run wrote, summarized for a human.

Reads the datasets with pyarrow (no Spark start-up), counting only committed batches, so it can be pointed at
the output of a query that is still running.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds

from pipeline.delta import BATCH_ID, is_table
from pipeline.sinks import DATASETS, PARTITIONS, committed_batches


def read_dataset(output: Path, name: str, columns: list[str] | None = None) -> pa.Table | None:
    """One output dataset as an Arrow table, restricted to committed batches; None if nothing was written.

    A dataset written with ``--format delta`` is read as its Delta table's latest version.
    """
    root = output / name
    if is_table(root):
        from deltalake import DeltaTable

        table: pa.Table = DeltaTable(str(root)).to_pyarrow_table(columns=columns)
        return table
    if not root.is_dir() or not any(root.rglob("*.parquet")):
        return None
    # Partition values are strings: inferred, a sensor called "0007" would come back as a number, and a dataset
    # whose only partition is null (records with no sensor) could not be read at all.
    keys = pa.schema([(key, pa.string()) for key in PARTITIONS[name]])
    dataset = ds.dataset(str(root), format="parquet", partitioning=ds.partitioning(keys, flavor="hive"))
    committed = committed_batches(output)
    if not committed:
        return None
    flt = ds.field("batch_id").isin(pa.array(committed, pa.int64()))
    return dataset.to_table(columns=columns, filter=flt)


@dataclass
class OutputSummary:
    """Counts a person wants first: batches, sessions by status, violations by kind, dead letters."""

    batches: int = 0
    changes: int = 0
    sessions_by_status: Counter[str] = field(default_factory=Counter)
    violations_by_kind: Counter[str] = field(default_factory=Counter)
    dead_letters_by_reason: Counter[str] = field(default_factory=Counter)
    sensors: int = 0


def summarize_output(output: Path) -> OutputSummary:
    """Summarize an output root written by ``sotw pipeline``."""
    summary = OutputSummary(batches=len(committed_batches(output)) or _delta_batches(output))
    changes = read_dataset(output, "changes", ["sensor"])
    if changes is not None:
        summary.changes = changes.num_rows
        summary.sensors = len(set(changes.column("sensor").to_pylist()))
    sessions = read_dataset(output, "sessions", ["status"])
    if sessions is not None:
        summary.sessions_by_status.update(sessions.column("status").to_pylist())
    integrity = read_dataset(output, "integrity", ["violation"])
    if integrity is not None:
        summary.violations_by_kind.update(integrity.column("violation").to_pylist())
    dead = read_dataset(output, "dead_letters", ["detail"])
    if dead is not None:
        # The reason's first words are the rule broken; the rest (positions, bytes) would split the counts.
        summary.dead_letters_by_reason.update(str(d).split(":")[0] for d in dead.column("detail").to_pylist())
    return summary


def _delta_batches(output: Path) -> int:
    """Batches a Delta output recorded: the distinct transaction versions of its tables' commits."""
    batches: set[str] = set()
    for name in DATASETS:
        root = output / name
        if is_table(root):
            from deltalake import DeltaTable

            for commit in DeltaTable(str(root)).history():
                if BATCH_ID in commit:
                    batches.add(str(commit[BATCH_ID]))
    return len(batches)


def render(summary: OutputSummary, output: Path) -> str:
    """A plain-text report of ``summary``."""
    lines = [
        f"output     {output}",
        f"batches    {summary.batches} committed",
        f"changes    {summary.changes:,} rows from {summary.sensors} sensors",
        "",
        "sessions by status",
    ]
    by_status = sorted(summary.sessions_by_status.items())
    lines += [f"  {k:<18} {v:>8,}" for k, v in by_status] or ["  (none closed)"]
    lines += ["", "violations by kind"]
    lines += [f"  {k:<18} {v:>8,}" for k, v in sorted(summary.violations_by_kind.items())] or ["  (none)"]
    lines += ["", "dead letters by reason"]
    lines += [f"  {k[:40]:<40} {v:>8,}" for k, v in summary.dead_letters_by_reason.most_common()] or [
        "  (none)"
    ]
    return "\n".join(lines)


__all__ = ["DATASETS", "OutputSummary", "read_dataset", "render", "summarize_output"]
