"""A team's tables as the verifier reads them: the rows of each session from Parquet, Delta or a Kafka topic, with the commit time of each, and the truth's tables to compare them with."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.dataset as ds

from loadtest.correctness.delta import FILE_COLUMN, file_times, is_delta_table, read_table
from loadtest.correctness.outputspec import COMMITTED, DELETED, KEYS, META, ROW_ID, SEQ, OutputSpec
from loadtest.correctness.topicoutput import RECORD_MS, read_topic_table
from loadtest.correctness.values import (
    read_truth_rows,
)
from loadtest.errors import HarnessError


def parquet_files(root: Path) -> list[Path]:
    """The Parquet files of a directory (Hive partition folders included), skipping ``_`` and ``.`` entries."""
    if not root.is_dir():
        return []
    return sorted(
        p
        for p in root.rglob("*.parquet")
        if not any(part.startswith(("_", ".")) for part in p.relative_to(root).parts)
    )


def _read_parquet_with_files(root: Path) -> pd.DataFrame:
    files = parquet_files(root)
    if not files:
        return pd.DataFrame()
    dataset = ds.dataset(
        [str(f) for f in files], format="parquet", partitioning="hive", partition_base_dir=str(root)
    )
    parts = []
    for fragment in dataset.get_fragments():
        part = fragment.to_table(schema=dataset.schema).to_pandas()
        part[FILE_COLUMN] = str(Path(fragment.path).relative_to(root))
        parts.append(part)
    frame: pd.DataFrame = pd.concat(parts, ignore_index=True)
    return frame


@dataclass(frozen=True)
class TablesOutput:
    """A tables-contract output, normalized: one row per live ``(key, row_id)`` as written.

    ``rows`` has ``key`` (the session or sensor), ``sensor`` (a session-keyed table's sensor column, else
    None), ``row_id``, ``row`` (the row as a dict, ``id`` included), ``seq`` and ``committed_ms`` where the
    output tells them (else NaN). ``key`` names what the table is
    keyed by; ``commit_source`` is a ``COMMIT_SOURCES`` key; ``ignored`` the columns that are not the rows'.
    ``changes``, for a topic, is every change it holds (``session``, ``seq``, ``committed_ms``), which dates
    more messages than the final rows do; None for files, which keep only the final rows.
    """

    rows: pd.DataFrame
    key: str
    commit_source: str
    ignored: tuple[str, ...] = ()
    changes: pd.DataFrame | None = None


def read_tables(spec: OutputSpec) -> TablesOutput:
    """Read a tables-contract output (Parquet directory, Delta table or Kafka topic) into ``TablesOutput``.

    Raises
    ------
    HarnessError
        If the table lacks a key or row id column (the message names the columns it has), or its topic
        cannot be read (``loadtest.correctness.topicoutput.read_topic_table``).
    """
    fmt = spec.resolved_format()
    where = str(spec.path)
    topic_changes = None
    if fmt == "topic":
        if spec.topic is None or spec.kafka is None:
            raise HarnessError("--format topic needs the output topic and the run's cluster")
        raw, topic_changes = read_topic_table(spec.kafka, spec.topic)
        where = f"topic {spec.topic}"
    elif fmt == "delta":
        raw = read_table(spec.path, with_files=True) if is_delta_table(spec.path) else pd.DataFrame()
    else:
        raw = _read_parquet_with_files(spec.path)
    empty = pd.DataFrame(columns=["key", "sensor", "row_id", "row", SEQ, COMMITTED])
    if raw.empty:
        return TablesOutput(empty, "session", _commit_source(fmt, raw), spec.ignored)
    key = next((k for k in KEYS if k in raw.columns), None)
    row_id = next((c for c in ROW_ID if c in raw.columns), None)
    if key is None or row_id is None:
        raise HarnessError(
            f"the table at {where} does not follow the tables contract: it needs a `session` (or `sensor`) "
            f"column and a `row_id` (or `id`) column, and has {sorted(str(c) for c in raw.columns if c != FILE_COLUMN)}; see "
            "docs/own-pipeline.md"
        )
    if DELETED in raw.columns:
        raw = raw[~raw[DELETED].fillna(False).astype(bool)]
    source = _commit_source(fmt, raw)
    committed = _commit_times(spec, raw, source)
    rows = pd.DataFrame(
        {
            "key": raw[key].astype(str).to_numpy(),
            "sensor": raw["sensor"].astype("string").to_numpy()
            if key == "session" and "sensor" in raw
            else None,
            "row_id": raw[row_id].astype("int64").to_numpy(),
            "row": [_row_of(r, int(i)) for r, i in zip(_plain_rows(raw), raw[row_id], strict=True)],
            SEQ: raw[SEQ].astype("float64").to_numpy() if SEQ in raw.columns else math.nan,
            COMMITTED: committed,
        }
    )
    changes = None
    if topic_changes is not None and key == "session":
        dates = topic_changes[COMMITTED if source == "column" else RECORD_MS].astype("float64")
        changes = pd.DataFrame(
            {"session": topic_changes["session"], "seq": topic_changes[SEQ].astype("int64"), COMMITTED: dates}
        )
        changes = changes[changes[COMMITTED].notna()]
    return TablesOutput(rows, key, source if SEQ in raw.columns else "none", spec.ignored, changes)


def _plain_rows(raw: pd.DataFrame) -> list[dict[str, Any]]:
    columns = [c for c in raw.columns if str(c) not in META and not str(c).startswith("_")]
    values = raw["values"].tolist() if "values" in raw.columns else [None] * len(raw)
    out = []
    # A frame with no columns has no records: a table whose rows are all in `values` has none of its own.
    records = raw[columns].to_dict("records") if columns else [{} for _ in range(len(raw))]
    for record, packed in zip(records, values, strict=True):
        row = {str(k): v for k, v in record.items() if not _missing(v)}
        if isinstance(packed, str):
            row.update(json.loads(packed))
        elif isinstance(packed, dict):  # a topic's JSON value may hold the row as an object
            row.update(packed)
        out.append(row)
    return out


def _row_of(row: dict[str, Any], row_id: int) -> dict[str, Any]:
    return {**{k: _plain(v) for k, v in row.items()}, "id": row_id}


def _plain(value: Any) -> Any:
    """Numpy scalars as Python values, so rows compare and print as JSON does."""
    return value.item() if hasattr(value, "item") else value


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _commit_source(fmt: str, raw: pd.DataFrame) -> str:
    if COMMITTED in raw.columns:
        return "column"
    return {"delta": "delta", "topic": "record"}.get(fmt, "first_seen")


def _commit_times(spec: OutputSpec, raw: pd.DataFrame, source: str) -> Any:
    if source == "column":
        return raw[COMMITTED].astype("float64").to_numpy()
    if source == "record":
        return raw[RECORD_MS].astype("float64").to_numpy()
    if source == "delta":
        times = file_times(spec.path)
    else:
        times = json.loads(spec.seen.read_text()) if spec.seen is not None and spec.seen.is_file() else {}
    return raw[FILE_COLUMN].map(lambda f: times.get(str(f), math.nan)).astype("float64").to_numpy()


def read_truth_tables(run_dir: Path) -> pd.DataFrame:
    """Every session's true final table (``truth/tables``): ``sensor``, ``session``, ``id``, ``values``."""
    return read_truth_rows(run_dir, "tables")
