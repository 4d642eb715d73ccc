"""What the pipeline reads of Spark's checkpoint: the batches it committed, the offsets each was planned over.

Spark owns the checkpoint; sotw only reads it, to hold its own output against it (``pipeline.sinks`` when a
batch is replayed, ``pipeline.recovery`` before a query starts and when an output is rolled back).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipeline.errors import PipelineError


def checkpoint_batches(checkpoint: Path) -> list[int]:
    """Batch ids the Spark checkpoint has committed, ascending."""
    folder = checkpoint / "commits"
    if not folder.is_dir():
        return []
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit())


def planned_offsets(checkpoint: Path, batch_id: int) -> list[Any] | None:
    """The source offsets Spark's offset log recorded for ``batch_id`` (one entry per source), or None.

    Spark writes ``offsets/<batch>`` (a version line, the batch's metadata, then one line per source with the
    offsets the batch reads up to) before it runs the batch, so ``foreachBatch`` always finds its own entry.
    """
    path = checkpoint / "offsets" / str(batch_id)
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return None
    out: list[Any] = []
    for line in lines[2:]:
        try:
            out.append(json.loads(line))
        except ValueError:
            out.append(line)  # "-" for a source without an offset yet, or a format we do not read
    return out


def offset_changes(recorded: list[Any], planned: list[Any], most: int = 3) -> str:
    """A short description of where two offset-log entries differ, for an error message."""
    changes: list[str] = []
    for old, new in zip(recorded, planned, strict=False):
        if isinstance(old, dict) and isinstance(new, dict):
            for topic in sorted(set(old) | set(new)):
                before, after = old.get(topic, {}), new.get(topic, {})
                if not (isinstance(before, dict) and isinstance(after, dict)):
                    continue
                for part in sorted(set(before) | set(after), key=str):
                    if before.get(part) != after.get(part):
                        changes.append(f"{topic}[{part}] {before.get(part, '-')} -> {after.get(part, '-')}")
        elif old != new:
            changes.append(f"{old} -> {new}")
    if len(recorded) != len(planned):
        changes.append(f"{len(recorded)} sources -> {len(planned)}")
    shown = "; ".join(changes[:most])
    return shown + (f" and {len(changes) - most} more" if len(changes) > most else "")


def checkpoint_query_id(checkpoint: Path) -> str | None:
    """The query id Spark recorded in ``checkpoint/metadata`` (None before the first start)."""
    meta = checkpoint / "metadata"
    if not meta.is_file():
        return None
    try:
        return str(json.loads(meta.read_text().splitlines()[0])["id"])
    except (ValueError, KeyError, IndexError) as exc:
        raise PipelineError(f"checkpoint {checkpoint} is damaged: cannot read its metadata ({exc})") from None
