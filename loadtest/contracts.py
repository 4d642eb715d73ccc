"""The output contracts the verifier reads, so it can judge any team's streaming job, not only sotw's.

Two contracts (docs/own-pipeline.md states them for users):

- **full**: sotw's own four datasets (changes, sessions, integrity, dead letters; docs/pipeline-outputs.md),
  verified change by change under the run's integrity policy (``loadtest.verify``).
- **tables**: the contract a team can meet in an afternoon: one table holding each session's (or each
  sensor's) current rows, a row per ``(session, row_id)`` with the row's columns. Only the final tables
  are compared with the simulator's truth: exact, rows missing, rows extra, rows with wrong values.

Either is read from Parquet files or from a Delta Lake table (``loadtest.delta``), named or detected
(``OutputSpec.resolved_format``). A session's table can be judged only if every message that built it
reached the broker intact; a session that lost one upstream (an injected gap, a malformed copy without an
intact one, a send never acknowledged) has no single right answer and is counted as not judged.
"""

from __future__ import annotations

import json
import logging
import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow.dataset as ds

from loadtest.delta import FILE_COLUMN, file_times, is_delta_table, read_table
from loadtest.errors import HarnessError
from loadtest.results import Correctness, Discrepancy

log = logging.getLogger(__name__)

CONTRACTS = ("full", "tables")
FORMATS = ("auto", "parquet", "delta")
FULL_DATASETS = ("changes", "sessions", "integrity", "dead_letters")

KEYS = ("session", "sensor")
ROW_ID = ("row_id", "id")
SEQ = "seq"
DELETED = "deleted"
COMMITTED = "committed_ms"
# Columns of the tables contract that are not the row's own columns.
META = frozenset({*KEYS, *ROW_ID, SEQ, DELETED, COMMITTED, "values", "batch_id", "processed_ms", FILE_COLUMN})

# How a commit time was found, for the report (docs/own-pipeline.md, "Latency").
COMMIT_SOURCES = {
    "markers": "sotw's _commits markers",
    "delta": "Delta commit timestamps",
    "column": "the committed_ms column",
    "first_seen": "when the harness first saw the row's file",
    "none": "not measured: the output has no seq column",
}


@dataclass(frozen=True)
class OutputSpec:
    """Where a job writes and which contract and format the verifier reads it with.

    Parameters
    ----------
    path
        The output root (full contract) or the table (tables contract).
    contract
        ``full`` or ``tables``.
    format
        ``parquet``, ``delta``, or ``auto`` (a ``_delta_log`` makes it Delta).
    seen
        A JSON file of ``{data file: epoch ms}`` the harness's output probe writes while the run goes: when
        it first saw each file, the commit time of last resort.
    """

    path: Path
    contract: str = "full"
    format: str = "auto"
    seen: Path | None = None

    def __post_init__(self) -> None:
        if self.contract not in CONTRACTS:
            raise HarnessError(
                f"output contract must be one of {', '.join(CONTRACTS)}, got {self.contract!r}"
            )
        if self.format not in FORMATS:
            raise HarnessError(f"output format must be one of {', '.join(FORMATS)}, got {self.format!r}")

    def resolved_format(self) -> str:
        """``parquet`` or ``delta``: as given, or detected from what is on disk."""
        if self.format != "auto":
            return self.format
        table = self.path / "changes" if self.contract == "full" else self.path
        return "delta" if is_delta_table(table) else "parquet"


# --------------------------------------------------------------------------------------------- reading


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

    ``rows`` has ``key`` (the session or sensor), ``row_id``, ``row`` (the row as a dict, ``id`` included),
    ``seq`` and ``committed_ms`` where the output tells them (else NaN). ``key`` names what the table is
    keyed by; ``commit_source`` is a ``COMMIT_SOURCES`` key.
    """

    rows: pd.DataFrame
    key: str
    commit_source: str


def read_tables(spec: OutputSpec) -> TablesOutput:
    """Read a tables-contract output (Parquet directory or Delta table) into ``TablesOutput``.

    Raises
    ------
    HarnessError
        If the table lacks a key or row id column (the message names the columns it has).
    """
    fmt = spec.resolved_format()
    if fmt == "delta":
        raw = read_table(spec.path, with_files=True) if is_delta_table(spec.path) else pd.DataFrame()
    else:
        raw = _read_parquet_with_files(spec.path)
    empty = pd.DataFrame(columns=["key", "row_id", "row", SEQ, COMMITTED])
    if raw.empty:
        return TablesOutput(empty, "session", _commit_source(fmt, raw))
    key = next((k for k in KEYS if k in raw.columns), None)
    row_id = next((c for c in ROW_ID if c in raw.columns), None)
    if key is None or row_id is None:
        raise HarnessError(
            f"the table at {spec.path} does not follow the tables contract: it needs a `session` (or `sensor`) "
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
            "row_id": raw[row_id].astype("int64").to_numpy(),
            "row": [_row_of(r, int(i)) for r, i in zip(_plain_rows(raw), raw[row_id], strict=True)],
            SEQ: raw[SEQ].astype("float64").to_numpy() if SEQ in raw.columns else math.nan,
            COMMITTED: committed,
        }
    )
    return TablesOutput(rows, key, source if SEQ in raw.columns else "none")


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
    return "delta" if fmt == "delta" else "first_seen"


def _commit_times(spec: OutputSpec, raw: pd.DataFrame, source: str) -> Any:
    if source == "column":
        return raw[COMMITTED].astype("float64").to_numpy()
    if source == "delta":
        times = file_times(spec.path)
    else:
        times = json.loads(spec.seen.read_text()) if spec.seen is not None and spec.seen.is_file() else {}
    return raw[FILE_COLUMN].map(lambda f: times.get(str(f), math.nan)).astype("float64").to_numpy()


def read_truth_tables(run_dir: Path) -> pd.DataFrame:
    """Every session's true final table (``truth/tables``): ``sensor``, ``session``, ``id``, ``values``."""
    files = sorted((run_dir / "truth" / "tables").glob("*.parquet"))
    if not files:
        return pd.DataFrame(columns=["sensor", "session", "id", "values"])
    frame: pd.DataFrame = ds.dataset([str(f) for f in files], format="parquet").to_table().to_pandas()
    return frame


# --------------------------------------------------------------------------------------------- verdict


def same_row(got: dict[str, Any], want: dict[str, Any]) -> bool:
    """Whether two rows hold the same columns and values (numbers compared as numbers: 21 == 21.0)."""
    if set(got) != set(want):
        return False
    for name, value in want.items():
        mine = got[name]
        if isinstance(value, int | float) and isinstance(mine, int | float) and not isinstance(value, bool):
            if float(value) != float(mine):
                return False
        elif mine != value:
            return False
    return True


def judged_sessions(ledger: pd.DataFrame) -> dict[str, str]:
    """``{session: why not judged}`` for the sessions that lost a message before the pipeline could see it.

    Judged are the sessions every snapshot and update seq of which reached the broker intact at least once.
    """
    delivered = ledger["delivered"].fillna(False).astype(bool) & ledger["offset"].notna()
    intact = ledger[delivered & (ledger["fault"] != "malformed")]
    have: dict[str, set[int]] = {}
    for session, seq in zip(intact["session"], intact["seq"], strict=True):
        have.setdefault(str(session), set()).add(int(seq))
    table = ledger[ledger["kind"] != "end"]
    lost: dict[str, str] = {}
    for session, rows in table.groupby("session"):
        seqs = {int(s) for s in rows["seq"]}
        missing = sorted(seqs - have.get(str(session), set()))
        if missing:
            faults = rows[rows["seq"].isin(missing)]["fault"].astype(str)
            kinds = sorted(set(faults) - {"none"}) or ["not delivered"]
            lost[str(session)] = f"seq {_list(missing)} never reached the broker intact ({', '.join(kinds)})"
    return lost


def _list(values: Iterable[int], most: int = 6) -> str:
    items = list(values)
    shown = ", ".join(map(str, items[:most]))
    return shown + (f" and {len(items) - most} more" if len(items) > most else "")


def session_faults(ledger: pd.DataFrame) -> dict[str, str]:
    """Per session, the faults that reorder or repeat what the pipeline receives, for a wrong table's story."""
    out: dict[str, str] = {}
    faulty = ledger[ledger["fault"].isin(["delayed", "duplicate"])]
    for session, rows in faulty.groupby("session"):
        parts = []
        for fault, what in (
            ("delayed", "delayed (arrived after later seqs)"),
            ("duplicate", "duplicated later"),
        ):
            seqs = sorted({int(s) for s in rows.loc[rows["fault"] == fault, "seq"]})
            if seqs:
                parts.append(f"seq {_list(seqs)} {what}")
        out[str(session)] = "; ".join(parts)
    return out


def verify_tables(
    ledger: pd.DataFrame, truth_sessions: pd.DataFrame, truth_tables: pd.DataFrame, output: TablesOutput
) -> tuple[Correctness, list[Discrepancy]]:
    """Compare each judged session's (or sensor's) final table with the truth, row by row.

    Returns the ``Correctness`` (without triage) and its discrepancies, one per wrong, missing, extra or
    repeated row, each naming the session, the row and the faults its session met.
    """
    lost = judged_sessions(ledger)
    faults = session_faults(ledger)
    sensor_of = {str(s): str(n) for s, n in zip(ledger["session"], ledger["sensor"], strict=True)}
    truth_of = _truth_keys(ledger, truth_sessions, output.key)
    want_rows: dict[str, dict[int, dict[str, Any]]] = {k: {} for k in truth_of}
    session_of_key = {k: s for k, s in truth_of.items()}
    by_session = {str(s): g for s, g in truth_tables.groupby("session")} if not truth_tables.empty else {}
    for key, session in truth_of.items():
        table = by_session.get(session)
        if table is not None:
            want_rows[key] = {
                int(i): json.loads(v) for i, v in zip(table["id"], table["values"], strict=True)
            }
    got = output.rows
    got_by_key = {str(k): g for k, g in got.groupby("key")} if not got.empty else {}
    counts: Counter[str] = Counter()
    found: list[Discrepancy] = []
    judged = exact = 0
    for key in sorted(set(want_rows) | set(got_by_key)):
        known = session_of_key.get(key)
        sensor = sensor_of.get(known or "", key)
        if known is None:
            counts["extra"] += len(got_by_key[key])
            found.append(
                Discrepancy("unknown_session", key, f"rows for a {output.key} the ledger never had", sensor)
            )
            continue
        session = known
        if session in lost:
            counts["not_judged"] += 1
            continue
        judged += 1
        story = faults.get(session) or "no fault reached this session: the job's own error"
        mine = got_by_key.get(key, got.iloc[0:0])
        problems = _compare(want_rows[key], mine, counts)
        exact += not problems
        for kind, detail in problems:
            found.append(Discrepancy(kind, session, f"{detail}; {story}", sensor))
    counts["expected"] = sum(len(want_rows[k]) for k in want_rows if session_of_key[k] not in lost)
    kinds = Counter(d.kind for d in found)
    correctness = Correctness(
        policy="tables",
        passed=not found,
        sessions_expected=len(want_rows),
        sessions_exact_required=judged,
        sessions_exact=exact,
        exact_match_rate=exact / judged if judged else math.nan,
        rows_expected=counts["expected"],
        rows_written=len(got),
        rows_lost=counts["missing"],
        rows_repeated=counts["repeated"],
        rows_unexpected=counts["extra"],
        malformed_sent=0,
        malformed_quarantined=0,
        discrepancy_counts=dict(kinds),
        reasons=[f"{n} {k.replace('_', ' ')}" for k, n in sorted(kinds.items())],
        contract="tables",
        rows_wrong=counts["wrong"],
        sessions_not_judged=counts["not_judged"],
    )
    return correctness, found


def _truth_keys(ledger: pd.DataFrame, truth_sessions: pd.DataFrame, key: str) -> dict[str, str]:
    """``{table key: the session whose truth it must hold}``: each session, or each sensor's last session."""
    sessions = sorted({str(s) for s in ledger["session"]})
    if key == "session":
        return {s: s for s in sessions}
    started = (
        dict(zip(truth_sessions["session"].astype(str), truth_sessions["started_ms"], strict=True))
        if not truth_sessions.empty
        else {}
    )
    last: dict[str, str] = {}
    for session, sensor in ledger.drop_duplicates("session")[["session", "sensor"]].itertuples(index=False):
        current = last.get(str(sensor))
        if current is None or started.get(str(session), 0) >= started.get(current, 0):
            last[str(sensor)] = str(session)
    return last


def _compare(
    want: dict[int, dict[str, Any]], got: pd.DataFrame, counts: Counter[str]
) -> list[tuple[str, str]]:
    """The differences between one true table and the rows written for it, with ``counts`` updated."""
    problems: list[tuple[str, str]] = []
    seen: dict[int, dict[str, Any]] = {}
    for row_id, row in zip(got["row_id"], got["row"], strict=True):
        if int(row_id) in seen:
            counts["repeated"] += 1
            problems.append(("repeated_row", f"row {row_id} written more than once"))
            continue
        seen[int(row_id)] = row
    for row_id, row in sorted(want.items()):
        mine = seen.get(row_id)
        if mine is None:
            counts["missing"] += 1
            problems.append(("missing_row", f"row {row_id} missing, expected {_json(row)}"))
        elif not same_row(mine, row):
            counts["wrong"] += 1
            problems.append(("wrong_row", f"row {row_id} is {_json(mine)}, expected {_json(row)}"))
    for row_id in sorted(set(seen) - set(want)):
        counts["extra"] += 1
        problems.append(
            ("extra_row", f"row {row_id} should not exist (deleted or never written): {_json(seen[row_id])}")
        )
    return problems


def _json(row: dict[str, Any]) -> str:
    return json.dumps(row, sort_keys=True, separators=(",", ":"), default=str)


# --------------------------------------------------------------------------------------------- latency


def tables_end_to_end(ledger: pd.DataFrame, output: TablesOutput) -> pd.DataFrame:
    """Per row whose ``seq`` the output names: that message's ``intended_ts``, the row's commit time, latency.

    The final table shows only each row's last change, so this is the latency of the messages that set the
    final rows (a sample of all messages, the last ones of each row).
    """
    rows = output.rows
    if rows.empty or output.commit_source == "none" or output.key != "session":
        return pd.DataFrame(columns=LATENCY_COLUMNS)
    have = rows[rows[SEQ].notna() & rows[COMMITTED].notna()]
    written = pd.DataFrame(
        {"session": have["key"], "seq": have[SEQ].astype("int64"), "committed_ms": have[COMMITTED]}
    )
    return latencies(ledger, written)


LATENCY_COLUMNS = ["session", "seq", "intended_ts", "committed_ms", "latency_ms"]


def latencies(ledger: pd.DataFrame, written: pd.DataFrame) -> pd.DataFrame:
    """Per message: its ``intended_ts`` (ledger), the first ``committed_ms`` it was written at, the latency.

    ``written`` has ``session``, ``seq`` and ``committed_ms``, a row per time a message's effect was written.
    """
    first = written.groupby(["session", "seq"], as_index=False)["committed_ms"].min()
    meant = ledger[ledger["fault"] != "duplicate"].drop_duplicates(["session", "seq"])
    joined = first.merge(meant[["session", "seq", "intended_ts"]], on=["session", "seq"])
    joined["latency_ms"] = joined["committed_ms"].astype("float64") - joined["intended_ts"].astype("float64")
    result: pd.DataFrame = joined[LATENCY_COLUMNS]
    return result
